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

/// A fresh name for a temp entry: `prefix` plus 16 random hex digits.
pub fn temp_name(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    fill_random(&mut bytes);
    let suffix: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{suffix}")
}

/// Fills `buf` from the kernel's random source.
pub fn fill_random(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        }
    }
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
        assert_ne!(temp_name("x-"), temp_name("x-"));
        assert!(temp_name("pre-").starts_with("pre-"));
    }
}
