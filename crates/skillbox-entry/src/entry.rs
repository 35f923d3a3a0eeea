//! The binary's entry point (`-Wl,--entry=skillbox_entry`, set by skillbox's build
//! script): a plain exec goes to `skillbox warm` from here; anything else goes on to
//! glibc's `_start` with the stack and registers the kernel (or the dynamic loader)
//! handed over.
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
/// line is not a plain exec, `SKILLBOX_LOG` is set, no server of this user answers,
/// or it is another version.
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
    // As `skillbox_env::default_data_dir`: the first of each variable, empty as unset.
    let mut path = Path::new();
    match (
        exec.data_dir,
        data.filter(|d| !d.is_empty()),
        home.filter(|h| !h.is_empty()),
    ) {
        (Some(dir), _, _) | (None, Some(dir), _) => path.push(dir),
        (None, None, Some(home)) => {
            path.push(home);
            path.push_dir(b".local/share/skillbox");
        }
        (None, None, None) => return,
    }
    path.push_dir(SOCKET.as_bytes());
    if path.overflowed {
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
    let Some(socket) = Socket::connect(&path) else {
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

fn went_away(path: &Path) -> ! {
    write_all(2, crate::WENT_AWAY_BEFORE.as_bytes());
    write_all(2, path.bytes());
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

/// The socket's path, NUL-terminated, in a `sockaddr_un`'s 108 bytes.
struct Path {
    bytes: MaybeUninit<[u8; 108]>,
    len: usize,
    overflowed: bool,
}

impl Path {
    fn new() -> Path {
        Path {
            bytes: MaybeUninit::uninit(),
            len: 0,
            overflowed: false,
        }
    }

    fn push(&mut self, piece: &[u8]) {
        for &byte in piece {
            // One byte is kept for the NUL.
            if self.len + 1 >= 108 || byte == 0 {
                self.overflowed = true;
                return;
            }
            // SAFETY: `len` is below the buffer's size, checked above.
            unsafe {
                self.bytes
                    .as_mut_ptr()
                    .cast::<u8>()
                    .add(self.len)
                    .write(byte)
            };
            self.len += 1;
        }
    }

    /// `name` as a path component: after a `/` unless there is one (as `Path::join`).
    fn push_dir(&mut self, name: &[u8]) {
        if self.bytes().last() != Some(&b'/') {
            self.push(b"/");
        }
        self.push(name);
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written by `push`.
        unsafe { core::slice::from_raw_parts(self.bytes.as_ptr().cast(), self.len) }
    }
}

/// A unix stream socket; `close` closes it.
struct Socket(i32);

impl Socket {
    fn connect(path: &Path) -> Option<Socket> {
        const AF_UNIX: usize = 1;
        const SOCK_STREAM_CLOEXEC: usize = 1 | 0o2000000;
        // SAFETY: socket(2) takes no pointers.
        let fd = unsafe { syscall(SYS_SOCKET, [AF_UNIX, SOCK_STREAM_CLOEXEC, 0, 0]) };
        let socket = Socket(i32::try_from(fd).ok().filter(|&fd| fd >= 0)?);
        let mut address = MaybeUninit::<[u8; 110]>::uninit();
        let at = address.as_mut_ptr().cast::<u8>();
        // SAFETY: `address` holds the family's 2 bytes and 108 of path, and the path
        // (with its NUL) is below 108 bytes; connect(2) reads `2 + len + 1` of them.
        let connected = unsafe {
            at.cast::<u16>().write_unaligned(AF_UNIX as u16);
            for (i, &byte) in path.bytes().iter().enumerate() {
                at.add(2 + i).write(byte);
            }
            at.add(2 + path.len).write(0);
            syscall(SYS_CONNECT, [fd as usize, at as usize, 2 + path.len + 1, 0])
        };
        if connected == 0 {
            return Some(socket);
        }
        socket.close();
        None
    }

    /// The process at the other end is this user's (the kernel says so): a server of
    /// another user is none of this client's business.
    fn is_my_users(&self) -> bool {
        const SOL_SOCKET: usize = 1;
        const SO_PEERCRED: usize = 17;
        let mut credentials = [0u32; 3];
        let mut len = 12u32;
        // SAFETY: getsockopt(2) writes at most `len` (12) bytes: pid, uid, gid.
        let done = unsafe {
            syscall(
                SYS_GETSOCKOPT,
                [
                    self.0 as usize,
                    SOL_SOCKET,
                    SO_PEERCRED,
                    credentials.as_mut_ptr() as usize,
                    &mut len as *mut u32 as usize,
                ],
            )
        };
        // SAFETY: geteuid(2) takes nothing.
        let me = unsafe { syscall(SYS_GETEUID, [0; 0]) };
        done == 0 && len == 12 && isize::try_from(credentials[1]) == Ok(me)
    }

    fn send_all(&self, mut bytes: &[u8]) -> bool {
        const MSG_NOSIGNAL: usize = 0x4000;
        while !bytes.is_empty() {
            // SAFETY: sendto(2) reads `bytes`.
            let sent = unsafe {
                syscall(
                    SYS_SENDTO,
                    [
                        self.0 as usize,
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
            let got = unsafe { syscall(SYS_READ, [self.0 as usize, to as usize, len]) };
            if got != -EINTR {
                return usize::try_from(got).unwrap_or(0);
            }
        }
    }

    /// Not `Drop`: the compiler exports a trait's methods, and so calls them through
    /// the GOT (see lib.rs).
    fn close(self) {
        // SAFETY: closes the descriptor this value owns.
        unsafe { syscall(SYS_CLOSE, [self.0 as usize]) };
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
    let mut before = MaybeUninit::<KernelSigaction>::uninit();
    // SAFETY: rt_sigaction(2) reads `action` and writes `before`, with an 8-byte mask.
    unsafe {
        syscall(
            SYS_RT_SIGACTION,
            [
                signal,
                action as *const KernelSigaction as usize,
                before.as_mut_ptr() as usize,
                8,
            ],
        );
        before.assume_init()
    }
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

const EINTR: isize = 4;
const SYS_READ: usize = 0;
const SYS_WRITE: usize = 1;
const SYS_CLOSE: usize = 3;
const SYS_RT_SIGACTION: usize = 13;
const SYS_SOCKET: usize = 41;
const SYS_CONNECT: usize = 42;
const SYS_SENDTO: usize = 44;
const SYS_GETSOCKOPT: usize = 55;
const SYS_GETEUID: usize = 107;
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
