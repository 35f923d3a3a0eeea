//! Projection: a workspace's skill roots (`AGENTS.md`, `skills/`, `subagents/`,
//! `knowledge/`, `.skills-cache/` by default) placed at a sandbox's workspace root as one
//! tree ([`FileSystem::put_tree`]: one round trip on every backend), and the user's own
//! skills at `.skills-cache/user/`.
//!
//! A SHA-256 fingerprint over the projected paths, modes and contents is written into
//! the sandbox with them (`.skillbox/projection`). The next projection into the same
//! sandbox (or a workspace restored from a snapshot) compares it first: equal, nothing
//! is copied; different, the tree is placed again, replacing the skill files and
//! touching nothing else. Hashing 200 MB again for every run would cost more than the
//! copy it saves, so file hashes are cached by what `stat` says (device, inode, size,
//! mtime, ctime), as git's index does.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use skillbox_env::{
    CancellationToken, EnvError, EnvResult, ErrorCode, ExecutionEnv, MAX_TREE_BYTES,
    MAX_TREE_ENTRIES, Tree,
};

use crate::catalog::{SKILLS_CACHE, USER_SOURCE};

/// The workspace entries projected when nothing else is configured.
pub const DEFAULT_ROOTS: &[&str] = &[
    "AGENTS.md",
    "skills",
    "subagents",
    "knowledge",
    ".skills-cache",
];
/// Where the fingerprint is kept, relative to the sandbox's workspace root.
pub const MARKER: &str = ".skillbox/projection";

/// What is projected, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionConfig {
    /// Entries of the workspace (files or folders, relative) placed at the root.
    pub roots: Vec<String>,
    /// Off: nothing is projected.
    pub enabled: bool,
    /// The sandbox directory the roots are placed in.
    pub sandbox_root: PathBuf,
}

impl Default for ProjectionConfig {
    fn default() -> Self {
        ProjectionConfig {
            roots: DEFAULT_ROOTS.iter().map(|r| r.to_string()).collect(),
            enabled: true,
            sandbox_root: PathBuf::from("/workspace"),
        }
    }
}

/// One file to project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectedFile {
    /// Relative to the sandbox root.
    pub path: PathBuf,
    /// Where its content is read on the host.
    pub host: PathBuf,
    pub size: u64,
    pub executable: bool,
    pub sha256: String,
}

/// What a projection places, and its fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Projection {
    pub files: Vec<ProjectedFile>,
    /// Directories, so an empty one is there too.
    pub dirs: Vec<PathBuf>,
    pub fingerprint: String,
    pub bytes: u64,
    /// What was left out, and why (a symlink out of its root, a special file).
    pub notes: Vec<String>,
}

impl Projection {
    /// The projected files by path and SHA-256: inputs, so collecting a run's outputs
    /// leaves them out unless the run changed them.
    pub fn inputs(&self) -> BTreeMap<PathBuf, String> {
        self.files
            .iter()
            .map(|f| (f.path.clone(), f.sha256.clone()))
            .collect()
    }
}

/// How an [`apply`] went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// False when the sandbox already had this fingerprint: nothing was copied.
    pub copied: bool,
    pub files: usize,
    pub bytes: u64,
    pub fingerprint: String,
    /// Planning and placing, in milliseconds.
    pub millis: u64,
}

fn io_error(e: &std::io::Error, op: &str, path: &Path) -> EnvError {
    EnvError::io(e, op, path)
}

/// File hashes by what `stat` says of the file, kept between runs.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct HashCache {
    entries: BTreeMap<PathBuf, Cached>,
    #[serde(skip)]
    path: Option<PathBuf>,
    #[serde(skip)]
    changed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Cached {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    sha256: String,
}

impl Cached {
    fn of(meta: &std::fs::Metadata, sha256: String) -> Cached {
        Cached {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            sha256,
        }
    }
}

impl HashCache {
    /// The cache kept at `path` (empty when there is none, or it cannot be read).
    pub fn open(path: &Path) -> HashCache {
        let mut cache: HashCache = std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        cache.path = Some(path.to_path_buf());
        cache
    }

    /// A cache that is never written.
    pub fn in_memory() -> HashCache {
        HashCache::default()
    }

    fn hash(&mut self, path: &Path, meta: &std::fs::Metadata) -> std::io::Result<String> {
        if let Some(cached) = self.entries.get(path)
            && *cached == Cached::of(meta, cached.sha256.clone())
        {
            return Ok(cached.sha256.clone());
        }
        let mut hasher = Sha256::new();
        let mut file = open_nofollow(path)?;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let sha256 = hex(&hasher.finalize());
        self.entries
            .insert(path.to_path_buf(), Cached::of(meta, sha256.clone()));
        self.changed = true;
        Ok(sha256)
    }

    /// Keeps only the files seen this time, and writes the cache back (through a temp
    /// file) when it changed.
    pub fn save(&mut self, seen: &[ProjectedFile]) {
        let before = self.entries.len();
        let keep: std::collections::BTreeSet<&Path> =
            seen.iter().map(|f| f.host.as_path()).collect();
        self.entries.retain(|path, _| keep.contains(path.as_path()));
        if !self.changed && self.entries.len() == before {
            return;
        }
        let Some(path) = &self.path else {
            return;
        };
        let Ok(text) = serde_json::to_vec(self) else {
            return;
        };
        let temp = path.with_extension("tmp");
        if std::fs::write(&temp, text)
            .and_then(|()| std::fs::rename(&temp, path))
            .is_err()
        {
            let _ = std::fs::remove_file(&temp);
            tracing::debug!(path = %path.display(), "projection: the hash cache was not saved");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn open_nofollow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_nofollow())
        .open(path)
}

fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32 | rustix::fs::OFlags::NONBLOCK.bits() as i32
}

/// Plans what gets projected.
struct Planner<'a> {
    cache: &'a mut HashCache,
    projection: Projection,
}

impl Planner<'_> {
    fn too_large(&self, root: &Path) -> Option<EnvError> {
        let entries = self.projection.files.len() + self.projection.dirs.len();
        if entries > MAX_TREE_ENTRIES || self.projection.bytes > MAX_TREE_BYTES {
            return Some(EnvError::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "projection of {}: more than {MAX_TREE_ENTRIES} entries or {MAX_TREE_BYTES} bytes; project fewer roots",
                    root.display()
                ),
            ));
        }
        None
    }

    fn file(&mut self, host: &Path, meta: &std::fs::Metadata, to: PathBuf) -> EnvResult<()> {
        use std::os::unix::fs::PermissionsExt;
        let sha256 = self
            .cache
            .hash(host, meta)
            .map_err(|e| io_error(&e, "read", host))?;
        self.projection.bytes += meta.len();
        self.projection.files.push(ProjectedFile {
            path: to,
            host: host.to_path_buf(),
            size: meta.len(),
            executable: meta.permissions().mode() & 0o111 != 0,
            sha256,
        });
        Ok(())
    }

    /// `host` (a file or a folder) as `to`, within the projected root `root_host`.
    fn walk(&mut self, root_host: &Path, host: &Path, to: PathBuf) -> EnvResult<()> {
        let meta = match std::fs::symlink_metadata(host) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(&e, "stat", host)),
        };
        let file_type = meta.file_type();
        if file_type.is_symlink() {
            // A link to a file inside the same root is projected as that file.
            match inside_target(root_host, host) {
                Some(target) => match std::fs::symlink_metadata(&target) {
                    Ok(target_meta) if target_meta.is_file() => {
                        self.file(&target, &target_meta, to)?;
                    }
                    _ => self.projection.notes.push(format!(
                        "{}: a symlink to something that is not a file of the same root; left out",
                        host.display()
                    )),
                },
                None => self.projection.notes.push(format!(
                    "{}: a symlink out of {}; left out",
                    host.display(),
                    root_host.display()
                )),
            }
        } else if file_type.is_file() {
            self.file(host, &meta, to)?;
        } else if file_type.is_dir() {
            self.projection.dirs.push(to.clone());
            let mut names: Vec<_> = std::fs::read_dir(host)
                .map_err(|e| io_error(&e, "list", host))?
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect();
            names.sort();
            for name in names {
                self.walk(root_host, &host.join(&name), to.join(&name))?;
                if let Some(e) = self.too_large(root_host) {
                    return Err(e);
                }
            }
        } else {
            self.projection.notes.push(format!(
                "{}: not a file or a folder; left out",
                host.display()
            ));
        }
        Ok(())
    }
}

/// Where the symlink `link` points, when that is inside `root` (lexically).
fn inside_target(root: &Path, link: &Path) -> Option<PathBuf> {
    let target = std::fs::read_link(link).ok()?;
    if target.is_absolute() {
        return None;
    }
    let mut resolved = link.parent()?.to_path_buf();
    for component in target.components() {
        match component {
            Component::Normal(part) => resolved.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !resolved.pop() {
                    return None;
                }
            }
            _ => return None,
        }
    }
    resolved.starts_with(root).then_some(resolved)
}

/// Plans the projection of some skills only: each one's folder, at its projected path.
pub fn plan_skills(skills: &[&crate::Skill], cache: &mut HashCache) -> EnvResult<Projection> {
    let mut planner = Planner {
        cache,
        projection: Projection::default(),
    };
    for skill in skills {
        for parent in skill.projected.ancestors().skip(1) {
            if !parent.as_os_str().is_empty() {
                planner.projection.dirs.push(parent.to_path_buf());
            }
        }
        planner.walk(&skill.dir, &skill.dir, skill.projected.clone())?;
    }
    Ok(finish(planner.projection, cache))
}

/// Plans the projection of `workspace`'s roots (and the user's skills, when given).
pub fn plan(
    workspace: Option<&Path>,
    user_skills: Option<&Path>,
    config: &ProjectionConfig,
    cache: &mut HashCache,
) -> EnvResult<Projection> {
    let mut planner = Planner {
        cache,
        projection: Projection::default(),
    };
    if config.enabled {
        if let Some(workspace) = workspace {
            for root in &config.roots {
                let relative = Path::new(root);
                if relative.as_os_str().is_empty()
                    || !relative
                        .components()
                        .all(|c| matches!(c, Component::Normal(_)))
                {
                    return Err(EnvError::invalid(format!(
                        "projection root {root:?}: give a path relative to the workspace, without `..`"
                    )));
                }
                let host = workspace.join(relative);
                planner.walk(&host, &host, relative.to_path_buf())?;
            }
        }
        if let Some(user) = user_skills {
            let to = Path::new(SKILLS_CACHE).join(USER_SOURCE);
            if user.is_dir() {
                planner.projection.dirs.push(PathBuf::from(SKILLS_CACHE));
            }
            planner.walk(user, user, to)?;
        }
    }
    Ok(finish(planner.projection, cache))
}

/// Sorts what was planned, and fingerprints it.
fn finish(mut projection: Projection, cache: &mut HashCache) -> Projection {
    projection.files.sort_by(|a, b| a.path.cmp(&b.path));
    projection.files.dedup_by(|a, b| a.path == b.path);
    projection.dirs.sort();
    projection.dirs.dedup();
    let mut hasher = Sha256::new();
    for dir in &projection.dirs {
        hasher.update(b"d\0");
        hasher.update(dir.as_os_str().as_encoded_bytes());
        hasher.update(b"\n");
    }
    for file in &projection.files {
        hasher.update(if file.executable { b"x\0" } else { b"f\0" });
        hasher.update(file.path.as_os_str().as_encoded_bytes());
        hasher.update(b"\0");
        hasher.update(file.sha256.as_bytes());
        hasher.update(b"\n");
    }
    projection.fingerprint = hex(&hasher.finalize());
    cache.save(&projection.files);
    projection
}

/// The fingerprint of what was last projected into `env` at `root`, if any.
pub async fn fingerprint_in(
    env: &dyn ExecutionEnv,
    root: &Path,
    cancel: &CancellationToken,
) -> EnvResult<Option<String>> {
    match env.read_text(&root.join(MARKER), cancel).await {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::NotDirectory) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Places `projection` in `env` at `config.sandbox_root`, unless it is there already.
pub async fn apply(
    env: &dyn ExecutionEnv,
    projection: &Projection,
    config: &ProjectionConfig,
    cancel: &CancellationToken,
) -> EnvResult<Applied> {
    let started = Instant::now();
    let root = &config.sandbox_root;
    let unchanged = Applied {
        copied: false,
        files: projection.files.len(),
        bytes: projection.bytes,
        fingerprint: projection.fingerprint.clone(),
        millis: 0,
    };
    if projection.files.is_empty() && projection.dirs.is_empty() {
        return Ok(unchanged);
    }
    if fingerprint_in(env, root, cancel).await?.as_deref() == Some(&projection.fingerprint) {
        return Ok(Applied {
            millis: started.elapsed().as_millis() as u64,
            ..unchanged
        });
    }
    let files = projection.files.clone();
    let dirs = projection.dirs.clone();
    let fingerprint = projection.fingerprint.clone();
    let tree = skillbox_env::blocking(cancel, "projection", move || {
        let mut tree = Tree::new();
        for dir in dirs {
            tree.dir(dir)?;
        }
        for file in files {
            let mut data = Vec::with_capacity(file.size as usize);
            open_nofollow(&file.host)
                .and_then(|mut f| f.read_to_end(&mut data))
                .map_err(|e| io_error(&e, "read", &file.host))?;
            tree.file(file.path, data, file.executable)?;
        }
        tree.file(MARKER, format!("{fingerprint}\n"), false)?;
        Ok(tree)
    })
    .await?;
    env.put_tree(root, &tree, cancel).await?;
    Ok(Applied {
        copied: true,
        millis: started.elapsed().as_millis() as u64,
        ..unchanged
    })
}
