//! Lexical path handling shared by every env: no filesystem access here.

use std::path::{Component, Path, PathBuf};

/// Removes `.` and resolves `..` lexically; `..` never climbs above `/`.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::RootDir => out.push("/"),
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(if path.is_absolute() { "/" } else { "." });
    }
    out
}

/// A fresh name for a temp entry: `prefix` plus 16 random hex digits, or the error of
/// the kernel's random source (never a name another could guess).
pub fn temp_name(prefix: &str) -> std::io::Result<String> {
    Ok(format!("{prefix}{}", skillbox_protocol::random::hex(8)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_removes_dots_and_never_climbs_above_root() {
        assert_eq!(normalize(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
        assert_eq!(
            normalize(Path::new("/../../etc/shadow")),
            PathBuf::from("/etc/shadow")
        );
        assert_eq!(normalize(Path::new("/workspace/..")), PathBuf::from("/"));
        assert_eq!(normalize(Path::new("a/../..")), PathBuf::from("."));
    }

    #[test]
    fn temp_names_differ() {
        assert_ne!(temp_name("x-").unwrap(), temp_name("x-").unwrap());
        assert!(temp_name("pre-").unwrap().starts_with("pre-"));
    }
}
