//! TLS to Postgres: what a `--db` URL says of TLS, and the rustls connector
//! `tokio-postgres` speaks through.
//!
//! `sslmode=require` (and libpq's `verify-ca` and `verify-full`, read as `require`)
//! connects over TLS and always verifies the server's certificate and its name,
//! against the public web roots and the CA file libpq's `sslrootcert=PATH` names:
//! stricter than libpq's `require`, since records never go over a TLS connection
//! nobody checked. `disable` and the default `prefer` connect in plain text, never
//! trying TLS (what this build always did). `tokio-postgres` knows neither
//! `sslrootcert` nor the `verify-*` modes, so [`take_options`] takes them out of the
//! URL before it is parsed.

use std::future::Future;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// The largest `sslrootcert` file read.
const MAX_ROOT_CERT_BYTES: u64 = 1024 * 1024;

/// What a URL said of TLS that `tokio-postgres` does not parse.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    /// `sslrootcert=PATH`: a PEM file of CA certificates trusted besides the web's.
    pub root_cert: Option<PathBuf>,
}

/// `url` without `sslrootcert`, and with `sslmode=verify-ca`/`verify-full` as
/// `sslmode=require`, in either form `tokio-postgres` parses (a `postgres://` URL, or
/// libpq's `key=value` pairs); and what was taken out. A string this cannot read is
/// given back as it is, for `tokio-postgres` to refuse.
pub(crate) fn take_options(url: &str) -> (String, TlsOptions) {
    let mut options = TlsOptions::default();
    let mut take = |key: &str, value: &str| -> Option<Option<String>> {
        match (key, value) {
            ("sslrootcert", path) => {
                options.root_cert = Some(PathBuf::from(path));
                Some(None)
            }
            // Verified as `require` is: the chain and the name, always.
            ("sslmode", "verify-ca" | "verify-full") => Some(Some("require".into())),
            _ => None,
        }
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        take_from_query(url, &mut take)
    } else {
        take_from_pairs(url, &mut take).unwrap_or_else(|| url.to_string())
    };
    (rest, options)
}

/// What [`take_options`] does with one `key=value`: `None` keeps it, `Some(None)` takes
/// it out, `Some(Some(v))` keeps the key with `v`.
type Take<'a> = dyn FnMut(&str, &str) -> Option<Option<String>> + 'a;

fn take_from_query(url: &str, take: &mut Take<'_>) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let kept: Vec<String> = query
        .split('&')
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
            match take(key, &decoded) {
                None => Some(pair.to_string()),
                Some(None) => None,
                Some(Some(value)) => Some(format!("{key}={value}")),
            }
        })
        .collect();
    if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// libpq's `key = value` pairs, a value bare or in single quotes, `\` escaping the
/// next character; `None` when `s` is not that.
fn take_from_pairs(s: &str, take: &mut Take<'_>) -> Option<String> {
    let mut kept = Vec::new();
    let mut chars = s.char_indices().peekable();
    let skip_space = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_space(&mut chars);
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        skip_space(&mut chars);
        chars.next_if(|(_, c)| *c == '=')?;
        skip_space(&mut chars);
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let mut value = String::new();
        loop {
            match chars.next() {
                None if quoted => return None,
                None => break,
                Some((_, '\\')) => value.push(chars.next()?.1),
                Some((_, '\'')) if quoted => break,
                Some((_, c)) if c.is_whitespace() && !quoted => break,
                Some((_, c)) => value.push(c),
            }
        }
        let end = chars.peek().map_or(s.len(), |(i, _)| *i);
        match take(&key, &value) {
            None => kept.push(s[start..end].trim().to_string()),
            Some(None) => {}
            Some(Some(value)) => kept.push(format!("{key}={value}")),
        }
    }
    Some(kept.join(" "))
}

/// The certificates of the PEM file at `path` (`sslrootcert`): at least one, each one
/// that parses as a trust anchor; the error says why, the caller names the file.
pub(crate) fn read_root_cert(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let mut pem = Vec::new();
    file.take(MAX_ROOT_CERT_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(|e| e.to_string())?;
    if pem.len() as u64 > MAX_ROOT_CERT_BYTES {
        return Err(format!(
            "larger than {} KiB; give only the CA certificates",
            MAX_ROOT_CERT_BYTES / 1024
        ));
    }
    let mut store = rustls::RootCertStore::empty();
    let mut certs = Vec::new();
    for (i, cert) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        let cert = cert.map_err(|e| format!("certificate {}: not PEM: {e}", i + 1))?;
        store
            .add(cert.clone())
            .map_err(|e| format!("certificate {}: does not parse as X.509: {e}", i + 1))?;
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(
            "holds no certificate (a PEM file of -----BEGIN CERTIFICATE----- sections)".into(),
        );
    }
    Ok(certs)
}

/// Opens TLS to Postgres, verifying the server against the web's roots and
/// `extra_roots`. Cheap to clone.
#[derive(Clone)]
pub(crate) struct MakeRustls(Arc<rustls::ClientConfig>);

impl MakeRustls {
    pub(crate) fn new(extra_roots: Vec<CertificateDer<'static>>) -> Result<MakeRustls, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for root in extra_roots {
            roots.add(root).map_err(|e| e.to_string())?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        // What libpq offers; Postgres 17 requires it of a direct TLS connection.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(MakeRustls(Arc::new(config)))
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = std::convert::Infallible;

    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, Self::Error> {
        // Asked for every connection, TLS or not (a Unix socket's host is ""): the name
        // is checked when TLS is opened.
        Ok(RustlsConnect {
            config: self.0.clone(),
            host: host.to_string(),
        })
    }
}

/// One TLS connection about to be opened to `host`.
pub(crate) struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    host: String,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from(self.host.clone()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{:?} is not a name TLS can verify: {e}", self.host),
                )
            })?;
            let stream = tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await
                .map_err(|e| explain_refusal(e, &self.host))?;
            Ok(RustlsStream(stream))
        })
    }
}

/// A certificate refused says what it was checked against and how to trust its CA.
fn explain_refusal(e: io::Error, host: &str) -> io::Error {
    let refused = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|inner| matches!(inner, rustls::Error::InvalidCertificate(_)));
    if !refused {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "{e}: the certificate of {host} was checked against the public web roots and \
             the CA file of sslrootcert=PATH, if any; name the CA that signed it with \
             sslrootcert"
        ),
    )
}

/// A TLS connection to Postgres.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // `tls-server-end-point` is not offered: SCRAM goes on without it, as with
        // libpq's default `channel_binding=prefer`.
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_a_url() {
        let (rest, options) = take_options(
            "postgres://u:p@db:5432/x?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20pg.pem&application_name=a",
        );
        assert_eq!(
            rest,
            "postgres://u:p@db:5432/x?sslmode=require&application_name=a"
        );
        assert_eq!(
            options,
            TlsOptions {
                root_cert: Some("/etc/ca pg.pem".into())
            }
        );
        let (rest, options) = take_options("postgres://u@db/x?sslrootcert=/ca.pem");
        assert_eq!(rest, "postgres://u@db/x");
        assert_eq!(options.root_cert, Some("/ca.pem".into()));
        let plain = "postgresql://u@db/x?sslmode=disable";
        assert_eq!(take_options(plain), (plain.into(), TlsOptions::default()));
    }

    #[test]
    fn tls_options_are_taken_out_of_key_value_pairs() {
        let (rest, options) = take_options(
            "host=db user=u password='a b\\'c' sslrootcert = '/etc/my ca.pem' sslmode=verify-ca dbname=x",
        );
        assert_eq!(
            rest,
            "host=db user=u password='a b\\'c' sslmode=require dbname=x"
        );
        assert_eq!(options.root_cert, Some("/etc/my ca.pem".into()));
        // Not pairs at all: left for tokio-postgres to refuse.
        assert_eq!(take_options("host=db 'x").0, "host=db 'x");
        assert_eq!(take_options("nonsense").0, "nonsense");
    }
}
