//! A sandbox's workspace through its door. The server's runs and sessions, MCP's tools,
//! the agent's tools and the capability router are adapters over [`Workspace`]: a path a
//! caller gives is parsed by one rule ([`WorkspacePath`], against the sandbox's
//! [`WorkspaceRoot`]), a read is bounded by a cap from one table ([`ReadCaps`]), writes,
//! listings and removals go through the sandbox's own file view (never a host path), and
//! a run's inputs, command and collection are one sequence ([`Workspace::place_inputs`],
//! [`Workspace::run_and_collect`]) bounded by the caller's configured [`CollectLimits`].
//! What each adapter adds is its own: the HTTP budget of bytes in memory, MCP's answer
//! holds, the agent's budget of model context.

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;
use skillbox_env::{
    BackendKind, CancellationToken, DirEntry, EnvError, ErrorCode, ExecOutput, ExecRequest,
    ExecutionEnv, FileKind, Tree,
};
use skillbox_protocol::{OutputSelection, SandboxedKind, WorkspacePath, WorkspaceRoot};
use skillbox_store::{CollectLimits, CollectedFile, StoreError, collect_artifacts};

/// The sandbox a caller asked for (`backend`; native when it names none), never `host`:
/// the one place every door (runs, sessions, agent runs, MCP) refuses it.
pub fn sandboxed(backend: Option<BackendKind>) -> Result<SandboxedKind, EnvError> {
    SandboxedKind::try_from(backend.unwrap_or_default())
        .map_err(|e| EnvError::invalid(format!("backend: {e}")))
}

/// What a run's files are collected by: the files placed before it ran (inputs, a
/// restored snapshot, skills), by path and SHA-256, which come back only when changed;
/// which files to keep; and the caller's configured limits.
#[derive(Debug, Clone, Copy)]
pub struct Collection<'a> {
    pub inputs: &'a BTreeMap<PathBuf, String>,
    pub outputs: &'a OutputSelection,
    pub limits: CollectLimits,
}

/// The door's bounds, from one config: where the workspace is in every sandbox, what one
/// collection may hold (a run's, an agent attempt's, a capability call's) and the most
/// one read hands out. The server's flags and the CLI's defaults set it once; every door
/// reads it from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorConfig {
    pub root: WorkspaceRoot,
    pub collect: CollectLimits,
    pub read_caps: ReadCaps,
}

impl Default for DoorConfig {
    fn default() -> Self {
        DoorConfig {
            root: WorkspaceRoot::default(),
            collect: CollectLimits {
                max_files: 1000,
                max_total_bytes: 256 << 20,
                max_file_bytes: 128 << 20,
            },
            read_caps: ReadCaps::default(),
        }
    }
}

/// The most one read hands out, by who it is handed to: one table, so that a change is
/// made once and each door's figure is in sight of the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCaps {
    /// `GET /v1/sessions/{id}/files/{path}`: streamed, held in the server's budget of
    /// bytes in memory until sent.
    pub http: u64,
    /// MCP's `read_file`: one JSON-RPC answer, text or base64.
    pub mcp: u64,
    /// The agent's `read_file`: into a model's context.
    pub model: u64,
}

impl Default for ReadCaps {
    fn default() -> Self {
        ReadCaps {
            http: 256 << 20,
            mcp: 16 << 20,
            model: 256 << 10,
        }
    }
}

/// A sandbox seen through its door: paths in its workspace parsed once, by one rule.
#[derive(Clone, Copy)]
pub struct Workspace<'a> {
    env: &'a dyn ExecutionEnv,
    root: &'a WorkspaceRoot,
}

impl std::fmt::Debug for Workspace<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("root", self.root)
            .finish_non_exhaustive()
    }
}

/// `raw`, a path a caller gave as `field`, in the workspace at `root` (relative to it,
/// or absolute beneath it): the `invalid` error every door gives names the field. For a
/// door that checks a path before it has a sandbox to see it through.
pub fn parse_path(root: &WorkspaceRoot, raw: &str, field: &str) -> Result<WorkspacePath, EnvError> {
    root.parse(raw)
        .map_err(|e| EnvError::invalid(format!("{field}: {e}")))
}

impl<'a> Workspace<'a> {
    pub fn new(env: &'a dyn ExecutionEnv, root: &'a WorkspaceRoot) -> Self {
        Workspace { env, root }
    }

    /// The sandbox.
    pub fn env(&self) -> &'a dyn ExecutionEnv {
        self.env
    }

    pub fn root(&self) -> &'a WorkspaceRoot {
        self.root
    }

    /// `raw`, a path a caller gave as `field`: relative to the workspace, or absolute
    /// beneath it.
    pub fn parse(&self, raw: &str, field: &str) -> Result<WorkspacePath, EnvError> {
        parse_path(self.root, raw, field)
    }

    /// A path from a URL (`/v1/sessions/{id}/files/{path}`), which has no leading
    /// slash: one that starts with the root's own components (`workspace/out.txt`, as
    /// the clients send an absolute path) names a path beneath the root; any other is
    /// relative to it.
    pub fn parse_url(&self, raw: &str, field: &str) -> Result<WorkspacePath, EnvError> {
        let absolute = format!("/{}", raw.trim_start_matches('/'));
        let beneath = absolute
            .strip_prefix(self.root.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        self.parse(if beneath { &absolute } else { raw }, field)
    }

    /// `raw` as a file's path (not the root itself).
    pub fn parse_file(&self, raw: &str, field: &str) -> Result<WorkspacePath, EnvError> {
        let path = self.parse(raw, field)?;
        self.file(path, field)
    }

    /// `path` unless it is the root, which names no file.
    pub fn file(&self, path: WorkspacePath, field: &str) -> Result<WorkspacePath, EnvError> {
        if path.is_root() {
            return Err(EnvError::invalid(format!(
                "{field}: names {} itself; give a file",
                self.root
            )));
        }
        Ok(path)
    }

    /// The path in the sandbox.
    pub fn absolute(&self, path: &WorkspacePath) -> PathBuf {
        self.root.join(path)
    }

    /// The size of the regular file at `path`, at most `cap` bytes; `hint` says what
    /// the caller may do instead (`read a part with exec (head -c, tail -c)`).
    pub async fn sized_file(
        &self,
        path: &WorkspacePath,
        cap: u64,
        hint: &str,
        cancel: &CancellationToken,
    ) -> Result<u64, EnvError> {
        let absolute = self.absolute(path);
        let info = self.env.file_info(&absolute, cancel).await?;
        if info.kind != FileKind::File {
            return Err(EnvError::invalid(format!(
                "{}: not a regular file",
                absolute.display()
            )));
        }
        if info.size > cap {
            return Err(EnvError::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "{}: {} bytes, more than the {cap} a read hands out; {hint}",
                    absolute.display(),
                    info.size
                ),
            ));
        }
        Ok(info.size)
    }

    /// The file at `path`, at most `size` bytes (what [`sized_file`](Self::sized_file)
    /// found): a file grown or swapped for a bigger one since is refused, never read
    /// whole.
    pub async fn read(
        &self,
        path: &WorkspacePath,
        size: u64,
        cancel: &CancellationToken,
    ) -> Result<Vec<u8>, EnvError> {
        self.env
            .read_bytes_max(&self.absolute(path), size, cancel)
            .await
    }

    /// Writes `bytes` as the file `path` (0755 when `executable`, else 0644), making
    /// the directories it needs; a symlink in its place is replaced, never followed.
    pub async fn write(
        &self,
        path: &WorkspacePath,
        bytes: Bytes,
        executable: bool,
        cancel: &CancellationToken,
    ) -> Result<(), EnvError> {
        let path = self.file(path.clone(), "path")?;
        let mut tree = Tree::new();
        tree.file(PathBuf::from(path.as_str()), bytes, executable)?;
        self.env.put_tree(self.root.as_path(), &tree, cancel).await
    }

    /// The entries of the directory at `path` (symlinks listed, never followed).
    pub async fn list(
        &self,
        path: &WorkspacePath,
        cancel: &CancellationToken,
    ) -> Result<Vec<DirEntry>, EnvError> {
        self.env.list_dir(&self.absolute(path), cancel).await
    }

    /// Writes each input file (`files`, by path relative to the workspace; their
    /// directories made) and records its SHA-256 in `inputs`. The error says which file
    /// (its index) failed, for the caller to name its field.
    pub async fn place_inputs(
        &self,
        files: &[(PathBuf, Bytes)],
        inputs: &mut BTreeMap<PathBuf, String>,
        cancel: &CancellationToken,
    ) -> Result<(), (usize, EnvError)> {
        let root = self.root.as_path();
        for (index, (path, bytes)) in files.iter().enumerate() {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                self.env
                    .create_dir(&root.join(parent), true, cancel)
                    .await
                    .map_err(|e| (index, e))?;
            }
            self.env
                .write(&root.join(path), bytes, cancel)
                .await
                .map_err(|e| (index, e))?;
            inputs.insert(path.clone(), skillbox_store::sha256_hex(bytes));
        }
        Ok(())
    }

    /// Runs `request` (in the workspace unless it names another cwd), with `files` (by
    /// absolute path) written in the same round trip, then collects what it made: the
    /// exec's output, and the files or why they were not collected (past a limit, which
    /// a run reports as its error and an agent feeds back to its model). The
    /// collection's listing comes back with the exec where the backend can do that.
    pub async fn run_and_collect(
        &self,
        files: Vec<(PathBuf, Vec<u8>)>,
        request: ExecRequest,
        collection: Collection<'_>,
        cancel: &CancellationToken,
    ) -> Result<(ExecOutput, Result<Vec<CollectedFile>, StoreError>), EnvError> {
        let root = self.root.as_path();
        let mut request =
            request.walk_after(skillbox_store::collection_walk(&self.env.absolute(root)));
        if request.cwd.is_none() {
            request = request.cwd(root);
        }
        let output = self.env.write_and_exec(files, request, cancel).await?;
        let collected = self.collect(collection, cancel).await;
        Ok((output, collected))
    }

    /// What the workspace holds now that `collection` keeps.
    pub async fn collect(
        &self,
        collection: Collection<'_>,
        cancel: &CancellationToken,
    ) -> Result<Vec<CollectedFile>, StoreError> {
        collect_artifacts(
            self.env,
            self.root.as_path(),
            collection.inputs,
            collection.outputs,
            collection.limits,
            cancel,
        )
        .await
    }

    /// Removes the file at `path`, or with `recursive` a directory tree; never the root.
    pub async fn remove(
        &self,
        path: &WorkspacePath,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> Result<(), EnvError> {
        let path = self.file(path.clone(), "path")?;
        self.env
            .remove(&self.absolute(&path), recursive, cancel)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillbox_env::HostEnv;

    fn host() -> (tempfile::TempDir, HostEnv) {
        let dir = tempfile::tempdir().unwrap();
        let env = HostEnv::new(dir.path(), dir.path());
        (dir, env)
    }

    #[test]
    fn url_paths_name_the_root_s_own_components_as_beneath_it() {
        let (_dir, env) = host();
        let root = WorkspaceRoot::default();
        let door = Workspace::new(&env, &root);
        for (raw, want) in [
            ("workspace/a/b.txt", "a/b.txt"),
            ("a/b.txt", "a/b.txt"),
            ("workspacex/a", "workspacex/a"),
            ("workspace", ""),
        ] {
            assert_eq!(door.parse_url(raw, "path").unwrap().as_str(), want, "{raw}");
        }
        let e = door.parse_url("a/../../etc", "path").unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        assert!(e.message.starts_with("path: "), "{e}");
        let other = WorkspaceRoot::new("/home/agentscope/workspace").unwrap();
        let door = Workspace::new(&env, &other);
        assert_eq!(
            door.parse_url("home/agentscope/workspace/x", "path")
                .unwrap()
                .as_str(),
            "x"
        );
        assert_eq!(
            door.parse_url("workspace/x", "path").unwrap().as_str(),
            "workspace/x"
        );
    }

    #[test]
    fn the_root_itself_is_no_file() {
        let (_dir, env) = host();
        let root = WorkspaceRoot::default();
        let door = Workspace::new(&env, &root);
        let e = door.parse_file("/workspace/", "path").unwrap_err();
        assert_eq!(e.message, "path: names /workspace itself; give a file");
        assert!(door.parse_file("/workspace/x", "path").is_ok());
    }
}
