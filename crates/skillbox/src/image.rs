//! `skillbox image build`: the runtime image of the docker and gvisor backends, built
//! locally (no registry) and imported into the Docker daemon.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use skillbox_docker::{BuildInputs, ImageBuilder};
use skillbox_run::NodeRuntime;

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build the runtime image (Debian root via debootstrap, the host's node, the pinned
    /// Node packages) and import it; skipped when the daemon already has this build.
    Build(BuildArgs),
}

#[derive(Debug, Args)]
struct BuildArgs {
    /// Rebuild even if the daemon has an image with this tag.
    #[arg(long)]
    force: bool,
    /// The node executable to put in the image [default: `node` on PATH]
    #[arg(long, value_name = "FILE")]
    node: Option<PathBuf>,
}

/// `node` on PATH, resolved to the real file.
fn node_on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("node"))
        .find(|candidate| candidate.is_file())
        .and_then(|found| std::fs::canonicalize(found).ok())
}

pub async fn run(args: ImageArgs, data_dir: &Path) -> ExitCode {
    let ImageCommand::Build(args) = args.command;
    let Some(node_binary) = args.node.or_else(node_on_path) else {
        eprintln!(
            "skillbox image build: no `node` on PATH; install Node.js 20 or pass --node FILE"
        );
        return ExitCode::from(crate::EXIT_USAGE);
    };
    let progress = |line: &str| eprintln!("skillbox image: {line}");
    let runtime = NodeRuntime::new(data_dir);
    let builder = ImageBuilder::new(data_dir);
    if !args.force && builder.is_current(&runtime.id()).await {
        let tag = skillbox_docker::image_tag(&runtime.id());
        progress(&format!("image {tag} is up to date"));
        println!("{tag}");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = runtime.ensure(&progress).await {
        eprintln!("skillbox image build: {e}");
        return ExitCode::from(crate::EXIT_SETUP_FAILED);
    }
    let inputs = BuildInputs {
        node_binary,
        node_modules: runtime.node_modules(),
        runtime_id: runtime.id(),
    };
    match builder.build(&inputs, args.force, &progress).await {
        Ok(tag) => {
            println!("{tag}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("skillbox image build: {e}");
            ExitCode::from(crate::EXIT_SETUP_FAILED)
        }
    }
}
