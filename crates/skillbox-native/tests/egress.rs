//! Egress from a native sandbox through skillbox's proxy (DESIGN.md §8), against real
//! servers in network namespaces this test makes (never any outside address): the test
//! thread's own, standing for the host (203.0.113.1 on a veth), and a far one behind
//! that veth where `allowed.test`, 203.0.113.7, serves; `rebind.test` resolves to
//! 127.0.0.1. The sandbox's code is Python's standard library, as a
//! model's script would be. Needs root for the test's namespace (skipped otherwise; a
//! failure under SKILLBOX_REQUIRE_ALL=1).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::future::Future;
use std::process::Command;
use std::sync::Arc;

use skillbox_egress::testkit::{self, HOST, PUBLIC};
use skillbox_egress::{NetworkPolicy, StaticResolver, Verdict};
use skillbox_env::{CancellationToken, ExecRequest, ExecutionEnv, SandboxPolicy, SandboxSpec};
use skillbox_native::NativeBackend;

/// Runs `body` in the test's network namespaces (`skillbox_egress::testkit`): its
/// thread's own, standing for the host, and a far one behind a veth where [`PUBLIC`]
/// serves; skipped when this process may not make them or the sandbox cannot run.
fn in_netns<F, Fut>(test: &str, body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    if let Some(why) = testkit::cannot_run() {
        skillbox_env::testkit::skip(test, why);
        return;
    }
    if let Err(why) = common::data_dir().map(drop) {
        skillbox_env::testkit::skip(test, &why);
        return;
    }
    testkit::in_netns(body);
}

async fn sandbox(network: Option<NetworkPolicy>) -> Box<dyn ExecutionEnv> {
    let names = StaticResolver::of(&[
        ("allowed.test", PUBLIC),
        ("other.test", PUBLIC),
        ("rebind.test", "127.0.0.1"),
    ])
    .unwrap();
    let backend = NativeBackend::new(common::data_dir().unwrap()).with_resolver(Arc::new(names));
    let spec = SandboxSpec {
        policy: SandboxPolicy {
            network,
            ..SandboxPolicy::default()
        },
        ..skillbox_env::testkit::spec()
    };
    Box::new(backend.create(spec).await.unwrap())
}

/// Runs a Python script in `env`: (exit code, stdout, stderr).
async fn python(env: &dyn ExecutionEnv, script: &str) -> (i32, String, String) {
    let out = env
        .exec(
            ExecRequest::argv(["python3", "-c", script])
                .timeout(std::time::Duration::from_secs(30)),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    (
        out.exit_code.unwrap_or(-1),
        out.stdout_text(),
        out.stderr_text(),
    )
}

/// What a script prints for a URL fetched through the environment's proxy settings:
/// the body, or `HTTP <code>: <body>`, or `ERROR <what>`.
fn fetch(url: &str) -> String {
    format!(
        r#"
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen({url:?}, timeout=10).read().decode())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode())
except Exception as e:
    print("ERROR", type(e).__name__, e)
"#
    )
}

#[test]
fn allowed_names_are_reached_through_the_proxy_and_nothing_else() {
    in_netns(
        "allowed_names_are_reached_through_the_proxy_and_nothing_else",
        || async {
            let port = testkit::http_server(PUBLIC).await;
            let local = testkit::http_server("127.0.0.1").await;
            // A host service on every address: its public one is the host's own too.
            let everywhere = testkit::http_server("0.0.0.0").await;
            let env = sandbox(Some(NetworkPolicy {
                allow: vec![
                    format!("allowed.test:{port}"),
                    format!("rebind.test:{local}"),
                    format!("{HOST}:{everywhere}"),
                ],
                deny: vec![],
            }))
            .await;

            // An allowed name, through HTTP_PROXY as any client would.
            let (code, out, err) = python(
                env.as_ref(),
                &fetch(&format!("http://allowed.test:{port}/pkg")),
            )
            .await;
            assert_eq!((code, out.trim()), (0, "served GET /pkg HTTP/1.1"), "{err}");

            // A CONNECT tunnel (what HTTPS takes), by hand.
            let tunnel = format!(
                r#"
import os, socket
s = socket.create_connection(("127.0.0.1", int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])))
s.sendall(b"CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert head.startswith(b"HTTP/1.1 200"), head
s.sendall(b"GET /tunnelled HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
print(s.recv(4096).decode().split("\r\n\r\n", 1)[1])
"#
            );
            let (code, out, err) = python(env.as_ref(), &tunnel).await;
            assert_eq!(
                (code, out.trim()),
                (0, "served GET /tunnelled HTTP/1.1"),
                "{err}"
            );

            // A name not on the list, and an allowed name that resolves to loopback.
            let (_, out, _) =
                python(env.as_ref(), &fetch(&format!("http://other.test:{port}/"))).await;
            assert!(
                out.starts_with("HTTP 403") && out.contains("is not on the run's network.allow"),
                "{out}"
            );
            let (_, out, _) = python(
                env.as_ref(),
                &fetch(&format!("http://rebind.test:{local}/")),
            )
            .await;
            assert!(
                out.starts_with("HTTP 403") && out.contains("a loopback address"),
                "{out}"
            );
            assert!(!out.contains("served"), "{out}");
            // The host's own public address, allowed by the policy, is still refused.
            let (_, out, _) = python(
                env.as_ref(),
                &fetch(&format!("http://{HOST}:{everywhere}/")),
            )
            .await;
            assert!(
                out.starts_with("HTTP 403") && out.contains("one of this host's own addresses"),
                "{out}"
            );

            // Around the proxy: the server's address directly, with and without the
            // proxy settings: there is no route.
            let direct = format!(
                r#"
import socket
try:
    socket.create_connection(({PUBLIC:?}, {port}), timeout=5)
    print("CONNECTED")
except OSError as e:
    print("REFUSED", e.errno)
"#
            );
            let (_, out, _) = python(env.as_ref(), &direct).await;
            assert!(out.starts_with("REFUSED"), "{out}");
            let bypass = format!(
                "import os\nfor k in list(os.environ):\n    if 'proxy' in k.lower(): del os.environ[k]\n{}",
                fetch(&format!("http://{PUBLIC}:{port}/"))
            );
            let (_, out, _) = python(env.as_ref(), &bypass).await;
            assert!(out.starts_with("ERROR"), "{out}");

            let connections = env.egress();
            let allowed = connections
                .iter()
                .filter(|c| c.verdict == Verdict::Allowed)
                .count();
            let refused: Vec<_> = connections
                .iter()
                .filter(|c| c.verdict == Verdict::Refused)
                .collect();
            assert_eq!(allowed, 2, "{connections:#?}");
            assert_eq!(refused.len(), 3, "{connections:#?}");
            assert!(refused.iter().any(|c| c.host == "other.test"));
            assert!(refused.iter().any(|c| c.host == "rebind.test"));
            assert!(refused.iter().any(|c| c.host == HOST));
            env.cleanup().await.unwrap();
        },
    );
}

#[test]
fn without_a_policy_there_is_no_proxy_and_no_route() {
    in_netns(
        "without_a_policy_there_is_no_proxy_and_no_route",
        || async {
            let port = testkit::http_server(PUBLIC).await;
            let env = sandbox(None).await;
            let probe = format!(
                r#"
import os, socket
print(sorted(k for k in os.environ if "proxy" in k.lower()))
for address in [("127.0.0.1", 3128), ({PUBLIC:?}, {port})]:
    try:
        socket.create_connection(address, timeout=5)
        print("CONNECTED")
    except OSError as e:
        print("REFUSED")
"#
            );
            let (code, out, err) = python(env.as_ref(), &probe).await;
            assert_eq!((code, out.as_str()), (0, "[]\nREFUSED\nREFUSED\n"), "{err}");
            assert!(env.egress().is_empty());
            env.cleanup().await.unwrap();

            // A policy with a bad entry is refused when the sandbox is made, naming it.
            let backend = NativeBackend::new(common::data_dir().unwrap());
            let bad = backend
                .create(SandboxSpec {
                    policy: SandboxPolicy {
                        network: Some(NetworkPolicy {
                            allow: vec!["ok.example".into(), "https://x.example".into()],
                            deny: vec![],
                        }),
                        ..SandboxPolicy::default()
                    },
                    ..skillbox_env::testkit::spec()
                })
                .await
                .unwrap_err();
            assert!(bad.message.contains("network.allow[1]"), "{bad}");
        },
    );
}

const SECRET: &str = "real-key-0f3c9a7e51";

/// A secret bound to one host: the sandbox sees only a placeholder; the proxy puts the
/// value in the request's headers for that host (the server sees it) and nowhere else
/// (another allowed host gets the placeholder); the value is in no output, file or
/// directory skillbox keeps.
#[test]
fn secrets_are_added_at_egress_for_their_hosts_only() {
    in_netns(
        "secrets_are_added_at_egress_for_their_hosts_only",
        || async {
            let (ca, test_ca, config) = testkit::test_tls(&["api.test", "other.test"]);
            let seen = testkit::Seen::default();
            let port = testkit::https_server(config, seen.clone()).await;
            let data = common::data_dir().unwrap();
            let backend = NativeBackend::new(&data)
                .with_resolver(Arc::new(
                    StaticResolver::of(&[("api.test", PUBLIC), ("other.test", PUBLIC)]).unwrap(),
                ))
                .with_upstream_roots(vec![ca]);
            let spec = SandboxSpec {
                policy: SandboxPolicy {
                    network: Some(NetworkPolicy {
                        allow: vec![format!("api.test:{port}"), format!("other.test:{port}")],
                        deny: vec![],
                    }),
                    secrets: std::collections::BTreeMap::from([(
                        "API_KEY".to_string(),
                        skillbox_egress::SecretSpec {
                            value: SECRET.into(),
                            hosts: vec![format!("api.test:{port}")],
                        },
                    )]),
                    ..SandboxPolicy::default()
                },
                ..skillbox_env::testkit::spec()
            };
            let env: Box<dyn ExecutionEnv> = Box::new(backend.create(spec).await.unwrap());
            let script = testkit::secret_script(&["api.test", "other.test"], port, &test_ca);
            let (code, out, err) = python(env.as_ref(), &script).await;
            testkit::assert_secret_only_for_its_host(SECRET, code, &out, &err, &seen);
            let connections = env.egress();
            // Both hosts, and the two requests smuggled into api.test's tunnel, refused.
            assert_eq!(connections.len(), 4, "{connections:#?}");
            let refused = connections
                .iter()
                .filter(|c| c.verdict == skillbox_egress::Verdict::Refused);
            assert_eq!(refused.count(), 2, "{connections:#?}");
            assert!(!format!("{connections:?}").contains(SECRET));
            env.cleanup().await.unwrap();
            // Nothing skillbox kept holds the value.
            let found = Command::new("grep")
                .args(["-r", "-l", SECRET])
                .arg(&data)
                .output()
                .unwrap();
            assert!(
                found.stdout.is_empty(),
                "{}",
                String::from_utf8_lossy(&found.stdout)
            );
        },
    );
}
