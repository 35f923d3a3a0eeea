//! A sandbox's egress as each backend sets it up: the proxy for its policy, the
//! environment its execs get beyond the proxy's own variables (secrets' placeholders,
//! where the CA is), and the CA's certificate when it adds secrets. Where the backend
//! shows the CA's files to the sandbox is its own choice; what they hold is
//! [`ca_files`].

use std::collections::BTreeMap;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;

use crate::{Interceptor, NetworkPolicy, Proxy, Resolve, SecretSpec, Secrets};

/// A sandbox's egress.
#[derive(Debug)]
pub struct SandboxEgress {
    pub proxy: Proxy,
    /// Beyond [`crate::netns::proxy_env`]: each secret's placeholder, and the CA's
    /// paths for the usual clients, when it adds secrets.
    pub env: Vec<(String, String)>,
    /// The per-sandbox CA (public certificate only) the sandbox must trust, when it adds
    /// secrets.
    pub ca_pem: Option<String>,
}

/// Why a sandbox's egress cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The policy is wrong (the message names the field).
    #[error("{0}")]
    Invalid(String),
    /// Something the policy needs cannot be had here.
    #[error("egress secrets: {0}")]
    Unavailable(String),
}

/// Where a Linux system keeps its bundle of public roots (Debian and its kin, then
/// Fedora and its kin, then others), in the order looked at.
pub const ROOT_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The CA files, by name, that [`sandbox_egress`]'s environment points at in `ca_dir`:
/// `ca.pem` (the sandbox's CA) and `ca-bundle.pem` (this host's public roots, then
/// it); an error naming where it looked when this host has no bundle of roots (a
/// bundle of the sandbox's CA alone would make every other TLS host fail to verify).
pub fn ca_files(ca_pem: &str) -> Result<[(&'static str, String); 2], String> {
    let system = ROOT_BUNDLES
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok().filter(|b| b.contains("BEGIN CERTIFICATE")))
        .ok_or_else(|| {
            format!(
                "egress secrets: no bundle of public roots on this host (looked at {}); install the ca-certificates package",
                ROOT_BUNDLES.join(", ")
            )
        })?;
    Ok([
        ("ca.pem", ca_pem.to_string()),
        ("ca-bundle.pem", format!("{system}\n{ca_pem}")),
    ])
}

/// The egress of a sandbox with `network` and `secrets`, its CA's files shown at
/// `ca_dir`; `None` when the policy allows nothing (no network at all).
/// `upstream_roots`: roots the proxy trusts, beyond the public web's, when it opens TLS
/// to a host it adds a secret for (a private CA).
pub fn sandbox_egress(
    network: Option<&NetworkPolicy>,
    egress_bytes: Option<u64>,
    secrets: &BTreeMap<String, SecretSpec>,
    resolver: Arc<dyn Resolve>,
    upstream_roots: &[CertificateDer<'static>],
    ca_dir: &str,
) -> Result<Option<SandboxEgress>, SetupError> {
    let wants_network = network.is_some_and(|n| !n.allow.is_empty());
    if !secrets.is_empty() && !wants_network {
        return Err(SetupError::Invalid(
            "secrets: they go out through the egress proxy; give network.allow with their hosts"
                .into(),
        ));
    }
    let (mut env, mut ca_pem, mut adding) = (Vec::new(), None, None);
    if !secrets.is_empty() {
        let checked = Secrets::new(secrets)
            .map_err(SetupError::Invalid)?
            .with_placeholders(skillbox_protocol::random::fill)
            .map_err(SetupError::Unavailable)?;
        let interceptor = Interceptor::new(upstream_roots).map_err(SetupError::Unavailable)?;
        env = checked.env();
        for name in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "PIP_CERT",
            "GIT_SSL_CAINFO",
        ] {
            env.push((name.to_string(), format!("{ca_dir}/ca-bundle.pem")));
        }
        env.push((
            "NODE_EXTRA_CA_CERTS".to_string(),
            format!("{ca_dir}/ca.pem"),
        ));
        ca_pem = Some(interceptor.ca_pem().to_string());
        adding = Some((checked, interceptor));
    }
    let proxy = crate::proxy_for(network, egress_bytes, resolver, adding)
        .map_err(|e| SetupError::Invalid(e.to_string()))?;
    Ok(proxy.map(|proxy| SandboxEgress { proxy, env, ca_pem }))
}
