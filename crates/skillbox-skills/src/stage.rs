//! The stager: marketplace skills, delivered as bytes (a tar, a tar.gz, a zip, or a local
//! git repository), written to `<workspace>/.skills-cache/<source>/<name>`.
//!
//! The whole archive is read and checked first, in memory and within bounds: a path
//! with `..` or a root, a link that leads out of its skill, a device, a FIFO or a hard
//! link, too many entries or too many bytes (a zip bomb is caught by what it inflates
//! to, never by what its headers claim) refuse it, and nothing is written. Then each
//! file is written only when its content or mode differs from what is there (a temp
//! name, renamed into place), and what the source no longer has is removed: never
//! anything outside `.skills-cache/<source>`, which is walked beneath a directory fd
//! without following a symlink.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::catalog::{SKILLS_CACHE, USER_SOURCE};
use crate::skill::{self, SKILL_FILE, SkillError, valid_name};

/// What one stage may take in.
#[derive(Debug, Clone, Copy)]
pub struct StageLimits {
    /// Entries in the archive (files, directories, links).
    pub entries: usize,
    /// Bytes of file content, inflated.
    pub bytes: u64,
}

impl Default for StageLimits {
    fn default() -> Self {
        StageLimits {
            entries: 20_000,
            bytes: 512 * 1024 * 1024,
        }
    }
}

/// What a marketplace hands over.
#[derive(Debug, Clone, Copy)]
pub enum Archive<'a> {
    /// A tar archive, or a gzip-compressed one (told by its first bytes).
    Tar(&'a [u8]),
    Zip(&'a [u8]),
    /// A git repository on this machine: its `HEAD`, as `git archive` writes it.
    Git(&'a Path),
}

/// Why a stage was refused (nothing was written) or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StageError {
    #[error(
        "source {0:?}: use letters, digits, -, _ and ., at most 64 (and not \"user\", which is the user's own)"
    )]
    BadSource(String),
    #[error("refused: {entry}: {reason}")]
    Refused { entry: String, reason: String },
    #[error("refused: {0}")]
    TooLarge(String),
    #[error("the archive cannot be read: {0}")]
    Unreadable(String),
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
}

impl StageError {
    pub fn code(&self) -> skillbox_env::ErrorCode {
        use skillbox_env::ErrorCode;
        match self {
            StageError::BadSource(_) | StageError::Refused { .. } | StageError::Unreadable(_) => {
                ErrorCode::Invalid
            }
            StageError::TooLarge(_) => ErrorCode::ResourceExhausted,
            StageError::Io { .. } => ErrorCode::Unknown,
        }
    }
}

/// What a stage did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageReport {
    pub source: String,
    /// The skills now staged from it, by folder.
    pub skills: Vec<String>,
    /// Files written (new or changed), relative to `.skills-cache/<source>`.
    pub written: Vec<String>,
    /// Files already as the archive has them.
    pub unchanged: usize,
    /// What was removed because the source no longer has it.
    pub removed: Vec<String>,
    /// Skills in the archive that were not staged, and why.
    pub skipped: Vec<String>,
}

/// One entry as the archive gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: PathBuf },
}

fn refused(entry: impl std::fmt::Display, reason: impl Into<String>) -> StageError {
    StageError::Refused {
        entry: entry.to_string(),
        reason: reason.into(),
    }
}

/// The entry's path as plain relative names; refuses roots and `..`.
fn plain(name: &str) -> Result<PathBuf, StageError> {
    let path = Path::new(name);
    if path.is_absolute() {
        return Err(refused(name, "an absolute path"));
    }
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(refused(name, "a path with `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refused(name, "an absolute path"));
            }
        }
    }
    Ok(clean)
}

/// The archive's entries, checked and bounded.
struct Reader {
    limits: StageLimits,
    entries: BTreeMap<PathBuf, Item>,
    bytes: u64,
}

impl Reader {
    fn add(&mut self, name: &str, item: Item) -> Result<(), StageError> {
        let path = plain(name)?;
        if path.as_os_str().is_empty() {
            return Ok(());
        }
        if self.entries.len() >= self.limits.entries {
            return Err(StageError::TooLarge(format!(
                "more than {} entries",
                self.limits.entries
            )));
        }
        // The parents are directories, whatever the archive lists.
        for parent in path.ancestors().skip(1) {
            if parent.as_os_str().is_empty() {
                break;
            }
            match self.entries.get(parent) {
                Some(Item::Dir) | None => {}
                Some(_) => {
                    return Err(refused(
                        name,
                        format!("{} is a file and a directory", parent.display()),
                    ));
                }
            }
        }
        if let Some(existing) = self.entries.get(&path)
            && (*existing != Item::Dir || item != Item::Dir)
        {
            return Err(refused(name, "listed twice"));
        }
        self.entries.insert(path, item);
        Ok(())
    }

    /// Reads at most what is left of the byte bound from `from`.
    fn content(&mut self, name: &str, from: impl Read) -> Result<Vec<u8>, StageError> {
        let room = self.limits.bytes.saturating_sub(self.bytes);
        let mut data = Vec::new();
        from.take(room + 1)
            .read_to_end(&mut data)
            .map_err(|e| StageError::Unreadable(format!("{name}: {e}")))?;
        self.bytes += data.len() as u64;
        if self.bytes > self.limits.bytes {
            return Err(StageError::TooLarge(format!(
                "more than {} bytes once unpacked (at {name})",
                self.limits.bytes
            )));
        }
        Ok(data)
    }

    fn tar(&mut self, bytes: &[u8]) -> Result<(), StageError> {
        let gzip = bytes.starts_with(&[0x1f, 0x8b]);
        let source: Box<dyn Read> = if gzip {
            Box::new(flate2::read::GzDecoder::new(bytes))
        } else {
            Box::new(bytes)
        };
        let mut archive = tar::Archive::new(source);
        let entries = archive
            .entries()
            .map_err(|e| StageError::Unreadable(e.to_string()))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| StageError::Unreadable(e.to_string()))?;
            let name = entry
                .path()
                .map_err(|e| StageError::Unreadable(e.to_string()))?
                .to_string_lossy()
                .into_owned();
            let kind = entry.header().entry_type();
            let item = match kind {
                tar::EntryType::Directory => Item::Dir,
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let mode = entry.header().mode().unwrap_or(0o644);
                    Item::File {
                        data: self.content(&name, &mut entry)?,
                        mode,
                    }
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(|e| StageError::Unreadable(e.to_string()))?
                        .ok_or_else(|| refused(&name, "a symlink without a target"))?;
                    Item::Symlink {
                        target: target.into_owned(),
                    }
                }
                tar::EntryType::Link => {
                    return Err(refused(&name, "a hard link (give the file itself)"));
                }
                tar::EntryType::Char | tar::EntryType::Block => {
                    return Err(refused(&name, "a device file"));
                }
                tar::EntryType::Fifo => return Err(refused(&name, "a FIFO")),
                // pax headers and GNU long names are read by the tar crate itself.
                tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
                other => return Err(refused(&name, format!("an entry of type {other:?}"))),
            };
            self.add(&name, item)?;
        }
        Ok(())
    }

    fn zip(&mut self, bytes: &[u8]) -> Result<(), StageError> {
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
            .map_err(|e| StageError::Unreadable(e.to_string()))?;
        if archive.len() > self.limits.entries {
            return Err(StageError::TooLarge(format!(
                "more than {} entries",
                self.limits.entries
            )));
        }
        for i in 0..archive.len() {
            let mut file = archive
                .by_index(i)
                .map_err(|e| StageError::Unreadable(e.to_string()))?;
            let name = String::from_utf8_lossy(file.name_raw()).into_owned();
            let mode = file.unix_mode();
            let file_type = mode.map(|m| m & 0o170000);
            let item = if file.is_dir() {
                Item::Dir
            } else if file_type == Some(0o120000) {
                let target = self.content(&name, &mut file)?;
                Item::Symlink {
                    target: PathBuf::from(String::from_utf8_lossy(&target).into_owned()),
                }
            } else if matches!(file_type, Some(0o020000 | 0o060000)) {
                return Err(refused(&name, "a device file"));
            } else if file_type == Some(0o010000) {
                return Err(refused(&name, "a FIFO"));
            } else {
                Item::File {
                    data: self.content(&name, &mut file)?,
                    mode: mode.unwrap_or(0o644) & 0o7777,
                }
            };
            self.add(&name, item)?;
        }
        Ok(())
    }
}

/// `git archive` of `repo`'s HEAD, bounded.
fn git_archive(repo: &Path, limits: StageLimits) -> Result<Vec<u8>, StageError> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        // The repository is not trusted: none of its config runs anything here.
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
            "archive",
            "--format=tar",
            "HEAD",
        ])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| StageError::Unreadable(format!("git: {e}")))?;
    let mut output = output;
    let mut tar = Vec::new();
    // Headers and padding on top of the content bound.
    let cap = limits.bytes + (limits.entries as u64 + 2) * 1024;
    if let Some(stdout) = output.stdout.take() {
        stdout
            .take(cap + 1)
            .read_to_end(&mut tar)
            .map_err(|e| StageError::Unreadable(format!("git archive: {e}")))?;
    }
    if tar.len() as u64 > cap {
        let _ = output.kill();
        let _ = output.wait();
        return Err(StageError::TooLarge(format!(
            "git archive of {} is larger than {cap} bytes",
            repo.display()
        )));
    }
    let mut stderr = String::new();
    if let Some(mut err) = output.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    let status = output
        .wait()
        .map_err(|e| StageError::Unreadable(format!("git archive: {e}")))?;
    if !status.success() {
        return Err(StageError::Unreadable(format!(
            "git archive HEAD in {}: {}",
            repo.display(),
            stderr.trim()
        )));
    }
    Ok(tar)
}

/// A skill found in the archive: its folder name, and its entries relative to it.
#[derive(Debug, Default)]
struct Found {
    entries: BTreeMap<PathBuf, Item>,
}

/// Whether a file is made executable: a script (by its first bytes or its extension)
/// the archive had readable.
fn executable(path: &Path, data: &[u8], mode: u32) -> bool {
    let script = data.starts_with(b"#!")
        || matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("sh" | "bash" | "py" | "rb" | "pl" | "js" | "mjs")
        );
    script && mode & 0o444 != 0
}

/// Splits the archive's entries into skills: each SKILL.md makes its folder a skill
/// (the outermost one, where they nest); what is outside every skill is left out.
fn skills_of(
    entries: BTreeMap<PathBuf, Item>,
    skipped: &mut Vec<String>,
) -> Result<BTreeMap<String, Found>, StageError> {
    let mut roots: Vec<PathBuf> = entries
        .iter()
        .filter(|(path, item)| {
            matches!(item, Item::File { .. }) && path.file_name().is_some_and(|n| n == SKILL_FILE)
        })
        .map(|(path, _)| path.parent().unwrap_or(Path::new("")).to_path_buf())
        .collect();
    roots.sort_by_key(|p| p.components().count());
    let mut outer: Vec<PathBuf> = Vec::new();
    for root in roots {
        if !outer.iter().any(|o| root.starts_with(o)) {
            outer.push(root);
        }
    }
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    let mut folder_of: Vec<(PathBuf, String)> = Vec::new();
    for root in &outer {
        let Some(Item::File { data, .. }) = entries.get(&root.join(SKILL_FILE)) else {
            continue;
        };
        let shown = root.join(SKILL_FILE);
        let doc = match std::str::from_utf8(data)
            .map_err(|e| SkillError {
                file: shown.clone(),
                line: None,
                message: format!("not UTF-8: {e}"),
            })
            .and_then(|text| skill::parse(&shown, text))
        {
            Ok(doc) => doc,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        // A skill at the archive's root is named by its front matter.
        let folder = match root.file_name().and_then(|n| n.to_str()) {
            Some(name) => name.to_string(),
            None => doc.meta.name.clone(),
        };
        if !valid_name(&folder) {
            skipped.push(format!(
                "{}: the folder name {folder:?} cannot be a skill's (letters, digits, -, _ and .)",
                root.display()
            ));
            continue;
        }
        if found.contains_key(&folder) {
            return Err(refused(
                root.display(),
                format!("a second skill in a folder named {folder}"),
            ));
        }
        found.insert(folder.clone(), Found::default());
        folder_of.push((root.clone(), folder));
    }
    // Where the archive puts a symlink: a link's target may not pass through one.
    let links: std::collections::HashSet<PathBuf> = entries
        .iter()
        .filter(|(_, item)| matches!(item, Item::Symlink { .. }))
        .map(|(path, _)| path.clone())
        .collect();
    for (path, item) in entries {
        let Some((root, folder)) = folder_of.iter().find(|(root, _)| path.starts_with(root)) else {
            continue;
        };
        let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        if relative.as_os_str().is_empty() {
            continue;
        }
        if let Item::Symlink { target } = &item {
            // Resolved lexically from the link's own folder, it must stay in the skill,
            // and never pass through another link of the archive: read on disk, a
            // `..` after a link leaves the link's target, not the name before it, so
            // a chain of links that each look inside can lead anywhere.
            let mut resolved = relative.parent().unwrap_or(Path::new("")).to_path_buf();
            let mut inside = !target.is_absolute();
            let mut through_link = false;
            for component in target.components() {
                match component {
                    Component::Normal(part) => {
                        resolved.push(part);
                        through_link |= links.contains(&root.join(&resolved));
                    }
                    Component::CurDir => {}
                    Component::ParentDir => inside &= resolved.pop(),
                    _ => inside = false,
                }
            }
            if !inside {
                return Err(refused(
                    path.display(),
                    format!("a symlink to {} leads out of its skill", target.display()),
                ));
            }
            if through_link {
                return Err(refused(
                    path.display(),
                    format!(
                        "a symlink to {} goes through another symlink; a skill's links may point only at its own files and folders",
                        target.display()
                    ),
                ));
            }
        }
        if let Some(skill) = found.get_mut(folder) {
            skill.entries.insert(relative, item);
        }
    }
    Ok(found)
}

/// Stages `archive` as marketplace source `source` in `workspace`.
pub fn stage(
    workspace: &Path,
    source: &str,
    archive: Archive<'_>,
    limits: StageLimits,
) -> Result<StageReport, StageError> {
    if !valid_name(source) || source == USER_SOURCE {
        return Err(StageError::BadSource(source.to_string()));
    }
    let mut reader = Reader {
        limits,
        entries: BTreeMap::new(),
        bytes: 0,
    };
    match archive {
        Archive::Tar(bytes) => reader.tar(bytes)?,
        Archive::Zip(bytes) => reader.zip(bytes)?,
        Archive::Git(repo) => reader.tar(&git_archive(repo, limits)?)?,
    }
    let mut report = StageReport {
        source: source.to_string(),
        ..StageReport::default()
    };
    let skills = skills_of(reader.entries, &mut report.skipped)?;
    if skills.is_empty() {
        return Err(refused(
            "the archive",
            if report.skipped.is_empty() {
                "holds no skill (no SKILL.md)".to_string()
            } else {
                format!("holds no valid skill: {}", report.skipped.join("; "))
            },
        ));
    }
    report.skills = skills.keys().cloned().collect();
    let io = |path: &Path, e: Errno| StageError::Io {
        path: path.to_path_buf(),
        message: std::io::Error::from(e).to_string(),
    };
    let workspace_fd = rustix::fs::open(
        workspace,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(workspace, e))?;
    let cache = ensure_dir(workspace_fd.as_fd(), Path::new(SKILLS_CACHE))
        .map_err(|e| io(&workspace.join(SKILLS_CACHE), e))?;
    let root = ensure_dir(cache.as_fd(), Path::new(source))
        .map_err(|e| io(&workspace.join(SKILLS_CACHE).join(source), e))?;
    let shown = workspace.join(SKILLS_CACHE).join(source);

    let mut wanted: BTreeSet<PathBuf> = BTreeSet::new();
    for (folder, skill) in &skills {
        let base = PathBuf::from(folder);
        ensure_dir(root.as_fd(), &base).map_err(|e| io(&shown.join(&base), e))?;
        wanted.insert(base.clone());
        for (relative, item) in &skill.entries {
            let path = base.join(relative);
            wanted.insert(path.clone());
            for parent in path.ancestors().skip(1) {
                wanted.insert(parent.to_path_buf());
            }
            let placed = match item {
                Item::Dir => ensure_dir(root.as_fd(), &path).map(|_| false),
                Item::File { data, mode } => {
                    let mode = if executable(&path, data, *mode) {
                        0o755
                    } else {
                        0o644
                    };
                    put_file(root.as_fd(), &path, data, mode)
                }
                Item::Symlink { target } => put_symlink(root.as_fd(), &path, target),
            }
            .map_err(|e| io(&shown.join(&path), e))?;
            match (item, placed) {
                (Item::Dir, _) => {}
                (_, true) => report.written.push(path.display().to_string()),
                (_, false) => report.unchanged += 1,
            }
        }
    }
    remove_orphans(root.as_fd(), Path::new(""), &wanted, &mut report.removed)
        .map_err(|e| io(&shown, e))?;
    Ok(report)
}

fn beneath(dir: BorrowedFd<'_>, path: &Path, flags: OFlags) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        path,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

/// The directory `path` beneath `dir`, made (with its parents) where missing; whatever
/// else stands in the way (a file, a symlink) is replaced.
fn ensure_dir(dir: BorrowedFd<'_>, path: &Path) -> Result<OwnedFd, Errno> {
    let mut current = PathBuf::new();
    for component in path.components() {
        current.push(component);
        match beneath(dir, &current, OFlags::DIRECTORY | OFlags::RDONLY) {
            Ok(_) => continue,
            Err(Errno::NOENT) => {}
            // A symlink (ELOOP) or a file (ENOTDIR) where a directory goes.
            Err(Errno::LOOP | Errno::NOTDIR) => {
                rustix::fs::unlinkat(dir, &current, AtFlags::empty())?;
            }
            Err(e) => return Err(e),
        }
        match rustix::fs::mkdirat(dir, &current, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
    }
    beneath(dir, path, OFlags::DIRECTORY | OFlags::RDONLY)
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Writes `data` at `path` (beneath `dir`) unless a regular file with that content and
/// mode is there. Returns whether it wrote.
fn put_file(dir: BorrowedFd<'_>, path: &Path, data: &[u8], mode: u32) -> Result<bool, Errno> {
    use std::io::Write;
    let parent = path.parent().unwrap_or(Path::new(""));
    let name = path.file_name().ok_or(Errno::INVAL)?;
    let parent_fd = ensure_dir(dir, parent)?;
    match rustix::fs::statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat)
            if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                == rustix::fs::FileType::RegularFile
                && stat.st_mode & 0o7777 == mode
                && stat.st_size as usize == data.len() =>
        {
            let fd = rustix::fs::openat(
                &parent_fd,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )?;
            let mut there = Vec::with_capacity(data.len());
            std::fs::File::from(fd)
                .read_to_end(&mut there)
                .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
            if sha256(&there) == sha256(data) {
                return Ok(false);
            }
        }
        Ok(stat)
            if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                == rustix::fs::FileType::Directory =>
        {
            remove_tree_at(&parent_fd, Path::new(name))?;
        }
        _ => {}
    }
    let temp = format!(".stage-{}.tmp", std::process::id());
    let fd = rustix::fs::openat(
        &parent_fd,
        &temp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    let mut file = std::fs::File::from(fd);
    if let Err(e) = file.write_all(data) {
        let _ = rustix::fs::unlinkat(&parent_fd, &temp, AtFlags::empty());
        return Err(Errno::from_io_error(&e).unwrap_or(Errno::IO));
    }
    drop(file);
    rustix::fs::renameat(&parent_fd, &temp, &parent_fd, name)?;
    Ok(true)
}

fn put_symlink(dir: BorrowedFd<'_>, path: &Path, target: &Path) -> Result<bool, Errno> {
    let parent = path.parent().unwrap_or(Path::new(""));
    let name = path.file_name().ok_or(Errno::INVAL)?;
    let parent_fd = ensure_dir(dir, parent)?;
    if let Ok(there) = rustix::fs::readlinkat(&parent_fd, name, Vec::new())
        && Path::new(std::ffi::OsStr::from_bytes(there.as_bytes())) == target
    {
        return Ok(false);
    }
    match rustix::fs::statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat)
            if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                == rustix::fs::FileType::Directory =>
        {
            remove_tree_at(&parent_fd, Path::new(name))?;
        }
        Ok(_) => rustix::fs::unlinkat(&parent_fd, name, AtFlags::empty())?,
        Err(_) => {}
    }
    rustix::fs::symlinkat(target, &parent_fd, name)?;
    Ok(true)
}

/// Removes `path` beneath `dir`, a directory tree or anything else, never following a
/// symlink.
fn remove_tree_at(dir: &OwnedFd, path: &Path) -> Result<(), Errno> {
    let stat = rustix::fs::statat(dir, path, AtFlags::SYMLINK_NOFOLLOW)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Directory {
        return rustix::fs::unlinkat(dir, path, AtFlags::empty());
    }
    let sub = beneath(dir.as_fd(), path, OFlags::DIRECTORY | OFlags::RDONLY)?;
    for name in list(&sub)? {
        remove_tree_at(&sub, Path::new(&name))?;
    }
    rustix::fs::unlinkat(dir, path, AtFlags::REMOVEDIR)
}

fn list(dir: &OwnedFd) -> Result<Vec<std::ffi::OsString>, Errno> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(std::ffi::OsStr::from_bytes(name).to_os_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Removes what is under `rel` (beneath `root`) and not in `wanted`.
fn remove_orphans(
    root: BorrowedFd<'_>,
    rel: &Path,
    wanted: &BTreeSet<PathBuf>,
    removed: &mut Vec<String>,
) -> Result<(), Errno> {
    let dir = if rel.as_os_str().is_empty() {
        rustix::io::dup(root)?
    } else {
        beneath(root, rel, OFlags::DIRECTORY | OFlags::RDONLY)?
    };
    for name in list(&dir)? {
        let path = rel.join(&name);
        if !wanted.contains(&path) {
            remove_tree_at(&dir, Path::new(&name))?;
            removed.push(path.display().to_string());
            continue;
        }
        let stat = rustix::fs::statat(&dir, Path::new(&name), AtFlags::SYMLINK_NOFOLLOW)?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory {
            remove_orphans(root, &path, wanted, removed)?;
        }
    }
    Ok(())
}
