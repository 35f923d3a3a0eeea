//! Collecting what a run produced: walks the workspace through the env's own
//! [`FileSystem`](skillbox_env::FileSystem) — never `std::fs` — so it works on every
//! backend and sees only what the env's code could see. Symlinks are never followed and
//! special files (FIFOs, sockets, devices) never opened: code in the sandbox cannot make
//! the collector read something outside the workspace, or block on a pipe.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use skillbox_env::path::normalize;
use skillbox_env::{CancellationToken, EnvError, ErrorCode, ExecutionEnv, FileKind};

use crate::error::{CollectLimit, StoreError};
use crate::store::{ArtifactStore, sha256_hex};

/// The env's scratch area at the top of the workspace: never an artifact.
const SCRATCH_DIR: &str = ".tmp";

/// How many puts [`store_all`] runs at once.
const PARALLEL_PUTS: usize = 4;

/// Bounds on what one collection may gather. Exceeding any of them fails the whole
/// collection: nothing partial is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectLimits {
    /// Files collected (unchanged inputs do not count).
    pub max_files: usize,
    /// Bytes of all collected files together.
    pub max_total_bytes: u64,
    /// Bytes of any one file read, inputs included: telling an unchanged input from a
    /// changed one means reading it.
    pub max_file_bytes: u64,
}

impl Default for CollectLimits {
    fn default() -> Self {
        CollectLimits {
            max_files: 1000,
            max_total_bytes: 256 << 20,
            max_file_bytes: 64 << 20,
        }
    }
}

/// One file a run produced or changed, with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectedFile {
    /// Relative to the collection root, `/`-separated.
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub content_type: String,
    pub bytes: Bytes,
}

/// A collected file once it is in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredArtifact {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub content_type: String,
}

/// The files under `root` that a run created or changed, sorted by path.
///
/// `inputs` maps the relative paths of the files the run was given to the sha256 of
/// their content; such a file is skipped while its content is unchanged. Symlinks,
/// special files and a top-level `.tmp` directory are skipped. Exceeding a limit is an
/// error (code `resource_exhausted`) naming the limit and the file.
pub async fn collect_artifacts(
    env: &dyn ExecutionEnv,
    root: &Path,
    inputs: &BTreeMap<PathBuf, String>,
    limits: CollectLimits,
    cancel: &CancellationToken,
) -> Result<Vec<CollectedFile>, StoreError> {
    let root = env.absolute(root);
    let info = env.file_info(&root, cancel).await?;
    if info.kind != FileKind::Dir {
        return Err(EnvError::new(
            ErrorCode::NotDirectory,
            format!(
                "collect {}: not a directory (a symlink is not followed)",
                root.display()
            ),
        )
        .with_path(&root)
        .into());
    }
    let inputs = relative_inputs(&root, inputs);
    let mut collected = Vec::new();
    let mut total: u64 = 0;
    // Directories still to list: (absolute path, relative path with `/`).
    let mut pending = vec![(root.clone(), String::new())];
    while let Some((dir, rel_dir)) = pending.pop() {
        for entry in env.list_dir(&dir, cancel).await? {
            if cancel.is_cancelled() {
                return Err(EnvError::aborted("collect").into());
            }
            let rel = if rel_dir.is_empty() {
                entry.name.clone()
            } else {
                format!("{rel_dir}/{}", entry.name)
            };
            let abs = dir.join(&entry.name);
            match entry.kind {
                FileKind::Dir if rel_dir.is_empty() && entry.name == SCRATCH_DIR => {}
                FileKind::Dir => pending.push((abs, rel)),
                FileKind::File => {
                    let input = inputs.get(rel.as_str()).copied();
                    // A new file would be one too many: fail before reading it. (A changed
                    // input is only known to count once read.)
                    if input.is_none() && collected.len() >= limits.max_files {
                        return Err(StoreError::TooMany {
                            path: rel,
                            max: limits.max_files,
                        });
                    }
                    let file = read_file(env, &abs, &rel, input, limits, total, cancel).await?;
                    let Some(file) = file else { continue };
                    if collected.len() >= limits.max_files {
                        return Err(StoreError::TooMany {
                            path: rel,
                            max: limits.max_files,
                        });
                    }
                    total = checked_total(total, file.size, &rel, limits)?;
                    collected.push(file);
                }
                FileKind::Symlink | FileKind::Other => {
                    tracing::debug!(path = %rel, kind = ?entry.kind, "collect: skipped, not a regular file");
                }
            }
        }
    }
    collected.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(collected)
}

/// Reads one regular file, or says to skip it (an unchanged input, or gone meanwhile).
async fn read_file(
    env: &dyn ExecutionEnv,
    abs: &Path,
    rel: &str,
    input_sha256: Option<&str>,
    limits: CollectLimits,
    total: u64,
    cancel: &CancellationToken,
) -> Result<Option<CollectedFile>, StoreError> {
    let too_large = |size| StoreError::TooLarge {
        path: rel.to_string(),
        limit: CollectLimit::MaxFileBytes,
        size,
        max: limits.max_file_bytes,
    };
    let info = match env.file_info(abs, cancel).await {
        Ok(info) => info,
        Err(e) if e.code == ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // Replaced since it was listed: judge it by what it is now.
    if info.kind != FileKind::File {
        return Ok(None);
    }
    if info.size > limits.max_file_bytes {
        return Err(too_large(info.size));
    }
    if input_sha256.is_none() {
        checked_total(total, info.size, rel, limits)?;
    }
    let bytes = match env.read_bytes(abs, cancel).await {
        Ok(bytes) => bytes,
        Err(e) if e.code == ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let size = bytes.len() as u64;
    // It may have grown between the stat and the read.
    if size > limits.max_file_bytes {
        return Err(too_large(size));
    }
    let sha256 = sha256_hex(&bytes);
    if input_sha256 == Some(sha256.as_str()) {
        return Ok(None);
    }
    Ok(Some(CollectedFile {
        path: rel.to_string(),
        size,
        content_type: content_type(rel).to_string(),
        sha256,
        bytes: Bytes::from(bytes),
    }))
}

/// `total + size`, or the `max_total_bytes` error.
fn checked_total(
    total: u64,
    size: u64,
    rel: &str,
    limits: CollectLimits,
) -> Result<u64, StoreError> {
    match total.checked_add(size) {
        Some(sum) if sum <= limits.max_total_bytes => Ok(sum),
        sum => Err(StoreError::TooLarge {
            path: rel.to_string(),
            limit: CollectLimit::MaxTotalBytes,
            size: sum.unwrap_or(u64::MAX),
            max: limits.max_total_bytes,
        }),
    }
}

/// The inputs keyed by `/`-separated paths relative to `root`, as the walk names files
/// (`./a.txt` and `a.txt` are one file; an absolute path under `root` is made relative).
fn relative_inputs<'a>(
    root: &Path,
    inputs: &'a BTreeMap<PathBuf, String>,
) -> BTreeMap<String, &'a str> {
    inputs
        .iter()
        .filter_map(|(path, sha256)| {
            // Joining keeps an absolute path as it is; one that leaves `root` is dropped.
            let full = normalize(&root.join(path));
            let rel = full.strip_prefix(root).ok()?;
            let parts: Vec<&str> = rel
                .components()
                .filter_map(|c| match c {
                    Component::Normal(part) => part.to_str(),
                    _ => None,
                })
                .collect();
            Some((parts.join("/"), sha256.as_str()))
        })
        .collect()
}

/// The MIME type for a file name, from its extension.
pub fn content_type(path: &str) -> &'static str {
    mime_guess::from_path(path)
        .first_raw()
        .unwrap_or("application/octet-stream")
}

/// Puts every file in the store; returns them without their bytes, in the same order.
pub async fn store_all(
    store: &ArtifactStore,
    files: Vec<CollectedFile>,
) -> Result<Vec<StoredArtifact>, StoreError> {
    futures_util::stream::iter(files)
        .map(|file| async move {
            let sha256 = store.put_once(file.bytes).await?;
            Ok::<_, StoreError>(StoredArtifact {
                path: file.path,
                size: file.size,
                sha256,
                content_type: file.content_type,
            })
        })
        .buffered(PARALLEL_PUTS)
        .try_collect()
        .await
}
