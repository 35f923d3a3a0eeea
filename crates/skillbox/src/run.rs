//! `skillbox run FILE`: one script with the skill runtime; its files go to the artifact
//! store and, with `--out`, to a directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use skillbox_client::outdir::{Declared, ExportOptions, OutDir, download_to_dir};
use skillbox_client::{
    ClientError, ErrorCode, HttpSkillSandbox, Language, OutputSelection, RunRequest, SkillSandbox,
};
use skillbox_env::CancellationToken;
use skillbox_protocol::SandboxedKind;

use crate::terminal::{escaped, escaped_path};
use crate::units::{
    Bound, parse_duration, parse_root, parse_size, parse_size_bound, sandboxed_parser,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Node,
    Python,
    Sh,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The script to run.
    file: PathBuf,
    /// Its language [default: from the extension: .js node, .py python, .sh sh]
    #[arg(long, value_enum)]
    lang: Option<Lang>,
    /// Which boundary to run behind.
    #[arg(long, value_parser = sandboxed_parser(), default_value_t = SandboxedKind::Native)]
    backend: SandboxedKind,
    /// Where the workspace is in every sandbox [default: /workspace; not with --remote, whose server sets its own]: the code's working
    /// directory, the paths the model and MCP clients are told, collection and
    /// snapshots follow it (beneath /workspace, /home, /srv, /work or /mnt).
    #[arg(long, value_name = "PATH", value_parser = parse_root)]
    workspace_root: Option<skillbox_protocol::WorkspaceRoot>,

    /// Wall-clock limit (500ms, 30s, 2m).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    timeout: Duration,
    /// Copy the files the script made out to DIR: those --outputs declares into DIR
    /// itself, the rest into a new directory of their own beneath it (DIR/run-…), never
    /// merged into what is there (never through a symlink; existing files are kept
    /// unless --overwrite).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Replace files that already exist in --out DIR.
    #[arg(long, requires = "out")]
    overwrite: bool,
    /// Hand back only the files matching GLOB (repeatable; `*.pptx`, `out/**`), and
    /// with --out write them into DIR itself. Without it: every file with no hidden path
    /// component, into a directory of their own. A hidden file (`.env`) comes back only
    /// when a glob spells its dot.
    #[arg(long = "outputs", value_name = "GLOB")]
    outputs: Vec<String>,
    /// Disk for /workspace and /tmp together (512M, 2G), or none for no bound
    /// [default: 1G; a --remote server may refuse more than its own bound, and takes no
    /// none]
    #[arg(long, value_parser = parse_size_bound)]
    disk: Option<Bound>,
    /// Let the code reach HOST through skillbox's egress proxy (repeatable; host,
    /// host:port, *.domain, *.domain:port; no port means 80 and 443). Without it the
    /// run has no network at all. Loopback, private and metadata addresses are never
    /// reached, whatever a name resolves to. Native, docker and gvisor (not wasm).
    #[arg(long = "allow-net", value_name = "HOST")]
    allow_net: Vec<String>,
    /// Never let the code reach HOST, even when --allow-net covers it (repeatable; no
    /// port means every port).
    #[arg(long = "deny-net", value_name = "HOST", requires = "allow_net")]
    deny_net: Vec<String>,
    /// Let the code use the secret in this process's $NAME without being given it: the
    /// sandbox gets a placeholder in NAME, and the egress proxy puts the value in the
    /// headers of HTTPS requests to HOST only (repeatable; HOST as --allow-net's, no port
    /// meaning 443; each must also be allowed). A HOST that echoes request headers hands
    /// the value back to the code. Native, docker and gvisor.
    #[arg(
        long = "secret",
        value_name = "NAME=HOST[,HOST…]",
        requires = "allow_net"
    )]
    secrets: Vec<String>,
    /// Also trust the CA certificates in FILE (PEM; at most 100 and 1 MiB) when the
    /// egress proxy opens TLS to a --secret's host: for a private API whose certificate
    /// an internal CA signed. The public web roots stay trusted. Native, docker and
    /// gvisor; a --remote server takes its own (`skillbox serve --egress-ca`).
    #[arg(
        long = "egress-ca",
        value_name = "FILE",
        requires = "secrets",
        conflicts_with = "remote"
    )]
    egress_ca: Option<PathBuf>,
    /// Bytes through the egress proxy, both ways, over all connections (10M, 1G)
    #[arg(long, value_parser = parse_size, requires = "allow_net")]
    egress_bytes: Option<u64>,
    /// Place the skill NAME in /workspace first (repeatable): the workspace's
    /// skills/NAME, a staged .skills-cache/SOURCE/NAME, or the user's own.
    #[arg(long = "skill", value_name = "NAME")]
    skills: Vec<String>,
    /// Start from this scope's last snapshot of /workspace (what earlier runs with the
    /// same KEY installed or built) and save a new one after the run.
    #[arg(long = "scope", value_name = "KEY")]
    scope: Option<String>,
    /// The workspace whose skills --skill names [default: the current directory; with
    /// --remote, the server's --project]
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Print the RunResult JSON (the same object as POST /v1/run).
    #[arg(long)]
    json: bool,
    /// Run on a `skillbox serve` at URL instead of here.
    #[arg(long, value_name = "URL")]
    remote: Option<String>,
    /// The API key for --remote (from `skillbox keys new`); set SKILLBOX_API_KEY rather
    /// than the flag, which other users can read in the process list.
    #[arg(long, env = "SKILLBOX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

fn usage(message: &str) -> ExitCode {
    eprintln!("skillbox run: {message}");
    ExitCode::from(crate::EXIT_USAGE)
}

fn failed(error: &ClientError) -> ExitCode {
    eprintln!("skillbox run: {error}");
    ExitCode::from(crate::EXIT_SETUP_FAILED)
}

pub async fn run(args: RunArgs, data_dir: &Path) -> ExitCode {
    let script = match std::fs::read_to_string(&args.file) {
        Ok(script) => script,
        Err(e) => return usage(&format!("{}: {e}", args.file.display())),
    };
    let name = args
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let language = match args.lang {
        Some(Lang::Node) => Language::Node,
        Some(Lang::Python) => Language::Python,
        Some(Lang::Sh) => Language::Sh,
        None => match Language::from_extension(&name) {
            Some(language) => language,
            None => {
                return usage(&format!(
                    "{name}: cannot tell the language from the extension; pass --lang node|python|sh"
                ));
            }
        },
    };
    let outputs = match OutputSelection::new(&args.outputs) {
        Ok(outputs) => outputs,
        Err(e) => return usage(&format!("--outputs {e}")),
    };
    // Opened before the run: a missing directory fails fast, and what is written later
    // goes beneath this fd whatever happens to the path meanwhile.
    let mut out = match &args.out {
        Some(path) => {
            let options = ExportOptions {
                overwrite: args.overwrite,
                declared: Declared::Globs(outputs),
                own_dir_prefix: "run",
                ..ExportOptions::default()
            };
            match OutDir::open(path, options) {
                Ok(out) => Some(out),
                Err(e) => return usage(&e.message),
            }
        }
        None => None,
    };
    let mut request = RunRequest::new(language, script);
    request.timeout_ms = Some(args.timeout.as_millis() as u64);
    request.backend = Some(args.backend.kind());
    request.outputs = args.outputs.clone();
    request.skills = args.skills.clone();
    request.scope_key = args.scope.clone();
    if args.remote.is_some() && args.workspace_root.is_some() {
        return usage(
            "--workspace-root: a --remote server sets its own (skillbox serve --workspace-root); leave it out",
        );
    }
    if args.remote.is_some() && args.disk == Some(Bound(None)) {
        return usage(
            "--disk none: a --remote server bounds every run's disk itself (skillbox serve --disk); ask for a size or leave --disk out",
        );
    }
    let disk = args.disk.and_then(|Bound(disk)| disk);
    if disk.is_some() || args.egress_bytes.is_some() {
        request.limits = Some(skillbox_client::RunLimits {
            disk_bytes: disk,
            disk_inodes: None,
            egress_bytes: args.egress_bytes,
        });
    }
    if !args.allow_net.is_empty() {
        request.network = Some(skillbox_protocol::NetworkPolicy {
            allow: args.allow_net.clone(),
            deny: args.deny_net.clone(),
        });
    }
    for secret in &args.secrets {
        let Some((name, hosts)) = secret.split_once('=') else {
            return usage(&format!(
                "--secret {secret}: give NAME=HOST[,HOST…] (the value is read from $NAME)"
            ));
        };
        let Ok(value) = std::env::var(name) else {
            return usage(&format!(
                "--secret {name}: ${name} is not set in skillbox's environment (the value is read from it, never from the command line)"
            ));
        };
        request.secrets.insert(
            name.to_string(),
            skillbox_protocol::SecretSpec {
                value,
                hosts: hosts.split(',').map(str::to_string).collect(),
            },
        );
    }

    // Read once, before the run: a bad file is bad usage, named.
    let upstream_roots = match &args.egress_ca {
        Some(path) => match skillbox_egress::UpstreamRoots::read(path) {
            Ok(roots) => roots,
            Err(e) => return usage(&format!("--egress-ca {}: {e}", path.display())),
        },
        None => skillbox_egress::UpstreamRoots::default(),
    };

    let sandbox: Box<dyn SkillSandbox> = match &args.remote {
        Some(url) => match HttpSkillSandbox::new(url.clone()) {
            Ok(client) => match &args.api_key {
                Some(key) => Box::new(client.with_api_key(key.clone())),
                None => Box::new(client),
            },
            Err(e) => return usage(&e.message),
        },
        None => match crate::local::LocalSandbox::open(
            data_dir,
            // Container backends carry the runtime in their image.
            language == Language::Node && args.backend == SandboxedKind::Native,
            |config| {
                if let Some(Bound(disk)) = args.disk {
                    config.limits.disk_bytes = disk;
                }
                config.skills_workspace = match &args.workspace {
                    Some(dir) => Some(dir.clone()),
                    None => std::env::current_dir().ok(),
                };
                config.upstream_roots = upstream_roots;
                if let Some(root) = &args.workspace_root {
                    config.door.root = root.clone();
                }
            },
            CancellationToken::new(),
        )
        .await
        {
            Ok(local) => Box::new(local),
            Err(e) => return failed(&e),
        },
    };
    let result = match sandbox.run(request).await {
        Ok(result) => result,
        Err(e) => return failed(&e),
    };
    let report = match out.as_mut() {
        Some(out) => Some(download_to_dir(sandbox.as_ref(), &result.files, out).await),
        None => None,
    };
    if args.json {
        match serde_json::to_string(&result) {
            Ok(text) => println!("{text}"),
            Err(e) => return failed(&ClientError::new(ErrorCode::Unknown, e.to_string())),
        }
    } else {
        print!("{}", result.stdout);
        eprint!("{}", result.stderr);
        if result.timed_out {
            eprintln!("skillbox run: timed out");
        }
        if let Some(limit) = result.limit_hit {
            eprintln!(
                "skillbox run: limit hit: {}",
                serde_json::to_string(&limit)
                    .unwrap_or_default()
                    .trim_matches('"')
            );
        }
        for connection in &result.egress {
            let verdict = match connection.verdict {
                skillbox_protocol::EgressVerdict::Allowed => "allowed",
                skillbox_protocol::EgressVerdict::Refused => "refused",
            };
            eprintln!(
                "skillbox run: egress {verdict} {}:{} ({} bytes out, {} in){}",
                escaped(&connection.host),
                connection.port,
                connection.bytes_out,
                connection.bytes_in,
                connection
                    .reason
                    .as_deref()
                    .map(|r| format!(": {}", escaped(r)))
                    .unwrap_or_default()
            );
        }
        let written: std::collections::HashSet<&std::path::Path> = report
            .iter()
            .flat_map(|r| r.written.iter().map(std::path::PathBuf::as_path))
            .collect();
        for file in &result.files {
            let place = match (&out, &report) {
                (Some(out), Some(_)) => {
                    // Only what is there now: a file not written (it exists, the disk
                    // filled) or not selected is named below, with why.
                    let target = [Some(out.path()), out.own_dir()]
                        .into_iter()
                        .flatten()
                        .map(|dir| dir.join(&file.path))
                        .find(|target| written.contains(target.as_path()));
                    match target {
                        Some(target) => escaped_path(&target),
                        None => continue,
                    }
                }
                (Some(out), None) => escaped_path(&out.path().join(&file.path)),
                (None, _) => format!(
                    "{} (sha256 {}; --out DIR to copy it)",
                    escaped(&file.path),
                    escaped(file.sha256.get(..12).unwrap_or(&file.sha256))
                ),
            };
            eprintln!(
                "skillbox run: made {place}, {} bytes, {}",
                file.size,
                escaped(&file.content_type)
            );
        }
    }
    let status = result.shell_status().clamp(0, 255) as u8;
    let Some(report) = report else {
        return ExitCode::from(status);
    };
    if let Some(own) = out.as_ref().and_then(OutDir::own_dir) {
        eprintln!(
            "skillbox run: files --outputs did not declare went into {}, a new directory of their own (declare them with --outputs GLOB to write them into {} itself)",
            escaped_path(own),
            out.as_ref()
                .map_or_else(String::new, |o| escaped_path(o.path()))
        );
    }
    for path in &report.not_selected {
        eprintln!(
            "skillbox run: not copied: {} (hidden; ask for it with --outputs)",
            escaped(path)
        );
    }
    for error in &report.failed {
        // The message names the file.
        eprintln!("skillbox run: {}", escaped(&error.message));
    }
    // The script's own failure comes first; a file that could not be delivered is
    // skillbox's.
    if status == 0 && !report.failed.is_empty() {
        return ExitCode::from(crate::EXIT_SETUP_FAILED);
    }
    ExitCode::from(status)
}
