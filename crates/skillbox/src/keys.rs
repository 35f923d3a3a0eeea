//! `skillbox keys new TENANT`: a new API key for `skillbox serve --api-keys`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Make a key for TENANT: the token is printed once, on stdout; the key file gets
    /// only its hash.
    New {
        /// The tenant the key acts as (a-z, 0-9, '-', '_').
        tenant: String,
        /// Append the key's line to this file (made 0600 if missing); without it the
        /// line is printed on stderr for you to add.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

pub fn run(args: KeysArgs) -> ExitCode {
    let KeysCommand::New { tenant, file } = args.command;
    let (token, line) = match skillbox_server::ApiKeys::new_key(&tenant) {
        Ok(key) => key,
        Err(e) => {
            eprintln!("skillbox keys: {e}");
            return ExitCode::from(crate::EXIT_USAGE);
        }
    };
    match &file {
        Some(path) => {
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .and_then(|mut f| writeln!(f, "{line}"));
            if let Err(e) = appended {
                eprintln!("skillbox keys: {}: {e}", path.display());
                return ExitCode::from(crate::EXIT_SETUP_FAILED);
            }
            eprintln!(
                "skillbox keys: added a key of {tenant} to {}",
                path.display()
            );
        }
        None => eprintln!("skillbox keys: add this line to the key file:\n{line}"),
    }
    println!("{token}");
    ExitCode::SUCCESS
}
