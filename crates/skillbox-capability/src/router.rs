//! Running a capability: the trust check first, then a sandbox of exactly the declared
//! environment from the backend registry (never a weaker one: an environment that is
//! not there is `unavailable`), with the declared limits and volumes, the capability's
//! directory read-only at `/capability`, the call's inputs in `/workspace`, egress only
//! to what its `network` allows (a backend without an egress proxy refuses it, never
//! running it with no network or more), and back only the files its `write_file`
//! permissions name.
//!
//! A `host` capability has no boundary: it runs in the project directory itself, as the
//! user, and writes where it writes; nothing is collected from it.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use skillbox_door::{Collection, Workspace};
use skillbox_env::{
    CancellationToken, EnvError, ErrorCode, ExecOutput, ExecRequest, ExecutionEnv, Limits, Mount,
    SandboxPolicy, SandboxSpec,
};
use skillbox_protocol::{OutputSelection, WorkspaceRoot};
use skillbox_registry::BackendRegistry;
use skillbox_store::{CollectLimits, CollectedFile};

use crate::manifest::{Environment, Lifecycle, Permission};
use crate::registry::Capability;
use crate::trust::{Scope, TrustStore};

/// Where a capability's own directory is shown in its sandbox (read-only).
pub const CAPABILITY_DIR: &str = "/capability";

/// One call of a capability.
#[derive(Debug, Clone, Default)]
pub struct CapabilityCall {
    /// After the manifest's own `args`.
    pub args: Vec<String>,
    /// Files put in `/workspace` first: relative path and content.
    pub inputs: Vec<(PathBuf, Bytes)>,
    /// Fed to the process's stdin (empty when `None`).
    pub stdin: Option<Vec<u8>>,
}

/// How a call ended.
#[derive(Debug)]
pub struct CapabilityOutcome {
    /// The grant it ran under.
    pub scope: Scope,
    pub output: ExecOutput,
    /// What it made that its `write_file` permissions name (none for `host`).
    pub files: Vec<CollectedFile>,
    /// The connections its sandbox's egress proxy let through or refused (empty without
    /// a `network` section).
    pub egress: Vec<skillbox_egress::Connection>,
}

/// A volume's host directory as it is shown: a directory reached without a symlink on
/// the way. A link on the path could be changed after the grant (by a sandbox writing
/// where it sits, even), and the grant names the path, not what it pointed at.
fn volume_source(host: &Path, field: &str) -> Result<PathBuf, EnvError> {
    let not_found = |e: std::io::Error| {
        EnvError::invalid(format!(
            "{field}: {}: not a directory here (or missing: {e}); a volume shows a host directory",
            host.display()
        ))
        .with_path(host)
    };
    let real = std::fs::canonicalize(host).map_err(not_found)?;
    if real != skillbox_env::path::normalize(host) {
        return Err(EnvError::invalid(format!(
            "{field}: {} goes through a symlink (it is {}); a volume is reached without one, the project's path included: give the directory's own path, or make it a real directory",
            host.display(),
            real.display()
        ))
        .with_path(host));
    }
    if !real.is_dir() {
        return Err(EnvError::invalid(format!(
            "{field}: {}: not a directory here (or missing); a volume shows a host directory",
            host.display()
        ))
        .with_path(host));
    }
    Ok(real)
}

/// (device, inode) of `path` and of each directory above it, nearest first: those of
/// them that exist.
fn identities(path: &Path) -> Vec<(u64, u64)> {
    path.ancestors()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

/// Refuses a read-write volume that reaches what decides what runs, at, under or over
/// it, by name or by device and inode: skillbox's data dir (the grants), the directory
/// the capability sits in, and every root and capability directory its registry found
/// (another capability's code, a `host` one's included, which runs with no boundary).
/// Then one root or root's group owns (the sandbox would be root in it).
fn writable_volume(
    shown: &Path,
    capability: &Capability,
    project: &Path,
    data_dir: &Path,
    field: &str,
) -> Result<(), EnvError> {
    let capabilities = capability.dir.parent().unwrap_or(&capability.dir);
    let mut guarded = vec![
        (
            crate::registry::guarded_path(data_dir),
            "skillbox's data dir, where its grants are kept",
        ),
        (
            crate::registry::guarded_path(capabilities),
            "the directory the capabilities are in (their code and manifests)",
        ),
        // What `skillbox cap` loads for this project whatever roots this capability
        // came with (a server's `--capabilities` may not name them): a `host`
        // capability's code planted there would run unsandboxed at its next `cap run`.
        (
            crate::registry::guarded_path(&project.join("capabilities")),
            "the project's capabilities, which `skillbox cap` loads (their code and manifests)",
        ),
    ];
    for path in capability.guarded.iter() {
        guarded.push((
            path.clone(),
            "where capabilities are loaded from (their code and manifests)",
        ));
    }
    // The volume and each directory above it, by what they are (device and inode), not
    // by name: a bind mount of a guarded directory elsewhere is still that directory.
    let above_shown = identities(shown);
    let Some(&itself) = above_shown.first() else {
        return Err(EnvError::io(
            &std::io::Error::from(std::io::ErrorKind::NotFound),
            "stat",
            shown,
        ));
    };
    for (guarded, what) in guarded {
        // The guarded directory, or the deepest one above it that exists.
        let above_guarded = identities(&guarded);
        let guarded_itself = guarded
            .exists()
            .then(|| above_guarded.first().copied())
            .flatten();
        let reaches = shown.starts_with(&guarded)
            || guarded.starts_with(shown)
            || above_guarded.contains(&itself)
            || guarded_itself.is_some_and(|g| above_shown.contains(&g));
        if reaches {
            return Err(EnvError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "{field}: {} is read-write and reaches {} ({what}); a sandbox may never write there: show another directory, or this one without rw",
                    shown.display(),
                    guarded.display()
                ),
            )
            .with_path(shown));
        }
    }
    // Never one root owns, nor its group: the sandbox would be root in it (a setuid-root
    // file or a root-only socket already there would be its to change or reach).
    let meta = std::fs::metadata(shown).map_err(|e| EnvError::io(&e, "stat", shown))?;
    if meta.uid() == 0 || meta.gid() == 0 {
        return Err(EnvError::invalid(format!(
            "{field}: {} belongs to {}:{}, and a read-write volume is written as its owner, never as root or root's group; chown it to an unprivileged user and group",
            shown.display(),
            meta.uid(),
            meta.gid()
        ))
        .with_path(shown));
    }
    Ok(())
}

/// The command that runs `entry`: an executable as it is; a script by its extension.
fn command(entry: &Path, executable: bool) -> Vec<String> {
    let shown = entry.display().to_string();
    let interpreter = match entry.extension().and_then(|e| e.to_str()) {
        _ if executable => None,
        Some("py") => Some("python3"),
        Some("js" | "mjs" | "cjs") => Some("node"),
        Some("sh") => Some("/bin/sh"),
        _ => None,
    };
    interpreter
        .map(str::to_string)
        .into_iter()
        .chain(std::iter::once(shown))
        .collect()
}

/// The limits the manifest declares, over skillbox's defaults.
fn limits(capability: &Capability) -> Limits {
    let bounds = capability.manifest.bounds().unwrap_or_default();
    let defaults = Limits::default();
    Limits {
        timeout_ms: bounds
            .timeout
            .unwrap_or(Duration::from_millis(defaults.timeout_ms))
            .as_millis() as u64,
        memory_bytes: bounds.memory_bytes.or(defaults.memory_bytes),
        pids: bounds.pids.or(defaults.pids),
        disk_bytes: bounds.disk_bytes.or(defaults.disk_bytes),
        ..defaults
    }
}

/// What comes back: the files the `write_file` permissions name, and nothing else
/// (`None`: no `write_file` permission, so no file at all). Copy-out takes the same
/// globs as what the capability declared.
pub fn outputs(capability: &Capability) -> Result<Option<OutputSelection>, EnvError> {
    let globs: Vec<&str> = capability
        .manifest
        .permissions
        .iter()
        .filter_map(|p| match p {
            Permission::WriteFile(glob) => Some(glob.as_str()),
            _ => None,
        })
        .collect();
    if globs.is_empty() {
        return Ok(None);
    }
    OutputSelection::new(&globs).map(Some).map_err(|e| {
        EnvError::invalid(format!(
            "{}: permissions: write_file:{}: {}",
            capability.manifest_file().display(),
            e.glob,
            e.reason
        ))
    })
}

/// The sandbox a capability runs in: the declared limits, its own directory read-only
/// at [`CAPABILITY_DIR`], its volumes (read-only unless `rw`), egress to what its
/// `network` allows; a `host` capability runs in the project itself. `data_dir` holds
/// the grants: no read-write volume may reach it.
pub(crate) fn sandbox_spec(
    capability: &Capability,
    project: &Path,
    data_dir: &Path,
) -> Result<SandboxSpec, EnvError> {
    let manifest = &capability.manifest;
    let host = manifest.environment == Environment::Host;
    if let Some(image) = &manifest.image {
        // Never run it in another image than it declared.
        return Err(EnvError::not_supported(format!(
            "{}: image {image}: a capability's own image is not built yet (it would run in skillbox's runtime image instead); remove `image` to run it there",
            capability.manifest_file().display()
        )));
    }
    let mut policy = SandboxPolicy::default();
    if !host {
        policy.read_only_mounts.push(Mount {
            host: capability.dir.clone(),
            sandbox: CAPABILITY_DIR.into(),
        });
        let mut sources: Vec<(PathBuf, bool)> = Vec::new();
        for (i, volume) in manifest.volumes.iter().enumerate() {
            let field = format!(
                "{}: volumes[{i}].host",
                capability.manifest_file().display()
            );
            // A relative volume is the project's, found from the project as the grants
            // name it (the real path its caller resolved once): a project that is a link
            // now (swapped since) is refused below as any link on the way is, never
            // followed to another directory under this project's grant.
            let host = if volume.host.is_absolute() {
                volume.host.clone()
            } else {
                project.join(&volume.host)
            };
            let shown = volume_source(&host, &field)?;
            // A read-write volume shares its host directory with no other volume: the
            // code could swap the other's directory for a link between the check and
            // the mount.
            if let Some((other, _)) = sources.iter().find(|(other, other_rw)| {
                (volume.rw || *other_rw) && (shown.starts_with(other) || other.starts_with(&shown))
            }) {
                return Err(EnvError::invalid(format!(
                    "{field}: {} and {}: a read-write volume may not be at, over or under another volume's host directory",
                    shown.display(),
                    other.display()
                ))
                .with_path(&shown));
            }
            sources.push((shown.clone(), volume.rw));
            if volume.rw {
                writable_volume(&shown, capability, project, data_dir, &field)?;
            }
            policy.volumes.push(skillbox_env::Volume {
                host: shown,
                sandbox: volume.sandbox.clone(),
                rw: volume.rw,
            });
        }
        policy.network = manifest.network_policy();
    }
    Ok(SandboxSpec {
        // The host runs in the project itself; a sandbox gets a workspace of its own.
        workspace: host.then(|| project.to_path_buf()),
        // A manifest names its paths under the default root (see `call_in`).
        root: WorkspaceRoot::default(),
        limits: Limits {
            disk_bytes: if host {
                None
            } else {
                limits(capability).disk_bytes
            },
            disk_inodes: None,
            ..limits(capability)
        },
        policy,
    })
}

/// The argv that runs a capability's entry in `kind` (with the manifest's args, not yet
/// the call's).
pub(crate) fn entry_argv(capability: &Capability, kind: skillbox_env::BackendKind) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let host = kind == skillbox_env::BackendKind::Host;
    let entry_host = capability.entry_path();
    let executable = std::fs::metadata(&entry_host)
        .map(|m| m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    let entry = if host {
        entry_host
    } else {
        Path::new(CAPABILITY_DIR).join(&capability.manifest.entry)
    };
    // A wasm guest runs by its interpreter (or is a module itself), never as a file.
    let executable = executable && kind != skillbox_env::BackendKind::Wasm;
    let mut argv = command(&entry, executable);
    argv.extend(capability.manifest.args.iter().cloned());
    argv
}

/// Runs `capability` once for `call`, in `project`, if trust allows it; what it made is
/// collected within `collect` (the caller's configured limits, as its runs').
pub async fn run(
    capability: &Capability,
    call: CapabilityCall,
    project: &Path,
    trust: &TrustStore,
    backends: &BackendRegistry,
    collect: CollectLimits,
    cancel: &CancellationToken,
) -> Result<CapabilityOutcome, EnvError> {
    let manifest = &capability.manifest;
    if manifest.lifecycle == Lifecycle::Persistent {
        return Err(EnvError::new(
            ErrorCode::NotSupported,
            format!(
                "{} is persistent: it is started once and reached over its endpoint (skillbox cap start {0}), not run",
                capability.name()
            ),
        ));
    }
    // What the run would be is worked out first: a capability that cannot run does not
    // spend a `once` grant on the attempt.
    let spec = sandbox_spec(capability, project, trust.data_dir())?;
    let selection = outputs(capability)?;
    let scope = trust
        .authorize(capability, project)
        .await
        .map_err(|e| EnvError::new(e.code, e.message))?;
    let kind = manifest.environment;
    let host = manifest.environment == Environment::Host;
    let env = match backends.create_one_shot(kind, spec).await {
        Ok(env) => env,
        Err(e) => {
            // Nothing ran: a `once` grant is given back for the next attempt.
            if scope == Scope::Once
                && let Err(back) = trust.grant(capability, Scope::Once, project).await
            {
                tracing::warn!(error = %back, capability = capability.name(), "capability: cannot give a once grant back");
            }
            return Err(e);
        }
    };
    let result = call_in(
        env.as_ref(),
        capability,
        call,
        host,
        &selection,
        collect,
        cancel,
    )
    .await;
    let egress = env.egress();
    if let Err(e) = env.cleanup().await {
        tracing::warn!(error = %e, capability = capability.name(), "capability: cleanup failed");
    }
    let (output, files) = result?;
    Ok(CapabilityOutcome {
        scope,
        output,
        files,
        egress,
    })
}

async fn call_in(
    env: &dyn ExecutionEnv,
    capability: &Capability,
    call: CapabilityCall,
    host: bool,
    selection: &Option<OutputSelection>,
    collect: CollectLimits,
    cancel: &CancellationToken,
) -> Result<(ExecOutput, Vec<CollectedFile>), EnvError> {
    let mut argv = entry_argv(capability, env.kind());
    argv.extend(call.args);
    let mut request = ExecRequest::argv(argv);
    request.stdin = call.stdin;
    for name in &capability.manifest.env {
        if let Ok(value) = std::env::var(name) {
            request = request.env(name, value);
        }
    }
    if host {
        // The project directory itself, as the user: nothing is placed or collected.
        return Ok((env.exec(request, cancel).await?, Vec::new()));
    }
    // A manifest names its paths under the default root (its sockets, its volumes'
    // places), so a capability's sandbox always has it.
    let root = WorkspaceRoot::default();
    let door = Workspace::new(env, &root);
    let mut inputs = BTreeMap::new();
    door.place_inputs(&call.inputs, &mut inputs, cancel)
        .await
        .map_err(|(_, e)| e)?;
    let Some(outputs) = selection.as_ref() else {
        let request = request.cwd(root.as_path());
        return Ok((env.exec(request, cancel).await?, Vec::new()));
    };
    let collection = Collection {
        inputs: &inputs,
        outputs,
        limits: collect,
    };
    let (output, files) = door
        .run_and_collect(Vec::new(), request, collection, cancel)
        .await?;
    let files = files.map_err(|e| EnvError::new(e.code(), e.to_string()))?;
    Ok((output, files))
}

/// Runs `f`, which may wait on the grants file's lock (another process's change, up to
/// a few seconds), without holding up a multi-threaded runtime's other tasks; on a
/// current-thread runtime (the CLI) it just runs.
pub(crate) fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
