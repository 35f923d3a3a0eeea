//! `skillbox mcp`: the MCP server on stdio (DESIGN.md §4), over a runner on the data dir
//! as `skillbox run` uses. stdout carries only the protocol; logs go to stderr.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use skillbox_mcp::{McpConfig, McpServer};
use skillbox_protocol::SandboxedKind;

use crate::units::{parse_root, sandboxed_parser};

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The sandbox of a session's exec, read_file, write_file and list_dir when its first
    /// call names none (run_script names its own, default native).
    #[arg(long, value_parser = sandboxed_parser(), default_value_t = SandboxedKind::Native)]
    backend: SandboxedKind,
    /// The workspace whose skills run_script's `skills` name [default: the current
    /// directory]
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Where the workspace is in every sandbox [default: /workspace]: the code's working
    /// directory, the paths the model and MCP clients are told, collection and
    /// snapshots follow it (beneath /workspace, /home, /srv, /work or /mnt).
    #[arg(long, value_name = "PATH", value_parser = parse_root)]
    workspace_root: Option<skillbox_protocol::WorkspaceRoot>,
}

pub async fn run(args: McpArgs, data_dir: &Path) -> ExitCode {
    let mut config = skillbox_run::RunnerConfig::new(data_dir);
    if let Some(root) = &args.workspace_root {
        config.door.root = root.clone();
    }
    config.skills_workspace = match args.workspace {
        Some(dir) => Some(dir),
        None => std::env::current_dir().ok(),
    };
    // The Node runtime installs on the first Node run (progress in the logs), so the
    // client's handshake is answered at once.
    let runner = match crate::local::runner_with(config, false).await {
        Ok(runner) => Arc::new(runner),
        Err(e) => {
            eprintln!("skillbox mcp: {e}");
            return ExitCode::from(crate::EXIT_SETUP_FAILED);
        }
    };
    let server = McpServer::local(
        runner.clone(),
        McpConfig {
            default_backend: args.backend,
            ..McpConfig::default()
        },
    );
    // A signal ends the session as the client closing stdin does: the sandbox is
    // removed before the process exits.
    let stopper = server.clone();
    let signalled = Arc::new(AtomicBool::new(false));
    let saw = signalled.clone();
    tokio::spawn(async move {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        saw.store(true, Ordering::SeqCst);
        stopper.stop();
    });
    let served = server.serve_stdio().await;
    runner.shutdown().await;
    let code = match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("skillbox mcp: {e}");
            crate::EXIT_SETUP_FAILED
        }
    };
    if signalled.load(Ordering::SeqCst) {
        // Everything is removed by now. A read of stdin that is not a pipe (a socket, a
        // terminal) runs on a blocking thread that nothing can cancel, and the runtime
        // would wait for it at exit until the client closes stdin: exit here instead.
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::process::exit(i32::from(code));
    }
    ExitCode::from(code)
}
