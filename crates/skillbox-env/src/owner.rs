//! Which process left something behind: the owner tag in the names of the things a
//! process makes and removes itself (a native sandbox's dir and cgroups, an install's
//! staging dir), so that a later process can tell a dead owner's leftovers from a live
//! one's and sweep them.
//!
//! A pid alone does not say it: the pid of a killed process is handed out again, and a
//! server that is pid 1 of its container has the same pid after every restart, so a
//! sweep by pid alone never removes what its earlier self left. The tag is
//! `<pid>.<start time>` (the start time in clock ticks since boot, field 22 of
//! `/proc/<pid>/stat`), which names one process for as long as the machine runs.

use std::sync::OnceLock;

/// The start time of `pid` (field 22 of `/proc/<pid>/stat`), in clock ticks since boot.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; fields after it
    // follow its last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's owner tag, `<pid>.<start time>` (the bare pid where `/proc` cannot
/// say when it started). It holds no `-`, so a name may go on after it with one.
pub fn this_process() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let pid = std::process::id();
        match start_time(pid) {
            Some(started) => format!("{pid}.{started}"),
            None => pid.to_string(),
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

/// Whether the owner `tag` names still runs. A tag this process did not make is a
/// leftover of a dead owner unless a process with its pid and start time runs. A bare
/// pid (what earlier versions wrote) counts as alive while any process has that pid,
/// except this process's own pid when it is not this process's tag: then an earlier
/// process with this pid wrote it. Anything else that does
/// not parse is not a tag: alive, so that nothing unknown is removed.
pub fn alive(tag: &str) -> bool {
    if tag == this_process() {
        return true;
    }
    let (pid, started) = match tag.split_once('.') {
        Some((pid, started)) => (pid, Some(started)),
        None => (tag, None),
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return true;
    };
    match started {
        Some(started) => match started.parse::<u64>() {
            Ok(started) => start_time(pid) == Some(started),
            Err(_) => true,
        },
        // Not this process's tag (checked above), so an earlier process's.
        None if pid == std::process::id() => false,
        None => std::path::Path::new(&format!("/proc/{pid}")).exists(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_restarted_pid_is_not() {
        let me = this_process();
        assert!(alive(me));
        let (pid, started) = me.split_once('.').expect("a tag with a start time");
        assert_eq!(pid, std::process::id().to_string());
        // The same pid with another start time: an earlier process that had this pid.
        let earlier: u64 = started.parse::<u64>().unwrap() - 1;
        assert!(!alive(&format!("{pid}.{earlier}")));
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
}
