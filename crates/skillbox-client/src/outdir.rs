//! Writing a run's files into a directory on the host (`--out DIR`): the door through
//! which what sandboxed code made reaches the machine, so nothing the code chose can
//! steer where or how a file lands.
//!
//! - The directory is opened once, as a directory fd, and every entry is created beneath
//!   it one component at a time (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`,
//!   `O_NOFOLLOW`): a symlink in the way is refused, never followed, and no path leaves it.
//! - An existing file is never replaced unless the caller asked for it (`overwrite`); the
//!   error names the file and the other files are still written.
//! - A path with a hidden component (`.git/config`, `.envrc`) is written only when the
//!   caller's [`OutputSelection`] spells its dot.
//! - Files are created 0644 and directories 0755 (less under the umask): whatever mode
//!   the sandbox gave a file, no exec, setuid, setgid or sticky bit comes out.
//! - Each file is written beneath the same directory fd as a file with no name
//!   (`O_TMPFILE`), linked in under a hidden temp name once it is whole, and renamed
//!   into place with `RENAME_NOREPLACE`: a partial file never has its final name, and a
//!   copy killed mid-write leaves nothing behind. Where the filesystem has no unnamed
//!   files (or this process cannot link one in), the temp name is the file's from the
//!   start, and such a kill leaves it.
//! - A count and a byte cap bound the whole export.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags};
use rustix::io::Errno;
use skillbox_protocol::{ArtifactInfo, ErrorCode, OutputSelection};

use crate::{ClientError, SkillSandbox};

/// Most files one export writes.
pub const DEFAULT_MAX_FILES: usize = 1000;
/// Most bytes one export writes (the server's own collection limit).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Longest name of one path component, and of a whole relative path (Linux's limits).
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;

/// How an export may write.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Replace files that exist (never directories, never through a symlink).
    pub overwrite: bool,
    /// Which files are written; by default every one with no hidden component.
    pub outputs: OutputSelection,
    pub max_files: usize,
    pub max_bytes: u64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            overwrite: false,
            outputs: OutputSelection::visible(),
            max_files: DEFAULT_MAX_FILES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// What became of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exported {
    /// Written, at this host path.
    Written(PathBuf),
    /// Not selected by the outputs (a hidden path, by default): nothing written.
    NotSelected,
}

/// A host directory that a run's files are written into.
#[derive(Debug)]
pub struct OutDir {
    dir: OwnedFd,
    path: PathBuf,
    options: ExportOptions,
    files: usize,
    bytes: u64,
}

fn err(code: ErrorCode, message: String) -> ClientError {
    ClientError::new(code, message)
}

/// `doing` to `target` failed with `e`; the message names the file.
fn failed(target: &Path, e: Errno, doing: &str) -> ClientError {
    err(
        errno_code(e),
        format!("{}: cannot {doing}: {e}", target.display()),
    )
}

/// Writing `target`'s bytes failed.
fn write_failed(target: &Path, e: std::io::Error) -> ClientError {
    err(
        ErrorCode::Unknown,
        format!("{}: cannot write it: {e}", target.display()),
    )
}

fn errno_code(errno: Errno) -> ErrorCode {
    match errno {
        Errno::NOENT => ErrorCode::NotFound,
        Errno::EXIST => ErrorCode::AlreadyExists,
        // LOOP, XDEV: a symlink in the way, refused by O_NOFOLLOW or RESOLVE_BENEATH.
        Errno::ACCESS | Errno::PERM | Errno::ROFS | Errno::LOOP | Errno::XDEV => {
            ErrorCode::PermissionDenied
        }
        Errno::NOTDIR => ErrorCode::NotDirectory,
        Errno::ISDIR => ErrorCode::IsDirectory,
        Errno::NOSPC | Errno::DQUOT | Errno::FBIG | Errno::NAMETOOLONG => {
            ErrorCode::ResourceExhausted
        }
        _ => ErrorCode::Unknown,
    }
}

/// Opens one component beneath `dir`, never following a symlink. `openat2` where the
/// kernel has it; else `openat` with `O_NOFOLLOW`, which is as strict for a single
/// component.
fn open_beneath(
    dir: BorrowedFd<'_>,
    name: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(dir, name, flags, mode, resolve) {
        Err(Errno::NOSYS) => rustix::fs::openat(dir, name, flags, mode),
        other => other,
    }
}

/// A name for a file being written, unique in this process and, by a random part,
/// apart from what an earlier process with this pid left (a killed one, where the file
/// could not be written unnamed); hidden so that nothing looks like an artifact.
fn temp_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Std's hasher keys are random per process (and differ from one to the next).
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!(
        ".skillbox-partial-{}-{}-{random:016x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The components of a relative artifact path, or why it is not one.
fn components(rel: &str) -> Result<Vec<&str>, String> {
    if rel.is_empty() || rel.len() > PATH_MAX || rel.contains('\0') || rel.starts_with('/') {
        return Err("not a relative path".into());
    }
    let parts: Vec<&str> = rel.split('/').collect();
    for part in &parts {
        match *part {
            "" | "." | ".." => return Err("has an empty, . or .. component".into()),
            p if p.len() > NAME_MAX => {
                return Err(format!("has a component over {NAME_MAX} bytes"));
            }
            _ => {}
        }
    }
    Ok(parts)
}

impl OutDir {
    /// Opens `path`, which must be an existing directory. The caller named it, so a
    /// symlink there is the caller's own; everything beneath it is checked.
    pub fn open(path: &Path, options: ExportOptions) -> Result<OutDir, ClientError> {
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            let what = match e {
                Errno::NOENT => "no such directory".to_string(),
                Errno::NOTDIR => "not a directory".to_string(),
                e => e.to_string(),
            };
            err(errno_code(e), format!("--out {}: {what}", path.display()))
        })?;
        Ok(OutDir {
            dir,
            path: path.to_path_buf(),
            options,
            files: 0,
            bytes: 0,
        })
    }

    /// The directory as it was named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `rel` would be written at all (the outputs select it); checks the path.
    pub fn selects(&self, rel: &str) -> Result<bool, ClientError> {
        components(rel).map_err(|why| self.invalid(rel, &why))?;
        Ok(self.options.outputs.selects(rel))
    }

    fn invalid(&self, rel: &str, why: &str) -> ClientError {
        err(
            ErrorCode::Invalid,
            format!(
                "artifact {rel:?}: {why}; not written to {}",
                self.path.display()
            ),
        )
    }

    /// Writes `bytes` as `rel` beneath the directory, or says why not. A refusal leaves
    /// the directory as it was: no partial file, no replaced file.
    pub fn write(&mut self, rel: &str, bytes: &[u8]) -> Result<Exported, ClientError> {
        let parts = components(rel).map_err(|why| self.invalid(rel, &why))?;
        if !self.options.outputs.selects(rel) {
            return Ok(Exported::NotSelected);
        }
        let target = self.path.join(rel);
        if self.files >= self.options.max_files {
            return Err(err(
                ErrorCode::ResourceExhausted,
                format!(
                    "{}: not written: more than {} files in one export",
                    target.display(),
                    self.options.max_files
                ),
            ));
        }
        let len = bytes.len() as u64;
        if self.bytes.saturating_add(len) > self.options.max_bytes {
            return Err(err(
                ErrorCode::ResourceExhausted,
                format!(
                    "{}: not written: the export would pass {} bytes",
                    target.display(),
                    self.options.max_bytes
                ),
            ));
        }
        let (name, dirs) = match parts.split_last() {
            Some(split) => split,
            None => return Err(self.invalid(rel, "names no file")),
        };
        let parent = self.open_parent(dirs)?;
        let parent = parent.as_ref().map_or(self.dir.as_fd(), |fd| fd.as_fd());
        self.place(parent, name, bytes, &target)?;
        self.files += 1;
        self.bytes += len;
        Ok(Exported::Written(target))
    }

    /// Opens (creating, 0755) each directory on the way, refusing a symlink or a file in
    /// the way. `None`: the top directory itself.
    fn open_parent(&self, dirs: &[&str]) -> Result<Option<OwnedFd>, ClientError> {
        let mut current: Option<OwnedFd> = None;
        for (depth, name) in dirs.iter().enumerate() {
            let at = current.as_ref().map_or(self.dir.as_fd(), |fd| fd.as_fd());
            let shown = || self.path.join(dirs[..=depth].join("/"));
            match rustix::fs::mkdirat(at, *name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => {
                    return Err(err(
                        errno_code(e),
                        format!("{}: cannot create the directory: {e}", shown().display()),
                    ));
                }
            }
            let next = open_beneath(at, name, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .map_err(|e| {
                    // O_NOFOLLOW | O_DIRECTORY on a symlink is ENOTDIR: look at what it is.
                    let link = matches!(e, Errno::LOOP | Errno::NOTDIR)
                        && rustix::fs::statat(at, *name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(
                            |stat| FileType::from_raw_mode(stat.st_mode) == FileType::Symlink,
                        );
                    let (code, why) = if link {
                        (
                            ErrorCode::PermissionDenied,
                            "is a symlink; skillbox does not write through links".to_string(),
                        )
                    } else if e == Errno::NOTDIR {
                        (ErrorCode::NotDirectory, "is not a directory".to_string())
                    } else {
                        (errno_code(e), e.to_string())
                    };
                    err(
                        code,
                        format!("{}: {why}; nothing written beneath it", shown().display()),
                    )
                })?;
            current = Some(next);
        }
        Ok(current)
    }

    /// Writes the file beneath `parent` under a temp name, then renames it to `name`.
    fn place(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        bytes: &[u8],
        target: &Path,
    ) -> Result<(), ClientError> {
        let temp = temp_name();
        if !write_unnamed(parent, &temp, bytes, target)? {
            write_named(parent, &temp, bytes, target)?;
        }
        let result = if self.options.overwrite {
            self.replace(parent, &temp, name, target)
        } else {
            rename_noreplace(parent, &temp, name).map_err(|e| match e {
                Errno::EXIST => err(
                    ErrorCode::AlreadyExists,
                    format!(
                        "{} exists; not overwritten (pass --overwrite to replace it)",
                        target.display()
                    ),
                ),
                e => failed(target, e, "put it in place"),
            })
        };
        if result.is_err() {
            let _ = rustix::fs::unlinkat(parent, temp.as_str(), AtFlags::empty());
        }
        result
    }

    /// Renames over an existing file (the entry itself, so a symlink or hard link there is
    /// replaced, never written through); a directory in the way is an error.
    fn replace(
        &self,
        parent: BorrowedFd<'_>,
        temp: &str,
        name: &str,
        target: &Path,
    ) -> Result<(), ClientError> {
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
                return Err(err(
                    ErrorCode::IsDirectory,
                    format!("{} is a directory; not replaced", target.display()),
                ));
            }
            Ok(_) | Err(Errno::NOENT) => {}
            Err(e) => {
                return Err(err(errno_code(e), format!("{}: {e}", target.display())));
            }
        }
        rustix::fs::renameat(parent, temp, parent, name).map_err(|e| {
            err(
                errno_code(e),
                format!("{}: cannot replace it: {e}", target.display()),
            )
        })
    }
}

/// Writes `bytes` into a file that has no name yet (`O_TMPFILE` beneath `parent`) and,
/// once it is whole, links it in as `temp`: a process killed while writing leaves
/// nothing in the directory, since the kernel frees a file no name holds. `Ok(false)`
/// when this cannot be done here and nothing was made: the filesystem has no unnamed
/// files (EOPNOTSUPP; EISDIR from a kernel that reads the flag as `O_DIRECTORY` alone;
/// EINVAL), or this process can name none (see [`link_unnamed`]; any error there: a
/// security module may refuse the link, and the named write is as safe).
fn write_unnamed(
    parent: BorrowedFd<'_>,
    temp: &str,
    bytes: &[u8],
    target: &Path,
) -> Result<bool, ClientError> {
    let fd = match open_beneath(
        parent,
        ".",
        OFlags::WRONLY | OFlags::TMPFILE,
        Mode::from_raw_mode(0o644),
    ) {
        Ok(fd) => fd,
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => return Ok(false),
        Err(e) => return Err(failed(target, e, "create it")),
    };
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(|e| write_failed(target, e))?;
    Ok(link_unnamed(file.as_fd(), parent, temp).is_ok())
}

/// Gives the unnamed file `fd` the name `temp` beneath `dir`: through its
/// `/proc/self/fd` link, which a process may follow to its own file, else with
/// `AT_EMPTY_PATH`, which asks for CAP_DAC_READ_SEARCH. ENOENT: neither is open to this
/// process (no `/proc`, no capability).
fn link_unnamed(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, temp: &str) -> Result<(), Errno> {
    let by_proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match rustix::fs::linkat(
        rustix::fs::CWD,
        by_proc.as_str(),
        dir,
        temp,
        AtFlags::SYMLINK_FOLLOW,
    ) {
        Err(Errno::NOENT) => rustix::fs::linkat(fd, "", dir, temp, AtFlags::EMPTY_PATH),
        other => other,
    }
}

/// Writes `bytes` under the name `temp` from the start, where a file cannot be written
/// unnamed: a process killed while writing leaves the temp file behind.
fn write_named(
    parent: BorrowedFd<'_>,
    temp: &str,
    bytes: &[u8],
    target: &Path,
) -> Result<(), ClientError> {
    let fd = open_beneath(
        parent,
        temp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| failed(target, e, "create it"))?;
    if let Err(e) = std::fs::File::from(fd).write_all(bytes) {
        let _ = rustix::fs::unlinkat(parent, temp, AtFlags::empty());
        return Err(write_failed(target, e));
    }
    Ok(())
}

/// `renameat2(RENAME_NOREPLACE)`; where the filesystem lacks it, a hard link (which
/// also fails when the name exists) and then the temp name removed.
fn rename_noreplace(dir: BorrowedFd<'_>, temp: &str, name: &str) -> Result<(), Errno> {
    match rustix::fs::renameat_with(dir, temp, dir, name, RenameFlags::NOREPLACE) {
        Err(Errno::INVAL | Errno::NOSYS) => {
            rustix::fs::linkat(dir, temp, dir, name, AtFlags::empty())?;
            let _ = rustix::fs::unlinkat(dir, temp, AtFlags::empty());
            Ok(())
        }
        other => other,
    }
}

/// What an export did with each file, in the order given.
#[derive(Debug, Default)]
pub struct ExportReport {
    pub written: Vec<PathBuf>,
    /// Paths the outputs did not select.
    pub not_selected: Vec<String>,
    /// Files that could not be written, each error naming its file.
    pub failed: Vec<ClientError>,
}

/// Downloads each artifact and writes it into `out`. One file's failure (it exists, a
/// symlink is in the way) does not stop the others.
pub async fn download_to_dir(
    sandbox: &dyn SkillSandbox,
    files: &[ArtifactInfo],
    out: &mut OutDir,
) -> ExportReport {
    let mut report = ExportReport::default();
    for file in files {
        match out.selects(&file.path) {
            Ok(true) => {}
            Ok(false) => {
                report.not_selected.push(file.path.clone());
                continue;
            }
            Err(e) => {
                report.failed.push(e);
                continue;
            }
        }
        let bytes = match sandbox.download(&file.sha256).await {
            Ok(bytes) => bytes,
            Err(e) => {
                report.failed.push(ClientError::new(
                    e.code,
                    format!("{}: cannot download it: {}", file.path, e.message),
                ));
                continue;
            }
        };
        match out.write(&file.path, &bytes) {
            Ok(Exported::Written(path)) => report.written.push(path),
            Ok(Exported::NotSelected) => report.not_selected.push(file.path.clone()),
            Err(e) => report.failed.push(e),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt;

    fn out(dir: &Path) -> OutDir {
        OutDir::open(dir, ExportOptions::default()).unwrap()
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = walk(dir)
            .into_iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        names.sort();
        names
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut all = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            all.push(path.clone());
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                all.extend(walk(&path));
            }
        }
        all
    }

    #[test]
    fn files_and_their_directories_are_written_with_plain_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut out = out(tmp.path());
        let written = out.write("deck.pptx", b"pk").unwrap();
        assert_eq!(written, Exported::Written(tmp.path().join("deck.pptx")));
        out.write("a/b/c.txt", b"c").unwrap();
        assert_eq!(fs::read(tmp.path().join("a/b/c.txt")).unwrap(), b"c");
        for (path, max) in [
            ("deck.pptx", 0o644),
            ("a/b/c.txt", 0o644),
            ("a", 0o755),
            ("a/b", 0o755),
        ] {
            let mode = fs::metadata(tmp.path().join(path)).unwrap().mode() & 0o7777;
            assert_eq!(mode & !max, 0, "{path}: mode {mode:o}");
        }
        assert_eq!(entries(tmp.path()), ["a", "a/b", "a/b/c.txt", "deck.pptx"]);
    }

    #[test]
    fn an_existing_file_is_kept_unless_overwrite_is_asked_for() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("README.md"), "mine").unwrap();
        let mut out = out(tmp.path());
        let e = out.write("README.md", b"theirs").unwrap_err();
        assert_eq!(e.code, ErrorCode::AlreadyExists);
        assert!(
            e.message.contains("README.md") && e.message.contains("--overwrite"),
            "{e}"
        );
        assert_eq!(
            fs::read_to_string(tmp.path().join("README.md")).unwrap(),
            "mine"
        );
        // The next file is still written; no temp file is left.
        out.write("other.txt", b"x").unwrap();
        assert_eq!(entries(tmp.path()), ["README.md", "other.txt"]);

        let options = ExportOptions {
            overwrite: true,
            ..ExportOptions::default()
        };
        let mut out = OutDir::open(tmp.path(), options).unwrap();
        out.write("README.md", b"theirs").unwrap();
        assert_eq!(
            fs::read_to_string(tmp.path().join("README.md")).unwrap(),
            "theirs"
        );
        fs::create_dir(tmp.path().join("dir")).unwrap();
        assert_eq!(
            out.write("dir", b"x").unwrap_err().code,
            ErrorCode::IsDirectory
        );
    }

    #[test]
    fn overwrite_replaces_a_symlink_or_hard_link_itself_never_its_target() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::write(&victim, "host file").unwrap();
        std::os::unix::fs::symlink(&victim, tmp.path().join("link")).unwrap();
        fs::hard_link(&victim, tmp.path().join("hard")).unwrap();
        let options = ExportOptions {
            overwrite: true,
            ..ExportOptions::default()
        };
        let mut out = OutDir::open(tmp.path(), options).unwrap();
        out.write("link", b"new").unwrap();
        out.write("hard", b"new").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "host file");
        assert!(
            !fs::symlink_metadata(tmp.path().join("link"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn a_symlink_in_the_way_is_refused_and_nothing_is_written_through_it() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("deck")).unwrap();
        let mut out = out(tmp.path());
        let e = out.write("deck/slides.pptx", b"x").unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}");
        assert!(e.message.contains("symlink"), "{e}");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
        // A symlink as the file itself: not replaced, not written through.
        std::os::unix::fs::symlink(outside.path().join("x"), tmp.path().join("x")).unwrap();
        assert_eq!(
            out.write("x", b"x").unwrap_err().code,
            ErrorCode::AlreadyExists
        );
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
        // A file in the way of a directory.
        fs::write(tmp.path().join("f"), "").unwrap();
        assert_eq!(
            out.write("f/g", b"x").unwrap_err().code,
            ErrorCode::NotDirectory
        );
    }

    #[test]
    fn hidden_paths_are_written_only_when_the_outputs_spell_their_dot() {
        let tmp = tempfile::tempdir().unwrap();
        let mut out = out(tmp.path());
        for path in [".git/config", ".envrc", "a/.bashrc"] {
            assert_eq!(
                out.write(path, b"x").unwrap(),
                Exported::NotSelected,
                "{path}"
            );
        }
        assert!(entries(tmp.path()).is_empty());
        let options = ExportOptions {
            outputs: OutputSelection::new(&[".envrc"]).unwrap(),
            ..ExportOptions::default()
        };
        let mut out = OutDir::open(tmp.path(), options).unwrap();
        assert!(matches!(
            out.write(".envrc", b"x").unwrap(),
            Exported::Written(_)
        ));
        assert_eq!(
            out.write(".git/config", b"x").unwrap(),
            Exported::NotSelected
        );
        assert_eq!(entries(tmp.path()), [".envrc"]);
    }

    #[test]
    fn paths_that_are_not_plain_relative_ones_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut out = out(tmp.path());
        for path in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/",
            "a\0b",
        ] {
            let e = out.write(path, b"x").unwrap_err();
            assert_eq!(e.code, ErrorCode::Invalid, "{path:?}");
        }
        assert!(out.write(&"n".repeat(256), b"x").is_err());
        assert!(entries(tmp.path()).is_empty());
    }

    #[test]
    fn the_count_and_byte_caps_hold_and_refuse_without_a_trace() {
        let tmp = tempfile::tempdir().unwrap();
        let options = ExportOptions {
            max_files: 2,
            max_bytes: 10,
            ..ExportOptions::default()
        };
        let mut out = OutDir::open(tmp.path(), options).unwrap();
        out.write("a", b"12345").unwrap();
        let e = out.write("b", b"123456").unwrap_err();
        assert_eq!(e.code, ErrorCode::ResourceExhausted);
        out.write("c", b"12345").unwrap();
        let e = out.write("d", b"").unwrap_err();
        assert!(e.message.contains("more than 2 files"), "{e}");
        assert_eq!(entries(tmp.path()), ["a", "c"]);
    }

    #[test]
    fn a_directory_that_is_not_there_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let e = OutDir::open(&tmp.path().join("nope"), ExportOptions::default()).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("nope") && e.message.contains("no such directory"));
        fs::write(tmp.path().join("file"), "").unwrap();
        let e = OutDir::open(&tmp.path().join("file"), ExportOptions::default()).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotDirectory);
    }
}
