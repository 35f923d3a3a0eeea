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

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use sha2::{Digest, Sha256};
use skillbox_env::{
    CancellationToken, EnvError, EnvResult, ErrorCode, ExecutionEnv, MAX_TREE_BYTES,
    MAX_TREE_DEPTH, MAX_TREE_ENTRIES, Tree,
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
            sandbox_root: PathBuf::from(skillbox_env::DEFAULT_WORKSPACE_ROOT),
        }
    }
}

/// One file to project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectedFile {
    /// Relative to the sandbox root.
    pub path: PathBuf,
    /// Where its content is read on the host (a symlink's own path: it is read through
    /// the link, resolved beneath `root`).
    pub host: PathBuf,
    pub size: u64,
    pub executable: bool,
    pub sha256: String,
    /// The projected root it was found in: it is opened beneath that, never outside.
    #[serde(skip)]
    pub root: PathBuf,
    /// `host` is a symlink to follow (beneath `root`).
    #[serde(skip)]
    pub through_link: bool,
}

/// Opens the regular file `path` found under the projected root `root`, resolving every
/// component beneath `root` (`openat2` with `RESOLVE_BENEATH`): a symlink anywhere on
/// the way that leads out of it (`..` past it, an absolute target, a chain of links) is
/// refused by the kernel, as is a magic link. The last component is followed only when
/// `follow` (a symlink entry, projected as the file it points to). What the sandboxed
/// code could change between planning and reading (it may share the workspace) cannot
/// point the read anywhere else: the check is the open itself.
fn open_beneath(root: &Path, path: &Path, follow: bool) -> std::io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    // A root that is a file itself is opened beneath its folder.
    let (base, relative) = match path.strip_prefix(root) {
        Ok(relative) if !relative.as_os_str().is_empty() => (root, relative),
        _ => match (root.parent(), root.file_name()) {
            (Some(parent), Some(name)) if path == root => (parent, Path::new(name)),
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not under its projected root",
                ));
            }
        },
    };
    // The root itself must be a real folder, not a symlink to one.
    let dir = rustix::fs::open(
        base,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rustix::fs::openat2(
        &dir,
        relative,
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
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
///
/// Kept as one line a file (`sha256 dev ino size mtime_ns ctime_ns path`, tab-separated,
/// the path escaped), which loads in a few milliseconds for tens of thousands of files:
/// an unchanged projection costs a walk and this, not a read of every file.
#[derive(Debug, Default)]
pub struct HashCache {
    entries: HashMap<PathBuf, Cached>,
    path: Option<PathBuf>,
    changed: bool,
    /// An entry whose ctime is this late or later may have changed again within the
    /// same clock tick after it was hashed (file times are coarse): it is hashed again,
    /// as git does with a "racy" index entry.
    racy_from_ns: i64,
}

/// Entries kept at most; past it, those not seen by the last plan go.
const CACHE_MAX_ENTRIES: usize = 200_000;
const CACHE_HEADER: &str = "skillbox-hash-cache 2";
/// How far before the cache's writing a ctime still counts as racy.
const RACY_NS: i64 = 2_000_000_000;

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Cached {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    sha256: String,
}

impl Cached {
    fn of(meta: &std::fs::Metadata, sha256: String) -> Cached {
        Cached {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime().saturating_mul(1_000_000_000) + meta.mtime_nsec(),
            ctime_ns: meta.ctime().saturating_mul(1_000_000_000) + meta.ctime_nsec(),
            sha256,
        }
    }

    fn same_file(&self, meta: &std::fs::Metadata) -> bool {
        self.ino == meta.ino()
            && self.size == meta.size()
            && self.mtime_ns == meta.mtime().saturating_mul(1_000_000_000) + meta.mtime_nsec()
            && self.ctime_ns == meta.ctime().saturating_mul(1_000_000_000) + meta.ctime_nsec()
            && self.dev == meta.dev()
    }
}

/// A path on one line: `\`, tab, newline and carriage return escaped.
fn escape(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(text: &str) -> String {
    if !text.contains('\\') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

fn parse_line(line: &str) -> Option<(PathBuf, Cached)> {
    let mut fields = line.splitn(7, '\t');
    let sha256 = fields.next()?.to_string();
    if sha256.len() != 64 {
        return None;
    }
    let dev = fields.next()?.parse().ok()?;
    let ino = fields.next()?.parse().ok()?;
    let size = fields.next()?.parse().ok()?;
    let mtime_ns = fields.next()?.parse().ok()?;
    let ctime_ns = fields.next()?.parse().ok()?;
    let path = PathBuf::from(unescape(fields.next()?));
    Some((
        path,
        Cached {
            dev,
            ino,
            size,
            mtime_ns,
            ctime_ns,
            sha256,
        },
    ))
}

impl HashCache {
    /// The cache kept at `path` (empty when there is none, or it cannot be read).
    pub fn open(path: &Path) -> HashCache {
        let mut cache = HashCache {
            path: Some(path.to_path_buf()),
            ..HashCache::default()
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return cache;
        };
        let mut lines = text.lines();
        let saved_at = lines
            .next()
            .and_then(|header| header.strip_prefix(CACHE_HEADER))
            .and_then(|rest| rest.trim().parse::<i64>().ok());
        let Some(saved_at) = saved_at else {
            return cache;
        };
        cache.racy_from_ns = saved_at - RACY_NS;
        cache.entries = HashMap::with_capacity(text.len() / 100);
        cache.entries.extend(lines.filter_map(parse_line));
        cache
    }

    /// A cache that is never written.
    pub fn in_memory() -> HashCache {
        HashCache::default()
    }

    #[cfg(test)]
    fn hash(&mut self, path: &Path, meta: &std::fs::Metadata) -> std::io::Result<String> {
        let root = path.parent().unwrap_or(Path::new("/"));
        self.hash_with(path, meta, || open_beneath(root, path, false))
    }

    /// The hash of the file `meta` describes, keyed by `path`, reading it through `open`
    /// when the cache does not have it.
    fn hash_with(
        &mut self,
        path: &Path,
        meta: &std::fs::Metadata,
        open: impl FnOnce() -> std::io::Result<std::fs::File>,
    ) -> std::io::Result<String> {
        if let Some(cached) = self.entries.get(path)
            && cached.same_file(meta)
            && cached.ctime_ns < self.racy_from_ns
        {
            return Ok(cached.sha256.clone());
        }
        let mut hasher = Sha256::new();
        let mut file = open()?;
        // The file read is the one the cache entry describes.
        let meta = file.metadata()?;
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
            .insert(path.to_path_buf(), Cached::of(&meta, sha256.clone()));
        self.changed = true;
        Ok(sha256)
    }

    /// Writes the cache back (through a temp file) when it changed; past
    /// `CACHE_MAX_ENTRIES`, only the files `seen` this time stay.
    pub fn save(&mut self, seen: &[ProjectedFile]) {
        if self.entries.len() > CACHE_MAX_ENTRIES {
            let keep: std::collections::HashSet<&Path> =
                seen.iter().map(|f| f.host.as_path()).collect();
            self.entries.retain(|path, _| keep.contains(path.as_path()));
            self.changed = true;
        }
        if !self.changed {
            return;
        }
        let Some(path) = &self.path else {
            return;
        };
        let mut text = String::with_capacity(self.entries.len() * 160);
        text.push_str(CACHE_HEADER);
        text.push_str(&format!(" {}\n", now_ns()));
        for (file, cached) in &self.entries {
            use std::fmt::Write;
            let _ = writeln!(
                text,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                cached.sha256,
                cached.dev,
                cached.ino,
                cached.size,
                cached.mtime_ns,
                cached.ctime_ns,
                escape(file)
            );
        }
        let temp = path.with_extension("tmp");
        if std::fs::write(&temp, text)
            .and_then(|()| std::fs::rename(&temp, path))
            .is_err()
        {
            let _ = std::fs::remove_file(&temp);
            tracing::debug!(path = %path.display(), "projection: the hash cache was not saved");
        }
        self.changed = false;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

    /// The file at `host` under the projected root `root` (through the symlink `host`
    /// when `through_link`), whose `stat` is `meta`, as `to`.
    fn file(
        &mut self,
        root: &Path,
        host: &Path,
        meta: &std::fs::Metadata,
        through_link: bool,
        to: PathBuf,
    ) -> EnvResult<()> {
        use std::os::unix::fs::PermissionsExt;
        let sha256 = self
            .cache
            .hash_with(host, meta, || open_beneath(root, host, through_link))
            .map_err(|e| io_error(&e, "read", host))?;
        self.projection.bytes += meta.len();
        self.projection.files.push(ProjectedFile {
            path: to,
            host: host.to_path_buf(),
            size: meta.len(),
            executable: meta.permissions().mode() & 0o111 != 0,
            sha256,
            root: root.to_path_buf(),
            through_link,
        });
        Ok(())
    }

    /// The projected root `root` (a file or a folder) as `to`. A root that is a symlink
    /// is left out, with a note: a link named `AGENTS.md` to the workspace's `.env` is
    /// not the workspace's agents file, whatever its name says. A root that is a file
    /// is then read with `O_NOFOLLOW` beneath its folder, so one swapped for a link
    /// after this look is refused, not followed.
    fn walk(&mut self, root: &Path, to: PathBuf) -> EnvResult<()> {
        let meta = match std::fs::symlink_metadata(root) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(&e, "stat", root)),
        };
        if meta.file_type().is_symlink() {
            self.projection.notes.push(format!(
                "{}: a projected root that is a symlink; left out",
                root.display()
            ));
            return Ok(());
        }
        self.visit(root, root, &meta, to)
    }

    /// One entry whose `lstat` is `meta`.
    fn visit(
        &mut self,
        root_host: &Path,
        host: &Path,
        meta: &std::fs::Metadata,
        to: PathBuf,
    ) -> EnvResult<()> {
        if to.components().count() > MAX_TREE_DEPTH {
            return Err(EnvError::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "projection of {}: {}...: more than the {MAX_TREE_DEPTH} names deep a projection holds; project fewer roots",
                    root_host.display(),
                    to.iter().take(4).collect::<PathBuf>().display()
                ),
            ));
        }
        let file_type = meta.file_type();
        if file_type.is_symlink() {
            // A link to a file inside the same root is projected as that file: resolved
            // by the kernel beneath the root, every link on the way included.
            match open_beneath(root_host, host, true).and_then(|file| file.metadata()) {
                Ok(target_meta) => self.file(root_host, host, &target_meta, true, to)?,
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error()) => {
                    self.projection.notes.push(format!(
                        "{}: a symlink out of {}; left out",
                        host.display(),
                        root_host.display()
                    ))
                }
                Err(_) => self.projection.notes.push(format!(
                    "{}: a symlink to something that is not a file of the same root; left out",
                    host.display()
                )),
            }
        } else if file_type.is_file() {
            self.file(root_host, host, meta, false, to)?;
        } else if file_type.is_dir() {
            self.projection.dirs.push(to.clone());
            // Each entry is stat'ed relative to the directory's fd (as the listing
            // gives it), not by walking its whole path again: an unchanged projection
            // is mostly this.
            let mut entries: Vec<(std::ffi::OsString, std::fs::DirEntry)> = std::fs::read_dir(host)
                .map_err(|e| io_error(&e, "list", host))?
                .filter_map(Result::ok)
                .map(|entry| (entry.file_name(), entry))
                .collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            for (name, entry) in entries {
                let path = entry.path();
                let meta = match entry.metadata() {
                    Ok(meta) => meta,
                    // Gone since the listing.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_error(&e, "stat", &path)),
                };
                self.visit(root_host, &path, &meta, to.join(&name))?;
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
        planner.walk(&skill.dir, skill.projected.clone())?;
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
                planner.walk(&host, relative.to_path_buf())?;
            }
        }
        if let Some(user) = user_skills {
            let to = Path::new(SKILLS_CACHE).join(USER_SOURCE);
            if user.is_dir() {
                planner.projection.dirs.push(PathBuf::from(SKILLS_CACHE));
            }
            planner.walk(user, to)?;
        }
    }
    Ok(finish(planner.projection, cache))
}

/// Sorts what was planned, and fingerprints it.
fn finish(mut projection: Projection, cache: &mut HashCache) -> Projection {
    // The walk visits names in order, so this is usually sorted already.
    if !projection.files.is_sorted_by(|a, b| a.path <= b.path) {
        projection.files.sort_by(|a, b| a.path.cmp(&b.path));
    }
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

/// The most of the marker a fingerprint is read from: its hex digest and a newline.
/// The sandbox's code may have put anything there (a workspace restored from a
/// snapshot brings what earlier runs left), so no more is ever read.
const MARKER_BYTES: u64 = 128;

/// The fingerprint of what was last projected into `env` at `root`, if any: a marker
/// that is not one (too large, not text, not a regular file, unreadable: the run may
/// have made it so) is none.
pub async fn fingerprint_in(
    env: &dyn ExecutionEnv,
    root: &Path,
    cancel: &CancellationToken,
) -> EnvResult<Option<String>> {
    match env
        .read_bytes_max(&root.join(MARKER), MARKER_BYTES, cancel)
        .await
    {
        Ok(bytes) => Ok(String::from_utf8(bytes)
            .ok()
            .map(|text| text.trim().to_string())),
        Err(e)
            if matches!(
                e.code,
                ErrorCode::NotFound
                    | ErrorCode::NotDirectory
                    | ErrorCode::ResourceExhausted
                    | ErrorCode::Invalid
                    | ErrorCode::IsDirectory
                    | ErrorCode::PermissionDenied
            ) =>
        {
            Ok(None)
        }
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
            // At most the size planned (and counted against the tree's bound): a file
            // that grew since is cut there, and the next projection sees the change.
            open_beneath(&file.root, &file.host, file.through_link)
                .and_then(|f| f.take(file.size).read_to_end(&mut data))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_cache_keeps_odd_paths_and_notices_a_change() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let odd = dir.path().join("a\tb\\c\nd.txt");
        std::fs::write(&odd, "one").unwrap_or_else(|e| panic!("{e}"));
        let cache_path = dir.path().join("cache");
        let mut cache = HashCache::open(&cache_path);
        let meta = std::fs::metadata(&odd).unwrap_or_else(|e| panic!("{e}"));
        let first = cache.hash(&odd, &meta).unwrap_or_else(|e| panic!("{e}"));
        cache.save(&[]);
        let mut again = HashCache::open(&cache_path);
        assert_eq!(again.entries.len(), 1);
        assert_eq!(again.entries[&odd].sha256, first);
        assert!(again.entries[&odd].same_file(&meta));
        // Same size, new content, maybe within the same clock tick (so with the same
        // ctime): hashed again, since its ctime is too close to the cache's writing.
        std::fs::write(&odd, "two").unwrap_or_else(|e| panic!("{e}"));
        let meta = std::fs::metadata(&odd).unwrap_or_else(|e| panic!("{e}"));
        let second = again.hash(&odd, &meta).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(first, second);
        assert_eq!(second, hex(&Sha256::digest(b"two")));
    }
}

#[cfg(test)]
mod racy_tests {
    use super::*;

    #[test]
    fn an_old_enough_entry_is_trusted_without_reading_the_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("f");
        std::fs::write(&file, "content").unwrap_or_else(|e| panic!("{e}"));
        let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{e}"));
        let cache_path = dir.path().join("cache");
        // A cache written long after the file's ctime: its entry is not racy.
        let line = format!(
            "{CACHE_HEADER} {}\n{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            now_ns() + 10 * RACY_NS,
            "ab".repeat(32),
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
            escape(&file)
        );
        std::fs::write(&cache_path, line).unwrap_or_else(|e| panic!("{e}"));
        let mut cache = HashCache::open(&cache_path);
        // The cached (deliberately wrong) hash is what comes back: the file was not read.
        assert_eq!(
            cache.hash(&file, &meta).unwrap_or_else(|e| panic!("{e}")),
            "ab".repeat(32)
        );
        // A header it does not know: nothing trusted.
        std::fs::write(&cache_path, "something else\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(HashCache::open(&cache_path).entries.is_empty());
    }
}
