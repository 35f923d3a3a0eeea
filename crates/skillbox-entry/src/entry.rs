//! The binary's entry point (`-Wl,--entry=skillbox_entry`, set by skillbox's build
//! script): a plain exec goes to `skillbox warm` from here; anything else goes on to
//! glibc's `_start` with the stack pointer and `rdx` as the kernel (or the dynamic
//! loader) handed them over, which is all `_start` reads.
//!
//! The rules at the top of `lib.rs` hold here: raw system calls only, buffers on the
//! stack that are written before they are read, no panic.

use core::arch::{asm, naked_asm};
use core::marker::PhantomData;
use core::mem::MaybeUninit;

use crate::{END, ERR, MAX_REQUEST, OTHER_VERSION, OUT, PlainExec, SOCKET};

/// The process's first instruction. `rdx` is the dynamic loader's finaliser (zero in a
/// static binary) that `_start` registers; the two pushes keep it and keep the stack
/// 16-byte aligned for the call.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn skillbox_entry() -> ! {
    naked_asm!(
        "mov rdi, rsp",
        "push rdx",
        "push rdx",
        "call {warm_exec}",
        "pop rdx",
        "pop rdx",
        "jmp _start",
        warm_exec = sym warm_exec,
    )
}

/// Sends a plain exec to the data dir's `skillbox warm` and ends the process with the
/// command's status; returns (having left nothing open or changed) when the command
/// line is not a plain exec, `SKILLBOX_LOG` is set, the data dir or its socket is not
/// this user's alone, no server of this user and user namespace answers, or it is
/// another version.
///
/// # Safety
///
/// `stack` is the process's initial stack: argc, the argument pointers and a null,
/// the environment pointers and a null.
unsafe extern "C" fn warm_exec(stack: *const usize) {
    // SAFETY: the initial stack's layout, as the kernel lays it out (see above).
    let (args, env) = unsafe {
        let argc = *stack;
        // No program name (`execve` with an empty argv): the full parser's to answer.
        if argc == 0 {
            return;
        }
        let argv = stack.add(1).cast::<*const u8>();
        (CStrs::new(argv.add(1)), CStrs::new(argv.add(argc + 1)))
    };
    let Some(exec) = crate::plain_exec(args) else {
        return;
    };
    let mut log = false;
    let (mut data, mut home) = (None, None);
    for var in env {
        log |= crate::after(var, b"SKILLBOX_LOG=").is_some();
        data = data.or(crate::after(var, b"SKILLBOX_DATA="));
        home = home.or(crate::after(var, b"HOME="));
    }
    // The full client logs; with no data dir it says why.
    if log {
        return;
    }
    let mut length = 0usize;
    crate::request(&exec, &mut |piece| {
        length = length.saturating_add(piece.len())
    });
    let Ok(length32) = u32::try_from(length) else {
        return;
    };
    if length > MAX_REQUEST {
        return;
    }
    // As `skillbox_env::default_data_dir`: the first of each variable, empty as unset;
    // then absolute, as `main` makes it.
    let mut buffer = MaybeUninit::<[u8; 4096]>::uninit();
    let mut path = Path::new(&mut buffer);
    match (
        exec.data_dir,
        data.filter(|d| !d.is_empty()),
        home.filter(|h| !h.is_empty()),
    ) {
        (Some(dir), _, _) | (None, Some(dir), _) => path.absolute(dir),
        (None, None, Some(home)) => {
            path.absolute(home);
            path.components(b".local/share/skillbox");
        }
        (None, None, None) => return,
    }
    let Some(dir) = path.terminated() else {
        return;
    };
    // SAFETY: `terminated` ends it with a NUL.
    let Some(dir) = (unsafe { DataDir::open(dir) }) else {
        return;
    };
    let socket = Socket::connect(&dir);
    dir.close();
    let Some(socket) = socket else {
        return;
    };
    if socket.is_my_users() {
        // From here Ctrl-C ends this client (the server sees the connection close and
        // ends the command), and a closed stdout does not: its writes fail and are
        // dropped.
        let signals = Signals::take();
        if send_request(&socket, &exec, length32) {
            relay(&socket, &path);
        }
        signals.restore();
    }
    socket.close();
}

/// The data dir, opened and trusted only as `skillbox_env::own_data_dir` trusts it:
/// this user's and not writable by group or others, and so is each directory in it,
/// with no symlink in it; and `warm.sock` a socket of this user's. The socket is then
/// reached through this descriptor, so what was checked is what is used, whatever
/// happens to the path in between.
struct DataDir(Fd);

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;
const S_IFSOCK: u32 = 0o140000;
const AT_SYMLINK_NOFOLLOW: usize = 0x100;

impl DataDir {
    /// # Safety
    ///
    /// `path` ends with a NUL (`Path::terminated`).
    unsafe fn open(path: &[u8]) -> Option<DataDir> {
        const O_DIRECTORY_CLOEXEC: usize = 0o200000 | 0o2000000;
        const AT_EMPTY_PATH: usize = 0x1000;
        // SAFETY: `path` is NUL-terminated (the caller's promise).
        let fd = unsafe {
            syscall(
                SYS_OPENAT,
                [AT_FDCWD, path.as_ptr() as usize, O_DIRECTORY_CLOEXEC],
            )
        };
        let dir = DataDir(Fd::own(fd)?);
        // SAFETY: both names are NUL-terminated.
        let (stat_dir, stat_socket) = unsafe {
            (
                stat(dir.0.raw(), c"".as_ptr().cast(), AT_EMPTY_PATH),
                stat(
                    dir.0.raw(),
                    SOCKET_NAME.as_ptr().cast(),
                    AT_SYMLINK_NOFOLLOW,
                ),
            )
        };
        let me = euid();
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
        dir.close();
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
            let got = unsafe { syscall(SYS_GETDENTS64, [self.0.raw(), at as usize, 4096]) };
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
                if kind == DT_REG || kind == DT_SOCK {
                    continue;
                }
                // SAFETY: the name and its NUL fill the rest of the entry's `len` bytes.
                let named = unsafe { core::slice::from_raw_parts(name, len - 19) };
                let named = named.split(|&byte| byte == 0).next().unwrap_or(&[]);
                if kind == DT_DIR && (crate::same(named, b".") || crate::same(named, b"..")) {
                    continue;
                }
                // SAFETY: the name is NUL-terminated within the entry.
                let Some(entry) = (unsafe { stat(self.0.raw(), name, AT_SYMLINK_NOFOLLOW) }) else {
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

    fn close(self) {
        self.0.close();
    }
}

/// This process's effective uid.
fn euid() -> u32 {
    // SAFETY: geteuid(2) takes nothing.
    unsafe { syscall(SYS_GETEUID, [0; 0]) as u32 }
}

/// A directory of `me`'s that group and others cannot write.
fn private_dir(stat: &Stat, me: u32) -> bool {
    stat.mode & S_IFMT == S_IFDIR && stat.uid == me && stat.mode & 0o022 == 0
}

/// `warm.sock` (`crate::SOCKET`), NUL-terminated.
const SOCKET_NAME: &core::ffi::CStr = c"warm.sock";

/// The frames from the server, to stdout and stderr, until the exit status; ends the
/// process, unless the first frame says the server is another version.
fn relay(socket: &Socket, path: &Path) {
    let mut buffer = MaybeUninit::<[u8; 1 << 15]>::uninit();
    let buffer = buffer.as_mut_ptr().cast::<u8>();
    let mut first = true;
    loop {
        let mut head = [0u8; 5];
        if !socket.read_exact(head.as_mut_ptr(), head.len()) {
            went_away(path);
        }
        let [kind, a, b, c, d] = head;
        let mut left = u32::from_le_bytes([a, b, c, d]) as usize;
        match kind {
            OTHER_VERSION if first => return,
            OUT | ERR => {
                let to = if kind == OUT { 1 } else { 2 };
                while left > 0 {
                    let want = left.min(1 << 15);
                    // SAFETY: `buffer` holds 32 KiB and `want` is no more.
                    let got = unsafe { socket.read(buffer, want) };
                    if got == 0 {
                        went_away(path);
                    }
                    // SAFETY: the socket wrote `got` bytes there.
                    write_all(to, unsafe { core::slice::from_raw_parts(buffer, got) });
                    left -= got;
                }
            }
            END if left == 1 => {
                let mut status = 0u8;
                if !socket.read_exact(&mut status, 1) {
                    went_away(path);
                }
                exit(status);
            }
            _ => went_away(path),
        }
        first = false;
    }
}

fn went_away(dir: &Path) -> ! {
    write_all(2, crate::WENT_AWAY_BEFORE.as_bytes());
    write_all(2, dir.bytes());
    if dir.bytes().last() != Some(&b'/') {
        write_all(2, b"/");
    }
    write_all(2, SOCKET.as_bytes());
    write_all(2, crate::WENT_AWAY_AFTER.as_bytes());
    exit(crate::INTERRUPTED_STATUS)
}

/// The length, then the request, through a 16 KiB buffer.
fn send_request<'a, I>(socket: &Socket, exec: &PlainExec<'a, I>, length: u32) -> bool
where
    I: Iterator<Item = &'a [u8]> + Clone,
{
    // The buffer is a local of its own: in a struct beside zeroed fields LLVM may
    // zero it all with one `memset`.
    let mut bytes = MaybeUninit::<[u8; CHUNK]>::uninit();
    let mut chunk = Chunk {
        socket,
        bytes: bytes.as_mut_ptr().cast(),
        len: 0,
        failed: false,
    };
    chunk.put(&length.to_le_bytes());
    crate::request(exec, &mut |piece| chunk.put(piece));
    chunk.flush();
    !chunk.failed
}

const CHUNK: usize = 1 << 14;

struct Chunk<'s> {
    socket: &'s Socket,
    /// `CHUNK` bytes.
    bytes: *mut u8,
    len: usize,
    failed: bool,
}

impl Chunk<'_> {
    fn put(&mut self, piece: &[u8]) {
        for &byte in piece {
            if self.len == CHUNK {
                self.flush();
            }
            // SAFETY: `len` is below the buffer's size (flushed above when full).
            unsafe { self.bytes.add(self.len).write(byte) };
            self.len += 1;
        }
    }

    fn flush(&mut self) {
        // SAFETY: the first `len` bytes were written by `put`.
        let bytes = unsafe { core::slice::from_raw_parts(self.bytes, self.len) };
        self.failed |= !self.socket.send_all(bytes);
        self.len = 0;
    }
}

/// A path built in a caller's buffer (the data dir's, a socket's, a `/proc` file's).
struct Path {
    bytes: *mut u8,
    capacity: usize,
    len: usize,
    overflowed: bool,
}

impl Path {
    /// A path in `buffer`; one that would not fit (with its NUL) is `overflowed`.
    fn new<const N: usize>(buffer: &mut MaybeUninit<[u8; N]>) -> Path {
        Path {
            bytes: buffer.as_mut_ptr().cast(),
            capacity: N,
            len: 0,
            overflowed: false,
        }
    }

    fn push(&mut self, piece: &[u8]) {
        for &byte in piece {
            // One byte is kept for the NUL.
            if self.len + 1 >= self.capacity || byte == 0 {
                self.overflowed = true;
                return;
            }
            // SAFETY: `len` is below the buffer's size, checked above.
            unsafe { self.bytes.add(self.len).write(byte) };
            self.len += 1;
        }
    }

    /// `dir` made absolute as `std::path::absolute` makes it: after the working
    /// directory when relative; `.` and empty components dropped, `..` kept, a
    /// leading `//` (exactly two) kept.
    fn absolute(&mut self, dir: &[u8]) {
        if dir.first() != Some(&b'/') {
            self.working_directory();
        } else if dir.get(1) == Some(&b'/') && dir.get(2) != Some(&b'/') {
            self.push(b"/");
        }
        self.components(dir);
    }

    fn components(&mut self, path: &[u8]) {
        for part in path.split(|&byte| byte == b'/') {
            if !part.is_empty() && !crate::same(part, b".") {
                self.push(b"/");
                self.push(part);
            }
        }
    }

    fn working_directory(&mut self) {
        let room = self.capacity - 1 - self.len;
        // SAFETY: getcwd(2) writes at most `room` bytes (the path and its NUL) after
        // what is there.
        let got = unsafe { syscall(SYS_GETCWD, [self.bytes.add(self.len) as usize, room]) };
        match usize::try_from(got) {
            // "/" is the empty prefix: the components each bring their own slash.
            Ok(2) if self.bytes().is_empty() => {}
            Ok(with_nul) if with_nul > 1 => self.len += with_nul - 1,
            _ => self.overflowed = true,
        }
    }

    /// The path with a NUL after it, for a system call (`/` for the root).
    fn terminated(&mut self) -> Option<&[u8]> {
        if self.len == 0 {
            self.push(b"/");
        }
        if self.overflowed {
            return None;
        }
        // SAFETY: `push` keeps one byte of the buffer free for this.
        unsafe {
            self.bytes.add(self.len).write(0);
            Some(core::slice::from_raw_parts(self.bytes, self.len + 1))
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written by `push` or getcwd(2).
        unsafe { core::slice::from_raw_parts(self.bytes, self.len) }
    }
}

/// A descriptor this process opened; `close` closes it. Not `Drop`: the compiler
/// exports a trait's methods, and so calls them through the GOT (see lib.rs).
struct Fd(i32);

impl Fd {
    /// The descriptor in a system call's answer; `None` for an error, and for 0, 1
    /// or 2 (closed): a closed stdout would make the socket fd 1, and the command's
    /// output would go into it. The full client runs after Rust's start has put
    /// `/dev/null` there.
    fn own(answer: isize) -> Option<Fd> {
        let fd = Fd(i32::try_from(answer).ok().filter(|&fd| fd >= 0)?);
        if fd.0 < 3 {
            fd.close();
            return None;
        }
        Some(fd)
    }

    fn raw(&self) -> usize {
        self.0 as usize
    }

    fn close(self) {
        // SAFETY: closes the descriptor this value owns.
        unsafe { syscall(SYS_CLOSE, [self.raw()]) };
    }
}

/// What `newfstatat(2)` says of a file.
struct Stat {
    dev: u64,
    ino: u64,
    mode: u32,
    uid: u32,
}

/// `newfstatat(dir, name, flags)`; `None` on failure.
///
/// # Safety
///
/// `name` is NUL-terminated.
unsafe fn stat(dir: usize, name: *const u8, flags: usize) -> Option<Stat> {
    let mut raw = MaybeUninit::<[u64; 18]>::uninit();
    // SAFETY: newfstatat(2) writes one `struct stat` (144 bytes) into `raw`; `name` is
    // the caller's promise.
    let done = unsafe {
        syscall(
            SYS_NEWFSTATAT,
            [dir, name as usize, raw.as_mut_ptr() as usize, flags],
        )
    };
    if done != 0 {
        return None;
    }
    let words = raw.as_ptr().cast::<u64>();
    // SAFETY: filled by the kernel: st_dev, st_ino, st_nlink, then st_mode and st_uid
    // (32 bits each) in the fourth word.
    unsafe {
        Some(Stat {
            dev: *words,
            ino: *words.add(1),
            mode: *words.add(3) as u32,
            uid: (*words.add(3) >> 32) as u32,
        })
    }
}

const AT_FDCWD: usize = -100isize as usize;

/// A unix stream socket; `close` closes it.
struct Socket(Fd);

impl Socket {
    /// Connects to `warm.sock` in `dir`, through the descriptor (`/proc/self/fd/N`).
    fn connect(dir: &DataDir) -> Option<Socket> {
        const AF_UNIX: usize = 1;
        const SOCK_STREAM_CLOEXEC: usize = 1 | 0o2000000;
        // SAFETY: socket(2) takes no pointers.
        let socket = Socket(Fd::own(unsafe {
            syscall(SYS_SOCKET, [AF_UNIX, SOCK_STREAM_CLOEXEC, 0, 0])
        })?);
        // A `sockaddr_un`: the family, then the path and its NUL (108 bytes at most).
        let mut name = MaybeUninit::<[u8; 108]>::uninit();
        let mut path = Path::new(&mut name);
        path.push(b"/proc/self/fd/");
        decimal(&mut path, dir.0.raw());
        path.push(b"/");
        path.push(SOCKET.as_bytes());
        let connected = match path.terminated() {
            Some(name) => {
                let mut address = MaybeUninit::<[u8; 110]>::uninit();
                let at = address.as_mut_ptr().cast::<u8>();
                // SAFETY: `address` holds the family's 2 bytes and 108 more, and
                // `name` is at most 108; connect(2) reads `2 + name.len()` of them.
                unsafe {
                    at.cast::<u16>().write_unaligned(AF_UNIX as u16);
                    for (i, &byte) in name.iter().enumerate() {
                        at.add(2 + i).write(byte);
                    }
                    syscall(SYS_CONNECT, [socket.0.raw(), at as usize, 2 + name.len()]) == 0
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

    /// The process at the other end is this user's, in this user namespace (the
    /// kernel says so): a server of another user, or a process in a sandbox (whose
    /// user may be this one's uid), is none of this client's business.
    fn is_my_users(&self) -> bool {
        const SO_PEERCRED: usize = 17;
        const SO_PEERPIDFD: usize = 77;
        let mut credentials = [0u32; 3];
        // SAFETY: `credentials` holds the 12 bytes of a `ucred`: pid, uid, gid.
        let got = unsafe { self.option(SO_PEERCRED, credentials.as_mut_ptr().cast(), 12) };
        let [_, uid, _] = credentials;
        if got != Some(12) || uid != euid() {
            return false;
        }
        let mut pidfd = -1i32;
        // SAFETY: `pidfd` holds the 4 bytes of a descriptor.
        let got = unsafe { self.option(SO_PEERPIDFD, (&raw mut pidfd).cast(), 4) };
        let Some(pidfd) = (got == Some(4)).then(|| Fd::own(pidfd as isize)).flatten() else {
            return false;
        };
        // The peer's pid as this /proc numbers it (not as SO_PEERCRED does: in another
        // pid namespace the two differ).
        let Some(pid) = pid_of(&pidfd) else {
            pidfd.close();
            return false;
        };
        let mut buffer = MaybeUninit::<[u8; 32]>::uninit();
        let mut theirs = Path::new(&mut buffer);
        theirs.push(b"/proc/");
        decimal(&mut theirs, pid);
        theirs.push(b"/ns/user");
        // SAFETY: both names are NUL-terminated.
        let (theirs, mine) = unsafe {
            (
                theirs
                    .terminated()
                    .and_then(|name| stat(AT_FDCWD, name.as_ptr(), 0)),
                stat(AT_FDCWD, c"/proc/self/ns/user".as_ptr().cast(), 0),
            )
        };
        // Still alive after the lookup: the pid was not another process's by then.
        // SAFETY: signal 0 through our own pidfd only checks that the process lives.
        let alive = unsafe { syscall(SYS_PIDFD_SEND_SIGNAL, [pidfd.raw(), 0, 0, 0]) } == 0;
        pidfd.close();
        match (theirs, mine) {
            (Some(theirs), Some(mine)) => alive && (theirs.dev, theirs.ino) == (mine.dev, mine.ino),
            _ => false,
        }
    }

    /// A `SOL_SOCKET` option of the socket into `to`; how many bytes the kernel wrote.
    ///
    /// # Safety
    ///
    /// `to` is valid for `len` bytes of writes.
    unsafe fn option(&self, name: usize, to: *mut u8, len: u32) -> Option<u32> {
        const SOL_SOCKET: usize = 1;
        let mut len = len;
        // SAFETY: getsockopt(2) writes at most `len` bytes to `to` (the caller's promise).
        let done = unsafe {
            syscall(
                SYS_GETSOCKOPT,
                [
                    self.0.raw(),
                    SOL_SOCKET,
                    name,
                    to as usize,
                    (&raw mut len) as usize,
                ],
            )
        };
        (done == 0).then_some(len)
    }

    fn close(self) {
        self.0.close();
    }

    fn send_all(&self, mut bytes: &[u8]) -> bool {
        const MSG_NOSIGNAL: usize = 0x4000;
        while !bytes.is_empty() {
            // SAFETY: sendto(2) reads `bytes`.
            let sent = unsafe {
                syscall(
                    SYS_SENDTO,
                    [
                        self.0.raw(),
                        bytes.as_ptr() as usize,
                        bytes.len(),
                        MSG_NOSIGNAL,
                        0,
                        0,
                    ],
                )
            };
            match usize::try_from(sent) {
                Ok(sent) if sent > 0 => bytes = bytes.get(sent..).unwrap_or(&[]),
                _ if sent == -EINTR => {}
                _ => return false,
            }
        }
        true
    }

    /// Up to `len` bytes to `to`; 0 at the end of the stream or on an error.
    ///
    /// # Safety
    ///
    /// `to` is valid for `len` bytes of writes.
    unsafe fn read(&self, to: *mut u8, len: usize) -> usize {
        loop {
            // SAFETY: the caller's promise.
            let got = unsafe { syscall(SYS_READ, [self.0.raw(), to as usize, len]) };
            if got != -EINTR {
                return usize::try_from(got).unwrap_or(0);
            }
        }
    }

    fn read_exact(&self, to: *mut u8, len: usize) -> bool {
        let mut done = 0;
        while done < len {
            // SAFETY: `to` is the caller's buffer of `len` bytes; `done` is below it.
            let got = unsafe { self.read(to.add(done), len - done) };
            if got == 0 {
                return false;
            }
            done += got;
        }
        true
    }
}

/// All of `bytes` to `fd`; an error (a closed stdout) drops them, as the full client does.
fn write_all(fd: usize, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: write(2) reads `bytes`.
        let wrote = unsafe { syscall(SYS_WRITE, [fd, bytes.as_ptr() as usize, bytes.len()]) };
        match usize::try_from(wrote) {
            Ok(wrote) if wrote > 0 => bytes = bytes.get(wrote..).unwrap_or(&[]),
            _ if wrote == -EINTR => {}
            _ => return,
        }
    }
}

fn exit(status: u8) -> ! {
    // SAFETY: exit_group(2) ends the process.
    unsafe { syscall(SYS_EXIT_GROUP, [usize::from(status)]) };
    #[expect(clippy::empty_loop, reason = "exit_group does not return")]
    loop {}
}

/// SIGINT ends the client with `exec`'s cancel message; SIGPIPE is ignored. `restore`
/// puts back what was there (for glibc's start, when the server is another version).
struct Signals {
    interrupt: KernelSigaction,
    pipe: KernelSigaction,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

const SIGINT: usize = 2;
const SIGPIPE: usize = 13;

impl Signals {
    fn take() -> Signals {
        const SA_RESTORER: u64 = 0x0400_0000;
        const SIG_IGN: usize = 1;
        let interrupt = KernelSigaction {
            handler: interrupted as extern "C" fn(i32) as usize,
            flags: SA_RESTORER,
            restorer: sigreturn as unsafe extern "C" fn() as usize,
            mask: 0,
        };
        let ignore = KernelSigaction {
            handler: SIG_IGN,
            ..interrupt
        };
        Signals {
            interrupt: sigaction(SIGINT, &interrupt),
            pipe: sigaction(SIGPIPE, &ignore),
        }
    }

    fn restore(self) {
        sigaction(SIGINT, &self.interrupt);
        sigaction(SIGPIPE, &self.pipe);
    }
}

/// Installs `action` for `signal`; returns the one before.
fn sigaction(signal: usize, action: &KernelSigaction) -> KernelSigaction {
    // Overwritten by the kernel (the call cannot fail for these signals).
    let mut before = *action;
    // SAFETY: rt_sigaction(2) reads `action` and writes `before`, with an 8-byte mask.
    unsafe {
        syscall(
            SYS_RT_SIGACTION,
            [
                signal,
                action as *const KernelSigaction as usize,
                &mut before as *mut KernelSigaction as usize,
                8,
            ],
        );
    }
    before
}

extern "C" fn interrupted(_: i32) {
    // Only write(2) and exit_group(2), both async-signal-safe.
    write_all(2, crate::INTERRUPTED.as_bytes());
    exit(crate::INTERRUPTED_STATUS)
}

/// The signal trampoline the kernel returns through (`sa_restorer`).
#[unsafe(naked)]
unsafe extern "C" fn sigreturn() {
    naked_asm!("mov eax, 15", "syscall", "ud2")
}

/// The C strings of a null-terminated array of pointers (argv, envp).
#[derive(Clone)]
struct CStrs<'a> {
    at: *const *const u8,
    strings: PhantomData<&'a [u8]>,
}

impl CStrs<'_> {
    /// # Safety
    ///
    /// `at` is a null-terminated array of pointers to NUL-terminated strings that live
    /// as long as the process.
    unsafe fn new(at: *const *const u8) -> Self {
        CStrs {
            at,
            strings: PhantomData,
        }
    }
}

impl<'a> Iterator for CStrs<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        // SAFETY: `new`'s promise: entries up to the null are NUL-terminated strings.
        unsafe {
            let string = *self.at;
            if string.is_null() {
                return None;
            }
            self.at = self.at.add(1);
            let mut len = 0;
            while *string.add(len) != 0 {
                len += 1;
            }
            Some(core::slice::from_raw_parts(string, len))
        }
    }
}

/// The pid of `pidfd`'s process in this /proc (its `fdinfo`'s `Pid:`); `None` when it
/// has exited or is not in this /proc's pid namespace.
fn pid_of(pidfd: &Fd) -> Option<usize> {
    const O_RDONLY_CLOEXEC: usize = 0o2000000;
    let mut name = MaybeUninit::<[u8; 48]>::uninit();
    let mut path = Path::new(&mut name);
    path.push(b"/proc/self/fdinfo/");
    decimal(&mut path, pidfd.raw());
    let name = path.terminated()?;
    // SAFETY: `name` is NUL-terminated.
    let fd = Fd::own(unsafe {
        syscall(
            SYS_OPENAT,
            [AT_FDCWD, name.as_ptr() as usize, O_RDONLY_CLOEXEC],
        )
    })?;
    let mut buffer = MaybeUninit::<[u8; 1024]>::uninit();
    let at = buffer.as_mut_ptr().cast::<u8>();
    // SAFETY: read(2) writes at most 1024 bytes into `buffer`.
    let got = unsafe { syscall(SYS_READ, [fd.raw(), at as usize, 1024]) };
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

/// `n` in decimal, after what `path` holds.
fn decimal(path: &mut Path, n: usize) {
    let mut digits = [0u8; 20];
    let (mut at, mut left) = (digits.len(), n);
    loop {
        at -= 1;
        if let Some(digit) = digits.get_mut(at) {
            *digit = b'0' + (left % 10) as u8;
        }
        left /= 10;
        if left == 0 || at == 0 {
            break;
        }
    }
    path.push(digits.get(at..).unwrap_or(&[]));
}

const EINTR: isize = 4;
const SYS_READ: usize = 0;
const SYS_WRITE: usize = 1;
const SYS_CLOSE: usize = 3;
const SYS_RT_SIGACTION: usize = 13;
const SYS_SOCKET: usize = 41;
const SYS_CONNECT: usize = 42;
const SYS_SENDTO: usize = 44;
const SYS_GETSOCKOPT: usize = 55;
const SYS_GETCWD: usize = 79;
const SYS_GETDENTS64: usize = 217;
const SYS_GETEUID: usize = 107;
const SYS_OPENAT: usize = 257;
const SYS_NEWFSTATAT: usize = 262;
const SYS_PIDFD_SEND_SIGNAL: usize = 424;
const SYS_EXIT_GROUP: usize = 231;

/// A system call with up to six arguments; the kernel's answer (`-errno` on failure).
///
/// # Safety
///
/// The call's own: any pointer among `args` must be valid for what it does with it.
unsafe fn syscall<const N: usize>(number: usize, args: [usize; N]) -> isize {
    let arg = |at: usize| args.get(at).copied().unwrap_or(0);
    let answer: isize;
    // SAFETY: the caller's promise; `syscall` clobbers rcx and r11 only.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") number as isize => answer,
            in("rdi") arg(0),
            in("rsi") arg(1),
            in("rdx") arg(2),
            in("r10") arg(3),
            in("r8") arg(4),
            in("r9") arg(5),
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_s_name_is_the_protocol_s() {
        assert_eq!(SOCKET_NAME.to_bytes(), SOCKET.as_bytes());
    }

    /// The data dir's path, and so the socket's in a message, is the one `main` makes
    /// (`std::path::absolute`, then `join`).
    #[test]
    fn a_data_dir_is_made_absolute_as_the_standard_library_makes_it() {
        for dir in [
            "/a/b", "/a//b/", "/a/./b/.", "//a/b", "///a", "/", "a/b", "./a", "a/../b", ".",
            "a//b/", "../x",
        ] {
            let mut buffer = MaybeUninit::<[u8; 4096]>::uninit();
            let mut path = Path::new(&mut buffer);
            path.absolute(dir.as_bytes());
            path.terminated().unwrap();
            let mut ours = String::from_utf8(path.bytes().to_vec()).unwrap();
            if !ours.ends_with('/') {
                ours.push('/');
            }
            ours.push_str(SOCKET);
            let std = std::path::absolute(dir).unwrap().join(SOCKET);
            assert_eq!(ours, std.to_str().unwrap(), "{dir}");
        }
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0, 7, 10, 1234, usize::MAX] {
            let mut buffer = MaybeUninit::<[u8; 32]>::uninit();
            let mut path = Path::new(&mut buffer);
            decimal(&mut path, n);
            assert_eq!(path.bytes(), n.to_string().as_bytes());
        }
    }
}
