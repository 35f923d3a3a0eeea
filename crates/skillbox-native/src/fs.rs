//! The host-side view of a native sandbox's files. It sees exactly what the sandbox's
//! processes see through the mounts, never more: every path is opened beneath the
//! mount's directory fd with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, so no
//! symlink or `..` can lead out; writes only where the sandbox may write.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use skillbox_env::{
    CancellationToken, DirEntry, EnvError, EnvResult, ErrorCode, FileInfo, FileKind, FileSystem,
    MAX_LIST_ENTRIES, TextLines, Tree, TreeKind, blocking,
};

use crate::ids::HostIds;
use crate::sandbox::NativeSandbox;

/// The env's own temp entries, beneath the workspace (never collected).
const TEMP_DIR: &str = ".tmp";

/// A path resolved to a mount: the mount's dir fd and the path below it.
#[derive(Debug, Clone)]
struct Located {
    fd: Arc<OwnedFd>,
    host_root: PathBuf,
    sandbox_root: PathBuf,
    relative: PathBuf,
    writable: bool,
    /// In a read-write volume: the sandbox writes there, the file view does not.
    volume: bool,
    /// Where the workspace is (for messages).
    workspace: PathBuf,
    chown_to: Option<HostIds>,
    /// The path as the caller gave it (for messages).
    shown: PathBuf,
}

fn io_err(errno: Errno, op: &str, path: &Path) -> EnvError {
    EnvError::io(&std::io::Error::from(errno), op, path)
}

impl Located {
    fn err(&self, errno: Errno, op: &str) -> EnvError {
        io_err(errno, op, &self.shown)
    }

    fn open(&self, rel: &Path, flags: OFlags, mode: Mode, op: &str) -> EnvResult<OwnedFd> {
        self.open_errno(rel, flags, mode)
            .map_err(|e| self.err(e, op))
    }

    /// [`Located::open`], its failure the bare errno.
    fn open_errno(&self, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        rustix::fs::openat2(
            self.fd.as_fd(),
            rel,
            flags | OFlags::CLOEXEC,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// The file to read, opened without waiting on a FIFO: regular files only.
    fn open_to_read(&self) -> EnvResult<std::fs::File> {
        let fd = self.open(
            &self.relative,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
            "read",
        )?;
        skillbox_env::regular_file(fd, "read", &self.shown)
    }

    /// As [`Located::open_to_read`], but a symlink at the path itself is refused
    /// (`O_NOFOLLOW`), not followed.
    fn open_to_read_no_follow(&self) -> EnvResult<std::fs::File> {
        let fd = self
            .open_errno(
                &self.relative,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .map_err(|e| match e {
                Errno::LOOP => skillbox_env::symlink_not_read(&self.shown),
                e => self.err(e, "read"),
            })?;
        skillbox_env::regular_file(fd, "read", &self.shown)
    }

    /// The parent directory (opened beneath the mount) and the last component.
    fn parent(&self, op: &str) -> EnvResult<(OwnedFd, PathBuf)> {
        let name = match self.relative.components().next_back() {
            Some(Component::Normal(name)) => PathBuf::from(name),
            _ => {
                return Err(EnvError::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "{op} {}: is a mount point of the sandbox",
                        self.shown.display()
                    ),
                )
                .with_path(&self.shown));
            }
        };
        let parent = self.relative.parent().unwrap_or(Path::new(""));
        let dir = self.open(parent, OFlags::PATH | OFlags::DIRECTORY, Mode::empty(), op)?;
        Ok((dir, name))
    }

    fn require_writable(&self, op: &str) -> EnvResult<()> {
        if self.volume {
            Err(EnvError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "{op} {}: a read-write volume is written by the sandbox's own code only; \
                     skillbox's file operations write under {}",
                    self.shown.display(),
                    self.workspace.display()
                ),
            )
            .with_path(&self.shown))
        } else if self.writable {
            Ok(())
        } else {
            Err(EnvError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "{op} {}: read-only in this sandbox (only {} is writable)",
                    self.shown.display(),
                    self.workspace.display()
                ),
            )
            .with_path(&self.shown))
        }
    }

    /// `rel` below this path, as its own `Located` (named in messages as such).
    fn below(&self, rel: &Path) -> Located {
        Located {
            relative: self.relative.join(rel),
            shown: self.shown.join(rel),
            ..self.clone()
        }
    }

    /// Creates or replaces the file `name` in `dir` (opened beneath the mount) with
    /// `data` and the permission bits `mode`: written under a temp name, chowned, and
    /// renamed over `name`, so a reader sees the old content or the new, and a symlink at
    /// `name` is replaced, never followed.
    fn replace_file(&self, dir: &OwnedFd, name: &Path, data: &[u8], mode: u32) -> EnvResult<()> {
        let tmp = PathBuf::from(
            skillbox_env::path::temp_name(&format!(".{}.", name.display()))
                .map_err(|e| EnvError::io(&e, "write", name))?,
        );
        let fd = rustix::fs::openat(
            dir,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| self.err(e, "write"))?;
        let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o777));
        let mut file = std::fs::File::from(fd);
        let written = file.write_all(data).and_then(|()| file.flush());
        drop(file);
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
            return Err(EnvError::io(&e, "write", &self.shown));
        }
        self.chown(dir, &tmp);
        rustix::fs::renameat(dir, &tmp, dir, name).map_err(|e| {
            let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
            self.err(e, "write")
        })
    }

    fn chown(&self, dir: &OwnedFd, name: &Path) {
        if let Some(ids) = self.chown_to {
            let _ = rustix::fs::chownat(
                dir,
                name,
                Some(rustix::fs::Uid::from_raw(ids.uid)),
                Some(rustix::fs::Gid::from_raw(ids.gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            );
        }
    }
}

fn kind_of(file_type: rustix::fs::FileType) -> FileKind {
    use rustix::fs::FileType;
    match file_type {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

impl NativeSandbox {
    fn locate(&self, path: &Path) -> EnvResult<Located> {
        let mut abs = self.absolute_path(path);
        for (alias, target) in &self.root.aliases {
            if let Ok(rest) = abs.strip_prefix(alias) {
                abs = target.join(rest);
                break;
            }
        }
        for mount in &self.root.mounts {
            if let Ok(rest) = abs.strip_prefix(&mount.sandbox) {
                return Ok(Located {
                    fd: mount.fd.clone(),
                    host_root: mount.host.clone(),
                    sandbox_root: mount.sandbox.clone(),
                    relative: rest.to_path_buf(),
                    writable: mount.writable,
                    volume: mount.volume,
                    workspace: self.root.workspace.clone(),
                    chown_to: self.chown_to,
                    shown: abs.clone(),
                });
            }
        }
        let private = ["/tmp", "/proc", "/dev"].iter().any(|p| abs.starts_with(p));
        let message = if private {
            format!(
                "{}: private to each exec; only {} and the read-only system directories are shared",
                abs.display(),
                self.root.workspace.display()
            )
        } else {
            format!("{}: not visible in this sandbox", abs.display())
        };
        Err(EnvError::new(
            if private {
                ErrorCode::NotSupported
            } else {
                ErrorCode::NotFound
            },
            message,
        )
        .with_path(&abs))
    }

    fn remember(&self, path: &Path) {
        if let Ok(mut temps) = self.temps.lock() {
            temps.push(path.to_path_buf());
        }
    }

    fn make_dirs(loc: &Located, rel: &Path) -> EnvResult<()> {
        let mut current = PathBuf::new();
        for component in rel.components() {
            current.push(component);
            let (dir, name) = Located {
                relative: current.clone(),
                ..loc.clone()
            }
            .parent("create_dir")?;
            match rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o755)) {
                Ok(()) => loc.chown(&dir, &name),
                Err(Errno::EXIST) => {}
                Err(e) => return Err(loc.err(e, "create_dir")),
            }
        }
        Ok(())
    }
}

/// The entries of `dir`, sorted; `None` when there are more than [`MAX_LIST_ENTRIES`]
/// (read no further than that).
fn list(dir: OwnedFd) -> Result<Option<Vec<DirEntry>>, Errno> {
    let mut entries = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if entries.len() == MAX_LIST_ENTRIES {
            return Ok(None);
        }
        let name_os = std::ffi::OsStr::from_bytes(name);
        let look = || rustix::fs::statat(&dir, name_os, AtFlags::SYMLINK_NOFOLLOW).ok();
        let (kind, size) = match entry.file_type() {
            // A regular file's size takes a look at it; nothing else does.
            rustix::fs::FileType::RegularFile => (
                FileKind::File,
                look().map(|s| u64::try_from(s.st_size).unwrap_or(0)),
            ),
            rustix::fs::FileType::Unknown => match look() {
                Some(s) => {
                    let kind = kind_of(rustix::fs::FileType::from_raw_mode(s.st_mode));
                    let size =
                        (kind == FileKind::File).then(|| u64::try_from(s.st_size).unwrap_or(0));
                    (kind, size)
                }
                None => (FileKind::Other, None),
            },
            t => (kind_of(t), None),
        };
        entries.push(DirEntry {
            name: String::from_utf8_lossy(name).into_owned(),
            kind,
            size,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(entries))
}

/// The directories a `put_tree` has open, from its base down, each opened from its
/// parent's fd. An entry's directory is reached from the deepest open one on its way,
/// made (when missing) and opened one name at a time, so an entry of a tree in path
/// order costs a few system calls whatever its depth. (Made again from the mount's fd for every entry, each
/// component's path resolved anew, a tree 2,000 deep cost minutes of system time.)
struct OpenDirs<'a> {
    base: &'a Located,
    /// The base's fd, then one for each of `names`.
    fds: Vec<OwnedFd>,
    names: Vec<std::ffi::OsString>,
}

impl<'a> OpenDirs<'a> {
    /// The base, made with its parents, opened beneath the mount.
    fn new(base: &'a Located) -> EnvResult<OpenDirs<'a>> {
        NativeSandbox::make_dirs(base, &base.relative)?;
        let fd = base.open(
            &base.relative,
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
            "put_tree",
        )?;
        Ok(OpenDirs {
            base,
            fds: vec![fd],
            names: Vec::new(),
        })
    }

    /// The directory `rel` beneath the base, made with its parents. Something else
    /// there (a file, a symlink to one) is `not_directory`; a symlink out of the mount,
    /// `permission_denied`.
    fn dir(&mut self, rel: &Path) -> EnvResult<&OwnedFd> {
        let wanted: Vec<&std::ffi::OsStr> = rel.iter().collect();
        let kept = self
            .names
            .iter()
            .zip(&wanted)
            .take_while(|(open, name)| open.as_os_str() == **name)
            .count();
        self.names.truncate(kept);
        self.fds.truncate(kept + 1);
        for name in &wanted[kept..] {
            let fd = self.child(name)?;
            self.names.push(name.to_os_string());
            self.fds.push(fd);
        }
        Ok(&self.fds[self.names.len()])
    }

    /// `name` in the deepest open directory, made if missing, and opened.
    fn child(&self, name: &std::ffi::OsStr) -> EnvResult<OwnedFd> {
        let parent = &self.fds[self.names.len()];
        let here = || {
            let rel: PathBuf = self.names.iter().collect();
            self.base.below(&rel.join(name))
        };
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => self.base.chown(parent, Path::new(name)),
            Err(Errno::EXIST) => {}
            Err(e) => return Err(here().err(e, "put_tree")),
        }
        match rustix::fs::openat2(
            parent,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => Ok(fd),
            // A symlink there: resolved as every path of the file view is, beneath the
            // mount's fd (one that leads out is refused there).
            Err(Errno::LOOP) => {
                let loc = here();
                loc.open(
                    &loc.relative,
                    OFlags::PATH | OFlags::DIRECTORY,
                    Mode::empty(),
                    "put_tree",
                )
            }
            Err(e) => Err(here().err(e, "put_tree")),
        }
    }
}

#[async_trait]
impl FileSystem for NativeSandbox {
    fn cwd(&self) -> &Path {
        &self.cwd
    }

    async fn canonical(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<PathBuf> {
        let loc = self.locate(path)?;
        blocking(cancel, "canonical", move || {
            let fd = loc.open(&loc.relative, OFlags::PATH, Mode::empty(), "canonical")?;
            let host = std::fs::read_link(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ))
            .map_err(|e| EnvError::io(&e, "canonical", &loc.shown))?;
            let rest = host.strip_prefix(&loc.host_root).map_err(|_| {
                EnvError::new(
                    ErrorCode::Unknown,
                    format!(
                        "canonical {}: resolved outside its mount",
                        loc.shown.display()
                    ),
                )
            })?;
            Ok(loc.sandbox_root.join(rest))
        })
        .await
    }

    async fn exists(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<bool> {
        let loc = match self.locate(path) {
            Ok(loc) => loc,
            Err(e) if e.code == ErrorCode::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        blocking(cancel, "exists", move || {
            match loc.open(
                &loc.relative,
                OFlags::PATH | OFlags::NOFOLLOW,
                Mode::empty(),
                "exists",
            ) {
                Ok(_) => Ok(true),
                Err(e) if e.code == ErrorCode::NotFound => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn file_info(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<FileInfo> {
        let loc = self.locate(path)?;
        blocking(cancel, "file_info", move || {
            let stat = if loc.relative.as_os_str().is_empty() {
                rustix::fs::fstat(&*loc.fd).map_err(|e| loc.err(e, "stat"))?
            } else {
                let (dir, name) = loc.parent("stat")?;
                rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| loc.err(e, "stat"))?
            };
            let modified = u64::try_from(stat.st_mtime).ok().map(|s| {
                std::time::UNIX_EPOCH + std::time::Duration::new(s, stat.st_mtime_nsec as u32)
            });
            Ok(FileInfo {
                kind: kind_of(rustix::fs::FileType::from_raw_mode(stat.st_mode)),
                size: stat.st_size as u64,
                mode: stat.st_mode & 0o7777,
                modified,
                read_only: !loc.writable,
            })
        })
        .await
    }

    async fn list_dir(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<DirEntry>> {
        let abs = self.absolute_path(path);
        if abs == Path::new("/") {
            let mut names: Vec<String> =
                self.root
                    .mounts
                    .iter()
                    .filter_map(|m| {
                        m.sandbox
                            .components()
                            .nth(1)
                            .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    })
                    .chain(self.root.aliases.iter().filter_map(|(a, _)| {
                        a.file_name().map(|n| n.to_string_lossy().into_owned())
                    }))
                    .chain(["dev", "proc", "tmp"].map(String::from))
                    .collect();
            names.sort();
            names.dedup();
            let aliases: Vec<String> = self
                .root
                .aliases
                .iter()
                .filter_map(|(a, _)| a.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            return Ok(names
                .into_iter()
                .map(|name| {
                    let kind = if aliases.contains(&name) {
                        FileKind::Symlink
                    } else {
                        FileKind::Dir
                    };
                    DirEntry {
                        name,
                        kind,
                        size: None,
                    }
                })
                .collect());
        }
        let loc = self.locate(path)?;
        blocking(cancel, "list_dir", move || {
            let dir = loc.open(
                &loc.relative,
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
                "list",
            )?;
            list(dir)
                .map_err(|e| loc.err(e, "list"))?
                .ok_or_else(|| skillbox_env::too_many_to_list(&loc.shown))
        })
        .await
    }

    async fn read_text(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<String> {
        let bytes = self.read_bytes(path, cancel).await?;
        let shown = self.absolute_path(path);
        String::from_utf8(bytes).map_err(|_| {
            EnvError::invalid(format!("read {}: not UTF-8 text", shown.display())).with_path(&shown)
        })
    }

    async fn read_text_lines(
        &self,
        path: &Path,
        max: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<TextLines> {
        let loc = self.locate(path)?;
        blocking(cancel, "read", move || {
            let reader = std::io::BufReader::new(loc.open_to_read()?);
            skillbox_env::first_lines(reader, max, &loc.shown)
        })
        .await
    }

    async fn read_bytes(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<u8>> {
        let loc = self.locate(path)?;
        blocking(cancel, "read", move || {
            let mut file = loc.open_to_read()?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)
                .map_err(|e| EnvError::io(&e, "read", &loc.shown))?;
            Ok(bytes)
        })
        .await
    }

    async fn read_bytes_max(
        &self,
        path: &Path,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<u8>> {
        let loc = self.locate(path)?;
        blocking(cancel, "read", move || {
            let file = loc.open_to_read_no_follow()?;
            skillbox_env::read_at_most(file, max_bytes, &loc.shown)
        })
        .await
    }

    async fn write(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        let loc = self.locate(path)?;
        loc.require_writable("write")?;
        let data = data.to_vec();
        blocking(cancel, "write", move || {
            let (dir, name) = loc.parent("write")?;
            // Replacing a file keeps its mode (an edited script stays executable).
            let mode = match rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat)
                    if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                        == rustix::fs::FileType::RegularFile =>
                {
                    stat.st_mode & 0o7777
                }
                _ => 0o644,
            };
            loc.replace_file(&dir, &name, &data, mode)
        })
        .await
    }

    /// In one blocking task: each directory made once ([`NativeSandbox::make_dirs`],
    /// beneath the mount like `create_dir`), each file through [`Located::replace_file`]
    /// like `write` but with the tree's mode, in a directory opened beneath the mount
    /// once for the files that follow in it.
    async fn put_tree(&self, dir: &Path, tree: &Tree, cancel: &CancellationToken) -> EnvResult<()> {
        let base = self.locate(dir)?;
        base.require_writable("put_tree")?;
        let tree = tree.clone();
        let stop = cancel.clone();
        blocking(cancel, "put_tree", move || {
            // In the tree's order: one built in path order (a projection, a snapshot's
            // restore) opens each directory once.
            let mut dirs = OpenDirs::new(&base)?;
            for entry in tree.entries() {
                if stop.is_cancelled() {
                    return Err(EnvError::aborted("put_tree"));
                }
                let TreeKind::File { data, executable } = &entry.kind else {
                    dirs.dir(&entry.path)?;
                    continue;
                };
                let (Some(parent), Some(name)) = (entry.path.parent(), entry.path.file_name())
                else {
                    return Err(EnvError::invalid(format!(
                        "put_tree {}: not a file path",
                        base.below(&entry.path).shown.display()
                    )));
                };
                let dir = dirs.dir(parent)?;
                let mode = if *executable { 0o755 } else { 0o644 };
                base.below(&entry.path)
                    .replace_file(dir, Path::new(name), data, mode)?;
            }
            Ok(())
        })
        .await
    }

    async fn append(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        let loc = self.locate(path)?;
        loc.require_writable("append")?;
        let data = data.to_vec();
        blocking(cancel, "append", move || {
            let (dir, name) = loc.parent("append")?;
            let fd = rustix::fs::openat(
                &dir,
                &name,
                OFlags::WRONLY
                    | OFlags::APPEND
                    | OFlags::CREATE
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY
                    | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map_err(|e| match e {
                // A FIFO with no reader.
                Errno::NXIO => EnvError::new(
                    ErrorCode::Invalid,
                    format!(
                        "append {}: a FIFO; only regular files are read or appended to",
                        loc.shown.display()
                    ),
                )
                .with_path(&loc.shown),
                e => loc.err(e, "append"),
            })?;
            let mut file = skillbox_env::regular_file(fd, "append", &loc.shown)?;
            loc.chown(&dir, &name);
            file.write_all(&data)
                .map_err(|e| EnvError::io(&e, "append", &loc.shown))
        })
        .await
    }

    async fn rename(&self, from: &Path, to: &Path, cancel: &CancellationToken) -> EnvResult<()> {
        let (src, dst) = (self.locate(from)?, self.locate(to)?);
        src.require_writable("rename")?;
        dst.require_writable("rename")?;
        blocking(cancel, "rename", move || {
            let (src_dir, src_name) = src.parent("rename")?;
            let (dst_dir, dst_name) = dst.parent("rename")?;
            rustix::fs::renameat(&src_dir, &src_name, &dst_dir, &dst_name)
                .map_err(|e| src.err(e, "rename"))
        })
        .await
    }

    async fn remove(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let loc = self.locate(path)?;
        loc.require_writable("remove")?;
        blocking(cancel, "remove", move || {
            let (dir, name) = loc.parent("remove")?;
            let stat = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| loc.err(e, "remove"))?;
            let is_dir = rustix::fs::FileType::from_raw_mode(stat.st_mode)
                == rustix::fs::FileType::Directory;
            match (is_dir, recursive) {
                (false, _) => rustix::fs::unlinkat(&dir, &name, AtFlags::empty())
                    .map_err(|e| loc.err(e, "remove")),
                (true, false) => rustix::fs::unlinkat(&dir, &name, AtFlags::REMOVEDIR)
                    .map_err(|e| loc.err(e, "remove")),
                // However deep the sandbox made it: no recursion, no fd per level.
                (true, true) => skillbox_env::remove::remove_tree_at(dir.as_fd(), name.as_os_str())
                    .map_err(|e| EnvError::io(&e, "remove", &loc.shown)),
            }
        })
        .await
    }

    async fn create_dir(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let loc = self.locate(path)?;
        loc.require_writable("create_dir")?;
        blocking(cancel, "create_dir", move || {
            if recursive {
                let rel = loc.relative.clone();
                return NativeSandbox::make_dirs(&loc, &rel);
            }
            let (dir, name) = loc.parent("create_dir")?;
            rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o755))
                .map_err(|e| loc.err(e, "create_dir"))?;
            loc.chown(&dir, &name);
            Ok(())
        })
        .await
    }

    async fn create_temp_dir(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        self.create_dir(&self.root.workspace.join(TEMP_DIR), true, cancel)
            .await?;
        let path = self.root.workspace.join(TEMP_DIR).join(
            skillbox_env::path::temp_name(prefix).map_err(|e| {
                EnvError::io(
                    &e,
                    "create a temp entry in",
                    self.root.workspace.join(TEMP_DIR),
                )
            })?,
        );
        self.create_dir(&path, false, cancel).await?;
        self.remember(&path);
        Ok(path)
    }

    async fn create_temp_file(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        self.create_dir(&self.root.workspace.join(TEMP_DIR), true, cancel)
            .await?;
        let path = self.root.workspace.join(TEMP_DIR).join(
            skillbox_env::path::temp_name(prefix).map_err(|e| {
                EnvError::io(
                    &e,
                    "create a temp entry in",
                    self.root.workspace.join(TEMP_DIR),
                )
            })?,
        );
        let loc = self.locate(&path)?;
        blocking(cancel, "create_temp_file", move || {
            let (dir, name) = loc.parent("create_temp_file")?;
            rustix::fs::openat(
                &dir,
                &name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map_err(|e| loc.err(e, "create_temp_file"))?;
            loc.chown(&dir, &name);
            Ok(())
        })
        .await?;
        self.remember(&path);
        Ok(path)
    }

    async fn cleanup(&self) -> EnvResult<()> {
        // End every exec still running: each kills its namespace tree and reaps it.
        self.cleaned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shutdown.cancel();
        // An init started ahead of an exec that never came is killed, and its cgroup
        // removed once it is gone.
        let prepared = self.prepared.lock().ok().and_then(|mut slot| slot.take());
        if let Some(prepared) = prepared {
            prepared.discard(self.one_shot).await;
        }
        self.running.close();
        self.running.wait().await;
        // Its processes are gone: the proxy's connections end (each recorded).
        if let Some(egress) = &self.egress {
            egress.proxy.stop().await;
        }
        if let Some(ca_dir) = &self.egress_dir {
            let _ = skillbox_env::remove::remove_tree(ca_dir);
        }
        let temps = match self.temps.lock() {
            Ok(mut temps) => std::mem::take(&mut *temps),
            Err(_) => Vec::new(),
        };
        if !self.temp_workspace {
            let never = CancellationToken::new();
            for temp in temps {
                match self.remove(&temp, true, &never).await {
                    Err(e) if e.code != ErrorCode::NotFound => return Err(e),
                    _ => {}
                }
            }
            let _ = self
                .remove(&self.root.workspace.join(TEMP_DIR), false, &never)
                .await;
        }
        let dir = self.dir.clone();
        let remove = move || match skillbox_env::remove::remove_tree(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(EnvError::io(&e, "cleanup", &dir))
            }
            _ => Ok(()),
        };
        if self.one_shot {
            return remove();
        }
        tokio::task::spawn_blocking(remove)
            .await
            .map_err(|e| EnvError::new(ErrorCode::Unknown, format!("cleanup worker failed: {e}")))?
    }
}
