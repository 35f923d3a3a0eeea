//! The one wasmtime configuration skillbox compiles and runs with, and the cache of
//! compiled guest modules.
//!
//! Guest interpreters are compiled on the host, by skillbox itself, once per module and
//! wasmtime build, into `<cache>/<module sha256>-<engine hash>.cwasm` (written to a temp
//! name, then renamed). The cache is shown read-only inside the sandbox, so code in a
//! sandbox can never plant compiled code that a later sandbox would load. Modules the
//! caller brings (a `.wasm` in the workspace) are compiled inside the sandbox, per run.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use skillbox_env::{EnvError, EnvResult, ErrorCode};
use wasmtime::{Config, Engine, OptLevel};

/// How often the epoch ticks; a deadline is a number of ticks.
pub const EPOCH_TICK_MS: u64 = 10;

/// The engine config. Compiling and loading must agree on it, so both sides call this.
pub fn engine() -> EnvResult<Engine> {
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        // Set, not read from WASMTIME_BACKTRACE_DETAILS: the host's environment must not
        // change what is compiled (the cache key) or loaded.
        .wasm_backtrace_details(wasmtime::WasmBacktraceDetails::Disable)
        .cranelift_opt_level(OptLevel::Speed)
        .parallel_compilation(true)
        // Linear memories start small and grow on demand, with a reservation the store
        // limiter keeps them inside; 4 GiB of address space is only reserved, not used.
        .memory_init_cow(true);
    Engine::new(&config).map_err(|e| {
        EnvError::new(
            ErrorCode::Unavailable,
            format!("wasm: wasmtime engine: {e}"),
        )
    })
}

/// The part of a cache file name that changes with the wasmtime build and config.
pub fn engine_key(engine: &Engine) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Where the compiled form of the module with `sha256` lives.
pub fn cached_path(cache: &Path, sha256: &str, engine: &Engine) -> PathBuf {
    cache.join(format!("{sha256}-{}.cwasm", engine_key(engine)))
}

/// Compiles `module` into the cache unless it is there; returns the cache file. Blocking
/// (a large interpreter takes seconds).
pub fn ensure_compiled(
    engine: &Engine,
    cache: &Path,
    module: &Path,
    sha256: &str,
) -> EnvResult<PathBuf> {
    let target = cached_path(cache, sha256, engine);
    if target.is_file() {
        return Ok(target);
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(cache)
            .and_then(|()| skillbox_env::readable_by_sandboxes(cache))
            .map_err(|e| EnvError::io(&e, "create", cache))?;
    }
    // One compile at a time across processes (parallel tests, a server and a CLI run):
    // the others wait and then find it done. The lock sits beside the cache, out of
    // what sandboxes see.
    let _lock = CompileLock::take(cache.parent().unwrap_or(cache))?;
    remove_stale_temps(cache);
    if target.is_file() {
        return Ok(target);
    }
    let bytes = std::fs::read(module).map_err(|e| EnvError::io(&e, "read", module))?;
    let actual = crate::sha256_hex(&bytes);
    if actual != sha256 {
        return Err(EnvError::unavailable(format!(
            "wasm: {} has SHA-256 {actual}, not the {sha256} its guests.json pins; run `skillbox setup` to reinstall the guests",
            module.display()
        ))
        .with_path(module));
    }
    tracing::info!(module = %module.display(), "wasm: compiling a guest for this host (once)");
    let started = std::time::Instant::now();
    let compiled = engine.precompile_module(&bytes).map_err(|e| {
        EnvError::unavailable(format!("wasm: compiling {}: {e:#}", module.display()))
            .with_path(module)
    })?;
    let temp = cache.join(format!(
        ".{sha256}.{}.{}.tmp",
        std::process::id(),
        crate::nonce()
    ));
    let written = (|| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Readable by the sandbox user whatever the umask; on disk before it is named.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)?;
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        file.write_all(&compiled)?;
        file.sync_all()?;
        std::fs::rename(&temp, &target)?;
        std::fs::File::open(cache)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(EnvError::io(&e, "write the compiled guest", &target));
    }
    tracing::info!(
        module = %module.display(),
        ms = started.elapsed().as_millis() as u64,
        "wasm: compiled"
    );
    Ok(target)
}

/// Removes the temp files of compiles in `cache`. Only under the compile lock: every
/// writer holds it while its temp file exists, so one there now is a process's that
/// was killed mid-write (tens of MiB for an interpreter), which nothing else removes.
fn remove_stale_temps(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// An exclusive `flock` on `<cache>/.compile.lock`, released when dropped.
struct CompileLock(std::fs::File);

impl CompileLock {
    fn take(cache: &Path) -> EnvResult<CompileLock> {
        use std::os::fd::AsRawFd;
        let path = cache.join(".compile.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| EnvError::io(&e, "open", &path))?;
        // SAFETY: flock on an fd this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(EnvError::io(
                &std::io::Error::last_os_error(),
                "lock",
                &path,
            ));
        }
        Ok(CompileLock(file))
    }
}

impl Drop for CompileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as above; closing the file would release it too.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compile_removes_what_a_killed_compile_left() {
        let home = tempfile::tempdir().unwrap();
        let (cache, module) = (home.path().join("cache"), home.path().join("m.wat"));
        std::fs::create_dir(&cache).unwrap();
        std::fs::write(&module, "(module)").unwrap();
        let sha = crate::sha256_hex(b"(module)");
        // A temp file as a compile killed between its write and its rename leaves it.
        let left = cache.join(format!(".{sha}.4242.4242-0-00000000.tmp"));
        std::fs::write(&left, vec![0u8; 4096]).unwrap();
        let engine = engine().unwrap();
        let compiled = ensure_compiled(&engine, &cache, &module, &sha).unwrap();
        assert!(compiled.is_file());
        assert!(
            !left.exists(),
            "the killed compile's temp file is still there"
        );
    }
}
