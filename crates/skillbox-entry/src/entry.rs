//! The binary's entry point (`-Wl,--entry=skillbox_entry`, set by skillbox's build
//! script): a plain exec goes to `skillbox warm` from here; anything else goes on to
//! glibc's `_start` with the stack pointer and `rdx` as the kernel (or the dynamic
//! loader) handed them over, which is all `_start` reads.
//!
//! The rules at the top of `lib.rs` hold here: raw system calls only, buffers on the
//! stack that are written before they are read, no panic.

use core::arch::naked_asm;
use core::marker::PhantomData;
use core::mem::MaybeUninit;

use crate::sys::{EINTR, Path, syscall};
use crate::trust::Socket;
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
    // The data dir, its socket and the server behind it, trusted as the Rust client
    // and the server trust them: the same code (`crate::trust`).
    let Some(socket) = path.terminated().and_then(crate::trust::server) else {
        return;
    };
    // From here Ctrl-C ends this client (the server sees the connection close and ends
    // the command), and a closed stdout does not: its writes fail and are dropped.
    let signals = Signals::take();
    if send_request(&socket, &exec, length32) {
        relay(&socket, &path);
    }
    signals.restore();
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

impl Path {
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
}

/// The entry point's own use of the socket `crate::trust` connected.
impl Socket {
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
            let got = unsafe { syscall(crate::sys::READ, [self.0.raw(), to as usize, len]) };
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

// The system calls only the entry point makes (the rest are `crate::sys`'s).
const SYS_WRITE: usize = 1;
const SYS_RT_SIGACTION: usize = 13;
const SYS_SENDTO: usize = 44;
const SYS_GETCWD: usize = 79;
const SYS_EXIT_GROUP: usize = 231;

#[cfg(test)]
mod tests {
    use super::*;

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
}
