//! Manifests, the registry and trust, over real files.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::{Path, PathBuf};

use skillbox_capability::{
    CapabilityRegistry, Environment, Lifecycle, Manifest, Permission, Scope, TrustStore, schema,
};
use skillbox_protocol::ErrorCode;

const GOOD: &str = "name: word-count
description: Counts the words of a file
version: 0.1.0
environment: native
lifecycle: oneshot
entry: count.py
args: [--top, \"10\"]
permissions:
  - run_command:python3
  - write_file:report-*
  - network:none
limits:
  timeout: 30s
  memory: 256M
  pids: 16
  disk: 64M
env: [LANG]
";

fn parse(text: &str) -> Result<Manifest, skillbox_capability::ManifestError> {
    Manifest::parse(Path::new("capabilities/x/manifest.yaml"), text)
}

/// A capability directory under `root` with `manifest` and an entry file.
fn capability(root: &Path, dir: &str, manifest: &str, entry: Option<&str>) -> PathBuf {
    let dir = root.join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manifest.yaml"), manifest).unwrap();
    if let Some(entry) = entry {
        std::fs::write(dir.join(entry), "print('hi')\n").unwrap();
    }
    dir
}

/// `work` to its end on this thread (a thread of its own, for calls at once that each
/// take the grants' lock as a process would).
fn on_thread<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(work)
}

#[test]
fn a_manifest_parses_into_its_declared_answers() {
    let m = parse(GOOD).unwrap();
    assert_eq!(m.environment, Environment::Native);
    assert_eq!(m.lifecycle, Lifecycle::Oneshot);
    assert_eq!(m.permissions[1], Permission::WriteFile("report-*".into()));
    let bounds = m.bounds().unwrap();
    assert_eq!(bounds.timeout, Some(std::time::Duration::from_secs(30)));
    assert_eq!(bounds.memory_bytes, Some(256 << 20));
    assert_eq!(bounds.disk_bytes, Some(64 << 20));
    assert_eq!(
        m.needs(),
        [
            "run_capability:native",
            "run_command:python3",
            "write_file:report-*",
            "network:none",
            "env:LANG"
        ]
    );
}

#[test]
fn a_bad_manifest_is_named_by_file_line_and_field() {
    let cases: Vec<(String, usize, &str, &str)> = vec![
        (
            GOOD.replace("env: [LANG]", "envs: [LANG]"),
            17,
            "envs",
            "unknown field",
        ),
        (
            GOOD.replace("environment: native", "environment: vmware"),
            4,
            "environment",
            "vmware",
        ),
        (
            GOOD.replace("network:none", "network:any"),
            11,
            "permissions[2]",
            "the only network permission is network:none",
        ),
        (
            GOOD.replace("write_file:report-*", "eat_cake:yes"),
            10,
            "permissions[1]",
            "unknown permission",
        ),
        (
            GOOD.replace("write_file:report-*", "write_file:../x"),
            10,
            "permissions[1]",
            "write_file:../x",
        ),
        (
            GOOD.replace("write_file:report-*", "write_file:/etc/*"),
            10,
            "permissions[1]",
            "write_file:/etc/*",
        ),
        (
            GOOD.replace("write_file:report-*", "read_file:a/./b"),
            10,
            "permissions[1]",
            "read_file:a/./b",
        ),
        (
            GOOD.replace("entry: count.py", "entry: ../../etc/passwd"),
            6,
            "entry",
            "inside the capability",
        ),
        (
            GOOD.replace("entry: count.py", "entry: /bin/sh"),
            6,
            "entry",
            "inside the capability",
        ),
        (
            GOOD.replace("name: word-count", "name: Word Count"),
            1,
            "name",
            "a-z",
        ),
        (
            GOOD.replace("timeout: 30s", "timeout: soon"),
            13,
            "limits.timeout",
            "not a duration",
        ),
        (
            GOOD.replace("lifecycle: oneshot", "lifecycle: persistent"),
            5,
            "lifecycle",
            "port or socket",
        ),
        (
            format!("{GOOD}port: 8080\n"),
            18,
            "port",
            "only a persistent",
        ),
        (
            format!(
                "{}port: 80\n",
                GOOD.replace("lifecycle: oneshot", "lifecycle: persistent")
            ),
            18,
            "port",
            "1024 or above",
        ),
        (
            format!(
                "{}socket: /tmp/app.sock\n",
                GOOD.replace("lifecycle: oneshot", "lifecycle: persistent")
            ),
            18,
            "socket",
            "under /workspace",
        ),
        (
            format!(
                "{}socket: /workspace/../etc/x.sock\n",
                GOOD.replace("lifecycle: oneshot", "lifecycle: persistent")
            ),
            18,
            "socket",
            "under /workspace",
        ),
        (
            format!(
                "{}port: 8080\n",
                GOOD.replace("lifecycle: oneshot", "lifecycle: persistent")
                    .replace("environment: native", "environment: wasm")
            ),
            5,
            "lifecycle",
            "no sockets",
        ),
        (
            format!("{GOOD}image: alpine\n"),
            18,
            "image",
            "only docker and gvisor",
        ),
        (
            format!(
                "{GOOD}volumes:\n  - host: /srv/a\n    sandbox: /data\n    rw: true\n  - host: /srv/b\n    sandbox: /data/ref\n"
            ),
            22,
            "volumes[1].sandbox",
            "another volume",
        ),
        (
            format!(
                "{GOOD}volumes:\n  - host: /srv/b\n    sandbox: /data/ref\n  - host: /srv/a\n    sandbox: /data\n    rw: true\n"
            ),
            21,
            "volumes[1].sandbox",
            "another volume",
        ),
        (
            format!("{GOOD}volumes:\n  - host: /srv/a\n    sandbox: /etc/app\n"),
            19,
            "volumes[0].sandbox",
            "/etc",
        ),
        (
            format!(
                "{GOOD}volumes:\n  - host: /srv/a\n    sandbox: /ref\n  - host: /srv/b\n    sandbox: /ref/b\n"
            ),
            21,
            "volumes[1].sandbox",
            "another volume",
        ),
        (
            format!("{GOOD}volumes:\n  - host: /srv/x/../a\n    sandbox: /data\n"),
            19,
            "volumes[0].host",
            "plainly",
        ),
        (
            format!("{GOOD}volumes:\n  - host: /srv/a/\n    sandbox: /data\n"),
            19,
            "volumes[0].host",
            "plainly",
        ),
        (
            format!("{GOOD}volumes:\n  - host: ../notes\n    sandbox: /data\n"),
            19,
            "volumes[0].host",
            "in the project written plainly",
        ),
        (
            format!("{GOOD}volumes:\n  - host: ./notes\n    sandbox: /data\n"),
            19,
            "volumes[0].host",
            "in the project written plainly",
        ),
        (
            format!("{GOOD}volumes:\n  - host: .\n    sandbox: /data\n"),
            19,
            "volumes[0].host",
            "in the project written plainly",
        ),
        (
            format!("{GOOD}volumes:\n  - host: notes\n    sandbox: data\n"),
            19,
            "volumes[0].sandbox",
            "must be absolute",
        ),
        (
            format!("{GOOD}volumes:\n  - host: .git/hooks\n    sandbox: /data\n    rw: true\n"),
            19,
            "volumes[0].host",
            "hidden directories",
        ),
        (
            format!("{GOOD}volumes:\n  - host: data/.cache\n    sandbox: /data\n"),
            19,
            "volumes[0].host",
            "hidden directories",
        ),
        (
            format!("{GOOD}volumes:\n  - host: \"notes\\nvolume:rw:/etc\"\n    sandbox: /data\n"),
            19,
            "volumes[0].host",
            "control characters",
        ),
        (
            format!(
                "{GOOD}volumes:\n  - host: /srv/a\n    sandbox: /usr/local/data\n    rw: true\n"
            ),
            19,
            "volumes[0].sandbox",
            "/usr",
        ),
        (
            format!("{GOOD}volumes:\n  - host: /srv/a\n    sandbox: /\n    rw: true\n"),
            19,
            "volumes[0].sandbox",
            "at or under /",
        ),
        (
            format!(
                "{GOOD}volumes:\n  - host: /srv/a\n    sandbox: /capability/out\n    rw: true\n"
            ),
            19,
            "volumes[0].sandbox",
            "/capability",
        ),
        (
            GOOD.replace("env: [LANG]", "env: [\"lang-x\"]"),
            17,
            "env[0]",
            "variable name",
        ),
        (
            format!(
                "{}network:\n  allow:\n    - files.example.org\n    - https://api.example.com/v1\n",
                GOOD.replace("  - network:none\n", "")
            ),
            20,
            "network.allow[1]",
            "a host, not a URL",
        ),
        (
            format!(
                "{}network:\n  allow: [files.example.org]\n  deny: [\"*.example.org:99999\"]\n",
                GOOD.replace("  - network:none\n", "")
            ),
            19,
            "network.deny[0]",
            "not a number from 1 to 65535",
        ),
        (
            format!("{GOOD}network:\n  allow: [files.example.org]\n"),
            19,
            "network.allow",
            "contradicts the permission network:none",
        ),
        (
            format!(
                "{}network:\n  allow: [files.example.org]\n",
                GOOD.replace("  - network:none\n", "")
                    .replace("environment: native", "environment: host")
            ),
            17,
            "network",
            "network is for sandboxes",
        ),
        (
            format!(
                "{}network:\n  allow: [files.example.org]\n  through: proxy\n",
                GOOD.replace("  - network:none\n", "")
            ),
            19,
            "network.through",
            "unknown field",
        ),
    ];
    for (text, line, field, words) in cases {
        let e = parse(&text).unwrap_err();
        assert_eq!(e.field.as_deref(), Some(field), "{e}");
        assert_eq!(e.line, Some(line), "{e}");
        assert!(e.message.contains(words), "{e}");
        let shown = e.to_string();
        assert!(
            shown.starts_with(&format!("capabilities/x/manifest.yaml:{line}: {field}: ")),
            "{shown}"
        );
    }
}

#[test]
fn the_checked_in_schema_is_the_one_the_types_make() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/capability-manifest.schema.json");
    let generated = serde_json::to_string_pretty(&schema()).unwrap() + "\n";
    if std::env::var_os("SKILLBOX_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; write it with SKILLBOX_BLESS=1", path.display()));
    assert_eq!(
        checked_in, generated,
        "the manifest types changed: re-bless with SKILLBOX_BLESS=1 cargo test -p skillbox-capability, on purpose"
    );
    assert!(generated.contains("\"deny\"") || generated.contains("additionalProperties"));
}

#[test]
fn the_registry_loads_the_good_and_names_each_bad_one() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("evil.py"), "boom").unwrap();
    capability(root.path(), "a-count", GOOD, Some("count.py"));
    // The same name again: the later one is refused, the first stays.
    capability(root.path(), "b-count", GOOD, Some("count.py"));
    // Invalid YAML for its schema.
    capability(
        root.path(),
        "c-bad",
        &GOOD.replace("name: word-count", "nam: x"),
        Some("count.py"),
    );
    // Its entry is missing.
    capability(
        root.path(),
        "d-missing",
        &GOOD.replace("word-count", "d-missing"),
        None,
    );
    // Its entry is a symlink out of its directory.
    let e = capability(
        root.path(),
        "e-link",
        &GOOD.replace("word-count", "e-link"),
        None,
    );
    std::os::unix::fs::symlink(outside.path().join("evil.py"), e.join("count.py")).unwrap();
    // A second root, and a root that does not exist.
    let second = tempfile::tempdir().unwrap();
    capability(
        second.path(),
        "f",
        &GOOD.replace("word-count", "other"),
        Some("count.py"),
    );
    let registry = CapabilityRegistry::load(&[
        root.path().to_path_buf(),
        root.path().join("nope"),
        second.path().to_path_buf(),
    ]);
    let names: Vec<&str> = registry.iter().map(|c| c.name()).collect();
    assert_eq!(names, ["other", "word-count"]);
    let counted = registry.get("word-count").unwrap();
    assert!(counted.dir.ends_with("a-count"));
    assert_eq!(counted.entry_path(), counted.dir.join("count.py"));
    let errors: Vec<String> = registry.errors().iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 4, "{errors:#?}");
    let about = |dir: &str| {
        errors
            .iter()
            .find(|e| e.contains(&format!("/{dir}/")))
            .unwrap()
            .clone()
    };
    assert!(
        about("b-count").contains("already the name of"),
        "{errors:#?}"
    );
    assert!(about("c-bad").contains("nam"), "{errors:#?}");
    assert!(about("d-missing").contains("no such file"), "{errors:#?}");
    assert!(about("e-link").contains("leads out of"), "{errors:#?}");
}

fn loaded(root: &Path, manifest: &str) -> skillbox_capability::Capability {
    let name = manifest
        .lines()
        .find_map(|l| l.strip_prefix("name: "))
        .unwrap()
        .to_string();
    capability(root, &name, manifest, Some("count.py"));
    CapabilityRegistry::load(&[root.to_path_buf()])
        .get(&name)
        .cloned()
        .unwrap()
}

/// A grants write that a killed process left half done (its temp file, named after a
/// pid this process has now: a server that is pid 1 of its container, restarted) does
/// not stop this process's grants.
#[tokio::test]
async fn a_grants_write_a_killed_process_left_does_not_block_grants() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let word_count = loaded(root.path(), GOOD);
    let left = data
        .path()
        .join(format!("trust.tmp-{}", std::process::id()));
    std::fs::write(&left, "{\"grants\":[").unwrap();
    let trust = TrustStore::open(data.path());
    trust
        .grant(&word_count, Scope::Project, root.path())
        .await
        .unwrap();
    assert_eq!(
        TrustStore::open(data.path())
            .authorize(&word_count, root.path())
            .await
            .unwrap(),
        Scope::Project
    );
}

#[tokio::test]
async fn a_host_capability_never_gets_more_than_a_session() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = root.path();
    let host = loaded(
        root.path(),
        &GOOD.replace("environment: native", "environment: host"),
    );
    let trust = TrustStore::open(data.path());
    let e = trust
        .grant(&host, Scope::Project, project)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PermissionDenied);
    assert!(e.message.contains("session at most"), "{e}");
    // Ungranted: refused, naming what it needs and the command.
    let e = trust.authorize(&host, project).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::PermissionDenied);
    assert!(e.message.contains("run_capability:host"), "{e}");
    assert!(
        e.message
            .contains("skillbox cap grant word-count --scope once"),
        "{e}"
    );
    // Once: one run, then refused again.
    trust.grant(&host, Scope::Once, project).await.unwrap();
    assert_eq!(trust.authorize(&host, project).await.unwrap(), Scope::Once);
    assert!(trust.authorize(&host, project).await.is_err());
    // Many runs under session grants never turn into a project grant.
    trust.grant(&host, Scope::Session, project).await.unwrap();
    for _ in 0..5 {
        assert_eq!(
            trust.authorize(&host, project).await.unwrap(),
            Scope::Session
        );
    }
    let later = TrustStore::open(data.path());
    assert!(
        later.authorize(&host, project).await.is_err(),
        "a session grant outlived its process"
    );
    // A hand-edited project grant for it counts for nothing.
    let file = data.path().join("trust.json");
    let forged = format!(
        "{{\"grants\":[{{\"capability\":\"word-count\",\"project\":{:?},\"scope\":\"project\",\"covers\":[\"run_capability:host\",\"run_command:python3\",\"write_file:report-*\",\"network:none\"],\"grantedMs\":1}}]}}",
        project
    );
    std::fs::write(&file, forged).unwrap();
    assert!(
        TrustStore::open(data.path())
            .authorize(&host, project)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn project_grants_persist_cover_what_was_declared_and_a_deny_wins() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = root.path();
    let native = loaded(root.path(), GOOD);
    let trust = TrustStore::open(data.path());
    trust.grant(&native, Scope::Project, project).await.unwrap();
    let again = TrustStore::open(data.path());
    assert_eq!(
        again.authorize(&native, project).await.unwrap(),
        Scope::Project
    );
    // Another project: not granted there.
    let elsewhere = tempfile::tempdir().unwrap();
    assert!(again.authorize(&native, elsewhere.path()).await.is_err());
    // The manifest asks for more than was granted: refused, naming only what is new.
    let greedy = loaded(
        root.path(),
        &GOOD.replace("  - network:none", "  - network:none\n  - run_command:curl"),
    );
    let e = again.authorize(&greedy, project).await.unwrap_err();
    assert!(e.message.contains("needs run_command:curl;"), "{e}");
    // A deny wins over the grant, and lifting it restores it.
    again.deny("word-count", project).await.unwrap();
    let e = again.authorize(&native, project).await.unwrap_err();
    assert!(e.message.contains("denied"), "{e}");
    again.allow("word-count", project).await.unwrap();
    assert!(again.authorize(&native, project).await.is_ok());
    // Revoked: gone for every process.
    assert_eq!(again.revoke("word-count", project).await.unwrap(), 1);
    assert!(
        TrustStore::open(data.path())
            .authorize(&native, project)
            .await
            .is_err()
    );
    let (grants, denied) = again.list(project).await.unwrap();
    assert!(grants.is_empty() && denied.is_empty());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.path().join("trust.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the grants file is the user's alone");
}

/// A grant covers the hosts a manifest's `network` allowed when it was granted: a new
/// host, or a `deny` entry dropped (which reaches more), needs a new grant; one more
/// `deny` entry (which reaches less) does not.
#[tokio::test]
async fn a_grant_covers_the_network_it_was_given_for_and_no_more() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = root.path();
    let base = GOOD.replace("  - network:none\n", "");
    let with = |network: &str| loaded(root.path(), &format!("{base}network:\n{network}"));
    let fetcher = with("  allow: [\"*.example.org\"]\n  deny: [secret.example.org]\n");
    assert_eq!(
        fetcher.manifest.needs()[3..5],
        [
            "network:allow:*.example.org",
            "network:deny:secret.example.org"
        ]
    );
    let policy = fetcher.manifest.network_policy().unwrap();
    assert_eq!(policy.allow, ["*.example.org"]);
    assert_eq!(policy.deny, ["secret.example.org"]);
    let trust = TrustStore::open(data.path());
    trust
        .grant(&fetcher, Scope::Project, project)
        .await
        .unwrap();
    assert_eq!(
        trust.authorize(&fetcher, project).await.unwrap(),
        Scope::Project
    );

    let wider = with("  allow: [\"*.example.org\", pypi.org]\n  deny: [secret.example.org]\n");
    let e = trust.authorize(&wider, project).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::PermissionDenied);
    assert!(e.message.contains("needs network:allow:pypi.org;"), "{e}");

    let undenied = with("  allow: [\"*.example.org\"]\n");
    let e = trust.authorize(&undenied, project).await.unwrap_err();
    assert!(
        e.message
            .contains("network:deny:secret.example.org no longer declared"),
        "{e}"
    );

    let narrower =
        with("  allow: [\"*.example.org\"]\n  deny: [secret.example.org, a.example.org]\n");
    assert_eq!(
        trust.authorize(&narrower, project).await.unwrap(),
        Scope::Project
    );

    // An empty section is no network, as none is: nothing to grant beyond running.
    let none = with("  allow: []\n");
    assert!(none.manifest.network_policy().is_none());
}

/// What a manifest adds after its grant beyond permissions and network is "more" too: a
/// host directory it sees, a variable passed in from the caller (a secret, say), and
/// serving. Each is named among what it needs, and a grant given without it does not
/// cover it.
#[tokio::test]
async fn a_grant_covers_the_volumes_variables_and_serving_it_was_given_for_and_no_more() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let shared = tempfile::tempdir().unwrap();
    let project = root.path();
    let plain = loaded(root.path(), &GOOD.replace("env: [LANG]\n", ""));
    let trust = TrustStore::open(data.path());
    trust.grant(&plain, Scope::Project, project).await.unwrap();
    assert_eq!(
        trust.authorize(&plain, project).await.unwrap(),
        Scope::Project
    );

    let volume = format!(
        "volumes:\n  - host: {}\n    sandbox: /shared\n",
        shared.path().display()
    );
    let peeking = loaded(
        root.path(),
        &GOOD.replace("env: [LANG]\n", &format!("{volume}env: [API_TOKEN]\n")),
    );
    let needs = peeking.manifest.needs();
    let seen = format!("volume:ro:{}", shared.path().display());
    assert!(
        needs.contains(&seen) && needs.contains(&"env:API_TOKEN".to_string()),
        "{needs:?}"
    );
    let e = trust.authorize(&peeking, project).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::PermissionDenied);
    assert!(
        e.message.contains(&format!("needs env:API_TOKEN, {seen};")),
        "{e}"
    );
    // Granted with them, it runs; the grant lists them.
    let grant = trust
        .grant(&peeking, Scope::Project, project)
        .await
        .unwrap();
    assert!(grant.covers.contains(&seen), "{:?}", grant.covers);
    assert_eq!(
        trust.authorize(&peeking, project).await.unwrap(),
        Scope::Project
    );

    // A oneshot granted, then declared persistent: serving is new.
    let serving = loaded(
        root.path(),
        &GOOD
            .replace("env: [LANG]\n", &format!("{volume}env: [API_TOKEN]\n"))
            .replace("lifecycle: oneshot", "lifecycle: persistent\nport: 8080"),
    );
    let e = trust.authorize(&serving, project).await.unwrap_err();
    assert!(e.message.contains("needs lifecycle:persistent;"), "{e}");
}

/// Two processes sharing a data dir (the CLI beside a server: two stores here, each
/// with its own in-process lock) change the grants file at once: no grant or deny is
/// lost, and one `once` grant runs one call between them.
#[tokio::test]
async fn two_processes_changing_the_grants_at_once_lose_nothing() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = root.path();
    let names: Vec<String> = (0..16).map(|i| format!("cap-{i:02}")).collect();
    let capabilities: Vec<_> = names
        .iter()
        .map(|name| {
            loaded(
                root.path(),
                &GOOD.replace("name: word-count", &format!("name: {name}")),
            )
        })
        .collect();
    let (one, two) = (TrustStore::open(data.path()), TrustStore::open(data.path()));
    std::thread::scope(|s| {
        for (i, capability) in capabilities.iter().enumerate() {
            let store = if i % 2 == 0 { &one } else { &two };
            s.spawn(move || on_thread(store.grant(capability, Scope::Project, project)).unwrap());
        }
        for (i, name) in names.iter().enumerate() {
            let store = if i % 2 == 0 { &two } else { &one };
            s.spawn(move || on_thread(store.deny(name, project)).unwrap());
        }
    });
    let (grants, denied) = TrustStore::open(data.path()).list(project).await.unwrap();
    assert_eq!(grants.len(), names.len(), "grants were lost: {grants:#?}");
    assert_eq!(denied.len(), names.len(), "denies were lost: {denied:?}");

    let native = loaded(root.path(), GOOD);
    let native = &native;
    for _ in 0..20 {
        one.grant(native, Scope::Once, project).await.unwrap();
        let allowed = std::thread::scope(|s| {
            let calls: Vec<_> = [&one, &two, &one, &two]
                .into_iter()
                .map(|store| s.spawn(move || on_thread(store.authorize(native, project))))
                .collect();
            calls
                .into_iter()
                .map(|c| c.join().unwrap())
                .filter(|r| r.is_ok())
                .count()
        });
        assert_eq!(
            allowed, 1,
            "one once grant ran {allowed} calls across two stores"
        );
    }
}

/// A process that holds the grants' lock (stopped mid-change, say) makes a change fail
/// after a bounded wait, naming the lock, instead of hanging every other process.
#[tokio::test]
async fn a_held_grants_lock_fails_a_change_in_bounded_time() {
    use std::os::fd::AsFd;
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let native = loaded(root.path(), GOOD);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data.path().join("trust.lock"))
        .unwrap();
    rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive).unwrap();
    let started = std::time::Instant::now();
    let e = TrustStore::open(data.path())
        .grant(&native, Scope::Project, root.path())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    assert!(e.message.contains("trust.lock"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    drop(lock);
    TrustStore::open(data.path())
        .grant(&native, Scope::Project, root.path())
        .await
        .unwrap();
}

/// A server authorizes many calls at once: one `once` grant still runs one of them, and
/// the grants file stays whole.
#[tokio::test]
async fn a_once_grant_is_used_up_by_one_of_many_calls_at_once() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = root.path();
    let native = loaded(root.path(), GOOD);
    let trust = TrustStore::open(data.path());
    for _ in 0..20 {
        trust.grant(&native, Scope::Once, project).await.unwrap();
        let allowed = std::thread::scope(|s| {
            let calls: Vec<_> = (0..8)
                .map(|_| s.spawn(|| on_thread(trust.authorize(&native, project))))
                .collect();
            calls
                .into_iter()
                .map(|c| c.join().unwrap())
                .filter(|r| match r {
                    Ok(scope) => *scope == Scope::Once,
                    Err(e) => {
                        assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}");
                        false
                    }
                })
                .count()
        });
        assert_eq!(allowed, 1, "one once grant ran {allowed} calls");
    }
}

#[test]
fn a_missing_name_says_what_did_not_load_under_it() {
    let root = tempfile::tempdir().unwrap();
    capability(root.path(), "word-count", GOOD, Some("count.py"));
    capability(root.path(), "broken", "name: broken\n", None);
    let registry = CapabilityRegistry::load(&[root.path().to_path_buf()]);
    let missing = registry.missing("broken");
    assert!(
        missing.starts_with("no capability \"broken\" (it did not load: "),
        "{missing}"
    );
    assert!(missing.ends_with("; have: word-count"), "{missing}");
    assert_eq!(
        registry.missing("nope"),
        "no capability \"nope\"; have: word-count"
    );
}

/// Grants kept in a records database, as servers sharing it (`serve --db`) and
/// `skillbox cap --db` keep them: what one node grants, denies or revokes, the other
/// decides by, the ceiling holds as in a file, and one `once` grant runs one call of
/// many at once across both nodes.
async fn grants_in_a_database_hold_for_every_node(
    one: skillbox_store::RecordsDb,
    two: skillbox_store::RecordsDb,
) {
    use skillbox_capability::Standing;
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = root.path();
    let native = loaded(root.path(), GOOD);
    let host = loaded(
        root.path(),
        &GOOD
            .replace("environment: native", "environment: host")
            .replace("name: word-count", "name: on-host"),
    );
    let node = |records: &skillbox_store::RecordsDb| {
        TrustStore::in_records(
            data.path(),
            skillbox_store::GrantRecords::open(records).unwrap(),
        )
    };
    let (a, b) = (node(&one), node(&two));
    let e = b.authorize(&native, project).await.unwrap_err();
    assert!(e.message.contains("is not granted"), "{e}");
    a.grant(&native, Scope::Project, project).await.unwrap();
    assert_eq!(b.authorize(&native, project).await.unwrap(), Scope::Project);
    assert_eq!(
        b.standing(&native, project).await.unwrap(),
        Standing::Granted(Scope::Project)
    );
    // Granted again: one grant, not two.
    b.grant(&native, Scope::Project, project).await.unwrap();
    assert_eq!(a.list(project).await.unwrap().0.len(), 1);
    // Another project: nothing there; and nothing of it reached the data dir.
    let elsewhere = tempfile::tempdir().unwrap();
    assert!(a.authorize(&native, elsewhere.path()).await.is_err());
    assert!(!data.path().join("trust.json").exists());
    // A deny on one node wins on the other, and lifting it there restores the grant.
    b.deny("word-count", project).await.unwrap();
    let e = a.authorize(&native, project).await.unwrap_err();
    assert!(e.message.contains("denied"), "{e}");
    assert_eq!(
        a.standing(&native, project).await.unwrap(),
        Standing::Denied
    );
    a.allow("word-count", project).await.unwrap();
    assert!(b.authorize(&native, project).await.is_ok());
    // A host capability: never above a session, database or not.
    let e = a.grant(&host, Scope::Project, project).await.unwrap_err();
    assert!(e.message.contains("session at most"), "{e}");
    // One once grant, eight calls at once on two nodes: one runs.
    for _ in 0..10 {
        a.grant(&host, Scope::Once, project).await.unwrap();
        let calls = (0..8).map(|i| {
            let store = if i % 2 == 0 { &a } else { &b };
            store.authorize(&host, project)
        });
        let results = futures_util::future::join_all(calls).await;
        let ran = results
            .iter()
            .filter(|r| match r {
                Ok(scope) => *scope == Scope::Once,
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}");
                    false
                }
            })
            .count();
        assert_eq!(ran, 1, "one once grant ran {ran} calls: {results:?}");
    }
    // A session grant stays with its node.
    a.grant(&host, Scope::Session, project).await.unwrap();
    assert_eq!(a.authorize(&host, project).await.unwrap(), Scope::Session);
    assert!(b.authorize(&host, project).await.is_err());
    // Revoked on one node: refused on both.
    assert_eq!(b.revoke("word-count", project).await.unwrap(), 1);
    assert!(a.authorize(&native, project).await.is_err());
    assert!(b.authorize(&native, project).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_in_postgres_hold_for_every_node() {
    let test = "grants_in_postgres_hold_for_every_node";
    let Some(server) = skillbox_env::testkit::postgres::PostgresServer::start(test) else {
        return;
    };
    let connect = || async {
        skillbox_store::RecordsDb::postgres(&server.url())
            .await
            .expect("connect")
    };
    grants_in_a_database_hold_for_every_node(connect().await, connect().await).await;
}

#[tokio::test]
async fn grants_in_sqlite_hold_for_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    grants_in_a_database_hold_for_every_node(
        skillbox_store::RecordsDb::sqlite(dir.path()),
        skillbox_store::RecordsDb::sqlite(dir.path()),
    )
    .await;
}
