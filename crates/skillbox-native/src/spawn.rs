//! The parent side of starting a sandbox: pipes, `clone3` into every namespace at once
//! (and on cgroup v2 into its cgroup; on v1 init joins it), uid/gid maps, then the
//! go-ahead.
//!
//! `clone3` runs on one dedicated thread that lives as long as the process, because the
//! child's "die with parent" signal fires when the *thread* that cloned it exits, and
//! tokio's blocking threads come and go.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use crate::cgroup::ExecCgroup;
use crate::child::{self, ChildFds, ChildPlan};
use crate::clone;
use crate::ids::{HostIds, SANDBOX_ID};

/// The sandbox's init, owned: dropping it before it was reaped kills it (and with it
/// the whole pid namespace) and reaps it, so no path can leave a sandbox running
/// unsupervised.
#[derive(Debug)]
pub struct InitProcess {
    pid: i32,
    pidfd: OwnedFd,
    reaped: bool,
}

impl InitProcess {
    /// Kills the whole sandbox (harmless once it has exited).
    pub fn kill(&self) {
        // SAFETY: signalling our own child through its pidfd.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                0usize,
                0u32,
            )
        };
    }

    /// Reaps init if it has exited; true once reaped.
    pub fn try_reap(&mut self) -> bool {
        if !self.reaped {
            let mut status = 0;
            // SAFETY: a non-blocking wait on our own child.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            // -1 (ECHILD) means someone else reaped it: nothing left to wait for.
            self.reaped = rc != 0;
        }
        self.reaped
    }

    /// The host pid of init.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A second fd for the same process, to wait on asynchronously.
    pub fn watch_fd(&self) -> std::io::Result<OwnedFd> {
        self.pidfd.try_clone()
    }
}

impl Drop for InitProcess {
    fn drop(&mut self) {
        if self.try_reap() {
            return;
        }
        self.kill();
        let pid = self.pid;
        // The namespace takes a moment to die; reap it off this thread.
        let reaper = std::thread::Builder::new()
            .name("skillbox-reaper".into())
            .spawn(move || {
                let mut status = 0;
                // SAFETY: a blocking wait on our own, already killed, child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
            });
        if let Err(e) = reaper {
            tracing::warn!(pid, error = %e, "cannot start a reaper thread; a zombie remains until exit");
        }
    }
}

/// What the parent keeps of a started sandbox.
#[derive(Debug)]
pub struct Started {
    pub init: InitProcess,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub error: OwnedFd,
    pub status: OwnedFd,
    pub namespaces: ExecNamespaces,
    /// The egress proxy's listener on the exec's loopback, when the plan asked for it.
    pub egress: Option<OwnedFd>,
    /// The write end of init's sync pipe: a prepared init's command goes here
    /// ([`Started::go`]). Held until init's setup is done, whatever the init: init
    /// checks before it runs the command that its parent still holds it (see
    /// `child::init_main`).
    pub go: Option<OwnedFd>,
}

impl Started {
    /// Lets a prepared init run `command` (from [`child::late_command`]); false when it
    /// is gone (its end of the pipe closed: killed meanwhile, or failed and said why
    /// on its error pipe).
    pub fn go(&mut self, command: &[u8]) -> bool {
        let Some(go) = self.go.as_ref() else {
            return false;
        };
        let mut sent = 0;
        while sent < command.len() {
            // SAFETY: a write from a live slice to our own pipe. The pipe is empty and
            // the command at most `child::LATE_BYTES` long, so it fits at once (unless
            // the user is past `pipe-user-pages-soft`: then it waits for init to read).
            let n = unsafe {
                libc::write(
                    go.as_raw_fd(),
                    command[sent..].as_ptr().cast(),
                    command.len() - sent,
                )
            };
            if n > 0 {
                sent += n as usize;
            } else if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return false;
            }
        }
        true
    }
}

/// The network and user namespaces of one exec (`None` where they could not be opened).
#[derive(Debug)]
pub struct ExecNamespaces {
    pub net: Option<OwnedFd>,
    pub user: Option<OwnedFd>,
}

/// The parent's ends plus the child's, until the clone is done.
struct Pipes {
    parent: [OwnedFd; 5], // stdin w, stdout r, stderr r, error r, status r
    sync: OwnedFd,        // parent's write end
    child: [OwnedFd; 6],  // sync r, error w, status w, stdin r, stdout w, stderr w
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds are fresh and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// Keeps pipe fds off 0–2 so the payload's dup2 onto stdio never clobbers one.
fn above_stdio(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd we own.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

fn pipes() -> std::io::Result<Pipes> {
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let (error_r, error_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    let (sync_r, sync_w) = pipe()?;
    Ok(Pipes {
        parent: [stdin_w, stdout_r, stderr_r, error_r, status_r],
        sync: sync_w,
        child: [sync_r, error_w, status_w, stdin_r, stdout_w, stderr_w],
    })
}

enum Job {
    Start {
        plan: Box<ChildPlan>,
        ids: HostIds,
        cgroup: Option<std::sync::Arc<ExecCgroup>>,
        reply: tokio::sync::oneshot::Sender<Result<Started, String>>,
    },
    /// Housekeeping that need not hold up the caller.
    Run(Box<dyn FnOnce() + Send>),
}

/// The spawner thread's queue, starting the thread on first use.
fn spawner() -> &'static Mutex<mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("skillbox-spawner".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Start {
                            plan,
                            ids,
                            cgroup,
                            reply,
                        } => {
                            let _ = reply.send(clone_sandbox(plan, ids, cgroup.as_deref(), true));
                        }
                        Job::Run(work) => work(),
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the sandbox spawner thread");
        }
        Mutex::new(tx)
    })
}

/// Starts the spawner thread ahead of the first exec, off the critical path.
pub fn warm_up() {
    spawner();
}

/// Has sandboxes cloned by a spawner process (see `spawner`) started from `program`
/// with `args` before its subcommand: for a long-lived caller whose address space is
/// large. Returns the process's pid. On error nothing changed: sandboxes are cloned
/// here, as before.
pub fn use_spawner_process(program: &std::path::Path, args: &[String]) -> std::io::Result<u32> {
    let (reply, answer) = mpsc::channel();
    let (program, args) = (program.to_path_buf(), args.to_vec());
    let job = Job::Run(Box::new(move || {
        // On v2 the host's detection may move this process into a leaf of its own:
        // first, so that the spawner process starts there too.
        let _ = crate::cgroup::Host::get();
        let started = if crate::spawner::client::running() {
            Err(std::io::Error::other(
                "a spawner process is already running",
            ))
        } else {
            crate::spawner::client::start(&program, &args)
        };
        let _ = reply.send(started);
    }));
    spawner()
        .lock()
        .map_err(|_| std::io::Error::other("the sandbox spawner is poisoned"))?
        .send(job)
        .map_err(|_| std::io::Error::other("the sandbox spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the sandbox spawner dropped the request"))?
}

/// Runs `work` on the spawner thread, between starts (or here, if it is gone).
pub fn run_on_spawner(work: impl FnOnce() + Send + 'static) {
    let job = Job::Run(Box::new(work));
    let unsent = match spawner().lock() {
        Ok(sender) => sender.send(job).err().map(|e| e.0),
        Err(_) => Some(job),
    };
    if let Some(Job::Run(work)) = unsent {
        work();
    }
}

/// Starts a sandbox from `plan` (whose `fds` are filled in here).
pub async fn start(
    plan: ChildPlan,
    ids: HostIds,
    cgroup: Option<std::sync::Arc<ExecCgroup>>,
) -> Result<Started, String> {
    let sender = spawner();
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Job::Start {
        plan: Box::new(plan),
        ids,
        cgroup,
        reply,
    };
    sender
        .lock()
        .map_err(|_| "the sandbox spawner is poisoned".to_string())?
        .send(job)
        .map_err(|_| "the sandbox spawner thread is gone".to_string())?;
    answer
        .await
        .map_err(|_| "the sandbox spawner dropped the request".to_string())?
}

/// Starts a sandbox from `plan` on the calling thread, for a one-shot caller whose
/// thread outlives the sandbox (its death signal fires when this thread exits).
pub fn start_here(
    plan: ChildPlan,
    ids: HostIds,
    cgroup: Option<&ExecCgroup>,
) -> Result<Started, String> {
    clone_sandbox(Box::new(plan), ids, cgroup, false)
}

/// Starts a sandbox; `remote`: by the spawner process if one runs.
fn clone_sandbox(
    plan: Box<ChildPlan>,
    ids: HostIds,
    cgroup: Option<&ExecCgroup>,
    remote: bool,
) -> Result<Started, String> {
    // On cgroup v2 the child is born in its cgroup; on v1 it joins its leaves itself,
    // through files opened here.
    let into = match cgroup.and_then(ExecCgroup::clone_into) {
        Some(Ok(fd)) => Some(fd),
        Some(Err(e)) => return Err(format!("cgroup: cannot open the exec cgroup: {e}")),
        None => None,
    };
    let join = match cgroup.map(ExecCgroup::join_files).transpose() {
        Ok(files) => files.unwrap_or_default(),
        Err(e) => return Err(format!("cgroup: {e}")),
    };
    clone_into_cgroup(plan, ids, into.as_ref(), &join, remote)
}

/// [`clone_sandbox`] with the cgroup as fds: `into` (v2) to be born in, `join` (v1) for
/// init to join.
pub(crate) fn clone_into_cgroup(
    mut plan: Box<ChildPlan>,
    ids: HostIds,
    into: Option<&OwnedFd>,
    join: &[OwnedFd],
    remote: bool,
) -> Result<Started, String> {
    let pipes = pipes().map_err(|e| format!("pipes: {e}"))?;
    let [sync_r, error_w, status_w, stdin_r, stdout_w, stderr_w] = &pipes.child;
    plan.fds = ChildFds {
        sync: sync_r.as_raw_fd(),
        error: error_w.as_raw_fd(),
        status: status_w.as_raw_fd(),
        stdin: stdin_r.as_raw_fd(),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_w.as_raw_fd(),
    };
    let into_fd = into.map(AsRawFd::as_raw_fd);
    plan.cgroup_join = join.iter().map(AsRawFd::as_raw_fd).collect();
    let by_spawner = if remote {
        crate::spawner::client::clone_init(&plan, into_fd)?
    } else {
        None
    };
    let (pid, pidfd) = match by_spawner {
        Some(cloned) => cloned,
        None => {
            plan.payload_stack = vec![0; child::PAYLOAD_STACK];
            if plan.late {
                plan.late_buffer = vec![0; child::LATE_BYTES];
            }
            clone::clone_init(&mut plan, into_fd, false).map_err(|e| clone::clone_error(&e))?
        }
    };
    let plan_clear_groups = plan.clear_groups;
    let plan_egress = plan.egress;
    let plan_late = plan.late;
    drop(pipes.child);
    // From here on, any early return drops `init`, which kills and reaps the child.
    let init = InitProcess {
        pid,
        pidfd,
        reaped: false,
    };
    let maps = (|| -> std::io::Result<()> {
        // Unprivileged, the kernel wants setgroups denied before a gid map; as root we
        // leave it allowed so init can drop the supplementary groups it inherited.
        if !plan_clear_groups {
            fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
        }
        fs::write(
            format!("/proc/{pid}/uid_map"),
            format!("{SANDBOX_ID} {} 1\n", ids.uid),
        )?;
        fs::write(
            format!("/proc/{pid}/gid_map"),
            format!("{SANDBOX_ID} {} 1\n", ids.gid),
        )
    })();
    if let Err(e) = maps {
        return Err(format!("user_ns: cannot write the uid/gid map: {e}"));
    }
    // The exec's namespaces, for its connector: opened now, while init still waits for
    // the go-ahead and is dumpable (it is not once it runs, and then only a process
    // with CAP_SYS_PTRACE could open them).
    let namespaces = ExecNamespaces {
        net: open_namespace(pid, "net"),
        user: open_namespace(pid, "user"),
    };
    // The egress listener before init goes: the sandbox's code finds it there from its
    // first instruction, and cannot take its port first.
    let egress = if plan_egress {
        let net = namespaces
            .net
            .as_ref()
            .ok_or("egress: cannot open the exec's network namespace")?;
        // SAFETY: geteuid has no preconditions.
        let user = if unsafe { libc::geteuid() } == 0 {
            None
        } else {
            Some(
                namespaces
                    .user
                    .as_ref()
                    .ok_or("egress: cannot open the exec's user namespace")?
                    .as_fd(),
            )
        };
        Some(
            crate::egress::listen_in(net.as_fd(), user)
                .map_err(|e| format!("egress: cannot listen on the sandbox's loopback: {e}"))?,
        )
    } else {
        None
    };
    let go = || {
        // SAFETY: one byte from a stack variable to our own pipe.
        unsafe { libc::write(pipes.sync.as_raw_fd(), [1u8].as_ptr().cast(), 1) == 1 }
    };
    if !go() {
        return Err("cannot signal the sandbox to start".into());
    }
    // The second byte lets init run the command. (A prepared init waits for its
    // command instead.)
    if !plan_late && !go() {
        // Init is gone: it failed a step after the first byte, and said which on its
        // error pipe before it exited.
        return Err(match read_failure(&pipes.parent[3]) {
            Some((step, errno)) => format!(
                "{}: {}",
                crate::layout::describe_step(&plan.layout, step),
                std::io::Error::from_raw_os_error(errno)
            ),
            None => "the sandbox's init exited before its command".into(),
        });
    }
    let [stdin, stdout, stderr, error, status] = pipes.parent;
    Ok(Started {
        init,
        stdin,
        stdout,
        stderr,
        error,
        status,
        namespaces,
        egress,
        go: Some(pipes.sync),
    })
}

/// The step and errno an init that is gone wrote on its error pipe, if it did. Waits
/// at most 100 ms: others may hold the pipe's write end a moment longer (an init cloned
/// beside it, until it closes what it inherited), but a record comes before the exit.
fn read_failure(error: &OwnedFd) -> Option<(u32, i32)> {
    let mut poll = libc::pollfd {
        fd: error.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack, for our own pipe.
    if unsafe { libc::poll(&mut poll, 1, 100) } != 1 {
        return None;
    }
    let mut record = [0u8; 8];
    // SAFETY: reading into a stack buffer from our own pipe, which has data.
    let got = unsafe { libc::read(error.as_raw_fd(), record.as_mut_ptr().cast(), 8) };
    child::read_record(&record[..got.clamp(0, 8) as usize])
}

fn open_namespace(pid: i32, kind: &str) -> Option<OwnedFd> {
    let path = format!("/proc/{pid}/ns/{kind}");
    match fs::File::open(&path) {
        Ok(file) => Some(file.into()),
        Err(e) => {
            tracing::debug!(path, error = %e, "native: cannot open the exec's namespace");
            None
        }
    }
}
