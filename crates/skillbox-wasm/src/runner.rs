//! The guest runner: the process that runs one WASI module under wasmtime, inside the
//! native sandbox. skillbox starts it as `skillbox __wasm-guest SPEC -- ARGV…`; SPEC (JSON)
//! says which module, which directories to preopen, the memory bound and the deadline.
//!
//! The guest sees only the preopened directories and its stdio: no sockets (WASI
//! preview 1 has none to open), no other files, no processes. When it ends, the runner
//! exits with the guest's exit code, or, when the deadline passed or the memory bound
//! refused the guest, ends itself by [`DEADLINE_SIGNAL`] or [`MEMORY_SIGNAL`]. Nothing in
//! the sandbox but the runner can send it a signal (a WASI guest has no way to), so the
//! host can trust what they say.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmtime::{Linker, Module, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::engine::{EPOCH_TICK_MS, engine};

/// The runner's exit code when the module could not be loaded (the shell's "cannot run").
pub const EXIT_CANNOT_RUN: i32 = 126;
/// When the module does not exist.
pub const EXIT_NOT_FOUND: i32 = 127;
/// When the guest trapped (as an aborted process would).
pub const EXIT_TRAP: i32 = 134;

/// The subcommand that runs a guest.
pub const SUBCOMMAND: &str = "__wasm-guest";

static RUNNER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Says that this program answers [`SUBCOMMAND`] with [`main`] (the skillbox binary
/// calls it first thing), so wasm sandboxes made in this process start it.
pub fn this_program_runs_guests() {
    if let Ok(exe) = std::env::current_exe() {
        let _ = RUNNER.set(exe);
    }
}

/// The program that runs guests, if this process has one.
pub fn guest_runner() -> Option<PathBuf> {
    RUNNER.get().cloned()
}

/// The runner ends itself by this signal when the guest ran past its deadline.
pub const DEADLINE_SIGNAL: i32 = libc::SIGALRM;
/// ... and by this one when the memory bound refused the guest and it then failed.
pub const MEMORY_SIGNAL: i32 = libc::SIGUSR2;

/// What to run, from the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerSpec {
    pub module: ModuleSource,
    pub dirs: Vec<Preopen>,
    /// Added to the environment the runner was started with.
    pub env: Vec<(String, String)>,
    /// The bound on the guest's linear memories together.
    pub memory_bytes: Option<u64>,
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ModuleSource {
    /// A guest interpreter compiled by skillbox on the host (the read-only cache).
    Compiled(PathBuf),
    /// A `.wasm` or `.wat` file the caller brought, compiled here.
    Source(PathBuf),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Preopen {
    /// The directory as this process sees it.
    pub dir: PathBuf,
    /// Its name inside the guest.
    pub guest: String,
    pub writable: bool,
}

/// How the guest ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Exit(i32),
    Deadline,
    MemoryRefused,
}

struct State {
    wasi: WasiP1Ctx,
    limits: Limiter,
}

/// Refuses growth past the bound, and remembers that it did.
struct Limiter {
    memory_bytes: Option<u64>,
    refused: Arc<AtomicBool>,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let over_bound = self
            .memory_bytes
            .is_some_and(|bound| desired as u64 > bound);
        let over_max = maximum.is_some_and(|max| desired > max);
        if over_bound {
            self.refused.store(true, Ordering::SeqCst);
        }
        Ok(!over_bound && !over_max)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Ten million entries is far beyond any interpreter's table.
        Ok(desired <= 10_000_000 && maximum.is_none_or(|max| desired <= max))
    }
}

/// `skillbox __wasm-guest SPEC -- ARGV…`: runs the guest and returns the exit code,
/// or ends the process by [`DEADLINE_SIGNAL`] or [`MEMORY_SIGNAL`].
pub fn main(args: &[String]) -> i32 {
    let (spec, argv) = match parse(args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("skillbox wasm: {message}");
            return EXIT_CANNOT_RUN;
        }
    };
    let signal = match run(&spec, &argv) {
        Outcome::Exit(code) => return code,
        Outcome::Deadline => DEADLINE_SIGNAL,
        Outcome::MemoryRefused => MEMORY_SIGNAL,
    };
    // SAFETY: plain libc calls; the default action of both signals ends the process.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::kill(libc::getpid(), signal);
    }
    std::thread::sleep(Duration::from_secs(1));
    EXIT_TRAP
}

fn parse(args: &[String]) -> Result<(RunnerSpec, Vec<String>), String> {
    let [spec, dashes, argv @ ..] = args else {
        return Err("usage: skillbox __wasm-guest SPEC -- ARGV…".into());
    };
    if dashes != "--" || argv.is_empty() {
        return Err("usage: skillbox __wasm-guest SPEC -- ARGV…".into());
    }
    let spec: RunnerSpec = serde_json::from_str(spec).map_err(|e| format!("spec: {e}"))?;
    Ok((spec, argv.to_vec()))
}

fn run(spec: &RunnerSpec, argv: &[String]) -> Outcome {
    let engine = match engine() {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("skillbox wasm: {e}");
            return Outcome::Exit(EXIT_CANNOT_RUN);
        }
    };
    let module = match load(&engine, &spec.module) {
        Ok(module) => module,
        Err((code, message)) => {
            eprintln!("skillbox wasm: {message}");
            return Outcome::Exit(code);
        }
    };
    let wasi = match wasi_ctx(spec, argv) {
        Ok(wasi) => wasi,
        Err(message) => {
            eprintln!("skillbox wasm: {message}");
            return Outcome::Exit(EXIT_CANNOT_RUN);
        }
    };
    let refused = Arc::new(AtomicBool::new(false));
    let mut store = Store::new(
        &engine,
        State {
            wasi,
            limits: Limiter {
                memory_bytes: spec.memory_bytes,
                refused: refused.clone(),
            },
        },
    );
    store.limiter(|state| &mut state.limits);
    store.set_epoch_deadline(spec.timeout_ms.div_ceil(EPOCH_TICK_MS).max(1));
    store.epoch_deadline_trap();
    let ticker = engine.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(EPOCH_TICK_MS));
            ticker.increment_epoch();
        }
    });

    let mut linker: Linker<State> = Linker::new(&engine);
    if let Err(e) = wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state| &mut state.wasi) {
        eprintln!("skillbox wasm: WASI: {e}");
        return Outcome::Exit(EXIT_CANNOT_RUN);
    }
    let result = linker
        .instantiate(&mut store, &module)
        .and_then(|instance| instance.get_typed_func::<(), ()>(&mut store, "_start"))
        .and_then(|start| start.call(&mut store, ()));
    let code = match result {
        Ok(()) => 0,
        Err(error) => {
            if let Some(exit) = error.downcast_ref::<I32Exit>() {
                exit.0
            } else if error.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                eprintln!(
                    "skillbox wasm: the guest ran past its deadline ({} ms) and was stopped",
                    spec.timeout_ms
                );
                return Outcome::Deadline;
            } else {
                eprintln!("skillbox wasm: the guest trapped: {error:#}");
                EXIT_TRAP
            }
        }
    };
    if code != 0 && refused.load(Ordering::SeqCst) {
        eprintln!(
            "skillbox wasm: the guest asked for more than its {} bytes of memory",
            spec.memory_bytes.unwrap_or_default()
        );
        return Outcome::MemoryRefused;
    }
    Outcome::Exit(code)
}

fn load(engine: &wasmtime::Engine, source: &ModuleSource) -> Result<Module, (i32, String)> {
    match source {
        ModuleSource::Compiled(path) => {
            // SAFETY: the file is skillbox's own compile of a guest pinned by SHA-256, in
            // a cache that is read-only here and that no sandbox can write.
            unsafe { Module::deserialize_file(engine, path) }.map_err(|e| {
                (
                    EXIT_CANNOT_RUN,
                    format!("{}: cannot load the compiled guest: {e}", path.display()),
                )
            })
        }
        ModuleSource::Source(path) => {
            let bytes = std::fs::read(path).map_err(|e| {
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    EXIT_NOT_FOUND
                } else {
                    EXIT_CANNOT_RUN
                };
                (code, format!("{}: {e}", path.display()))
            })?;
            Module::new(engine, &bytes).map_err(|e| {
                (
                    EXIT_CANNOT_RUN,
                    format!("{}: not a WebAssembly module: {e:#}", path.display()),
                )
            })
        }
    }
}

fn wasi_ctx(spec: &RunnerSpec, argv: &[String]) -> Result<WasiP1Ctx, String> {
    let mut builder = WasiCtxBuilder::new();
    builder.inherit_stdio().args(argv);
    for (key, value) in std::env::vars() {
        builder.env(&key, &value);
    }
    for (key, value) in &spec.env {
        builder.env(key, value);
    }
    for preopen in &spec.dirs {
        let perms = if preopen.writable {
            FsPerms::ReadWrite
        } else {
            FsPerms::ReadOnly
        };
        builder
            .preopened_dir(&preopen.dir, &preopen.guest, perms)
            .map_err(|e| format!("preopen {}: {e}", display(&preopen.dir)))?;
    }
    Ok(builder.build_p1())
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
