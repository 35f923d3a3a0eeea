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
use skillbox_env::{CancellationToken, EnvError, ErrorCode, ExecutionEnv, FileKind, FileRead};
use skillbox_protocol::OutputSelection;

use crate::error::{CollectLimit, StoreError};
use crate::store::{ArtifactStore, sha256_hex};

/// The env's scratch area at the top of the workspace: never an artifact.
pub(crate) const SCRATCH_DIR: &str = ".tmp";

/// Entries (files, directories, links) a workspace may hold for a collection to list it.
const MAX_ENTRIES: usize = 100_000;

/// Bytes (as listed) read together in one `read_files` call.
const READ_CHUNK_BYTES: u64 = 64 << 20;

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

/// The walk [`collect_artifacts`] makes of `root` (absolute), for an exec to announce
/// ([`skillbox_env::ExecRequest::walk_after`]).
pub fn collection_walk(root: &Path) -> skillbox_env::WalkAfter {
    skillbox_env::WalkAfter {
        root: root.to_path_buf(),
        prune: vec![SCRATCH_DIR.to_string()],
        max_entries: MAX_ENTRIES,
    }
}

/// The files under `root` that a run created or changed, sorted by path.
///
/// `inputs` maps the relative paths of the files the run was given to the sha256 of
/// their content; such a file is skipped while its content is unchanged. Only files
/// `outputs` selects are collected (by default none with a hidden component: no
/// `.git/config` comes back unless asked for). Symlinks, special files and a top-level
/// `.tmp` directory are skipped. Exceeding a limit is an error (code
/// `resource_exhausted`) naming the limit and the file; files not selected never count.
pub async fn collect_artifacts(
    env: &dyn ExecutionEnv,
    root: &Path,
    inputs: &BTreeMap<PathBuf, String>,
    outputs: &OutputSelection,
    limits: CollectLimits,
    cancel: &CancellationToken,
) -> Result<Vec<CollectedFile>, StoreError> {
    let root = env.absolute(root);
    // One listing of the whole tree, then one batch of reads: on a backend where each
    // file operation is a round trip (docker, gvisor), a handful of them, not a few per file.
    let entries = match env.walk(&root, &[SCRATCH_DIR], MAX_ENTRIES, cancel).await {
        Ok(entries) => entries,
        Err(e) if e.code == ErrorCode::NotDirectory => {
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
        Err(e) => return Err(e.into()),
    };
    if cancel.is_cancelled() {
        return Err(EnvError::aborted("collect").into());
    }
    let inputs = relative_inputs(&root, inputs);
    let mut files: Vec<(String, Option<&str>, u64)> = Vec::new();
    // Judged by the sizes listed, before anything is read: a file over the cap, one new
    // file too many, or new files over the total fail without being read.
    let (mut new_files, mut listed_total) = (0usize, 0u64);
    for entry in entries {
        if entry.kind != FileKind::File {
            if entry.kind != FileKind::Dir {
                tracing::debug!(path = %entry.path, kind = ?entry.kind, "collect: skipped, not a regular file");
            }
            continue;
        }
        if !outputs.selects(&entry.path) {
            tracing::debug!(path = %entry.path, "collect: skipped, not selected by the outputs");
            continue;
        }
        if entry.size > limits.max_file_bytes {
            return Err(too_large(&entry.path, entry.size, limits));
        }
        let input = inputs.get(entry.path.as_str()).copied();
        if input.is_none() {
            new_files += 1;
            if new_files > limits.max_files {
                return Err(StoreError::TooMany {
                    path: entry.path,
                    max: limits.max_files,
                });
            }
            listed_total = checked_total(listed_total, entry.size, &entry.path, limits)?;
        }
        files.push((entry.path, input, entry.size));
    }
    let mut collected = Vec::new();
    let mut total: u64 = 0;
    // Read in chunks, the limits checked after each: inputs are not in the listed total
    // (an unchanged one does not count), so what is held stays near the collected total
    // plus one chunk, whatever the inputs have become.
    let mut files = files.into_iter().peekable();
    while files.peek().is_some() {
        let mut chunk = Vec::new();
        let mut chunk_bytes = 0u64;
        while let Some((rel, input, size)) = files.next_if(|_| chunk_bytes < READ_CHUNK_BYTES) {
            chunk_bytes += size.max(1);
            chunk.push((rel, input));
        }
        let paths: Vec<PathBuf> = chunk.iter().map(|(rel, _)| root.join(rel)).collect();
        let read = env
            .read_files(&paths, limits.max_file_bytes, cancel)
            .await?;
        collect_chunk(chunk, read, limits, &mut collected, &mut total)?;
    }
    collected.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(collected)
}

/// Adds what one chunk read to `collected`, with the limits.
fn collect_chunk(
    chunk: Vec<(String, Option<&str>)>,
    read: Vec<FileRead>,
    limits: CollectLimits,
    collected: &mut Vec<CollectedFile>,
    total: &mut u64,
) -> Result<(), StoreError> {
    for ((rel, input), read) in chunk.into_iter().zip(read) {
        let bytes = match read {
            FileRead::Content(bytes) => bytes,
            // Gone, or replaced by something else, since the listing.
            FileRead::Missing | FileRead::NotFile => continue,
            // Grown since the listing.
            FileRead::TooLarge(size) => return Err(too_large(&rel, size, limits)),
        };
        let sha256 = sha256_hex(&bytes);
        if input == Some(sha256.as_str()) {
            continue;
        }
        // A changed input counts, which is only known once it is read.
        if collected.len() >= limits.max_files {
            return Err(StoreError::TooMany {
                path: rel,
                max: limits.max_files,
            });
        }
        let size = bytes.len() as u64;
        *total = checked_total(*total, size, &rel, limits)?;
        collected.push(CollectedFile {
            content_type: content_type(&rel).to_string(),
            path: rel,
            size,
            sha256,
            bytes: Bytes::from(bytes),
        });
    }
    Ok(())
}

fn too_large(rel: &str, size: u64, limits: CollectLimits) -> StoreError {
    StoreError::TooLarge {
        path: rel.to_string(),
        limit: CollectLimit::MaxFileBytes,
        size,
        max: limits.max_file_bytes,
    }
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
    // All of it fits the store's budget, or none of it is written.
    store
        .check_room_for(files.iter().map(|file| &file.bytes))
        .await?;
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
