//! The proxy's listener inside a sandbox's own network namespace: a socket made there
//! stays there, so only the sandbox's processes reach it, while the proxy that accepts
//! on it (and its own connections) live in skillbox's namespace.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The port the proxy listens on, on each sandbox's own loopback.
pub const EGRESS_PORT: u16 = 3128;

/// The proxy's address as a sandbox's programs are told it.
pub fn proxy_url() -> String {
    format!("http://127.0.0.1:{EGRESS_PORT}")
}

/// The environment that points the usual clients at the proxy (curl, Python's urllib
/// and requests, pip, npm, git): each unless the exec sets it itself.
pub fn proxy_env() -> Vec<(&'static str, String)> {
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

/// A socket listening on `127.0.0.1:EGRESS_PORT` in the network namespace `net`, its
/// `lo` brought up first, made by a thread of its own that joins `net` (setns moves
/// only the calling thread) and then ends. Needs CAP_SYS_ADMIN over the namespace's
/// owner (root, for a namespace another user namespace does not own).
pub fn listen_in(net: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let net = net.try_clone_to_owned()?;
    std::thread::Builder::new()
        .name("skillbox-egress".into())
        .spawn(move || {
            // SAFETY: joining a network namespace from a thread that does nothing else
            // and then exits.
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
        .map_err(|_| io::Error::other("the egress listen thread panicked"))?
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Brings `lo` up in the calling thread's network namespace: 0, or -1 (errno set).
/// Raw syscalls only: safe in a forked child and in a sandbox's init.
///
/// # Safety
/// Async-signal-safe; no preconditions beyond a usable stack.
pub unsafe fn loopback_up() -> libc::c_long {
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: libc::c_short,
        pad: [u8; 22],
    }
    // SAFETY: a plain socket + two ioctls on a stack struct of the kernel's size.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return -1;
        }
        let mut req = IfReq {
            name: [0; 16],
            flags: 0,
            pad: [0; 22],
        };
        req.name[..2].copy_from_slice(b"lo");
        let mut rc = libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req as *mut IfReq);
        if rc == 0 {
            req.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            rc = libc::ioctl(sock, libc::SIOCSIFFLAGS, &mut req as *mut IfReq);
        }
        libc::close(sock);
        rc as libc::c_long
    }
}

/// `lo` up, then a non-blocking socket listening on `127.0.0.1:EGRESS_PORT` in the
/// calling thread's network namespace: the fd, or the errno. Raw syscalls only (safe
/// in a forked child).
///
/// # Safety
/// Async-signal-safe; the caller owns the fd it gets.
pub unsafe fn listen_loopback() -> Result<RawFd, i32> {
    // SAFETY: raw socket calls; the fd is closed on every error path.
    unsafe {
        if loopback_up() != 0 {
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
