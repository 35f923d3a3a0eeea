//! Egress for a native sandbox (DESIGN.md §8): the exec's network namespace still has
//! only `lo`. Before the exec's init is let go, skillbox makes a listening socket on
//! `127.0.0.1:EGRESS_PORT` *in that namespace* (a thread of its own joins it as root;
//! otherwise a forked child joins its user namespace first and hands the socket back)
//! and serves it with the sandbox's [`Proxy`](skillbox_egress::Proxy) from the host
//! side: the socket stays in the sandbox's namespace, so nothing but the sandbox's own
//! processes can reach it, and the proxy's own connections are made from skillbox's
//! namespace. A connection that ignores the proxy has no route anywhere.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::connect::{close_all_but, errno, receive_fd, send_report};

/// The port the proxy listens on, on each exec's own loopback.
pub(crate) const EGRESS_PORT: u16 = 3128;

/// Whether `policy` gives the sandbox egress: a network policy with an allow entry.
pub(crate) fn wanted(policy: &skillbox_env::SandboxPolicy) -> bool {
    policy.wants_egress()
}

/// The sandbox's proxy, or `None` without egress; a bad policy is `invalid`, naming
/// the entry.
pub(crate) fn proxy_for(
    policy: &skillbox_env::SandboxPolicy,
    resolver: &std::sync::Arc<dyn skillbox_egress::Resolve>,
) -> skillbox_env::EnvResult<Option<skillbox_egress::Proxy>> {
    let Some(network) = &policy.network else {
        return Ok(None);
    };
    let rules = skillbox_egress::Rules::new(network)
        .map_err(|e| skillbox_env::EnvError::invalid(e.to_string()))?;
    if !wanted(policy) {
        return Ok(None);
    }
    if policy.listen_ports.contains(&EGRESS_PORT) {
        return Err(skillbox_env::EnvError::invalid(format!(
            "listenPorts: {EGRESS_PORT} is where the egress proxy listens in a sandbox with a network policy"
        )));
    }
    Ok(Some(skillbox_egress::Proxy::new(
        rules,
        resolver.clone(),
        skillbox_egress::ProxyLimits {
            egress_bytes: policy.egress_bytes,
            ..skillbox_egress::ProxyLimits::default()
        },
    )))
}

/// The proxy's address as the sandbox's programs are told it.
pub(crate) fn proxy_url() -> String {
    format!("http://127.0.0.1:{EGRESS_PORT}")
}

/// The environment that points the usual clients at the proxy (curl, Python's
/// urllib and requests, pip, npm, Node's fetch through its proxy agent, git): each
/// unless the exec sets it itself.
pub(crate) fn proxy_env() -> Vec<(&'static str, String)> {
    let url = proxy_url();
    let mut env: Vec<(&'static str, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "npm_config_proxy",
        "npm_config_https_proxy",
        "PIP_PROXY",
    ]
    .into_iter()
    .map(|name| (name, url.clone()))
    .collect();
    env.push(("NO_PROXY", "localhost,127.0.0.1,::1".into()));
    env.push(("no_proxy", "localhost,127.0.0.1,::1".into()));
    env
}

/// A listening socket on `127.0.0.1:EGRESS_PORT` in the network namespace `net`, its
/// `lo` brought up first. As root a thread of its own joins `net`; otherwise `user`
/// (the namespace's owner) is given and a forked child joins both.
pub(crate) fn listen_in(net: BorrowedFd<'_>, user: Option<BorrowedFd<'_>>) -> io::Result<OwnedFd> {
    let Some(user) = user else {
        let net = net.try_clone_to_owned()?;
        // setns moves only the calling thread: this one, which ends after the listen.
        return std::thread::Builder::new()
            .name("skillbox-egress".into())
            .spawn(move || {
                // SAFETY: joining a network namespace from a thread that does nothing
                // else and then exits.
                if unsafe { libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: raw socket calls on memory this thread owns.
                unsafe { listen_loopback() }
                    .map_err(io::Error::from_raw_os_error)
                    // SAFETY: a fresh fd the listen handed us.
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            })?
            .join()
            .map_err(|_| io::Error::other("the egress listen thread panicked"))?;
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
        match listen_loopback() {
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

/// `lo` up, then a socket listening on `127.0.0.1:EGRESS_PORT`: the fd, or the errno.
/// Raw syscalls only (safe in a forked child).
///
/// # Safety
/// Runs in the namespace to listen in.
unsafe fn listen_loopback() -> Result<RawFd, i32> {
    // SAFETY: raw socket calls; the fd is closed on every error path.
    unsafe {
        if crate::child::loopback_up() != 0 {
            return Err(errno());
        }
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        );
        if fd < 0 {
            return Err(errno());
        }
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: EGRESS_PORT.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        if libc::bind(
            fd,
            std::ptr::from_ref(&address).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) != 0
            || libc::listen(fd, 128) != 0
        {
            let e = errno();
            libc::close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}
