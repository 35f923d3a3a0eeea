//! Every capability under one or more roots (`<root>/<name>/manifest.yaml`). A bad
//! manifest, a missing entry file or a duplicate name is reported for that capability
//! alone; the valid ones still load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::manifest::{Manifest, ManifestError};

/// The file a capability's directory holds its manifest in.
pub const MANIFEST: &str = "manifest.yaml";

/// Largest manifest read (a manifest is a few hundred bytes).
const MAX_MANIFEST_BYTES: u64 = 64 * 1024;

/// A capability that loaded: its validated manifest and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub manifest: Manifest,
    /// Its directory (canonical).
    pub dir: PathBuf,
    /// What a read-write volume may reach none of (another capability's code): every
    /// root of the registry it was loaded from and every capability directory found in
    /// them (loaded or not), each as [`guarded_path`] gives it, and the real directory
    /// of one that is a symlink.
    pub(crate) guarded: std::sync::Arc<[PathBuf]>,
}

impl Capability {
    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    /// The entry's path on the host.
    pub fn entry_path(&self) -> PathBuf {
        self.dir.join(&self.manifest.entry)
    }

    pub fn manifest_file(&self) -> PathBuf {
        self.dir.join(MANIFEST)
    }
}

/// The capabilities of some roots, and what could not be loaded.
#[derive(Debug, Clone, Default)]
pub struct CapabilityRegistry {
    capabilities: BTreeMap<String, Capability>,
    errors: Vec<ManifestError>,
}

fn problem(file: &Path, message: String) -> ManifestError {
    ManifestError {
        file: file.to_path_buf(),
        line: None,
        field: None,
        message,
    }
}

/// One capability directory: its manifest, validated, and its entry file checked.
fn load_one(dir: &Path) -> Result<Capability, ManifestError> {
    let file = dir.join(MANIFEST);
    let dir = dir
        .canonicalize()
        .map_err(|e| problem(&file, format!("cannot resolve its directory: {e}")))?;
    let meta = std::fs::symlink_metadata(&file).map_err(|e| problem(&file, e.to_string()))?;
    if !meta.is_file() {
        return Err(problem(
            &file,
            "not a regular file (a symlink is not followed)".into(),
        ));
    }
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(problem(
            &file,
            format!("{} bytes; a manifest is at most 64 KiB", meta.len()),
        ));
    }
    let text = std::fs::read_to_string(&file).map_err(|e| problem(&file, e.to_string()))?;
    let manifest = Manifest::parse(&file, &text)?;
    let entry = dir.join(&manifest.entry);
    let entry_error = |message: String| ManifestError {
        field: Some("entry".into()),
        line: text
            .lines()
            .position(|l| l.starts_with("entry:"))
            .map(|i| i + 1),
        ..problem(&file, message)
    };
    // Resolved, it must still be a file in the capability's directory: a symlink out of
    // it would run something the manifest does not name.
    match entry.canonicalize() {
        Ok(real) if !real.starts_with(&dir) => {
            return Err(entry_error(format!(
                "{} leads out of the capability's directory (to {})",
                manifest.entry.display(),
                real.display()
            )));
        }
        Ok(real) if !real.is_file() => {
            return Err(entry_error(format!(
                "{}: not a file",
                manifest.entry.display()
            )));
        }
        Ok(_) => {}
        Err(_) => {
            return Err(entry_error(format!(
                "{}: no such file in {}",
                manifest.entry.display(),
                dir.display()
            )));
        }
    }
    Ok(Capability {
        manifest,
        dir,
        guarded: std::sync::Arc::from(Vec::new()),
    })
}

/// `path` made absolute, with its deepest existing ancestor resolved (symlinks and all)
/// and the rest as given: where it is or would be made, as the kernel would find it.
pub(crate) fn guarded_path(path: &Path) -> PathBuf {
    let absolute = std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .unwrap_or_else(|_| path.to_path_buf());
    let absolute = skillbox_env::path::normalize(&absolute);
    for ancestor in absolute.ancestors() {
        if let Ok(real) = ancestor.canonicalize() {
            let rest = absolute.strip_prefix(ancestor).unwrap_or(Path::new(""));
            return if rest.as_os_str().is_empty() {
                real
            } else {
                real.join(rest)
            };
        }
    }
    absolute
}

impl CapabilityRegistry {
    /// Loads every `<root>/<dir>/manifest.yaml`, roots in order, directories by name. A
    /// root that does not exist holds nothing; a name seen before is an error for the
    /// later one.
    pub fn load(roots: &[PathBuf]) -> CapabilityRegistry {
        let mut registry = CapabilityRegistry::default();
        let found: Vec<Vec<PathBuf>> = roots
            .iter()
            .map(|root| {
                let Ok(entries) = std::fs::read_dir(root) else {
                    return Vec::new();
                };
                let mut dirs: Vec<PathBuf> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.join(MANIFEST).exists() || p.join(MANIFEST).is_symlink())
                    .collect();
                dirs.sort();
                dirs
            })
            .collect();
        let guarded: std::sync::Arc<[PathBuf]> = roots
            .iter()
            .chain(found.iter().flatten())
            .map(|p| guarded_path(p))
            .collect();
        for dirs in found {
            for dir in dirs {
                match load_one(&dir) {
                    Ok(mut capability) => {
                        capability.guarded = guarded.clone();
                        if let Some(first) = registry.capabilities.get(capability.name()) {
                            registry.errors.push(ManifestError {
                                field: Some("name".into()),
                                ..problem(
                                    &capability.manifest_file(),
                                    format!(
                                        "{:?} is already the name of {}; a name is one capability",
                                        capability.name(),
                                        first.manifest_file().display()
                                    ),
                                )
                            });
                            continue;
                        }
                        registry
                            .capabilities
                            .insert(capability.name().to_string(), capability);
                    }
                    Err(e) => registry.errors.push(e),
                }
            }
        }
        registry
    }

    pub fn get(&self, name: &str) -> Option<&Capability> {
        self.capabilities.get(name)
    }

    /// The capabilities that loaded, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Capability> {
        self.capabilities.values()
    }

    /// What could not be loaded, each naming its file.
    pub fn errors(&self) -> &[ManifestError] {
        &self.errors
    }

    /// Why `name` is not one of these: what did not load from a directory of that name,
    /// and the names that did.
    pub fn missing(&self, name: &str) -> String {
        let known: Vec<&str> = self.iter().map(Capability::name).collect();
        let bad = self
            .errors
            .iter()
            .find(|e| e.file.parent().and_then(Path::file_name) == Some(name.as_ref()))
            .map(|e| format!(" (it did not load: {e})"))
            .unwrap_or_default();
        format!(
            "no capability {name:?}{bad}; have: {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )
    }
}
