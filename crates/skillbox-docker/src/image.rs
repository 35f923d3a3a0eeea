//! The runtime image, built here without any registry: a `debootstrap` root of the host's
//! Debian release (with python3 and curl), the host's own `node` binary, and the pinned
//! Node packages at `/node_modules`. It is imported through the Engine API and tagged by
//! the hash of what went into it, so an unchanged build is skipped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use bollard::Docker;
use bollard::query_parameters::CreateImageOptions;
use bytes::Bytes;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use skillbox_env::BackendKind;
use skillbox_env::{EnvError, EnvResult, ErrorCode, Limits, SandboxSpec};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::SANDBOX_UID;
use crate::backend::DockerBackend;
use crate::daemon::{connect, daemon_error};
use crate::runtime::{PRIVATE_PERL, PRIVATE_PYTHON, Runtime};

/// A debootstrap root being made: this prefix, the recipe hash, `-`, its owner
/// (`<pid>.<start time>`, `skillbox_env::owner`), `-`, random hex; renamed when done.
const ROOT_STAGING: &str = ".rootfs-";
/// Bump when the recipe below changes what ends up in the image.
const RECIPE: &str = "skillbox-runtime-4";
const REPOSITORY: &str = "skillbox-runtime";
/// Debian packages on top of `minbase` (which has bash, coreutils, perl-base).
/// pip (Depends only, as debootstrap installs): `pip install` through the egress proxy.
const PACKAGES: &str = "python3,python3-pip,curl,ca-certificates";
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Parts of the debootstrap root nothing in a sandbox reads.
const SKIPPED: &[&str] = &[
    "dev",
    "proc",
    "sys",
    "run",
    "tmp",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
    "etc/passwd",
    "etc/group",
];

/// The image tag for a Node runtime (`node-<hash>` from the runtime): the same inputs
/// always give the same tag, so the backend can name the image without building it.
pub fn image_tag(runtime_id: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(RECIPE.as_bytes());
    hash.update(b"\0");
    hash.update(PACKAGES.as_bytes());
    hash.update(b"\0");
    hash.update(runtime_id.as_bytes());
    let digest = hash.finalize();
    let short: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{REPOSITORY}:{short}")
}

/// What goes into the image besides the Debian root.
#[derive(Debug, Clone)]
pub struct BuildInputs {
    /// The `node` executable to copy in (the host's).
    pub node_binary: PathBuf,
    /// The installed `node_modules` of the runtime.
    pub node_modules: PathBuf,
    /// `node-<hash>` of the runtime.
    pub runtime_id: String,
}

/// Builds the runtime image into the daemon.
#[derive(Debug)]
pub struct ImageBuilder {
    /// Where the debootstrap root is kept between builds (`<data>/images`).
    cache: PathBuf,
    mirror: String,
}

fn failed(message: impl Into<String>) -> EnvError {
    EnvError::new(ErrorCode::Unavailable, message)
}

fn io_failed(what: &str, path: &Path, e: &std::io::Error) -> EnvError {
    EnvError::io(e, what, path).with_path(path)
}

/// The host's Debian release name, so the image's libraries match the host's `node`.
fn host_suite() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "bookworm".into())
}

impl ImageBuilder {
    pub fn new(data_dir: &Path) -> Self {
        ImageBuilder {
            cache: data_dir.join("images"),
            mirror: std::env::var("SKILLBOX_DEBIAN_MIRROR")
                .unwrap_or_else(|_| DEFAULT_MIRROR.into()),
        }
    }

    /// True when the daemon already has the image for this Node runtime.
    pub async fn is_current(&self, runtime_id: &str) -> bool {
        match connect(BackendKind::Docker).await {
            Ok(docker) => docker.inspect_image(&image_tag(runtime_id)).await.is_ok(),
            Err(_) => false,
        }
    }

    /// Builds the image unless the daemon has it (or `force`), reporting progress, and
    /// checks that it runs. Returns the tag.
    pub async fn build(
        &self,
        inputs: &BuildInputs,
        force: bool,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> EnvResult<String> {
        let tag = image_tag(&inputs.runtime_id);
        let docker = connect(BackendKind::Docker).await?;
        if !force && docker.inspect_image(&tag).await.is_ok() {
            progress(&format!("image {tag} is up to date"));
            return Ok(tag);
        }
        for (what, path) in [
            ("node binary", &inputs.node_binary),
            ("node_modules", &inputs.node_modules),
        ] {
            if !path.exists() {
                return Err(failed(format!(
                    "image build: the {what} {} does not exist",
                    path.display()
                )));
            }
        }
        let rootfs = self.rootfs(progress).await?;
        progress(&format!("importing {tag} into the Docker daemon"));
        self.import(&docker, &rootfs, inputs, &tag, progress)
            .await?;
        progress(&format!(
            "checking {tag}: node, pptxgenjs and python3 start in a sandbox"
        ));
        verify(&tag).await?;
        progress(&format!("image {tag} is ready"));
        Ok(tag)
    }

    /// The debootstrap root for this recipe, made once and kept.
    async fn rootfs(&self, progress: &(dyn Fn(&str) + Send + Sync)) -> EnvResult<PathBuf> {
        let suite = host_suite();
        let mut hash = Sha256::new();
        hash.update(format!("{RECIPE}\0{suite}\0{PACKAGES}\0{}", self.mirror).as_bytes());
        let short: String = hash
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        let done = self.cache.join(format!("rootfs-{suite}-{short}"));
        if done.join("usr/bin/python3").exists() {
            progress(&format!(
                "using the Debian {suite} root in {}",
                done.display()
            ));
            return Ok(done);
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(failed(
                "image build: debootstrap needs root; run `sudo skillbox image build`",
            ));
        }
        std::fs::create_dir_all(&self.cache).map_err(|e| io_failed("create", &self.cache, &e))?;
        skillbox_env::owner::claim(&self.cache)
            .map_err(|e| io_failed("claim", &self.cache.join(skillbox_env::owner::CLAIMS), &e))?;
        sweep_dead_roots(&self.cache);
        let work = self.cache.join(
            skillbox_env::path::temp_name(&format!(
                "{ROOT_STAGING}{short}-{}-",
                skillbox_env::owner::this_process()
            ))
            .map_err(|e| io_failed("name a directory in", &self.cache, &e))?,
        );
        progress(&format!(
            "debootstrap {suite} (minbase + {PACKAGES}) from {} — about a minute",
            self.mirror
        ));
        let mut debootstrap = tokio::process::Command::new("debootstrap");
        // The image's root: its files keep their modes in the image, where the sandbox
        // user reads them; not skillbox's own umask.
        skillbox_env::with_sandbox_umask(debootstrap.as_std_mut());
        let mut child = debootstrap
            .args([
                "--variant=minbase",
                &format!("--include={PACKAGES}"),
                &suite,
            ])
            .arg(&work)
            .arg(&self.mirror)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    failed("image build: debootstrap is not installed; apt-get install debootstrap")
                } else {
                    failed(format!("image build: cannot run debootstrap: {e}"))
                }
            })?;
        let mut tail: Vec<String> = Vec::new();
        if let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) {
            let mut out = BufReader::new(out).lines();
            let mut err = BufReader::new(err).lines();
            let (mut out_open, mut err_open) = (true, true);
            while out_open || err_open {
                let line = tokio::select! {
                    line = out.next_line(), if out_open => match line {
                        Ok(Some(line)) => line,
                        _ => { out_open = false; continue; }
                    },
                    line = err.next_line(), if err_open => match line {
                        Ok(Some(line)) => line,
                        _ => { err_open = false; continue; }
                    },
                };
                if line.starts_with("I: Retrieving")
                    || line.starts_with("I: Validating")
                    || line.starts_with("I: Extracting")
                {
                    tracing::debug!("{line}");
                } else {
                    progress(&format!("debootstrap: {line}"));
                }
                tail.push(line);
                if tail.len() > 20 {
                    tail.remove(0);
                }
            }
        }
        let status = child
            .wait()
            .await
            .map_err(|e| failed(format!("image build: debootstrap: {e}")))?;
        if !status.success() {
            let _ = std::fs::remove_dir_all(&work);
            return Err(failed(format!(
                "image build: debootstrap failed ({status}); last output:\n{}",
                tail.join("\n")
            )));
        }
        match std::fs::rename(&work, &done) {
            Ok(()) => {}
            // Another build finished first; use its root.
            Err(_) if done.join("usr/bin/python3").exists() => {
                let _ = std::fs::remove_dir_all(&work);
            }
            Err(e) => return Err(io_failed("rename", &done, &e)),
        }
        Ok(done)
    }

    /// Streams the root plus skillbox's files as one tar into `POST /images/create`.
    async fn import(
        &self,
        docker: &Docker,
        rootfs: &Path,
        inputs: &BuildInputs,
        tag: &str,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> EnvResult<()> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        let rootfs = rootfs.to_path_buf();
        let inputs_for_tar = inputs.clone();
        let writer = tokio::task::spawn_blocking(move || {
            let sink = ChannelWriter { tx: tx.clone() };
            let result = write_image_tar(sink, &rootfs, &inputs_for_tar);
            if let Err(e) = &result {
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
            result
        });
        let (repo, version) = tag.split_once(':').unwrap_or((tag, "latest"));
        let options = CreateImageOptions {
            from_src: Some("-".into()),
            repo: Some(repo.into()),
            tag: Some(version.into()),
            changes: vec![
                format!("USER {SANDBOX_UID}:{SANDBOX_UID}"),
                "WORKDIR /workspace".into(),
                "ENV PATH=/usr/local/bin:/usr/bin:/bin".into(),
                "ENV LANG=C.UTF-8".into(),
                format!("LABEL dev.skillbox.runtime={}", inputs.runtime_id),
            ],
            ..Default::default()
        };
        let body = bollard::body_try_stream(tokio_stream_from(rx));
        let mut answers = docker.create_image(Some(options), Some(body), None);
        while let Some(answer) = answers.next().await {
            match answer {
                Ok(info) => {
                    if let Some(status) = info.status.filter(|s| !s.is_empty()) {
                        progress(&format!("import: {status}"));
                    }
                }
                Err(e) => {
                    writer.abort();
                    return Err(daemon_error(BackendKind::Docker, &e));
                }
            }
        }
        match writer.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(failed(format!("image build: the tar writer failed: {e}"))),
        }
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A `Write` that hands 256 KiB chunks to the upload.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload ended"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn tar_error(what: &str, e: &std::io::Error) -> EnvError {
    failed(format!("image build: {what}: {e}"))
}

fn append_file(
    tar: &mut tar::Builder<impl Write>,
    path: &str,
    data: &[u8],
    mode: u32,
) -> EnvResult<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, path, data)
        .map_err(|e| tar_error(path, &e))
}

fn append_dir(
    tar: &mut tar::Builder<impl Write>,
    path: &str,
    mode: u32,
    uid: u64,
) -> EnvResult<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(0);
    header.set_mode(mode);
    header.set_uid(uid);
    header.set_gid(uid);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Directory);
    tar.append_data(&mut header, path, std::io::empty())
        .map_err(|e| tar_error(path, &e))
}

fn append_symlink(tar: &mut tar::Builder<impl Write>, path: &str, target: &str) -> EnvResult<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(0);
    header.set_mode(0o777);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Symlink);
    tar.append_link(&mut header, path, target)
        .map_err(|e| tar_error(path, &e))
}

/// The npm package of the node at `node` (`<prefix>/lib/node_modules/npm` for a node
/// in `<prefix>/bin`), if it is there.
fn npm_beside(node: &Path) -> Option<PathBuf> {
    let node = std::fs::canonicalize(node).ok()?;
    let npm = node.parent()?.parent()?.join("lib/node_modules/npm");
    npm.join("bin/npm-cli.js").is_file().then_some(npm)
}

/// Adds `dir` (recursively, symlinks as symlinks) under `prefix`, skipping `skip`.
fn append_tree(
    tar: &mut tar::Builder<impl Write>,
    dir: &Path,
    prefix: &Path,
    skip: &[&str],
    owner_root: bool,
) -> EnvResult<()> {
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let here = dir.join(&relative);
        let mut entries: Vec<_> = std::fs::read_dir(&here)
            .map_err(|e| tar_error(&here.display().to_string(), &e))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let rel = relative.join(entry.file_name());
            let rel_text = rel.to_string_lossy();
            if skip.iter().any(|s| rel_text == *s) {
                continue;
            }
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| tar_error(&path.display().to_string(), &e))?;
            let mut header = tar::Header::new_gnu();
            header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
            if owner_root {
                header.set_uid(0);
                header.set_gid(0);
            }
            let name = prefix.join(&rel);
            let ft = meta.file_type();
            if ft.is_symlink() {
                let target = std::fs::read_link(&path)
                    .map_err(|e| tar_error(&path.display().to_string(), &e))?;
                header.set_size(0);
                tar.append_link(&mut header, &name, &target)
                    .map_err(|e| tar_error(&name.display().to_string(), &e))?;
            } else if ft.is_dir() {
                header.set_size(0);
                tar.append_data(&mut header, &name, std::io::empty())
                    .map_err(|e| tar_error(&name.display().to_string(), &e))?;
                stack.push(rel);
            } else if ft.is_file() {
                let file = std::fs::File::open(&path)
                    .map_err(|e| tar_error(&path.display().to_string(), &e))?;
                tar.append_data(&mut header, &name, file)
                    .map_err(|e| tar_error(&name.display().to_string(), &e))?;
            }
            // Devices, fifos and sockets of the build root are not part of the image.
        }
    }
    Ok(())
}

/// Removes the debootstrap roots of builds whose process is gone (a Ctrl-C during the
/// minute of debootstrap): a partial Debian root of a few hundred MiB each, which no
/// later build reuses. One with anything mounted beneath it (a debootstrap still
/// running, orphaned) is left for a later build: the removal must not go into a mount.
/// A name without an owner with a start time (an older version's) is left too.
fn sweep_dead_roots(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix(ROOT_STAGING)
            .and_then(|r| r.split('-').nth(1))
        else {
            continue;
        };
        if !owner.contains('.') || !skillbox_env::owner::gone(cache, owner) {
            continue;
        }
        let path = entry.path();
        let beneath = format!("{}/", path.display());
        // Field 5 of a mountinfo line is the mount point (spaces escaped as \040).
        let mounted = mounts
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .any(|point| point.starts_with(&beneath) || point == beneath.trim_end_matches('/'));
        if mounted {
            tracing::warn!(dir = %path.display(), "image build: a dead build's root has mounts beneath it; left for later");
            continue;
        }
        if let Err(e) = skillbox_env::remove::remove_tree(&path) {
            tracing::warn!(dir = %path.display(), error = %e, "image build: could not remove a dead build's root");
        }
    }
    skillbox_env::owner::sweep_claims(cache);
}

fn with_sandbox_user(rootfs: &Path, file: &str, line: &str) -> EnvResult<Vec<u8>> {
    let path = rootfs.join(file);
    let mut text = std::fs::read_to_string(&path).map_err(|e| io_failed("read", &path, &e))?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    Ok(text.into_bytes())
}

/// `path` (relative) inside `rootfs`, its symlinks resolved inside `rootfs` too: an
/// absolute link in the root names a file of the root, never one of the host.
fn inside(rootfs: &Path, path: &Path) -> EnvResult<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..16 {
        let full = rootfs.join(&current);
        let meta = std::fs::symlink_metadata(&full).map_err(|e| io_failed("stat", &full, &e))?;
        if !meta.file_type().is_symlink() {
            return Ok(full);
        }
        let target = std::fs::read_link(&full).map_err(|e| io_failed("readlink", &full, &e))?;
        let next = if target.is_absolute() {
            target.strip_prefix("/").unwrap_or(&target).to_path_buf()
        } else {
            current.parent().unwrap_or(Path::new("")).join(target)
        };
        // Normalized, so `..` cannot climb out of the root.
        current = skillbox_env::path::normalize(&Path::new("/").join(next))
            .strip_prefix("/")
            .map(Path::to_path_buf)
            .unwrap_or_default();
    }
    Err(failed(format!(
        "image build: {}: too many levels of symlinks in the root",
        path.display()
    )))
}

fn write_image_tar(sink: impl Write, rootfs: &Path, inputs: &BuildInputs) -> EnvResult<()> {
    let mut tar = tar::Builder::new(sink);
    tar.follow_symlinks(false);
    append_tree(&mut tar, rootfs, Path::new(""), SKIPPED, false)?;
    for dir in ["dev", "proc", "sys", "run", "tmp"] {
        append_dir(&mut tar, dir, if dir == "tmp" { 0o1777 } else { 0o755 }, 0)?;
    }
    append_dir(&mut tar, "workspace", 0o755, u64::from(SANDBOX_UID))?;
    let passwd = with_sandbox_user(
        rootfs,
        "etc/passwd",
        &format!("sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:skillbox sandbox:/tmp:/bin/sh\n"),
    )?;
    append_file(&mut tar, "etc/passwd", &passwd, 0o644)?;
    let group = with_sandbox_user(rootfs, "etc/group", &format!("sandbox:x:{SANDBOX_UID}:\n"))?;
    append_file(&mut tar, "etc/group", &group, 0o644)?;
    append_dir(&mut tar, "usr/lib/skillbox", 0o755, 0)?;
    for (private, public) in [
        (PRIVATE_PERL, "usr/bin/perl"),
        (PRIVATE_PYTHON, "usr/bin/python3"),
    ] {
        let source = inside(rootfs, Path::new(public))?;
        let data = std::fs::read(&source).map_err(|e| io_failed("read", &source, &e))?;
        append_file(&mut tar, private.trim_start_matches('/'), &data, 0o711)?;
    }
    let node = std::fs::read(&inputs.node_binary)
        .map_err(|e| io_failed("read", &inputs.node_binary, &e))?;
    append_file(&mut tar, "usr/local/bin/node", &node, 0o755)?;
    // The host's npm beside its node (`npm install` through the egress proxy), when
    // there is one.
    if let Some(npm) = npm_beside(&inputs.node_binary) {
        for dir in ["usr/local/lib", "usr/local/lib/node_modules"] {
            // The Debian root may have it already (a tar must not hold a path twice).
            if !rootfs.join(dir).exists() {
                append_dir(&mut tar, dir, 0o755, 0)?;
            }
        }
        append_tree(
            &mut tar,
            &npm,
            Path::new("usr/local/lib/node_modules/npm"),
            &[],
            true,
        )?;
        for (name, cli) in [("npm", "npm-cli.js"), ("npx", "npx-cli.js")] {
            append_symlink(
                &mut tar,
                &format!("usr/local/bin/{name}"),
                &format!("../lib/node_modules/npm/bin/{cli}"),
            )?;
        }
    }
    append_dir(&mut tar, "node_modules", 0o755, 0)?;
    append_tree(
        &mut tar,
        &inputs.node_modules,
        Path::new("node_modules"),
        &[],
        true,
    )?;
    tar.finish().map_err(|e| tar_error("finish", &e))?;
    Ok(())
}

/// Starts a sandbox from the new image and checks that what runs need is there.
async fn verify(tag: &str) -> EnvResult<()> {
    use skillbox_env::{CancellationToken, ExecRequest, FileSystem, Shell};
    let backend = DockerBackend::connect(Runtime::Runc, tag).await?;
    let spec = SandboxSpec {
        limits: Limits::default(),
        ..SandboxSpec::default()
    };
    let root = spec.root.as_str().to_owned();
    let sandbox = backend.create(spec).await?;
    let check = ExecRequest::shell(
        "node -e \"require('pptxgenjs'); console.log('node ' + process.version)\" && \
         python3 -c 'import sys; print(\"python\", sys.version.split()[0])' && \
         python3 -m pip --version && { [ ! -e /usr/local/bin/npm ] || npm --version; }",
    )
    .cwd(root);
    let result = sandbox.exec(check, &CancellationToken::new()).await;
    let _ = sandbox.cleanup().await;
    let output = result?;
    if !output.success() {
        return Err(failed(format!(
            "image build: the new image {tag} does not run node/pptxgenjs/python3: {}{}",
            output.stdout_text(),
            output.stderr_text()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead build's root goes; a live build's, an older version's and one with a
    /// mount beneath it (root only: a tmpfs stands in for debootstrap's /proc) stay.
    #[test]
    fn only_a_dead_builds_unmounted_root_is_removed() {
        let cache = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let started = stat[stat.rfind(')').unwrap() + 2..]
            .split_whitespace()
            .nth(19)
            .unwrap()
            .to_string();
        child.wait().unwrap();
        let dead = format!("{ROOT_STAGING}0123456789abcdef-{pid}.{started}-01");
        let busy = format!("{ROOT_STAGING}0123456789abcdef-{pid}.{started}-02");
        let live = format!(
            "{ROOT_STAGING}0123456789abcdef-{}-03",
            skillbox_env::owner::this_process()
        );
        let older = format!("{ROOT_STAGING}0123456789abcdef-fedcba9876543210");
        for name in [&dead, &busy, &live, &older] {
            std::fs::create_dir_all(cache.path().join(name).join("proc")).unwrap();
        }
        let proc_dir = cache.path().join(&busy).join("proc");
        let path = std::ffi::CString::new(proc_dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mount(2) of a fresh tmpfs on a directory this test made.
        let mounted = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        } == 0;
        sweep_dead_roots(cache.path());
        let busy_kept = proc_dir.exists();
        if mounted {
            // SAFETY: unmounting the tmpfs mounted above (before any assert can fail).
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
        assert!(!cache.path().join(&dead).exists(), "a dead build's root");
        assert!(cache.path().join(&live).exists(), "a live build's root");
        assert!(
            cache.path().join(&older).exists(),
            "an unknown owner's root"
        );
        assert!(!mounted || busy_kept, "a root with a mount beneath it");
    }
}
