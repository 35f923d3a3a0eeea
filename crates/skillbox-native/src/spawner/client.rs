//! The caller's side of the spawner process (the server's spawner thread, in
//! `skillbox serve`): starts it, and asks it to clone each init.

use std::io::{self, Read, Write};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use super::wire::{
    CLONE_FAILED, MALFORMED, MAX_FDS, MAX_REQUEST, READY, SUBCOMMAND, encode, recv_with_fds,
    send_with_fds,
};
use crate::child::ChildPlan;

/// The running spawner process, as the server's spawner thread sees it.
struct Remote {
    socket: UnixStream,
    process: Child,
}

/// `None` until [`start`] succeeded, and again once the process failed.
fn remote() -> &'static Mutex<Option<Remote>> {
    static REMOTE: OnceLock<Mutex<Option<Remote>>> = OnceLock::new();
    REMOTE.get_or_init(|| Mutex::new(None))
}

/// Starts the spawner process from `program` (this program, which must answer
/// [`SUBCOMMAND`] by calling [`main`](super::server::main)), with `args` before the
/// subcommand's own (a test binary's filter), and waits for it to say it is ready. Call
/// once, on the thread that will clone (its exit kills the process, and every init it
/// cloned), after the cgroup host was detected (on v2 that moves this process into its
/// own leaf, where the spawner process must start too).
pub(crate) fn start(program: &std::path::Path, args: &[String]) -> io::Result<u32> {
    let (ours, theirs) = UnixStream::pair()?;
    let mut command = Command::new(program);
    command
        .args(args)
        .arg(SUBCOMMAND)
        .arg(std::process::id().to_string())
        .env_clear()
        .current_dir("/")
        // Out of the server's process group: a terminal's ^C is the server's to handle.
        .process_group(0)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut process = command.spawn()?;
    let ready = (|| {
        ours.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
        let mut byte = [0u8];
        (&ours).read_exact(&mut byte)?;
        ours.set_read_timeout(None)?;
        if byte[0] == READY {
            Ok(())
        } else {
            Err(io::Error::other(
                "it sent something other than its greeting",
            ))
        }
    })();
    if let Err(e) = ready {
        let _ = process.kill();
        let status = process.wait()?;
        return Err(io::Error::other(format!(
            "the spawner process did not start ({status}): {e}"
        )));
    }
    let pid = process.id();
    *remote().lock().map_err(|_| io::Error::other("poisoned"))? = Some(Remote {
        socket: ours,
        process,
    });
    Ok(pid)
}

/// Whether a spawner process is running to clone for us.
pub(crate) fn running() -> bool {
    remote().lock().is_ok_and(|r| r.is_some())
}

/// Has the spawner process clone init from `plan`: `Ok(None)` when there is no spawner
/// process, and the caller clones itself. When the spawner process fails, this start
/// fails (an init it may have cloned still holds this start's pipes) and later ones
/// are cloned by the caller.
pub(crate) fn clone_init(
    plan: &ChildPlan,
    into: Option<RawFd>,
) -> Result<Option<(i32, OwnedFd)>, String> {
    let Ok(mut guard) = remote().lock() else {
        return Ok(None);
    };
    let Some(remote) = guard.as_mut() else {
        return Ok(None);
    };
    // Found dead between starts: nothing was asked of it, so this start is cloned here.
    if let Ok(Some(status)) = remote.process.try_wait() {
        tracing::warn!(%status, "native: the spawner process exited; sandboxes are cloned by the server from now on");
        *guard = None;
        return Ok(None);
    }
    match ask(&remote.socket, plan, into) {
        Ok(Ok(cloned)) => Ok(Some(cloned)),
        Ok(Err(e)) => Err(e),
        Err(e) => {
            let _ = remote.process.kill();
            let status = remote.process.wait();
            tracing::warn!(error = %e, ?status, "native: the spawner process failed; sandboxes are cloned by the server from now on");
            *guard = None;
            Err(format!(
                "native: the spawner process failed ({e}); run again (sandboxes are now cloned by the server)"
            ))
        }
    }
}

/// One request and its answer. The outer error is the channel's, the inner the start's.
fn ask(
    socket: &UnixStream,
    plan: &ChildPlan,
    into: Option<RawFd>,
) -> io::Result<Result<(i32, OwnedFd), String>> {
    let (body, fds) = encode(plan, into);
    if fds.len() > MAX_FDS || body.len() > MAX_REQUEST {
        return Ok(Err(format!(
            "native: this sandbox's plan is too large to send to the spawner process ({} fds, {} bytes)",
            fds.len(),
            body.len()
        )));
    }
    send_with_fds(socket, &(body.len() as u32).to_le_bytes(), &fds)?;
    (&*socket).write_all(&body)?;
    let mut answer = [0u8; 12];
    let mut fds = recv_with_fds(socket, &mut answer)?;
    let word =
        |i: usize| i32::from_le_bytes([answer[i], answer[i + 1], answer[i + 2], answer[i + 3]]);
    let (pid, what, errno) = (word(0), word(4), word(8));
    match (pid, what, fds.pop()) {
        (1.., 0, Some(pidfd)) if fds.is_empty() => Ok(Ok((pid, pidfd))),
        (0, CLONE_FAILED, None) if errno > 0 => Ok(Err(crate::clone::clone_error(
            &io::Error::from_raw_os_error(errno),
        ))),
        (0, MALFORMED, None) => Ok(Err(
            "native: the spawner process refused this sandbox's plan as malformed".into(),
        )),
        _ => Err(io::Error::other("a malformed answer")),
    }
}
