//! A real S3 server for the tests of `--store s3://…`: moto's (`moto[server]` from PyPI,
//! pinned in `scripts/s3/requirements.txt`, installed by scripts/test.sh into
//! `target/s3/venv`), on a free port of 127.0.0.1, killed when dropped. Its own plain
//! HTTP requests (with a signature moto does not check) make buckets and look at
//! what skillbox stored, beside skillbox's signed ones.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Moto does not check signatures, but takes a request without one as anonymous and
/// refuses it an object; this names the access key [`MotoServer::aws_env`] gives.
const FAKE_AUTHORIZATION: &str = "AWS4-HMAC-SHA256 \
    Credential=skillbox-test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, \
    Signature=0000000000000000000000000000000000000000000000000000000000000000";

/// A running moto server.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    port: u16,
}

/// What one plain request got: the status and the body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl MotoServer {
    /// Starts one, or skips `test` (a failure under `SKILLBOX_REQUIRE_ALL=1`) when no
    /// moto server is installed: `$SKILLBOX_MOTO_SERVER`, else
    /// `<target>/s3/venv/bin/moto_server` (`target_tmpdir` is a test's
    /// `CARGO_TARGET_TMPDIR`, beneath the target dir).
    pub fn start(test: &str, target_tmpdir: &Path) -> Option<MotoServer> {
        let binary = std::env::var_os("SKILLBOX_MOTO_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_tmpdir.join("../s3/venv/bin/moto_server"));
        if !binary.is_file() {
            super::skip(
                test,
                &format!(
                    "no moto server at {} (scripts/test.sh installs the pinned one; or set \
                     SKILLBOX_MOTO_SERVER)",
                    binary.display()
                ),
            );
            return None;
        }
        let port = super::free_port();
        let child = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let server = MotoServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.try_request("GET", "/", b"").is_err() {
            assert!(
                Instant::now() < deadline,
                "moto server on port {port} did not answer within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(server)
    }

    /// `http://127.0.0.1:PORT`, what `AWS_ENDPOINT_URL` names.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The variables a skillbox (or an `ArtifactStore::s3` in this process) needs to
    /// reach this server: an endpoint, plain HTTP allowed, a region and made-up keys.
    pub fn aws_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "skillbox-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "skillbox-test-secret".into()),
        ]
    }

    /// Makes the bucket `name`.
    pub fn create_bucket(&self, name: &str) {
        let answer = self.request("PUT", &format!("/{name}"), b"");
        assert_eq!(answer.status, 200, "create bucket {name}: {answer:?}");
    }

    /// The object at `bucket/key`, or `None` when there is none.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let answer = self.request("GET", &format!("/{bucket}/{key}"), b"");
        match answer.status {
            200 => Some(answer.body),
            404 => None,
            status => panic!("GET {bucket}/{key}: {status}"),
        }
    }

    /// Writes `bytes` at `bucket/key`, replacing what is there (as an attacker with
    /// the bucket's keys, or a damaged disk, would).
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let answer = self.request("PUT", &format!("/{bucket}/{key}"), bytes);
        assert_eq!(answer.status, 200, "PUT {bucket}/{key}: {answer:?}");
    }

    /// The keys in `bucket` under `prefix` (at most 1000).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let answer = self.request(
            "GET",
            &format!("/{bucket}?list-type=2&prefix={prefix}"),
            b"",
        );
        assert_eq!(answer.status, 200, "list {bucket}/{prefix}: {answer:?}");
        let text = String::from_utf8_lossy(&answer.body);
        text.split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split("</Key>").next())
            .map(str::to_string)
            .collect()
    }

    /// One plain HTTP/1.0 request (so the answer is never chunked); panics when the
    /// server cannot be reached.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> Answer {
        self.try_request(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path} to moto: {e}"))
    }

    fn try_request(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<Answer> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\
             Authorization: {FAKE_AUTHORIZATION}\r\nContent-Length: {}\r\n\r\n",
            self.port,
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no end of headers"))?;
        let status = String::from_utf8_lossy(&raw[..split])
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other("no status"))?;
        Ok(Answer {
            status,
            body: raw[split + 4..].to_vec(),
        })
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
