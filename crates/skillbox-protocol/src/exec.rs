//! How one exec ended: [`ExecOutput`].

use serde::{Deserialize, Serialize, Serializer};

/// Which limit ended or cut a run.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    Memory,
    Pids,
    Cpu,
    Output,
    FileSize,
    /// The sandbox's `/workspace` and `/tmp` together are full (bytes or inodes).
    Disk,
}

impl LimitKind {
    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Memory => "memory",
            LimitKind::Pids => "pids",
            LimitKind::Cpu => "cpu",
            LimitKind::Output => "output",
            LimitKind::FileSize => "file_size",
            LimitKind::Disk => "disk",
        }
    }
}

/// Whether each stream hit the output cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Truncated {
    pub stdout: bool,
    pub stderr: bool,
}

/// The result of one exec. `exitCode` is null when a signal ended the process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExecOutput {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    #[serde(serialize_with = "lossy_utf8")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub stdout: Vec<u8>,
    #[serde(serialize_with = "lossy_utf8")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub stderr: Vec<u8>,
    pub timed_out: bool,
    pub limit_hit: Option<LimitKind>,
    pub duration_ms: u64,
    pub truncated: Truncated,
}

fn lossy_utf8<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&String::from_utf8_lossy(bytes))
}

impl ExecOutput {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// True when the process exited by itself with status 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    /// The shell convention: the exit code, 124 on timeout, 128+N on signal N.
    pub fn shell_status(&self) -> i32 {
        shell_status(self.timed_out, self.exit_code, self.signal)
    }
}

/// The shell convention for an ending: 124 after a timeout, the exit code, or 128+N
/// after signal N.
pub(crate) fn shell_status(timed_out: bool, exit_code: Option<i32>, signal: Option<i32>) -> i32 {
    if timed_out {
        124
    } else if let Some(code) = exit_code {
        code
    } else {
        128 + signal.unwrap_or(0)
    }
}
