//! `wasm`: WASI guests under wasmtime. A command such as `python3` or `node` runs an
//! installed interpreter built for WASI (CPython, QuickJS); a `.wasm` or `.wat` path runs
//! that module. Each exec is one runner process inside a native sandbox, so a guest has
//! two boundaries around it: the WASI instance (the workspace is its only directory, it
//! has no sockets) and every native layer.

mod backend;
pub mod engine;
pub mod guests;
pub mod runner;

pub use backend::{WasmBackend, WasmConfig, WasmSandbox};

use sha2::{Digest, Sha256};

/// Where the guests, the compile cache and the runner copy live unless configured:
/// `$SKILLBOX_WASM_HOME`, else `<data>/wasm`.
pub fn default_home(data_dir: &std::path::Path) -> std::path::PathBuf {
    std::env::var_os("SKILLBOX_WASM_HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| data_dir.join("wasm"), std::path::PathBuf::from)
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A number no other call in this process returns, mixed with the time (temp names).
fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{n}-{t:08x}", std::process::id())
}
