//! The spawner process's side (the "server" of the socket, not `skillbox serve`):
//! answers the caller's requests on stdin, one clone each, until the caller closes it.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::wire::{
    CLONE_FAILED, MALFORMED, MAX_REQUEST, READY, decode, recv_with_fds, reply, send_with_fds,
};

/// The spawner process's body: answers requests on stdin until the server closes it.
/// Returns the exit code; says why on stderr when it is not 0.
pub fn main(args: &[String]) -> i32 {
    let fail = |why: &str| {
        eprintln!("skillbox spawner process: {why}");
        1
    };
    // SAFETY: prctl, getppid, signal, close_range and chdir with no pointers but a
    // static string.
    unsafe {
        // Set before exec by the server; set again in case, then make sure the server did
        // not die before it was in place.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        let server = args.first().and_then(|p| p.parse::<i32>().ok());
        if server != Some(libc::getppid()) {
            return fail("not started by the server it names");
        }
        // The server stops it (its socket's end, its death); a terminal's or a service
        // manager's signals to the server's group are the server's to handle.
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(signal, libc::SIG_IGN);
        }
        // Nothing of whoever started the server: no fd but stdio (the socket is 0), no
        // directory held.
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        libc::chdir(c"/".as_ptr());
    }
    // SAFETY: stdin is the socketpair's end the server gave us, ours alone.
    let socket = UnixStream::from(unsafe { OwnedFd::from_raw_fd(0) });
    if (&socket).write_all(&[READY]).is_err() {
        return fail("cannot greet the server");
    }
    // One payload stack for every init: each clone shares it copy-on-write and writes
    // only the few pages it uses, and this process never writes it again. (A fresh one
    // a request cost a memset of its every page here: glibc serves it from the heap
    // once a freed large block has raised its mmap threshold.)
    let mut stack: Vec<u8> = vec![0; crate::child::PAYLOAD_STACK];
    // Likewise the buffer a prepared init reads its command into.
    let mut late_buffer: Vec<u8> = vec![0; crate::child::LATE_BYTES];
    loop {
        let mut header = [0u8; 4];
        let fds = match recv_with_fds(&socket, &mut header) {
            Ok(fds) => fds,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return 0,
            Err(e) => return fail(&format!("cannot read a request: {e}")),
        };
        let len = u32::from_le_bytes(header) as usize;
        if len > MAX_REQUEST {
            return fail(&format!("a request of {len} bytes"));
        }
        let mut body = vec![0u8; len];
        if let Err(e) = (&socket).read_exact(&mut body) {
            return fail(&format!("cannot read a request: {e}"));
        }
        let answer = match decode(&body, &fds) {
            Some((mut plan, into)) => {
                plan.payload_stack = std::mem::take(&mut stack);
                if plan.late {
                    plan.late_buffer = std::mem::take(&mut late_buffer);
                }
                let cloned = crate::clone::clone_init(&mut plan, into, true);
                stack = std::mem::take(&mut plan.payload_stack);
                if plan.late {
                    late_buffer = std::mem::take(&mut plan.late_buffer);
                }
                cloned.map_err(|e| (CLONE_FAILED, e.raw_os_error().unwrap_or(libc::EIO)))
            }
            None => Err((MALFORMED, libc::EINVAL)),
        };
        drop(fds);
        let sent = match answer {
            Ok((pid, pidfd)) => send_with_fds(&socket, &reply(pid, 0, 0), &[pidfd.as_raw_fd()]),
            Err((what, errno)) => send_with_fds(&socket, &reply(0, what, errno), &[]),
        };
        if let Err(e) = sent {
            return fail(&format!("cannot answer: {e}"));
        }
    }
}
