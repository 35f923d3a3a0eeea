//! Egress through `skillbox run --allow-net` (DESIGN.md §8), end to end through the
//! binary, in network namespaces this test makes (never any outside address): skillbox
//! runs in one (the host's, here: 203.0.113.1 on a veth), and behind that veth, in
//! another, tests/egress/registry.py serves a PyPI simple index and an npm registry on
//! 203.0.113.7; so the proxy reaches the registry and nothing else. The secret tests
//! add an HTTPS server there (`skillbox_egress::testkit`), as `api.test` and
//! `other.test`, names the namespace's own `/etc/hosts` gives. Needs root and `ip`
//! (skipped otherwise; a failure under SKILLBOX_REQUIRE_ALL=1).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::{BIN, backend_or_skip, native_or_skip, text};
use serde_json::Value;
use skillbox_egress::testkit;

const PUBLIC: &str = "203.0.113.7";
/// The host's own address: skillbox's namespace's end of the veth to the registry's.
const HOST: &str = "203.0.113.1";

/// A named network namespace for skillbox with `lo` up and [`HOST`] on a veth to a
/// second one, where the registry serves on [`PUBLIC`]; both removed (the registry
/// killed) when dropped.
struct Namespace {
    name: String,
    registry: Child,
    port: u16,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Namespace {
    fn new(test: &str) -> Option<Namespace> {
        if !native_or_skip(test) {
            return None;
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skillbox_env::testkit::skip(test, "a named network namespace needs root");
            return None;
        }
        // Tests of one process (cargo test's threads) each get their own.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("sbx-egress-{}-{n}", std::process::id());
        let ip = |args: &[&str]| {
            let status = Command::new("ip").args(args).status().expect("ip");
            assert!(status.success(), "ip {args:?}");
        };
        // skillbox's namespace (the host's, here) and the registry's, a veth between:
        // the host's own address is one the proxy refuses, as any of its interfaces'.
        let far = format!("{name}-far");
        ip(&["netns", "add", &name]);
        ip(&["netns", "add", &far]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        ip(&["-n", &far, "link", "set", "lo", "up"]);
        ip(&[
            "-n", &name, "link", "add", "sbx-host", "type", "veth", "peer", "name", "sbx-far",
            "netns", &far,
        ]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{HOST}/24"),
            "dev",
            "sbx-host",
        ]);
        ip(&["-n", &name, "link", "set", "sbx-host", "up"]);
        ip(&[
            "-n",
            &far,
            "addr",
            "add",
            &format!("{PUBLIC}/24"),
            "dev",
            "sbx-far",
        ]);
        ip(&["-n", &far, "link", "set", "sbx-far", "up"]);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/egress/registry.py");
        let mut registry = Command::new("ip")
            .args(["netns", "exec", &far, "/usr/bin/python3"])
            .arg(script)
            .arg(PUBLIC)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(registry.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let port: u16 = first.trim().parse().expect("the registry's port");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines = log.clone();
        let stderr = registry.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Some(Namespace {
            name,
            registry,
            port,
            log,
        })
    }

    /// `skillbox --data-dir DATA ARGS` run inside the namespace.
    fn skillbox(&self, data: &Path, args: &[&str]) -> Output {
        self.command(data, args).output().unwrap()
    }

    /// The command of [`Namespace::skillbox`], to add to.
    fn command(&self, data: &Path, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.name, BIN, "--data-dir"])
            .arg(data)
            .args(args)
            .env_remove("NODE_EXTRA_CA_CERTS");
        command
    }

    /// The namespace behind the veth, where [`PUBLIC`] is.
    fn far(&self) -> String {
        format!("{}-far", self.name)
    }

    /// `names` resolve to [`PUBLIC`] for what runs in the namespace: `ip netns exec`
    /// shows `/etc/netns/NAME/hosts` as its `/etc/hosts` (removed with the namespace).
    fn resolve(&self, names: &[&str]) {
        let dir = Path::new("/etc/netns").join(&self.name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("hosts"),
            format!(
                "127.0.0.1 localhost\n::1 localhost\n{PUBLIC} {}\n",
                names.join(" ")
            ),
        )
        .unwrap();
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.registry.kill();
        let _ = self.registry.wait();
        for name in [self.name.clone(), self.far()] {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
        let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&self.name));
    }
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {:?}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

/// `pip install` and `npm install` from the registry, through the proxy, with only the
/// registry allowed, on native, docker and gvisor; the run's egress record lists what
/// went through.
#[test]
fn pip_and_npm_install_through_the_proxy() {
    let Some(ns) = Namespace::new("pip_and_npm_install_through_the_proxy") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let allow = format!("{PUBLIC}:{}", ns.port);
    let registry = format!("http://{PUBLIC}:{}", ns.port);

    for backend in ["native", "docker", "gvisor"] {
        let before = ns.requests().len();
        let pip = write(
            scripts.path(),
            "pip.sh",
            &format!(
                "set -e\n/usr/bin/python3 -m pip install -q --disable-pip-version-check --no-cache-dir \
                 --index-url {registry}/simple/ --trusted-host {PUBLIC} --target /workspace/lib skillbox-egress-probe\n\
                 PYTHONPATH=/workspace/lib /usr/bin/python3 -c 'import skillbox_egress_probe as p; print(p.VALUE)'\n"
            ),
        );
        let out = ns.skillbox(
            data.path(),
            &[
                "run",
                &pip,
                "--backend",
                backend,
                "--allow-net",
                &allow,
                "--timeout",
                "120s",
                "--json",
            ],
        );
        let result = json(&out);
        assert_eq!(result["exitCode"], 0, "{backend}: {result:#}");
        assert_eq!(
            result["stdout"].as_str().unwrap().trim(),
            "pip-probe-ok",
            "{backend}: {result:#}"
        );
        let egress = result["egress"].as_array().unwrap();
        assert!(
            !egress.is_empty()
                && egress
                    .iter()
                    .all(|c| c["verdict"] == "allowed" && c["host"] == PUBLIC),
            "{backend}: {result:#}"
        );
        assert!(
            ns.requests()[before..].iter().any(|p| p.ends_with(".whl")),
            "{backend}: {:?}",
            ns.requests()
        );

        let before = ns.requests().len();
        let npm = write(
            scripts.path(),
            "npm.sh",
            &format!(
                "set -e\ncd /workspace\n\
                 # a package of its own: else npm takes / (the image's /node_modules) for the project\n\
                 echo '{{}}' > package.json\nnpm install --no-audit --no-fund --no-update-notifier --loglevel=error \
                 --registry {registry}/ skillbox-egress-probe >/dev/null\n\
                 node -e 'console.log(require(\"skillbox-egress-probe\"))'\n"
            ),
        );
        let out = ns.skillbox(
            data.path(),
            &[
                "run",
                &npm,
                "--backend",
                backend,
                "--allow-net",
                &allow,
                "--timeout",
                "120s",
                "--json",
                "--outputs",
                "none",
            ],
        );
        let result = json(&out);
        assert_eq!(result["exitCode"], 0, "{backend}: {result:#}");
        assert_eq!(
            result["stdout"].as_str().unwrap().trim(),
            "npm-probe-ok",
            "{backend}: {result:#}"
        );
        assert!(
            ns.requests()[before..].iter().any(|p| p.ends_with(".tgz")),
            "{backend}: {:?}",
            ns.requests()
        );
    }
}

/// Without --allow-net the registry is not reached at all; with another host allowed,
/// the proxy refuses it and says why; the plain output names the refusal; and a
/// backend with no proxy refuses the policy instead of running with less or more.
#[test]
fn what_is_not_allowed_is_not_reached() {
    let Some(ns) = Namespace::new("what_is_not_allowed_is_not_reached") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let url = format!("http://{PUBLIC}:{}/simple/skillbox-egress-probe/", ns.port);
    let fetch = write(
        scripts.path(),
        "fetch.py",
        &format!(
            "import urllib.request, urllib.error\ntry:\n    urllib.request.urlopen({url:?}, timeout=10)\n    print('REACHED')\n\
             except urllib.error.HTTPError as e:\n    print('HTTP', e.code, e.read().decode().strip())\n\
             except Exception as e:\n    print('ERROR', type(e).__name__)\n"
        ),
    );
    let out = ns.skillbox(data.path(), &["run", &fetch]);
    assert!(
        text(&out.stdout).starts_with("ERROR"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    let out = ns.skillbox(
        data.path(),
        &["run", &fetch, "--allow-net", "files.example.org"],
    );
    let said = text(&out.stdout);
    assert!(
        said.starts_with("HTTP 403") && said.contains("is not on the run's network.allow"),
        "{said}{}",
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "skillbox run: egress refused {PUBLIC}:{}",
            ns.port
        )),
        "{stderr}"
    );
    assert!(ns.requests().is_empty(), "{:?}", ns.requests());

    // A bad entry is bad usage of the request, named.
    let out = ns.skillbox(
        data.path(),
        &["run", &fetch, "--allow-net", "https://x.example/"],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("network.allow[0]"),
        "{}",
        text(&out.stderr)
    );

    // Wasm has no proxy: refused, naming egress, rather than run without it.
    let out = ns.skillbox(
        data.path(),
        &[
            "run",
            &fetch,
            "--backend",
            "wasm",
            "--allow-net",
            "files.example.org",
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("egress"),
        "{}",
        text(&out.stderr)
    );
    assert!(ns.requests().is_empty(), "{:?}", ns.requests());
}

/// A capability's manifest declares its `network`, and its sandbox gets exactly that:
/// one that allows the registry reaches it through the proxy (and `cap run --json`
/// shows the connection); one that allows another host is refused by the proxy, naming
/// why; one with no `network` has no route at all; and one whose environment has no
/// egress proxy (wasm) is refused `unavailable`, naming egress, rather than run without.
#[test]
fn a_capability_reaches_only_what_its_manifest_allows() {
    let Some(ns) = Namespace::new("a_capability_reaches_only_what_its_manifest_allows") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let url = format!("http://{PUBLIC}:{}/simple/skillbox-egress-probe/", ns.port);
    let fetch = format!(
        "import urllib.request, urllib.error\ntry:\n    body = urllib.request.urlopen({url:?}, timeout=10).read().decode()\n    print('REACHED', 'skillbox_egress_probe' in body)\n\
         except urllib.error.HTTPError as e:\n    print('HTTP', e.code, e.read().decode().strip())\n\
         except Exception as e:\n    print('ERROR', type(e).__name__)\n"
    );
    let capability = |name: &str, environment: &str, network: &str| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("fetch.py"), &fetch).unwrap();
        std::fs::write(
            dir.join("manifest.yaml"),
            format!(
                "name: {name}\ndescription: fetches the registry\nversion: 0.1.0\n\
                 environment: {environment}\nlifecycle: oneshot\nentry: fetch.py\n{network}"
            ),
        )
        .unwrap();
    };
    capability(
        "fetch-allowed",
        "native",
        &format!("network:\n  allow: [\"{PUBLIC}:{}\"]\n", ns.port),
    );
    capability(
        "fetch-other",
        "native",
        "network:\n  allow: [files.example.org]\n",
    );
    capability("fetch-none", "native", "");
    capability(
        "fetch-wasm",
        "wasm",
        &format!("network:\n  allow: [\"{PUBLIC}:{}\"]\n", ns.port),
    );
    let cap = |args: &[&str]| {
        let mut all = vec![
            "cap",
            "--project",
            project.path().to_str().unwrap(),
            "--root",
            root.path().to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        ns.skillbox(data.path(), &all)
    };
    let run = |name: &str| {
        let out = cap(&["grant", name, "--scope", "once"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        cap(&["run", name, "--json"])
    };

    let result = json(&run("fetch-allowed"));
    assert_eq!(result["output"]["stdout"], "REACHED True\n", "{result:#}");
    assert_eq!(result["egress"][0]["verdict"], "allowed", "{result:#}");
    assert_eq!(result["egress"][0]["host"], PUBLIC, "{result:#}");
    assert!(
        ns.requests().iter().any(|p| p.starts_with("/simple/")),
        "{:?}",
        ns.requests()
    );

    let before = ns.requests().len();
    let result = json(&run("fetch-other"));
    let said = result["output"]["stdout"].as_str().unwrap();
    assert!(
        said.starts_with("HTTP 403") && said.contains("is not on the run's network.allow"),
        "{result:#}"
    );
    assert_eq!(result["egress"][0]["verdict"], "refused", "{result:#}");

    let result = json(&run("fetch-none"));
    assert!(
        result["output"]["stdout"]
            .as_str()
            .unwrap()
            .starts_with("ERROR"),
        "{result:#}"
    );
    assert!(result.get("egress").is_none(), "{result:#}");
    assert_eq!(ns.requests().len(), before, "{:?}", ns.requests());

    let out = run("fetch-wasm");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("unavailable") && stderr.contains("egress"),
        "{stderr}"
    );
    assert_eq!(ns.requests().len(), before, "{:?}", ns.requests());
}

/// MCP's `run_script` takes `network` (the requests written by hand over `skillbox mcp`'s
/// stdio, inside the namespace): with the registry allowed it is reached through the
/// proxy and the answer lists the connection; with no `network`, or one with only `deny`
/// entries, there is no network; a bad entry is a tool error naming it; the tool's
/// schema and description say so.
#[test]
fn mcp_run_script_reaches_only_what_its_network_allows() {
    use std::io::Write;

    let Some(ns) = Namespace::new("mcp_run_script_reaches_only_what_its_network_allows") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name, BIN, "--data-dir"])
        .arg(data.path())
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut id = 0;
    let mut call = |method: &str, params: Value| -> Value {
        id += 1;
        let mut line = serde_json::to_vec(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .unwrap();
        line.push(b'\n');
        stdin.write_all(&line).unwrap();
        if method == "initialize" {
            stdin
                .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
                .unwrap();
        }
        // Notifications may come first: the answer is the line with this id.
        loop {
            let answer: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
            if answer["id"] == id {
                return answer;
            }
        }
    };
    call(
        "initialize",
        serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "by-hand", "version": "0"}}),
    );
    let listed = call("tools/list", serde_json::json!({}));
    let tool = &listed["result"]["tools"][0];
    assert_eq!(tool["name"], "run_script", "{listed}");
    assert!(
        tool["inputSchema"]["properties"]["network"].is_object(),
        "{tool}"
    );
    assert!(
        tool["description"]
            .as_str()
            .unwrap()
            .contains("network.allow"),
        "{tool}"
    );

    let url = format!("http://{PUBLIC}:{}/simple/skillbox-egress-probe/", ns.port);
    let fetch = format!(
        "import urllib.request, urllib.error\ntry:\n    body = urllib.request.urlopen({url:?}, timeout=10).read().decode()\n    print('REACHED', 'skillbox_egress_probe' in body)\n\
         except urllib.error.HTTPError as e:\n    print('HTTP', e.code, e.read().decode().strip())\n\
         except Exception as e:\n    print('ERROR', type(e).__name__)\n"
    );
    let mut run = |network: Option<Value>| {
        let mut arguments = serde_json::json!({"language": "python", "script": fetch});
        if let Some(network) = network {
            arguments["network"] = network;
        }
        call(
            "tools/call",
            serde_json::json!({"name": "run_script", "arguments": arguments}),
        )
    };

    let allow = format!("{PUBLIC}:{}", ns.port);
    let answer = run(Some(serde_json::json!({"allow": [allow]})));
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["stdout"], "REACHED True\n", "{answer}");
    assert_eq!(result["egress"][0]["verdict"], "allowed", "{answer}");
    assert_eq!(result["egress"][0]["host"], PUBLIC, "{answer}");
    let reached = ns.requests().len();
    assert!(reached > 0);

    for network in [
        None,
        Some(serde_json::json!({"deny": ["files.example.org"]})),
    ] {
        let answer = run(network.clone());
        let result = &answer["result"]["structuredContent"];
        assert!(
            result["stdout"].as_str().unwrap().starts_with("ERROR"),
            "{network:?}: {answer}"
        );
        assert!(result.get("egress").is_none(), "{answer}");
    }
    assert_eq!(ns.requests().len(), reached, "{:?}", ns.requests());

    let answer = run(Some(serde_json::json!({"allow": ["https://x.example/"]})));
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let message = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        message.contains("network.allow[0]") && message.contains("a host, not a URL"),
        "{message}"
    );
    let answer = run(Some(serde_json::json!({"allow": [allow], "via": "x"})));
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let message = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        message.contains("network") && message.contains("unknown field `via`"),
        "{message}"
    );
    assert_eq!(ns.requests().len(), reached, "{:?}", ns.requests());

    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// On docker and gvisor the container keeps `NetworkMode none`; the proxy listens in
/// its network namespace (docker) or behind a bridge in the sandbox (gvisor): an
/// allowed address is reached through it, another host is refused, and without a
/// policy the container has no route.
#[test]
fn containers_reach_what_they_allow_through_the_proxy() {
    let Some(ns) = Namespace::new("containers_reach_what_they_allow_through_the_proxy") else {
        return;
    };
    for backend in ["docker", "gvisor"] {
        container_reaches_what_it_allows(&ns, backend);
    }
}

fn container_reaches_what_it_allows(ns: &Namespace, backend: &str) {
    let data = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let url = format!("http://{PUBLIC}:{}/simple/skillbox-egress-probe/", ns.port);
    let fetch = write(
        scripts.path(),
        "fetch.py",
        &format!(
            "import urllib.request, urllib.error\ntry:\n    body = urllib.request.urlopen({url:?}, timeout=10).read().decode()\n    print('REACHED', 'skillbox_egress_probe' in body)\n\
             except urllib.error.HTTPError as e:\n    print('HTTP', e.code, e.read().decode().strip())\n\
             except Exception as e:\n    print('ERROR', type(e).__name__)\n"
        ),
    );
    let allow = format!("{PUBLIC}:{}", ns.port);
    let out = ns.skillbox(
        data.path(),
        &[
            "run",
            &fetch,
            "--backend",
            backend,
            "--allow-net",
            &allow,
            "--json",
        ],
    );
    let result = json(&out);
    assert_eq!(result["stdout"], "REACHED True\n", "{result:#}");
    assert_eq!(result["egress"][0]["verdict"], "allowed", "{result:#}");
    assert!(
        ns.requests().iter().any(|p| p.starts_with("/simple/")),
        "{:?}",
        ns.requests()
    );

    let out = ns.skillbox(
        data.path(),
        &[
            "run",
            &fetch,
            "--backend",
            backend,
            "--allow-net",
            "files.example.org",
        ],
    );
    let said = text(&out.stdout);
    assert!(
        said.starts_with("HTTP 403") && said.contains("is not on the run's network.allow"),
        "{said}{}",
        text(&out.stderr)
    );

    let before = ns.requests().len();
    let out = ns.skillbox(data.path(), &["run", &fetch, "--backend", backend]);
    assert!(
        text(&out.stdout).starts_with("ERROR"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(ns.requests().len(), before);
}

/// `--secret NAME=HOST` reads the value from skillbox's own environment (never the
/// command line); a name not set there is bad usage, a bad name or host is named, and a
/// backend that cannot add secrets (wasm: no egress proxy) refuses them.
#[test]
fn secret_flags_are_checked() {
    if !native_or_skip("secret_flags_are_checked") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let script = write(scripts.path(), "x.py", "print('ran')\n");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = Command::new(BIN);
        command
            .arg("--data-dir")
            .arg(data.path())
            .arg("run")
            .arg(&script)
            .args(args);
        for (k, v) in env {
            command.env(k, v);
        }
        command
            .env_remove("SKILLBOX_TEST_UNSET_SECRET")
            .output()
            .unwrap()
    };
    let out = run(
        &[
            "--allow-net",
            "api.example.com",
            "--secret",
            "SKILLBOX_TEST_UNSET_SECRET=api.example.com",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("$SKILLBOX_TEST_UNSET_SECRET is not set"),
        "{}",
        text(&out.stderr)
    );

    let out = run(
        &[
            "--allow-net",
            "api.example.com",
            "--secret",
            "lower_case=api.example.com",
        ],
        &[("lower_case", "v")],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("secrets.lower_case"),
        "{}",
        text(&out.stderr)
    );

    let out = run(
        &[
            "--allow-net",
            "api.example.com",
            "--secret",
            "API_KEY=https://x/",
        ],
        &[("API_KEY", "v")],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("secrets.API_KEY.hosts[0]"),
        "{}",
        text(&out.stderr)
    );

    let out = run(
        &[
            "--backend",
            "wasm",
            "--allow-net",
            "api.example.com",
            "--secret",
            "API_KEY=api.example.com",
        ],
        &[("API_KEY", "v")],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("egress secrets"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stdout).contains("ran"));
}

/// The value of the secret the tests below add at egress: only ever in skillbox's
/// environment (never on a command line, never in a file the test writes).
const SECRET: &str = "real-key-5be07c29d4a1";

/// An HTTPS server behind the veth, as `api.test` and `other.test` (names the
/// namespace resolves to [`PUBLIC`]), its certificate signed by a test CA that no
/// public root vouches for.
struct TlsServer {
    /// The test CA's certificate, PEM, and the same in a file (for `--egress-ca`).
    ca_pem: String,
    ca_file: String,
    seen: testkit::Seen,
    port: u16,
    _runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl TlsServer {
    fn new(ns: &Namespace) -> TlsServer {
        ns.resolve(&["api.test", "other.test"]);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (_, ca_pem, config) = testkit::test_tls(&["api.test", "other.test"]);
        let seen = testkit::Seen::default();
        let port = runtime.block_on(async {
            let listener = testkit::listen_in_netns(&ns.far(), PUBLIC);
            testkit::https_server_on(listener, config, seen.clone()).await
        });
        let dir = tempfile::tempdir().unwrap();
        let ca_file = write(dir.path(), "internal-ca.pem", &ca_pem);
        TlsServer {
            ca_pem,
            ca_file,
            seen,
            port,
            _runtime: runtime,
            _dir: dir,
        }
    }

    /// What a run adds to reach both names, the secret bound to `api.test` only.
    fn flags(&self) -> Vec<String> {
        let port = self.port;
        [
            "--allow-net",
            &format!("api.test:{port}"),
            "--allow-net",
            &format!("other.test:{port}"),
            "--secret",
            &format!("API_KEY=api.test:{port}"),
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// A script that writes the placeholder it sees in `$API_KEY` to
    /// `/workspace/placeholder.txt` (a file the run keeps) and prints it on stderr, then
    /// fetches `https://api.test` and `https://other.test` with it in `Authorization`
    /// (`testkit::secret_script`); in `dir`.
    fn script(&self, dir: &Path) -> String {
        let fetch = testkit::secret_script(&["api.test", "other.test"], self.port, &self.ca_pem);
        write(
            dir,
            "call_api.py",
            &format!(
                "import os, sys\nkey = os.environ['API_KEY']\n\
                 open('/workspace/placeholder.txt', 'w').write(key)\n\
                 print('placeholder', key, file=sys.stderr, flush=True)\n{fetch}"
            ),
        )
    }
}

/// The files under `dir` that hold `needle` (`grep -r`: every file, sqlite databases
/// and their journals included; sockets and FIFOs skipped).
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let found = Command::new("grep")
        .args(["-r", "-l", "-a", "--devices=skip", needle])
        .arg(dir)
        .output()
        .unwrap();
    // 1: no match, and no error.
    assert!(
        matches!(found.status.code(), Some(0 | 1)),
        "grep {}: {}",
        dir.display(),
        text(&found.stderr)
    );
    text(&found.stdout).lines().map(str::to_string).collect()
}

/// [`SECRET`] is in no file under `dir`.
fn assert_not_under(dir: &Path) {
    let holding = files_holding(dir, SECRET);
    assert!(holding.is_empty(), "{SECRET} in {holding:?}");
}

/// Checks a run of [`TlsServer::script`] (`out`, in plain mode, its files copied to
/// `copied`) that should have reached both hosts: `api.test` saw the value and
/// `other.test` the placeholder the script saw and kept; the value is in neither
/// output (skillbox's logs included) nor the kept file, and nowhere under `dirs`.
fn assert_secret_kept_nowhere(server: &TlsServer, out: &Output, copied: &Path, dirs: &[&Path]) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    testkit::assert_secret_only_for_its_host(
        SECRET,
        out.status.code().unwrap_or(-1),
        &stdout,
        &stderr,
        &server.seen,
    );
    let placeholder = stderr
        .lines()
        .find_map(|l| l.strip_prefix("placeholder "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(placeholder.starts_with("skillbox-secret-"), "{placeholder}");
    assert_eq!(
        server.seen.lock().unwrap()[1].1,
        format!("Bearer {placeholder}")
    );
    let kept = std::fs::read_to_string(copied.join("placeholder.txt")).unwrap();
    assert_eq!(kept, placeholder);
    assert!(
        stderr.contains(&format!("egress allowed api.test:{}", server.port)),
        "{stderr}"
    );
    assert_not_under(copied);
    for dir in dirs {
        assert_not_under(dir);
    }
}

/// `run --secret` with `--egress-ca`: the value, only in skillbox's environment,
/// reaches `api.test` (whose certificate the test CA signed: the proxy trusts it
/// because of the flag) and no other host; with skillbox logging everything
/// (`SKILLBOX_LOG=trace`) it is in neither output, nor in the file the script kept
/// (`--out`), nor anywhere under the data dir (the artifact store, what the sandbox
/// left), on native, docker and gvisor. Without the flag the proxy refuses
/// `api.test`'s certificate and the host gets nothing.
#[test]
fn a_secret_reaches_its_host_only_and_is_kept_nowhere() {
    let test = "a_secret_reaches_its_host_only_and_is_kept_nowhere";
    let Some(ns) = Namespace::new(test) else {
        return;
    };
    let server = TlsServer::new(&ns);
    let scripts = tempfile::tempdir().unwrap();
    let script = server.script(scripts.path());
    let flags = server.flags();
    for backend in ["native", "docker", "gvisor"] {
        if backend != "native" && !backend_or_skip(backend, test) {
            continue;
        }
        server.seen.lock().unwrap().clear();
        let (data, copied) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut args = vec!["run", &script, "--backend", backend, "--egress-ca"];
        args.push(&server.ca_file);
        args.extend(flags.iter().map(String::as_str));
        args.extend([
            "--out",
            copied.path().to_str().unwrap(),
            "--outputs",
            "placeholder.txt",
        ]);
        let out = ns
            .command(data.path(), &args)
            .env("API_KEY", SECRET)
            .env("SKILLBOX_LOG", "trace")
            .output()
            .unwrap();
        assert!(
            text(&out.stderr).contains("TRACE"),
            "{backend}: logs at trace\n{}",
            text(&out.stderr)
        );
        assert_secret_kept_nowhere(&server, &out, copied.path(), &[data.path()]);
    }

    // Without --egress-ca nothing vouches for api.test's certificate: the proxy's TLS
    // to it fails, the script's request is answered 502 saying why (urllib raises it)
    // and the connection's record says refused and why, so the flag is what made it
    // work.
    server.seen.lock().unwrap().clear();
    let data = tempfile::tempdir().unwrap();
    let mut args = vec!["run", &script, "--json"];
    args.extend(flags.iter().map(String::as_str));
    let out = ns
        .command(data.path(), &args)
        .env("API_KEY", SECRET)
        .env("SKILLBOX_LOG", "trace")
        .output()
        .unwrap();
    let result = json(&out);
    assert_ne!(result["exitCode"], 0, "{result:#}");
    let api = result["egress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["host"] == "api.test")
        .unwrap_or_else(|| panic!("{result:#}"));
    let reason = api["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("TLS with api.test") && reason.contains("UnknownIssuer"),
        "{result:#}"
    );
    assert_eq!(api["verdict"], "refused", "{result:#}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("HTTP Error 502"),
        "{result:#}"
    );
    assert!(server.seen.lock().unwrap().is_empty());
    assert!(!text(&out.stdout).contains(SECRET) && !text(&out.stderr).contains(SECRET));
    assert_not_under(data.path());
}

/// The same through `skillbox serve --egress-ca` and `POST /v1/run` (the CLI's
/// `--remote`, the value only in the client's environment): the server, logging
/// everything, keeps the value in no log line, no run record and no artifact.
#[test]
fn a_secret_through_serve_is_kept_nowhere() {
    let test = "a_secret_through_serve_is_kept_nowhere";
    let Some(ns) = Namespace::new(test) else {
        return;
    };
    let server = TlsServer::new(&ns);
    let scripts = tempfile::tempdir().unwrap();
    let script = server.script(scripts.path());
    // serve installs the Node runtime before it listens: the one the CLI tests share
    // (installed once, with the network the test process has), copied in (8 MB; the
    // data dir holds no links).
    let shared = Path::new(env!("CARGO_TARGET_TMPDIR")).join("skillbox-cli-tests");
    let setup = common::skillbox(&shared, &["setup", "--no-wasm"]);
    assert!(setup.status.success(), "{}", text(&setup.stderr));
    let data = tempfile::tempdir().unwrap();
    let copy = Command::new("cp")
        .arg("-a")
        .arg(shared.join("runtimes"))
        .arg(data.path())
        .status()
        .unwrap();
    assert!(copy.success());

    let addr = "127.0.0.1:18480";
    let mut serve = ns
        .command(
            data.path(),
            &[
                "serve",
                "--addr",
                addr,
                "--warm-containers",
                "0",
                "--egress-ca",
                &server.ca_file,
            ],
        )
        .env("SKILLBOX_LOG", "trace")
        .env_remove("API_KEY")
        .env_remove("SKILLBOX_API_KEYS")
        .env_remove("SKILLBOX_API_KEYS_FILE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (listening, ready) = std::sync::mpsc::channel();
    let reader = {
        let (logs, stderr) = (logs.clone(), serve.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("skillbox serve: listening") {
                    let _ = listening.send(());
                }
                logs.lock().unwrap().push(line);
            }
        })
    };
    let started = ready.recv_timeout(std::time::Duration::from_secs(120));
    assert!(
        started.is_ok(),
        "serve did not listen: {:?}",
        logs.lock().unwrap()
    );

    let (client, copied) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let remote = format!("http://{addr}");
    let flags = server.flags();
    let mut args = vec!["run", &script, "--remote", &remote];
    args.extend(flags.iter().map(String::as_str));
    args.extend([
        "--out",
        copied.path().to_str().unwrap(),
        "--outputs",
        "placeholder.txt",
    ]);
    let out = ns
        .command(client.path(), &args)
        .env("API_KEY", SECRET)
        .env("SKILLBOX_LOG", "trace")
        .env_remove("SKILLBOX_API_KEY")
        .output()
        .unwrap();

    // SAFETY: signalling the server this test started (`ip netns exec` execs it).
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    let status = serve.wait().unwrap();
    reader.join().unwrap();
    let logs = logs.lock().unwrap().clone();
    assert!(status.success(), "{status:?}");
    assert_secret_kept_nowhere(&server, &out, copied.path(), &[data.path(), client.path()]);
    assert!(
        logs.iter().any(|l| l.contains("TRACE")),
        "the server logs at trace"
    );
    assert!(
        logs.iter().all(|l| !l.contains(SECRET)),
        "the server logged the value"
    );
    // The run's summary was kept, and grep reads it: the grep above looked at a record
    // of this run.
    let records = files_holding(data.path(), "placeholder.txt");
    assert!(
        records.iter().any(|f| f.contains("agent-runs.sqlite")),
        "{records:?}"
    );
}

/// `--egress-ca FILE` is read once, before anything runs: a file that is missing,
/// empty, not PEM, or holds a private key is bad usage naming the flag and the file
/// (a key's body is never echoed); the flag needs a `--secret` (only the TLS the proxy
/// opens for a secret's host uses it) and cannot go to a `--remote` server (which has
/// its own); `serve --egress-ca` is checked the same way.
#[test]
fn egress_ca_flags_are_checked() {
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let script = write(files.path(), "x.py", "print('ran')\n");
    let empty = write(files.path(), "empty.pem", "");
    let garbage = write(files.path(), "garbage.pem", "not a certificate\n");
    let key = write(
        files.path(),
        "key.pem",
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIKeyBodyNeverEchoed000000000000000000000\n-----END PRIVATE KEY-----\n",
    );
    let missing = files.path().join("missing.pem").display().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            &script,
            "--allow-net",
            "api.example.com",
            "--secret",
            "API_KEY=api.example.com",
        ];
        args.extend_from_slice(extra);
        Command::new(BIN)
            .arg("--data-dir")
            .arg(data.path())
            .args(&args)
            .env("API_KEY", SECRET)
            .output()
            .unwrap()
    };
    for (file, said) in [
        (&missing, "No such file"),
        (&empty, "holds no certificate"),
        (&garbage, "holds no certificate"),
        (&key, "only CERTIFICATE sections"),
        (&files.path().display().to_string(), "not a regular file"),
    ] {
        let out = run(&["--egress-ca", file]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(
            stderr.contains(&format!("skillbox run: --egress-ca {file}: "))
                && stderr.contains(said),
            "{file}: {stderr}"
        );
        assert!(!stderr.contains("KeyBodyNeverEchoed"), "{stderr}");
        assert!(!text(&out.stdout).contains("ran"));
    }

    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(data.path())
        .args([
            "run",
            &script,
            "--allow-net",
            "api.example.com",
            "--egress-ca",
            &key,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--secret"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&["--egress-ca", &key, "--remote", "http://127.0.0.1:9"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--remote"),
        "{}",
        text(&out.stderr)
    );

    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(data.path())
        .args(["serve", "--addr", "127.0.0.1:9", "--egress-ca", &empty])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "skillbox serve: --egress-ca {empty}: holds no certificate"
        )),
        "{}",
        text(&out.stderr)
    );
}
