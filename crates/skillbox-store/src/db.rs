//! The records' database: SQLite files in the data dir (the default, one process), or
//! one Postgres database that several `skillbox serve` nodes share (`serve --db
//! postgres://…`).
//!
//! Every statement is written once, with SQLite's `?N` parameters, and translated to
//! Postgres' `$N`; the few that only one engine understands are written twice, side
//! by side, where they are used ([`Db::pick`]). Each engine has its own list of
//! versioned migrations per component, applied when the component opens (SQLite) or
//! when the database is connected (Postgres), and recorded in `skillbox_schema`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::ValueRef;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::error::StoreError;
use crate::pg_tls;

/// One parameter of a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Int(i64),
    Text(String),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}

/// `params![a, b]`: a statement's parameters, each converted to a [`Value`].
macro_rules! params {
    ($($value:expr),* $(,)?) => { vec![$($crate::db::Value::from($value)),*] };
}
pub(crate) use params;

/// One cell of a row read back.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cell {
    Int(i64),
    Text(String),
    Null,
}

/// One row read back, its cells in the statement's column order.
#[derive(Debug, Clone)]
pub(crate) struct Row(Vec<Cell>);

impl Row {
    pub(crate) fn int(&self, index: usize) -> Result<i64, StoreError> {
        match self.0.get(index) {
            Some(Cell::Int(v)) => Ok(*v),
            other => Err(decode_error(index, "an integer", other)),
        }
    }

    pub(crate) fn text(&self, index: usize) -> Result<String, StoreError> {
        match self.0.get(index) {
            Some(Cell::Text(v)) => Ok(v.clone()),
            other => Err(decode_error(index, "text", other)),
        }
    }
}

fn decode_error(index: usize, wanted: &str, got: Option<&Cell>) -> StoreError {
    StoreError::Records {
        op: "read a row".into(),
        detail: format!("column {index}: expected {wanted}, found {got:?}"),
    }
}

/// One statement of a [`Db::transaction`].
#[derive(Debug)]
pub(crate) struct Statement<'a> {
    pub sql: &'a str,
    pub params: Vec<Value>,
}

/// What a statement did: the rows it returned (a query, or `RETURNING`), or how many
/// it changed.
#[derive(Debug, Default)]
pub(crate) struct Done {
    pub rows: Vec<Row>,
    pub changed: u64,
}

/// One step of a migration.
#[derive(Debug)]
pub(crate) enum Step {
    Sql(&'static str),
    /// SQLite only: `ALTER TABLE … ADD COLUMN` unless the column is there (a file made
    /// before versioned migrations may have it or not).
    AddColumn {
        table: &'static str,
        column: &'static str,
        decl: &'static str,
    },
}

/// The schema of one component at one version, as the steps from the version before.
#[derive(Debug)]
pub(crate) struct Migration {
    pub version: i64,
    pub steps: &'static [Step],
}

/// A component's migrations, one list per engine.
#[derive(Debug)]
pub(crate) struct Schema {
    /// The name its version is recorded under.
    pub component: &'static str,
    pub sqlite: &'static [Migration],
    pub postgres: &'static [Migration],
}

/// Which engine a [`Db`] speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// A connection to the records' database: one SQLite file, or a pool of connections
/// to a Postgres database. Cheap to clone.
#[derive(Clone)]
pub struct Db {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres {
        pool: deadpool_postgres::Pool,
        /// Where it is, without the password: for messages.
        name: Arc<str>,
    },
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Sqlite(_) => f.write_str("Db::Sqlite"),
            Inner::Postgres { name, .. } => write!(f, "Db::Postgres({name})"),
        }
    }
}

/// How long a request waits for a free connection, or for a new one to be made.
const POOL_WAIT: Duration = Duration::from_secs(10);
/// Connections to Postgres one node keeps at most.
const POOL_SIZE: usize = 16;
/// Every migration of every component runs holding this advisory lock, so nodes that
/// start together apply each once ("skillbox" in ASCII).
const MIGRATION_LOCK: i64 = 0x736b_696c_6c62_6f78;
const SCHEMA_TABLE: &str = "CREATE TABLE IF NOT EXISTS skillbox_schema (
    component TEXT PRIMARY KEY,
    version BIGINT NOT NULL
)";

impl Db {
    /// Opens (creating) the SQLite file at `path`, with `pragmas` run first, and brings
    /// `schema` up to date.
    pub(crate) fn sqlite(path: &Path, pragmas: &str, schema: &Schema) -> Result<Db, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::Io {
                op: "create the records dir",
                path: parent.display().to_string(),
                source,
            })?;
        }
        let mut conn = rusqlite::Connection::open(path)
            .map_err(sqlite_error(&format!("open {}", path.display())))?;
        conn.execute_batch(pragmas)
            .map_err(sqlite_error("set up the database"))?;
        migrate_sqlite(&mut conn, schema).map_err(|e| match e {
            StoreError::Records { op, detail } => StoreError::Records {
                op: format!("{op} ({})", path.display()),
                detail,
            },
            other => other,
        })?;
        Ok(Db {
            inner: Inner::Sqlite(Arc::new(Mutex::new(conn))),
        })
    }

    /// Connects to the Postgres database `url` names and brings every one of `schemas`
    /// up to date. `sslmode=require` (or `verify-ca`, `verify-full`) connects over TLS,
    /// the server's certificate and name verified against the public web roots and the
    /// CA file of `sslrootcert=PATH`; `disable` and the default `prefer` connect in
    /// plain text ([`crate::pg_tls`]).
    pub(crate) async fn postgres(url: &str, schemas: &[&Schema]) -> Result<Db, StoreError> {
        let invalid = |reason: String| StoreError::InvalidDbUrl {
            url: redact(url),
            reason,
        };
        let (rest, options) = pg_tls::take_options(url);
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e: tokio_postgres::Error| invalid(error_chain(&e)))?;
        if config.get_ssl_mode() != tokio_postgres::config::SslMode::Require {
            if let Some(path) = &options.root_cert {
                return Err(invalid(format!(
                    "sslrootcert={} names a CA for TLS, and TLS is only used with \
                     sslmode=require: add it",
                    path.display()
                )));
            }
            // `prefer` as well: never TLS that nobody verifies.
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        }
        let extra_roots = match &options.root_cert {
            Some(path) => pg_tls::read_root_cert(path)
                .map_err(|e| invalid(format!("sslrootcert={}: {e}", path.display())))?,
            None => Vec::new(),
        };
        let tls = pg_tls::MakeRustls::new(extra_roots).map_err(invalid)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(POOL_WAIT);
        }
        let name: Arc<str> = describe(&config).into();
        let manager = deadpool_postgres::Manager::from_config(
            config,
            tls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(POOL_WAIT))
            .build()
            .map_err(|e| StoreError::InvalidDbUrl {
                url: name.to_string(),
                reason: e.to_string(),
            })?;
        let db = Db {
            inner: Inner::Postgres {
                pool,
                name: name.clone(),
            },
        };
        for schema in schemas {
            db.migrate_postgres(schema).await.map_err(|e| match e {
                StoreError::RecordsUnavailable { detail, .. } => StoreError::DbUnreachable {
                    url: name.to_string(),
                    detail,
                },
                other => other,
            })?;
        }
        Ok(db)
    }

    pub fn engine(&self) -> Engine {
        match self.inner {
            Inner::Sqlite(_) => Engine::Sqlite,
            Inner::Postgres { .. } => Engine::Postgres,
        }
    }

    /// `sqlite` or `postgres`, for this engine.
    pub(crate) fn pick<'a>(&self, sqlite: &'a str, postgres: &'a str) -> &'a str {
        match self.engine() {
            Engine::Sqlite => sqlite,
            Engine::Postgres => postgres,
        }
    }

    /// Runs one statement; returns how many rows it changed.
    pub(crate) async fn execute(
        &self,
        op: &str,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<u64, StoreError> {
        let mut done = self.run(op, &[Statement { sql, params }], false).await?;
        Ok(done.pop().map_or(0, |d| d.changed))
    }

    /// Runs one query; returns its rows.
    pub(crate) async fn query(
        &self,
        op: &str,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<Vec<Row>, StoreError> {
        let mut done = self.run(op, &[Statement { sql, params }], false).await?;
        Ok(done.pop().map(|d| d.rows).unwrap_or_default())
    }

    /// The first row of a query, if any.
    pub(crate) async fn query_one(
        &self,
        op: &str,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<Option<Row>, StoreError> {
        Ok(self.query(op, sql, params).await?.into_iter().next())
    }

    /// Runs `statements` in one transaction: all of them commit, or none.
    pub(crate) async fn transaction(
        &self,
        op: &str,
        statements: &[Statement<'_>],
    ) -> Result<Vec<Done>, StoreError> {
        self.run(op, statements, true).await
    }

    async fn run(
        &self,
        op: &str,
        statements: &[Statement<'_>],
        in_transaction: bool,
    ) -> Result<Vec<Done>, StoreError> {
        match &self.inner {
            Inner::Sqlite(conn) => {
                let mut conn = conn.lock().map_err(|_| StoreError::Records {
                    op: op.to_string(),
                    detail: "lock poisoned".into(),
                })?;
                run_sqlite(&mut conn, statements, in_transaction).map_err(sqlite_error(op))
            }
            Inner::Postgres { pool, name } => {
                let mut client = pool
                    .get()
                    .await
                    .map_err(|e| StoreError::RecordsUnavailable {
                        op: op.to_string(),
                        detail: format!("{name}: {}", pool_error(&e)),
                    })?;
                run_postgres(&mut client, statements, in_transaction)
                    .await
                    .map_err(postgres_error(op))
            }
        }
    }

    async fn migrate_postgres(&self, schema: &Schema) -> Result<(), StoreError> {
        let Inner::Postgres { pool, name } = &self.inner else {
            unreachable!("migrate_postgres on a Postgres Db only")
        };
        let op = format!("migrate the {} tables", schema.component);
        let mut client = pool
            .get()
            .await
            .map_err(|e| StoreError::RecordsUnavailable {
                op: op.clone(),
                detail: format!("{name}: {}", pool_error(&e)),
            })?;
        let tx = client.transaction().await.map_err(postgres_error(&op))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(postgres_error(&op))?;
        tx.batch_execute(SCHEMA_TABLE)
            .await
            .map_err(postgres_error(&op))?;
        let current: i64 = tx
            .query_opt(
                "SELECT version FROM skillbox_schema WHERE component = $1",
                &[&schema.component],
            )
            .await
            .map_err(postgres_error(&op))?
            .map_or(0, |row| row.get(0));
        check_known(schema, schema.postgres, current)?;
        for migration in schema.postgres.iter().filter(|m| m.version > current) {
            for step in migration.steps {
                let Step::Sql(sql) = step else {
                    unreachable!("Postgres migrations are SQL");
                };
                tx.batch_execute(sql).await.map_err(postgres_error(&op))?;
            }
            tx.execute(
                "INSERT INTO skillbox_schema (component, version) VALUES ($1, $2)
                 ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
                &[&schema.component, &migration.version],
            )
            .await
            .map_err(postgres_error(&op))?;
        }
        tx.commit().await.map_err(postgres_error(&op))
    }
}

/// Refuses a database a newer skillbox has migrated past what this one knows.
fn check_known(schema: &Schema, migrations: &[Migration], current: i64) -> Result<(), StoreError> {
    let known = migrations.last().map_or(0, |m| m.version);
    if current > known {
        return Err(StoreError::Records {
            op: format!("open the {} tables", schema.component),
            detail: format!(
                "the database is at schema version {current}, and this skillbox knows \
                 versions up to {known}: run the newer skillbox that migrated it"
            ),
        });
    }
    Ok(())
}

fn migrate_sqlite(conn: &mut rusqlite::Connection, schema: &Schema) -> Result<(), StoreError> {
    let op = format!("migrate the {} tables", schema.component);
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sqlite_error(&op))?;
    tx.execute_batch(SCHEMA_TABLE).map_err(sqlite_error(&op))?;
    let current: i64 = tx
        .query_row(
            "SELECT version FROM skillbox_schema WHERE component = ?1",
            [schema.component],
            |row| row.get(0),
        )
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(0),
            e => Err(e),
        })
        .map_err(sqlite_error(&op))?;
    check_known(schema, schema.sqlite, current)?;
    for migration in schema.sqlite.iter().filter(|m| m.version > current) {
        for step in migration.steps {
            match step {
                Step::Sql(sql) => tx.execute_batch(sql),
                Step::AddColumn {
                    table,
                    column,
                    decl,
                } => {
                    let has = tx
                        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")
                        .and_then(|mut query| query.exists([table, column]));
                    match has {
                        Ok(true) => Ok(()),
                        Ok(false) => {
                            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {decl}"))
                        }
                        Err(e) => Err(e),
                    }
                }
            }
            .map_err(sqlite_error(&op))?;
        }
        tx.execute(
            "INSERT INTO skillbox_schema (component, version) VALUES (?1, ?2)
             ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            rusqlite::params![schema.component, migration.version],
        )
        .map_err(sqlite_error(&op))?;
    }
    tx.commit().map_err(sqlite_error(&op))
}

fn run_sqlite(
    conn: &mut rusqlite::Connection,
    statements: &[Statement<'_>],
    in_transaction: bool,
) -> rusqlite::Result<Vec<Done>> {
    if !in_transaction {
        return statements.iter().map(|s| run_sqlite_one(conn, s)).collect();
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let done = statements
        .iter()
        .map(|s| run_sqlite_one(&tx, s))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    tx.commit()?;
    Ok(done)
}

fn run_sqlite_one(
    conn: &rusqlite::Connection,
    statement: &Statement<'_>,
) -> rusqlite::Result<Done> {
    let mut prepared = conn.prepare_cached(statement.sql)?;
    let params = rusqlite::params_from_iter(statement.params.iter().map(|v| match v {
        Value::Int(i) => rusqlite::types::Value::Integer(*i),
        Value::Text(s) => rusqlite::types::Value::Text(s.clone()),
    }));
    let columns = prepared.column_count();
    if columns == 0 {
        let changed = prepared.execute(params)?;
        return Ok(Done {
            rows: Vec::new(),
            changed: changed as u64,
        });
    }
    let rows = prepared
        .query_map(params, |row| {
            (0..columns)
                .map(|i| {
                    Ok(match row.get_ref(i)? {
                        ValueRef::Integer(v) => Cell::Int(v),
                        ValueRef::Text(t) | ValueRef::Blob(t) => {
                            Cell::Text(String::from_utf8_lossy(t).into_owned())
                        }
                        ValueRef::Null => Cell::Null,
                        ValueRef::Real(r) => Cell::Int(r as i64),
                    })
                })
                .collect::<rusqlite::Result<Vec<_>>>()
                .map(Row)
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let changed = rows.len() as u64;
    Ok(Done { rows, changed })
}

async fn run_postgres(
    client: &mut deadpool_postgres::Client,
    statements: &[Statement<'_>],
    in_transaction: bool,
) -> Result<Vec<Done>, tokio_postgres::Error> {
    let mut done = Vec::with_capacity(statements.len());
    if in_transaction {
        let tx = client.transaction().await?;
        for statement in statements {
            let sql = dollar_params(statement.sql);
            let prepared = tx.prepare_cached(&sql).await?;
            done.push(run_prepared(&*tx, &prepared, &statement.params).await?);
        }
        tx.commit().await?;
    } else {
        for statement in statements {
            let sql = dollar_params(statement.sql);
            let prepared = client.prepare_cached(&sql).await?;
            done.push(run_prepared(&***client, &prepared, &statement.params).await?);
        }
    }
    Ok(done)
}

async fn run_prepared(
    client: &impl tokio_postgres::GenericClient,
    prepared: &tokio_postgres::Statement,
    params: &[Value],
) -> Result<Done, tokio_postgres::Error> {
    let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as _).collect();
    if prepared.columns().is_empty() {
        let changed = client.execute(prepared, &params).await?;
        return Ok(Done {
            rows: Vec::new(),
            changed,
        });
    }
    let rows = client
        .query(prepared, &params)
        .await?
        .iter()
        .map(postgres_row)
        .collect::<Result<Vec<_>, _>>()?;
    let changed = rows.len() as u64;
    Ok(Done { rows, changed })
}

fn postgres_row(row: &tokio_postgres::Row) -> Result<Row, tokio_postgres::Error> {
    let mut cells = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let cell = if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(i)?.map(Cell::Int)
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(i)?
                .map(|v| Cell::Int(v.into()))
        } else if *ty == Type::INT2 {
            row.try_get::<_, Option<i16>>(i)?
                .map(|v| Cell::Int(v.into()))
        } else if *ty == Type::BOOL {
            row.try_get::<_, Option<bool>>(i)?
                .map(|v| Cell::Int(v.into()))
        } else {
            row.try_get::<_, Option<String>>(i)?.map(Cell::Text)
        };
        cells.push(cell.unwrap_or(Cell::Null));
    }
    Ok(Row(cells))
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Int(v) if *ty == Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
            Value::Int(v) if *ty == Type::INT2 => i16::try_from(*v)?.to_sql(ty, out),
            Value::Int(v) => v.to_sql(ty, out),
            Value::Text(s) => s.as_str().to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        [Type::INT8, Type::INT4, Type::INT2].contains(ty) || <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// SQLite's `?N` parameters as Postgres' `$N`.
fn dollar_params(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// `postgres://user@host:port/dbname` of a config: where, without the password.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// A URL for a message: its password, if any, replaced.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_string(),
        // Not a URL (a key=value string, say): say nothing of what it holds.
        Err(_) => "(the --db value)".into(),
    }
}

pub(crate) fn sqlite_error(op: &str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::Records {
        op: op.to_string(),
        detail: e.to_string(),
    }
}

fn postgres_error(op: &str) -> impl FnOnce(tokio_postgres::Error) -> StoreError + '_ {
    move |e| {
        if e.is_closed() || io_cause(&e) {
            // The connection went, or never came: the database is not answering.
            return StoreError::RecordsUnavailable {
                op: op.to_string(),
                detail: error_chain(&e),
            };
        }
        StoreError::Records {
            op: op.to_string(),
            detail: error_chain(&e),
        }
    }
}

/// Whether an I/O error is among the causes: a socket that failed, not a statement.
fn io_cause(e: &tokio_postgres::Error) -> bool {
    let mut next = std::error::Error::source(e);
    while let Some(source) = next {
        if source.is::<std::io::Error>() {
            return true;
        }
        next = source.source();
    }
    false
}

/// Why the pool gave no connection: a connection that could not be made says why
/// (TLS refused, say), not only that it failed.
fn pool_error(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => error_chain(e),
        other => other.to_string(),
    }
}

fn error_chain(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return db.to_string();
    }
    let mut text = e.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

/// Where records are kept: SQLite files in a data dir (each component its own file,
/// as before Postgres), or one Postgres database for all of them.
#[derive(Debug, Clone)]
pub enum RecordsDb {
    Sqlite { dir: PathBuf },
    Postgres(Db),
}

impl RecordsDb {
    /// `<dir>/<file>.sqlite` files, one per component.
    pub fn sqlite(dir: &Path) -> RecordsDb {
        RecordsDb::Sqlite {
            dir: dir.to_path_buf(),
        }
    }

    /// The Postgres database at `url` (`postgres://user:password@host:port/dbname`, or
    /// libpq's `key=value` form), every component's tables brought up to date.
    pub async fn postgres(url: &str) -> Result<RecordsDb, StoreError> {
        Db::postgres(url, &crate::ALL_SCHEMAS)
            .await
            .map(RecordsDb::Postgres)
    }

    /// The database for a component: its own file `file` in the data dir, or the one
    /// Postgres database.
    pub(crate) fn open(
        &self,
        file: &str,
        pragmas: &str,
        schema: &Schema,
    ) -> Result<Db, StoreError> {
        match self {
            RecordsDb::Sqlite { dir } => Db::sqlite(&dir.join(file), pragmas, schema),
            RecordsDb::Postgres(db) => Ok(db.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_the_postgres_way() {
        assert_eq!(
            dollar_params("SELECT a FROM t WHERE b = ?1 AND c = ?12 AND d = '?'"),
            "SELECT a FROM t WHERE b = $1 AND c = $12 AND d = '?'"
        );
    }

    #[test]
    fn a_password_never_reaches_a_message() {
        assert_eq!(
            redact("postgres://u:secret@db:5432/x"),
            "postgres://u:***@db:5432/x"
        );
        assert_eq!(redact("host=db password=secret"), "(the --db value)");
        let config: tokio_postgres::Config = "postgres://u:secret@db:6000/x".parse().unwrap();
        assert_eq!(describe(&config), "postgres://u@db:6000/x");
    }
}
