//! `GET /v1/capabilities` and `POST /v1/capabilities/{name}/run` over real HTTP: the
//! examples listed with their grants and a broken manifest named, a run refused until
//! `skillbox cap`'s trust store grants it and then run in the native sandbox, a `once`
//! grant used up, stdin, a host capability never run, a docker one with no daemon
//! `unavailable`, and bad names and bodies.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use skillbox_capability::{CapabilityRegistry, Scope, Standing, TrustStore};
use skillbox_run::{Runner, RunnerConfig};
use skillbox_server::{ApiKeys, CapabilityConfig, ServerConfig};
use skillbox_store::ArtifactStore;
use tokio_util::sync::CancellationToken;

use super::{Server, is_error};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/capabilities")
        .canonicalize()
        .unwrap()
}

/// A server of `roots`, with a data dir (its trust file) and a project of its own.
struct Served {
    server: Server,
    roots: Vec<PathBuf>,
    data: tempfile::TempDir,
    project: PathBuf,
    _project: tempfile::TempDir,
}

async fn serve(roots: Vec<PathBuf>, keys: Option<Arc<ApiKeys>>) -> Served {
    let data = tempfile::tempdir().unwrap();
    let project_dir = tempfile::tempdir().unwrap();
    let project = project_dir.path().canonicalize().unwrap();
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    // Python capabilities only: no Node runtime to install.
    let runner = Runner::new(RunnerConfig::new(data.path()), store);
    let config = ServerConfig {
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        keys,
        capabilities: CapabilityConfig {
            roots: roots.clone(),
            project: project.clone(),
        },
        ..ServerConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(skillbox_server::serve_on(
        listener,
        config,
        Arc::new(runner),
        shutdown.clone(),
    ));
    Served {
        server: Server {
            base,
            http: reqwest::Client::new(),
            shutdown,
            _objects: objects,
        },
        roots,
        data,
        project,
        _project: project_dir,
    }
}

impl Served {
    /// Grants `name` as `skillbox cap grant` does: through the trust store of the data dir.
    async fn grant(&self, name: &str, scope: Scope) {
        let registry = CapabilityRegistry::load(&self.roots);
        TrustStore::open(self.data.path())
            .grant(registry.get(name).unwrap(), scope, &self.project)
            .await
            .unwrap();
    }

    async fn standing(&self, name: &str) -> Standing {
        let registry = CapabilityRegistry::load(&self.roots);
        TrustStore::open(self.data.path())
            .standing(registry.get(name).unwrap(), &self.project)
            .await
            .unwrap()
    }

    async fn list(&self) -> Value {
        let response = self
            .server
            .http
            .get(format!("{}/v1/capabilities", self.server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    async fn call(&self, name: &str, body: &Value) -> (u16, Value) {
        self.server
            .post(&format!("/v1/capabilities/{name}/run"), body)
            .await
    }
}

fn native_or_skip(test: &str) -> bool {
    let native = skillbox_native::probe();
    if !native.available {
        skillbox_env::testkit::skip(test, &native.reason.unwrap_or_default());
    }
    native.available
}

fn listed<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_listed_with_their_grants_and_what_did_not_load() {
    let broken = tempfile::tempdir().unwrap();
    let dir = broken.path().join("broken");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.yaml"),
        "name: broken\ndescription: x\nversion: 0.1.0\nenvironment: native\nlifecycle: sometimes\nentry: x.py\n",
    )
    .unwrap();
    let served = serve(vec![examples(), broken.path().to_path_buf()], None).await;
    let list = served.list().await;
    for (name, environment) in [
        ("word-count", "native"),
        ("git-report", "host"),
        ("csv-summary", "docker"),
    ] {
        let c = listed(&list, name);
        assert_eq!(c["environment"], environment, "{c}");
        assert_eq!(c["lifecycle"], "oneshot", "{c}");
        assert_eq!(c["version"], "0.1.0", "{c}");
        assert_eq!(c["grant"], "not granted", "{c}");
        assert!(c["description"].as_str().is_some_and(|d| !d.is_empty()));
    }
    let names: Vec<&str> = list["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(names.is_sorted(), "{names:?}");
    assert!(!names.contains(&"broken"), "{list}");
    // The broken one alone, by file, line and field.
    let errors = list["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{list}");
    let error = errors[0].as_str().unwrap();
    assert!(
        error.contains("broken/manifest.yaml:5") && error.contains("lifecycle"),
        "{error}"
    );

    // A grant shows; a host one at its ceiling as given.
    served.grant("word-count", Scope::Project).await;
    served.grant("git-report", Scope::Once).await;
    let list = served.list().await;
    assert_eq!(listed(&list, "word-count")["grant"], "project");
    assert_eq!(listed(&list, "git-report")["grant"], "once");

    // No roots: nothing. And the routes are in the OpenAPI document.
    let empty = serve(Vec::new(), None).await;
    assert_eq!(
        empty.list().await,
        json!({"capabilities": [], "errors": []})
    );
    let openapi: Value = empty
        .server
        .http
        .get(format!("{}/openapi.json", empty.server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(openapi["paths"]["/v1/capabilities"]["get"].is_object());
    assert!(openapi["paths"]["/v1/capabilities/{name}/run"]["post"].is_object());
    for schema in ["CapabilityList", "CapabilityRunRequest", "CapabilityRun"] {
        assert!(
            openapi["components"]["schemas"][schema].is_object(),
            "{schema}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_need_the_api_key_like_every_v1_route() {
    const KEY: &str = "capability-tenant-0123456789";
    let keys = Arc::new(ApiKeys::from_pairs(&format!("a={KEY}")).unwrap());
    let served = serve(vec![examples()], Some(keys)).await;
    let url = |path: &str| format!("{}{path}", served.server.base);
    let http = &served.server.http;
    let anonymous = http.get(url("/v1/capabilities")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let run = http
        .post(url("/v1/capabilities/word-count/run"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), 401);
    let keyed = http
        .get(url("/v1/capabilities"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_runs_over_http_only_once_granted() {
    if !native_or_skip("a_capability_runs_over_http_only_once_granted") {
        return;
    }
    let served = serve(vec![examples()], None).await;
    let body = json!({
        "files": [{"path": "notes.txt", "content": "the cat and the dog and the cat\n"}],
    });
    let (status, refused) = served.call("word-count", &body).await;
    assert_eq!(status, 403, "{refused}");
    assert!(is_error(&refused, "permission_denied"), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("run_capability:native")
            && message.contains("skillbox cap grant word-count --scope project")
            && message.contains(&format!("--project {}", served.project.display())),
        "{message}"
    );

    served.grant("word-count", Scope::Project).await;
    let (status, ran) = served.call("word-count", &body).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["capability"], "word-count");
    assert_eq!(ran["grant"], "project");
    assert_eq!(ran["output"]["exitCode"], 0, "{ran}");
    let counted: Value = serde_json::from_str(ran["output"]["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(counted[0], json!({"word": "the", "count": 3}), "{ran}");
    assert!(
        counted
            .as_array()
            .unwrap()
            .contains(&json!({"word": "dog", "count": 1})),
        "{ran}"
    );
    // Only what its write_file permission names comes back (not the input), stored and
    // downloadable by this tenant.
    let files = ran["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{ran}");
    assert_eq!(files[0]["path"], "word-count.json");
    let written: Value = serde_json::from_slice(
        &served
            .server
            .download(files[0]["url"].as_str().unwrap())
            .await,
    )
    .unwrap();
    assert_eq!(written, counted);
    // A project grant holds for the next call too.
    let (status, again) = served.call("word-count", &body).await;
    assert_eq!(status, 200, "{again}");
}

/// A server's `--capabilities` need not name the project's own `capabilities/`, which
/// `skillbox cap` loads for that project (a `host` capability there runs unsandboxed):
/// a read-write volume over it (written relative, as a capability in a root every
/// project uses would) is refused before anything runs, and a plain one of the
/// project's is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_volume_over_the_project_s_capabilities_is_refused_over_http() {
    use std::os::unix::fs::MetadataExt;
    if !native_or_skip("a_read_write_volume_over_the_project_s_capabilities") {
        return;
    }
    let shared = tempfile::tempdir().unwrap();
    for (name, volume) in [("planter", "capabilities"), ("scribe", "notes")] {
        let dir = shared.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("manifest.yaml"),
            format!(
                "name: {name}\ndescription: writes a project dir\nversion: 0.1.0\nenvironment: native\nlifecycle: oneshot\nentry: t.sh\nvolumes:\n  - host: {volume}\n    sandbox: /data\n    rw: true\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.join("t.sh"), "echo planted > /data/planted.sh\n").unwrap();
    }
    let served = serve(vec![shared.path().canonicalize().unwrap()], None).await;
    // The project's own capabilities, and a directory of its own, the user's (not root's).
    let root = rustix::process::geteuid().is_root();
    let owned = |dir: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        if root {
            std::os::unix::fs::chown(dir, Some(4242), Some(4242)).unwrap();
        }
    };
    let capabilities = served.project.join("capabilities");
    owned(&capabilities.join("deploy"));
    owned(&capabilities);
    owned(&served.project.join("notes"));
    for name in ["planter", "scribe"] {
        served.grant(name, Scope::Project).await;
    }
    let (status, refused) = served.call("planter", &json!({})).await;
    assert_eq!(status, 403, "{refused}");
    assert!(is_error(&refused, "permission_denied"), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("the project's capabilities"), "{message}");
    assert!(!capabilities.join("planted.sh").exists());
    assert_eq!(std::fs::read_dir(&capabilities).unwrap().count(), 1);

    let (status, ran) = served.call("scribe", &json!({})).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["output"]["exitCode"], 0, "{ran}");
    let planted = served.project.join("notes/planted.sh");
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "planted\n");
    if root {
        assert_eq!(std::fs::metadata(&planted).unwrap().uid(), 4242);
    }

    // The project swapped for a link to another directory since the server resolved it:
    // the grant is the project's, and the volume is not followed elsewhere under it.
    let elsewhere = tempfile::tempdir().unwrap();
    owned(&elsewhere.path().join("notes"));
    let moved = served.project.with_extension("moved");
    std::fs::rename(&served.project, &moved).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), &served.project).unwrap();
    let (status, refused) = served.call("scribe", &json!({})).await;
    std::fs::remove_file(&served.project).unwrap();
    std::fs::rename(&moved, &served.project).unwrap();
    assert_eq!(status, 400, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("goes through a symlink"), "{message}");
    assert_eq!(
        std::fs::read_dir(elsewhere.path().join("notes"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_once_grant_runs_one_capability_call_with_its_stdin() {
    if !native_or_skip("a_once_grant_runs_one_capability_call") {
        return;
    }
    let served = serve(vec![examples()], None).await;
    served.grant("fmt-json", Scope::Once).await;
    let body = json!({"stdin": "{\"b\": [1, 2], \"a\": true}"});
    let (status, ran) = served.call("fmt-json", &body).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["grant"], "once");
    assert_eq!(
        ran["output"]["stdout"], "{\n  \"a\": true,\n  \"b\": [\n    1,\n    2\n  ]\n}\n",
        "{ran}"
    );
    assert_eq!(ran["files"], json!([]), "no write_file, no file");
    // The same bytes as base64.
    served.grant("fmt-json", Scope::Once).await;
    let (status, ran) = served
        .call(
            "fmt-json",
            &json!({"stdin": "eyJ4IjogMX0=", "stdinEncoding": "base64"}),
        )
        .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["output"]["stdout"], "{\n  \"x\": 1\n}\n", "{ran}");
    // Used up.
    let (status, refused) = served.call("fmt-json", &body).await;
    assert_eq!(status, 403, "a once grant ran twice: {refused}");
    assert_eq!(served.standing("fmt-json").await, Standing::NotGranted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_capability_is_never_run_over_http() {
    let served = serve(vec![examples()], None).await;
    for granted in [false, true] {
        if granted {
            served.grant("git-report", Scope::Once).await;
        }
        let (status, refused) = served.call("git-report", &json!({})).await;
        assert_eq!(status, 403, "{refused}");
        assert!(is_error(&refused, "permission_denied"), "{refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("never runs a host capability over HTTP")
                && message.contains("grant git-report --scope once"),
            "{message}"
        );
    }
    // The CLI's once grant is still there for the CLI.
    assert_eq!(
        served.standing("git-report").await,
        Standing::Granted(Scope::Once)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capability_names_and_bodies_are_checked() {
    let broken = tempfile::tempdir().unwrap();
    std::fs::create_dir(broken.path().join("half")).unwrap();
    std::fs::write(broken.path().join("half/manifest.yaml"), "name: half\n").unwrap();
    let served = serve(vec![examples(), broken.path().to_path_buf()], None).await;
    let (status, missing) = served.call("no-such", &json!({})).await;
    assert_eq!(status, 404, "{missing}");
    assert!(is_error(&missing, "not_found"), "{missing}");
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("have: csv-summary, "),
        "{missing}"
    );
    let (status, half) = served.call("half", &json!({})).await;
    assert_eq!(status, 404, "{half}");
    assert!(
        half["error"]["message"]
            .as_str()
            .unwrap()
            .contains("it did not load: "),
        "{half}"
    );
    // Bad bodies, before any trust check or sandbox: 400 naming the field.
    for (body, field) in [
        (json!({"argz": []}), "argz"),
        (json!({"args": "--top"}), "args"),
        (json!({"args": ["a\u{0}b"]}), "args[0]"),
        (
            json!({"files": [{"path": "../up.txt", "content": ""}]}),
            "files[0].path",
        ),
        (
            json!({"files": [{"path": "a.txt", "content": "!", "encoding": "base64"}]}),
            "files[0].content",
        ),
        (
            json!({"stdin": "not base64!", "stdinEncoding": "base64"}),
            "stdin",
        ),
        (json!({"stdinEncoding": "rot13"}), "stdinEncoding"),
    ] {
        let (status, refused) = served.call("word-count", &body).await;
        assert_eq!(status, 400, "{body}: {refused}");
        assert!(is_error(&refused, "invalid"), "{refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains(field),
            "{body}: {refused}"
        );
    }
    let http = &served.server.http;
    let url = format!("{}/v1/capabilities/word-count/run", served.server.base);
    let untyped = http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(untyped.status(), 415);
    let got = http.get(&url).send().await.unwrap();
    assert_eq!(got.status(), 405);
}

/// A docker capability with no daemon is `unavailable`, never run somewhere else. The
/// daemon is named by DOCKER_HOST, process wide: the case runs in a child process.
#[test]
fn a_docker_capability_without_a_daemon_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-docker.sock");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "capabilities::docker_capability_child",
            "--ignored",
            "--nocapture",
        ])
        .env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .env("SKILLBOX_CAPABILITY_CHILD", "1")
        .output()
        .unwrap();
    let output =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let result = output
        .lines()
        .find_map(|l| l.strip_prefix("CASE_RESULT "))
        .unwrap_or_else(|| panic!("the child said nothing: {output}"));
    let (status, body) = result.split_once(' ').unwrap();
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(status, "503", "{body}");
    assert!(is_error(&body, "unavailable"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-docker.sock"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child half of a_docker_capability_without_a_daemon_is_unavailable"]
async fn docker_capability_child() {
    assert!(
        std::env::var_os("SKILLBOX_CAPABILITY_CHILD").is_some(),
        "run through a_docker_capability_without_a_daemon_is_unavailable"
    );
    let served = serve(vec![examples()], None).await;
    served.grant("csv-summary", Scope::Project).await;
    let (status, body) = served
        .call(
            "csv-summary",
            &json!({"files": [{"path": "sales.csv", "content": "region,amount\nnorth,10\n"}]}),
        )
        .await;
    println!("CASE_RESULT {status} {body}");
}

/// One HTTP/1.0 exchange with a service through its forwarded unix socket.
async fn through(socket: &Path, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// The persistent example over HTTP: refused ungranted, started and listed, reached
/// through its socket, refused a second start, stopped with nothing left; and a service
/// still running when the server shuts down ends with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_capability_is_started_listed_and_stopped_and_ends_with_the_server() {
    if !native_or_skip("a_persistent_capability_over_http") {
        return;
    }
    let served = serve(vec![examples()], None).await;
    let start = |name: &'static str| {
        let server = &served.server;
        async move {
            server
                .post(&format!("/v1/capabilities/{name}/start"), &json!({}))
                .await
        }
    };
    let (status, refused) = start("http-notes").await;
    assert_eq!(status, 403, "{refused}");
    assert!(is_error(&refused, "permission_denied"));
    let (status, refused) = start("word-count").await;
    assert_eq!(
        status, 400,
        "a oneshot capability is run, not started: {refused}"
    );
    let (status, refused) = start("git-report").await;
    assert_eq!(status, 403, "a host capability never over HTTP: {refused}");

    served.grant("http-notes", Scope::Project).await;
    let (status, info) = start("http-notes").await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["state"], "ready");
    assert!(
        info["owner"]
            .as_str()
            .unwrap()
            .starts_with("skillbox serve (pid")
    );
    let socket = PathBuf::from(
        info["endpoint"]
            .as_str()
            .unwrap()
            .strip_prefix("unix:")
            .unwrap(),
    );
    let added = through(
        &socket,
        "POST /notes HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    assert!(added.starts_with("HTTP/1.0 201"), "{added}");
    let (status, again) = start("http-notes").await;
    assert_eq!(status, 409, "{again}");

    let listed: Value = served
        .server
        .http
        .get(format!("{}/v1/services", served.server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["services"][0]["name"], "http-notes", "{listed}");
    assert_eq!(listed["services"][0]["state"], "ready", "{listed}");
    let one = served
        .server
        .http
        .get(format!("{}/v1/services/http-notes", served.server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    let missing = served
        .server
        .http
        .get(format!("{}/v1/services/nope", served.server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let init: i32 = info["process"]
        .as_str()
        .unwrap()
        .strip_prefix("pid ")
        .unwrap()
        .parse()
        .unwrap();
    let (status, stopped) = served
        .server
        .post("/v1/services/http-notes/stop", &json!({}))
        .await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["state"], "stopped");
    assert!(
        !Path::new(&format!("/proc/{init}")).exists(),
        "the sandbox still runs"
    );
    assert!(!socket.exists());
    let (status, _) = served
        .server
        .post("/v1/services/http-notes/stop", &json!({}))
        .await;
    assert_eq!(status, 404);

    // Running when the server shuts down: it ends with it.
    let (status, info) = start("http-notes").await;
    assert_eq!(status, 200, "{info}");
    let init: i32 = info["process"]
        .as_str()
        .unwrap()
        .strip_prefix("pid ")
        .unwrap()
        .parse()
        .unwrap();
    served.server.shutdown.cancel();
    let started = std::time::Instant::now();
    while Path::new(&format!("/proc/{init}")).exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the service outlived the server"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!socket.exists());
}

/// Tenants see and stop only the services they started; a name that is a path is never
/// followed (a record planted outside the table is neither read nor deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_belong_to_their_tenant_and_names_are_never_paths() {
    if !native_or_skip("services_belong_to_their_tenant") {
        return;
    }
    let tokens = ["ana-token-0123456789abcdef", "bob-token-0123456789abcdef"];
    let keys =
        Arc::new(ApiKeys::from_pairs(&format!("ana={},bob={}", tokens[0], tokens[1])).unwrap());
    let served = serve(vec![examples()], Some(keys)).await;
    served.grant("http-notes", Scope::Project).await;
    let as_tenant = |token: &str, method: reqwest::Method, path: &str| {
        served
            .server
            .http
            .request(method, format!("{}{path}", served.server.base))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
    };
    let started = as_tenant(
        tokens[0],
        reqwest::Method::POST,
        "/v1/capabilities/http-notes/start",
    )
    .await
    .unwrap();
    assert_eq!(started.status(), 200);
    let info: Value = started.json().await.unwrap();
    assert_eq!(info["tenant"], "ana");
    let bobs: Value = as_tenant(tokens[1], reqwest::Method::GET, "/v1/services")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(bobs["services"], json!([]), "bob sees ana's service");
    for (method, path) in [
        (reqwest::Method::GET, "/v1/services/http-notes"),
        (reqwest::Method::POST, "/v1/services/http-notes/stop"),
    ] {
        let answer = as_tenant(tokens[1], method, path).await.unwrap();
        assert_eq!(answer.status(), 404, "{path}");
    }
    let anas: Value = as_tenant(tokens[0], reqwest::Method::GET, "/v1/services")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(anas["services"][0]["name"], "http-notes", "{anas}");

    // A record planted outside the table, named through an encoded path.
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    std::fs::write(outside.path().join("rec.json"), "{}").unwrap();
    let traversal = format!(
        "/v1/services/..%2F..%2F..%2F..%2F..%2F..%2F..%2F..{}%2Frec",
        outside.path().display().to_string().replace('/', "%2F")
    );
    for (method, path) in [
        (reqwest::Method::GET, traversal.clone()),
        (reqwest::Method::POST, format!("{traversal}/stop")),
    ] {
        let answer = as_tenant(tokens[0], method, &path).await.unwrap();
        assert_eq!(answer.status(), 404, "{path}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(outside.path().join("rec.json").exists());
    assert!(
        !outside.path().join("rec.lock").exists(),
        "a lock was made outside the table"
    );

    let stopped = as_tenant(
        tokens[0],
        reqwest::Method::POST,
        "/v1/services/http-notes/stop",
    )
    .await
    .unwrap();
    assert_eq!(stopped.status(), 200);
}
