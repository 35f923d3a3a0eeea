//! The file view of a docker sandbox: every operation runs inside the container as the
//! sandbox's user (`helpers/fs.py`), so it sees exactly what the sandbox's processes
//! see, and never blocks on what they planted (FIFOs, sockets, devices are refused).

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use skillbox_env::{
    CancellationToken, DirEntry, EnvError, EnvResult, ErrorCode, FileInfo, FileKind, FileRead,
    FileSystem, MAX_LIST_ENTRIES, TextLines, Tree, TreeKind, WalkEntry, first_lines,
    too_large_to_read, too_many_entries,
};

use crate::daemon::{Collected, MAX_READ_BYTES, collect_exec};
use crate::runtime::{helper_argv, walkread_args};
use crate::sandbox::DockerSandbox;

/// What one `readmany` helper run prints at most, about: the files after that go to
/// the next run.
const READ_BATCH_BYTES: u64 = 256 * 1024 * 1024;
/// The largest file `read_files` reads: a run's output must hold it after a batch.
const READ_MAX_FILE_BYTES: u64 = MAX_READ_BYTES as u64 - READ_BATCH_BYTES - 4096;
impl DockerSandbox {
    /// The walk in the file helper's `walkread` output `out` (its listing, then what it
    /// read ahead, kept for `generation`): `None` when `out` is not such an output, an
    /// error when it lists more than `max_entries`.
    fn parse_walk(
        &self,
        root: &Path,
        out: &[u8],
        max_entries: usize,
        generation: u64,
    ) -> Option<EnvResult<Vec<WalkEntry>>> {
        let (line, rest) = match out.iter().position(|&b| b == b'\n') {
            Some(end) => (&out[..end], &out[end + 1..]),
            None => (out, &[][..]),
        };
        let entries = listing(line)?;
        if entries.len() > max_entries {
            return Some(Err(too_many_entries(root, max_entries)));
        }
        if !rest.is_empty() {
            let read = parse_read_ahead(rest, entries.len())?;
            let files = read
                .into_iter()
                .map(|(index, answer)| (self.arg(&root.join(&entries[index].path)), answer))
                .collect();
            self.keep_read_ahead(generation, files);
        }
        Some(Ok(entries))
    }

    /// Runs one of skillbox's helper commands (not the caller's code) to the end and
    /// collects what it printed.
    async fn helper(
        &self,
        argv: Vec<String>,
        stdin: Option<Vec<u8>>,
        max_stdout: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<Collected> {
        let container = self.container();
        if container.is_removed() {
            return Err(container.gone());
        }
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("file operation"));
        }
        self.begin();
        let gate = container.fs_gate.clone().read_owned().await;
        let docker = container.docker.clone();
        let id = container.id.clone();
        let backend = self.backend_name();
        // The helper runs to its end in a task of its own: a cancelled caller stops
        // waiting at once, and the operation (bounded, and killed with the rest by the
        // next reset if it got stuck) keeps the gate until it is really over.
        let run = tokio::spawn(async move {
            let _gate = gate;
            collect_exec(
                &docker,
                &id,
                backend,
                "file operation",
                argv,
                stdin,
                max_stdout,
            )
            .await
        });
        tokio::select! {
            joined = run => joined.map_err(|e| EnvError::new(ErrorCode::Unknown, format!("file operation: {e}")))?,
            () = cancel.cancelled() => Err(EnvError::aborted("file operation")),
            () = container.shutdown.cancelled() => Err(EnvError::aborted("the sandbox was cleaned up")),
        }
    }

    /// Runs the file helper: `op` with `args`, returning its stdout.
    async fn fs_op(
        &self,
        op: &str,
        args: &[String],
        stdin: Option<Vec<u8>>,
        path: &Path,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<u8>> {
        self.fs_op_within(op, args, stdin, path, MAX_READ_BYTES, cancel)
            .await?
            .ok_or_else(|| {
                EnvError::new(
                    ErrorCode::ResourceExhausted,
                    format!("{op} {}: more than {MAX_READ_BYTES} bytes", path.display()),
                )
                .with_path(path)
            })
    }

    /// [`Self::fs_op`] taking at most `max_stdout` bytes of its stdout: `None` when more
    /// came (the rest is not read).
    async fn fs_op_within(
        &self,
        op: &str,
        args: &[String],
        stdin: Option<Vec<u8>>,
        path: &Path,
        max_stdout: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<Option<Vec<u8>>> {
        let argv = helper_argv(self.container().runtime, op, args);
        let out = self.helper(argv, stdin, max_stdout, cancel).await?;
        if out.stdout_past_bound {
            return Ok(None);
        }
        match out.exit_code {
            Some(0) => Ok(Some(out.stdout)),
            Some(1) => {
                let parsed: Option<serde_json::Value> = serde_json::from_slice(&out.stderr).ok();
                let errno = parsed
                    .as_ref()
                    .and_then(|v| v["errno"].as_i64())
                    .unwrap_or(0) as i32;
                let msg = parsed
                    .as_ref()
                    .and_then(|v| v["msg"].as_str().map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned());
                // A batch operation names the entry below `path` that failed.
                let failed = match parsed.as_ref().and_then(|v| v["entry"].as_str()) {
                    Some(entry) => path.join(entry),
                    None => path.to_path_buf(),
                };
                Err(EnvError::new(
                    skillbox_env::errno_code(errno),
                    format!("{op} {}: {msg}", failed.display()),
                )
                .with_path(failed))
            }
            other => Err(EnvError::new(
                ErrorCode::Unknown,
                format!(
                    "{op} {}: the file helper failed (exit {other:?}): {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            )
            .with_path(path)),
        }
    }

    async fn fs_json(
        &self,
        op: &str,
        args: &[String],
        path: &Path,
        cancel: &CancellationToken,
    ) -> EnvResult<serde_json::Value> {
        let out = self.fs_op(op, args, None, path, cancel).await?;
        serde_json::from_slice(&out).map_err(|e| {
            EnvError::new(
                ErrorCode::Unknown,
                format!("{op} {}: unreadable helper answer: {e}", path.display()),
            )
        })
    }
}

fn kind_of(text: &str) -> FileKind {
    match text {
        "file" => FileKind::File,
        "dir" => FileKind::Dir,
        "symlink" => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// How a `readmany` run ended.
#[derive(Debug, PartialEq, Eq)]
enum ReadsEnd {
    /// Every answer is in (or a "later": the rest goes to the next run).
    Done,
    /// The next path failed with this errno.
    Failed(i32),
}

/// The answers of one `readmany` run, appended to `read`. `None` when the answer is
/// malformed.
fn parse_reads(mut out: &[u8], read: &mut Vec<FileRead>) -> Option<ReadsEnd> {
    while !out.is_empty() {
        let end = out.iter().position(|&b| b == b'\n')?;
        let header: serde_json::Value = serde_json::from_slice(&out[..end]).ok()?;
        out = &out[end + 1..];
        match header["s"].as_str()? {
            "ok" => {
                let n = usize::try_from(header["n"].as_u64()?).ok()?;
                read.push(FileRead::Content(out.get(..n)?.to_vec()));
                out = &out[n..];
            }
            "missing" => read.push(FileRead::Missing),
            "notfile" => read.push(FileRead::NotFile),
            "toolarge" => read.push(FileRead::TooLarge(header["n"].as_u64()?)),
            "later" => return out.is_empty().then_some(ReadsEnd::Done),
            "error" => {
                let errno = i32::try_from(header["errno"].as_i64()?).ok()?;
                return out.is_empty().then_some(ReadsEnd::Failed(errno));
            }
            _ => return None,
        }
    }
    Some(ReadsEnd::Done)
}

/// The records `walkread` prints after its listing: each file's index in the listing
/// and its answer, as `readmany` frames them. `None` for anything malformed.
fn parse_read_ahead(mut out: &[u8], listed: usize) -> Option<Vec<(usize, FileRead)>> {
    let mut read = Vec::new();
    while !out.is_empty() {
        let end = out.iter().position(|&b| b == b'\n')?;
        let header: serde_json::Value = serde_json::from_slice(&out[..end]).ok()?;
        out = &out[end + 1..];
        let index = usize::try_from(header["i"].as_u64()?)
            .ok()
            .filter(|&i| i < listed)?;
        let answer = match header["s"].as_str()? {
            "ok" => {
                let n = usize::try_from(header["n"].as_u64()?).ok()?;
                let data = out.get(..n)?.to_vec();
                out = &out[n..];
                FileRead::Content(data)
            }
            "missing" => FileRead::Missing,
            "notfile" => FileRead::NotFile,
            "toolarge" => FileRead::TooLarge(header["n"].as_u64()?),
            // A file that could not be read is read again, by read_files, to name it.
            "error" => continue,
            _ => return None,
        };
        read.push((index, answer));
    }
    Some(read)
}

fn bad_answer(op: &str, path: &Path) -> EnvError {
    EnvError::new(
        ErrorCode::Unknown,
        format!("{op} {}: unreadable helper answer", path.display()),
    )
}

#[async_trait]
impl FileSystem for DockerSandbox {
    fn cwd(&self) -> &Path {
        self.default_cwd()
    }

    async fn canonical(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<PathBuf> {
        let value = self
            .fs_json("canonical", &[self.arg(path)], path, cancel)
            .await?;
        value
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| bad_answer("canonical", path))
    }

    async fn exists(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<bool> {
        let value = self
            .fs_json("exists", &[self.arg(path)], path, cancel)
            .await?;
        value.as_bool().ok_or_else(|| bad_answer("exists", path))
    }

    async fn file_info(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<FileInfo> {
        let v = self
            .fs_json("info", &[self.arg(path)], path, cancel)
            .await?;
        let modified = v["mtimeNs"].as_i64().and_then(|ns| {
            u64::try_from(ns)
                .ok()
                .map(|ns| std::time::UNIX_EPOCH + Duration::from_nanos(ns))
        });
        Ok(FileInfo {
            kind: kind_of(v["kind"].as_str().unwrap_or("")),
            size: v["size"].as_u64().ok_or_else(|| bad_answer("info", path))?,
            mode: v["mode"].as_u64().unwrap_or(0) as u32,
            modified,
            read_only: v["readOnly"].as_bool().unwrap_or(false),
        })
    }

    async fn list_dir(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<DirEntry>> {
        let v = self
            .fs_json(
                "list",
                &[self.arg(path), MAX_LIST_ENTRIES.to_string()],
                path,
                cancel,
            )
            .await?;
        if v.as_str() == Some("too many") {
            return Err(skillbox_env::too_many_to_list(path));
        }
        let entries = v.as_array().ok_or_else(|| bad_answer("list", path))?;
        entries
            .iter()
            .map(|e| {
                let kind = kind_of(e.get(1)?.as_str()?);
                let size = match e.get(2) {
                    Some(size) if kind == FileKind::File => Some(size.as_u64()?),
                    _ => None,
                };
                Some(DirEntry {
                    name: e.get(0)?.as_str()?.to_string(),
                    kind,
                    size,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad_answer("list", path))
    }

    async fn read_text(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<String> {
        let bytes = self.read_bytes(path, cancel).await?;
        String::from_utf8(bytes).map_err(|_| {
            EnvError::invalid(format!("{}: not UTF-8 text", path.display())).with_path(path)
        })
    }

    async fn read_text_lines(
        &self,
        path: &Path,
        max: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<TextLines> {
        let text = self.read_text(path, cancel).await?;
        first_lines(std::io::Cursor::new(text), max, path)
    }

    /// One helper run for the whole tree.
    async fn walk(
        &self,
        root: &Path,
        prune: &[&str],
        max_entries: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<WalkEntry>> {
        let root = self.absolute(root);
        // Made by the exec just before, in its own round trip (`walk_after`); what does
        // not read as a walk (the command's own bytes, framed to look like one) is
        // walked again.
        if let Some(out) = self.take_walk_ahead(&root, prune, max_entries)
            && let Some(walked) = self.parse_walk(&root, &out, max_entries, self.generation())
        {
            tracing::debug!(root = %root.display(), "docker: walk answered from the exec before it");
            return walked;
        }
        let args = walkread_args(&self.arg(&root), max_entries, prune);
        let before = self.generation();
        let out = self.fs_op("walkread", &args, None, &root, cancel).await?;
        self.parse_walk(&root, &out, max_entries, before + 1)
            .unwrap_or_else(|| Err(bad_answer("walk", &root)))
    }

    /// As few helper runs as the bytes allow (about [`READ_BATCH_BYTES`] each).
    async fn read_files(
        &self,
        paths: &[PathBuf],
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<FileRead>> {
        // One file must fit what a helper run may print.
        if max_bytes > READ_MAX_FILE_BYTES {
            return Err(EnvError::invalid(format!(
                "read_files: a cap of {max_bytes} bytes is over the {} backend's {READ_MAX_FILE_BYTES}",
                self.container().runtime.backend()
            )));
        }
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("file operation"));
        }
        let wanted: Vec<String> = paths.iter().map(|p| self.arg(p)).collect();
        if let Some(read) = self.take_read_ahead(&wanted, max_bytes) {
            return Ok(read);
        }
        let mut read = Vec::with_capacity(paths.len());
        while read.len() < paths.len() {
            let rest = &paths[read.len()..];
            let shown = &rest[0];
            let list: Vec<String> = rest.iter().map(|p| self.arg(p)).collect();
            let stdin = serde_json::to_vec(&list)
                .map_err(|e| EnvError::new(ErrorCode::Unknown, format!("read_files: {e}")))?;
            let args = [max_bytes.to_string(), READ_BATCH_BYTES.to_string()];
            let out = self
                .fs_op("readmany", &args, Some(stdin), shown, cancel)
                .await?;
            let before = read.len();
            let end = parse_reads(&out, &mut read).ok_or_else(|| bad_answer("readmany", shown))?;
            if read.len() > paths.len() {
                return Err(bad_answer("readmany", shown));
            }
            if let ReadsEnd::Failed(errno) = end {
                let failed = paths.get(read.len()).unwrap_or(shown);
                return Err(EnvError::new(
                    skillbox_env::errno_code(errno),
                    format!(
                        "read {}: {}",
                        failed.display(),
                        std::io::Error::from_raw_os_error(errno)
                    ),
                )
                .with_path(failed));
            }
            if read.len() == before {
                return Err(bad_answer("readmany", shown));
            }
        }
        Ok(read)
    }

    /// One helper run for the whole tree (see [`tree_input`]).
    async fn put_tree(&self, dir: &Path, tree: &Tree, cancel: &CancellationToken) -> EnvResult<()> {
        let dir = self.absolute(dir);
        let stdin = tree_input(&dir, tree)?;
        self.fs_op("puttree", &[self.arg(&dir)], Some(stdin), &dir, cancel)
            .await
            .map(drop)
    }

    async fn read_bytes(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<u8>> {
        self.fs_op("read", &[self.arg(path)], None, path, cancel)
            .await
    }

    /// The helper stops after `max_bytes + 1` bytes of the one file it opened, and no
    /// more than that is taken from its stdout: the sandbox's code, which may write
    /// into it too (gVisor), cannot make the read hold more.
    async fn read_bytes_max(
        &self,
        path: &Path,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<u8>> {
        let args = [self.arg(path), max_bytes.to_string()];
        let max = max_bytes.min(MAX_READ_BYTES as u64 - 1);
        let out = self
            .fs_op_within("readmax", &args, None, path, max as usize + 1, cancel)
            .await?;
        let Some(out) = out.filter(|out| out.len() as u64 <= max) else {
            return Err(too_large_to_read(&self.absolute(path), max));
        };
        Ok(out)
    }

    async fn write(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        self.fs_op(
            "write",
            &[self.arg(path)],
            Some(data.to_vec()),
            path,
            cancel,
        )
        .await
        .map(drop)
    }

    async fn append(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        self.fs_op(
            "append",
            &[self.arg(path)],
            Some(data.to_vec()),
            path,
            cancel,
        )
        .await
        .map(drop)
    }

    async fn rename(&self, from: &Path, to: &Path, cancel: &CancellationToken) -> EnvResult<()> {
        self.fs_json("rename", &[self.arg(from), self.arg(to)], from, cancel)
            .await
            .map(drop)
    }

    async fn remove(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let flag = if recursive { "1" } else { "0" };
        self.fs_json("remove", &[self.arg(path), flag.into()], path, cancel)
            .await
            .map(drop)
    }

    async fn create_dir(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let flag = if recursive { "1" } else { "0" };
        self.fs_json("mkdir", &[self.arg(path), flag.into()], path, cancel)
            .await
            .map(drop)
    }

    async fn create_temp_dir(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        temp_entry(self, "dir", prefix, cancel).await
    }

    async fn create_temp_file(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        temp_entry(self, "file", prefix, cancel).await
    }

    async fn cleanup(&self) -> EnvResult<()> {
        self.container().remove().await;
        let after = self.after_cleanup.lock().ok().and_then(|mut a| a.take());
        if let Some(after) = after {
            (after.0)();
        }
        // The container's processes are gone: the proxy's connections end (recorded).
        if let Some(egress) = &self.egress {
            egress.proxy.stop().await;
        }
        Ok(())
    }
}

/// The entries of a walk's listing line (`[[path, kind, size, executable], …]`): `None`
/// unless every path is one a file system can hold beneath the root, each once (a walk
/// that came in an exec's frame is the sandbox's to forge, and what it lists becomes
/// artifact paths).
fn listing(line: &[u8]) -> Option<Vec<WalkEntry>> {
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    let entries = v
        .as_array()?
        .iter()
        .map(|e| {
            Some(WalkEntry {
                path: e.get(0)?.as_str()?.to_string(),
                kind: kind_of(e.get(1)?.as_str()?),
                size: e.get(2)?.as_u64()?,
                executable: e.get(3).and_then(|x| x.as_bool()).unwrap_or(false),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    entries
        .iter()
        .all(|e| plain_relative(&e.path) && seen.insert(e.path.as_str()))
        .then_some(entries)
}

/// A relative path of plain names: not empty, no NUL, no empty, `.` or `..` component.
fn plain_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// What the helper's `puttree` reads on stdin: one JSON line listing the entries in
/// order (`[path, "dir"]` or `[path, "file", executable, size]`, paths `/`-separated),
/// then the content of every file back to back, in the same order.
fn tree_input(dir: &Path, tree: &Tree) -> EnvResult<Vec<u8>> {
    let mut listed = Vec::with_capacity(tree.len());
    for entry in tree.entries() {
        let parts: Option<Vec<&str>> = entry.path.iter().map(|c| c.to_str()).collect();
        let Some(parts) = parts else {
            return Err(EnvError::invalid(format!(
                "put_tree {}: the name is not UTF-8, which the file helper cannot be given",
                dir.join(&entry.path).display()
            )));
        };
        let path = parts.join("/");
        listed.push(match &entry.kind {
            TreeKind::Dir => serde_json::json!([path, "dir"]),
            TreeKind::File { data, executable } => {
                serde_json::json!([path, "file", executable, data.len()])
            }
        });
    }
    let mut input = serde_json::to_vec(&listed)
        .map_err(|e| EnvError::new(ErrorCode::Unknown, format!("put_tree: {e}")))?;
    input.push(b'\n');
    input.reserve_exact(usize::try_from(tree.bytes()).unwrap_or(0));
    for entry in tree.entries() {
        if let TreeKind::File { data, .. } = &entry.kind {
            input.extend_from_slice(data);
        }
    }
    Ok(input)
}

async fn temp_entry(
    sandbox: &DockerSandbox,
    kind: &str,
    prefix: &str,
    cancel: &CancellationToken,
) -> EnvResult<PathBuf> {
    if prefix.contains('/') || prefix.contains('\0') {
        return Err(EnvError::invalid(format!(
            "temp prefix {prefix:?}: must not contain '/'"
        )));
    }
    let path = &sandbox.default_cwd().join(".tmp");
    let v = sandbox
        .fs_json("mktemp", &[kind.into(), prefix.into()], path, cancel)
        .await?;
    v.as_str()
        .map(PathBuf::from)
        .ok_or_else(|| bad_answer("mktemp", path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::FS_PY;

    /// A listing (a walk's first line, which may come in an exec's frame the sandbox
    /// can forge) is taken only when every path is plain, relative and listed once.
    #[test]
    fn a_listing_with_a_path_no_file_system_holds_is_refused() {
        let good = br#"[["a","dir",0,false],["a/b.txt","file",3,false],[".hidden","file",1,true]]"#;
        let entries = listing(good).expect("a plain listing");
        assert_eq!(entries.len(), 3);
        assert!(entries[2].executable);
        assert_eq!(listing(b"[]").map(|e| e.len()), Some(0));
        for bad in [
            r#"[["/etc/x","file",1,false]]"#,
            r#"[["../x","file",1,false]]"#,
            r#"[["a/../../x","file",1,false]]"#,
            r#"[["a//b","file",1,false]]"#,
            r#"[["a/./b","file",1,false]]"#,
            r#"[["","file",1,false]]"#,
            r#"[["a/","file",1,false]]"#,
            r#"[["a\u0000b","file",1,false]]"#,
            r#"[["x","file",1,false],["x","file",2,false]]"#,
            r#"[["x","file",-1,false]]"#,
            r#"{"x":1}"#,
        ] {
            assert!(listing(bad.as_bytes()).is_none(), "{bad} was taken");
        }
    }

    /// Runs the file helper's `readmany` here, on the host, over `paths`.
    fn readmany(paths: &[&Path], limit: u64, budget: u64) -> Vec<u8> {
        use std::io::Write as _;
        let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let mut child = std::process::Command::new("python3")
            .args(["-I", "-S", "-c", FS_PY, "readmany"])
            .args([limit.to_string(), budget.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&serde_json::to_vec(&list).unwrap())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout
    }

    /// Runs the file helper's `walkread` here, on the host, over `root`.
    fn walkread(root: &Path, limit: usize, budget: u64) -> Vec<u8> {
        helper_walkread(root, limit, budget, &[]).expect("the file helper's walkread failed")
    }

    fn mkfifo(path: &Path) {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo {}", path.display());
    }

    /// A small tree comes back listed and read in one helper run: every regular file's
    /// bytes under its index, a symlink and a FIFO listed but never opened; a tree over
    /// the budget, the listing alone.
    #[test]
    fn walkread_reads_a_small_tree_along_with_its_listing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), b"alpha").unwrap();
        std::fs::write(root.join("sub/b.bin"), [0u8, 1, 2, b'\n', 3]).unwrap();
        std::fs::write(root.join("sub/empty"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        mkfifo(&root.join("fifo"));

        let out = walkread(root, 100, 1024);
        let end = out.iter().position(|&b| b == b'\n').unwrap();
        let listed: Vec<serde_json::Value> = serde_json::from_slice(&out[..end]).unwrap();
        let names: Vec<&str> = listed.iter().map(|e| e[0].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["a.txt", "fifo", "link", "sub", "sub/b.bin", "sub/empty"]
        );
        let read = parse_read_ahead(&out[end + 1..], listed.len()).unwrap();
        let by_name: Vec<(&str, &FileRead)> = read.iter().map(|(i, r)| (names[*i], r)).collect();
        assert_eq!(
            by_name,
            [
                ("a.txt", &FileRead::Content(b"alpha".to_vec())),
                ("sub/b.bin", &FileRead::Content(vec![0, 1, 2, b'\n', 3])),
                ("sub/empty", &FileRead::Content(Vec::new())),
            ]
        );

        // 10 bytes of files in all: over a budget of 9, nothing is read.
        let out = walkread(root, 100, 9);
        let end = out.iter().position(|&b| b == b'\n').unwrap();
        assert_eq!(out.len(), end + 1, "{}", String::from_utf8_lossy(&out));
        // Too many entries: the listing (one over the limit), nothing read.
        let out = walkread(root, 2, 1024);
        let end = out.iter().position(|&b| b == b'\n').unwrap();
        let listed: Vec<serde_json::Value> = serde_json::from_slice(&out[..end]).unwrap();
        assert_eq!(listed.len(), 3);
        assert_eq!(out.len(), end + 1);
    }

    /// The exec wrapper's own walk (helpers/walk.pl) run here, on the host, over
    /// `root`: `None` where it leaves the walk to the file helper.
    fn wrapper_walkread(root: &Path, limit: usize, budget: u64, prune: &[&str]) -> Option<Vec<u8>> {
        wrapper_walkread_within(root, limit, budget, prune, 16 << 20)
    }

    /// [`wrapper_walkread`] printing at most `most` bytes.
    fn wrapper_walkread_within(
        root: &Path,
        limit: usize,
        budget: u64,
        prune: &[&str],
        most: usize,
    ) -> Option<Vec<u8>> {
        let script = concat!(
            "use Fcntl ();\n",
            include_str!("helpers/walk.pl"),
            "\nmy $o = walkread(@ARGV); print(defined($o) ? \"y$o\" : 'n');\n"
        );
        let out = std::process::Command::new("perl")
            .args(["-e", script])
            .arg(root)
            .args([limit.to_string(), budget.to_string()])
            .args([(u32::MAX).to_string(), most.to_string()])
            .args(prune)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        match out.stdout.split_first() {
            Some((b'y', rest)) => Some(rest.to_vec()),
            Some((b'n', [])) => None,
            _ => panic!("{out:?}"),
        }
    }

    /// The file helper's `walkread` with `prune`, here, as [`walkread`]: `None` when it
    /// fails.
    fn helper_walkread(root: &Path, limit: usize, budget: u64, prune: &[&str]) -> Option<Vec<u8>> {
        let out = std::process::Command::new("python3")
            .args(["-I", "-S", "-c", FS_PY, "walkread"])
            .arg(root)
            .args([limit.to_string(), budget.to_string()])
            .args(prune)
            .output()
            .unwrap();
        out.status.success().then_some(out.stdout)
    }

    /// The walk the exec wrapper makes after a run's command prints byte for byte what
    /// the file helper's `walkread` prints for the same tree: names JSON must escape,
    /// past the basic plane, a pruned directory, a symlink, a FIFO, an executable, the
    /// budget and the entry limit. What it cannot answer the same (a name that is not
    /// UTF-8, a root that is not a directory) it leaves to the helper.
    #[test]
    fn the_wrapper_s_walk_prints_what_the_file_helper_prints() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        let root = real.join("w");
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(root.join(".tmp/inner")).unwrap();
        std::fs::write(root.join(".tmp/inner/x"), b"pruned").unwrap();
        std::fs::write(root.join("a.txt"), b"alpha").unwrap();
        std::fs::write(root.join("run.sh"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::write(root.join("sub/b.bin"), [0u8, 1, 2, b'\n', 3, 0xff]).unwrap();
        std::fs::write(root.join("sub/empty"), b"").unwrap();
        std::fs::write(root.join("sub/deeper/c"), b"deep").unwrap();
        for name in [
            "é.txt",
            "emoji😀",
            "quote\"back\\slash",
            "new\nline",
            "tab\t",
            "del\x7f",
            "ctl\x01",
            "Zed",
            "ü",
            "trail\n",
        ] {
            std::fs::write(root.join("sub").join(name), name.as_bytes()).unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("dirlink")).unwrap();
        mkfifo(&root.join("fifo"));
        // The root's parent through a symlink, which both resolve.
        std::os::unix::fs::symlink(&real, dir.path().join("via")).unwrap();
        let via = dir.path().join("via/w");

        // 21 entries, with .tmp listed but not entered.
        let n = 21;
        for (root, limit, budget, prune) in [
            (&root, 100, 1 << 20, &[".tmp"][..]),
            (&root, 100, 1 << 20, &[][..]),
            (&via, 100, 1 << 20, &[".tmp"][..]),
            // Over the budget: the listing alone.
            (&root, 100, 20, &[".tmp"][..]),
            // Exactly the limit.
            (&root, n, 1 << 20, &[".tmp"][..]),
        ] {
            let helper = helper_walkread(root, limit, budget, prune).unwrap();
            let wrapper = wrapper_walkread(root, limit, budget, prune);
            assert_eq!(
                wrapper.as_deref().map(String::from_utf8_lossy),
                Some(String::from_utf8_lossy(&helper)),
                "{} limit {limit} budget {budget} prune {prune:?}",
                root.display()
            );
            let end = helper.iter().position(|&b| b == b'\n').unwrap();
            assert!(
                listing(&helper[..end]).is_some(),
                "{}",
                String::from_utf8_lossy(&helper)
            );
        }
        // The walk reads its files with the budget: all of them once.
        let out = wrapper_walkread(&root, 100, 1 << 20, &[".tmp"]).unwrap();
        let end = out.iter().position(|&b| b == b'\n').unwrap();
        let listed = listing(&out[..end]).unwrap();
        assert_eq!(listed.len(), n);
        let read = parse_read_ahead(&out[end + 1..], listed.len()).unwrap();
        assert_eq!(
            read.len(),
            listed.iter().filter(|e| e.kind == FileKind::File).count()
        );
        // Over the limit: one entry more than it, nothing read, from both.
        for limit in [3, n - 1] {
            for out in [
                helper_walkread(&root, limit, 1 << 20, &[".tmp"]).unwrap(),
                wrapper_walkread(&root, limit, 1 << 20, &[".tmp"]).unwrap(),
            ] {
                let end = out.iter().position(|&b| b == b'\n').unwrap();
                assert_eq!(listing(&out[..end]).unwrap().len(), limit + 1);
                assert_eq!(out.len(), end + 1);
            }
        }
        // Past its most bytes, nothing: the listing alone (over the budget), and the
        // listing with what it read.
        for budget in [20, 1 << 20] {
            let whole = helper_walkread(&root, 100, budget, &[".tmp"])
                .unwrap()
                .len();
            for most in [whole - 2, whole - 1] {
                assert_eq!(
                    wrapper_walkread_within(&root, 100, budget, &[".tmp"], most),
                    None
                );
            }
            let out = wrapper_walkread_within(&root, 100, budget, &[".tmp"], whole);
            assert_eq!(out.map(|o| o.len()), Some(whole));
        }
        // A root that is a symlink, or not there: the helper fails, the wrapper leaves it.
        for not_dir in [dir.path().join("via"), dir.path().join("none")] {
            assert_eq!(helper_walkread(&not_dir, 100, 1 << 20, &[]), None);
            assert_eq!(wrapper_walkread(&not_dir, 100, 1 << 20, &[]), None);
        }
        // A name that is not UTF-8: the helper's listing is refused, the wrapper leaves it.
        use std::os::unix::ffi::OsStrExt as _;
        std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"bad\xff")), b"").unwrap();
        let helper = helper_walkread(&root, 100, 1 << 20, &[".tmp"]).unwrap();
        let end = helper.iter().position(|&b| b == b'\n').unwrap();
        assert!(listing(&helper[..end]).is_none());
        assert_eq!(wrapper_walkread(&root, 100, 1 << 20, &[".tmp"]), None);
    }

    /// A record that names an entry the listing does not have, or is cut short, is a
    /// bad answer, not a file.
    #[test]
    fn read_ahead_records_are_checked() {
        assert!(parse_read_ahead(b"{\"i\":0,\"s\":\"ok\",\"n\":3}\nabc", 1).is_some());
        assert!(parse_read_ahead(b"{\"i\":1,\"s\":\"ok\",\"n\":3}\nabc", 1).is_none());
        assert!(parse_read_ahead(b"{\"i\":0,\"s\":\"ok\",\"n\":4}\nabc", 1).is_none());
        assert!(parse_read_ahead(b"{\"i\":0,\"s\":\"what\"}\n", 1).is_none());
    }

    /// Runs the file helper's `puttree` here, on the host, into `dir`.
    fn puttree(dir: &Path, input: &[u8]) -> std::process::Output {
        use std::io::Write as _;
        let mut child = std::process::Command::new("python3")
            .args(["-I", "-S", "-c", FS_PY, "puttree"])
            .arg(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The helper may stop reading early (a failure), so a broken pipe is fine.
        let _ = child.stdin.take().unwrap().write_all(input);
        child.wait_with_output().unwrap()
    }

    /// The helper reads what `tree_input` frames: every file with its bytes and mode,
    /// however the paths were spelled in the tree.
    #[test]
    fn puttree_places_what_tree_input_frames() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("skills");
        let mut tree = Tree::new();
        tree.file("a/./run.sh", &b"#!/bin/sh\n"[..], true).unwrap();
        tree.dir("empty/").unwrap();
        tree.file("a//b/data.bin", vec![0u8, 10, 255, 10], false)
            .unwrap();
        tree.file("top.txt", &b""[..], false).unwrap();
        let out = puttree(&base, &tree_input(&base, &tree).unwrap());
        assert!(out.status.success(), "{out:?}");
        let mode = |p: &str| {
            std::fs::metadata(base.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(
            std::fs::read(base.join("a/run.sh")).unwrap(),
            b"#!/bin/sh\n"
        );
        assert_eq!(mode("a/run.sh"), 0o755);
        assert_eq!(
            std::fs::read(base.join("a/b/data.bin")).unwrap(),
            [0, 10, 255, 10]
        );
        assert_eq!(mode("a/b/data.bin"), 0o644);
        assert_eq!(std::fs::read(base.join("top.txt")).unwrap(), b"");
        assert!(base.join("empty").is_dir());
    }

    /// The helper checks every path again (a `Tree` never holds such a one, but the
    /// helper trusts nothing on its stdin) and names the entry that failed; what came
    /// before it stays, nothing is made outside its directory, and input that ends
    /// before a file does is an error, not a short file.
    #[test]
    fn puttree_rechecks_every_path_and_names_the_entry_that_failed() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("in");
        for bad in ["../out", "/abs", "a/../../out", "a//b", "./a", "", "a/"] {
            let input = format!("[[\"ok.txt\",\"file\",false,2],[{bad:?},\"file\",false,1]]\nokX");
            let out = puttree(&base, input.as_bytes());
            assert_eq!(out.status.code(), Some(1), "{bad:?}: {out:?}");
            let failed: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
            assert_eq!(failed["errno"], libc::EINVAL, "{bad:?}");
            assert_eq!(failed["entry"], bad, "{bad:?}");
            assert_eq!(std::fs::read(base.join("ok.txt")).unwrap(), b"ok");
        }
        assert!(!dir.path().join("out").exists());
        let out = puttree(&base, b"[[\"short.txt\",\"file\",true,10]]\nonly5");
        let failed: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(failed["errno"], libc::EIO, "{out:?}");
        assert_eq!(failed["entry"], "short.txt");
        assert!(!base.join("short.txt").exists());
    }

    /// Past its byte budget the helper stops with "later", and the next run picks up
    /// there: every file is read once, in order, whatever the batches.
    #[test]
    fn readmany_batches_by_bytes_and_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = (0..5).map(|i| dir.path().join(format!("{i}"))).collect();
        for (i, file) in files.iter().enumerate() {
            std::fs::write(file, vec![b'a' + i as u8; 40]).unwrap();
        }
        std::os::unix::fs::symlink(&files[0], dir.path().join("link")).unwrap();
        let mut paths: Vec<PathBuf> = files.clone();
        paths.insert(2, dir.path().join("link"));
        paths.insert(3, dir.path().join("gone"));
        let mut read = Vec::new();
        let mut runs = 0;
        while read.len() < paths.len() {
            let rest: Vec<&Path> = paths[read.len()..].iter().map(PathBuf::as_path).collect();
            // 100 bytes a run: two 40-byte files each, the next goes to the next run.
            let out = readmany(&rest, 64, 100);
            let before = read.len();
            assert_eq!(parse_reads(&out, &mut read), Some(ReadsEnd::Done));
            assert!(read.len() > before);
            runs += 1;
        }
        assert_eq!(runs, 3);
        let content = |i: usize| FileRead::Content(vec![b'a' + i as u8; 40]);
        assert_eq!(
            read,
            vec![
                content(0),
                content(1),
                FileRead::NotFile,
                FileRead::Missing,
                content(2),
                content(3),
                content(4),
            ]
        );
        // Over the cap: the size, not the content.
        std::fs::write(&files[0], [0u8; 65]).unwrap();
        let mut read = Vec::new();
        parse_reads(&readmany(&[&files[0]], 64, 100), &mut read).unwrap();
        assert_eq!(read, vec![FileRead::TooLarge(65)]);
        // A file that cannot be opened ends the run with its errno, after what came
        // before it (a name too long: an errno root gets too).
        let unopenable = dir.path().join("n".repeat(300));
        let mut read = Vec::new();
        let out = readmany(&[&files[1], &unopenable, &files[2]], 64, 100);
        let end = parse_reads(&out, &mut read).unwrap();
        assert_eq!(end, ReadsEnd::Failed(libc::ENAMETOOLONG));
        assert_eq!(read, vec![content(1)]);
        // A malformed answer is refused, not half-read.
        assert!(parse_reads(b"{\"s\":\"ok\",\"n\":5}\nabc", &mut Vec::new()).is_none());
    }
}
