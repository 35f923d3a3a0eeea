//! How a docker exec ended: the exec wrapper's status line, what skillbox did and saw
//! while the output was read, and the [`ExecOutput`] that makes, through the one exit
//! rule every backend uses ([`skillbox_env::Ended`]). Everything here is pure.

use std::time::Duration;

use skillbox_env::{
    BackendKind, Ended, Ending, EnvError, EnvResult, ExecOutput, LimitKind, Truncated,
};

/// How the exec wrapper said the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Exit(i32),
    Signal(i32),
    /// `execve` failed with this errno.
    ExecFailed(i32),
    /// `chdir` to the working directory failed with this errno.
    CwdFailed(i32),
    /// The wrapper could not set itself up (its seccomp filter): this errno.
    SetupFailed(i32),
    /// Writing the exec's input files failed: input `n / 4096`, errno `n % 4096`.
    InputFailed(i32),
    /// An exit, or a signal, while the container's memory cgroup counted an
    /// out-of-memory kill (of the command or of anything else in the container).
    OomExit(i32),
    OomSignal(i32),
}

/// How many input files one exec may write (the index must fit its status).
pub(crate) const MAX_INPUTS: usize = 255;

impl Status {
    /// The error of an [`Status::InputFailed`] `n`, naming the file from `paths`.
    pub(crate) fn input_error(n: i32, paths: &[String]) -> EnvError {
        let (index, errno) = (n / 4096, n % 4096);
        let path = usize::try_from(index)
            .ok()
            .and_then(|i| paths.get(i))
            .cloned()
            .unwrap_or_else(|| format!("input {index}"));
        EnvError::new(
            skillbox_env::errno_code(errno),
            format!("write {path}: {}", std::io::Error::from_raw_os_error(errno)),
        )
        .with_path(path)
    }
}

impl Status {
    /// The status without its out-of-memory mark, and whether it had one.
    pub(crate) fn split_oom(self) -> (Status, bool) {
        match self {
            Status::OomExit(n) => (Status::Exit(n), true),
            Status::OomSignal(n) => (Status::Signal(n), true),
            other => (other, false),
        }
    }

    /// The number a status's tag covers: its kind times 2^20, plus its number.
    fn message(self) -> Option<u64> {
        let (kind, n) = match self {
            Status::Exit(n) => (1, n),
            Status::Signal(n) => (2, n),
            Status::ExecFailed(n) => (3, n),
            Status::CwdFailed(n) => (4, n),
            Status::SetupFailed(n) => (5, n),
            Status::InputFailed(n) => (6, n),
            Status::OomExit(n) => (7, n),
            Status::OomSignal(n) => (8, n),
        };
        let n = u64::try_from(n).ok().filter(|n| *n < 1 << 20)?;
        Some(kind * (1 << 20) + n)
    }
}

/// The prime the status tags are computed modulo (2^31 - 1): small enough that the
/// wrapper's perl multiplies exactly in 64-bit integers.
const TAG_PRIME: u64 = 2_147_483_647;

/// The key that makes one exec's status line believable.
///
/// The command shares stdin, stdout and stderr with the wrapper (a docker exec has
/// nothing else), so whatever the command starts can write a status line of its own,
/// and read the wrapper's. Putting a nonce in the wrapper's argv, as before, gave it
/// away: every process in the container can read every `/proc/<pid>/cmdline`. The
/// other places a wrapper could keep a secret are no better. Its environment:
/// gVisor (this release) lets a process read `/proc/<pid>/environ` of a non-dumpable
/// process of its uid. A pipe or another fd: gVisor also lets it open
/// `/proc/<pid>/fd/N` of such a process, and under runc it can still read the
/// wrapper's line off the stderr they share. A file only root could write: the
/// container has no other uid for the wrapper to be (every capability is dropped,
/// so it could not switch to the sandbox user). What neither runtime gives away is
/// the wrapper's memory (`/proc/<pid>/mem` and ptrace are refused) and its own exit.
///
/// So the key lives only in the wrapper's memory: skillbox sends it as the first line
/// of stdin, which the wrapper reads before anything of the sandbox can run (execs
/// take turns, and what one left is killed before the next). And the line carries no
/// key, only a tag of the status under it: four one-time MACs `a·m + b mod p`. A
/// process that reads the real line learns the tag of that one status, which tells it
/// nothing about the tag of another (each guess is right with probability about
/// 2^-124). The most it can do is take the line away, which makes the exec read as
/// killed: what killing the command would have done too.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct StatusKey {
    pairs: [(u64, u64); 4],
}

impl std::fmt::Debug for StatusKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatusKey(..)")
    }
}

impl StatusKey {
    /// A fresh key, for one exec.
    pub(crate) fn random() -> std::io::Result<StatusKey> {
        let mut bytes = [0u8; 32];
        skillbox_protocol::random::fill(&mut bytes)?;
        let word = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&bytes[4 * i..4 * i + 4]);
            u64::from(u32::from_le_bytes(w)) % TAG_PRIME
        };
        Ok(StatusKey {
            pairs: [0, 1, 2, 3].map(|i| (word(2 * i), word(2 * i + 1))),
        })
    }

    /// The first line of the wrapper's stdin: the eight numbers, in decimal.
    pub(crate) fn line(&self) -> String {
        let numbers: Vec<String> = self
            .pairs
            .iter()
            .flat_map(|(a, b)| [a.to_string(), b.to_string()])
            .collect();
        format!("{}\n", numbers.join(" "))
    }

    /// The tag of `status` under this key, as the wrapper writes it (32 hex digits).
    pub(crate) fn tag(&self, status: Status) -> Option<String> {
        let m = status.message()?;
        Some(
            self.pairs
                .iter()
                .map(|(a, b)| format!("{:08x}", (a * m + b) % TAG_PRIME))
                .collect(),
        )
    }
}

fn parse_status(text: &str) -> Option<Status> {
    let (kind, number) = text.split_once(' ')?;
    let number: i32 = number.trim().parse().ok()?;
    Some(match kind {
        "exit" => Status::Exit(number),
        "signal" => Status::Signal(number),
        "exec" => Status::ExecFailed(number),
        "cwd" => Status::CwdFailed(number),
        "setup" => Status::SetupFailed(number),
        "input" => Status::InputFailed(number),
        "oomexit" => Status::OomExit(number),
        "oomsignal" => Status::OomSignal(number),
        _ => return None,
    })
}

/// Splits the wrapper's status line off the end of stderr: where the command's own
/// stderr ends, and the status if the last line is a status whose tag is right under
/// this exec's key. Anything else (a line the command wrote) is left in stderr.
pub(crate) fn split_status(tail: &[u8], key: &StatusKey) -> (usize, Option<Status>) {
    const MARKER: &[u8] = b"\0skillbox-status:";
    let Some(at) = find_last(tail, MARKER) else {
        return (tail.len(), None);
    };
    let verified = tail[at + MARKER.len()..]
        .strip_suffix(b"\n")
        .filter(|line| !line.contains(&b'\n'))
        .and_then(|line| std::str::from_utf8(line).ok())
        .and_then(|line| line.split_once(':'))
        .and_then(|(tag, text)| {
            let status = parse_status(text)?;
            (key.tag(status)? == tag).then_some(status)
        });
    match verified {
        Some(status) => (at, Some(status)),
        None => (tail.len(), None),
    }
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > haystack.len() {
        return None;
    }
    (0..=haystack.len() - needle.len())
        .rev()
        .find(|&i| &haystack[i..i + needle.len()] == needle)
}

/// What skillbox did to a running exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kill {
    /// The wall-clock limit passed.
    Deadline,
    /// The caller cancelled, or the sandbox was cleaned up.
    Abort,
}

/// What is known once an exec's output is over.
#[derive(Debug)]
pub(crate) struct Seen {
    /// What skillbox did to the command, if anything.
    pub(crate) kill: Option<Kill>,
    /// The wrapper's report, if it wrote one.
    pub(crate) status: Option<Status>,
    /// The first thing that failed: reading the output, or resetting the container.
    pub(crate) failure: Option<EnvError>,
    /// The container died under the exec (the daemon said so, or it was found stopped
    /// with nothing reported).
    pub(crate) died: bool,
    /// The sandbox was removed meanwhile (a reset that failed, a drop).
    pub(crate) removed: bool,
}

/// How an exec ended, in order of precedence.
#[derive(Debug, PartialEq)]
pub(crate) enum ExecEnd {
    /// The container died under it (under gVisor a memory bomb takes the sandbox's
    /// kernel with the code that hit it): reported as killed, and the sandbox is gone.
    ContainerDied,
    /// Cancelled by the caller, or the sandbox was cleaned up: no output, `aborted`.
    Aborted,
    /// Reading its output, or resetting the container after it, failed.
    Failed(EnvError),
    /// Its output ended. `status` is the wrapper's report (none when the wrapper was
    /// killed before it could write one); `timed_out` when skillbox killed it at the
    /// deadline.
    Finished {
        status: Option<Status>,
        timed_out: bool,
    },
}

impl From<Seen> for ExecEnd {
    fn from(seen: Seen) -> ExecEnd {
        if seen.died {
            return ExecEnd::ContainerDied;
        }
        if seen.kill == Some(Kill::Abort)
            || (seen.removed && seen.failure.is_none() && seen.status.is_none())
        {
            return ExecEnd::Aborted;
        }
        if let Some(failure) = seen.failure {
            return ExecEnd::Failed(failure);
        }
        ExecEnd::Finished {
            status: seen.status.map(|s| s.split_oom().0),
            timed_out: seen.kill == Some(Kill::Deadline),
        }
    }
}

impl ExecEnd {
    /// True when the memory limit may be what ended it, so the daemon's out-of-memory
    /// record is worth looking up: the container died, or the command was SIGKILLed (or
    /// ended unreported) without skillbox having killed it.
    pub(crate) fn may_be_memory(&self) -> bool {
        matches!(
            self,
            ExecEnd::ContainerDied
                | ExecEnd::Finished {
                    status: None | Some(Status::Signal(libc::SIGKILL)),
                    timed_out: false,
                }
        )
    }

    /// True when a full disk may be what ended it, so the sandbox's disk is worth a
    /// look: the command failed (anything but `exit 0`) with an ending to report.
    pub(crate) fn may_be_disk(&self) -> bool {
        match self {
            ExecEnd::Finished { status, .. } => match status {
                None | Some(Status::Signal(_) | Status::OomSignal(_) | Status::ExecFailed(_)) => {
                    true
                }
                Some(Status::Exit(code) | Status::OomExit(code)) => *code != 0,
                Some(Status::CwdFailed(_) | Status::SetupFailed(_) | Status::InputFailed(_)) => {
                    false
                }
            },
            ExecEnd::ContainerDied | ExecEnd::Aborted | ExecEnd::Failed(_) => false,
        }
    }

    /// The line stderr gets when the program never ran, as a shell would print it.
    pub(crate) fn note(&self, program: &str) -> Option<String> {
        let ExecEnd::Finished {
            status: Some(Status::ExecFailed(errno)),
            ..
        } = self
        else {
            return None;
        };
        let what = if *errno == libc::ENOENT {
            "command not found".to_string()
        } else {
            format!("cannot run it (errno {errno})")
        };
        Some(format!("skillbox: {program}: {what}\n"))
    }
}

/// What the backend measured besides the ending.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    /// Which output streams were cut at the cap (the note included).
    pub(crate) truncated: Truncated,
    /// The daemon recorded an out-of-memory kill for the container during the exec.
    pub(crate) oom: bool,
    /// The wrapper saw the container's memory cgroup count an out-of-memory kill while
    /// the command ran (its status said so): memory, however the command ended.
    pub(crate) oom_inside: bool,
    /// The sandbox's bounded `/workspace` or `/tmp` was full when the exec ended.
    pub(crate) disk_full: bool,
    pub(crate) duration: Duration,
}

/// The exec's result: its [`ExecOutput`] by the one exit rule, or the error it ends
/// with. `cwd` and `backend` are for the errors' messages.
pub(crate) fn outcome(
    end: ExecEnd,
    measured: Measured,
    cwd: &str,
    backend: BackendKind,
) -> EnvResult<ExecOutput> {
    // Memory first: a memory kill can leave a disk full of what was being written.
    let accounted = if measured.oom_inside || (measured.oom && end.may_be_memory()) {
        Some(LimitKind::Memory)
    } else {
        (measured.disk_full && end.may_be_disk()).then_some(LimitKind::Disk)
    };
    let (ending, timed_out) = match end {
        ExecEnd::ContainerDied => (Ending::Killed, false),
        ExecEnd::Aborted => return Err(EnvError::aborted("exec")),
        ExecEnd::Failed(error) => return Err(error),
        ExecEnd::Finished { status, timed_out } => {
            let ending = match status {
                Some(Status::Exit(code) | Status::OomExit(code)) => Ending::Exited(code),
                Some(Status::Signal(signal) | Status::OomSignal(signal)) => {
                    Ending::Signaled(signal)
                }
                Some(Status::ExecFailed(errno)) => Ending::NotStarted(errno),
                Some(Status::CwdFailed(errno)) => {
                    return Err(EnvError::new(
                        skillbox_env::errno_code(errno),
                        format!("exec: cannot use {cwd} as the working directory"),
                    )
                    .with_path(cwd));
                }
                Some(Status::InputFailed(n)) => return Err(Status::input_error(n, &[])),
                Some(Status::SetupFailed(errno)) => {
                    return Err(EnvError::new(
                        skillbox_env::ErrorCode::Unavailable,
                        format!(
                            "backend {backend}: the exec wrapper could not apply skillbox's \
                             seccomp layer (errno {errno}); refusing to run without it"
                        ),
                    ));
                }
                // Killed by skillbox (the deadline) or before the wrapper could report
                // (the OOM killer picked the wrapper).
                None => Ending::Killed,
            };
            (ending, timed_out)
        }
    };
    Ok(Ended {
        ending,
        timed_out,
        truncated: measured.truncated,
        accounted,
        duration: measured.duration,
    }
    .output())
}

#[cfg(test)]
mod tests {
    use skillbox_env::ErrorCode;

    use super::*;

    fn line(key: &StatusKey, status: Status, text: &str) -> Vec<u8> {
        format!("\0skillbox-status:{}:{text}\n", key.tag(status).unwrap()).into_bytes()
    }

    #[test]
    fn the_status_line_is_split_off_stderr() {
        let key = StatusKey::random().unwrap();
        let mut tail = b"some error\n".to_vec();
        tail.extend(line(&key, Status::Signal(9), "signal 9"));
        let (end, status) = split_status(&tail, &key);
        assert_eq!(&tail[..end], b"some error\n");
        assert_eq!(status, Some(Status::Signal(9)));
        // Under another key, or not the last line, it is the command's own output.
        let other = StatusKey::random().unwrap();
        assert_eq!(split_status(&tail, &other), (tail.len(), None));
        let mut more = line(&key, Status::Exit(0), "exit 0");
        more.extend(b"more\n");
        assert_eq!(split_status(&more, &key), (more.len(), None));
    }

    #[test]
    fn a_tag_covers_only_its_own_status() {
        let key = StatusKey::random().unwrap();
        let statuses = [
            Status::Exit(0),
            Status::Exit(3),
            Status::Exit(255),
            Status::Signal(9),
            Status::ExecFailed(2),
            Status::CwdFailed(2),
            Status::SetupFailed(1),
            Status::InputFailed(4096 + 28),
            Status::OomExit(137),
            Status::OomSignal(9),
        ];
        let texts = [
            "exit 0",
            "exit 3",
            "exit 255",
            "signal 9",
            "exec 2",
            "cwd 2",
            "setup 1",
            "input 4124",
            "oomexit 137",
            "oomsignal 9",
        ];
        for (status, text) in statuses.iter().zip(texts) {
            assert_eq!(parse_status(text), Some(*status));
            let real = line(&key, *status, text);
            assert_eq!(split_status(&real, &key).1, Some(*status), "{text}");
            // The tag of this status, on any other status: refused.
            let tag = key.tag(*status).unwrap();
            for other in texts.iter().filter(|t| **t != text) {
                let forged = format!("\0skillbox-status:{tag}:{other}\n");
                assert_eq!(split_status(forged.as_bytes(), &key).1, None, "{other}");
            }
        }
        // No tag at all, or a number out of the tagged range.
        assert_eq!(split_status(b"\0skillbox-status:exit 0\n", &key).1, None);
        assert_eq!(Status::Exit(-1).message(), None);
        assert_eq!(Status::Exit(1 << 20).message(), None);
        // The key's line is what the wrapper parses: eight numbers under the prime.
        let text = key.line();
        let numbers: Vec<u64> = text
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(numbers.len(), 8);
        assert!(numbers.iter().all(|n| *n < TAG_PRIME));
        assert!(text.ends_with('\n') && !text[..text.len() - 1].contains('\n'));
        assert_eq!(format!("{key:?}"), "StatusKey(..)");
    }

    #[test]
    fn statuses_parse() {
        assert_eq!(parse_status("exit 3"), Some(Status::Exit(3)));
        assert_eq!(parse_status("exec 2"), Some(Status::ExecFailed(2)));
        assert_eq!(parse_status("cwd 20"), Some(Status::CwdFailed(20)));
        assert_eq!(parse_status("bogus 1"), None);
        assert_eq!(parse_status("exit x"), None);
    }

    fn seen(status: Option<Status>) -> Seen {
        Seen {
            kill: None,
            status,
            failure: None,
            died: false,
            removed: false,
        }
    }

    fn failure() -> EnvError {
        EnvError::new(ErrorCode::Unknown, "exec output: the stream broke")
    }

    #[test]
    fn the_ending_is_decided_in_order() {
        let finished = |status, timed_out| ExecEnd::Finished { status, timed_out };
        let exit0 = Some(Status::Exit(0));
        // A dead container comes first, whatever else happened.
        let all = Seen {
            kill: Some(Kill::Deadline),
            failure: Some(failure()),
            removed: true,
            died: true,
            ..seen(exit0)
        };
        assert_eq!(ExecEnd::from(all), ExecEnd::ContainerDied);
        // Then an abort (a cancel or a cleanup), even over a status and a failure.
        let abort = Seen {
            kill: Some(Kill::Abort),
            failure: Some(failure()),
            ..seen(exit0)
        };
        assert_eq!(ExecEnd::from(abort), ExecEnd::Aborted);
        // A sandbox removed under an exec that said nothing and saw nothing fail.
        let removed = Seen {
            removed: true,
            ..seen(None)
        };
        assert_eq!(ExecEnd::from(removed), ExecEnd::Aborted);
        // ... but a status or a failure says more than the removal.
        let removed = Seen {
            removed: true,
            ..seen(exit0)
        };
        assert_eq!(ExecEnd::from(removed), finished(exit0, false));
        let broke = Seen {
            removed: true,
            failure: Some(failure()),
            ..seen(None)
        };
        assert_eq!(ExecEnd::from(broke), ExecEnd::Failed(failure()));
        // A failure over a status.
        let broke = Seen {
            failure: Some(failure()),
            ..seen(exit0)
        };
        assert_eq!(ExecEnd::from(broke), ExecEnd::Failed(failure()));
        // Otherwise the status, with the deadline if skillbox killed at it.
        assert_eq!(ExecEnd::from(seen(exit0)), finished(exit0, false));
        let late = Seen {
            kill: Some(Kill::Deadline),
            ..seen(None)
        };
        assert_eq!(ExecEnd::from(late), finished(None, true));
    }

    #[test]
    fn memory_is_looked_for_only_where_it_can_be_the_cause() {
        let finished = |status, timed_out| ExecEnd::Finished { status, timed_out };
        assert!(ExecEnd::ContainerDied.may_be_memory());
        assert!(finished(None, false).may_be_memory());
        assert!(finished(Some(Status::Signal(libc::SIGKILL)), false).may_be_memory());
        // Killed by skillbox at the deadline: the timeout, not memory.
        assert!(!finished(None, true).may_be_memory());
        assert!(!finished(Some(Status::Signal(libc::SIGKILL)), true).may_be_memory());
        for status in [
            Status::Exit(0),
            Status::Exit(137),
            Status::Signal(libc::SIGTERM),
            Status::ExecFailed(libc::ENOENT),
        ] {
            assert!(!finished(Some(status), false).may_be_memory(), "{status:?}");
        }
        assert!(!ExecEnd::Aborted.may_be_memory());
        assert!(!ExecEnd::Failed(failure()).may_be_memory());
    }

    fn measured(oom: bool) -> Measured {
        Measured {
            truncated: Truncated::default(),
            oom,
            oom_inside: false,
            disk_full: false,
            duration: Duration::from_millis(9),
        }
    }

    fn output(end: ExecEnd, oom: bool) -> EnvResult<ExecOutput> {
        outcome(end, measured(oom), "/workspace/sub", BackendKind::Docker)
    }

    fn fields(out: &ExecOutput) -> (Option<i32>, Option<i32>, bool, Option<LimitKind>) {
        (out.exit_code, out.signal, out.timed_out, out.limit_hit)
    }

    #[test]
    fn a_reported_status_is_the_exit_rules() {
        let done = |status| ExecEnd::Finished {
            status: Some(status),
            timed_out: false,
        };
        let out = output(done(Status::Exit(3)), false).unwrap();
        assert_eq!(fields(&out), (Some(3), None, false, None));
        assert_eq!(out.duration_ms, 9);
        let out = output(done(Status::Signal(libc::SIGTERM)), false).unwrap();
        assert_eq!(fields(&out), (None, Some(libc::SIGTERM), false, None));
        let out = output(done(Status::ExecFailed(libc::ENOENT)), false).unwrap();
        assert_eq!(fields(&out), (Some(127), None, false, None));
        let out = output(done(Status::ExecFailed(libc::EACCES)), false).unwrap();
        assert_eq!(fields(&out), (Some(126), None, false, None));
        // SIGXCPU names the cpu limit, by the same rule as every backend.
        let out = output(done(Status::Signal(libc::SIGXCPU)), false).unwrap();
        assert_eq!(out.limit_hit, Some(LimitKind::Cpu));
    }

    #[test]
    fn a_wrapper_that_could_not_start_the_command_is_an_error() {
        let done = |status| ExecEnd::Finished {
            status: Some(status),
            timed_out: false,
        };
        let e = output(done(Status::CwdFailed(libc::ENOENT)), false).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(e.path.as_deref(), Some("/workspace/sub"));
        assert!(e.message.contains("/workspace/sub"), "{e}");
        let e = output(done(Status::SetupFailed(libc::EINVAL)), false).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(
            e.message.contains("seccomp") && e.message.contains("docker"),
            "{e}"
        );
    }

    #[test]
    fn kills_and_deaths() {
        // Unreported: killed before the wrapper could say; memory when the daemon says.
        let unreported = || ExecEnd::Finished {
            status: None,
            timed_out: false,
        };
        let out = output(unreported(), false).unwrap();
        assert_eq!(fields(&out), (None, Some(libc::SIGKILL), false, None));
        let out = output(unreported(), true).unwrap();
        assert_eq!(
            fields(&out),
            (None, Some(libc::SIGKILL), false, Some(LimitKind::Memory))
        );
        // The deadline: 124's SIGKILL whatever the wrapper said, never memory.
        for status in [None, Some(Status::Exit(0)), Some(Status::Signal(9))] {
            let late = ExecEnd::Finished {
                status,
                timed_out: true,
            };
            let out = output(late, true).unwrap();
            assert_eq!(fields(&out), (None, Some(libc::SIGKILL), true, None));
            assert_eq!(out.shell_status(), 124);
        }
        // A dead container: killed, memory when the daemon recorded it, never a timeout.
        let out = output(ExecEnd::ContainerDied, true).unwrap();
        assert_eq!(
            fields(&out),
            (None, Some(libc::SIGKILL), false, Some(LimitKind::Memory))
        );
        let out = output(ExecEnd::ContainerDied, false).unwrap();
        assert_eq!(fields(&out), (None, Some(libc::SIGKILL), false, None));
        // An OOM record does not make a clean exit a memory kill.
        let clean = ExecEnd::Finished {
            status: Some(Status::Exit(0)),
            timed_out: false,
        };
        assert_eq!(output(clean, true).unwrap().limit_hit, None);
    }

    #[test]
    fn a_failed_command_with_its_disk_full_hit_the_disk_limit() {
        let full = |end: ExecEnd, oom: bool| {
            let measured = Measured {
                disk_full: true,
                ..measured(oom)
            };
            outcome(end, measured, "/workspace", BackendKind::Docker).unwrap()
        };
        let done = |status| ExecEnd::Finished {
            status,
            timed_out: false,
        };
        for status in [
            Some(Status::Exit(1)),
            Some(Status::Signal(libc::SIGXFSZ)),
            Some(Status::ExecFailed(libc::ENOSPC)),
            None,
        ] {
            let out = full(done(status), false);
            assert_eq!(out.limit_hit, Some(LimitKind::Disk), "{status:?}");
        }
        // A command that succeeded did not run out of disk, whatever is left.
        assert_eq!(full(done(Some(Status::Exit(0))), false).limit_hit, None);
        // Memory comes first; a dead container is memory's or nothing's.
        let out = full(done(None), true);
        assert_eq!(out.limit_hit, Some(LimitKind::Memory));
        assert_eq!(full(ExecEnd::ContainerDied, false).limit_hit, None);
        // Killed at the deadline with the disk full: the disk, by the one exit rule.
        let late = ExecEnd::Finished {
            status: None,
            timed_out: true,
        };
        let out = full(late, false);
        assert!(out.timed_out);
        assert_eq!(out.limit_hit, Some(LimitKind::Disk));
        assert!(!ExecEnd::Aborted.may_be_disk());
        assert!(!done(Some(Status::CwdFailed(2))).may_be_disk());
    }

    #[test]
    fn aborts_and_failures_are_errors() {
        let e = output(ExecEnd::Aborted, true).unwrap_err();
        assert_eq!(e.code, ErrorCode::Aborted);
        assert_eq!(output(ExecEnd::Failed(failure()), true), Err(failure()));
    }

    #[test]
    fn a_cut_stream_is_reported() {
        let truncated = Truncated {
            stdout: false,
            stderr: true,
        };
        let end = ExecEnd::Finished {
            status: Some(Status::Exit(0)),
            timed_out: false,
        };
        let out = outcome(
            end,
            Measured {
                truncated,
                ..measured(false)
            },
            "/workspace",
            BackendKind::Gvisor,
        )
        .unwrap();
        assert_eq!(out.truncated, truncated);
        assert_eq!(out.limit_hit, Some(LimitKind::Output));
        assert_eq!(out.exit_code, Some(0));
    }

    #[test]
    fn only_a_program_that_never_ran_gets_a_note() {
        let done = |status| ExecEnd::Finished {
            status: Some(status),
            timed_out: false,
        };
        assert_eq!(
            done(Status::ExecFailed(libc::ENOENT))
                .note("nope")
                .as_deref(),
            Some("skillbox: nope: command not found\n")
        );
        assert_eq!(
            done(Status::ExecFailed(libc::EACCES)).note("x").as_deref(),
            Some("skillbox: x: cannot run it (errno 13)\n")
        );
        assert_eq!(done(Status::Exit(127)).note("x"), None);
        assert_eq!(ExecEnd::ContainerDied.note("x"), None);
    }
}
