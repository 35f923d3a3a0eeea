//! Egress on an allowlist (DESIGN.md §8, issue 17): a sandbox never gets a network
//! interface; what it may reach goes through skillbox's proxy on the host side.
//!
//! - [`Rules`]: a run's `network: {allow, deny}` checked once (each bad entry named),
//!   matched per host and port; deny wins; no rules, no network.
//! - [`forbidden`]: the addresses the proxy never connects to, whatever name resolved
//!   to them (loopback, private, link-local and cloud metadata, CGNAT, multicast, …),
//!   judged on the resolved address at connect time, so DNS rebinding does not help;
//!   and [`own_address`]: any address of the host's own interfaces (a public one too),
//!   where a service bound to 0.0.0.0 on the host would answer.
//! - [`Proxy`]: HTTP `CONNECT host:port` and absolute-form `http://` requests, checked
//!   against the rules, resolved once, every address checked, one of them connected,
//!   bytes counted against a bound, each connection recorded in an [`Audit`].
//! - [`UpstreamRoots`]: a private CA's certificates the proxy also trusts when it opens
//!   TLS to a host it adds secrets for (`--egress-ca`), checked once.

mod addr;
pub mod netns;
mod proxy;
mod roots;
mod rules;
mod secrets;
mod setup;
#[cfg(feature = "testkit")]
pub mod testkit;
mod wire;

pub use addr::{forbidden, own_address};
pub use proxy::{
    Audit, Connection, Proxy, ProxyLimits, Resolve, StaticResolver, SystemResolver, Verdict,
};
pub use roots::{MAX_UPSTREAM_ROOTS, MAX_UPSTREAM_ROOTS_BYTES, UpstreamRoots};
pub use rules::{NetworkPolicy, Rule, RuleError, Rules};
pub use secrets::{Interceptor, MAX_SECRETS, Secrets, Substitutions};
pub use setup::{ROOT_BUNDLES, SandboxEgress, SetupError, ca_files, sandbox_egress};
pub use skillbox_protocol::SecretSpec;

/// A sandbox's proxy for `network` (checked: a bad entry is the error), adding
/// `secrets` at egress when given, or `None` when it allows nothing (no network at all,
/// as no policy).
pub fn proxy_for(
    network: Option<&NetworkPolicy>,
    egress_bytes: Option<u64>,
    resolver: std::sync::Arc<dyn Resolve>,
    secrets: Option<(Substitutions, Interceptor)>,
) -> Result<Option<Proxy>, RuleError> {
    let Some(network) = network else {
        return Ok(None);
    };
    let rules = Rules::new(network)?;
    if rules.is_empty() {
        return Ok(None);
    }
    let limits = ProxyLimits {
        egress_bytes,
        ..ProxyLimits::default()
    };
    Ok(Some(Proxy::with_secrets(rules, resolver, limits, secrets)))
}
