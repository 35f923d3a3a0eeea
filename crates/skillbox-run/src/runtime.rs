//! The Node runtime: `runtimes/node/package.json` + `package-lock.json`, embedded in the
//! binary, installed once with `npm ci` into `<data>/runtimes/node-<hash>` and shown
//! read-only as `/node_modules` in every Node sandbox (Node finds it by walking up from
//! `/workspace`, for `require` and `import` alike).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};

const PACKAGE_JSON: &str = include_str!("../../../runtimes/node/package.json");
const PACKAGE_LOCK: &str = include_str!("../../../runtimes/node/package-lock.json");
const COMPLETE: &str = ".skillbox-complete";
/// An install's temp dir beside the runtime: this prefix, its owner (`<pid>.<start
/// time>`, `skillbox_env::owner`), `-`, random hex.
const STAGING: &str = ".node-install-";

/// Why the runtime could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("node runtime: `{0}` was not found on PATH; install Node.js 20+ and npm")]
    Missing(&'static str),
    #[error("node runtime: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("node runtime: `npm ci` failed (exit {status}); last output:\n{tail}")]
    Npm { status: i32, tail: String },
}

/// The Node runtime of one data dir.
#[derive(Debug, Clone)]
pub struct NodeRuntime {
    dir: PathBuf,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

impl NodeRuntime {
    /// The runtime for `data_dir`, named by the hash of the pinned lock file.
    pub fn new(data_dir: &Path) -> Self {
        let mut hash = Sha256::new();
        hash.update(PACKAGE_JSON.as_bytes());
        hash.update(PACKAGE_LOCK.as_bytes());
        let digest = hash.finalize();
        let short: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        NodeRuntime {
            dir: data_dir.join("runtimes").join(format!("node-{short}")),
        }
    }

    /// The runtime's name, `node-<hash of the lock file>`: what an image built from it
    /// records.
    pub fn id(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The installed `node_modules`, mounted read-only at `/node_modules`.
    pub fn node_modules(&self) -> PathBuf {
        self.dir.join("node_modules")
    }

    pub fn is_installed(&self) -> bool {
        self.dir.join(COMPLETE).is_file()
    }

    /// Installs the runtime unless it is there. `progress` gets one line per step (and
    /// npm's own output lines). Safe against concurrent installs: each builds in its own
    /// temp dir and the first rename wins.
    pub async fn ensure(
        &self,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<(), RuntimeError> {
        if self.is_installed() {
            return Ok(());
        }
        for tool in ["node", "npm"] {
            if which(tool).is_none() {
                return Err(RuntimeError::Missing(tool));
            }
        }
        let parent = self.dir.parent().unwrap_or(Path::new("/"));
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(io(format!("create {}", parent.display())))?;
        skillbox_env::owner::claim(parent).map_err(io(format!(
            "claim {}",
            parent.join(skillbox_env::owner::CLAIMS).display()
        )))?;
        sweep_staging(parent).await;
        let staging = parent.join(
            skillbox_env::path::temp_name(&format!(
                "{STAGING}{}-",
                skillbox_env::owner::this_process()
            ))
            .map_err(io(format!("name a directory in {}", parent.display())))?,
        );
        let result = self.install_into(&staging, progress).await;
        if result.is_err() {
            let _ = tokio::fs::remove_dir_all(&staging).await;
            return result;
        }
        match tokio::fs::rename(&staging, &self.dir).await {
            Ok(()) => {}
            // Someone else finished first: theirs is as good as ours.
            Err(_) if self.is_installed() => {
                let _ = tokio::fs::remove_dir_all(&staging).await;
            }
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&staging).await;
                return Err(io(format!("move the runtime into {}", self.dir.display()))(
                    e,
                ));
            }
        }
        progress(&format!("node runtime ready in {}", self.dir.display()));
        Ok(())
    }

    async fn install_into(
        &self,
        staging: &Path,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<(), RuntimeError> {
        tokio::fs::create_dir(staging)
            .await
            .map_err(io(format!("create {}", staging.display())))?;
        tokio::fs::write(staging.join("package.json"), PACKAGE_JSON)
            .await
            .map_err(io("write package.json"))?;
        tokio::fs::write(staging.join("package-lock.json"), PACKAGE_LOCK)
            .await
            .map_err(io("write package-lock.json"))?;
        progress("installing the node runtime (npm ci: pptxgenjs and its dependencies)…");
        let mut npm = tokio::process::Command::new("npm");
        // Sandboxes read what it installs (through a read-only mount): not under
        // skillbox's own umask.
        skillbox_env::with_sandbox_umask(npm.as_std_mut());
        let mut child = npm
            .args([
                "ci",
                "--omit=dev",
                "--no-audit",
                "--no-fund",
                "--loglevel=http",
            ])
            .current_dir(staging)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(io("start npm ci"))?;
        // npm's lines as they come: a long install shows it is moving.
        let mut tail: Vec<String> = Vec::new();
        let mut out = child.stdout.take().map(|o| BufReader::new(o).lines());
        let mut err = child.stderr.take().map(|e| BufReader::new(e).lines());
        while out.is_some() || err.is_some() {
            let line = tokio::select! {
                line = next_line(&mut out), if out.is_some() => line.or_else(|| { out = None; None }),
                line = next_line(&mut err), if err.is_some() => line.or_else(|| { err = None; None }),
            };
            if let Some(line) = line {
                if line.contains("fetch GET") || line.starts_with("added ") {
                    progress(&format!("  npm: {}", line.trim_start_matches("npm http ")));
                }
                tail.push(line);
            }
        }
        let status = child.wait().await.map_err(io("wait for npm ci"))?;
        if !status.success() {
            let keep = tail.len().saturating_sub(20);
            return Err(RuntimeError::Npm {
                status: status.code().unwrap_or(-1),
                tail: tail[keep..].join("\n"),
            });
        }
        tokio::fs::write(staging.join(COMPLETE), "")
            .await
            .map_err(io("mark the runtime complete"))?;
        Ok(())
    }
}

/// Removes the temp dirs of installs whose process is gone (killed mid-`npm ci`, or a
/// Ctrl-C during the first start): left alone, each would stay for good. A name without
/// an owner with a start time (an older version's) is left, as it cannot be told from a
/// running install's.
async fn sweep_staging(parent: &Path) {
    let Ok(mut entries) = tokio::fs::read_dir(parent).await else {
        return;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = name.strip_prefix(STAGING).and_then(|r| r.split('-').next()) else {
            continue;
        };
        if owner.contains('.') && skillbox_env::owner::gone(parent, owner) {
            let _ = tokio::fs::remove_dir_all(entry.path()).await;
        }
    }
    skillbox_env::owner::sweep_claims(parent);
}

async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut Option<tokio::io::Lines<R>>,
) -> Option<String> {
    match lines {
        Some(lines) => lines.next_line().await.ok().flatten(),
        None => None,
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|dir| Path::new(dir).join(tool))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dead_installs_temp_dir_is_swept_and_a_live_ones_kept() {
        let parent = tempfile::tempdir().unwrap();
        // An owner that is gone: a child, by its pid and start time (read before it is
        // reaped), then reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let started = after_name.split_whitespace().nth(19).unwrap().to_string();
        child.wait().unwrap();
        let dead = format!("{STAGING}{pid}.{started}-00aa");
        let live = format!("{STAGING}{}-00bb", skillbox_env::owner::this_process());
        let older = format!("{STAGING}0123456789abcdef");
        for name in [&dead, &live, &older] {
            std::fs::create_dir_all(parent.path().join(name).join("node_modules/x")).unwrap();
        }
        sweep_staging(parent.path()).await;
        assert!(
            !parent.path().join(&dead).exists(),
            "a dead install's dir stays"
        );
        assert!(
            parent.path().join(&live).exists(),
            "a running install's dir went"
        );
        assert!(
            parent.path().join(&older).exists(),
            "an unknown owner's dir went"
        );
    }
}
