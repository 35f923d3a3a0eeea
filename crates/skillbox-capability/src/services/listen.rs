//! Where a service is reached from the host: the `--listen` endpoint (`Listen`), its
//! socket bound only its owner may open, and the listener a supervisor accepts on.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use skillbox_env::{Duplex, EnvError, ErrorCode};

/// The longest path a unix socket address holds (without its NUL).
pub(super) const SUN_PATH_MAX: usize = 107;

/// Where clients reach a service on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket, made mode 0600: only its owner (and root) may connect.
    Unix(PathBuf),
    /// A TCP port on a loopback address: any local user may connect.
    Tcp(SocketAddr),
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
            Listen::Tcp(address) => write!(f, "tcp:{address}"),
        }
    }
}

impl FromStr for Listen {
    type Err = String;

    /// `unix:PATH`, an absolute `PATH`, or `tcp:ADDR:PORT` / `ADDR:PORT` on loopback.
    fn from_str(text: &str) -> Result<Listen, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            return unix_listen(Path::new(path));
        }
        if text.starts_with('/') {
            return unix_listen(Path::new(text));
        }
        let address = text.strip_prefix("tcp:").unwrap_or(text);
        let address: SocketAddr = address.parse().map_err(|_| {
            format!(
                "{text:?}: give unix:PATH (an absolute path) or a loopback ADDRESS:PORT such as 127.0.0.1:8080"
            )
        })?;
        if !address.ip().is_loopback() {
            return Err(format!(
                "{text:?}: only a loopback address (127.0.0.1, ::1): anything wider would let the network reach the service without any check"
            ));
        }
        Ok(Listen::Tcp(address))
    }
}

/// Bytes the private directory a socket is bound in adds to its parent's path.
pub(super) const BIND_EXTRA: usize = "/.sbx-00000000/s".len();

pub(super) fn unix_listen(path: &Path) -> Result<Listen, String> {
    if !path.is_absolute() {
        return Err(format!("{}: give an absolute path", path.display()));
    }
    let parent = path.parent().map_or(0, |p| p.as_os_str().len());
    if path.as_os_str().len() > SUN_PATH_MAX || parent + BIND_EXTRA > SUN_PATH_MAX {
        return Err(format!(
            "{}: too long for a unix socket here (at most {} bytes, and its directory at most {})",
            path.display(),
            SUN_PATH_MAX,
            SUN_PATH_MAX - BIND_EXTRA
        ));
    }
    Ok(Listen::Unix(path.to_path_buf()))
}

/// The host side of a service's endpoint.
#[derive(Debug)]
pub(super) enum HostListener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

impl HostListener {
    pub(super) async fn accept(&self) -> std::io::Result<Box<dyn Duplex>> {
        Ok(match self {
            HostListener::Unix(listener) => Box::new(listener.accept().await?.0),
            HostListener::Tcp(listener) => Box::new(listener.accept().await?.0),
        })
    }
}

/// Binds `path` as a socket only its owner may open: made under a temporary name, set
/// 0600, then renamed into place, so no client ever finds it open to all. A socket left
/// at `path` by a supervisor that is gone is replaced; anything else there is kept.
pub(super) fn bind_unix(path: &Path) -> Result<std::os::unix::net::UnixListener, EnvError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(EnvError::new(
                    ErrorCode::AlreadyExists,
                    format!(
                        "{}: something already listens there; stop it or choose another --listen",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path).map_err(|e| EnvError::io(&e, "remove", path))?;
        }
        Ok(_) => {
            return Err(EnvError::new(
                ErrorCode::AlreadyExists,
                format!(
                    "{}: exists and is not a socket; choose another --listen",
                    path.display()
                ),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(EnvError::io(&e, "stat", path)),
    }
    // Bound in a directory only we can enter, set 0600 there, then moved into place: no
    // client can reach it before its mode is set, and no link can be swapped in.
    let parent = path.parent().unwrap_or(Path::new("/"));
    let private = parent.join(format!(
        ".sbx-{}",
        skillbox_protocol::random::hex(4).map_err(|e| EnvError::io(
            &e,
            "name a directory in",
            parent
        ))?
    ));
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(|e| EnvError::io(&e, "create", &private))?;
    }
    let temp = private.join("s");
    let bound = std::os::unix::net::UnixListener::bind(&temp)
        .map_err(|e| EnvError::io(&e, "bind", &temp))
        .and_then(|listener| {
            std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600))
                .and_then(|()| std::fs::rename(&temp, path))
                .map_err(|e| EnvError::io(&e, "place the socket at", path))
                .map(|()| listener)
        });
    let _ = std::fs::remove_file(&temp);
    let _ = std::fs::remove_dir(&private);
    let listener = bound?;
    listener
        .set_nonblocking(true)
        .map_err(|e| EnvError::io(&e, "bind", path))?;
    Ok(listener)
}

/// Removes `path` if it is a socket (never anything else a record might name).
pub(super) fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes a socket this process bound if what made it is dropped before handing it on.
pub(super) struct SocketGuard(pub(super) Option<PathBuf>);

impl SocketGuard {
    pub(super) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            remove_socket(path);
        }
    }
}
