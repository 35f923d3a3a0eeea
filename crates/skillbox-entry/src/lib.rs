//! skillbox's first instructions, and the wire format of `skillbox warm`.
//!
//! `skillbox [--data-dir DIR] exec [--json] -- CMD...`, with a `skillbox warm` serving
//! that data dir, is sent to the server by the binary's entry point, before the C
//! library starts: a warm exec does not pay for glibc's start (its cache-size probes,
//! `cpuid` after `cpuid`, each a trap to the hypervisor on a VM) or for relocating the
//! static-pie binary (some 50,000 pointers, 200 pages made private). Anything else (or
//! no server, or one of another version) goes on to glibc's `_start` untouched, and the
//! command line is parsed as usual.
//!
//! This file is the portable part: the protocol, which command lines are a plain exec,
//! and the request's bytes. `entry` (x86-64 Linux) is the entry point itself; `trust`
//! (x86-64 and aarch64 Linux) is which server a client talks to and whom a server
//! serves, the one copy of those checks, which skillbox's Rust client and server call
//! too; `sys` is the raw system calls both make. Besides the protocol's constants only
//! `trust`'s two doors are public, and the entry point does not call them: a function
//! another crate could reach would be exported, and rustc calls exported functions
//! through the GOT (it does not ask the linker to relax those calls), which is not
//! filled in yet.
//!
//! # Nothing here may need the C library or a relocation
//!
//! In the static-pie release binary this code runs before `_dl_relocate_static_pie`
//! and before glibc picks its string functions (IRELATIVE). So it reads only the stack
//! the kernel handed over and data addressed relative to the instruction pointer:
//! - no pointer stored in static data: no `&str` or `&[u8]` in a `static` or a
//!   promoted constant table, no trait object (a vtable), no `fmt`, no panic that can
//!   happen (a panic's location is such a pointer);
//! - no call to `memcpy`, `memset`, `memcmp` or `strlen` (resolved at run time):
//!   `no_builtins` keeps LLVM from turning loops into them, nothing copies or zeroes a
//!   buffer wholesale (`copy_from_slice`, `[0; N]`), and bytes are compared with
//!   `same`, not `==` on slices (which is `memcmp`);
//! - no allocation, no thread-local, no libc.
//!
//! Where the binary is linked dynamically (tests, `cargo build`), the dynamic loader
//! has relocated everything before the entry point runs, so a slip here shows only in
//! the static-pie binary: scripts/test.sh runs every path of it there.
#![cfg_attr(not(test), no_std)]
#![no_builtins]

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod entry;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod sys;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod trust;

/// The server's socket, in the data dir.
pub const SOCKET: &str = "warm.sock";
/// A request is at most this large (its length, then JSON: the command and the limits).
pub const MAX_REQUEST: usize = 1 << 20;
/// The version a server must be to take a request: it is this binary's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The limits a plain exec asks for: `exec`'s defaults (the other fields' defaults are
/// `Limits::default`'s, and only the timeout differs in `exec`; skillbox's tests hold
/// the two to each other). Sent, not left out: a server of this version from before
/// still reads the request.
pub const LIMITS: &str = r#"{"timeoutMs":60000}"#;

// Frames from the server: a kind byte, a little-endian u32 length, the bytes.
/// The command's stdout (or `--json`'s line).
pub const OUT: u8 = b'o';
/// The command's stderr, and skillbox's own messages.
pub const ERR: u8 = b'e';
/// The end: one byte, the exit status.
pub const END: u8 = b'x';
/// The server is another version of skillbox: the client runs the command itself.
pub const OTHER_VERSION: u8 = b'v';

/// What an interrupted client prints (what `exec` says for a cancel) before it ends
/// with [`INTERRUPTED_STATUS`].
pub const INTERRUPTED: &str = "skillbox exec: aborted: exec: cancelled\n";
/// `exec`'s status when skillbox itself failed or was stopped.
pub const INTERRUPTED_STATUS: u8 = 125;
/// What a client prints, before the socket's path and [`WENT_AWAY_AFTER`], when the
/// server closes the connection before the exit status (and ends with
/// [`INTERRUPTED_STATUS`]).
pub const WENT_AWAY_BEFORE: &str = "skillbox exec: skillbox warm (at ";
pub const WENT_AWAY_AFTER: &str = ") went away before the command ended\n";

/// A plain exec's parts, taken from its command line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlainExec<'a, I> {
    /// `--data-dir`'s value, if given.
    pub(crate) data_dir: Option<&'a [u8]>,
    pub(crate) json: bool,
    /// The command's words (at least one, each UTF-8).
    pub(crate) command: I,
}

/// `[--data-dir DIR | --data-dir=DIR] exec [--json] -- CMD...` (`--data-dir` before or
/// after `exec`), every word UTF-8, and nothing else: `None` for any other command
/// line, which the full parser then reads. `args` are the words after the program's name.
pub(crate) fn plain_exec<'a, I>(mut args: I) -> Option<PlainExec<'a, I>>
where
    I: Iterator<Item = &'a [u8]> + Clone,
{
    let (mut data_dir, mut json, mut subcommand) = (None, false, false);
    loop {
        let arg = utf8(args.next()?)?;
        if same(arg, b"--") && subcommand {
            break;
        } else if same(arg, b"exec") && !subcommand {
            subcommand = true;
        } else if same(arg, b"--json") && subcommand && !json {
            json = true;
        } else if same(arg, b"--data-dir") && data_dir.is_none() {
            let dir = utf8(args.next()?)?;
            if dir.is_empty() || dir.first() == Some(&b'-') {
                return None;
            }
            data_dir = Some(dir);
        } else {
            match after(arg, b"--data-dir=") {
                Some(dir) if data_dir.is_none() && !dir.is_empty() => data_dir = Some(dir),
                _ => return None,
            }
        }
    }
    let mut words = args.clone();
    let first = words.next()?;
    if utf8(first).is_none() || words.any(|word| utf8(word).is_none()) {
        return None;
    }
    Some(PlainExec {
        data_dir,
        json,
        command: args,
    })
}

/// `a == b`, byte by byte: slices' `==` calls `memcmp`.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// What follows `prefix` in `word`, if it starts so.
fn after<'a>(word: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let (head, rest) = word.split_at_checked(prefix.len())?;
    same(head, prefix).then_some(rest)
}

/// `word` if it is UTF-8 (the rules of `str::from_utf8`, which is another crate's
/// function and so called through the GOT, unrelocated at this point).
fn utf8(word: &[u8]) -> Option<&[u8]> {
    let mut at = 0;
    while let Some(&lead) = word.get(at) {
        // The length of the sequence and the range its second byte must be in
        // (no overlong forms, no surrogates, nothing above U+10FFFF).
        let (len, low, high) = match lead {
            0x00..=0x7f => (1, 0, 0),
            0xc2..=0xdf => (2, 0x80, 0xbf),
            0xe0 => (3, 0xa0, 0xbf),
            0xe1..=0xec | 0xee..=0xef => (3, 0x80, 0xbf),
            0xed => (3, 0x80, 0x9f),
            0xf0 => (4, 0x90, 0xbf),
            0xf1..=0xf3 => (4, 0x80, 0xbf),
            0xf4 => (4, 0x80, 0x8f),
            _ => return None,
        };
        if len > 1 {
            let second = *word.get(at + 1)?;
            if second < low || second > high {
                return None;
            }
            for next in 2..len {
                if !(0x80..=0xbf).contains(word.get(at + next)?) {
                    return None;
                }
            }
        }
        at += len;
    }
    Some(word)
}

/// The request's JSON, handed to `out` piece by piece (no buffer of its own): the
/// version, the limits, `--json` and the command.
pub(crate) fn request<'a, I>(exec: &PlainExec<'a, I>, out: &mut impl FnMut(&[u8]))
where
    I: Iterator<Item = &'a [u8]> + Clone,
{
    out(b"{\"version\":\"");
    out(VERSION.as_bytes());
    out(b"\",\"exec\":{\"limits\":");
    out(LIMITS.as_bytes());
    out(if exec.json {
        b",\"json\":true,\"command\":["
    } else {
        b",\"json\":false,\"command\":["
    });
    for (at, word) in exec.command.clone().enumerate() {
        if at > 0 {
            out(b",");
        }
        out(b"\"");
        json_string(word, out);
        out(b"\"");
    }
    out(b"]}}");
}

/// `text`'s bytes inside a JSON string: quote, backslash and control bytes escaped.
fn json_string(text: &[u8], out: &mut impl FnMut(&[u8])) {
    let mut plain = text;
    while let Some(at) = plain
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
    {
        // Checked forms only: a panic's path is a call that could unwind (see above).
        let Some((before, rest)) = plain.split_at_checked(at) else {
            return;
        };
        out(before);
        let Some((&byte, rest)) = rest.split_first() else {
            return;
        };
        let hex = b"0123456789abcdef";
        let escaped = match byte {
            b'"' => [b'\\', b'"', 0, 0, 0, 0],
            b'\\' => [b'\\', b'\\', 0, 0, 0, 0],
            _ => [
                b'\\',
                b'u',
                b'0',
                b'0',
                *hex.get(usize::from(byte >> 4)).unwrap_or(&b'0'),
                *hex.get(usize::from(byte & 0xf)).unwrap_or(&b'0'),
            ],
        };
        out(escaped
            .get(..if byte < 0x20 { 6 } else { 2 })
            .unwrap_or(&[]));
        plain = rest;
    }
    out(plain);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> Option<(Option<String>, bool, Vec<String>)> {
        let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let exec = plain_exec(words.iter().copied())?;
        let text = |word: &[u8]| String::from_utf8(word.to_vec()).unwrap();
        Some((
            exec.data_dir.map(text),
            exec.json,
            exec.command.map(text).collect(),
        ))
    }

    #[test]
    fn only_a_plain_exec_is_taken_before_the_c_library() {
        let command = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parsed("exec -- true"),
            Some((None, false, command(&["true"])))
        );
        assert_eq!(
            parsed("--data-dir /d exec --json -- sh -c x"),
            Some((Some("/d".into()), true, command(&["sh", "-c", "x"])))
        );
        assert_eq!(
            parsed("exec --data-dir=/d -- echo --json"),
            Some((Some("/d".into()), false, command(&["echo", "--json"])))
        );
        for other in [
            "exec true",
            "exec --",
            "exec --memory 1G -- true",
            "exec --backend docker -- true",
            "exec --workdir /w -- true",
            "exec --json --json -- true",
            "--json exec -- true",
            "run -- true",
            "exec exec -- true",
            "-- exec true",
            "--data-dir exec -- true",
            "--data-dir -x exec -- true",
            "--data-dir= exec -- true",
            "--data-dir /a --data-dir /b exec -- true",
            "exec --help",
            "--version",
            "",
        ] {
            assert_eq!(parsed(other), None, "{other}");
        }
    }

    #[test]
    fn utf8_is_what_the_standard_library_says_it_is() {
        let agrees = |bytes: &[u8]| {
            assert_eq!(
                utf8(bytes).is_some(),
                std::str::from_utf8(bytes).is_ok(),
                "{bytes:x?}"
            );
        };
        for a in 0..=255u8 {
            agrees(&[a]);
            for b in 0..=255u8 {
                agrees(&[a, b]);
                agrees(&[b'x', a, b]);
                for c in [0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xff] {
                    agrees(&[a, b, c]);
                    for d in [0x41, 0x80, 0xbf, 0xc0] {
                        agrees(&[a, b, c, d]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_word_that_is_not_utf8_leaves_the_command_line_to_the_full_parser() {
        let bad: &[u8] = b"\xff";
        for words in [
            vec![&b"exec"[..], b"--", bad],
            vec![b"exec", b"--", b"echo", bad],
            vec![b"--data-dir", bad, b"exec", b"--", b"true"],
            vec![bad, b"exec", b"--", b"true"],
        ] {
            assert!(plain_exec(words.iter().copied()).is_none(), "{words:?}");
        }
    }

    #[test]
    fn the_request_is_json_the_server_reads_back_word_for_word() {
        let words: Vec<&[u8]> = vec![
            b"--data-dir",
            b"/d",
            b"exec",
            b"--json",
            b"--",
            b"sh",
            b"-c",
            "echo \"hi\" \\ there\n\t\u{1}\u{1f}\u{7f} é 🙂 --".as_bytes(),
            b"",
        ];
        let exec = plain_exec(words.iter().copied()).unwrap();
        let mut bytes = Vec::new();
        request(&exec, &mut |piece| bytes.extend_from_slice(piece));
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "version": env!("CARGO_PKG_VERSION"),
                "exec": {
                    "limits": {"timeoutMs": 60000},
                    "json": true,
                    "command": [
                        "sh",
                        "-c",
                        "echo \"hi\" \\ there\n\t\u{1}\u{1f}\u{7f} é 🙂 --",
                        "",
                    ],
                },
            })
        );
    }
}
