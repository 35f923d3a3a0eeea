//! `capabilities/<name>/manifest.yaml`: what a capability is, where it runs, for how long,
//! and what it may touch, declared before anything executes. Parsed once, refusing
//! unknown fields, and validated into a [`Manifest`] the rest of skillbox takes as it is;
//! every error names the file, the line and the field.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use skillbox_protocol::units::{parse_duration, parse_size};
use skillbox_protocol::{BackendKind, NetworkPolicy};

/// Where a capability's code runs: one of the backend kinds, `host` included (a
/// capability may run as the user, under a grant that never outlives the session).
pub type Environment = BackendKind;

/// How long a capability's process lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Lifecycle {
    /// Run once, collect what it made, nothing left.
    Oneshot,
    /// A fresh process per call, with the call's arguments and stdin.
    Ondemand,
    /// Started once and reached over its port or socket until stopped.
    Persistent,
}

impl Lifecycle {
    /// The name in a manifest and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Oneshot => "oneshot",
            Lifecycle::Ondemand => "ondemand",
            Lifecycle::Persistent => "persistent",
        }
    }
}

/// Where a volume may not go in any sandbox (besides `/` itself): the places the
/// sandbox owns or the kernel fills, and the system's own directories.
const VOLUME_RESERVED: &[&str] = &[
    skillbox_protocol::DEFAULT_WORKSPACE_ROOT,
    "/tmp",
    "/proc",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/sys",
    "/run",
];

/// A host directory shown in the sandbox: read-only unless `rw`. Declared here only,
/// never by the code, and granted by its path (`volume:ro:PATH`, `volume:rw:PATH`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Volume {
    /// Path on the host, written plainly (no `.`, `..`, `//` or trailing `/`) and
    /// reached without a symlink: absolute, or relative to the project the capability
    /// runs for (`notes`, `data/cache`: the project's own directories, whichever
    /// project that is; grants are per project).
    pub host: PathBuf,
    /// Absolute path inside the sandbox, alone there: not at or under `/`, `/workspace`,
    /// `/tmp`, `/proc`, `/dev`, `/etc`, `/usr`, `/bin`, `/sbin`, `/lib*`, `/sys`, `/run`,
    /// nor at, over or under `/capability` or another volume.
    pub sandbox: PathBuf,
    /// The code may write there, as the directory's owner (never root or root's
    /// group); not bounded by `limits.disk`.
    #[serde(default)]
    pub rw: bool,
}

/// The limits a capability runs under (each at most what the server allows).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManifestLimits {
    /// Wall-clock limit per run: `30s`, `2m`.
    pub timeout: Option<String>,
    /// Memory for the whole process tree: `256M`, `1G`.
    pub memory: Option<String>,
    /// Processes and threads at once.
    pub pids: Option<u32>,
    /// `/workspace` and `/tmp` together: `512M`.
    pub disk: Option<String>,
}

/// `network`: the hosts a sandboxed capability may reach through skillbox's egress proxy
/// (DESIGN.md §3.8), as a run's `network`: entries `host`, `host:port`, `*.domain` or
/// `*.domain:port`; an `allow` host without a port means 80 and 443, a `deny` host
/// without one every port; deny wins; no `allow` entry means no network at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManifestNetwork {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

impl ManifestNetwork {
    /// The sandbox's network policy.
    pub fn policy(&self) -> NetworkPolicy {
        NetworkPolicy {
            allow: self.allow.clone(),
            deny: self.deny.clone(),
        }
    }
}

/// One thing a capability may do, beyond running in its environment.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
#[schemars(with = "String")]
pub enum Permission {
    /// `run_command:NAME`: start the program NAME.
    RunCommand(String),
    /// `read_file:GLOB`: read files matching GLOB (relative to the workspace).
    ReadFile(String),
    /// `write_file:GLOB`: write files matching GLOB.
    WriteFile(String),
    /// `network:none`: no network (as no `network` section; says so out loud).
    NetworkNone,
}

impl Permission {
    const KINDS: &'static str = "run_command:NAME, read_file:GLOB, write_file:GLOB, network:none";
}

impl TryFrom<String> for Permission {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let Some((kind, value)) = text.split_once(':') else {
            return Err(format!(
                "{text:?} is not KIND:VALUE (one of {})",
                Permission::KINDS
            ));
        };
        if value.is_empty() {
            return Err(format!("{text:?} has no value after the colon"));
        }
        match kind {
            "run_command" => Ok(Permission::RunCommand(value.into())),
            "read_file" => Ok(Permission::ReadFile(value.into())),
            "write_file" => Ok(Permission::WriteFile(value.into())),
            "network" if value == "none" => Ok(Permission::NetworkNone),
            "network" => Err(format!(
                "{text:?}: the only network permission is network:none; hosts to reach go in the \
                 manifest's network section (network: {{allow: [{value}]}})"
            )),
            _ => Err(format!(
                "{text:?}: unknown permission {kind:?} (one of {})",
                Permission::KINDS
            )),
        }
    }
}

impl From<Permission> for String {
    fn from(permission: Permission) -> String {
        permission.to_string()
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Permission::RunCommand(name) => write!(f, "run_command:{name}"),
            Permission::ReadFile(glob) => write!(f, "read_file:{glob}"),
            Permission::WriteFile(glob) => write!(f, "write_file:{glob}"),
            Permission::NetworkNone => f.write_str("network:none"),
        }
    }
}

/// A capability's manifest, as written (`manifest.yaml`) and as validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// a-z, 0-9 and `-`, at most 63 characters.
    pub name: String,
    pub description: String,
    pub version: String,
    pub environment: Environment,
    pub lifecycle: Lifecycle,
    /// The program or script, relative to the capability's directory (never out of it).
    pub entry: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub permissions: Vec<Permission>,
    #[serde(default)]
    pub limits: ManifestLimits,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    /// What it may reach through skillbox's egress proxy (sandboxes only; none: no
    /// network at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ManifestNetwork>,
    /// The container image (docker, gvisor only; default: skillbox's runtime image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The TCP port a persistent capability serves on, inside its sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Or the unix socket it listens on, inside its sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// Names of environment variables passed through from the caller.
    #[serde(default)]
    pub env: Vec<String>,
}

/// A manifest that is not one: the file, where in it, the field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ManifestError {}

/// How a `network.allow` entry is named among what a capability needs granted.
pub const NETWORK_ALLOW: &str = "network:allow:";
/// How a `network.deny` entry is named there: a grant given with it holds only while the
/// manifest keeps it.
pub const NETWORK_DENY: &str = "network:deny:";

/// The validated limits, in the units the sandbox takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    pub timeout: Option<Duration>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
    pub disk_bytes: Option<u64>,
}

/// The line a field starts on, for errors found after parsing: `key`, `key.sub`, or
/// `key[i]` (the i-th item of a list under `key`).
fn line_of(text: &str, field: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let (head, rest) = match field.find(['.', '[']) {
        Some(at) => field.split_at(at),
        None => (field, ""),
    };
    let top = lines
        .iter()
        .position(|l| l.strip_prefix(head).is_some_and(|r| r.starts_with(':')))?;
    let below = || {
        lines
            .iter()
            .enumerate()
            .skip(top + 1)
            .take_while(|(_, l)| l.starts_with(' ') || l.is_empty())
    };
    if let Some(sub) = rest.strip_prefix('.') {
        let (name, item) = match sub.find(['.', '[']) {
            Some(at) => sub.split_at(at),
            None => (sub, ""),
        };
        let Some((at, line)) = below().find(|(_, l)| {
            l.trim_start()
                .strip_prefix(name)
                .is_some_and(|r| r.starts_with(':'))
        }) else {
            return Some(top + 1);
        };
        // `key.sub[i]`: the i-th `- ` item under `sub` (deeper than it), when the list is
        // written one item a line; else `sub`'s own line.
        let index = item
            .strip_prefix('[')
            .and_then(|r| r.split_once(']'))
            .and_then(|(n, _)| n.parse::<usize>().ok());
        let indent = line.len() - line.trim_start().len();
        let deeper = |l: &&str| l.len() - l.trim_start().len() > indent || l.is_empty();
        return index
            .and_then(|index| {
                lines
                    .iter()
                    .enumerate()
                    .skip(at + 1)
                    .take_while(|(_, l)| deeper(l))
                    .filter(|(_, l)| l.trim_start().starts_with("- "))
                    .nth(index)
                    .map(|(i, _)| i + 1)
            })
            .or(Some(at + 1));
    }
    if let Some(index) = rest
        .strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .and_then(|(n, _)| n.parse::<usize>().ok())
    {
        return below()
            .filter(|(_, l)| l.trim_start().starts_with("- "))
            .nth(index)
            .map(|(i, _)| i + 1)
            .or(Some(top + 1));
    }
    Some(top + 1)
}

/// For an error about a quoted value in a list (`"network:any": …` under `permissions`):
/// which item it is, so the error names `permissions[2]` and its line.
fn item_of(text: &str, list: &str, message: &str) -> Option<String> {
    let value = message.strip_prefix('"')?.split_once('"')?.0;
    let lines: Vec<&str> = text.lines().collect();
    let top = lines
        .iter()
        .position(|l| l.strip_prefix(list).is_some_and(|r| r.starts_with(':')))?;
    let items = lines
        .iter()
        .skip(top + 1)
        .take_while(|l| l.starts_with(' ') || l.is_empty())
        .filter(|l| l.trim_start().starts_with("- "));
    items
        .enumerate()
        .find(|(_, l)| l.contains(value))
        .map(|(i, _)| format!("{list}[{i}]"))
}

fn plain_relative(path: &Path) -> bool {
    !path.as_os_str().is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

impl Manifest {
    /// Parses and validates `text`, the content of `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Manifest, ManifestError> {
        let manifest: Manifest = yaml_serde::from_str(text).map_err(|e| {
            let line = e.location().map(|l| l.line());
            // The message starts with the field path when the error is in one.
            let message = e.to_string();
            let message = match message.rsplit_once(" at line ") {
                Some((head, _)) => head.to_string(),
                None => message,
            };
            let (path, message) = match message.split_once(": ") {
                Some((field, rest)) if !field.contains(' ') => {
                    (Some(field.to_string()), rest.to_string())
                }
                _ => (None, message),
            };
            // An unknown field is the field to name, under the path it is in.
            let unknown = message
                .strip_prefix("unknown field `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name.to_string());
            let field = match (path, unknown) {
                (Some(path), Some(name)) => Some(format!("{path}.{name}")),
                (None, Some(name)) => Some(name),
                (Some(path), None) => Some(item_of(text, &path, &message).unwrap_or(path)),
                (None, None) => None,
            };
            // The parser points at the list; the item says where the value is.
            let line = match &field {
                Some(f) if f.ends_with(']') => line_of(text, f).or(line),
                _ => line,
            };
            ManifestError {
                file: file.to_path_buf(),
                line,
                field,
                message,
            }
        })?;
        manifest.validate(file, text)?;
        Ok(manifest)
    }

    fn validate(&self, file: &Path, text: &str) -> Result<(), ManifestError> {
        let error = |field: &str, message: String| ManifestError {
            file: file.to_path_buf(),
            line: line_of(text, field),
            field: Some(field.to_string()),
            message,
        };
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 63
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !self.name.starts_with('-');
        if !name_ok {
            return Err(error(
                "name",
                format!(
                    "{:?}: use a-z, 0-9 and -, at most 63 characters, not starting with -",
                    self.name
                ),
            ));
        }
        if !plain_relative(&self.entry) {
            return Err(error(
                "entry",
                format!(
                    "{}: must be a path inside the capability's directory (relative, no `..`)",
                    self.entry.display()
                ),
            ));
        }
        let containers = matches!(self.environment, Environment::Docker | Environment::Gvisor);
        if self.image.is_some() && !containers {
            return Err(error(
                "image",
                format!(
                    "only docker and gvisor capabilities have an image, not {}",
                    self.environment
                ),
            ));
        }
        match (self.lifecycle, self.port, &self.socket) {
            (Lifecycle::Persistent, None, None) => {
                return Err(error(
                    "lifecycle",
                    "a persistent capability says how it is reached: give port or socket".into(),
                ));
            }
            (Lifecycle::Persistent, Some(_), Some(_)) => {
                return Err(error("socket", "give port or socket, not both".into()));
            }
            (Lifecycle::Persistent, Some(port), _) if port < 1024 => {
                return Err(error(
                    "port",
                    format!(
                        "{port}: use a port of 1024 or above (the sandbox has no privilege to bind a lower one)"
                    ),
                ));
            }
            (Lifecycle::Persistent, _, Some(socket))
                if !socket.starts_with(skillbox_protocol::DEFAULT_WORKSPACE_ROOT)
                    || socket == Path::new(skillbox_protocol::DEFAULT_WORKSPACE_ROOT)
                    || socket
                        .components()
                        .any(|c| matches!(c, Component::ParentDir)) =>
            {
                return Err(error(
                    "socket",
                    format!(
                        "{}: must be a path under /workspace, where skillbox can open it (each exec's /tmp is its own)",
                        socket.display()
                    ),
                ));
            }
            (Lifecycle::Persistent, _, _) if self.environment == Environment::Wasm => {
                return Err(error(
                    "lifecycle",
                    "a wasm capability cannot be persistent: a WASI guest has no sockets to serve on".into(),
                ));
            }
            (Lifecycle::Oneshot | Lifecycle::Ondemand, Some(_), _) => {
                return Err(error(
                    "port",
                    "only a persistent capability serves on a port".into(),
                ));
            }
            (Lifecycle::Oneshot | Lifecycle::Ondemand, _, Some(_)) => {
                return Err(error(
                    "socket",
                    "only a persistent capability listens on a socket".into(),
                ));
            }
            _ => {}
        }
        for (i, volume) in self.volumes.iter().enumerate() {
            if !volume.sandbox.is_absolute() {
                return Err(error(
                    &format!("volumes[{i}].sandbox"),
                    format!("{}: must be absolute", volume.sandbox.display()),
                ));
            }
            for (name, path) in [("host", &volume.host), ("sandbox", &volume.sandbox)] {
                if path.to_string_lossy().chars().any(char::is_control) {
                    return Err(error(
                        &format!("volumes[{i}].{name}"),
                        format!("{:?}: a path with control characters", path.display()),
                    ));
                }
            }
            if !volume.host.is_absolute() && !plain_relative(&volume.host) {
                return Err(error(
                    &format!("volumes[{i}].host"),
                    format!(
                        "{}: give an absolute path, or one in the project written plainly \
                         (`notes`, `data/cache`: no `.`, `..` or leading `./`)",
                        volume.host.display()
                    ),
                ));
            }
            // A capability in a root every project uses names the same relative path in
            // each: never a project's hidden ones (`.git`, whose hooks and config run
            // on the host; `.env`; `.skillbox`).
            if !volume.host.is_absolute()
                && volume
                    .host
                    .components()
                    .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
            {
                return Err(error(
                    &format!("volumes[{i}].host"),
                    format!(
                        "{}: a project's hidden directories (`.git`, `.env`…) are never a \
                         volume; name a directory of the capability's own (`notes`)",
                        volume.host.display()
                    ),
                ));
            }
            if volume
                .sandbox
                .components()
                .any(|c| matches!(c, Component::ParentDir))
            {
                return Err(error(
                    &format!("volumes[{i}].sandbox"),
                    "may not contain `..`".into(),
                ));
            }
            // The grant names the path as written: it is the directory's own, plain.
            let plain = skillbox_env::path::normalize(&volume.host);
            if volume.host.as_os_str() != plain.as_os_str() {
                return Err(error(
                    &format!("volumes[{i}].host"),
                    format!(
                        "{}: give the path plainly (no `.`, `..`, `//` or trailing `/`): {}",
                        volume.host.display(),
                        plain.display()
                    ),
                ));
            }
            if self.environment == Environment::Host {
                return Err(error(
                    &format!("volumes[{i}]"),
                    "a host capability sees the host already; volumes are for sandboxes".into(),
                ));
            }
            // A volume shares its place with nothing: a mount point made inside it would
            // be made in the host's directory (by paths the code controls, when it is
            // read-write), and one holding it would hide it. Every backend holds to this.
            let sandbox = skillbox_env::path::normalize(&volume.sandbox);
            let capability = Path::new(crate::router::CAPABILITY_DIR);
            let nested = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
            let reserved = if sandbox == Path::new("/") {
                Some(&"/")
            } else {
                VOLUME_RESERVED.iter().find(|r| sandbox.starts_with(r))
            };
            if let Some(owned) = reserved {
                return Err(error(
                    &format!("volumes[{i}].sandbox"),
                    format!(
                        "{}: a volume may not be at or under {owned}, which the sandbox or its system holds; show it elsewhere (e.g. /data)",
                        sandbox.display()
                    ),
                ));
            }
            if nested(&sandbox, capability) {
                return Err(error(
                    &format!("volumes[{i}].sandbox"),
                    format!(
                        "{}: a volume may not be at, over or under {}, where the capability's own directory is shown",
                        sandbox.display(),
                        capability.display()
                    ),
                ));
            }
            for (j, other) in self.volumes.iter().enumerate().take(i) {
                let other_sandbox = skillbox_env::path::normalize(&other.sandbox);
                if nested(&sandbox, &other_sandbox) {
                    return Err(error(
                        &format!("volumes[{i}].sandbox"),
                        format!(
                            "{} and volumes[{j}].sandbox {}: a volume may not be at, over or under another volume",
                            sandbox.display(),
                            other_sandbox.display()
                        ),
                    ));
                }
            }
        }
        // File globs are checked as a run's `outputs` are: relative to the workspace,
        // without `.` or `..`. A bad one is this file's fault, named here, not found at
        // run time (after a `once` grant was spent on it).
        for (i, permission) in self.permissions.iter().enumerate() {
            let glob = match permission {
                Permission::ReadFile(glob) | Permission::WriteFile(glob) => glob,
                _ => continue,
            };
            if let Err(e) = skillbox_protocol::OutputSelection::new(&[glob.as_str()]) {
                return Err(error(
                    &format!("permissions[{i}]"),
                    format!("{permission}: {}", e.reason),
                ));
            }
        }
        for (i, name) in self.env.iter().enumerate() {
            let ok = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(error(
                    &format!("env[{i}]"),
                    format!("{name:?}: a variable name is A-Z, 0-9 and _"),
                ));
            }
        }
        if let Some(network) = &self.network {
            self.validate_network(network)
                .map_err(|(field, message)| error(&field, message))?;
        }
        self.bounds()
            .map_err(|(field, message)| error(&format!("limits.{field}"), message))?;
        Ok(())
    }

    /// The `network` section: each entry checked as a run's are (the same rules, so the
    /// same entries mean the same thing), and only where a sandbox's proxy enforces it.
    fn validate_network(&self, network: &ManifestNetwork) -> Result<(), (String, String)> {
        skillbox_egress::Rules::new(&network.policy()).map_err(|e| {
            let field = if e.entry.is_empty() {
                "network".to_string()
            } else {
                format!("network.{}[{}]", e.field, e.index)
            };
            let message = if e.entry.is_empty() {
                e.why
            } else {
                format!("{:?}: {}", e.entry, e.why)
            };
            (field, message)
        })?;
        if network.allow.is_empty() {
            return Ok(());
        }
        if self.environment == Environment::Host {
            return Err((
                "network".into(),
                "a host capability has the host's whole network already; network is for sandboxes"
                    .into(),
            ));
        }
        if self.permissions.contains(&Permission::NetworkNone) {
            return Err((
                "network.allow".into(),
                "contradicts the permission network:none; keep one of them".into(),
            ));
        }
        Ok(())
    }

    /// The limits in the sandbox's units (checked at parse: this does not fail then).
    pub fn bounds(&self) -> Result<Bounds, (&'static str, String)> {
        let limits = &self.limits;
        Ok(Bounds {
            timeout: limits
                .timeout
                .as_deref()
                .map(parse_duration)
                .transpose()
                .map_err(|e| ("timeout", e))?,
            memory_bytes: limits
                .memory
                .as_deref()
                .map(parse_size)
                .transpose()
                .map_err(|e| ("memory", e))?,
            pids: match limits.pids {
                Some(0) => return Err(("pids", "must be at least 1".into())),
                pids => pids,
            },
            disk_bytes: limits
                .disk
                .as_deref()
                .map(parse_size)
                .transpose()
                .map_err(|e| ("disk", e))?,
        })
    }

    /// What running it needs granted: running in its environment, each permission, each
    /// `network` entry (`network:allow:HOST`, `network:deny:HOST`: a grant covers the
    /// allow entries it was given for, and holds only while the deny entries it was given
    /// with are still there, since dropping one reaches more), each host directory it
    /// sees (`volume:ro:PATH`, `volume:rw:PATH`, the path as written: a relative one is
    /// the project's, and a grant holds for one project), each environment variable passed in
    /// from the caller (`env:NAME`: its value may be a secret), and serving
    /// (`lifecycle:persistent`: it runs until stopped and answers whoever reaches it).
    pub fn needs(&self) -> Vec<String> {
        let network = self.network.iter().flat_map(|n| {
            let allow = n.allow.iter().map(|e| format!("{NETWORK_ALLOW}{e}"));
            let deny = n.deny.iter().map(|e| format!("{NETWORK_DENY}{e}"));
            allow.chain(deny)
        });
        let volumes = self.volumes.iter().map(|v| {
            let how = if v.rw { "rw" } else { "ro" };
            format!("volume:{how}:{}", v.host.display())
        });
        let env = self.env.iter().map(|name| format!("env:{name}"));
        let serves =
            (self.lifecycle == Lifecycle::Persistent).then(|| "lifecycle:persistent".to_string());
        std::iter::once(format!("run_capability:{}", self.environment))
            .chain(self.permissions.iter().map(Permission::to_string))
            .chain(network)
            .chain(volumes)
            .chain(env)
            .chain(serves)
            .collect()
    }

    /// The sandbox's network policy: `None` when it may reach nothing.
    pub fn network_policy(&self) -> Option<NetworkPolicy> {
        self.network
            .as_ref()
            .filter(|n| !n.allow.is_empty())
            .map(ManifestNetwork::policy)
    }
}

/// The JSON Schema of `manifest.yaml`, generated from the types.
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Manifest)).unwrap_or_default()
}
