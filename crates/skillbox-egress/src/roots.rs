//! Roots the proxy trusts upstream beyond the public web's (DESIGN.md §3.8): the
//! certificates of a private CA the operator names (`--egress-ca FILE`), for a host
//! whose secrets the proxy adds and whose certificate that CA signed. Checked once,
//! when the file is read; every sandbox's proxy then takes the checked list.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The largest file of roots read.
pub const MAX_UPSTREAM_ROOTS_BYTES: u64 = 1024 * 1024;
/// Most certificates in it.
pub const MAX_UPSTREAM_ROOTS: usize = 100;

/// The checked roots (none by default: the public web roots only).
#[derive(Debug, Clone, Default)]
pub struct UpstreamRoots(Arc<[CertificateDer<'static>]>);

impl UpstreamRoots {
    /// The certificates of `pem`: one or more `CERTIFICATE` sections and nothing else
    /// (a private key given by mistake is named, never kept), each a certificate that
    /// parses as a trust anchor; at most [`MAX_UPSTREAM_ROOTS`].
    pub fn from_pem(pem: &[u8]) -> Result<UpstreamRoots, String> {
        // Any other section is refused: the PEM reader would skip it unseen.
        for (n, line) in pem.split(|b| *b == b'\n').enumerate() {
            let line = line.trim_ascii();
            if line.starts_with(b"-----BEGIN ") && line != b"-----BEGIN CERTIFICATE-----" {
                let label = String::from_utf8_lossy(line);
                return Err(format!(
                    "line {}: {label:?}: only CERTIFICATE sections (the CA's certificates) belong here",
                    n + 1
                ));
            }
        }
        let mut roots = Vec::new();
        let mut store = rustls::RootCertStore::empty();
        for (i, cert) in CertificateDer::pem_slice_iter(pem).enumerate() {
            if i == MAX_UPSTREAM_ROOTS {
                return Err(format!(
                    "more than {MAX_UPSTREAM_ROOTS} certificates; give only the CAs the proxy should trust"
                ));
            }
            let cert = cert.map_err(|e| format!("certificate {}: not PEM: {e}", i + 1))?;
            store
                .add(cert.clone())
                .map_err(|e| format!("certificate {}: does not parse as X.509: {e}", i + 1))?;
            roots.push(cert);
        }
        if roots.is_empty() {
            return Err(
                "holds no certificate (a PEM file of -----BEGIN CERTIFICATE----- sections)".into(),
            );
        }
        Ok(UpstreamRoots(roots.into()))
    }

    /// [`UpstreamRoots::from_pem`] of the file at `path`, a regular file of at most
    /// [`MAX_UPSTREAM_ROOTS_BYTES`]; the error does not name the path (the caller does,
    /// with its flag).
    pub fn read(path: &Path) -> Result<UpstreamRoots, String> {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        if !file.metadata().map_err(|e| e.to_string())?.is_file() {
            return Err("not a regular file".into());
        }
        let mut pem = Vec::new();
        file.take(MAX_UPSTREAM_ROOTS_BYTES + 1)
            .read_to_end(&mut pem)
            .map_err(|e| e.to_string())?;
        if pem.len() as u64 > MAX_UPSTREAM_ROOTS_BYTES {
            return Err(format!(
                "larger than {} KiB; give only the CAs the proxy should trust",
                MAX_UPSTREAM_ROOTS_BYTES / 1024
            ));
        }
        UpstreamRoots::from_pem(&pem)
    }

    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn roots_are_read_and_checked() {
        let (a, b) = (ca_pem(), ca_pem());
        let roots = UpstreamRoots::from_pem(format!("# ours\n{a}\n{b}").as_bytes()).unwrap();
        assert_eq!(roots.len(), 2);
        assert!(UpstreamRoots::default().is_empty());

        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        let garbled = a.replace(
            "-----BEGIN CERTIFICATE-----\n",
            "-----BEGIN CERTIFICATE-----\n!!",
        );
        let not_x509 = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        let unended = a.replace("-----END CERTIFICATE-----", "");
        for (pem, said) in [
            (String::new(), "holds no certificate"),
            ("just text\n".to_string(), "holds no certificate"),
            (format!("{a}\n{key}"), "line "),
            (key.clone(), "PRIVATE KEY"),
            (garbled, "certificate 1: not PEM"),
            (
                format!("{a}\n{not_x509}"),
                "certificate 2: does not parse as X.509",
            ),
            (unended, "certificate 1: not PEM"),
            (
                format!("{a}\n").repeat(MAX_UPSTREAM_ROOTS + 1),
                "more than 100 certificates",
            ),
        ] {
            let err = UpstreamRoots::from_pem(pem.as_bytes()).unwrap_err();
            assert!(err.contains(said), "{said}: {err}");
            assert!(!err.contains("PRIVATE KEY-----\nM"), "{err}");
        }
        assert_eq!(
            UpstreamRoots::from_pem(format!("{a}\n").repeat(MAX_UPSTREAM_ROOTS).as_bytes())
                .unwrap()
                .len(),
            MAX_UPSTREAM_ROOTS
        );
    }

    #[test]
    fn the_file_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca_pem()).unwrap();
        assert_eq!(UpstreamRoots::read(&path).unwrap().len(), 1);
        let mut big = ca_pem();
        big.push_str(&"#".repeat(MAX_UPSTREAM_ROOTS_BYTES as usize));
        std::fs::write(&path, big).unwrap();
        assert!(
            UpstreamRoots::read(&path)
                .unwrap_err()
                .contains("larger than 1024 KiB")
        );
        assert!(UpstreamRoots::read(dir.path()).is_err());
        assert!(UpstreamRoots::read(&dir.path().join("missing")).is_err());
    }
}
