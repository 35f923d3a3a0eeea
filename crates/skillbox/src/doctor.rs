//! `skillbox doctor`: what each backend gives on this host, layer by layer; with
//! `--model openai`, what the configured model server does with the loop's requests.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use skillbox_env::BackendReport;
use skillbox_registry::BackendRegistry;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON: {"backends":[{"name","available","reason","boundary","layers":{…}}],
    /// "previews":{"png","detail"}}; with --model openai, the model's report
    #[arg(long)]
    json: bool,
    /// Check the model instead of the backends: with openai, send the server at
    /// SKILLBOX_MODEL_URL a few tiny requests (the loop's shape with tools, a stream)
    /// and say what it takes; exit 1 when agent runs could not use it.
    #[arg(long, value_enum, value_name = "MODEL")]
    model: Option<crate::agent::Model>,
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
    match args.model {
        Some(crate::agent::Model::Openai) => return model(args.json).await,
        Some(crate::agent::Model::Loopback) => {
            println!(
                "model    loopback     a scripted model replays a recorded session: no server to check"
            );
            return ExitCode::SUCCESS;
        }
        None => {}
    }
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

/// `--model openai`: the server's report; exit 0 when agent runs can use it, 1 when
/// not, 2 when the variables are missing or wrong.
async fn model(json: bool) -> ExitCode {
    let provider = match skillbox_agent::openai::OpenAiConfig::from_env().and_then(|config| {
        // A doctor answers fast: one try per check, the configured timeout.
        skillbox_agent::openai::OpenAiProvider::new(skillbox_agent::openai::OpenAiConfig {
            max_retries: 0,
            ..config
        })
    }) {
        Ok(provider) => provider,
        Err(e) => {
            eprintln!("skillbox doctor: --model openai: {e}");
            return ExitCode::from(crate::EXIT_USAGE);
        }
    };
    let report =
        skillbox_agent::model_check::check(&provider, &skillbox_env::CancellationToken::new())
            .await;
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("skillbox: cannot render the report: {e}");
                return ExitCode::from(crate::EXIT_SETUP_FAILED);
            }
        }
    } else {
        println!("model    {}  {}", report.model, report.endpoint);
        for (name, probe) in [
            ("listed", &report.listed),
            ("chat", &report.chat),
            ("tools", &report.tools),
            ("tool_choice", &report.tool_choice),
            ("streaming", &report.streaming),
        ] {
            let mark = if probe.ok { "ok " } else { "NO " };
            println!("         {mark} {name:<12} {}", probe.detail);
        }
        if report.usable {
            println!("usable   yes: agent runs can use this server");
        } else {
            println!("usable   no: agent runs would fail on the first request (see chat)");
        }
    }
    if report.usable {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
