//! The file half of an env. Paths are the env's own paths (inside a sandbox:
//! `/workspace/...`); relative paths are taken from [`FileSystem::cwd`].

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use async_trait::async_trait;
use serde::Serialize;

use crate::CancellationToken;
use crate::error::{EnvError, EnvResult, ErrorCode};
use crate::path::normalize;

/// The kind of a directory entry. Symlinks are reported, never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

impl FileKind {
    /// Its name, as it is serialized: `file`, `dir`, `symlink` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
    }
}

/// What `file_info` says about a path (the path itself, not a symlink's target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub modified: Option<SystemTime>,
    /// True when the env cannot write here (a read-only mount).
    pub read_only: bool,
}

/// One entry of `list_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
    /// A regular file's size, from the same look at the entry as its kind (a symlink
    /// is not followed): a listing answers sizes without a `file_info` per file, which
    /// on a container backend is a process per file. `None` for anything else.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// The first lines of a text file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TextLines {
    pub lines: Vec<String>,
    /// More lines followed.
    pub truncated: bool,
}

/// One entry of [`FileSystem::walk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WalkEntry {
    /// Relative to the walked directory, `/`-separated.
    pub path: String,
    pub kind: FileKind,
    /// Bytes, for a regular file when it was listed (0 for anything else).
    pub size: u64,
    /// A regular file with an execute bit (false for anything else).
    pub executable: bool,
}

/// What [`FileSystem::read_files`] found at one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    Content(Vec<u8>),
    /// Not there (any more).
    Missing,
    /// There, but not a regular file (a directory, a symlink, a FIFO…): not opened.
    NotFile,
    /// A regular file of more than the cap, and its size.
    TooLarge(u64),
}

/// Most entries one [`Tree`] holds.
pub const MAX_TREE_ENTRIES: usize = 100_000;
/// Most file bytes one [`Tree`] holds.
pub const MAX_TREE_BYTES: u64 = 1 << 30;
/// Most names in one path of a [`Tree`] (and of a snapshot or a projection, which become
/// one): a tree of any depth is placed in time linear in its entries, but a deeper one
/// is no workspace anyone needs, and every tool that walks it pays for its depth.
pub const MAX_TREE_DEPTH: usize = 256;

/// Directories and files to place beneath one directory in one operation
/// ([`FileSystem::put_tree`]): what a skills projection or a snapshot restore hands over
/// as one archive. Every path is relative, made of plain names only (no `..`, `.`, root
/// or NUL), checked as it is added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    entries: Vec<TreeEntry>,
    bytes: u64,
}

/// One entry of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub path: PathBuf,
    pub kind: TreeKind,
}

/// A directory, or a file with its content and whether it is executable (0755, else
/// 0644: never setuid, setgid or sticky).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeKind {
    Dir,
    File {
        data: bytes::Bytes,
        executable: bool,
    },
}

impl Tree {
    pub fn new() -> Tree {
        Tree::default()
    }

    fn check(&self, path: &Path) -> EnvResult<()> {
        use std::os::unix::ffi::OsStrExt;
        let plain = !path.as_os_str().is_empty()
            && !path.as_os_str().as_bytes().contains(&0)
            && path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(EnvError::invalid(format!(
                "tree entry {}: give a relative path of plain names (no `..`, `.` or `/` at the start)",
                path.display()
            )));
        }
        let depth = path.components().count();
        if depth > MAX_TREE_DEPTH {
            return Err(EnvError::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "tree entry {}...: {depth} names deep, more than the {MAX_TREE_DEPTH} a tree holds",
                    path.iter().take(8).collect::<PathBuf>().display()
                ),
            ));
        }
        if self.entries.len() >= MAX_TREE_ENTRIES {
            return Err(EnvError::new(
                ErrorCode::ResourceExhausted,
                format!("a tree holds at most {MAX_TREE_ENTRIES} entries"),
            ));
        }
        Ok(())
    }

    /// Adds a directory (its parents are made as needed).
    pub fn dir(&mut self, path: impl Into<PathBuf>) -> EnvResult<()> {
        let path = path.into();
        self.check(&path)?;
        self.entries.push(TreeEntry {
            path,
            kind: TreeKind::Dir,
        });
        Ok(())
    }

    /// Adds a file (its parents are made as needed).
    pub fn file(
        &mut self,
        path: impl Into<PathBuf>,
        data: impl Into<bytes::Bytes>,
        executable: bool,
    ) -> EnvResult<()> {
        let path = path.into();
        self.check(&path)?;
        let data = data.into();
        let bytes = self.bytes + data.len() as u64;
        if bytes > MAX_TREE_BYTES {
            return Err(EnvError::new(
                ErrorCode::ResourceExhausted,
                format!("a tree holds at most {MAX_TREE_BYTES} bytes of files"),
            ));
        }
        self.bytes = bytes;
        self.entries.push(TreeEntry {
            path,
            kind: TreeKind::File { data, executable },
        });
        Ok(())
    }

    /// In the order they were added.
    pub fn entries(&self) -> &[TreeEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of file content.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// File operations, confined to what the env's processes can see.
#[async_trait]
pub trait FileSystem: Send + Sync {
    /// The directory relative paths start from.
    fn cwd(&self) -> &Path;

    /// `path` made absolute against `cwd` and normalized (`.`/`..` removed lexically).
    fn absolute(&self, path: &Path) -> PathBuf {
        normalize(&self.cwd().join(path))
    }

    /// `base` joined with `relative`, normalized.
    fn join(&self, base: &Path, relative: &Path) -> PathBuf {
        normalize(&self.absolute(base).join(relative))
    }

    /// The path with every symlink resolved, as the env's processes would resolve it.
    async fn canonical(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<PathBuf>;

    async fn exists(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<bool>;

    async fn file_info(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<FileInfo>;

    /// Entries sorted by name; symlinks are listed as symlinks, not followed. More than
    /// [`MAX_LIST_ENTRIES`] is a `resource_exhausted` error ([`too_many_to_list`]): the
    /// listing is bounded whatever the sandboxed code put in the directory.
    async fn list_dir(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<DirEntry>>;

    /// Reads a UTF-8 file (invalid UTF-8 is `invalid`).
    async fn read_text(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<String>;

    /// Reads at most `max` lines.
    async fn read_text_lines(
        &self,
        path: &Path,
        max: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<TextLines>;

    async fn read_bytes(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<u8>>;

    /// Reads the regular file at `path` (a final symlink is not followed: `invalid`),
    /// at most `max_bytes` of it: the file is opened once and no more than `max_bytes +
    /// 1` bytes are read from that open file, so one swapped in or grown since a stat
    /// is refused like one that was too large all along ([`too_large_to_read`],
    /// `resource_exhausted`), without the rest being read.
    async fn read_bytes_max(
        &self,
        path: &Path,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<u8>>;

    /// Creates or replaces a file (atomically: readers see the old or the new content).
    async fn write(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()>;

    async fn append(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()>;

    /// Atomic rename; replaces an existing file at `to`.
    async fn rename(&self, from: &Path, to: &Path, cancel: &CancellationToken) -> EnvResult<()>;

    /// Removes a file, a symlink, or (with `recursive`) a directory tree.
    async fn remove(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()>;

    async fn create_dir(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()>;

    /// A new empty directory inside the env; `cleanup` removes it.
    async fn create_temp_dir(&self, prefix: &str, cancel: &CancellationToken)
    -> EnvResult<PathBuf>;

    /// A new empty file inside the env; `cleanup` removes it.
    async fn create_temp_file(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf>;

    /// Removes everything this env created for itself (temp dirs, a temp workspace) and
    /// ends anything still running. The env is unusable afterwards.
    async fn cleanup(&self) -> EnvResult<()>;

    /// Everything below the directory `root`, relative to it, each directory's entries
    /// after the directory itself. Symlinks are listed, never followed (`root` included).
    /// The directories named in `prune` (relative to `root`) are listed but not entered.
    /// More than `max_entries` entries is a `resource_exhausted` error.
    ///
    /// The default lists each directory and stats each file; a backend for which every
    /// operation is a round trip does it in one.
    async fn walk(
        &self,
        root: &Path,
        prune: &[&str],
        max_entries: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<WalkEntry>> {
        let root = self.absolute(root);
        if self.file_info(&root, cancel).await?.kind != FileKind::Dir {
            return Err(EnvError::new(
                ErrorCode::NotDirectory,
                format!(
                    "walk {}: not a directory (a symlink is not followed)",
                    root.display()
                ),
            )
            .with_path(&root));
        }
        let mut entries = Vec::new();
        let mut pending = std::collections::VecDeque::from([(root.clone(), String::new())]);
        while let Some((dir, rel_dir)) = pending.pop_front() {
            for entry in self.list_dir(&dir, cancel).await? {
                let path = if rel_dir.is_empty() {
                    entry.name.clone()
                } else {
                    format!("{rel_dir}/{}", entry.name)
                };
                let abs = dir.join(&entry.name);
                let (size, executable) = match entry.kind {
                    FileKind::File => match self.file_info(&abs, cancel).await {
                        Ok(info) => (info.size, info.mode & 0o111 != 0),
                        // Gone since the listing.
                        Err(e) if e.code == ErrorCode::NotFound => continue,
                        Err(e) => return Err(e),
                    },
                    FileKind::Dir => {
                        if !prune.contains(&path.as_str()) {
                            pending.push_back((abs, path.clone()));
                        }
                        (0, false)
                    }
                    FileKind::Symlink | FileKind::Other => (0, false),
                };
                entries.push(WalkEntry {
                    path,
                    kind: entry.kind,
                    size,
                    executable,
                });
                if entries.len() > max_entries {
                    return Err(too_many_entries(&root, max_entries));
                }
            }
        }
        Ok(entries)
    }

    /// Places `tree` beneath the directory `dir` (made, with its parents, if missing),
    /// in one operation where the backend can (one round trip on docker): each directory
    /// made, each file created or replaced atomically with the tree's mode (0755 or
    /// 0644) and owned as the env's own files are. A symlink at a file's path is
    /// replaced, never written through; nothing is written outside what the env's
    /// processes may write. A non-directory where a directory goes is `not_directory`,
    /// a directory where a file goes `is_directory`; what was placed before that stays.
    async fn put_tree(&self, dir: &Path, tree: &Tree, cancel: &CancellationToken) -> EnvResult<()> {
        let _ = (dir, tree, cancel);
        Err(EnvError::new(
            ErrorCode::NotSupported,
            "put_tree: this env cannot place a tree of files",
        ))
    }

    /// The content of each of `paths`, read only where it is a regular file of at most
    /// `max_bytes` (a symlink is not followed); see [`FileRead`].
    ///
    /// The default stats each and reads it with [`FileSystem::read_bytes_max`], so one
    /// that grew since the stat is never read past the cap; a backend for which every
    /// operation is a round trip reads them together.
    async fn read_files(
        &self,
        paths: &[PathBuf],
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<FileRead>> {
        let mut read = Vec::with_capacity(paths.len());
        for path in paths {
            let info = match self.file_info(path, cancel).await {
                Ok(info) => info,
                Err(e) if e.code == ErrorCode::NotFound => {
                    read.push(FileRead::Missing);
                    continue;
                }
                Err(e) => return Err(e),
            };
            read.push(if info.kind != FileKind::File {
                FileRead::NotFile
            } else if info.size > max_bytes {
                FileRead::TooLarge(info.size)
            } else {
                match self.read_bytes_max(path, max_bytes, cancel).await {
                    Ok(bytes) => FileRead::Content(bytes),
                    // It grew since the stat, or another file took its place: what was
                    // read stopped one byte past the cap.
                    Err(e) if e.code == ErrorCode::ResourceExhausted => {
                        FileRead::TooLarge(info.size.max(max_bytes.saturating_add(1)))
                    }
                    Err(e) if e.code == ErrorCode::NotFound => FileRead::Missing,
                    // Replaced by a directory, a symlink or a special file since the stat.
                    Err(e) if matches!(e.code, ErrorCode::IsDirectory | ErrorCode::Invalid) => {
                        FileRead::NotFile
                    }
                    Err(e) => return Err(e),
                }
            });
        }
        Ok(read)
    }
}

/// The error of a [`FileSystem::walk`] that found more than `max` entries.
pub fn too_many_entries(root: &Path, max: usize) -> EnvError {
    EnvError::new(
        ErrorCode::ResourceExhausted,
        format!("walk {}: more than {max} entries", root.display()),
    )
    .with_path(root)
}

/// The most entries [`FileSystem::list_dir`] gives (as many as artifact collection
/// walks in all): a directory of a million files must not become a listing of 100 MB.
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// The length of `text` as a JSON string's content: what serde_json escapes, longer (a
/// control byte takes six).
pub fn json_string_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

/// At most the length of `entries` as compact JSON (`[{"name","kind","size"},…]`): each
/// name as JSON escapes it and 64 bytes for the rest of its entry. What a listing sent
/// as JSON takes, known before it is made.
pub fn listing_json_len(entries: &[DirEntry]) -> usize {
    entries
        .iter()
        .map(|entry| json_string_len(&entry.name) + 64)
        .sum::<usize>()
        + 2
}

/// The error of a [`FileSystem::list_dir`] that found more than [`MAX_LIST_ENTRIES`].
pub fn too_many_to_list(dir: &Path) -> EnvError {
    EnvError::new(
        ErrorCode::ResourceExhausted,
        format!(
            "list {}: more than {MAX_LIST_ENTRIES} entries; list a directory beneath it",
            dir.display()
        ),
    )
    .with_path(dir)
}

/// The error of a [`FileSystem::read_bytes_max`] that found more than `max` bytes.
pub fn too_large_to_read(path: &Path, max: u64) -> EnvError {
    EnvError::new(
        ErrorCode::ResourceExhausted,
        format!(
            "read {}: more than the {max} bytes a read hands out",
            path.display()
        ),
    )
    .with_path(path)
}

/// The error of a [`FileSystem::read_bytes_max`] that found a symlink at `path`.
pub fn symlink_not_read(path: &Path) -> EnvError {
    EnvError::new(
        ErrorCode::Invalid,
        format!(
            "read {}: a symlink, which a read does not follow",
            path.display()
        ),
    )
    .with_path(path)
}

/// Reads `file` to its end if that is at most `max` bytes, else fails with
/// [`too_large_to_read`] having read `max + 1` bytes: a sparse or growing file cannot
/// make it read more.
pub fn read_at_most(file: impl std::io::Read, max: u64, path: &Path) -> EnvResult<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| EnvError::io(&e, "read", path))?;
    if bytes.len() as u64 > max {
        return Err(too_large_to_read(path, max));
    }
    Ok(bytes)
}

/// Reads at most `max` lines from `reader`.
pub fn first_lines(reader: impl BufRead, max: usize, path: &Path) -> EnvResult<TextLines> {
    let mut lines = Vec::new();
    for line in reader.lines() {
        let line = line.map_err(|e| EnvError::io(&e, "read", path))?;
        if lines.len() == max {
            return Ok(TextLines {
                lines,
                truncated: true,
            });
        }
        lines.push(line);
    }
    Ok(TextLines {
        lines,
        truncated: false,
    })
}

/// Checks that `fd` (opened with `O_NONBLOCK`, so opening a FIFO did not wait for a
/// writer) is a regular file, and makes it blocking again for the read or append. A
/// FIFO, socket or device is refused at once: a planted one can never hang a tool, an
/// agent run or a shutdown.
pub fn regular_file(fd: std::os::fd::OwnedFd, op: &str, path: &Path) -> EnvResult<std::fs::File> {
    use rustix::fs::{FileType, OFlags};
    let stat = rustix::fs::fstat(&fd).map_err(|e| EnvError::io(&e.into(), op, path))?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::RegularFile {
        let what = match kind {
            FileType::Directory => {
                return Err(EnvError::new(
                    ErrorCode::IsDirectory,
                    format!("{op} {}: is a directory", path.display()),
                )
                .with_path(path));
            }
            FileType::Fifo => "a FIFO",
            FileType::Socket => "a socket",
            FileType::CharacterDevice | FileType::BlockDevice => "a device",
            _ => "not a regular file",
        };
        return Err(EnvError::new(
            ErrorCode::Invalid,
            format!(
                "{op} {}: {what}; only regular files are read or appended to",
                path.display()
            ),
        )
        .with_path(path));
    }
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| EnvError::io(&e.into(), op, path))?;
    rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)
        .map_err(|e| EnvError::io(&e.into(), op, path))?;
    Ok(std::fs::File::from(fd))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use crate::HostEnv;

    #[test]
    fn a_kind_is_named_as_it_is_serialized() {
        for kind in [
            FileKind::File,
            FileKind::Dir,
            FileKind::Symlink,
            FileKind::Other,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }

    /// A host env whose `file_info` answers as if each file were 1 byte (a stat taken
    /// before the file grew) and whose `read_bytes` must not be called: what the default
    /// `read_files` does when a file grows between its stat and its read.
    struct StaleStat(HostEnv);

    #[async_trait]
    impl FileSystem for StaleStat {
        fn cwd(&self) -> &Path {
            self.0.cwd()
        }
        async fn canonical(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<PathBuf> {
            self.0.canonical(path, cancel).await
        }
        async fn exists(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<bool> {
            self.0.exists(path, cancel).await
        }
        async fn file_info(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<FileInfo> {
            let info = self.0.file_info(path, cancel).await?;
            Ok(FileInfo { size: 1, ..info })
        }
        async fn list_dir(
            &self,
            path: &Path,
            cancel: &CancellationToken,
        ) -> EnvResult<Vec<DirEntry>> {
            self.0.list_dir(path, cancel).await
        }
        async fn read_text(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<String> {
            self.0.read_text(path, cancel).await
        }
        async fn read_text_lines(
            &self,
            path: &Path,
            max: usize,
            cancel: &CancellationToken,
        ) -> EnvResult<TextLines> {
            self.0.read_text_lines(path, max, cancel).await
        }
        async fn read_bytes(&self, path: &Path, _: &CancellationToken) -> EnvResult<Vec<u8>> {
            panic!("{} was read whole", path.display())
        }
        async fn read_bytes_max(
            &self,
            path: &Path,
            max_bytes: u64,
            cancel: &CancellationToken,
        ) -> EnvResult<Vec<u8>> {
            self.0.read_bytes_max(path, max_bytes, cancel).await
        }
        async fn write(
            &self,
            path: &Path,
            data: &[u8],
            cancel: &CancellationToken,
        ) -> EnvResult<()> {
            self.0.write(path, data, cancel).await
        }
        async fn append(
            &self,
            path: &Path,
            data: &[u8],
            cancel: &CancellationToken,
        ) -> EnvResult<()> {
            self.0.append(path, data, cancel).await
        }
        async fn rename(
            &self,
            from: &Path,
            to: &Path,
            cancel: &CancellationToken,
        ) -> EnvResult<()> {
            self.0.rename(from, to, cancel).await
        }
        async fn remove(
            &self,
            path: &Path,
            recursive: bool,
            cancel: &CancellationToken,
        ) -> EnvResult<()> {
            self.0.remove(path, recursive, cancel).await
        }
        async fn create_dir(
            &self,
            path: &Path,
            recursive: bool,
            cancel: &CancellationToken,
        ) -> EnvResult<()> {
            self.0.create_dir(path, recursive, cancel).await
        }
        async fn create_temp_dir(
            &self,
            prefix: &str,
            cancel: &CancellationToken,
        ) -> EnvResult<PathBuf> {
            self.0.create_temp_dir(prefix, cancel).await
        }
        async fn create_temp_file(
            &self,
            prefix: &str,
            cancel: &CancellationToken,
        ) -> EnvResult<PathBuf> {
            self.0.create_temp_file(prefix, cancel).await
        }
        async fn cleanup(&self) -> EnvResult<()> {
            self.0.cleanup().await
        }
    }

    #[tokio::test]
    async fn read_files_never_reads_a_file_grown_since_its_stat_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let env = StaleStat(HostEnv::new(dir.path(), dir.path().join("tmp")));
        let live = CancellationToken::new();
        env.write(Path::new("grown.bin"), &[7u8; 1000], &live)
            .await
            .unwrap();
        env.write(Path::new("small.txt"), b"small", &live)
            .await
            .unwrap();
        let read = env
            .read_files(
                &[PathBuf::from("grown.bin"), PathBuf::from("small.txt")],
                10,
                &live,
            )
            .await
            .unwrap();
        assert_eq!(
            read,
            [FileRead::TooLarge(11), FileRead::Content(b"small".to_vec())]
        );
    }
}
