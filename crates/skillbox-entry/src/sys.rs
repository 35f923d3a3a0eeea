//! Raw system calls and the few types the entry point and the trust checks build on: a
//! descriptor, a path in a caller's buffer, what `newfstatat(2)` says of a file.
//!
//! The rules at the top of `lib.rs` hold here: no libc, no panic, buffers on the stack
//! that are written before they are read. x86-64 and aarch64, the architectures skillbox
//! builds for (its seccomp policy knows no other).

use core::arch::asm;
use core::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
mod number {
    pub(crate) const READ: usize = 0;
    pub(crate) const CLOSE: usize = 3;
    pub(crate) const SOCKET: usize = 41;
    pub(crate) const CONNECT: usize = 42;
    pub(crate) const GETSOCKOPT: usize = 55;
    pub(crate) const GETEUID: usize = 107;
    pub(crate) const GETDENTS64: usize = 217;
    pub(crate) const OPENAT: usize = 257;
    pub(crate) const NEWFSTATAT: usize = 262;
    pub(crate) const PIDFD_SEND_SIGNAL: usize = 424;
}

#[cfg(target_arch = "aarch64")]
mod number {
    pub(crate) const READ: usize = 63;
    pub(crate) const CLOSE: usize = 57;
    pub(crate) const SOCKET: usize = 198;
    pub(crate) const CONNECT: usize = 203;
    pub(crate) const GETSOCKOPT: usize = 209;
    pub(crate) const GETEUID: usize = 175;
    pub(crate) const GETDENTS64: usize = 61;
    pub(crate) const OPENAT: usize = 56;
    pub(crate) const NEWFSTATAT: usize = 79;
    pub(crate) const PIDFD_SEND_SIGNAL: usize = 424;
}

pub(crate) use number::*;

pub(crate) const EINTR: isize = 4;
pub(crate) const AT_FDCWD: usize = -100isize as usize;
pub(crate) const AT_SYMLINK_NOFOLLOW: usize = 0x100;
pub(crate) const AT_EMPTY_PATH: usize = 0x1000;
pub(crate) const O_CLOEXEC: usize = 0o2000000;
/// arm and arm64 number it apart from everyone else.
#[cfg(target_arch = "x86_64")]
pub(crate) const O_DIRECTORY: usize = 0o200000;
#[cfg(target_arch = "aarch64")]
pub(crate) const O_DIRECTORY: usize = 0o40000;

/// A system call with up to six arguments; the kernel's answer (`-errno` on failure).
///
/// # Safety
///
/// The call's own: any pointer among `args` must be valid for what it does with it.
pub(crate) unsafe fn syscall<const N: usize>(number: usize, args: [usize; N]) -> isize {
    let arg = |at: usize| args.get(at).copied().unwrap_or(0);
    let answer: isize;
    #[cfg(target_arch = "x86_64")]
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
    #[cfg(target_arch = "aarch64")]
    // SAFETY: the caller's promise; `svc 0` returns in x0 and clobbers nothing else.
    unsafe {
        asm!(
            "svc 0",
            in("x8") number,
            inlateout("x0") arg(0) as isize => answer,
            in("x1") arg(1),
            in("x2") arg(2),
            in("x3") arg(3),
            in("x4") arg(4),
            in("x5") arg(5),
            options(nostack),
        );
    }
    answer
}

/// This process's effective uid.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid(2) takes nothing.
    unsafe { syscall(GETEUID, [0; 0]) as u32 }
}

/// A descriptor this process opened; `close` closes it. Not `Drop`: the compiler
/// exports a trait's methods, and so calls them through the GOT (see lib.rs).
pub(crate) struct Fd(i32);

impl Fd {
    /// The descriptor in a system call's answer; `None` for an error, and for 0, 1
    /// or 2 (closed): a closed stdout would make the socket fd 1, and the command's
    /// output would go into it. (After Rust's start they are never closed: it puts
    /// `/dev/null` there.)
    pub(crate) fn own(answer: isize) -> Option<Fd> {
        let fd = Fd(i32::try_from(answer).ok().filter(|&fd| fd >= 0)?);
        if fd.0 < 3 {
            fd.close();
            return None;
        }
        Some(fd)
    }

    pub(crate) fn raw(&self) -> usize {
        self.0 as usize
    }

    /// The number, handed over with the duty to close it.
    pub(crate) fn into_raw(self) -> i32 {
        self.0
    }

    pub(crate) fn close(self) {
        // SAFETY: closes the descriptor this value owns.
        unsafe { syscall(CLOSE, [self.raw()]) };
    }
}

/// What `newfstatat(2)` says of a file.
pub(crate) struct Stat {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
}

pub(crate) const S_IFMT: u32 = 0o170000;
pub(crate) const S_IFDIR: u32 = 0o040000;
pub(crate) const S_IFLNK: u32 = 0o120000;
pub(crate) const S_IFSOCK: u32 = 0o140000;

/// `newfstatat(dir, name, flags)`; `None` on failure.
///
/// # Safety
///
/// `name` is NUL-terminated.
pub(crate) unsafe fn stat(dir: usize, name: *const u8, flags: usize) -> Option<Stat> {
    let mut raw = MaybeUninit::<[u64; 18]>::uninit();
    // SAFETY: newfstatat(2) writes one `struct stat` (144 bytes on x86-64, 128 on
    // aarch64) into `raw`; `name` is the caller's promise.
    let done = unsafe {
        syscall(
            NEWFSTATAT,
            [dir, name as usize, raw.as_mut_ptr() as usize, flags],
        )
    };
    if done != 0 {
        return None;
    }
    let words = raw.as_ptr().cast::<u64>();
    // SAFETY: filled by the kernel: st_dev, st_ino, then on x86-64 st_nlink (64 bits)
    // and st_mode and st_uid (32 bits each) in the fourth word; on aarch64 st_mode and
    // st_nlink in the third, st_uid and st_gid in the fourth.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        let (mode, uid) = (*words.add(3) as u32, (*words.add(3) >> 32) as u32);
        #[cfg(target_arch = "aarch64")]
        let (mode, uid) = (*words.add(2) as u32, *words.add(3) as u32);
        Some(Stat {
            dev: *words,
            ino: *words.add(1),
            mode,
            uid,
        })
    }
}

/// A path built in a caller's buffer (the data dir's, a socket's, a `/proc` file's).
pub(crate) struct Path {
    pub(crate) bytes: *mut u8,
    pub(crate) capacity: usize,
    pub(crate) len: usize,
    pub(crate) overflowed: bool,
}

impl Path {
    /// A path in `buffer`; one that would not fit (with its NUL) is `overflowed`.
    pub(crate) fn new<const N: usize>(buffer: &mut MaybeUninit<[u8; N]>) -> Path {
        Path {
            bytes: buffer.as_mut_ptr().cast(),
            capacity: N,
            len: 0,
            overflowed: false,
        }
    }

    pub(crate) fn push(&mut self, piece: &[u8]) {
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

    /// The path with a NUL after it, for a system call (`/` for the root).
    pub(crate) fn terminated(&mut self) -> Option<&[u8]> {
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

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written by `push` (or getcwd(2)).
        unsafe { core::slice::from_raw_parts(self.bytes, self.len) }
    }
}

/// `n` in decimal, after what `path` holds.
pub(crate) fn decimal(path: &mut Path, n: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0, 7, 10, 1234, usize::MAX] {
            let mut buffer = MaybeUninit::<[u8; 32]>::uninit();
            let mut path = Path::new(&mut buffer);
            decimal(&mut path, n);
            assert_eq!(path.bytes(), n.to_string().as_bytes());
        }
    }

    /// The stat decoded here is the standard library's, on every architecture.
    #[test]
    fn a_stat_says_what_the_standard_library_says() {
        use std::os::unix::fs::MetadataExt;
        for (name, follow) in [(c"/proc/self/ns/user", 0), (c"/tmp", AT_SYMLINK_NOFOLLOW)] {
            // SAFETY: a NUL-terminated name.
            let ours = unsafe { stat(AT_FDCWD, name.as_ptr().cast(), follow) }.unwrap();
            let path = name.to_str().unwrap();
            let std = if follow == 0 {
                std::fs::metadata(path)
            } else {
                std::fs::symlink_metadata(path)
            }
            .unwrap();
            assert_eq!(
                (ours.dev, ours.ino, ours.mode, ours.uid),
                (std.dev(), std.ino(), std.mode(), std.uid()),
                "{path}"
            );
        }
    }
}
