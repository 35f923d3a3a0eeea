//! Per-exec cgroups for memory, pids and CPU: v2 where this process's cgroup is
//! delegated to it, v1 where the host mounts the controllers separately. Each exec gets
//! its own leaf, named after this process (its owner tag: pid, start time and pid
//! namespace) and held under a shared `flock` while it is used, so a later sweep, in
//! this pid namespace or another, can tell leftovers from live ones.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use skillbox_env::{LimitKind, Limits};

const ROOT: &str = "/sys/fs/cgroup";
const PREFIX: &str = "skillbox-";

/// Where this process may create cgroups.
#[derive(Debug, Clone)]
pub enum Host {
    /// One directory per controller (v1); `None` where that controller is missing or
    /// not writable.
    V1 {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
    },
    /// A delegated v2 directory with memory/pids/cpu usable below it.
    V2 {
        parent: PathBuf,
        controllers: Vec<String>,
    },
    /// No usable cgroup; why.
    None(String),
}

impl Host {
    /// Detected once per process.
    pub fn get() -> &'static Host {
        static HOST: OnceLock<Host> = OnceLock::new();
        HOST.get_or_init(detect)
    }

    /// The host of a sandbox with no cgroup limits: never probed, never used.
    pub fn unused() -> &'static Host {
        static UNUSED: Host = Host::None(String::new());
        &UNUSED
    }

    pub fn describe(&self) -> String {
        match self {
            Host::V1 { memory, pids, cpu } => {
                let have: Vec<&str> = [("memory", memory), ("pids", pids), ("cpu", cpu)]
                    .into_iter()
                    .filter(|(_, p)| p.is_some())
                    .map(|(n, _)| n)
                    .collect();
                format!("v1 ({})", have.join(", "))
            }
            Host::V2 {
                parent,
                controllers,
            } => {
                format!("v2 at {} ({})", parent.display(), controllers.join(", "))
            }
            Host::None(reason) => format!("none: {reason}"),
        }
    }

    pub fn has(&self, controller: &str) -> bool {
        match self {
            Host::V1 { memory, pids, cpu } => match controller {
                "memory" => memory.is_some(),
                "pids" => pids.is_some(),
                "cpu" => cpu.is_some(),
                _ => false,
            },
            Host::V2 { controllers, .. } => controllers.iter().any(|c| c == controller),
            Host::None(_) => false,
        }
    }
}

/// The cgroup path of this process in hierarchy `id` (v1 controller name, or "" for v2),
/// from the text of `/proc/self/cgroup`.
fn own_path(text: &str, controller: &str) -> Option<String> {
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
        if names.split(',').any(|n| n == controller) {
            return Some(path.to_string());
        }
    }
    None
}

fn writable_dir(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path.
    dir.is_dir() && unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0
}

fn detect() -> Host {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v1 = |controller: &str| -> Option<PathBuf> {
        let mount = Path::new(ROOT).join(controller);
        if !mount.join("cgroup.procs").exists() || mount.join("cgroup.subtree_control").exists() {
            return None;
        }
        let path = own_path(&own, controller)?;
        let dir = mount.join(path.trim_start_matches('/'));
        writable_dir(&dir).then_some(dir)
    };
    let (memory, pids, cpu) = (v1("memory"), v1("pids"), v1("cpu"));
    if memory.is_some() || pids.is_some() || cpu.is_some() {
        return Host::V1 { memory, pids, cpu };
    }
    match detect_v2(&own) {
        Ok(host) => host,
        Err(reason) => Host::None(reason),
    }
}

fn detect_v2(own: &str) -> Result<Host, String> {
    let root = Path::new(ROOT);
    if !root.join("cgroup.controllers").exists() {
        return Err(
            "no cgroup v2 hierarchy at /sys/fs/cgroup and no writable v1 controllers".into(),
        );
    }
    let own = own_path(own, "").ok_or("cannot read this process's cgroup")?;
    // In the root cgroup, `own` is "/": the root itself, not "/sys/fs/cgroup/".
    let mut dir = match own.trim_matches('/') {
        "" => root.to_path_buf(),
        below => root.join(below),
    };
    if !writable_dir(&dir) {
        return Err(format!(
            "cgroup {} is not delegated to this user (run as root, or under systemd-run --user --scope -p Delegate=yes)",
            dir.display()
        ));
    }
    let available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<String> = ["memory", "pids", "cpu"]
        .into_iter()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .map(String::from)
        .collect();
    if wanted.is_empty() {
        return Err(format!(
            "cgroup {} offers no memory, pids or cpu controller",
            dir.display()
        ));
    }
    // v2 forbids processes in a cgroup that hands controllers to children: move this
    // process into a leaf of its own first, then enable the controllers below.
    let enable: String = wanted.iter().map(|c| format!("+{c} ")).collect();
    if fs::write(dir.join("cgroup.subtree_control"), enable.trim()).is_err() {
        let leaf = dir.join(format!("{PREFIX}supervisor"));
        let _ = fs::create_dir(&leaf);
        fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())
            .map_err(|e| format!("cannot move into {}: {e}", leaf.display()))?;
        fs::write(dir.join("cgroup.subtree_control"), enable.trim()).map_err(|e| {
            // EBUSY: other processes share the delegated cgroup, and v2 will not hand
            // controllers down from a cgroup with processes in it.
            let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                "; other processes are in it: start skillbox alone in a delegated cgroup, e.g. systemd-run --user --scope -p Delegate=yes skillbox …"
            } else {
                ""
            };
            format!(
                "cannot enable {} in {}: {e}{hint}",
                wanted.join(","),
                dir.display()
            )
        })?;
    }
    dir = dir.to_path_buf();
    Ok(Host::V2 {
        parent: dir,
        controllers: wanted,
    })
}

/// The cgroup(s) of one exec. Removed by [`ExecCgroup::remove`].
#[derive(Debug)]
pub struct ExecCgroup {
    v2: bool,
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    dirs: Vec<PathBuf>,
    /// Each leaf open under a shared `flock` until it is removed
    /// (`skillbox_env::owner::hold`).
    held: Vec<fs::File>,
}

fn write(path: PathBuf, value: &str) -> Result<(), String> {
    fs::write(&path, value).map_err(|e| format!("write {value} to {}: {e}", path.display()))
}

impl ExecCgroup {
    /// Creates the leaf and writes the limits the cgroup enforces. Only controllers
    /// that a limit needs are used.
    pub fn create(host: &Host, limits: &Limits, name: &str) -> Result<ExecCgroup, String> {
        let name = format!("{PREFIX}{}-{name}", skillbox_env::owner::this_process());
        let mut cg = ExecCgroup {
            v2: false,
            memory: None,
            pids: None,
            dirs: Vec::new(),
            held: Vec::new(),
        };
        let result = cg.setup(host, limits, &name);
        if let Err(e) = result {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    fn mkdir(&mut self, parent: &Path, name: &str) -> Result<PathBuf, String> {
        let dir = parent.join(name);
        // A sweep in another pid namespace may take the leaf between its making and
        // its lock (it is empty and unlocked then): made again, a few times at most.
        for _ in 0..3 {
            fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            match skillbox_env::owner::hold(&dir) {
                Ok(held) => {
                    self.dirs.push(dir.clone());
                    self.held.push(held);
                    return Ok(dir);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let _ = fs::remove_dir(&dir);
                    return Err(format!("lock {}: {e}", dir.display()));
                }
            }
        }
        Err(format!(
            "mkdir {}: removed as it was made, three times",
            dir.display()
        ))
    }

    fn setup(&mut self, host: &Host, limits: &Limits, name: &str) -> Result<(), String> {
        match host {
            Host::V1 { memory, pids, cpu } => {
                if let (Some(bytes), Some(parent)) = (limits.memory_bytes, memory) {
                    let dir = self.mkdir(parent, name)?;
                    write(dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                    if dir.join("memory.memsw.limit_in_bytes").exists() {
                        write(dir.join("memory.memsw.limit_in_bytes"), &bytes.to_string())?;
                    } else {
                        write(dir.join("memory.swappiness"), "0")?;
                    }
                    self.memory = Some(dir);
                }
                if let (Some(max), Some(parent)) = (limits.pids, pids) {
                    let dir = self.mkdir(parent, name)?;
                    write(dir.join("pids.max"), &max.to_string())?;
                    self.pids = Some(dir);
                }
                if let (Some(cpus), Some(parent)) = (limits.cpus, cpu) {
                    let dir = self.mkdir(parent, name)?;
                    write(dir.join("cpu.cfs_period_us"), "100000")?;
                    write(
                        dir.join("cpu.cfs_quota_us"),
                        &((cpus * 100_000.0) as u64).to_string(),
                    )?;
                }
            }
            Host::V2 {
                parent,
                controllers,
            } => {
                self.v2 = true;
                let dir = self.mkdir(parent, name)?;
                let has = |c: &str| controllers.iter().any(|x| x == c);
                if let Some(bytes) = limits.memory_bytes.filter(|_| has("memory")) {
                    write(dir.join("memory.max"), &bytes.to_string())?;
                    // No swap for the sandbox. A kernel without swap accounting has no
                    // such file: fine only when there is no swap to leak into.
                    if let Err(e) = fs::write(dir.join("memory.swap.max"), "0")
                        && (e.kind() != std::io::ErrorKind::NotFound || host_has_swap())
                    {
                        return Err(format!(
                            "memory.swap.max: {e}; without it the memory limit would leak into \
                             swap (enable swap accounting, or run without --memory)"
                        ));
                    }
                    write(dir.join("memory.oom.group"), "1")?;
                    self.memory = Some(dir.clone());
                }
                if let Some(max) = limits.pids.filter(|_| has("pids")) {
                    write(dir.join("pids.max"), &max.to_string())?;
                    self.pids = Some(dir.clone());
                }
                if let Some(cpus) = limits.cpus.filter(|_| has("cpu")) {
                    write(
                        dir.join("cpu.max"),
                        &format!("{} 100000", (cpus * 100_000.0) as u64),
                    )?;
                }
            }
            Host::None(_) => {}
        }
        Ok(())
    }

    /// On v2, the leaf to start the sandbox in with `CLONE_INTO_CGROUP` (no move: the
    /// child is born there). `None` on v1, where init joins through
    /// [`ExecCgroup::join_files`] instead.
    pub fn clone_into(&self) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        let dir = self.dirs.first().filter(|_| self.v2)?;
        Some(fs::File::open(dir).map(std::os::fd::OwnedFd::from))
    }

    /// On v1, each leaf's `tasks` file, open for writing, for the sandbox's init to
    /// join by writing `0` to it (see `ChildPlan::cgroup_join`): the kernel checks the
    /// credentials this file was opened with. Empty on v2 ([`ExecCgroup::clone_into`]).
    pub fn join_files(&self) -> Result<Vec<std::os::fd::OwnedFd>, String> {
        if self.v2 {
            return Ok(Vec::new());
        }
        self.dirs
            .iter()
            .map(|dir| {
                let path = dir.join("tasks");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map(std::os::fd::OwnedFd::from)
                    .map_err(|e| format!("open {}: {e}", path.display()))
            })
            .collect()
    }

    /// Which cgroup limit the run hit, if any.
    pub fn limit_hit(&self) -> Option<LimitKind> {
        let count = |file: PathBuf, key: &str| -> u64 {
            fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
                .next()
                .unwrap_or(0)
        };
        if let Some(dir) = &self.memory {
            let file = if self.v2 {
                "memory.events"
            } else {
                "memory.oom_control"
            };
            if count(dir.join(file), "oom_kill ") > 0 {
                return Some(LimitKind::Memory);
            }
        }
        if let Some(dir) = &self.pids
            && count(dir.join("pids.events"), "max ") > 0
        {
            return Some(LimitKind::Pids);
        }
        None
    }

    /// Removes the leaves. The processes are gone by then (the pid namespace died with
    /// its init), but the kernel may take a moment to let go of them.
    pub fn remove(&mut self) {
        self.held.clear();
        for dir in self.dirs.drain(..).rev() {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                match fs::remove_dir(&dir) {
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        tracing::warn!(dir = %dir.display(), error = %e, "could not remove exec cgroup");
                        break;
                    }
                    _ => break,
                }
            }
        }
    }
}

impl Drop for ExecCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Removes empty leaves that a skillbox process which no longer runs left behind: told
/// by the owner tag in each leaf's name and by the leaf's own lock, which its owner
/// holds while it uses it (`skillbox_env::owner::take_if_gone`), so an owner in
/// another pid namespace (in another data dir, even) is judged too. A leaf is removed
/// while this sweep holds it locked: an owner that had just made it finds it gone once
/// its own lock is granted, and makes it again.
pub fn sweep(host: &Host) {
    let parents: Vec<PathBuf> = match host {
        Host::V1 { memory, pids, cpu } => {
            [memory, pids, cpu].into_iter().flatten().cloned().collect()
        }
        Host::V2 { parent, .. } => vec![parent.clone()],
        Host::None(_) => return,
    };
    for parent in parents {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(owner) = name.strip_prefix(PREFIX).and_then(|r| r.split('-').next()) else {
                continue;
            };
            let path = entry.path();
            if owner.starts_with(|c: char| c.is_ascii_digit())
                && let Some(lock) = skillbox_env::owner::take_if_gone(&path, owner)
            {
                let _ = fs::remove_dir(&path);
                drop(lock);
            }
        }
    }
}

/// Whether the host has any swap (`SwapTotal` above 0 in `/proc/meminfo`).
fn host_has_swap() -> bool {
    fs::read_to_string("/proc/meminfo").is_ok_and(|text| {
        text.lines()
            .find_map(|line| line.strip_prefix("SwapTotal:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .is_some_and(|kb| kb > 0)
    })
}
