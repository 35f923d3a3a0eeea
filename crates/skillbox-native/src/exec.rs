//! Running commands in a `NativeSandbox` (its `Shell`): the plan of an exec, its init
//! cloned (or the one prepared ahead, given its command), setup waited for, output
//! pumped, and how the command ended reported through the exit rule.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use skillbox_env::{
    CancellationToken, Ended, Ending, EnvError, EnvResult, ErrorCode, ExecEvent, ExecRequest,
    ExecStream, Shell, StreamKind, Truncated, errno_code, pump_output,
};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use crate::cgroup::ExecCgroup;
use crate::child::{ChildFds, ChildPlan, STEP_CHDIR, STEP_EXEC, read_record};
use crate::child::{MAX_ARGS, MAX_ENV, MAX_PROGRAMS};
use crate::layout;
use crate::sandbox::{NativeSandbox, PreparedExec, sandbox_counter, unavailable};
use crate::spawn::{self, InitProcess, Started};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl NativeSandbox {
    fn needs_cgroup(&self) -> bool {
        (self.limits.memory_bytes.is_some() && self.cgroup_host.has("memory"))
            || (self.limits.pids.is_some() && self.cgroup_host.has("pids"))
            || self.limits.cpus.is_some()
    }

    /// The plan of an exec without its command: what [`NativeSandbox::prepare_exec`]
    /// starts an init from.
    fn layout_plan(&self) -> ChildPlan {
        ChildPlan {
            layout: self.root.layout.clone(),
            // As root (an idmapped workspace too) the inherited supplementary groups
            // are dropped; unprivileged, the kernel allows no setgroups at all.
            // SAFETY: geteuid has no preconditions.
            clear_groups: unsafe { libc::geteuid() } == 0,
            cwd: CString::default(),
            programs: Vec::new(),
            argv: Vec::new(),
            env: Vec::new(),
            // Allocated by whoever clones (`spawn`): the spawner process has its own.
            payload_stack: Vec::new(),
            late: false,
            late_buffer: Vec::new(),
            egress: self.egress.is_some(),
            workspace_tree: -1,
            bind_trees: Vec::new(),
            // Filled in by whoever clones (`spawn`), from the exec's cgroup.
            cgroup_join: Vec::new(),
            // The child clones the tmpfs itself, unless it is kept in its helper's
            // namespaces (`start_init` hands it a clone made there).
            workspace_source: match &self.scratch {
                Some(s) if !s.cloned_per_exec() => std::os::fd::AsRawFd::as_raw_fd(&s.fd()),
                _ => -1,
            },
            fds: ChildFds {
                sync: -1,
                error: -1,
                status: -1,
                stdin: -1,
                stdout: -1,
                stderr: -1,
            },
        }
    }

    fn child_plan(&self, request: &ExecRequest) -> EnvResult<ChildPlan> {
        let argv = request.command.to_argv();
        if argv.len() > MAX_ARGS {
            return Err(EnvError::invalid(format!(
                "command: more than {MAX_ARGS} arguments"
            )));
        }
        let mut env = vec![
            ("PATH".to_string(), PATH.to_string()),
            ("HOME".into(), "/tmp".into()),
            ("USER".into(), "sandbox".into()),
            ("LOGNAME".into(), "sandbox".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TMPDIR".into(), "/tmp".into()),
            ("SHELL".into(), "/bin/sh".into()),
        ];
        if let Some(egress) = &self.egress {
            env.extend(
                crate::egress::proxy_env()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v)),
            );
            env.extend(egress.env.iter().cloned());
        }
        for (key, value) in &request.env {
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value.clone()));
        }
        if env.len() > MAX_ENV {
            return Err(EnvError::invalid(format!(
                "env: more than {MAX_ENV} variables"
            )));
        }
        let path_var = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let cwd = self.absolute_path(request.cwd.as_deref().unwrap_or(&self.cwd));
        let c = |s: &str| {
            CString::new(s).map_err(|_| EnvError::invalid("command: contains a NUL byte"))
        };
        let programs = if argv[0].contains('/') {
            vec![c(&argv[0])?]
        } else {
            path_var
                .split(':')
                .filter(|d| d.starts_with('/'))
                .map(|d| c(&format!("{d}/{}", argv[0])))
                .collect::<EnvResult<Vec<_>>>()?
        };
        if programs.len() > MAX_PROGRAMS {
            return Err(EnvError::invalid(format!(
                "env PATH: more than {MAX_PROGRAMS} directories"
            )));
        }
        Ok(ChildPlan {
            cwd: CString::new(cwd.as_os_str().as_bytes())
                .map_err(|_| EnvError::invalid("cwd: contains a NUL byte"))?,
            programs,
            argv: argv.iter().map(|a| c(a)).collect::<EnvResult<_>>()?,
            env: env
                .iter()
                .map(|(k, v)| c(&format!("{k}={v}")))
                .collect::<EnvResult<_>>()?,
            ..self.layout_plan()
        })
    }

    /// Starts the next exec's init now, ahead of its command: its clone, maps, root,
    /// layers and cgroup, so that exec only sends its command. Not for a sandbox with
    /// egress (its listener and proxy are per exec) nor a one-shot one; a sandbox holds
    /// one at most.
    pub async fn prepare_exec(&self) -> EnvResult<()> {
        // Counted as running: a cleanup meanwhile waits until the init started here
        // is ended and its cgroup gone.
        let _running = self.running.token();
        let has_one = self.prepared.lock().map_or(true, |slot| slot.is_some());
        if self.egress.is_some() || self.one_shot || self.shutdown.is_cancelled() || has_one {
            return Ok(());
        }
        let plan = ChildPlan {
            late: true,
            ..self.layout_plan()
        };
        let (started, cgroup) = self.start_init(plan).await?;
        let prepared = PreparedExec {
            started: Some(started),
            cgroup,
        };
        let unused = match self.prepared.lock() {
            // Cleaned up meanwhile: ended here (killed, its cgroup removed).
            Ok(_) if self.shutdown.is_cancelled() => Some(prepared),
            Ok(mut slot) if slot.is_none() => slot.replace(prepared),
            _ => Some(prepared),
        };
        if let Some(unused) = unused {
            unused.discard(false).await;
        }
        Ok(())
    }

    /// Clones an exec's init from `plan`, in its cgroup: the clones of the captured
    /// binds it attaches are made here and dropped once it has its own.
    async fn start_init(
        &self,
        mut plan: ChildPlan,
    ) -> EnvResult<(Started, Option<Arc<ExecCgroup>>)> {
        // A detached mount attaches once: an idmapped workspace is cloned per exec.
        let workspace_tree = if self.idmapped {
            let captured = self.workspace_bind_tree();
            let tree = match captured {
                Some(tree) => tree
                    .clone_for_exec()
                    .map_err(|e| format!("open_tree of the captured workspace: {e}"))
                    .and_then(|clone| {
                        crate::idmap::idmapped(
                            clone,
                            &self.workspace,
                            crate::idmap::Mapping::ROOT_WORKSPACE,
                        )
                    }),
                None => crate::idmap::idmapped_tree(&self.workspace),
            }
            .map_err(|e| unavailable("idmapped workspace", e))?;
            plan.workspace_tree = std::os::fd::AsRawFd::as_raw_fd(&tree);
            Some(tree)
        } else {
            None
        };
        // A tmpfs kept in its helper's namespaces (an older kernel): a clone made there
        // for this exec, which the child attaches as it is.
        // (A fork of this process and a wait: off the async threads.)
        let scratch_tree = match &self.scratch {
            Some(scratch) if scratch.cloned_per_exec() => {
                let scratch = scratch.clone();
                tokio::task::spawn_blocking(move || scratch.exec_tree())
                    .await
                    .map_err(|e| unavailable("disk limit", e))?
                    .map_err(|e| unavailable("disk limit", e))?
            }
            _ => None,
        };
        if let Some(tree) = &scratch_tree {
            plan.workspace_tree = std::os::fd::AsRawFd::as_raw_fd(tree);
        }
        // The binds captured at create, cloned for this exec (a detached mount attaches
        // once); the idmapped workspace has its own clone above.
        // The volumes: cloned from their fds (as root).
        let slots = self
            .volumes
            .iter()
            .map(|v| v.slot + 1)
            .fold(self.bind_trees.len(), usize::max);
        let bind_clones = (0..slots)
            .map(|slot| {
                if let Some(volume) = self.volumes.iter().find(|v| v.slot == slot) {
                    return volume.clone_for_exec().map(Some);
                }
                match self.bind_trees.get(slot) {
                    Some(Some(tree)) if !(self.idmapped && slot == self.workspace_bind_slot()) => {
                        tree.clone_for_exec().map(Some).map_err(|e| {
                            unavailable("mount_ns", format!("cloning a captured bind: {e}"))
                        })
                    }
                    _ => Ok(None),
                }
            })
            .collect::<EnvResult<Vec<_>>>()?;
        plan.bind_trees = bind_clones
            .iter()
            .map(|t| t.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd))
            .collect();
        let cgroup = if self.needs_cgroup() {
            let name = format!(
                "{}-{}",
                sandbox_counter(),
                self.dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            );
            Some(Arc::new(
                ExecCgroup::create(self.cgroup_host, &self.limits, &name)
                    .map_err(|e| unavailable("cgroup", e))?,
            ))
        } else {
            None
        };
        let started = if self.one_shot {
            spawn::start_here(plan, self.ids, cgroup.as_deref())
        } else {
            spawn::start(plan, self.ids, cgroup.clone()).await
        }
        .map_err(|e| unavailable("setup", e))?;
        // The child has its copies (and moved them into place): ours can go.
        drop(workspace_tree);
        drop(scratch_tree);
        drop(bind_clones);
        Ok((started, cgroup))
    }

    /// The workspace's bind source as captured at create, if it was.
    fn workspace_bind_tree(&self) -> Option<&crate::trees::Captured> {
        self.bind_trees
            .get(self.workspace_bind_slot())
            .and_then(Option::as_ref)
    }

    /// The workspace's place among the binds.
    fn workspace_bind_slot(&self) -> usize {
        self.root.layout.mounts[..self.root.layout.workspace_op]
            .iter()
            .filter(|op| matches!(op, crate::child::MountOp::Bind { .. }))
            .count()
    }
}

impl NativeSandbox {
    /// The memory bound when it is held as an address-space limit (no memory cgroup
    /// here) rather than a cgroup's.
    fn address_space_bound(&self) -> Option<u64> {
        self.limits
            .memory_bytes
            .filter(|_| !self.cgroup_host.has("memory"))
    }
}

/// The line stderr gets when a command crashed (a signal its runtime raises on a failed
/// reservation: SIGTRAP, SIGABRT, SIGSEGV, SIGBUS) under a memory bound held as
/// `RLIMIT_AS`: address space reserved ahead counts against it though it is never
/// used, and node reserves about 720 MiB before it runs a line.
fn crash_note(program: &str, ending: &Ending, bound: u64) -> Option<String> {
    let Ending::Signaled(signal) = ending else {
        return None;
    };
    let name = match *signal {
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        _ => return None,
    };
    Some(format!(
        "skillbox: {program} crashed ({name}) under a memory bound of {} MiB held as an address-space limit (RLIMIT_AS: no memory cgroup for this user); address space a runtime reserves ahead counts against it (node needs about 720 MiB): raise --memory (1G runs node), or run where a cgroup is delegated (see `skillbox doctor`)\n",
        bound / (1024 * 1024)
    ))
}

/// Waits for init to exit and reaps it. (Dropping the `InitProcess` instead kills it.)
async fn reap(watch: &AsyncFd<OwnedFd>, init: &mut InitProcess) {
    while !init.try_reap() {
        match watch.readable().await {
            Ok(mut guard) => guard.clear_ready(),
            // Without the watch, poll: a rare fallback, never the normal path.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
        }
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

#[async_trait]
impl Shell for NativeSandbox {
    async fn prepare_next(&self) {
        if let Err(e) = self.prepare_exec().await {
            tracing::debug!(error = %e, "native: the next exec was not prepared");
        }
    }

    async fn exec_stream(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecStream> {
        request.validate()?;
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("exec"));
        }
        if self.shutdown.is_cancelled() {
            return Err(EnvError::unavailable(
                "native: this sandbox was cleaned up; create a new one",
            ));
        }
        let plan = self.child_plan(&request)?;
        let timeout = request.timeout.unwrap_or(self.limits.timeout());
        let started_at = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        // A prepared init takes the command as it is; one too large for it is started
        // the usual way (and the prepared one kept for a later exec).
        let command = crate::child::late_command(&plan.cwd, &plan.programs, &plan.argv, &plan.env);
        let prepared = match command {
            Some(_) => self.prepared.lock().ok().and_then(|mut slot| slot.take()),
            None => None,
        }
        .and_then(|mut prepared| prepared.waiting().then_some(prepared))
        .and_then(PreparedExec::take);
        let (
            Started {
                mut init,
                stdin,
                stdout,
                stderr,
                error,
                status,
                namespaces,
                egress,
                go: sync,
            },
            cgroup,
        ) = match (prepared, command) {
            (Some((mut started, cgroup)), Some(command)) => {
                if started.go(&command) {
                    (started, cgroup)
                } else {
                    // Gone before its command came: dropped, and a fresh one started.
                    drop(PreparedExec {
                        started: Some(started),
                        cgroup,
                    });
                    self.start_init(plan).await?
                }
            }
            _ => self.start_init(plan).await?,
        };
        // The proxy serves this exec's loopback listener until the exec's task ends.
        let egress_done = match (egress, self.egress.as_ref().map(|e| &e.proxy)) {
            (Some(listener), Some(proxy)) => {
                let listener = std::net::TcpListener::from(listener);
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(|e| unavailable("egress", format!("the proxy's listener: {e}")))?;
                let done = CancellationToken::new();
                let (proxy, until) = (proxy.clone(), done.clone());
                tokio::spawn(async move { proxy.serve_until(listener, until).await });
                Some(done.drop_guard())
            }
            _ => None,
        };
        let spawned_at = Instant::now();
        let spawn_ms = started_at.elapsed().as_millis();
        tracing::debug!(spawn_ms, "native: sandbox cloned");
        let watch = init
            .watch_fd()
            .map_err(|e| EnvError::io(&e, "watch", "sandbox init"))?;
        // SAFETY: the OwnedFd stays open and unchanged inside the AsyncFd until it drops.
        let watch =
            unsafe { AsyncFd::register_with_interest(watch, tokio::io::Interest::READABLE) }
                .map_err(|e| EnvError::io(&e.into(), "watch", "sandbox init"))?;
        let pipe_err = |e: std::io::Error| EnvError::io(&e, "pipe", "sandbox");

        // The error pipe closes when the payload execs (or setup fails): wait for that.
        let mut error = pipe::Receiver::from_owned_fd(error).map_err(pipe_err)?;
        let mut record = Vec::new();
        let setup = tokio::select! {
            read = error.read_to_end(&mut record) => read.map(|_| ()).map_err(pipe_err),
            () = tokio::time::sleep_until(deadline) => Err(EnvError::new(
                ErrorCode::Timeout,
                format!(
                    "native: sandbox setup did not finish before the timeout (clone and maps took {spawn_ms} ms, then {} ms waiting for the exec)",
                    spawned_at.elapsed().as_millis()
                ),
            )),
            () = cancel.cancelled() => Err(EnvError::aborted("exec")),
        };
        let setup = setup.and_then(|()| match read_record(&record) {
            None => Ok(None),
            Some((STEP_EXEC, errno)) => Ok(Some(errno)),
            Some((STEP_CHDIR, errno)) => Err(EnvError::new(
                errno_code(errno),
                format!("cwd {}: {}", plan_cwd(&request, self), errno_text(errno)),
            )),
            Some((step, errno)) => Err(unavailable(
                &layout::describe_step(&self.root.layout, step),
                errno_text(errno),
            )),
        });
        let exec_errno = match setup {
            Ok(exec_errno) => exec_errno,
            Err(e) => {
                init.kill();
                reap(&watch, &mut init).await;
                return Err(e);
            }
        };
        // Init is past its look at the sync pipe (it runs the command, or failed to).
        drop(sync);

        let (tx, stream) = ExecStream::channel();
        let stream = match (init.watch_fd(), namespaces.net) {
            (Ok(pidfd), Some(net)) => {
                let workspace = self
                    .root
                    .mounts
                    .iter()
                    .find(|m| m.sandbox == self.root.workspace)
                    .map(|m| m.fd.clone());
                // Root joins the exec's network namespace directly; anyone else through
                // the user namespace their sandbox runs in.
                // SAFETY: geteuid has no preconditions.
                let user = (unsafe { libc::geteuid() } != 0)
                    .then_some(namespaces.user)
                    .flatten();
                stream.with_connector(Arc::new(crate::connect::NativeConnector::new(
                    init.pid(),
                    pidfd,
                    net,
                    user,
                    workspace,
                )))
            }
            _ => {
                tracing::debug!("native: this exec has no connector");
                stream
            }
        };
        let cap = self.limits.output_bytes;
        let stdout = pipe::Receiver::from_owned_fd(stdout).map_err(pipe_err)?;
        let stderr = pipe::Receiver::from_owned_fd(stderr).map_err(pipe_err)?;
        let stdout_task = tokio::spawn(pump_output(stdout, StreamKind::Stdout, cap, tx.clone()));
        let stderr_task = tokio::spawn(pump_output(stderr, StreamKind::Stderr, cap, tx.clone()));
        match (request.stdin, exec_errno) {
            (Some(input), None) => {
                let mut sink = pipe::Sender::from_owned_fd(stdin).map_err(pipe_err)?;
                tokio::spawn(async move {
                    let _ = sink.write_all(&input).await;
                });
            }
            _ => drop(stdin),
        }
        if let Some(errno) = exec_errno {
            let what = if errno == libc::ENOENT {
                "command not found".to_string()
            } else {
                errno_text(errno)
            };
            let line = format!("skillbox: {}: {what}\n", request.command.to_argv()[0]);
            let _ = tx
                .send(Ok(ExecEvent::Stderr(line.into_bytes().into())))
                .await;
        }
        let cancel = cancel.clone();
        let shutdown = self.shutdown.clone();
        let one_shot = self.one_shot;
        let scratch = self.scratch.clone();
        // What a crash note needs, only where one can be given (not on every exec).
        let crash_note_for = self
            .address_space_bound()
            .map(|bytes| (request.command.to_argv()[0].clone(), bytes));
        self.running.spawn(async move {
            let _egress = egress_done;
            let mut timed_out = false;
            let mut aborted = false;
            // Init writes the payload's wait status, then exits, which kills what is
            // left in the namespace. The status is the answer: the namespaces' teardown
            // after it is not waited for before the exit is reported (it is before the
            // cgroup goes, and before `cleanup` returns).
            let mut status_bytes = [0u8; 4];
            let mut wait_status = None;
            match pipe::Receiver::from_owned_fd(status) {
                Ok(mut status) => tokio::select! {
                    read = status.read_exact(&mut status_bytes) => {
                        wait_status = read.ok().map(|_| i32::from_ne_bytes(status_bytes));
                    }
                    () = tokio::time::sleep_until(deadline) => { timed_out = true; }
                    () = cancel.cancelled() => { aborted = true; }
                    () = shutdown.cancelled() => { aborted = true; }
                },
                Err(e) => {
                    tracing::debug!(error = %e, "native: the status pipe; waiting for init instead");
                    tokio::select! {
                        () = reap(&watch, &mut init) => {}
                        () = tokio::time::sleep_until(deadline) => { timed_out = true; }
                        () = cancel.cancelled() => { aborted = true; }
                        () = shutdown.cancelled() => { aborted = true; }
                    }
                }
            }
            // No status (init was killed, by the OOM killer or us), a timeout or an
            // abort: the whole tree dies now. Otherwise init is on its way out and takes
            // what the command left with it.
            if (wait_status.is_none() || timed_out || aborted) && !init.try_reap() {
                init.kill();
                reap(&watch, &mut init).await;
            }
            let truncated = Truncated {
                stdout: stdout_task.await.unwrap_or(false),
                stderr: stderr_task.await.unwrap_or(false),
            };
            let limit_hit = cgroup.as_ref().and_then(|cg| cg.limit_hit());
            let wrap_up = async move {
                // Init exits right after the status; its cgroup goes once it is gone.
                if !init.try_reap() {
                    reap(&watch, &mut init).await;
                }
                // Removing the cgroup may wait for the kernel to let go: not on this
                // thread.
                if let Some(cgroup) = cgroup {
                    if one_shot {
                        drop(cgroup);
                    } else {
                        let _ = tokio::task::spawn_blocking(move || drop(cgroup)).await;
                    }
                }
            };
            if aborted {
                wrap_up.await;
                let _ = tx.send(Err(EnvError::aborted("exec"))).await;
                return;
            }
            let ending = match (exec_errno, wait_status) {
                (Some(errno), _) => Ending::NotStarted(errno),
                (None, Some(status)) => Ending::from_wait_status(status),
                // Init itself was killed: by us on timeout, or by the OOM killer.
                (None, None) => Ending::Killed,
            };
            // A command that failed with its workspace full ran out of disk (the kernel
            // said ENOSPC; the full tmpfs says why).
            let failed = !matches!(ending, Ending::Exited(0));
            let limit_hit = limit_hit.or_else(|| {
                (failed && scratch.as_ref().is_some_and(|s| s.is_full()))
                    .then_some(skillbox_env::LimitKind::Disk)
            });
            if let Some(note) = crash_note_for
                .as_ref()
                .and_then(|(program, bytes)| crash_note(program, &ending, *bytes))
            {
                let _ = tx.send(Ok(ExecEvent::Stderr(note.into_bytes().into()))).await;
            }
            let output = Ended {
                ending,
                timed_out,
                truncated,
                accounted: limit_hit,
                duration: started_at.elapsed(),
            }
            .output();
            let _ = tx.send(Ok(ExecEvent::Exit(output))).await;
            wrap_up.await;
        });
        Ok(stream)
    }
}

fn plan_cwd(request: &ExecRequest, sandbox: &NativeSandbox) -> String {
    sandbox
        .absolute_path(request.cwd.as_deref().unwrap_or(&sandbox.cwd))
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

    use std::io::Read;

    use skillbox_env::{FileSystem, SandboxSpec};

    use super::*;
    use crate::backend::NativeBackend;
    use crate::child::STEP_CGROUP;

    /// Whether the native sandbox runs here; where it cannot, fine only outside CI.
    fn native_available() -> bool {
        let available = crate::probe().available;
        assert!(
            available || !skillbox_env::testkit::require_all(),
            "native sandbox unavailable"
        );
        available
    }

    /// Init that cannot join its cgroup (here: the `tasks` file it is given refuses the
    /// write) stops there and says so: its command never runs, outside the limits or
    /// at all.
    #[test]
    fn init_that_cannot_join_its_cgroup_runs_nothing() {
        if !native_available() {
            return;
        }
        let data = tempfile::tempdir().unwrap();
        let backend = NativeBackend::new(data.path());
        let sandbox = backend
            .create_blocking(SandboxSpec {
                workspace: None,
                ..SandboxSpec::default()
            })
            .unwrap();
        let plan = sandbox
            .child_plan(&ExecRequest::argv(["/bin/echo", "ran"]))
            .unwrap();
        // Open for reading only: init's write of `0` fails with EBADF.
        let tasks = std::fs::File::open("/proc/self/cgroup").unwrap();
        let started = spawn::clone_into_cgroup(
            Box::new(plan),
            sandbox.ids,
            None,
            &[OwnedFd::from(tasks)],
            false,
        );
        match started {
            Ok(mut started) => {
                let mut record = Vec::new();
                std::fs::File::from(started.error.try_clone().unwrap())
                    .read_to_end(&mut record)
                    .unwrap();
                assert_eq!(
                    read_record(&record),
                    Some((STEP_CGROUP, libc::EBADF)),
                    "init names the step that failed"
                );
                // The command's stdout: nothing, and closed (init, its one writer, is
                // gone without forking it).
                let mut out = Vec::new();
                std::fs::File::from(started.stdout.try_clone().unwrap())
                    .read_to_end(&mut out)
                    .unwrap();
                assert!(out.is_empty(), "the command ran: {out:?}");
                while !started.init.try_reap() {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
            // Init failed before the parent's second byte: the parent read why.
            Err(message) => assert!(
                message.contains("cgroup: joining") && message.contains("Bad file descriptor"),
                "{message}"
            ),
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(sandbox.cleanup()).unwrap();
    }

    /// A parent that dies just after it let init go (before init could set its
    /// parent-death signal again after the uid switch, say) leaves an init that runs
    /// nothing: init finds the parent's end of its sync pipe closed and exits.
    #[test]
    fn an_init_whose_parent_is_gone_runs_nothing() {
        if !native_available() {
            return;
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let data = tempfile::tempdir().unwrap();
            let backend = NativeBackend::new(data.path());
            let sandbox = backend.create(SandboxSpec::default()).await.unwrap();
            sandbox.prepare_exec().await.unwrap();
            let prepared = sandbox.prepared.lock().unwrap().take().unwrap();
            let (mut started, _cgroup) = prepared.take().unwrap();
            let plan = sandbox
                .child_plan(&ExecRequest::argv(["/bin/echo", "ran"]))
                .unwrap();
            let command =
                crate::child::late_command(&plan.cwd, &plan.programs, &plan.argv, &plan.env)
                    .unwrap();
            // Stopped, init finds both the command and the closed end when it looks.
            let pid = started.init.pid();
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            assert!(started.go(&command), "the command is sent");
            drop(started.go.take());
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            let mut out = Vec::new();
            std::fs::File::from(started.stdout.try_clone().unwrap())
                .read_to_end(&mut out)
                .unwrap();
            assert!(out.is_empty(), "the command ran: {out:?}");
            while !started.init.try_reap() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            drop(started);
            sandbox.cleanup().await.unwrap();
        });
    }
}
