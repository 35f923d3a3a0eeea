//! Which kind of sandbox, what isolates it, and what `skillbox doctor` found.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A kind of sandbox. Serialized lowercase (`"native"`, `"gvisor"`, …); parsed from the
/// same names on the command line.
#[non_exhaustive]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Linux namespaces + Landlock + seccomp + cgroups/rlimits; the default.
    #[default]
    Native,
    /// No boundary: the user's own shell.
    Host,
    /// A hardened container through the Docker Engine API (runc).
    Docker,
    /// The same container under gVisor's runsc: a user-space kernel in between.
    Gvisor,
    /// A WASI instance under wasmtime.
    Wasm,
}

impl BackendKind {
    /// Every kind, in the order `doctor` lists them.
    pub const ALL: [BackendKind; 5] = [
        BackendKind::Native,
        BackendKind::Host,
        BackendKind::Docker,
        BackendKind::Gvisor,
        BackendKind::Wasm,
    ];

    /// The name on the wire and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::Host => "host",
            BackendKind::Docker => "docker",
            BackendKind::Gvisor => "gvisor",
            BackendKind::Wasm => "wasm",
        }
    }

    /// What stands between this kind's code and the machine.
    pub fn boundary(self) -> Boundary {
        match self {
            BackendKind::Native => Boundary::Namespaces,
            BackendKind::Host => Boundary::None,
            BackendKind::Docker => Boundary::Container,
            BackendKind::Gvisor => Boundary::UserSpaceKernel,
            BackendKind::Wasm => Boundary::WasmInstance,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend name that is not one of [`BackendKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBackend(pub String);

impl fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = BackendKind::ALL.iter().map(|k| k.as_str()).collect();
        write!(
            f,
            "unknown backend {:?} (one of: {})",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownBackend {}

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        BackendKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .ok_or_else(|| UnknownBackend(name.to_string()))
    }
}

/// A kind of sandbox with a boundary: every [`BackendKind`] but `host`. Doors that run
/// code for a caller (runs, sessions, agent runs, MCP) take this, made once from the
/// caller's kind by [`TryFrom`], so `host` is refused in one place, with one message.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SandboxedKind {
    /// Namespaces, Landlock, seccomp and cgroups on this host (the default).
    #[default]
    Native,
    /// A container with no network (needs Docker and the runtime image).
    Docker,
    /// The same container under gVisor's user-space kernel.
    Gvisor,
    /// A WASI guest under wasmtime (python and node only).
    Wasm,
}

impl SandboxedKind {
    /// Every kind with a boundary, in [`BackendKind::ALL`]'s order.
    pub const ALL: [SandboxedKind; 4] = [
        SandboxedKind::Native,
        SandboxedKind::Docker,
        SandboxedKind::Gvisor,
        SandboxedKind::Wasm,
    ];

    /// The backend kind it is.
    pub fn kind(self) -> BackendKind {
        match self {
            SandboxedKind::Native => BackendKind::Native,
            SandboxedKind::Docker => BackendKind::Docker,
            SandboxedKind::Gvisor => BackendKind::Gvisor,
            SandboxedKind::Wasm => BackendKind::Wasm,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.kind().as_str()
    }
}

impl From<SandboxedKind> for BackendKind {
    fn from(kind: SandboxedKind) -> Self {
        kind.kind()
    }
}

impl TryFrom<BackendKind> for SandboxedKind {
    type Error = HostIsNoSandbox;

    fn try_from(kind: BackendKind) -> Result<Self, Self::Error> {
        SandboxedKind::ALL
            .into_iter()
            .find(|sandboxed| sandboxed.kind() == kind)
            .ok_or(HostIsNoSandbox)
    }
}

impl fmt::Display for SandboxedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `host` asked for where code needs a boundary. Its message, prefixed with the field or
/// flag by the caller, is the one every door gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIsNoSandbox;

impl fmt::Display for HostIsNoSandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = SandboxedKind::ALL.iter().map(|k| k.as_str()).collect();
        write!(
            f,
            "host runs code with no boundary; use {}",
            names.join(", ")
        )
    }
}

impl std::error::Error for HostIsNoSandbox {}

/// What stands between the code and the machine.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// A WebAssembly instance: only what is preopened, no sockets.
    WasmInstance,
}

impl Boundary {
    /// One line on what isolates the code, for `doctor` and logs.
    pub fn describe(self) -> &'static str {
        match self {
            Boundary::None => "none: runs as you, on your machine",
            Boundary::Namespaces => {
                "Linux namespaces + Landlock + seccomp + cgroups/rlimits, no network"
            }
            Boundary::Container => {
                "container: no network, read-only root, non-root, caps dropped, seccomp, cgroup limits"
            }
            Boundary::UserSpaceKernel => {
                "container under gVisor (runsc): a user-space kernel between the code and the host"
            }
            Boundary::WasmInstance => "WASI instance: only preopened directories, no sockets",
        }
    }
}

/// One layer of a backend and what this host gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Layer {
    pub available: bool,
    pub detail: String,
}

impl Layer {
    pub fn new(available: bool, detail: impl Into<String>) -> Self {
        Layer {
            available,
            detail: detail.into(),
        }
    }
}

/// What `doctor` found for one backend: whether it works here, why not, and each layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackendReport {
    pub name: BackendKind,
    pub available: bool,
    pub reason: Option<String>,
    /// What isolates it, in words.
    pub boundary: String,
    pub layers: BTreeMap<String, Layer>,
}

impl BackendReport {
    /// A report with no layers: available, or not and why.
    pub fn new(kind: BackendKind, reason: Option<String>) -> Self {
        BackendReport {
            name: kind,
            available: reason.is_none(),
            reason,
            boundary: kind.boundary().describe().to_string(),
            layers: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_but_host_is_a_sandbox_and_host_is_refused_with_one_message() {
        for kind in BackendKind::ALL {
            match SandboxedKind::try_from(kind) {
                Ok(sandboxed) => {
                    assert_eq!(sandboxed.kind(), kind);
                    assert_eq!(sandboxed.as_str(), kind.as_str());
                }
                Err(e) => {
                    assert_eq!(kind, BackendKind::Host);
                    assert_eq!(
                        e.to_string(),
                        "host runs code with no boundary; use native, docker, gvisor, wasm"
                    );
                }
            }
        }
        assert_eq!(SandboxedKind::default().kind(), BackendKind::default());
        let wire: SandboxedKind = serde_json::from_str("\"gvisor\"").unwrap();
        assert_eq!(wire, SandboxedKind::Gvisor);
        assert!(serde_json::from_str::<SandboxedKind>("\"host\"").is_err());
    }

    #[test]
    fn names_parse_and_serialize_the_same_way() {
        for kind in BackendKind::ALL {
            assert_eq!(kind.as_str().parse::<BackendKind>(), Ok(kind));
            assert_eq!(
                serde_json::to_string(&kind).expect("serializes"),
                format!("\"{kind}\"")
            );
        }
        let error = "kvm".parse::<BackendKind>().expect_err("not a kind");
        assert_eq!(
            error.to_string(),
            "unknown backend \"kvm\" (one of: native, host, docker, gvisor, wasm)"
        );
    }
}
