//! `skillbox doctor`: what each backend gives on this host, layer by layer.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use skillbox_docker::Runtime;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON: {"backends":[{"name","available","reason","layers":{…}}]}
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Backend {
    name: &'static str,
    available: bool,
    reason: Option<String>,
    boundary: &'static str,
    layers: BTreeMap<&'static str, skillbox_native::Layer>,
}

#[derive(Debug, Serialize)]
struct Report {
    backends: Vec<Backend>,
}

fn not_built(name: &'static str, boundary: &'static str) -> Backend {
    Backend {
        name,
        available: false,
        reason: Some(format!("the {name} backend is not part of this build yet")),
        boundary,
        layers: BTreeMap::new(),
    }
}

fn container(
    name: &'static str,
    boundary: &'static str,
    report: skillbox_docker::DockerReport,
) -> Backend {
    Backend {
        name,
        available: report.available,
        reason: report.reason,
        boundary,
        layers: report.layers,
    }
}

async fn report(data_dir: &Path) -> Report {
    let native = skillbox_native::probe();
    let image = skillbox_docker::image_tag(&skillbox_run::NodeRuntime::new(data_dir).id());
    let (docker, gvisor) = tokio::join!(
        skillbox_docker::probe(Runtime::Runc, &image),
        skillbox_docker::probe(Runtime::Runsc, &image)
    );
    Report {
        backends: vec![
            Backend {
                name: "native",
                available: native.available,
                reason: native.reason,
                boundary: "Linux namespaces + Landlock + seccomp + cgroups/rlimits, no network",
                layers: native.layers,
            },
            Backend {
                name: "host",
                available: true,
                reason: None,
                boundary: "none: runs as you, on your machine",
                layers: BTreeMap::new(),
            },
            container(
                "docker",
                "container: no network, read-only root, non-root, caps dropped, seccomp, cgroup limits",
                docker,
            ),
            container(
                "gvisor",
                "container under gVisor (runsc): a user-space kernel between the code and the host",
                gvisor,
            ),
            not_built("wasm", "WASI instance"),
        ],
    }
}

pub async fn run(args: DoctorArgs, data_dir: &Path) -> ExitCode {
    let report = report(data_dir).await;
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
    ExitCode::SUCCESS
}
