//! `ExecutionEnv` is the only door between a skillbox tool and the machine: a
//! [`FileSystem`] plus a [`Shell`]. Swap the env and the same tool runs on the host, in a
//! namespace sandbox, in a container or in a VM.
//!
//! Every operation returns [`EnvResult`] and takes a [`CancellationToken`]; cancelling
//! kills the work where it runs, not just the waiter.

mod backend;
mod data_dir;
mod error;
mod exec;
mod exit;
mod fs;
mod host;
mod limits;
pub mod owner;
pub mod path;
pub mod remove;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use backend::Backend;
pub use data_dir::{
    PRIVATE_UMASK, default_data_dir, own_data_dir, readable_by_sandboxes, with_sandbox_umask,
};
pub use error::{EnvError, EnvResult, ErrorCode, errno_code};
pub use exec::{
    Command, Duplex, Endpoint, ExecConnector, ExecEvent, ExecRequest, ExecStream, WalkAfter,
};
pub use exit::{Ended, Ending};
pub use fs::{
    DirEntry, FileInfo, FileKind, FileRead, FileSystem, MAX_LIST_ENTRIES, MAX_TREE_BYTES,
    MAX_TREE_DEPTH, MAX_TREE_ENTRIES, TextLines, Tree, TreeEntry, TreeKind, WalkEntry, first_lines,
    json_string_len, listing_json_len, read_at_most, regular_file, symlink_not_read,
    too_large_to_read, too_many_entries, too_many_to_list,
};
pub use host::{HostBackend, HostEnv};
pub use limits::{
    BYTES_PER_INODE, DiskSplit, Limits, MAX_TIMEOUT, MIN_DISK_BYTES, MIN_DISK_INODES, Mount,
    SandboxPolicy, SandboxSpec, Volume,
};
pub use skillbox_protocol::{
    BackendKind, BackendReport, Boundary, DEFAULT_WORKSPACE_ROOT, ExecOutput, Layer, LimitKind,
    Truncated, WorkspacePath, WorkspaceRoot,
};
pub use tokio_util::sync::CancellationToken;

use async_trait::async_trait;

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

    /// Gets the next exec ready ahead of its command where the backend can (the native
    /// one starts its init, with every layer in place); nothing where it cannot. A
    /// hint for a sandbox that will exec again (a session): an exec never needs it, and
    /// `cleanup` undoes it.
    async fn prepare_next(&self) {}
}

/// A place where code runs: files plus processes, with one boundary around both.
#[async_trait]
pub trait ExecutionEnv: FileSystem + Shell {
    /// Which kind of sandbox this is.
    fn kind(&self) -> BackendKind;

    /// What isolates this env from the machine.
    fn boundary(&self) -> Boundary {
        self.kind().boundary()
    }

    /// The connections this env's egress proxy let through or refused so far (empty
    /// without a network policy).
    fn egress(&self) -> Vec<skillbox_protocol::EgressConnection> {
        Vec::new()
    }

    /// Writes `files` (each as [`FileSystem::write`] does; their directories must
    /// exist), then runs `request` as [`Shell::exec`] does. A failed write runs nothing.
    /// A backend for which each operation is a round trip (the container ones) does
    /// both in one; there each file is made new with mode 0644 (a replaced file's mode
    /// is not kept), which is what a run's script needs.
    async fn write_and_exec(
        &self,
        files: Vec<(std::path::PathBuf, Vec<u8>)>,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecOutput> {
        for (path, data) in &files {
            self.write(path, data, cancel).await?;
        }
        self.exec(request, cancel).await
    }
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
