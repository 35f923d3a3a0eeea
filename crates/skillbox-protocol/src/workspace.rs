//! Paths inside a sandbox's workspace, parsed once by one rule for every door that reads,
//! writes, lists or deletes there (runs' input files, sessions' file routes, MCP's and
//! the agent's file tools), and for the artifact paths copy-out writes on the host.
//!
//! A [`WorkspacePath`] is relative to the workspace's root: plain components only (an
//! empty or `.` component is dropped, `..` refused), no NUL, each component at most
//! [`NAME_MAX`] bytes and the whole path, root included, at most [`PATH_MAX`] (Linux's
//! limits: checked here, so a path the kernel would refuse part-way never makes the
//! directories before it). Where a caller may name the root itself, an absolute path is
//! taken when it is the root or beneath it; any other absolute path is refused, never
//! read as relative (`/etc/x` is not `/workspace/etc/x`).

use std::fmt;
use std::path::{Path, PathBuf};

/// Where the workspace is in a sandbox unless configured otherwise.
pub const DEFAULT_WORKSPACE_ROOT: &str = "/workspace";
/// The top-level directories a workspace root may be beneath: places no backend puts
/// anything of its own (its system directories, `/tmp`, `/proc`, `/dev`, the runtime's
/// `/node_modules`, a capability's `/capability` are all elsewhere).
pub const ROOT_PLACES: &[&str] = &["workspace", "home", "srv", "work", "mnt"];

/// Longest name of one path component.
pub const NAME_MAX: usize = 255;
/// Longest whole path.
pub const PATH_MAX: usize = 4096;

/// The workspace's root in a sandbox: an absolute path of plain components.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkspaceRoot(String);

impl Default for WorkspaceRoot {
    fn default() -> Self {
        WorkspaceRoot(DEFAULT_WORKSPACE_ROOT.to_string())
    }
}

impl WorkspaceRoot {
    /// `raw` as a root: absolute, plain components, not `/` itself, at most 1024 bytes.
    pub fn new(raw: &str) -> Result<WorkspaceRoot, InvalidPath> {
        let invalid = |reason: &str| InvalidPath::new(raw, reason);
        let Some(rest) = raw.strip_prefix('/') else {
            return Err(invalid("the workspace root must be an absolute path"));
        };
        if raw.len() > 1024 {
            return Err(invalid("the workspace root is longer than 1024 bytes"));
        }
        let parts = rest
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(|c| check_component(raw, c))
            .collect::<Result<Vec<_>, _>>()?;
        if parts.is_empty() {
            return Err(invalid("the workspace root cannot be / itself"));
        }
        if !ROOT_PLACES.contains(&parts[0]) {
            let places: Vec<String> = ROOT_PLACES.iter().map(|p| format!("/{p}")).collect();
            return Err(invalid(&format!(
                "the workspace root must be beneath one of {} (where no backend keeps anything of its own)",
                places.join(", ")
            )));
        }
        Ok(WorkspaceRoot(format!("/{}", parts.join("/"))))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }

    /// The absolute path of `path` in the sandbox.
    pub fn join(&self, path: &WorkspacePath) -> PathBuf {
        if path.is_root() {
            PathBuf::from(&self.0)
        } else {
            Path::new(&self.0).join(&path.0)
        }
    }

    /// The absolute path of `relative`, a path the caller knows to be plain (a name of
    /// its own, such as the script's); [`join`](Self::join) for a caller's path.
    pub fn join_str(&self, relative: &str) -> PathBuf {
        Path::new(&self.0).join(relative)
    }

    /// `raw` as a path in this workspace (relative to it, or absolute beneath it).
    pub fn parse(&self, raw: &str) -> Result<WorkspacePath, InvalidPath> {
        let relative = match raw.strip_prefix('/') {
            None => raw,
            Some(_) => {
                let normal: String = raw
                    .split('/')
                    .filter(|c| !c.is_empty() && *c != ".")
                    .fold(String::new(), |path, c| path + "/" + c);
                match normal.strip_prefix(self.0.as_str()) {
                    Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                        let path = WorkspacePath::relative(rest.trim_start_matches('/'))
                            .map_err(|e| InvalidPath::new(raw, &e.reason))?;
                        return self.bounded(raw, path);
                    }
                    _ => {
                        return Err(InvalidPath::new(
                            raw,
                            &format!(
                                "is outside {}; give a path relative to it (or beneath {0}/)",
                                self.0
                            ),
                        ));
                    }
                }
            }
        };
        let path = WorkspacePath::relative(relative)?;
        self.bounded(raw, path)
    }

    /// `path` if the whole of it, this root included, is within [`PATH_MAX`].
    fn bounded(&self, raw: &str, path: WorkspacePath) -> Result<WorkspacePath, InvalidPath> {
        if self.0.len() + 1 + path.0.len() > PATH_MAX {
            return Err(InvalidPath::new(raw, &too_long()));
        }
        Ok(path)
    }
}

impl fmt::Display for WorkspaceRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A path inside the workspace, relative to its root; empty for the root itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WorkspacePath(String);

/// Why a path is not one inside the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPath {
    /// The path as given.
    pub path: String,
    pub reason: String,
}

impl InvalidPath {
    fn new(path: &str, reason: &str) -> InvalidPath {
        InvalidPath {
            path: path.to_string(),
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for InvalidPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.path, self.reason)
    }
}

impl std::error::Error for InvalidPath {}

fn too_long() -> String {
    format!("too long: a name is at most {NAME_MAX} bytes and the whole path at most {PATH_MAX}")
}

fn check_component<'a>(raw: &str, component: &'a str) -> Result<&'a str, InvalidPath> {
    if component == ".." {
        return Err(InvalidPath::new(
            raw,
            "give a path inside the workspace, without `..`",
        ));
    }
    if component.len() > NAME_MAX {
        return Err(InvalidPath::new(raw, &too_long()));
    }
    Ok(component)
}

impl WorkspacePath {
    /// `raw` as a relative path (an artifact's, an input file's): absolute refused.
    pub fn relative(raw: &str) -> Result<WorkspacePath, InvalidPath> {
        if raw.contains('\0') {
            return Err(InvalidPath::new(raw, "contains a NUL byte"));
        }
        if raw.starts_with('/') {
            return Err(InvalidPath::new(
                raw,
                "is absolute; give a path relative to the workspace",
            ));
        }
        if raw.len() > PATH_MAX {
            return Err(InvalidPath::new(raw, &too_long()));
        }
        let parts = raw
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(|c| check_component(raw, c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(WorkspacePath(parts.join("/")))
    }

    /// The root itself (the empty path).
    pub fn root() -> WorkspacePath {
        WorkspacePath::default()
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// `a/b/c`; empty for the root.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The components, in order (none for the root).
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// The last component; none for the root.
    pub fn file_name(&self) -> Option<&str> {
        self.components().next_back()
    }

    /// The path without its last component (the root's is none).
    pub fn parent(&self) -> Option<WorkspacePath> {
        if self.is_root() {
            return None;
        }
        Some(WorkspacePath(
            self.0
                .rsplit_once('/')
                .map_or("", |(dir, _)| dir)
                .to_string(),
        ))
    }

    /// Whether a component starts with `.`.
    pub fn is_hidden(&self) -> bool {
        self.components().any(|c| c.starts_with('.'))
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<String, String> {
        WorkspaceRoot::default()
            .parse(raw)
            .map(|p| p.0)
            .map_err(|e| e.reason)
    }

    #[test]
    fn relative_and_beneath_the_root_are_the_same_path() {
        for (raw, want) in [
            ("a/b.txt", "a/b.txt"),
            ("./a//b.txt/", "a/b.txt"),
            ("/workspace/a/b.txt", "a/b.txt"),
            ("//workspace//a/./b.txt", "a/b.txt"),
            ("/workspace", ""),
            ("/workspace/", ""),
            ("", ""),
            (".", ""),
        ] {
            assert_eq!(parse(raw).as_deref(), Ok(want), "{raw:?}");
        }
    }

    #[test]
    fn what_leaves_the_workspace_or_the_kernel_refuses_is_an_error_naming_why() {
        for (raw, why) in [
            ("/etc/passwd", "is outside /workspace"),
            ("/workspacex/a", "is outside /workspace"),
            ("/", "is outside /workspace"),
            ("a/../../x", "without `..`"),
            ("/workspace/../etc", "without `..`"),
            ("..", "without `..`"),
            ("a\0b", "NUL"),
        ] {
            let e = parse(raw).unwrap_err();
            assert!(e.contains(why), "{raw:?}: {e}");
        }
        assert!(parse(&"n".repeat(256)).unwrap_err().contains("too long"));
        assert!(parse(&"n".repeat(255)).is_ok());
        // The root counts against PATH_MAX: "/workspace/" is 11 bytes.
        let deep = vec!["d".repeat(200); 25].join("/");
        assert!(parse(&deep[..PATH_MAX - 11]).is_ok());
        assert!(
            parse(&deep[..PATH_MAX - 10])
                .unwrap_err()
                .contains("too long")
        );
        let e = WorkspacePath::relative("/workspace/a").unwrap_err();
        assert!(e.reason.contains("is absolute"), "{e}");
        assert_eq!(
            e.to_string(),
            "\"/workspace/a\": is absolute; give a path relative to the workspace"
        );
    }

    #[test]
    fn another_root_is_followed_by_every_path() {
        let root = WorkspaceRoot::new("/home/agentscope//workspace/").unwrap();
        assert_eq!(root.as_str(), "/home/agentscope/workspace");
        let path = root
            .parse("/home/agentscope/workspace/out/deck.pptx")
            .unwrap();
        assert_eq!(path.as_str(), "out/deck.pptx");
        assert_eq!(
            root.join(&path),
            PathBuf::from("/home/agentscope/workspace/out/deck.pptx")
        );
        assert!(
            root.parse("/workspace/x")
                .unwrap_err()
                .reason
                .contains("outside /home")
        );
        for bad in [
            "workspace",
            "/",
            "/a/../b",
            "",
            "/usr/w",
            "/tmp/w",
            "/etc",
            "/node_modules",
        ] {
            assert!(WorkspaceRoot::new(bad).is_err(), "{bad:?}");
        }
        assert!(WorkspaceRoot::new("/srv/agent").is_ok());
    }

    #[test]
    fn parts_of_a_path() {
        let path = WorkspacePath::relative("a/.b/c.txt").unwrap();
        assert_eq!(path.components().collect::<Vec<_>>(), ["a", ".b", "c.txt"]);
        assert_eq!(path.file_name(), Some("c.txt"));
        assert_eq!(path.parent().unwrap().as_str(), "a/.b");
        assert!(path.is_hidden());
        assert_eq!(
            WorkspacePath::relative("x").unwrap().parent(),
            Some(WorkspacePath::root())
        );
        assert_eq!(WorkspacePath::root().parent(), None);
        assert_eq!(WorkspacePath::root().file_name(), None);
    }
}
