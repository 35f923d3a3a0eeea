//! A real Postgres server for the tests of `--db postgres://…`: Debian's PostgreSQL
//! (`postgresql`, which scripts/test.sh installs), a cluster of its own in a temp dir,
//! on a free port of 127.0.0.1, stopped and removed when dropped. Its own `psql` looks
//! at what skillbox wrote, beside skillbox's client. [`PostgresServer::start_with_tls`]
//! also serves TLS, with a certificate for `localhost` and 127.0.0.1 signed by a CA made
//! for that server alone.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Postgres server with one user, `skillbox`, trusted without a password.
#[derive(Debug)]
pub struct PostgresServer {
    child: Child,
    port: u16,
    bin: PathBuf,
    /// With TLS: the PEM file of the CA that signed the server's certificate.
    ca_file: Option<PathBuf>,
    /// The cluster and its socket; removed after the server has stopped.
    _cluster: tempfile::TempDir,
}

impl PostgresServer {
    /// Starts one, or skips `test` (a failure under `SKILLBOX_REQUIRE_ALL=1`) when
    /// PostgreSQL is not installed: `$SKILLBOX_PG_BIN`, else the newest
    /// `/usr/lib/postgresql/*/bin`.
    pub fn start(test: &str) -> Option<PostgresServer> {
        Self::start_with(test, false)
    }

    /// [`PostgresServer::start`], serving TLS (`ssl=on`) as well as plain connections,
    /// with a certificate for `localhost` and 127.0.0.1 signed by a CA of its own
    /// ([`PostgresServer::ca_file`]).
    pub fn start_with_tls(test: &str) -> Option<PostgresServer> {
        Self::start_with(test, true)
    }

    fn start_with(test: &str, tls: bool) -> Option<PostgresServer> {
        let Some(bin) = binaries() else {
            super::skip(
                test,
                "no PostgreSQL server (apt-get install postgresql; scripts/test.sh does), \
                 or set SKILLBOX_PG_BIN to the directory of its initdb and postgres",
            );
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("skillbox-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("a temp dir for Postgres: {e}"));
        // Postgres will not run as root: as root, the cluster is the `postgres` user's
        // (the package makes it), else `nobody`'s.
        let (uid, gid) = cluster_owner();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", dir.path().display()));
        let data = dir.path().join("data");
        let initdb = Command::new(bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "skillbox", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {}/initdb: {e}", bin.display()));
        assert!(
            initdb.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        let ca_file = tls.then(|| write_certificates(dir.path(), uid, gid));
        let port = super::free_port();
        let mut postgres = Command::new(bin.join("postgres"));
        if ca_file.is_some() {
            postgres.args(["-c", "ssl=on"]);
            postgres.arg("-c").arg(format!(
                "ssl_cert_file={}",
                dir.path().join("server.crt").display()
            ));
            postgres.arg("-c").arg(format!(
                "ssl_key_file={}",
                dir.path().join("server.key").display()
            ));
        }
        let child = postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            // A test's cluster is thrown away: nothing needs to reach the disk.
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"])
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}/postgres: {e}", bin.display()));
        let server = PostgresServer {
            child,
            port,
            bin,
            ca_file,
            _cluster: dir,
        };
        // Ready when its pid file says so (what `pg_ctl -w` waits for).
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(data.join("postmaster.pid"))
            .is_ok_and(|pid| pid.lines().any(|line| line.trim() == "ready"))
        {
            assert!(
                Instant::now() < deadline,
                "Postgres on port {port} was not ready within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    /// The URL of database `postgres` as user `skillbox`: what `--db` takes.
    pub fn url(&self) -> String {
        format!("postgres://skillbox@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on, at 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PEM file of the CA that signed the server's certificate (started with
    /// [`PostgresServer::start_with_tls`]), for `sslrootcert=`.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// Runs `sql` with psql and returns what it printed (unaligned, tuples only:
    /// one row a line, columns split by `|`); panics when psql fails.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "skillbox", "-d", "postgres", "-X", "-A", "-t"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run psql: {e}"));
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Stops the server now (as a crash would: at once, no checkpoint), and returns
    /// when it has exited; its files stay until the value is dropped.
    pub fn stop(&mut self) {
        // SIGQUIT: an immediate shutdown that takes the server's children with it
        // (a SIGKILL would leave them).
        // SAFETY: a signal to the server this value started and has not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        let _ = self.child.wait();
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh CA (`ca.pem`) and a certificate for `localhost` and 127.0.0.1 it signed
/// (`server.crt`, its key `server.key`) in `dir`; the key the server's user's alone,
/// as Postgres insists. Returns the CA's file.
fn write_certificates(dir: &Path, uid: u32, gid: u32) -> PathBuf {
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "skillbox test Postgres CA");
    let ca_key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("a CA key: {e}"));
    let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key)
        .unwrap_or_else(|e| panic!("a test CA: {e}"));
    let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("a server key: {e}"));
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".into()])
        .and_then(|params| params.signed_by(&key, &ca))
        .unwrap_or_else(|e| panic!("a server certificate: {e}"));
    let write = |name: &str, text: &str, mode: u32| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .and_then(|()| std::os::unix::fs::chown(&path, Some(uid), Some(gid)))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        path
    };
    write("server.crt", &leaf.pem(), 0o644);
    write("server.key", &key.serialize_pem(), 0o600);
    write("ca.pem", &ca.pem(), 0o644)
}

/// Where PostgreSQL's programs are, if anywhere.
fn binaries() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SKILLBOX_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Who owns a test cluster: this process, or when it is root, `postgres` (else
/// `nobody`).
fn cluster_owner() -> (u32, u32) {
    // SAFETY: geteuid and getegid only read this process's credentials.
    let (me, group) = unsafe { (libc::geteuid(), libc::getegid()) };
    if me != 0 {
        return (me, group);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&"postgres"))
        .and_then(|fields| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))
        .unwrap_or((65534, 65534))
}
