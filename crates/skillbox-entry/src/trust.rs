//! Which `skillbox warm` a client talks to, and whom the server serves: the one copy of
//! these checks. The entry point's client (before glibc), the Rust client and the server
//! (crates/skillbox/src/warm.rs) all run this code.
//!
//! - The data dir is trusted as `skillbox_env::own_data_dir` trusts it: a directory of
//!   this user's that group and others cannot write; each directory directly in it the
//!   same; no symlink directly in it (it is listed; one it cannot list is not trusted).
//! - `warm.sock` in it is a socket of this user's, not a link, and is reached through
//!   the directory's descriptor (`/proc/self/fd/N/warm.sock`): what was checked is what
//!   is used, whatever happens to the path in between.
//! - The process at the other end is this user's (`SO_PEERCRED`) and in this process's
//!   user namespace: a server of another user, or a process in a sandbox (whose user may
//!   be this one's uid), is none of a client's business, and a server serves neither.
//!   The namespace is the one of the peer's pid as this `/proc` numbers it (from its
//!   `SO_PEERPIDFD` pidfd's `fdinfo`, not `SO_PEERCRED`'s pid, which another pid
//!   namespace numbers differently), and the pidfd must still be alive after the
//!   lookup, so the pid was not another process's by then.
//!
//! The rules of lib.rs hold here: this runs before glibc in the static-pie binary. The
//! two public functions are the Rust side's way in and are never called by the entry
//! point: a function another crate can reach is exported, and rustc calls exported
//! functions through the GOT. So the entry point calls the crate-private functions they
//! wrap, and they are `inline(never)` so that what they call is not reachable from
//! another crate (and so not exported) either.

use core::ffi::CStr;
use core::mem::MaybeUninit;

use crate::SOCKET;
use crate::sys::{
    self, AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW, Fd, O_CLOEXEC, O_DIRECTORY, Path, S_IFDIR,
    S_IFLNK, S_IFMT, S_IFSOCK, Stat, syscall,
};

/// `warm.sock` in `data_dir`, connected, if the checks above trust it and the process
/// listening there: a close-on-exec descriptor, the caller's to close. `None` if
/// anything is not so.
#[inline(never)]
pub fn connect(data_dir: &CStr) -> Option<i32> {
    server(data_dir.to_bytes_with_nul()).map(|socket| socket.0.into_raw())
}

/// Why the process at the other end of a socket is not served, or not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The kernel does not say who it is (`SO_PEERCRED`: not a unix socket?).
    NoCredentials,
    /// It is another user (this uid).
    OtherUser(u32),
    /// No pidfd of it (`SO_PEERPIDFD`, Linux 6.5; this errno, 0 when there is none).
    NoPidfd(i32),
    /// It has exited, or this `/proc` does not number it (another pid namespace's).
    Gone,
    /// Its user namespace or this process's cannot be read.
    NoUserNamespace,
    /// It is in another user namespace: a sandbox's process.
    OtherUserNamespace,
}

/// Whether the process at the other end of `socket` is served (the checks above).
///
/// # Safety
///
/// `socket` is a descriptor the caller holds open for the call.
#[inline(never)]
pub unsafe fn check_peer(socket: i32) -> Result<(), Refusal> {
    peer(socket as usize)
}

/// A unix stream socket; `close` closes it.
pub(crate) struct Socket(pub(crate) Fd);

impl Socket {
    pub(crate) fn close(self) {
        self.0.close();
    }
}

/// The socket of the server `data_dir` (NUL-terminated) names, connected, when the
/// data dir, the socket and the process behind it are trusted.
pub(crate) fn server(data_dir: &[u8]) -> Option<Socket> {
    let dir = DataDir::open(data_dir)?;
    let socket = connect_in(&dir);
    dir.0.close();
    let socket = socket?;
    if peer(socket.0.raw()).is_ok() {
        return Some(socket);
    }
    socket.close();
    None
}

/// The data dir, opened, when it and its socket are trusted.
struct DataDir(Fd);

impl DataDir {
    /// `path` with its NUL; `None` for one without.
    fn open(path: &[u8]) -> Option<DataDir> {
        if path.last() != Some(&0) {
            return None;
        }
        // SAFETY: `path` is NUL-terminated (checked above).
        let fd = unsafe {
            syscall(
                sys::OPENAT,
                [AT_FDCWD, path.as_ptr() as usize, O_DIRECTORY | O_CLOEXEC],
            )
        };
        let dir = DataDir(Fd::own(fd)?);
        // SAFETY: both names are NUL-terminated.
        let (stat_dir, stat_socket) = unsafe {
            (
                sys::stat(dir.0.raw(), c"".as_ptr().cast(), AT_EMPTY_PATH),
                sys::stat(
                    dir.0.raw(),
                    SOCKET_NAME.as_ptr().cast(),
                    AT_SYMLINK_NOFOLLOW,
                ),
            )
        };
        let me = sys::euid();
        let trusted = match (stat_dir, stat_socket) {
            (Some(d), Some(s)) => {
                private_dir(&d, me)
                    && s.mode & S_IFMT == S_IFSOCK
                    && s.uid == me
                    && dir.entries_are_private(me)
            }
            _ => false,
        };
        if trusted {
            return Some(dir);
        }
        dir.0.close();
        None
    }

    /// No entry is a symlink, and each directory is [`private_dir`]; false when the
    /// directory cannot be listed.
    fn entries_are_private(&self, me: u32) -> bool {
        const DT_DIR: u8 = 4;
        const DT_REG: u8 = 8;
        const DT_SOCK: u8 = 12;
        let mut buffer = MaybeUninit::<[u8; 4096]>::uninit();
        let at = buffer.as_mut_ptr().cast::<u8>();
        loop {
            // SAFETY: getdents64(2) writes at most 4096 bytes of entries into `buffer`.
            let got = unsafe { syscall(sys::GETDENTS64, [self.0.raw(), at as usize, 4096]) };
            let Ok(got) = usize::try_from(got) else {
                return false;
            };
            if got == 0 {
                return true;
            }
            let mut offset = 0;
            while offset + 19 < got {
                // SAFETY: a `linux_dirent64` at `offset` (the kernel wrote `got` bytes of
                // them): d_ino (8), d_off (8), d_reclen (2), d_type (1), the NUL-ended
                // name.
                let (len, kind, name) = unsafe {
                    let entry = at.add(offset);
                    (
                        usize::from(entry.add(16).cast::<u16>().read_unaligned()),
                        *entry.add(18),
                        entry.add(19),
                    )
                };
                if len <= 19 || offset + len > got {
                    return false;
                }
                offset += len;
                // Neither a link nor a directory: nothing to look at.
                if kind == DT_REG || kind == DT_SOCK {
                    continue;
                }
                // SAFETY: the name and its NUL fill the rest of the entry's `len` bytes.
                let named = unsafe { core::slice::from_raw_parts(name, len - 19) };
                let named = named.split(|&byte| byte == 0).next().unwrap_or(&[]);
                if kind == DT_DIR && (crate::same(named, b".") || crate::same(named, b"..")) {
                    continue;
                }
                // The type again, from the inode (a file system may say DT_UNKNOWN).
                // SAFETY: the name is NUL-terminated within the entry.
                let Some(entry) = (unsafe { sys::stat(self.0.raw(), name, AT_SYMLINK_NOFOLLOW) })
                else {
                    return false;
                };
                if entry.mode & S_IFMT == S_IFLNK
                    || (entry.mode & S_IFMT == S_IFDIR && !private_dir(&entry, me))
                {
                    return false;
                }
            }
        }
    }
}

/// A directory of `me`'s that group and others cannot write.
fn private_dir(stat: &Stat, me: u32) -> bool {
    stat.mode & S_IFMT == S_IFDIR && stat.uid == me && stat.mode & 0o022 == 0
}

/// `warm.sock` (`crate::SOCKET`), NUL-terminated.
const SOCKET_NAME: &CStr = c"warm.sock";

/// Connects to `warm.sock` in `dir`, through the descriptor (`/proc/self/fd/N`).
fn connect_in(dir: &DataDir) -> Option<Socket> {
    const AF_UNIX: usize = 1;
    const SOCK_STREAM: usize = 1;
    // SAFETY: socket(2) takes no pointers.
    let socket = Socket(Fd::own(unsafe {
        syscall(sys::SOCKET, [AF_UNIX, SOCK_STREAM | O_CLOEXEC, 0, 0])
    })?);
    // A `sockaddr_un`: the family, then the path and its NUL (108 bytes at most).
    let mut name = MaybeUninit::<[u8; 108]>::uninit();
    let mut path = Path::new(&mut name);
    path.push(b"/proc/self/fd/");
    sys::decimal(&mut path, dir.0.raw());
    path.push(b"/");
    path.push(SOCKET.as_bytes());
    let connected = match path.terminated() {
        Some(name) => {
            let mut address = MaybeUninit::<[u8; 110]>::uninit();
            let at = address.as_mut_ptr().cast::<u8>();
            // SAFETY: `address` holds the family's 2 bytes and 108 more, and `name` is
            // at most 108; connect(2) reads `2 + name.len()` of them.
            unsafe {
                at.cast::<u16>().write_unaligned(AF_UNIX as u16);
                for (i, &byte) in name.iter().enumerate() {
                    at.add(2 + i).write(byte);
                }
                syscall(sys::CONNECT, [socket.0.raw(), at as usize, 2 + name.len()]) == 0
            }
        }
        None => false,
    };
    if connected {
        return Some(socket);
    }
    socket.close();
    None
}

/// Whether the process at the other end of `socket` is this user's, in this user
/// namespace (the kernel says so).
fn peer(socket: usize) -> Result<(), Refusal> {
    const SO_PEERCRED: usize = 17;
    const SO_PEERPIDFD: usize = 77;
    let mut credentials = [0u32; 3];
    // SAFETY: `credentials` holds the 12 bytes of a `ucred`: pid, uid, gid.
    let got = unsafe { option(socket, SO_PEERCRED, credentials.as_mut_ptr().cast(), 12) };
    let [_, uid, _] = credentials;
    match got {
        Ok(12) if uid == sys::euid() => {}
        Ok(12) => return Err(Refusal::OtherUser(uid)),
        _ => return Err(Refusal::NoCredentials),
    }
    let mut pidfd = -1i32;
    // SAFETY: `pidfd` holds the 4 bytes of a descriptor.
    let got = unsafe { option(socket, SO_PEERPIDFD, (&raw mut pidfd).cast(), 4) };
    let pidfd = match got {
        Ok(4) => Fd::own(pidfd as isize).ok_or(Refusal::NoPidfd(0))?,
        Ok(_) => return Err(Refusal::NoPidfd(0)),
        Err(errno) => return Err(Refusal::NoPidfd(errno)),
    };
    // The peer's pid as this /proc numbers it (not as SO_PEERCRED does: in another
    // pid namespace the two differ).
    let Some(pid) = pid_of(&pidfd) else {
        pidfd.close();
        return Err(Refusal::Gone);
    };
    let mut buffer = MaybeUninit::<[u8; 32]>::uninit();
    let mut theirs = Path::new(&mut buffer);
    theirs.push(b"/proc/");
    sys::decimal(&mut theirs, pid);
    theirs.push(b"/ns/user");
    // SAFETY: both names are NUL-terminated.
    let (theirs, mine) = unsafe {
        (
            theirs
                .terminated()
                .and_then(|name| sys::stat(AT_FDCWD, name.as_ptr(), 0)),
            sys::stat(AT_FDCWD, c"/proc/self/ns/user".as_ptr().cast(), 0),
        )
    };
    // Still alive after the lookup: the pid was not another process's by then.
    // SAFETY: signal 0 through our own pidfd only checks that the process lives.
    let alive = unsafe { syscall(sys::PIDFD_SEND_SIGNAL, [pidfd.raw(), 0, 0, 0]) } == 0;
    pidfd.close();
    match (theirs, mine) {
        _ if !alive => Err(Refusal::Gone),
        (Some(theirs), Some(mine)) if (theirs.dev, theirs.ino) == (mine.dev, mine.ino) => Ok(()),
        (Some(_), Some(_)) => Err(Refusal::OtherUserNamespace),
        _ => Err(Refusal::NoUserNamespace),
    }
}

/// A `SOL_SOCKET` option of `socket` into `to`: how many bytes the kernel wrote, or
/// its errno.
///
/// # Safety
///
/// `to` is valid for `len` bytes of writes.
unsafe fn option(socket: usize, name: usize, to: *mut u8, len: u32) -> Result<u32, i32> {
    const SOL_SOCKET: usize = 1;
    let mut len = len;
    // SAFETY: getsockopt(2) writes at most `len` bytes to `to` (the caller's promise).
    let done = unsafe {
        syscall(
            sys::GETSOCKOPT,
            [
                socket,
                SOL_SOCKET,
                name,
                to as usize,
                (&raw mut len) as usize,
            ],
        )
    };
    if done == 0 {
        Ok(len)
    } else {
        Err(-done as i32)
    }
}

/// The pid of `pidfd`'s process in this /proc (its `fdinfo`'s `Pid:`); `None` when it
/// has exited or is not in this /proc's pid namespace.
fn pid_of(pidfd: &Fd) -> Option<usize> {
    let mut name = MaybeUninit::<[u8; 48]>::uninit();
    let mut path = Path::new(&mut name);
    path.push(b"/proc/self/fdinfo/");
    sys::decimal(&mut path, pidfd.raw());
    let name = path.terminated()?;
    // SAFETY: `name` is NUL-terminated.
    let fd =
        Fd::own(unsafe { syscall(sys::OPENAT, [AT_FDCWD, name.as_ptr() as usize, O_CLOEXEC]) })?;
    let mut buffer = MaybeUninit::<[u8; 1024]>::uninit();
    let at = buffer.as_mut_ptr().cast::<u8>();
    // SAFETY: read(2) writes at most 1024 bytes into `buffer`.
    let got = unsafe { syscall(sys::READ, [fd.raw(), at as usize, 1024]) };
    fd.close();
    // SAFETY: the kernel wrote `got` bytes there.
    let text = unsafe { core::slice::from_raw_parts(at, usize::try_from(got).ok()?) };
    let mut lines = text.split(|&byte| byte == b'\n');
    let value = lines.find_map(|line| crate::after(line, b"Pid:\t"))?;
    let mut pid = 0usize;
    for &digit in value {
        if !digit.is_ascii_digit() {
            return None;
        }
        pid = pid
            .checked_mul(10)?
            .checked_add(usize::from(digit - b'0'))?;
    }
    (pid > 0).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::process::{Child, Command, Stdio};

    #[test]
    fn the_socket_s_name_is_the_protocol_s() {
        assert_eq!(SOCKET_NAME.to_bytes(), SOCKET.as_bytes());
    }

    fn checked(socket: &impl AsRawFd) -> Result<(), Refusal> {
        // SAFETY: the socket is open for the call.
        unsafe { check_peer(socket.as_raw_fd()) }
    }

    /// A process started by `command` (its program is python3) that connects to a
    /// listener of this test's and stays until its stdin closes; the accepted socket.
    fn peer_from(mut command: Command) -> Option<(Child, UnixStream)> {
        static PEERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = PEERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("skillbox-trust-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("peer.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let child = command
            .args([
                "-c",
                "import socket, sys\n\
                 s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
                 print('connected', flush=True); sys.stdin.read()",
            ])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut child = child;
        let mut said = [0u8; 10];
        let connected = child.stdout.as_mut().unwrap().read_exact(&mut said).is_ok();
        let _ = std::fs::remove_dir_all(&dir);
        if !connected {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        let (socket, _) = listener.accept().unwrap();
        Some((child, socket))
    }

    fn python() -> Command {
        Command::new("python3")
    }

    /// Says why a test cannot run here; under `SKILLBOX_REQUIRE_ALL=1` that fails it.
    fn skip(test: &str, why: &str) {
        assert!(
            std::env::var("SKILLBOX_REQUIRE_ALL").as_deref() != Ok("1"),
            "{test}: cannot run here and SKILLBOX_REQUIRE_ALL=1: {why}"
        );
        eprintln!("{test}: skipped: {why}");
    }

    #[test]
    fn a_peer_of_this_user_and_user_namespace_is_served() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(checked(&a), Ok(()));
        assert_eq!(checked(&b), Ok(()));
        let (mut child, socket) = peer_from(python()).expect("python3 connects");
        assert_eq!(checked(&socket), Ok(()));
        drop(child.stdin.take());
        child.wait().unwrap();
        // Gone: the pidfd says so, whatever now has its pid.
        assert!(
            matches!(checked(&socket), Err(Refusal::Gone | Refusal::NoPidfd(_))),
            "{:?}",
            checked(&socket)
        );
    }

    /// What `unshare --user` makes is what a sandbox's process is: this uid (mapped),
    /// another user namespace.
    #[test]
    fn a_peer_in_another_user_namespace_is_refused() {
        let mut command = Command::new("unshare");
        command.args(["--user", "--map-current-user", "python3"]);
        let Some((mut child, socket)) = peer_from(command) else {
            skip(
                "a_peer_in_another_user_namespace_is_refused",
                "no user namespace can be made here (unshare --user)",
            );
            return;
        };
        assert_eq!(checked(&socket), Err(Refusal::OtherUserNamespace));
        drop(child.stdin.take());
        child.wait().unwrap();
    }

    #[test]
    fn a_peer_of_another_user_is_refused() {
        if sys::euid() != 0 {
            skip(
                "a_peer_of_another_user_is_refused",
                "only root can start a process of another user",
            );
            return;
        }
        let mut command = python();
        std::os::unix::process::CommandExt::uid(&mut command, 65534);
        let (mut child, socket) = peer_from(command).expect("python3 connects as 65534");
        assert_eq!(checked(&socket), Err(Refusal::OtherUser(65534)));
        drop(child.stdin.take());
        child.wait().unwrap();
    }

    #[test]
    fn what_is_not_a_unix_socket_has_no_peer() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(checked(&file), Err(Refusal::NoCredentials));
    }
}
