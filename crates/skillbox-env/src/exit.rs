//! The one rule that turns how a command ended into an [`ExecOutput`]: every backend
//! reports what it saw as an [`Ended`], and this file decides the exit code, the signal
//! and which limit was hit.

use std::time::Duration;

use crate::{ExecOutput, LimitKind, Truncated};

/// How the command's process ended, as the backend saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
    /// It never ran: `execve` failed with this errno.
    NotStarted(i32),
    /// The backend killed it, or it died before anything reported how it ended (its
    /// init or container was killed).
    Killed,
}

/// Everything a backend knows when an exec is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub ending: Ending,
    /// The wall-clock limit passed and the backend killed the command.
    pub timed_out: bool,
    /// Which output streams were cut at the cap.
    pub truncated: Truncated,
    /// A limit the backend's own accounting saw (a cgroup's memory or pids event, a
    /// container's OOM kill, the disk bound), which a signal alone cannot tell.
    pub accounted: Option<LimitKind>,
    pub duration: Duration,
}

impl Ended {
    /// The rule:
    /// - the exit code as it is; 127 when the program was not found and 126 when it
    ///   could not be run (the shell's codes);
    /// - a signal as it is; `SIGKILL` when the backend killed the command or it ended
    ///   unreported, and always after a timeout (the status a killed process leaves is
    ///   the backend's doing, not the command's);
    /// - the limit: what the backend accounted for, else `cpu` for `SIGXCPU`, `file_size`
    ///   for `SIGXFSZ`, else `output` when a stream was cut.
    pub fn output(self) -> ExecOutput {
        let (exit_code, signal) = match self.ending {
            _ if self.timed_out => (None, Some(libc::SIGKILL)),
            Ending::Exited(code) => (Some(code), None),
            Ending::Signaled(signal) => (None, Some(signal)),
            Ending::NotStarted(libc::ENOENT) => (Some(127), None),
            Ending::NotStarted(_) => (Some(126), None),
            Ending::Killed => (None, Some(libc::SIGKILL)),
        };
        let limit_hit = self
            .accounted
            .or(match signal {
                Some(libc::SIGXCPU) => Some(LimitKind::Cpu),
                Some(libc::SIGXFSZ) => Some(LimitKind::FileSize),
                _ => None,
            })
            .or((self.truncated.stdout || self.truncated.stderr).then_some(LimitKind::Output));
        ExecOutput {
            exit_code,
            signal,
            timed_out: self.timed_out,
            limit_hit,
            duration_ms: u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
            truncated: self.truncated,
            ..ExecOutput::default()
        }
    }
}

impl Ending {
    /// From a `wait` status word.
    pub fn from_wait_status(status: i32) -> Ending {
        if libc::WIFEXITED(status) {
            Ending::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Ending::Signaled(libc::WTERMSIG(status))
        } else {
            Ending::Killed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(ending: Ending) -> Ended {
        Ended {
            ending,
            timed_out: false,
            truncated: Truncated::default(),
            accounted: None,
            duration: Duration::from_millis(7),
        }
    }

    fn codes(out: &ExecOutput) -> (Option<i32>, Option<i32>, Option<LimitKind>, i32) {
        (out.exit_code, out.signal, out.limit_hit, out.shell_status())
    }

    #[test]
    fn exits_keep_their_code() {
        for code in [0, 1, 3, 255] {
            let out = ended(Ending::Exited(code)).output();
            assert_eq!(codes(&out), (Some(code), None, None, code));
            assert_eq!(out.success(), code == 0);
        }
        assert_eq!(ended(Ending::Exited(0)).output().duration_ms, 7);
    }

    #[test]
    fn a_signal_is_128_plus_its_number() {
        let out = ended(Ending::Signaled(libc::SIGTERM)).output();
        assert_eq!(
            codes(&out),
            (None, Some(libc::SIGTERM), None, 128 + libc::SIGTERM)
        );
        assert!(!out.success());
    }

    #[test]
    fn a_program_that_never_ran_is_127_or_126() {
        let missing = ended(Ending::NotStarted(libc::ENOENT)).output();
        assert_eq!(codes(&missing), (Some(127), None, None, 127));
        for errno in [libc::EACCES, libc::ENOEXEC, libc::EPERM] {
            let refused = ended(Ending::NotStarted(errno)).output();
            assert_eq!(codes(&refused), (Some(126), None, None, 126));
        }
    }

    #[test]
    fn a_killed_command_is_sigkill() {
        let out = ended(Ending::Killed).output();
        assert_eq!(codes(&out), (None, Some(libc::SIGKILL), None, 137));
    }

    #[test]
    fn a_timeout_is_124_and_sigkill_whatever_the_status_said() {
        for ending in [
            Ending::Exited(0),
            Ending::Signaled(libc::SIGTERM),
            Ending::Killed,
        ] {
            let out = Ended {
                timed_out: true,
                ..ended(ending)
            }
            .output();
            assert!(out.timed_out);
            assert_eq!(codes(&out), (None, Some(libc::SIGKILL), None, 124));
            assert!(!out.success());
        }
    }

    #[test]
    fn rlimit_signals_name_their_limit() {
        let cpu = ended(Ending::Signaled(libc::SIGXCPU)).output();
        assert_eq!(cpu.limit_hit, Some(LimitKind::Cpu));
        let fsize = ended(Ending::Signaled(libc::SIGXFSZ)).output();
        assert_eq!(fsize.limit_hit, Some(LimitKind::FileSize));
    }

    #[test]
    fn a_cut_stream_is_the_output_limit() {
        for truncated in [
            Truncated {
                stdout: true,
                stderr: false,
            },
            Truncated {
                stdout: false,
                stderr: true,
            },
        ] {
            let out = Ended {
                truncated,
                ..ended(Ending::Exited(0))
            }
            .output();
            assert_eq!(out.limit_hit, Some(LimitKind::Output));
            assert_eq!(out.truncated, truncated);
            // A cut stream does not fail the command.
            assert!(out.success());
        }
    }

    #[test]
    fn the_backends_accounting_comes_first() {
        let both = Truncated {
            stdout: true,
            stderr: true,
        };
        for accounted in [LimitKind::Memory, LimitKind::Pids, LimitKind::Disk] {
            // Over a signal's limit and over a cut stream.
            let out = Ended {
                accounted: Some(accounted),
                truncated: both,
                ..ended(Ending::Signaled(libc::SIGXCPU))
            }
            .output();
            assert_eq!(out.limit_hit, Some(accounted));
            assert_eq!(out.signal, Some(libc::SIGXCPU));
        }
        let oom = Ended {
            accounted: Some(LimitKind::Memory),
            ..ended(Ending::Killed)
        }
        .output();
        assert_eq!(
            codes(&oom),
            (None, Some(libc::SIGKILL), Some(LimitKind::Memory), 137)
        );
    }

    #[test]
    fn a_signal_after_a_timeout_names_no_rlimit() {
        // The timeout's SIGKILL replaces whatever the status said, SIGXCPU included.
        let out = Ended {
            timed_out: true,
            ..ended(Ending::Signaled(libc::SIGXCPU))
        }
        .output();
        assert_eq!(out.limit_hit, None);
    }

    #[test]
    fn wait_statuses_read_as_endings() {
        assert_eq!(Ending::from_wait_status(3 << 8), Ending::Exited(3));
        assert_eq!(
            Ending::from_wait_status(libc::SIGKILL),
            Ending::Signaled(libc::SIGKILL)
        );
        // Stopped (0x7f): neither exited nor signalled.
        assert_eq!(Ending::from_wait_status(0x137f), Ending::Killed);
    }
}
