//! Writing a run's files into a directory on the host (`--out DIR`): the door through
//! which what sandboxed code made reaches the machine, so nothing the code chose can
//! steer where or how a file lands, nor what a host tool does with it afterwards.
//!
//! - **By what was declared.** Only what the caller declared lands in the directory
//!   itself ([`Declared`]: a run's `--outputs` globs, a capability's `write_file`
//!   globs, an agent's verified artifacts, a file the user named). Everything else goes
//!   into a new directory of its own beneath it (`run-1a2b3c4d/`), never merged into a
//!   tree that is already there; a hidden path only when declared.
//! - **Never a name a host tool acts on** ([`never_written`]), declared or not, as
//!   defence in depth: no `.git`, no `HEAD` (git opens any directory holding `HEAD`,
//!   `objects/` and `refs/` as a repository, and runs its config's commands), no
//!   `objects/` or `refs/` made beside a `HEAD` already there, no `__pycache__` or
//!   `*.pyc` (Python runs bytecode found beside a module), no name that starts with `-`
//!   (a command given `*` there reads it as an option).
//! - The directory is opened once, as a directory fd, and every entry is created beneath
//!   it one component at a time (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`,
//!   `O_NOFOLLOW`): a symlink in the way is refused, never followed, and no path leaves it.
//! - An existing file is never replaced unless the caller asked for it (`overwrite`); the
//!   error names the file and the other files are still written.
//! - Files are created 0644 and directories 0755 (less under the umask): whatever mode
//!   the sandbox gave a file, no exec, setuid, setgid or sticky bit comes out.
//! - Each file is written beneath the same directory fd as a file with no name
//!   (`O_TMPFILE`), linked in under a hidden temp name once it is whole, and renamed
//!   into place with `RENAME_NOREPLACE`: a partial file never has its final name, and a
//!   copy killed mid-write leaves nothing behind. Where the filesystem has no unnamed
//!   files (or this process cannot link one in), the temp name is the file's from the
//!   start, and such a kill leaves it.
//! - A count and a byte cap bound the whole export.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags};
use rustix::io::Errno;
use skillbox_protocol::{ArtifactInfo, ErrorCode, OutputSelection, WorkspacePath};

use crate::{ClientError, SkillSandbox};

/// The umask of whoever ran this process, for the modes copy-out gives: the binary
/// runs under a private umask of its own (what it keeps is its user's alone), but the
/// files it writes for its caller are the caller's, as the caller's own files are.
static CALLER_UMASK: AtomicU32 = AtomicU32::new(0o022);

/// Records the umask the caller ran this process with (before it set its own).
pub fn set_caller_umask(mask: u32) {
    CALLER_UMASK.store(mask & 0o777, Ordering::Relaxed);
}

/// `mode` less the caller's umask.
fn caller_mode(mode: u32) -> Mode {
    Mode::from_raw_mode(mode & !CALLER_UMASK.load(Ordering::Relaxed))
}

/// Gives `fd` (a file or directory this export made) `mode` less the caller's umask,
/// whatever this process's own umask took off at its creation.
fn set_mode(fd: BorrowedFd<'_>, mode: u32, target: &Path) -> Result<(), ClientError> {
    rustix::fs::fchmod(fd, caller_mode(mode)).map_err(|e| failed(target, e, "set its mode"))
}

/// Most files one export writes.
pub const DEFAULT_MAX_FILES: usize = 1000;
/// Most bytes one export writes (the server's own collection limit).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// What the caller declared it wants in the directory itself.
#[derive(Debug, Clone, Default)]
pub enum Declared {
    /// Nothing: every file goes into a directory of its own.
    #[default]
    Nothing,
    /// The files these globs select (a run's `--outputs`, a capability's `write_file`).
    /// No globs (every visible file) declares nothing.
    Globs(OutputSelection),
    /// These paths exactly (an agent's verified artifacts, a file the user named).
    Paths(BTreeSet<String>),
}

impl Declared {
    /// Whether `path` was declared.
    pub fn declares(&self, path: &str) -> bool {
        match self {
            Declared::Nothing => false,
            Declared::Globs(globs) => globs.is_declared() && globs.selects(path),
            Declared::Paths(paths) => paths.contains(path),
        }
    }
}

/// How an export may write.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Replace files that exist (never directories, never through a symlink).
    pub overwrite: bool,
    /// What lands in the directory itself.
    pub declared: Declared,
    /// The start of the name of the directory the rest lands in (`run` gives
    /// `run-1a2b3c4d`), made beneath the directory for the first such file.
    pub own_dir_prefix: &'static str,
    pub max_files: usize,
    pub max_bytes: u64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            overwrite: false,
            declared: Declared::Nothing,
            own_dir_prefix: "run",
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
    /// A hidden path nobody declared: nothing written.
    NotSelected,
}

/// A host directory that a run's files are written into.
#[derive(Debug)]
pub struct OutDir {
    dir: OwnedFd,
    path: PathBuf,
    options: ExportOptions,
    /// The directory undeclared files land in, once one did: its fd and host path.
    own: Option<(OwnedFd, PathBuf)>,
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

/// A name for a file being written, apart from any other by its random part; hidden,
/// so that nothing looks like an artifact.
fn temp_name(target: &Path) -> Result<String, ClientError> {
    let random = skillbox_protocol::random::hex(12).map_err(|e| {
        err(
            ErrorCode::Unavailable,
            format!("{}: no temp name to write it under: {e}", target.display()),
        )
    })?;
    Ok(format!(".skillbox-partial-{random}"))
}

/// Why an artifact at `parts` is never written to a host directory, whatever was
/// declared: what a host tool would do with it. Names are compared without case, as a
/// case-folding file system (or git on one) would.
pub fn never_written(parts: &[&str]) -> Option<&'static str> {
    for part in parts {
        if part.eq_ignore_ascii_case(".git") {
            return Some("git takes a .git for a repository's own files");
        }
        if part.eq_ignore_ascii_case("HEAD") {
            return Some(
                "a HEAD beside objects/ and refs/ makes git open its directory as a repository and run its config's commands",
            );
        }
        if part.eq_ignore_ascii_case("__pycache__") {
            return Some("Python runs the bytecode it finds in __pycache__");
        }
        if part.starts_with('-') {
            return Some("a command given * in that directory would read the name as an option");
        }
    }
    let last = parts.last()?.to_ascii_lowercase();
    if last.ends_with(".pyc") || last.ends_with(".pyo") {
        return Some("Python runs bytecode it finds beside a module");
    }
    None
}

/// The components of an artifact's path, or why it is not one: relative, plain, and
/// exactly as a collection gives it (an empty or `.` component is refused, not dropped).
fn components(rel: &str) -> Result<Vec<&str>, String> {
    let path = WorkspacePath::relative(rel).map_err(|e| e.reason)?;
    if path.is_root() {
        return Err("names no file".into());
    }
    if path.as_str() != rel {
        return Err("has an empty or . component".into());
    }
    Ok(rel.split('/').collect())
}

/// Makes a new directory `PREFIX-` + 8 random hex digits beneath `dir` (shown as
/// `base`): one that was not there, never one already in use.
fn make_own_dir(
    dir: BorrowedFd<'_>,
    base: &Path,
    prefix: &str,
) -> Result<(OwnedFd, PathBuf), ClientError> {
    for _ in 0..8 {
        let random = skillbox_protocol::random::hex(4).map_err(|e| {
            err(
                ErrorCode::Unavailable,
                format!(
                    "{}: no name for the run's own directory: {e}",
                    base.display()
                ),
            )
        })?;
        let name = format!("{prefix}-{random}");
        let path = base.join(&name);
        match rustix::fs::mkdirat(dir, name.as_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) => {}
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(failed(&path, e, "create the run's own directory")),
        }
        let fd = open_beneath(
            dir,
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .map_err(|e| failed(&path, e, "open the directory it made"))?;
        set_mode(fd.as_fd(), 0o755, &path)?;
        return Ok((fd, path));
    }
    Err(err(
        ErrorCode::AlreadyExists,
        format!(
            "{}: every name tried for the run's own directory was taken",
            base.display()
        ),
    ))
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
            own: None,
            files: 0,
            bytes: 0,
        })
    }

    /// Declares what lands in the directory itself from now on (what an agent verified
    /// is known only once it ends).
    pub fn declare(&mut self, declared: Declared) {
        self.options.declared = declared;
    }

    /// The directory as it was named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory of their own that undeclared files went into, once one did.
    pub fn own_dir(&self) -> Option<&Path> {
        self.own.as_ref().map(|(_, path)| path.as_path())
    }

    /// Whether `rel` is written at all (declared, or not hidden); an error for a path
    /// that is not one, or that is never written.
    pub fn selects(&self, rel: &str) -> Result<bool, ClientError> {
        let parts = components(rel).map_err(|why| self.invalid(rel, &why))?;
        if let Some(why) = never_written(&parts) {
            return Err(err(
                ErrorCode::PermissionDenied,
                format!("artifact {rel:?}: never written to a host directory: {why}"),
            ));
        }
        Ok(self.options.declared.declares(rel) || !parts.iter().any(|p| p.starts_with('.')))
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

    /// Writes `bytes` as `rel`: in the directory itself when declared, else in the
    /// directory of the run's own (made for the first such file). A refusal leaves the
    /// directories as they were: no partial file, no replaced file.
    pub fn write(&mut self, rel: &str, bytes: &[u8]) -> Result<Exported, ClientError> {
        if !self.selects(rel)? {
            return Ok(Exported::NotSelected);
        }
        let declared = self.options.declared.declares(rel);
        let shown = || match (&self.own, declared) {
            (Some((_, own)), false) => own.join(rel),
            (None, false) => self
                .path
                .join(format!("{}-…", self.options.own_dir_prefix))
                .join(rel),
            (_, true) => self.path.join(rel),
        };
        if self.files >= self.options.max_files {
            return Err(err(
                ErrorCode::ResourceExhausted,
                format!(
                    "{}: not written: more than {} files in one export",
                    shown().display(),
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
                    shown().display(),
                    self.options.max_bytes
                ),
            ));
        }
        if !declared && self.own.is_none() {
            self.own = Some(make_own_dir(
                self.dir.as_fd(),
                &self.path,
                self.options.own_dir_prefix,
            )?);
        }
        let (top, base) = match (&self.own, declared) {
            (Some((fd, path)), false) => (fd.as_fd(), path.as_path()),
            _ => (self.dir.as_fd(), self.path.as_path()),
        };
        let target = base.join(rel);
        let parts: Vec<&str> = rel.split('/').collect();
        let Some((name, dirs)) = parts.split_last() else {
            return Err(self.invalid(rel, "names no file"));
        };
        let parent = open_parent(top, base, dirs)?;
        let parent = parent.as_ref().map_or(top, |fd| fd.as_fd());
        place(parent, name, bytes, &target, self.options.overwrite)?;
        self.files += 1;
        self.bytes += len;
        Ok(Exported::Written(target))
    }
}

/// Opens (creating, 0755) each of `dirs` beneath `top` (shown as `base`), refusing a
/// symlink or a file in the way, and an `objects` or `refs` beside a `HEAD` already
/// there. `None`: `top` itself.
fn open_parent(
    top: BorrowedFd<'_>,
    base: &Path,
    dirs: &[&str],
) -> Result<Option<OwnedFd>, ClientError> {
    let mut current: Option<OwnedFd> = None;
    for (depth, name) in dirs.iter().enumerate() {
        let at = current.as_ref().map_or(top, |fd| fd.as_fd());
        let shown = || base.join(dirs[..=depth].join("/"));
        if (name.eq_ignore_ascii_case("objects") || name.eq_ignore_ascii_case("refs"))
            && rustix::fs::statat(at, "HEAD", AtFlags::SYMLINK_NOFOLLOW).is_ok()
        {
            return Err(err(
                ErrorCode::PermissionDenied,
                format!(
                    "{}: not made beside a HEAD, where git would open the directory as a repository; nothing written beneath it",
                    shown().display()
                ),
            ));
        }
        let made = match rustix::fs::mkdirat(at, *name, Mode::from_raw_mode(0o755)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => {
                return Err(err(
                    errno_code(e),
                    format!("{}: cannot create the directory: {e}", shown().display()),
                ));
            }
        };
        let next = open_beneath(at, name, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| {
                // O_NOFOLLOW | O_DIRECTORY on a symlink is ENOTDIR: look at what it is.
                let link = matches!(e, Errno::LOOP | Errno::NOTDIR)
                    && rustix::fs::statat(at, *name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|stat| {
                        FileType::from_raw_mode(stat.st_mode) == FileType::Symlink
                    });
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
        if made {
            set_mode(next.as_fd(), 0o755, &shown())?;
        }
        current = Some(next);
    }
    Ok(current)
}

/// Writes the file beneath `parent` under a temp name, then renames it to `name`.
fn place(
    parent: BorrowedFd<'_>,
    name: &str,
    bytes: &[u8],
    target: &Path,
    overwrite: bool,
) -> Result<(), ClientError> {
    let temp = temp_name(target)?;
    if !write_unnamed(parent, &temp, bytes, target)? {
        write_named(parent, &temp, bytes, target)?;
    }
    let result = if overwrite {
        replace(parent, &temp, name, target)
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
    set_mode(fd.as_fd(), 0o644, target)?;
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
    let written = set_mode(fd.as_fd(), 0o644, target).and_then(|()| {
        std::fs::File::from(fd)
            .write_all(bytes)
            .map_err(|e| write_failed(target, e))
    });
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(parent, temp, AtFlags::empty());
        return Err(e);
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

    /// Everything declared: each file lands in the directory itself.
    fn declared_all() -> ExportOptions {
        ExportOptions {
            declared: Declared::Globs(OutputSelection::new(&["**"]).unwrap()),
            ..ExportOptions::default()
        }
    }

    fn out(dir: &Path) -> OutDir {
        OutDir::open(dir, declared_all()).unwrap()
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
        assert_eq!(out.own_dir(), None);
    }

    #[test]
    fn undeclared_files_land_in_a_new_directory_of_their_own_never_merged() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("src")).unwrap();
        fs::write(tmp.path().join("src/main.py"), "mine").unwrap();
        let options = ExportOptions {
            declared: Declared::Paths(BTreeSet::from(["deck.pptx".to_string()])),
            ..ExportOptions::default()
        };
        let mut out = OutDir::open(tmp.path(), options.clone()).unwrap();
        assert_eq!(
            out.write("deck.pptx", b"pk").unwrap(),
            Exported::Written(tmp.path().join("deck.pptx"))
        );
        let Exported::Written(at) = out.write("src/main.py", b"theirs").unwrap() else {
            panic!("not written");
        };
        let own = out.own_dir().unwrap().to_path_buf();
        assert_eq!(at, own.join("src/main.py"));
        let name = own.file_name().unwrap().to_str().unwrap();
        assert!(
            name.len() == "run-".len() + 8 && name.starts_with("run-"),
            "{name}"
        );
        assert_eq!(
            fs::read_to_string(tmp.path().join("src/main.py")).unwrap(),
            "mine"
        );
        // Undeclared and hidden: not written anywhere.
        assert_eq!(out.write(".envrc", b"x").unwrap(), Exported::NotSelected);
        // A second export makes a second directory: never one already there.
        let mut again = OutDir::open(tmp.path(), options).unwrap();
        again.write("src/main.py", b"again").unwrap();
        assert_ne!(again.own_dir().unwrap(), own);
        assert_eq!(
            fs::read_to_string(own.join("src/main.py")).unwrap(),
            "theirs"
        );
        // Globs that select every visible file declare nothing.
        let options = ExportOptions {
            declared: Declared::Globs(OutputSelection::visible()),
            own_dir_prefix: "agent",
            ..ExportOptions::default()
        };
        let mut out = OutDir::open(tmp.path(), options).unwrap();
        out.write("deck2.pptx", b"pk").unwrap();
        assert!(
            out.own_dir()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("agent-")
        );
        assert!(!tmp.path().join("deck2.pptx").exists());
    }

    #[test]
    fn names_a_host_tool_acts_on_are_never_written_even_when_declared() {
        let tmp = tempfile::tempdir().unwrap();
        let mut out = out(tmp.path());
        for path in [
            "src/HEAD",
            "src/head",
            ".git/config",
            "a/.GIT/hooks/pre-commit",
            "__pycache__/utils.cpython-311.pyc",
            "utils.pyc",
            "lib/x.PYO",
            "--checkpoint-action=exec=sh x.sh",
            "d/-rf",
        ] {
            let e = out.write(path, b"x").unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied, "{path}: {e}");
            assert!(e.message.contains("never written"), "{path}: {e}");
        }
        assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
        // objects/ and refs/ beside a HEAD already there (the user's): not made.
        fs::create_dir(tmp.path().join("src")).unwrap();
        fs::write(tmp.path().join("src/HEAD"), "ref: refs/heads/main\n").unwrap();
        for path in ["src/objects/info/packs", "src/refs/heads/x"] {
            let e = out.write(path, b"x").unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied, "{path}: {e}");
            assert!(e.message.contains("beside a HEAD"), "{path}: {e}");
        }
        assert_eq!(entries(tmp.path()), ["src", "src/HEAD"]);
        // Names that only look alike are written.
        for path in ["HEADER.md", "objects/x.txt", "py/cache.py", "a-b"] {
            out.write(path, b"x").unwrap();
        }
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
            ..declared_all()
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
            ..declared_all()
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
    fn hidden_paths_are_written_only_when_declared_with_their_dot() {
        let tmp = tempfile::tempdir().unwrap();
        let mut out = out(tmp.path());
        for path in [".envrc", "a/.bashrc"] {
            assert_eq!(
                out.write(path, b"x").unwrap(),
                Exported::NotSelected,
                "{path}"
            );
        }
        assert!(entries(tmp.path()).is_empty());
        let options = ExportOptions {
            declared: Declared::Globs(OutputSelection::new(&[".envrc"]).unwrap()),
            ..ExportOptions::default()
        };
        let mut out = OutDir::open(tmp.path(), options).unwrap();
        assert!(matches!(
            out.write(".envrc", b"x").unwrap(),
            Exported::Written(_)
        ));
        assert_eq!(out.write(".bashrc", b"x").unwrap(), Exported::NotSelected);
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
            ..declared_all()
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
