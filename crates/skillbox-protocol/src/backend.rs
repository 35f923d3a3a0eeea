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
