//! `skillbox run FILE`: one script with the skill runtime; its files go to the artifact
//! store and, with `--out`, to a directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use skillbox_client::{
    BackendKind, ClientError, ErrorCode, HttpSkillSandbox, Language, RunRequest, RunResult,
    SkillSandbox,
};
use skillbox_env::CancellationToken;

use crate::units::{backend_parser, parse_duration};

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
    #[arg(long, value_parser = backend_parser(), default_value = "native")]
    backend: BackendKind,
    /// Wall-clock limit (500ms, 30s, 2m).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    timeout: Duration,
    /// Copy the files the script made into DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print the RunResult JSON (the same object as POST /v1/run).
    #[arg(long)]
    json: bool,
    /// Run on a `skillbox serve` at URL instead of here.
    #[arg(long, value_name = "URL")]
    remote: Option<String>,
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
    if let Some(out) = &args.out
        && !out.is_dir()
    {
        return usage(&format!("--out {}: no such directory", out.display()));
    }
    let mut request = RunRequest::new(language, script);
    request.timeout_ms = Some(args.timeout.as_millis() as u64);
    request.backend = Some(args.backend);

    let sandbox: Box<dyn SkillSandbox> = match &args.remote {
        Some(url) => match HttpSkillSandbox::new(url.clone()) {
            Ok(client) => Box::new(client),
            Err(e) => return usage(&e.message),
        },
        None => match crate::local::LocalSandbox::open(
            data_dir,
            // Container backends carry the runtime in their image.
            language == Language::Node && args.backend == BackendKind::Native,
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
    if let Some(out) = &args.out
        && let Err(e) = copy_out(sandbox.as_ref(), &result, out).await
    {
        return failed(&e);
    }
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
        for file in &result.files {
            let place = match &args.out {
                Some(out) => out.join(&file.path).display().to_string(),
                None => format!(
                    "{} (sha256 {}; --out DIR to copy it)",
                    file.path,
                    &file.sha256[..12]
                ),
            };
            eprintln!(
                "skillbox run: made {place}, {} bytes, {}",
                file.size, file.content_type
            );
        }
    }
    ExitCode::from(result.shell_status().clamp(0, 255) as u8)
}

/// Writes each artifact under `out`, never outside it (paths come from the sandbox).
async fn copy_out(
    sandbox: &dyn SkillSandbox,
    result: &RunResult,
    out: &Path,
) -> Result<(), ClientError> {
    for file in &result.files {
        let relative = Path::new(&file.path);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(ClientError::new(
                ErrorCode::Invalid,
                format!("artifact path {:?} is not a plain relative path", file.path),
            ));
        }
        let bytes = sandbox.download(&file.sha256).await?;
        let target = out.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                ClientError::new(ErrorCode::Unknown, format!("{}: {e}", parent.display()))
            })?;
        }
        std::fs::write(&target, &bytes).map_err(|e| {
            ClientError::new(ErrorCode::Unknown, format!("{}: {e}", target.display()))
        })?;
    }
    Ok(())
}
