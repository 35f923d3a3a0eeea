//! Reaching what a running exec serves, from the host side, without giving the sandbox a
//! network. Each exec has a network namespace of its own with only `lo` in it:
//!
//! - a **port** is reached by a short-lived child of skillbox that joins that namespace
//!   (and its user namespace first when skillbox is not root; both opened when the exec
//!   was made, while its init was still dumpable),
//!   connects to `127.0.0.1:PORT` there, hands the connected socket back over a socket
//!   pair and exits. The socket stays in the sandbox's namespace: it can reach nothing
//!   but the sandbox's own loopback. The child is in the host's pid namespace, which the
//!   sandbox cannot see, and does nothing else.
//! - a **unix socket** under `/workspace` is opened `O_PATH` beneath the workspace's
//!   directory fd (`RESOLVE_BENEATH`, no magic links, a symlink as the last component is
//!   refused), checked to be a socket, and connected through `/proc/self/fd/N`: the
//!   inode the sandbox made, never a path it could point at a host socket.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use skillbox_env::{
    CancellationToken, Duplex, Endpoint, EnvError, EnvResult, ErrorCode, ExecConnector, blocking,
};

/// The longest a connect to a port waits for the sandbox's loopback to answer.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Port connects at once, in this process.
pub const CONCURRENT_PORT_CONNECTS: usize = 32;

fn port_connects() -> &'static tokio::sync::Semaphore {
    static PLACES: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PLACES.get_or_init(|| tokio::sync::Semaphore::new(CONCURRENT_PORT_CONNECTS))
}

/// Connects into one exec of a native sandbox.
#[derive(Debug)]
pub(crate) struct NativeConnector {
    pid: i32,
    /// The exec's init: readable once it has exited.
    pidfd: OwnedFd,
    /// The exec's network namespace.
    net: Arc<OwnedFd>,
    /// Not root: joining the network namespace takes joining its user namespace first.
    user: Option<Arc<OwnedFd>>,
    /// The workspace's directory fd, for sockets under `/workspace`.
    workspace: Option<Arc<OwnedFd>>,
}

impl NativeConnector {
    pub(crate) fn new(
        pid: i32,
        pidfd: OwnedFd,
        net: OwnedFd,
        user: Option<OwnedFd>,
        workspace: Option<Arc<OwnedFd>>,
    ) -> Self {
        NativeConnector {
            pid,
            pidfd,
            net: Arc::new(net),
            user: user.map(Arc::new),
            workspace,
        }
    }

    /// True once the exec's init has exited (its pidfd polls readable).
    fn ended(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one fd we own, without waiting.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0
    }
}

fn refused(endpoint: &Endpoint, e: &io::Error) -> EnvError {
    let code = match e.raw_os_error() {
        // The exec is gone (its namespaces with it), or it does not accept.
        Some(libc::ESRCH | libc::EAGAIN) => ErrorCode::Unavailable,
        Some(errno) => skillbox_env::errno_code(errno),
        None if e.kind() == io::ErrorKind::InvalidInput => ErrorCode::Invalid,
        None => ErrorCode::Unknown,
    };
    let what = match e.raw_os_error() {
        Some(libc::ESRCH) => "the exec has ended".to_string(),
        Some(libc::EAGAIN) => "its queue of connections is full (it does not accept)".to_string(),
        Some(libc::ETIMEDOUT) => format!(
            "no answer within {} s (it does not accept)",
            CONNECT_TIMEOUT.as_secs()
        ),
        _ => e.to_string(),
    };
    EnvError::new(code, format!("connect to {endpoint}: {what}"))
}

#[async_trait]
impl ExecConnector for NativeConnector {
    fn process(&self) -> String {
        format!("pid {}", self.pid)
    }

    async fn connect(
        &self,
        endpoint: &Endpoint,
        cancel: &CancellationToken,
    ) -> EnvResult<Box<dyn Duplex>> {
        let shown = endpoint.clone();
        if self.ended() {
            return Err(refused(
                endpoint,
                &io::Error::from_raw_os_error(libc::ESRCH),
            ));
        }
        let stream: Box<dyn Duplex> = match endpoint {
            Endpoint::Port(port) => {
                let _place = tokio::select! {
                    place = port_connects().acquire() => place.map_err(|_| {
                        EnvError::new(ErrorCode::Unknown, "connect: the connect places are gone")
                    })?,
                    () = cancel.cancelled() => return Err(EnvError::aborted("connect")),
                };
                let (net, user, port) = (self.net.clone(), self.user.clone(), *port);
                let fd = blocking(cancel, "connect", move || {
                    connect_port(net.as_fd(), user.as_deref().map(AsFd::as_fd), port)
                        .map_err(|e| refused(&shown, &e))
                })
                .await?;
                let stream = std::net::TcpStream::from(fd);
                stream
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpStream::from_std(stream))
                    .map(|s| Box::new(s) as Box<dyn Duplex>)
                    .map_err(|e| refused(endpoint, &e))?
            }
            Endpoint::Socket(path) => {
                let relative = Endpoint::socket_in_workspace(path)?;
                let workspace = self.workspace.clone().ok_or_else(|| {
                    EnvError::new(
                        ErrorCode::NotSupported,
                        format!("connect to {endpoint}: this sandbox has no workspace mount"),
                    )
                })?;
                let stream = blocking(cancel, "connect", move || {
                    connect_socket(workspace.as_fd(), &relative).map_err(|e| refused(&shown, &e))
                })
                .await?;
                stream
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::UnixStream::from_std(stream))
                    .map(|s| Box::new(s) as Box<dyn Duplex>)
                    .map_err(|e| refused(endpoint, &e))?
            }
        };
        Ok(stream)
    }
}

fn connect_socket(workspace: BorrowedFd<'_>, relative: &Path) -> io::Result<UnixStream> {
    let fd = rustix::fs::openat2(
        workspace,
        relative,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )?;
    let stat = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Socket {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a socket (a symlink or a file is never followed)",
        ));
    }
    // Non-blocking: a socket whose queue is full answers EAGAIN at once instead of
    // holding this thread until the service accepts.
    let socket = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    )?;
    let address = rustix::net::SocketAddrUnix::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    rustix::net::connect(&socket, &address)?;
    Ok(UnixStream::from(socket))
}

/// A connected TCP socket to `127.0.0.1:port` in the network namespace `net`: joined by
/// a thread of its own as root, else by a forked child that joins `user` (its owner)
/// first.
fn connect_port(
    net: BorrowedFd<'_>,
    user: Option<BorrowedFd<'_>>,
    port: u16,
) -> io::Result<OwnedFd> {
    let address = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let timeout_ms = CONNECT_TIMEOUT.as_millis() as i32;
    let Some(user) = user else {
        let net = net.try_clone_to_owned()?;
        // setns moves only the calling thread: this one, which ends after the connect.
        return std::thread::Builder::new()
            .name("skillbox-connect".into())
            .spawn(move || {
                // SAFETY: joining a network namespace from a thread that does nothing
                // else and then exits.
                if unsafe { libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: raw socket calls on memory this thread owns.
                unsafe { connect_loopback(&address, timeout_ms) }
                    .map_err(io::Error::from_raw_os_error)
                    // SAFETY: a fresh fd the connect handed us.
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            })?
            .join()
            .map_err(|_| io::Error::other("the connect thread panicked"))?;
    };
    let (ours, theirs) = UnixStream::pair()?;
    let fds = ChildFds {
        user: user.as_raw_fd(),
        net: net.as_raw_fd(),
        out: theirs.as_raw_fd(),
    };
    // SAFETY: the child runs only raw syscalls over memory prepared above (no
    // allocation, no locks) and ends with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the forked child; see `child_connect`.
        unsafe { child_connect(&fds, &address, timeout_ms) }
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

/// The fds the forked child keeps: every other is closed before it joins anything.
#[derive(Debug)]
struct ChildFds {
    user: RawFd,
    net: RawFd,
    out: RawFd,
}

/// Payload of the one message the child sends: 0 with the socket attached, or an errno.
pub(crate) type Report = i32;

/// A non-blocking connect to `address`, waited for at most `timeout_ms`; the fd, or
/// the errno. Raw syscalls only (safe in a forked child).
///
/// # Safety
/// `address` is a valid `sockaddr_in`.
unsafe fn connect_loopback(address: &libc::sockaddr_in, timeout_ms: i32) -> Result<RawFd, i32> {
    // SAFETY: raw socket calls; the fd is closed on every error path.
    unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        );
        if fd < 0 {
            return Err(errno());
        }
        let rc = libc::connect(
            fd,
            std::ptr::from_ref(address).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if rc != 0 {
            let e = errno();
            if e != libc::EINPROGRESS {
                libc::close(fd);
                return Err(e);
            }
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            let ready = loop {
                let ready = libc::poll(&mut poll, 1, timeout_ms);
                if ready >= 0 || errno() != libc::EINTR {
                    break ready;
                }
            };
            if ready <= 0 {
                let e = if ready == 0 { libc::ETIMEDOUT } else { errno() };
                libc::close(fd);
                return Err(e);
            }
            let mut error: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                std::ptr::from_mut(&mut error).cast(),
                &mut len,
            );
            if error != 0 {
                libc::close(fd);
                return Err(error);
            }
        }
        Ok(fd)
    }
}

/// Closes every fd of this process but `keep` (sorted).
///
/// # Safety
/// Async-signal-safe; only in the forked child.
pub(crate) unsafe fn close_all_but(keep: &[RawFd; 3]) {
    let mut next: libc::c_uint = 0;
    for &fd in keep {
        let fd = fd as libc::c_uint;
        if fd > next {
            // SAFETY: closing a range of our own fds.
            unsafe { libc::syscall(libc::SYS_close_range, next, fd - 1, 0u32) };
        }
        next = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, next, libc::c_uint::MAX, 0u32) };
}

/// In the forked child: keep three fds, die with skillbox, join, connect, send the
/// socket (or the errno) back, exit.
///
/// # Safety
/// Only in a child just forked from [`connect_port`]: it must not return, allocate or
/// take a lock; `address` and the fds were made before the fork.
unsafe fn child_connect(fds: &ChildFds, address: &libc::sockaddr_in, timeout_ms: i32) -> ! {
    // SAFETY: raw syscalls (all of this block) on fds this child owns copies of.
    unsafe {
        let mut keep = [fds.user, fds.net, fds.out];
        keep.sort_unstable();
        close_all_but(&keep);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::setns(fds.user, libc::CLONE_NEWUSER) != 0
            || libc::setns(fds.net, libc::CLONE_NEWNET) != 0
        {
            send_report(fds.out, errno(), -1);
            libc::_exit(1);
        }
        match connect_loopback(address, timeout_ms) {
            Ok(socket) => {
                send_report(fds.out, 0, socket);
                libc::_exit(0)
            }
            Err(e) => {
                send_report(fds.out, e, -1);
                libc::_exit(1)
            }
        }
    }
}

pub(crate) fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Room for one `SCM_RIGHTS` fd, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct FdControl([u8; 32]);

/// Sends `report`, with `fd` attached when it is not -1.
///
/// # Safety
/// `out` is an open socket; async-signal-safe (no allocation).
pub(crate) unsafe fn send_report(out: RawFd, report: Report, fd: RawFd) {
    let mut payload = report;
    let mut iov = libc::iovec {
        iov_base: std::ptr::from_mut(&mut payload).cast(),
        iov_len: std::mem::size_of::<Report>(),
    };
    let mut control = FdControl([0; 32]);
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if fd >= 0 {
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure; the buffer holds CMSG_SPACE(4) <= 32.
        unsafe {
            message.msg_control = control.0.as_mut_ptr().cast();
            message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: `message` points at live buffers.
    unsafe { libc::sendmsg(out, &message, libc::MSG_NOSIGNAL) };
}

/// The child's answer: the connected socket, or its errno as an error.
pub(crate) fn receive_fd(ours: &UnixStream) -> io::Result<OwnedFd> {
    let mut payload: Report = -1;
    let mut iov = libc::iovec {
        iov_base: std::ptr::from_mut(&mut payload).cast(),
        iov_len: std::mem::size_of::<Report>(),
    };
    let mut control = FdControl([0; 32]);
    // SAFETY: a zeroed msghdr is valid; the buffers set below outlive the call.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.0.as_mut_ptr().cast();
    message.msg_controllen = control.0.len() as _;
    // SAFETY: receiving into the buffers above; MSG_CMSG_CLOEXEC marks a received fd.
    let n = unsafe { libc::recvmsg(ours.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: walking the control messages the kernel filled in.
    let fd = unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            None
        } else {
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>());
            Some(OwnedFd::from_raw_fd(fd))
        }
    };
    match (n as usize == std::mem::size_of::<Report>(), payload, fd) {
        (true, 0, Some(fd)) => Ok(fd),
        (true, errno, _) if errno > 0 => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::other(
            "the helper that joins the sandbox's network ended without an answer",
        )),
    }
}
