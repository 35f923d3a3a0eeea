//! Which process left something behind: the owner tag in the names of the things a
//! process makes and removes itself (a native sandbox's dir and cgroups, an install's
//! staging dir), so that a later process can tell a dead owner's leftovers from a live
//! one's and sweep them.
//!
//! A pid alone does not say it: the pid of a killed process is handed out again, and a
//! server that is pid 1 of its container has the same pid after every restart, so a
//! sweep by pid alone never removes what its earlier self left. The tag is
//! `<pid>.<start time>.<pid namespace>` (the start time in clock ticks since boot, field
//! 22 of `/proc/<pid>/stat`; the namespace the inode of `/proc/self/ns/pid`), which
//! names one process for as long as the machine runs.
//!
//! A pid means something only in its own pid namespace. Two skillboxes that share a
//! directory from different namespaces (a server in a container whose data dir is a
//! volume, and a CLI on the host) cannot judge each other through their own `/proc`.
//! So a process that makes tagged things in a directory first takes a *claim* there:
//! `<dir>/.owners/<tag>`, a file it keeps open under a shared `flock` for as long as it
//! runs, which the kernel lets go of when it dies, in any namespace; a thing that may
//! outlive a data dir's view (a cgroup leaf) is held by its own fd the same way
//! ([`hold`]). An owner is gone when nothing holds its lock and, in this namespace, its
//! pid and start time say so too; in another, the lock alone says it. A sweep removes a
//! claim or a held thing only while it holds it under an exclusive lock
//! ([`take_if_gone`]), and an owner checks its name once its own lock is granted, so
//! no owner ever holds a lock that no one can find.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The directory of claims beneath a directory that holds tagged things.
pub const CLAIMS: &str = ".owners";

/// The start time of `pid` (field 22 of `/proc/<pid>/stat`), in clock ticks since boot.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; fields after it
    // follow its last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's owner tag, `<pid>.<start time>.<pid namespace>` (without the parts
/// `/proc` cannot say). It holds no `-`, so a name may go on after it with one.
pub fn this_process() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let pid = std::process::id();
        match (start_time(pid), pid_namespace()) {
            (Some(started), Some(namespace)) => format!("{pid}.{started}.{namespace}"),
            (Some(started), None) => format!("{pid}.{started}"),
            _ => pid.to_string(),
        }
    })
}

/// The pid namespace this process runs in (the inode of `/proc/self/ns/pid`), which
/// names it for as long as the machine runs. A pid means something only in its own pid
/// namespace: a process in another (a skillbox in a container next to one on the host)
/// cannot be judged through this one's `/proc`. `None` where `/proc` cannot say.
pub fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    static NAMESPACE: OnceLock<Option<u64>> = OnceLock::new();
    *NAMESPACE.get_or_init(|| std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()))
}

/// What a tag says, parsed.
enum Tag {
    /// Not a tag at all.
    Unknown,
    /// A bare pid, as the earliest versions wrote.
    Pid(u32),
    /// A pid and start time that this process's `/proc` can judge.
    Here(u32, u64),
    /// An owner in another pid namespace.
    Elsewhere,
}

fn parse(tag: &str) -> Tag {
    let mut parts = tag.split('.');
    let (Some(pid), started, namespace, None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Tag::Unknown;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return Tag::Unknown;
    };
    let Some(started) = started else {
        return Tag::Pid(pid);
    };
    let Ok(started) = started.parse::<u64>() else {
        return Tag::Unknown;
    };
    match namespace.map(str::parse::<u64>) {
        None => Tag::Here(pid, started),
        Some(Ok(namespace)) if Some(namespace) == pid_namespace() => Tag::Here(pid, started),
        Some(Ok(_)) => Tag::Elsewhere,
        Some(Err(_)) => Tag::Unknown,
    }
}

/// Whether the owner `tag` names still runs, judged by this process's `/proc` alone.
/// A tag this process did not make is a leftover of a dead owner unless a process with
/// its pid and start time runs. A bare pid (what earlier versions wrote) counts as
/// alive while any process has that pid, except this process's own pid when it is not
/// this process's tag: then an earlier process with this pid wrote it. An owner in
/// another pid namespace is alive (see [`gone`], which can tell), and anything else
/// that does not parse is not a tag: alive, so that nothing unknown is removed.
pub fn alive(tag: &str) -> bool {
    if tag == this_process() {
        return true;
    }
    match parse(tag) {
        Tag::Unknown | Tag::Elsewhere => true,
        Tag::Here(pid, started) => start_time(pid) == Some(started),
        // Not this process's tag (checked above), so an earlier process's.
        Tag::Pid(pid) if pid == std::process::id() => false,
        Tag::Pid(pid) => Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// `lock` (a claim, or a thing its owner holds locked itself, such as a cgroup leaf)
/// opened and locked exclusively, when no process holds it under `flock`; `None` when
/// one does.
fn lock_exclusive(lock: &Path) -> io::Result<Option<File>> {
    let file = File::open(lock)?;
    let free =
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok();
    Ok(free.then_some(file))
}

/// Whether `lock` is held by some process (the exclusive lock tried is let go of at
/// once). Absent, or free: not held. Unreadable: held, so that nothing is removed on a
/// guess.
fn held(lock: &Path) -> bool {
    match lock_exclusive(lock) {
        Ok(taken) => taken.is_none(),
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

/// Whether `tag` names no running owner, given whether its lock is held: an owner of
/// this pid namespace is gone when its pid and start time say so and it holds no lock
/// (a reader in another time namespace reads other start times); one of another pid
/// namespace, whose pids mean nothing here, when it holds no lock. This process and
/// anything that is not a tag never are.
fn gone_unless(tag: &str, lock_held: impl FnOnce() -> bool) -> bool {
    if tag == this_process() {
        return false;
    }
    match parse(tag) {
        Tag::Unknown => false,
        Tag::Elsewhere => !lock_held(),
        Tag::Pid(_) | Tag::Here(..) => !alive(tag) && !lock_held(),
    }
}

/// Whether what `tag`'s owner made in `dir` is left behind: its owner no longer runs.
/// Judged by [`alive`] and by its claim in `dir` ([`claim`]): gone when its pid says so
/// (in this pid namespace) and nothing holds its claim, or there is none (an owner
/// claims before it makes anything, and a claim is removed only once nothing holds it).
pub fn gone(dir: &Path, tag: &str) -> bool {
    gone_unless(tag, || held(&dir.join(CLAIMS).join(tag)))
}

/// `thing` of `tag`'s owner (a claim, or a directory its owner holds under a shared
/// `flock` itself while it uses it: [`hold`]; a cgroup leaf, which may belong to a
/// process of another data dir), locked exclusively, when it is left behind: nothing
/// holds it, and its owner is gone as [`gone`] judges. Remove it before the returned
/// lock is dropped: an owner that made it and locks it only after finds it gone.
pub fn take_if_gone(thing: &Path, tag: &str) -> Option<File> {
    // The pid first: a live owner of this namespace costs no open.
    if !gone_unless(tag, || false) {
        return None;
    }
    lock_exclusive(thing).ok().flatten()
}

/// Holds the directory `thing` this process just made under a shared `flock` until the
/// returned file is dropped, so that [`take_if_gone`] in any pid namespace tells that
/// it is in use. `NotFound` when a sweep took it between its making and this lock: make
/// it again.
pub fn hold(thing: &Path) -> io::Result<File> {
    let file = File::open(thing)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)?;
    if still_named(&file, thing)? {
        Ok(file)
    } else {
        Err(io::ErrorKind::NotFound.into())
    }
}

/// Takes this process's claim in `dir` (once per dir; later calls return at once):
/// `<dir>/.owners/<tag>`, held open under a shared `flock` until this process ends, so
/// that a skillbox in another pid namespace sharing `dir` can tell that what this one
/// makes there is in use. Call it before making any tagged thing in `dir`.
pub fn claim(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    static HELD: OnceLock<Mutex<HashMap<PathBuf, File>>> = OnceLock::new();
    let mut held = HELD
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if held.contains_key(dir) {
        return Ok(());
    }
    let claims = dir.join(CLAIMS);
    std::fs::create_dir_all(&claims)?;
    let path = claims.join(this_process());
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)?;
        // A sweeper removes a claim only while it holds it locked (`sweep_claims`): one
        // that found this file before the lock above may have removed it since, and
        // the lock is then on a name no one finds. Again, with a new file.
        if still_named(&file, &path)? {
            held.insert(dir.to_path_buf(), file);
            return Ok(());
        }
    }
}

/// Whether `path` still names the open `file`.
fn still_named(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let opened = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(named) => Ok(named.ino() == opened.ino() && named.dev() == opened.dev()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes the claims in `dir` of owners that are gone. Each is removed while this
/// process holds it under an exclusive lock, and only if its name still names the file
/// locked: an owner that opened it, and locks it only after, finds it gone and claims
/// again ([`claim`]); it never holds a claim no one can find.
pub fn sweep_claims(dir: &Path) {
    let claims = dir.join(CLAIMS);
    let Ok(entries) = std::fs::read_dir(&claims) else {
        return;
    };
    for entry in entries.flatten() {
        let tag = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Some(lock) = take_if_gone(&path, &tag)
            && still_named(&lock, &path).unwrap_or(false)
        {
            let _ = std::fs::remove_file(&path);
            // The lock goes with the file, after the removal.
            drop(lock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_restarted_pid_is_not() {
        let me = this_process();
        assert!(alive(me));
        let parts: Vec<&str> = me.split('.').collect();
        let [pid, started, namespace] = parts[..] else {
            panic!("a tag with a start time and a pid namespace: {me}");
        };
        assert_eq!(pid, std::process::id().to_string());
        assert_eq!(namespace, pid_namespace().unwrap().to_string());
        // The same pid with another start time: an earlier process that had this pid,
        // with or without the namespace (what the version before wrote).
        let earlier: u64 = started.parse::<u64>().unwrap() - 1;
        assert!(!alive(&format!("{pid}.{earlier}.{namespace}")));
        assert!(!alive(&format!("{pid}.{earlier}")));
        let dir = tempfile::tempdir().unwrap();
        assert!(gone(dir.path(), &format!("{pid}.{earlier}.{namespace}")));
        assert!(!gone(dir.path(), me));
        // A bare pid of our own is an earlier process's (we write start times).
        assert!(!alive(pid));
    }

    #[test]
    fn other_processes_are_told_by_pid_and_start_time() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let started = start_time(pid).unwrap();
        assert!(alive(&format!("{pid}.{started}")));
        assert!(!alive(&format!("{pid}.{}", started + 1)));
        assert!(
            alive(&pid.to_string()),
            "a bare pid that runs counts as alive"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!alive(&format!("{pid}.{started}")));
        // Not a tag: never taken for a dead owner.
        assert!(alive("etc"));
        assert!(alive("12.x"));
    }

    /// A child that holds `lock` (a file or a directory) under a shared `flock` until
    /// it is killed: the lock is on the shell's fd 9, which `sleep` takes over.
    fn holder(lock: &Path) -> std::process::Child {
        let child = std::process::Command::new("sh")
            .args(["-c", "exec 9<\"$0\"; flock --shared 9; exec sleep 30"])
            .arg(lock)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !held(lock) {
            assert!(std::time::Instant::now() < deadline, "flock never took it");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child
    }

    fn stop(mut child: std::process::Child) {
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// An owner in another pid namespace cannot be judged by pid: it is alive to
    /// [`alive`], and [`gone`] asks its claim, which a process holding it keeps.
    #[test]
    fn an_owner_in_another_namespace_is_judged_by_its_claim() {
        let dir = tempfile::tempdir().unwrap();
        let ours = pid_namespace().unwrap();
        // Pid 1 started at tick 1 in a namespace that is not ours: whatever this
        // process's pid 1 is, that says nothing of it.
        let elsewhere = format!("1.1.{}", ours + 1);
        assert!(alive(&elsewhere));
        assert!(gone(dir.path(), &elsewhere), "no claim: gone");
        let claims = dir.path().join(CLAIMS);
        std::fs::create_dir_all(&claims).unwrap();
        let path = claims.join(&elsewhere);
        std::fs::write(&path, "").unwrap();
        assert!(gone(dir.path(), &elsewhere), "a claim nothing holds: gone");
        let holding = holder(&path);
        assert!(!gone(dir.path(), &elsewhere), "a held claim: in use");
        sweep_claims(dir.path());
        assert!(path.exists(), "a held claim is kept");
        stop(holding);
        assert!(gone(dir.path(), &elsewhere), "its holder died: gone");
        sweep_claims(dir.path());
        assert!(!path.exists(), "a claim nothing holds is removed");
    }

    /// An owner of this pid namespace whose start time reads as another's (a process
    /// in another time namespace) is kept while it holds its claim, or the thing's own
    /// lock: the pid alone never removes what is in use.
    #[test]
    fn a_held_lock_keeps_an_owner_whose_pid_looks_dead() {
        let dir = tempfile::tempdir().unwrap();
        let me = this_process();
        let (pid, rest) = me.split_once('.').unwrap();
        let (started, namespace) = rest.split_once('.').unwrap();
        let earlier = started.parse::<u64>().unwrap() - 1;
        let looks_dead = format!("{pid}.{earlier}.{namespace}");
        assert!(!alive(&looks_dead));
        assert!(gone(dir.path(), &looks_dead));
        let claims = dir.path().join(CLAIMS);
        std::fs::create_dir_all(&claims).unwrap();
        let claim = claims.join(&looks_dead);
        std::fs::write(&claim, "").unwrap();
        let holding = holder(&claim);
        assert!(!gone(dir.path(), &looks_dead));
        sweep_claims(dir.path());
        assert!(claim.exists());
        stop(holding);
        assert!(gone(dir.path(), &looks_dead));

        // A directory its owner holds itself (a cgroup leaf), in this namespace and in
        // another: kept while held, whatever a claim says.
        let leaf = dir.path().join("leaf");
        std::fs::create_dir(&leaf).unwrap();
        let elsewhere = format!("1.1.{}", pid_namespace().unwrap() + 1);
        assert!(take_if_gone(&leaf, &looks_dead).is_some());
        assert!(take_if_gone(&leaf, &elsewhere).is_some());
        let holding = holder(&leaf);
        assert!(take_if_gone(&leaf, &looks_dead).is_none());
        assert!(take_if_gone(&leaf, &elsewhere).is_none());
        stop(holding);
        assert!(take_if_gone(&leaf, me).is_none(), "this process's own");
        let held_here = hold(&leaf).unwrap();
        assert!(
            take_if_gone(&leaf, &elsewhere).is_none(),
            "held by this process"
        );
        drop(held_here);
        // Taken, it is held: an owner's hold waits, then finds it removed.
        let taken = take_if_gone(&leaf, &elsewhere).unwrap();
        let holding = {
            let leaf = leaf.clone();
            std::thread::spawn(move || hold(&leaf).map(drop))
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        std::fs::remove_dir(&leaf).unwrap();
        drop(taken);
        let e = holding.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_claim_is_held_for_as_long_as_this_process_runs() {
        let dir = tempfile::tempdir().unwrap();
        claim(dir.path()).unwrap();
        claim(dir.path()).unwrap();
        let path = dir.path().join(CLAIMS).join(this_process());
        assert!(held(&path), "the claim is held");
        sweep_claims(dir.path());
        assert!(path.exists(), "this process's own claim is kept");
    }

    /// A sweeper that found this process's claim file before this process locked it,
    /// and removed it (under its own lock) before this process's lock was granted: the
    /// claim is made again, so that it is never held on a name no one finds.
    #[test]
    fn a_claim_removed_before_it_was_locked_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let claims = dir.path().join(CLAIMS);
        std::fs::create_dir_all(&claims).unwrap();
        let path = claims.join(this_process());
        std::fs::write(&path, "").unwrap();
        // The sweeper's exclusive lock, which the claim's shared one waits for.
        let sweeper = File::open(&path).unwrap();
        rustix::fs::flock(&sweeper, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let claiming = {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || claim(&dir))
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        std::fs::remove_file(&path).unwrap();
        drop(sweeper);
        claiming.join().unwrap().unwrap();
        assert!(path.exists(), "the claim was made again");
        assert!(held(&path), "and is held");
    }
}
