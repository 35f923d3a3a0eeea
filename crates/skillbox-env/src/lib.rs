//! `ExecutionEnv` is the only door between a skillbox tool and the machine: a
//! [`FileSystem`] plus a [`Shell`]. Swap the env and the same tool runs on the host, in a
//! namespace sandbox, in a container or in a VM.
//!
//! Every operation returns [`EnvResult`] and takes a [`CancellationToken`]; cancelling
//! kills the work where it runs, not just the waiter.

mod error;
mod exec;
mod fs;
mod host;
mod limits;
pub mod path;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use error::{EnvError, EnvResult, ErrorCode};
pub use exec::{Command, ExecEvent, ExecOutput, ExecRequest, ExecStream, LimitKind, Truncated};
pub use fs::{
    DirEntry, FileInfo, FileKind, FileRead, FileSystem, TextLines, WalkEntry, first_lines,
    too_many_entries,
};
pub use host::HostEnv;
pub use limits::{Limits, Mount, SandboxPolicy, SandboxSpec};
pub use tokio_util::sync::CancellationToken;

use async_trait::async_trait;

/// What stands between the code and the machine, as a backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Boundary {
    /// No boundary at all: the user's own shell.
    None,
    /// Linux namespaces, Landlock, seccomp, cgroups/rlimits.
    Namespaces,
    /// A container.
    Container,
    /// A user-space kernel.
    UserSpaceKernel,
}

/// Runs a program with some inputs and collects what it printed.
#[async_trait]
pub trait Shell: Send + Sync {
    /// Starts the command and streams its output; the last event is always
    /// [`ExecEvent::Exit`].
    async fn exec_stream(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecStream>;

    /// Runs the command to the end and returns everything it printed (up to the
    /// output cap).
    async fn exec(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecOutput> {
        self.exec_stream(request, cancel).await?.collect().await
    }
}

/// A place where code runs: files plus processes, with one boundary around both.
#[async_trait]
pub trait ExecutionEnv: FileSystem + Shell {
    /// The backend name (`host`, `native`, …).
    fn backend(&self) -> &'static str;

    /// What isolates this env from the machine.
    fn boundary(&self) -> Boundary;
}

pub use exec::{StreamKind, pump_output};

/// Runs blocking file work off the async threads, giving up early when `cancel` fires.
pub async fn blocking<T, F>(cancel: &CancellationToken, what: &str, work: F) -> EnvResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> EnvResult<T> + Send + 'static,
{
    if cancel.is_cancelled() {
        return Err(EnvError::aborted(what));
    }
    let task = tokio::task::spawn_blocking(work);
    tokio::select! {
        joined = task => joined.map_err(|e| EnvError::new(ErrorCode::Unknown, format!("{what}: worker failed: {e}")))?,
        () = cancel.cancelled() => Err(EnvError::aborted(what)),
    }
}
