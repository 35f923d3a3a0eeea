//! Egress for a native sandbox (DESIGN.md §8): the exec's network namespace still has
//! only `lo`. Before the exec's init is let go, skillbox makes a listening socket on
//! `127.0.0.1:EGRESS_PORT` *in that namespace* (a thread of its own joins it as root;
//! otherwise a forked child joins its user namespace first and hands the socket back)
//! and serves it with the sandbox's [`Proxy`](skillbox_egress::Proxy) from the host
//! side: the socket stays in the sandbox's namespace, so nothing but the sandbox's own
//! processes can reach it, and the proxy's own connections are made from skillbox's
//! namespace. A connection that ignores the proxy has no route anywhere.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::connect::{close_all_but, errno, receive_fd, send_report};

pub(crate) use skillbox_egress::netns::{EGRESS_PORT, proxy_env};

/// The sandbox's egress, or `None` without it; a bad policy is `invalid`, naming the
/// entry.
pub(crate) fn proxy_for(
    policy: &skillbox_env::SandboxPolicy,
    resolver: &std::sync::Arc<dyn skillbox_egress::Resolve>,
    upstream_roots: &[rustls_pki_types::CertificateDer<'static>],
) -> skillbox_env::EnvResult<Option<Egress>> {
    if policy.wants_egress() && policy.listen_ports.contains(&EGRESS_PORT) {
        return Err(skillbox_env::EnvError::invalid(format!(
            "listenPorts: {EGRESS_PORT} is where the egress proxy listens in a sandbox with a network policy"
        )));
    }
    skillbox_egress::sandbox_egress(
        policy.network.as_ref(),
        policy.egress_bytes,
        &policy.secrets,
        resolver.clone(),
        upstream_roots,
        CA_DIR,
    )
    .map_err(|e| match e {
        skillbox_egress::SetupError::Invalid(_) => skillbox_env::EnvError::invalid(e.to_string()),
        skillbox_egress::SetupError::Unavailable(_) => {
            skillbox_env::EnvError::unavailable(e.to_string())
        }
    })
}

/// Where a sandbox with secrets finds its CA (read-only): `ca.pem`, and
/// `ca-bundle.pem` (the host's roots and it).
pub(crate) const CA_DIR: &str = "/skillbox-egress";

/// A sandbox's egress: its proxy, the environment its execs get beyond the proxy's
/// (secrets' placeholders, the CA's paths), and its CA when it adds secrets.
pub(crate) type Egress = skillbox_egress::SandboxEgress;

/// Writes the CA files into `dir` (made here, 0755, files 0644: public certificates
/// only) for a read-only mount at [`CA_DIR`].
pub(crate) fn write_ca_dir(dir: &std::path::Path, ca_pem: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let files = skillbox_egress::ca_files(ca_pem).map_err(std::io::Error::other)?;
    for (name, body) in files {
        let path = dir.join(name);
        std::fs::write(&path, body)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// A listening socket on `127.0.0.1:EGRESS_PORT` in the network namespace `net`, its
/// `lo` brought up first. As root a thread of its own joins `net`; otherwise `user`
/// (the namespace's owner) is given and a forked child joins both.
pub(crate) fn listen_in(net: BorrowedFd<'_>, user: Option<BorrowedFd<'_>>) -> io::Result<OwnedFd> {
    let Some(user) = user else {
        return skillbox_egress::netns::listen_in(net);
    };
    let (ours, theirs) = UnixStream::pair()?;
    let fds = [user.as_raw_fd(), net.as_raw_fd(), theirs.as_raw_fd()];
    // SAFETY: the child runs only raw syscalls over memory prepared above (no
    // allocation, no locks) and ends with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the forked child; see `child_listen`.
        unsafe { child_listen(fds) }
    }
    drop(theirs);
    let received = receive_fd(&ours);
    let mut status = 0;
    loop {
        // SAFETY: waiting for the child forked above, which exits right after sending.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    received
}

/// In the forked child: keep three fds (user, net, out), die with skillbox, join,
/// listen, send the socket (or the errno) back, exit.
///
/// # Safety
/// Only in a child just forked from [`listen_in`]: it must not return, allocate or
/// take a lock.
unsafe fn child_listen(fds: [RawFd; 3]) -> ! {
    let [user, net, out] = fds;
    // SAFETY: raw syscalls (all of this block) on fds this child owns copies of.
    unsafe {
        let mut keep = fds;
        keep.sort_unstable();
        close_all_but(&keep);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::setns(user, libc::CLONE_NEWUSER) != 0 || libc::setns(net, libc::CLONE_NEWNET) != 0
        {
            send_report(out, errno(), -1);
            libc::_exit(1);
        }
        match skillbox_egress::netns::listen_loopback() {
            Ok(socket) => {
                send_report(out, 0, socket);
                libc::_exit(0)
            }
            Err(e) => {
                send_report(out, e, -1);
                libc::_exit(1)
            }
        }
    }
}
