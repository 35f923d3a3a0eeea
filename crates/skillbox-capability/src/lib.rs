//! Capabilities: code declared up front by a manifest (`capabilities/<name>/manifest.yaml`)
//! that says where it runs (an environment: one of the backend kinds), for how long (a
//! lifecycle), what it may touch (permissions, volumes, limits, the hosts its `network`
//! allows through skillbox's egress proxy) and how it is reached.
//!
//! - [`Manifest`]: parsed once, unknown fields refused, validated; errors name the file,
//!   line and field. [`schema`] is its JSON Schema, generated from the types.
//! - [`CapabilityRegistry`]: every capability under some roots; a bad one is reported
//!   alone and the others still load.
//! - [`TrustStore`]: grants (`once`, `session`, `project`) under each environment's
//!   ceiling (`host` never above `session`), denies that win over them, and the check a
//!   run must pass first.

mod manifest;
mod registry;
mod router;
mod services;
mod trust;

pub use manifest::{
    Bounds, Environment, Lifecycle, Manifest, ManifestError, ManifestLimits, ManifestNetwork,
    NETWORK_ALLOW, NETWORK_DENY, Permission, Volume, schema,
};
pub use registry::{Capability, CapabilityRegistry, MANIFEST};
pub use router::{CAPABILITY_DIR, CapabilityCall, CapabilityOutcome, outputs, run};
pub use services::{
    CAP_START, DEFAULT_READY_TIMEOUT, Listen, MAX_CONNECTIONS, Owner, SERVE, ServiceBounds,
    ServiceTable, describe_failure, services_dir,
};
pub use trust::{Grant, Scope, Standing, TrustError, TrustStore, ceiling};
