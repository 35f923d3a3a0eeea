//! `skillbox keys`: API keys for `skillbox serve`, in a key file (`--api-keys`) or in
//! the records database the servers share (`--db`).

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

/// The records database of `skillbox serve --db`.
#[derive(Debug, Args)]
struct Database {
    /// The records database the servers share: `postgres://USER:PASSWORD@HOST:PORT/DB`
    /// (`?sslmode=require&sslrootcert=CA.pem` for TLS, as with `serve --db`).
    #[arg(long, value_name = "URL", env = "SKILLBOX_DB", hide_env_values = true)]
    db: String,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Make a key for TENANT: the token is printed once, on stdout; the key file or the
    /// database gets only its hash.
    New {
        /// The tenant the key acts as (a-z, 0-9, '-', '_').
        tenant: String,
        /// Append the key's line to this file (made 0600 if missing); without it or
        /// --db the line is printed on stderr for you to add.
        #[arg(long, value_name = "FILE", conflicts_with = "db")]
        file: Option<PathBuf>,
        /// Keep the key in the records database the servers share (`serve --db`):
        /// every node answers it at once.
        #[arg(long, value_name = "URL", env = "SKILLBOX_DB", hide_env_values = true)]
        db: Option<String>,
    },
    /// List the keys of the database: id, tenant and when each was made (never a
    /// token, nor a whole hash).
    List {
        #[command(flatten)]
        database: Database,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove the key ID (as `keys list` shows it) from the database: every node
    /// refuses it from its next request on.
    Revoke {
        /// The key's id: the first 16 hex digits of its hash.
        id: String,
        #[command(flatten)]
        database: Database,
    },
}

pub fn run(args: KeysArgs) -> ExitCode {
    match args.command {
        KeysCommand::New {
            tenant,
            file: _,
            db: Some(db),
        } => on_database(&db, async |keys| {
            let (token, digest) =
                skillbox_server::ApiKeys::new_token(&tenant).map_err(|e| (crate::EXIT_USAGE, e))?;
            let id = keys
                .add(&tenant, &digest)
                .await
                .map_err(|e| (crate::EXIT_SETUP_FAILED, e.to_string()))?;
            eprintln!("skillbox keys: added key {id} of {tenant} to the database");
            println!("{token}");
            Ok(())
        }),
        KeysCommand::New {
            tenant,
            file,
            db: None,
        } => new_in_file(&tenant, file),
        KeysCommand::List { database, json } => on_database(&database.db, async |keys| {
            let listed = keys
                .list()
                .await
                .map_err(|e| (crate::EXIT_SETUP_FAILED, e.to_string()))?;
            for key in &listed {
                if json {
                    let line = serde_json::json!({
                        "id": key.id,
                        "tenant": key.tenant,
                        "createdMs": key.created_ms,
                    });
                    println!("{line}");
                } else {
                    println!(
                        "{}  {:<20}  {}",
                        key.id,
                        key.tenant,
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH
                                + std::time::Duration::from_millis(key.created_ms.max(0) as u64)
                        )
                    );
                }
            }
            if !json && listed.is_empty() {
                eprintln!(
                    "skillbox keys: the database holds no key; `skillbox keys new TENANT --db URL` makes one"
                );
            }
            Ok(())
        }),
        KeysCommand::Revoke { id, database } => on_database(&database.db, async |keys| {
            let revoked = keys.revoke(&id).await.map_err(|e| {
                let exit = if e.code() == skillbox_env::ErrorCode::Invalid {
                    crate::EXIT_USAGE
                } else {
                    crate::EXIT_SETUP_FAILED
                };
                (exit, e.to_string())
            })?;
            if !revoked {
                return Err((
                    crate::EXIT_USAGE,
                    format!("no key {id} in the database; `skillbox keys list` shows them"),
                ));
            }
            eprintln!("skillbox keys: revoked key {id}");
            Ok(())
        }),
    }
}

/// Runs `work` on the keys of the database `url` names; its error is an exit code and
/// a message.
fn on_database(
    url: &str,
    work: impl AsyncFnOnce(skillbox_store::KeyRecords) -> Result<(), (u8, String)>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("skillbox keys: cannot start the async runtime: {e}");
            return ExitCode::from(crate::EXIT_SETUP_FAILED);
        }
    };
    let done = runtime.block_on(async {
        let records = skillbox_store::RecordsDb::postgres(url)
            .await
            .map_err(|e| (crate::EXIT_SETUP_FAILED, e.to_string()))?;
        let keys = skillbox_store::KeyRecords::open(&records)
            .map_err(|e| (crate::EXIT_SETUP_FAILED, e.to_string()))?;
        work(keys).await
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err((exit, message)) => {
            eprintln!("skillbox keys: {message}");
            ExitCode::from(exit)
        }
    }
}

fn new_in_file(tenant: &str, file: Option<PathBuf>) -> ExitCode {
    let (token, line) = match skillbox_server::ApiKeys::new_key(tenant) {
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
