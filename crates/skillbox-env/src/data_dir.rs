//! The data dir is ours alone: skillbox keeps sandboxes, runtimes, objects and records
//! there, and a directory another user can write to (or owns) would let that user plant
//! what a later run trusts. So it is created 0700, and an existing one is accepted only
//! when this user owns it, and every directory in it, and none of them is group- or
//! world-writable. One that group or others may read or search is made 0700 (saying so
//! when it held anything): every sandbox runs as one host user (uid 65534 under root),
//! which must not read the stored artifacts, records and keys of others' runs.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::{EnvError, EnvResult, ErrorCode};

/// Where the data dir is when nothing names it: `$SKILLBOX_DATA`, else
/// `$HOME/.local/share/skillbox`. Never a guessable path under `/tmp`: without either
/// variable it is an error that says what to set.
pub fn default_data_dir() -> EnvResult<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(dir) = var("SKILLBOX_DATA") {
        return Ok(PathBuf::from(dir));
    }
    match var("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/skillbox")),
        None => Err(EnvError::new(
            ErrorCode::Invalid,
            "no data dir: HOME is not set; set SKILLBOX_DATA or pass --data-dir DIR \
             (a directory only this user can write)",
        )),
    }
}

/// What skillbox's own process creates with: files 0600, directories 0700. Set by the
/// binary before anything is made; what sandboxes must read through a mount is given
/// its mode explicitly ([`readable_by_sandboxes`]), and a sandbox's own processes start
/// from 022 again.
pub const PRIVATE_UMASK: u32 = 0o077;

/// Gives the directory `dir`, which sandboxes read through a read-only mount (a cache
/// of compiled guests, a runner), mode 0755 whatever the umask it was made under.
pub fn readable_by_sandboxes(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
}

/// Makes `command` start with umask 022: what it makes is read by sandboxes (npm's
/// `node_modules` for the Node runtime, a debootstrap root for the container image).
pub fn with_sandbox_umask(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and only sets the child's own mask.
    unsafe {
        command.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
}

/// Creates `dir` (mode 0700, with any missing parents) or checks the one that is there:
/// it and each directory directly in it must be owned by the effective user and not be
/// group- or world-writable. The error names the directory and what to do. A data dir
/// that group or others may read or search is made 0700, with a warning naming it when
/// it held anything.
pub fn own_data_dir(dir: &Path) -> EnvResult<()> {
    if let Err(e) = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        return Err(EnvError::io(&e, "create the data dir", dir));
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let meta = fs::metadata(dir).map_err(|e| EnvError::io(&e, "read the data dir", dir))?;
    check(dir, &meta, uid, "the data dir")?;
    if meta.mode() & 0o077 != 0 {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| EnvError::io(&e, "make the data dir private (chmod 700)", dir))?;
        // An empty one (a directory just made for it, `mkdir` or a temp dir) exposed
        // nothing: only one that held skillbox's state is worth a word.
        let held_state = fs::read_dir(dir)
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(true);
        if held_state {
            tracing::warn!(
                "the data dir {} was open to group or others (mode {:o}); made 0700: what \
             skillbox keeps there (stored artifacts, records, keys) is this user's alone, \
             and every sandbox runs as a host user of its own",
                dir.display(),
                meta.mode() & 0o7777
            );
        }
    }
    let entries = fs::read_dir(dir).map_err(|e| EnvError::io(&e, "list the data dir", dir))?;
    for entry in entries {
        let entry = entry.map_err(|e| EnvError::io(&e, "list the data dir", dir))?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(|e| EnvError::io(&e, "read", &path))?;
        if meta.file_type().is_symlink() {
            return Err(EnvError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "{} is a symlink in the data dir; skillbox does not follow links there \
                     (remove it, or point --data-dir at the real directory)",
                    path.display()
                ),
            )
            .with_path(&path));
        }
        if meta.is_dir() {
            check(&path, &meta, uid, "a directory in the data dir")?;
        }
    }
    Ok(())
}

fn check(path: &Path, meta: &fs::Metadata, uid: u32, what: &str) -> EnvResult<()> {
    if !meta.is_dir() {
        return Err(EnvError::new(
            ErrorCode::NotDirectory,
            format!("{what} {} is not a directory", path.display()),
        )
        .with_path(path));
    }
    if meta.uid() != uid {
        return Err(EnvError::new(
            ErrorCode::PermissionDenied,
            format!(
                "{what} {} belongs to uid {}, not to this user (uid {uid}); skillbox keeps \
                 its state only where no one else can write: use another --data-dir or \
                 SKILLBOX_DATA",
                path.display(),
                meta.uid()
            ),
        )
        .with_path(path));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(EnvError::new(
            ErrorCode::PermissionDenied,
            format!(
                "{what} {} is writable by group or others (mode {:o}); run `chmod go-w {}` \
                 or use another --data-dir",
                path.display(),
                meta.mode() & 0o7777,
                path.display()
            ),
        )
        .with_path(path));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_data_dir_is_made_private_with_its_parents() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/skillbox");
        own_data_dir(&dir).unwrap();
        for path in [root.path().join("a"), dir.clone()] {
            let mode = fs::metadata(&path).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", path.display());
        }
        // And it is accepted again.
        own_data_dir(&dir).unwrap();
    }

    /// Issue 38, row 7: a 0755 data dir let uid 65534 (every sandbox's user, under
    /// root) read stored artifacts. One open to group or others is made 0700.
    #[test]
    fn a_data_dir_readable_by_group_or_others_is_made_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        for mode in [0o755, 0o750, 0o701] {
            fs::create_dir_all(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            own_data_dir(&dir).unwrap();
            let now = fs::metadata(&dir).unwrap().mode() & 0o7777;
            assert_eq!(now, 0o700, "a data dir of mode {mode:o}");
        }
    }

    #[test]
    fn a_group_or_world_writable_data_dir_or_subdir_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        own_data_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let err = own_data_dir(&dir).unwrap_err();
        assert_eq!(err.code, ErrorCode::PermissionDenied, "{err}");
        assert!(err.message.contains("chmod go-w"), "{err}");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let sub = dir.join("objects");
        fs::create_dir(&sub).unwrap();
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o775)).unwrap();
        let err = own_data_dir(&dir).unwrap_err();
        assert!(err.message.contains("objects"), "{err}");
    }

    #[test]
    fn a_symlink_or_a_file_in_place_of_the_data_dir_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        own_data_dir(&dir).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("native")).unwrap();
        let err = own_data_dir(&dir).unwrap_err();
        assert!(err.message.contains("symlink"), "{err}");
        let file = root.path().join("file");
        fs::write(&file, "x").unwrap();
        assert_eq!(
            own_data_dir(&file).unwrap_err().code,
            ErrorCode::AlreadyExists
        );
    }
}
