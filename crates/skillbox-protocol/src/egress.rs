//! Egress on an allowlist: a run's `network` policy and what its proxy recorded.

use serde::{Deserialize, Serialize};

/// `network` on a run: `allow` and `deny` entries of the form `host`, `host:port`,
/// `*.domain` or `*.domain:port`. An `allow` host without a port means ports 80 and
/// 443, a `deny` host without one every port. Deny wins; no `allow` entry means no
/// network at all (as no policy does). Whatever a name resolves to, loopback, private,
/// link-local (cloud metadata) and other non-public addresses are never connected to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// Whether a connection went through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub enum EgressVerdict {
    Allowed,
    Refused,
}

/// One connection a run's code asked the proxy for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressConnection {
    pub host: String,
    pub port: u16,
    pub verdict: EgressVerdict,
    /// Why it was refused, or cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The address connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Bytes from the sandbox to the server, and back.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// A secret a run's code may use without being given it: the sandbox gets a
/// placeholder in the environment variable of its name, and skillbox's proxy puts
/// `value` in its place in the headers of HTTPS requests bound for `hosts` (and nowhere
/// else). skillbox puts the value in no sandbox, log, record or artifact; a bound host
/// that echoes request headers, or writes the value in an answer, hands it to the
/// sandbox (design.md §3.8).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    pub value: String,
    /// Host patterns as `network.allow`'s (`api.example.com`, `*.example.com:8443`; no
    /// port means 443). Each must also be allowed by the run's network policy.
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSpec")
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts)
            .finish()
    }
}
