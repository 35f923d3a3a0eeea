//! The two engines records are kept on, for tests that run the same case on each:
//! SQLite files in a temp dir, and a real Postgres server of the test's own.
//!
//! ```ignore
//! async fn a_case(engine: Engine) { … engine.records … }
//! on_both_engines!(a_case);
//! ```

#![allow(dead_code, reason = "each test binary that includes it uses a part")]

use skillbox_env::testkit::postgres::PostgresServer;
use skillbox_store::RecordsDb;

/// Where one case keeps its records, and a way to reach them behind skillbox's back.
pub struct Engine {
    pub records: RecordsDb,
    raw: Raw,
}

enum Raw {
    Sqlite(tempfile::TempDir),
    Postgres(PostgresServer),
}

impl Engine {
    pub fn sqlite() -> Engine {
        let dir = tempfile::tempdir().expect("tempdir");
        Engine {
            records: RecordsDb::sqlite(dir.path()),
            raw: Raw::Sqlite(dir),
        }
    }

    /// `None` (the test skipped) when no Postgres is installed.
    pub async fn postgres(test: &str) -> Option<Engine> {
        let server = PostgresServer::start(test)?;
        let records = RecordsDb::postgres(&server.url())
            .await
            .unwrap_or_else(|e| panic!("connect to the test's Postgres: {e}"));
        Some(Engine {
            records,
            raw: Raw::Postgres(server),
        })
    }

    /// Runs `sql` on the database itself, as an operator (or time) would: in SQLite's
    /// `file` of the data dir, or in the one Postgres database.
    pub fn exec(&self, file: &str, sql: &str) {
        match &self.raw {
            Raw::Sqlite(dir) => {
                rusqlite::Connection::open(dir.path().join(file))
                    .and_then(|db| db.execute_batch(sql))
                    .unwrap_or_else(|e| panic!("{file}: {sql}: {e}"));
            }
            Raw::Postgres(server) => {
                server.psql(sql);
            }
        }
    }

    /// The same records, opened again (a restart, or another node on the database).
    pub async fn reopen(&self) -> RecordsDb {
        self.reopen_result().await.expect("reopen the records")
    }

    /// [`Engine::reopen`], its error kept (Postgres migrates when it connects).
    pub async fn reopen_result(&self) -> Result<RecordsDb, skillbox_store::StoreError> {
        match &self.raw {
            Raw::Sqlite(dir) => Ok(RecordsDb::sqlite(dir.path())),
            Raw::Postgres(server) => RecordsDb::postgres(&server.url()).await,
        }
    }
}

/// One `#[tokio::test]` per case and engine: `sqlite::CASE` and `postgres::CASE`.
macro_rules! on_both_engines {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case($crate::engines::Engine::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $case() {
                    let test = concat!("postgres::", stringify!($case));
                    if let Some(engine) = $crate::engines::Engine::postgres(test).await {
                        super::$case(engine).await;
                    }
                }
            )*
        }
    };
}
