//! [`Backend`]: what makes sandboxes of one [`BackendKind`]. A registry holds one per
//! kind and is the only place a kind is turned into a sandbox.

use std::fmt;

use async_trait::async_trait;

use crate::{BackendKind, BackendReport, Boundary, EnvResult, ExecutionEnv, SandboxSpec};

/// Makes sandboxes of one kind. Object-safe: a registry keeps them as `dyn Backend`.
/// New methods get default bodies, so every backend keeps compiling.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    fn kind(&self) -> BackendKind;

    /// What isolates this backend's sandboxes.
    fn boundary(&self) -> Boundary {
        self.kind().boundary()
    }

    /// Whether it works on this host, and each layer, for `skillbox doctor`. Never
    /// fails: what is missing is the report's `reason`.
    async fn probe(&self) -> BackendReport;

    /// A new sandbox for `spec`. When a layer the spec asks for cannot be set up, this
    /// is `unavailable` naming the layer; it never makes a weaker sandbox instead.
    async fn create(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>>;

    /// A sandbox for a single exec in a short-lived process (`skillbox exec`), which a
    /// backend may make more cheaply; the same isolation as [`Backend::create`].
    async fn create_one_shot(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>> {
        self.create(spec).await
    }

    /// Removes every sandbox this backend made that is still there (a server shutting
    /// down with runs in flight).
    async fn shutdown(&self) {}
}
