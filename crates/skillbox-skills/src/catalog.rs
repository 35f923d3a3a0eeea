//! Every skill a run can use, read from the host without a sandbox: the workspace's own
//! (`<workspace>/skills/<name>`), the staged marketplace ones
//! (`<workspace>/.skills-cache/<source>/<name>`) and the user's
//! (`<data>/users/<user>/skills/<name>`). A folder whose SKILL.md is malformed is
//! reported alone, and the others still load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::skill::{self, SKILL_FILE, SkillError, SkillMeta};

/// Where a workspace keeps its own skills.
pub const WORKSPACE_SKILLS: &str = "skills";
/// Where staged marketplace skills live in a workspace.
pub const SKILLS_CACHE: &str = ".skills-cache";
/// The source name user skills are projected under (`.skills-cache/user/<name>`); no
/// marketplace source may take it.
pub const USER_SOURCE: &str = "user";

/// Where a skill comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Source {
    /// The workspace's own `skills/`.
    Workspace,
    /// Staged from a marketplace archive under this source name.
    Marketplace { source: String },
    /// The user's own skills in the data dir.
    User { user: String },
}

/// A skill that loaded.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Skill {
    #[serde(flatten)]
    pub meta: SkillMeta,
    pub source: Source,
    /// Its folder on the host.
    pub dir: PathBuf,
    /// Its folder relative to the sandbox's workspace root: `skills/<folder>` or
    /// `.skills-cache/<source>/<folder>`.
    pub projected: PathBuf,
}

impl Skill {
    /// Its folder's name.
    pub fn folder(&self) -> &str {
        self.projected
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
    }

    /// Its folder in a sandbox whose workspace root (where projection places the roots)
    /// is `root`.
    pub fn sandbox_dir(&self, root: &Path) -> PathBuf {
        root.join(&self.projected)
    }

    /// The command that runs `script` (a file in the skill's folder) with `args` in a
    /// sandbox whose workspace root is `root`: by its interpreter when its extension
    /// names one (`.py` python3, `.js`/`.mjs`/`.cjs` node, `.sh`/`.bash` sh), else the
    /// file itself, which must then be executable. The script is looked up on the host,
    /// in the skill's own folder; a path that leaves it is refused.
    pub fn script_command(
        &self,
        script: &str,
        args: &[String],
        root: &Path,
    ) -> Result<Vec<String>, String> {
        use std::os::unix::fs::PermissionsExt;
        let relative = Path::new(script);
        let plain = !relative.as_os_str().is_empty()
            && relative
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(format!(
                "{script}: give the script's path inside the skill's folder (e.g. scripts/run.sh)"
            ));
        }
        let host = self.dir.join(relative);
        let meta = std::fs::symlink_metadata(&host).map_err(|e| {
            let scripts = self.scripts().join(", ");
            format!(
                "skill {} has no {script} ({e}); its scripts: {}",
                self.meta.name,
                if scripts.is_empty() { "none" } else { &scripts }
            )
        })?;
        if !meta.is_file() {
            return Err(format!("{}: {script} is not a file", self.meta.name));
        }
        let path = self.sandbox_dir(root).join(relative).display().to_string();
        let interpreter = match relative.extension().and_then(|e| e.to_str()) {
            Some("py") => Some("python3"),
            Some("js" | "mjs" | "cjs") => Some("node"),
            Some("sh" | "bash") => Some("sh"),
            _ => None,
        };
        let mut argv = match interpreter {
            Some(program) => vec![program.to_string(), path],
            None if meta.permissions().mode() & 0o111 != 0 => vec![path],
            None => {
                return Err(format!(
                    "{}: {script} has no extension that names an interpreter and is not executable",
                    self.meta.name
                ));
            }
        };
        argv.extend(args.iter().cloned());
        Ok(argv)
    }

    /// The files under `scripts/` (or at the top of the folder) that look runnable.
    pub fn scripts(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (dir, prefix) in [
            (self.dir.join("scripts"), "scripts/"),
            (self.dir.clone(), ""),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let runnable = [".py", ".js", ".mjs", ".cjs", ".sh", ".bash"]
                    .iter()
                    .any(|ext| name.ends_with(ext));
                if runnable && entry.file_type().is_ok_and(|t| t.is_file()) {
                    found.push(format!("{prefix}{name}"));
                }
            }
        }
        found.sort();
        found
    }
}

/// Where to look.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The host directory whose `skills/` and `.skills-cache/` are read.
    pub workspace: Option<PathBuf>,
    /// The user's name and their skills directory (`<data>/users/<user>/skills`).
    pub user: Option<(String, PathBuf)>,
}

impl Sources {
    /// The user skills directory of `user` under `data_dir`.
    pub fn user_dir(data_dir: &Path, user: &str) -> PathBuf {
        data_dir.join("users").join(user).join("skills")
    }
}

/// The skills of some sources, by name, and what did not load.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SkillSet {
    skills: BTreeMap<String, Skill>,
    errors: Vec<SkillError>,
}

/// The folders directly in `dir` (sorted), and the problems with what is not one.
fn folders(dir: &Path, errors: &mut Vec<SkillError>) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            errors.push(SkillError {
                file: path,
                line: None,
                message: "a folder name that is not UTF-8".into(),
            });
            continue;
        };
        if name.starts_with('.') || file_type.is_file() {
            continue;
        }
        if file_type.is_symlink() {
            errors.push(SkillError {
                file: path,
                line: None,
                message: "a symlink: skills are never read or projected through one".into(),
            });
            continue;
        }
        if file_type.is_dir() {
            found.push((name, path));
        }
    }
    found.sort();
    found
}

impl SkillSet {
    /// Loads every skill of `sources`: the workspace's, then the staged ones, then the
    /// user's. A name already taken is reported, and the first keeps it.
    pub fn load(sources: &Sources) -> SkillSet {
        let mut set = SkillSet::default();
        if let Some(workspace) = &sources.workspace {
            let root = workspace.join(WORKSPACE_SKILLS);
            for (folder, dir) in folders(&root, &mut set.errors) {
                let projected = Path::new(WORKSPACE_SKILLS).join(&folder);
                set.add(dir, Source::Workspace, projected);
            }
            let cache = workspace.join(SKILLS_CACHE);
            for (source, source_dir) in folders(&cache, &mut set.errors) {
                if source == USER_SOURCE {
                    continue;
                }
                for (folder, dir) in folders(&source_dir, &mut set.errors) {
                    let projected = Path::new(SKILLS_CACHE).join(&source).join(&folder);
                    set.add(
                        dir,
                        Source::Marketplace {
                            source: source.clone(),
                        },
                        projected,
                    );
                }
            }
        }
        if let Some((user, root)) = &sources.user {
            for (folder, dir) in folders(root, &mut set.errors) {
                let projected = Path::new(SKILLS_CACHE).join(USER_SOURCE).join(&folder);
                set.add(dir, Source::User { user: user.clone() }, projected);
            }
        }
        set
    }

    fn add(&mut self, dir: PathBuf, source: Source, projected: PathBuf) {
        if !dir.join(SKILL_FILE).is_file() {
            self.errors.push(SkillError {
                file: dir.join(SKILL_FILE),
                line: None,
                message: "not a skill: the folder has no SKILL.md".into(),
            });
            return;
        }
        match skill::read(&dir) {
            Ok(doc) => {
                let name = doc.meta.name.clone();
                if let Some(first) = self.skills.get(&name) {
                    self.errors.push(SkillError {
                        file: dir.join(SKILL_FILE),
                        line: None,
                        message: format!(
                            "the name {name} is taken by {}; this one is not loaded",
                            first.dir.display()
                        ),
                    });
                    return;
                }
                self.skills.insert(
                    name,
                    Skill {
                        meta: doc.meta,
                        source,
                        dir,
                        projected,
                    },
                );
            }
            Err(e) => self.errors.push(e),
        }
    }

    /// By name.
    pub fn iter(&self) -> impl Iterator<Item = &Skill> {
        self.skills.values()
    }

    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.get(name)
    }

    pub fn errors(&self) -> &[SkillError] {
        &self.errors
    }

    pub fn len(&self) -> usize {
        self.skills.len()
    }

    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// Why there is no skill `name`: what did not load there, or the names there are.
    pub fn missing(&self, name: &str) -> String {
        let broken: Vec<String> = self
            .errors
            .iter()
            .filter(|e| {
                e.file
                    .parent()
                    .and_then(|d| d.file_name())
                    .is_some_and(|d| d == name)
            })
            .map(ToString::to_string)
            .collect();
        if !broken.is_empty() {
            return format!("skill {name} did not load: {}", broken.join("; "));
        }
        let names: Vec<&str> = self.skills.keys().map(String::as_str).collect();
        if names.is_empty() {
            format!(
                "no skill {name}: no skills here (a skill is a folder with a SKILL.md under skills/)"
            )
        } else {
            format!("no skill {name} (there are: {})", names.join(", "))
        }
    }
}
