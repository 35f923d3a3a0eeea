//! The file half of an env. Paths are the env's own paths (inside a sandbox:
//! `/workspace/...`); relative paths are taken from [`FileSystem::cwd`].

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use async_trait::async_trait;
use serde::Serialize;

use crate::CancellationToken;
use crate::error::{EnvError, EnvResult};
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
}

/// The first lines of a text file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TextLines {
    pub lines: Vec<String>,
    /// More lines followed.
    pub truncated: bool,
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

    /// Entries sorted by name; symlinks are listed as symlinks, not followed.
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
