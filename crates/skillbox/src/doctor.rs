//! `skillbox doctor`: what each backend gives on this host, layer by layer.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use skillbox_env::BackendReport;
use skillbox_registry::BackendRegistry;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON: {"backends":[{"name","available","reason","boundary","layers":{…}}],
    /// "previews":{"png","detail"}}
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    backends: Vec<BackendReport>,
    previews: Previews,
}

/// How `skillbox serve` previews a deck's slides here: PNG, or text outlines and why.
#[derive(Debug, Serialize)]
struct Previews {
    png: bool,
    detail: String,
}

pub async fn run(args: DoctorArgs, data_dir: &Path) -> ExitCode {
    let registry = BackendRegistry::new(skillbox_run::registry_config(data_dir));
    let (png, detail) = skillbox_server::preview_report();
    let report = Report {
        backends: registry.probe_all().await,
        previews: Previews { png, detail },
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("skillbox: cannot render the report: {e}");
                return ExitCode::from(crate::EXIT_SETUP_FAILED);
            }
        }
        return ExitCode::SUCCESS;
    }
    for backend in &report.backends {
        let state = if backend.available {
            "available"
        } else {
            "unavailable"
        };
        println!("{:<8} {state:<12} {}", backend.name, backend.boundary);
        if let Some(reason) = &backend.reason {
            println!("         reason: {reason}");
        }
        for (name, layer) in &backend.layers {
            let mark = if layer.available { "ok " } else { "NO " };
            println!("         {mark} {name:<13} {}", layer.detail);
        }
    }
    let state = if report.previews.png {
        "png"
    } else {
        "outline"
    };
    println!("previews {state:<12} {}", report.previews.detail);
    ExitCode::SUCCESS
}
