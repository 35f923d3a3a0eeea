//! The guest runner: the process that runs one WASI module under wasmtime, inside the
//! native sandbox. skillbox starts it as `skillbox __wasm-guest -- ARGV…`, with the spec
//! first on its stdin ([`framed_stdin`]): which module, which directories to preopen, the
//! guest's environment, the memory bound and the deadline. The rest of stdin is the
//! guest's. The spec is never an argument: any user of the host can read a process's
//! command line, and the guest's environment holds what the caller gave it (a token).
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

/// This program's path and an open file of the executable it was started from (which
/// stays this build even when the path is replaced by an upgrade).
static RUNNER: std::sync::OnceLock<(PathBuf, std::fs::File)> = std::sync::OnceLock::new();

/// Says that this program answers [`SUBCOMMAND`] with [`main`] (the skillbox binary
/// calls it first thing), so wasm sandboxes made in this process start it.
pub fn this_program_runs_guests() {
    if let (Ok(exe), Ok(file)) = (
        std::env::current_exe(),
        std::fs::File::open("/proc/self/exe"),
    ) {
        let _ = RUNNER.set((exe, file));
    }
}

/// The program that runs guests, if this process has one.
pub fn guest_runner() -> Option<PathBuf> {
    RUNNER.get().map(|(path, _)| path.clone())
}

/// The executable this process started from, when `path` is this program.
pub(crate) fn held_executable(path: &Path) -> Option<&'static std::fs::File> {
    RUNNER
        .get()
        .filter(|(exe, _)| exe == path)
        .map(|(_, file)| file)
}

/// The runner ends itself by this signal when the guest ran past its deadline.
pub const DEADLINE_SIGNAL: i32 = libc::SIGALRM;
/// ... and by this one when the memory bound refused the guest and it then failed.
pub const MEMORY_SIGNAL: i32 = libc::SIGUSR2;

/// Where the sandbox shows the compile cache; compiled guests load only from here.
pub const SANDBOX_CACHE: &str = "/skillbox-wasm/cache";

/// What to run, from the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerSpec {
    pub module: ModuleSource,
    pub dirs: Vec<Preopen>,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// The bound on the guest's linear memories and tables together.
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

/// Refuses growth past the bound, and remembers that it did. The bound covers every
/// linear memory and table of the store together (a table entry counted as 16 bytes).
struct Limiter {
    memory_bytes: Option<u64>,
    used: u64,
    refused: Arc<AtomicBool>,
}

/// What one table entry is counted as.
const TABLE_ENTRY_BYTES: u64 = 16;

impl Limiter {
    fn grow(&mut self, more: u64) -> bool {
        let total = self.used.saturating_add(more);
        if self.memory_bytes.is_some_and(|bound| total > bound) {
            self.refused.store(true, Ordering::SeqCst);
            return false;
        }
        self.used = total;
        true
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        Ok(self.grow(desired.saturating_sub(current) as u64))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        Ok(self.grow((desired.saturating_sub(current) as u64).saturating_mul(TABLE_ENTRY_BYTES)))
    }

    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        4
    }

    fn tables(&self) -> usize {
        4
    }
}

/// The most bytes a spec may take on stdin.
const MAX_SPEC_BYTES: usize = 64 * 1024 * 1024;

/// What the runner reads on stdin: the length of `spec` as JSON in decimal and a
/// newline, the JSON, then `input` (the guest's stdin). The runner reads exactly the
/// spec, so the guest's stdin starts where it ends.
pub fn framed_stdin(spec: &RunnerSpec, input: Option<&[u8]>) -> Result<Vec<u8>, String> {
    let json = serde_json::to_vec(spec).map_err(|e| e.to_string())?;
    if json.len() > MAX_SPEC_BYTES {
        return Err(format!(
            "{} bytes, at most {MAX_SPEC_BYTES} (the environment is too large)",
            json.len()
        ));
    }
    let input = input.unwrap_or_default();
    let mut framed = Vec::with_capacity(24 + json.len() + input.len());
    framed.extend_from_slice(format!("{}\n", json.len()).as_bytes());
    framed.extend_from_slice(&json);
    framed.extend_from_slice(input);
    Ok(framed)
}

/// Reads the spec [`framed_stdin`] put on `from`, not a byte past it (`from` is read
/// unbuffered: what follows is the guest's).
fn read_spec(from: &mut impl std::io::Read) -> Result<RunnerSpec, String> {
    let mut length = Vec::new();
    loop {
        let mut byte = [0u8; 1];
        from.read_exact(&mut byte)
            .map_err(|e| format!("spec on stdin: its length: {e}"))?;
        if byte[0] == b'\n' {
            break;
        }
        if !byte[0].is_ascii_digit() || length.len() >= 20 {
            return Err("spec on stdin: its length is not a decimal number and a newline".into());
        }
        length.push(byte[0]);
    }
    let length: usize = std::str::from_utf8(&length)
        .ok()
        .and_then(|l| l.parse().ok())
        .filter(|&l| l <= MAX_SPEC_BYTES)
        .ok_or_else(|| format!("spec on stdin: a length of 0 to {MAX_SPEC_BYTES} bytes"))?;
    let mut json = vec![0u8; length];
    from.read_exact(&mut json)
        .map_err(|e| format!("spec on stdin: {length} bytes: {e}"))?;
    serde_json::from_slice(&json).map_err(|e| format!("spec: {e}"))
}

/// This process's stdin, read without a buffer (the guest inherits what is left).
struct RawStdin;

impl std::io::Read for RawStdin {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: reads into a buffer of exactly `buf.len()` bytes that `buf` owns.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
    }
}

/// `skillbox __wasm-guest -- ARGV…`, the spec on stdin: runs the guest and returns the
/// exit code, or ends the process by [`DEADLINE_SIGNAL`] or [`MEMORY_SIGNAL`].
pub fn main(args: &[String]) -> i32 {
    let (spec, argv) = match parse(args, &mut RawStdin) {
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

fn parse(
    args: &[String],
    stdin: &mut impl std::io::Read,
) -> Result<(RunnerSpec, Vec<String>), String> {
    let usage = || "usage: skillbox __wasm-guest -- ARGV… (the spec on stdin)".to_string();
    let [dashes, argv @ ..] = args else {
        return Err(usage());
    };
    if dashes != "--" || argv.is_empty() {
        return Err(usage());
    }
    Ok((read_spec(stdin)?, argv.to_vec()))
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
                used: 0,
                refused: refused.clone(),
            },
        },
    );
    store.limiter(|state| &mut state.limits);
    store.set_epoch_deadline(spec.timeout_ms.div_ceil(EPOCH_TICK_MS).max(1));
    store.epoch_deadline_trap();
    let ticker = engine.clone();
    let started = std::thread::Builder::new()
        .name("epoch".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(EPOCH_TICK_MS));
                ticker.increment_epoch();
            }
        });
    if let Err(e) = started {
        // Without the ticker there is no deadline: never run without it.
        eprintln!("skillbox wasm: cannot start the deadline's ticker thread: {e}");
        return Outcome::Exit(EXIT_CANNOT_RUN);
    }

    let mut linker: Linker<State> = Linker::new(&engine);
    if let Err(e) = link(&mut linker) {
        eprintln!("skillbox wasm: WASI: {e:#}");
        return Outcome::Exit(EXIT_CANNOT_RUN);
    }
    let start = match linker
        .instantiate(&mut store, &module)
        .and_then(|instance| instance.get_typed_func::<(), ()>(&mut store, "_start"))
    {
        Ok(start) => start,
        Err(e) => {
            eprintln!(
                "skillbox wasm: not a WASI command (a module with a `_start` that imports only wasi_snapshot_preview1): {e:#}"
            );
            return Outcome::Exit(EXIT_CANNOT_RUN);
        }
    };
    let result = start.call(&mut store, ());
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

/// WASI preview 1, with `proc_exit` taking every status (wasmtime's own refuses 126 and
/// above as a trap; a guest's `exit(200)` is its exit status 200).
fn link(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    wasmtime_wasi::p1::add_to_linker_sync(linker, |state| &mut state.wasi)?;
    linker.allow_shadowing(true);
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "proc_exit",
        |status: i32| -> wasmtime::Result<()> { Err(I32Exit(status & 0xff).into()) },
    )?;
    Ok(())
}

fn load(engine: &wasmtime::Engine, source: &ModuleSource) -> Result<Module, (i32, String)> {
    match source {
        ModuleSource::Compiled(path) => {
            // Only skillbox's own cache, as the sandbox shows it: this subcommand must
            // never load machine code from anywhere else.
            if !path.starts_with(SANDBOX_CACHE)
                || path
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err((
                    EXIT_CANNOT_RUN,
                    format!(
                        "{}: compiled guests load only from {SANDBOX_CACHE}",
                        path.display()
                    ),
                ));
            }
            // SAFETY: the file is skillbox's own compile of a guest pinned by SHA-256, in
            // a cache that is read-only here and that no sandbox can write.
            unsafe { Module::deserialize_file(engine, path) }.map_err(|e| {
                (
                    EXIT_CANNOT_RUN,
                    format!(
                        "{}: cannot load the compiled guest: {e:#}; run `skillbox setup` to compile the guests again",
                        path.display()
                    ),
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
                (code, format!("{}: {e:#}", path.display()))
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
    // The guest's environment is the spec's alone: this process's own (which the
    // native sandbox set) is never handed on.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RunnerSpec {
        RunnerSpec {
            module: ModuleSource::Source(PathBuf::from("/workspace/a.wasm")),
            dirs: vec![],
            env: vec![("MYTOKEN".into(), "t0k3n\nwith a newline".into())],
            memory_bytes: Some(1 << 20),
            timeout_ms: 1000,
        }
    }

    #[test]
    fn the_spec_comes_on_stdin_and_the_rest_is_the_guest_s() {
        let framed = framed_stdin(&spec(), Some(b"guest input\n")).unwrap();
        let mut stdin = &framed[..];
        let args = ["--".to_string(), "a.wasm".to_string()];
        let (read, argv) = parse(&args, &mut stdin).unwrap();
        assert_eq!(read.env, spec().env);
        assert_eq!(argv, ["a.wasm"]);
        assert_eq!(stdin, b"guest input\n", "not a byte of the guest's read");

        let framed = framed_stdin(&spec(), None).unwrap();
        let mut stdin = &framed[..];
        parse(&args, &mut stdin).unwrap();
        assert!(stdin.is_empty());

        for (bad, said) in [
            (&b""[..], "its length"),
            (b"12x\n{}", "not a decimal number"),
            (b"99999999999\n{}", "a length of 0 to"),
            (b"10\n{}", "10 bytes"),
            (b"2\n{}", "spec: missing field"),
        ] {
            let err = parse(&args, &mut &bad[..]).unwrap_err();
            assert!(
                err.contains(said),
                "{:?}: {err}",
                String::from_utf8_lossy(bad)
            );
        }
        let err = parse(
            &["{}".to_string(), "--".to_string(), "a".to_string()],
            &mut &b""[..],
        )
        .unwrap_err();
        assert!(err.contains("the spec on stdin"), "{err}");
    }
}
