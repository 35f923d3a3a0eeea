//! The installed guests: interpreters built for WASI (CPython, QuickJS) that a command
//! name such as `python3` or `node` runs. `scripts/wasm-guests.sh` (run by `skillbox
//! setup`) installs them with a `guests.json` that says, for each, its module file and
//! SHA-256, the command names it answers to, the read-only directories it needs (the
//! stdlib) and its environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use skillbox_env::{EnvError, EnvResult};

/// What `guests.json` holds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    guests: Vec<Guest>,
}

/// One interpreter.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Guest {
    pub name: String,
    pub version: String,
    /// Where it came from, pinned (package, version, SHA-256).
    pub source: String,
    /// The module, relative to the guests dir.
    pub module: PathBuf,
    /// The command names that run it (`python3`, `node`).
    pub commands: Vec<String>,
    /// Read-only directories the guest needs, preopened at `guest`.
    #[serde(default)]
    pub dirs: Vec<GuestDir>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// SHA-256 of each installed file, relative to the guests dir.
    pub files: BTreeMap<PathBuf, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestDir {
    /// Relative to the guests dir.
    pub host: PathBuf,
    /// Absolute, inside the guest.
    pub guest: String,
}

impl Guest {
    /// The SHA-256 of the module, as installed (the compile cache's key).
    pub fn module_sha256(&self) -> Option<&str> {
        self.files.get(&self.module).map(String::as_str)
    }
}

/// The guests of one install dir.
#[derive(Debug, Clone, Default)]
pub struct Guests {
    pub dir: PathBuf,
    pub guests: Vec<Guest>,
}

impl Guests {
    /// Reads `<dir>/guests.json`; no file means no guests (not an error: `.wasm` files
    /// still run).
    pub fn load(dir: &Path) -> EnvResult<Guests> {
        let path = dir.join("guests.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Guests {
                    dir: dir.to_path_buf(),
                    guests: Vec::new(),
                });
            }
            Err(e) => return Err(EnvError::io(&e, "read", &path)),
        };
        // A broken install is the host's problem, not the caller's: unavailable.
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| {
            EnvError::unavailable(format!(
                "{}: line {}: {e}; run `skillbox setup` to reinstall the wasm guests",
                path.display(),
                e.line()
            ))
            .with_path(&path)
        })?;
        for guest in &manifest.guests {
            let escapes = |p: &Path| {
                p.is_absolute()
                    || p.components()
                        .any(|c| matches!(c, std::path::Component::ParentDir))
            };
            if escapes(&guest.module) || guest.dirs.iter().any(|d| escapes(&d.host)) {
                return Err(EnvError::unavailable(format!(
                    "{}: guest {}: paths must stay inside {}",
                    path.display(),
                    guest.name,
                    dir.display()
                )));
            }
            if guest.module_sha256().is_none() {
                return Err(EnvError::unavailable(format!(
                    "{}: guest {}: files has no SHA-256 for its module {}",
                    path.display(),
                    guest.name,
                    guest.module.display()
                )));
            }
            if let Some(bad) = guest.dirs.iter().find(|d| !d.guest.starts_with('/')) {
                return Err(EnvError::unavailable(format!(
                    "{}: guest {}: dirs: {} must be an absolute guest path",
                    path.display(),
                    guest.name,
                    bad.guest
                )));
            }
        }
        Ok(Guests {
            dir: dir.to_path_buf(),
            guests: manifest.guests,
        })
    }

    /// The guest a command runs: `python3`, `/usr/bin/python3` and `python3.12` name
    /// the same one when it answers to `python3`.
    pub fn for_command(&self, command: &str) -> Option<&Guest> {
        let name = command.rsplit('/').next().unwrap_or(command);
        self.guests
            .iter()
            .find(|g| g.commands.iter().any(|c| c == name))
    }

    /// Every command name, for messages.
    pub fn commands(&self) -> Vec<&str> {
        self.guests
            .iter()
            .flat_map(|g| g.commands.iter().map(String::as_str))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    fn write(dir: &Path, json: &str) {
        std::fs::write(dir.join("guests.json"), json).unwrap();
    }

    #[test]
    fn commands_find_their_guest_by_base_name() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            r#"{"guests":[{"name":"python","version":"3.12","source":"s","module":"python/python.wasm",
            "commands":["python3","python"],"dirs":[{"host":"python/lib","guest":"/usr/local/lib"}],
            "env":{"PYTHONHOME":"/usr/local"},"files":{"python/python.wasm":"ab"}}]}"#,
        );
        let guests = Guests::load(dir.path()).unwrap();
        assert_eq!(
            guests.for_command("/usr/bin/python3").unwrap().name,
            "python"
        );
        assert_eq!(
            guests.for_command("python").unwrap().module_sha256(),
            Some("ab")
        );
        assert!(guests.for_command("node").is_none());
        assert_eq!(guests.commands(), ["python3", "python"]);
    }

    #[test]
    fn no_manifest_is_no_guests_and_a_bad_one_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Guests::load(dir.path()).unwrap().guests.is_empty());
        write(dir.path(), r#"{"guests":[{"name":"x"}]}"#);
        let error = Guests::load(dir.path()).unwrap_err().to_string();
        assert!(error.contains("guests.json: line 1"), "{error}");
        write(
            dir.path(),
            r#"{"guests":[{"name":"x","version":"1","source":"s","module":"../x.wasm","commands":[],"files":{"../x.wasm":"ab"}}]}"#,
        );
        let error = Guests::load(dir.path()).unwrap_err().to_string();
        assert!(error.contains("must stay inside"), "{error}");
    }
}
