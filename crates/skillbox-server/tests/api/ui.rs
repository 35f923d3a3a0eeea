//! What the web UI stands on: the UI's files (no key, a strict CSP), the lists of a
//! tenant's agent runs and plain runs (newest first, paged), what a new run gets
//! (`GET /v1/agent`),
//! and slide previews of a deck the tenant owns (PNG from LibreOffice, else outlines).

use std::sync::Arc;

use serde_json::{Value, json};
use skillbox_server::{AgentModel, AgentRuns, ApiKeys, ServerConfig};
use skillbox_store::ArtifactStore;

use super::{Server, is_error, shared_data_dir, start_with};

const KEY_A: &str = "ui-tenant-a-token-0123456789";
const KEY_B: &str = "ui-tenant-b-token-9876543210";
/// A tenant no test runs anything as: the object owners are shared by every test here
/// (the runner's data dir), and the demo's deck is the same bytes whoever makes it in
/// the same second.
const KEY_OUTSIDER: &str = "ui-outsider-token-0123456789";
const DEMO: &str = "Make a 3-slide pitch deck for WorkspaceX.";

async fn keyed_agent_server(data: &std::path::Path, png_previews: bool) -> Option<Server> {
    let store = ArtifactStore::local(&data.join("objects")).await.unwrap();
    let agents = AgentRuns::open(
        &skillbox_store::RecordsDb::sqlite(data),
        "test",
        AgentModel::Loopback,
        2,
    )
    .await
    .unwrap();
    // Tenant names of these tests only: the object owners are shared by every test
    // here, and a demo deck made in the same second is the same bytes whoever makes it,
    // so a tenant `b` here would own what another test's tenant `a` made.
    let keys = ApiKeys::from_pairs(&format!(
        "ui-a={KEY_A},ui-b={KEY_B},ui-outsider={KEY_OUTSIDER}"
    ))
    .unwrap();
    start_with(
        ServerConfig {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            keys: Some(Arc::new(keys)),
            agents: Some(agents),
            png_previews,
            ..ServerConfig::default()
        },
        store,
        tempfile::tempdir().unwrap(),
    )
    .await
}

impl Server {
    async fn get_as(&self, path: &str, key: Option<&str>) -> reqwest::Response {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().await.unwrap()
    }

    async fn json_as(&self, path: &str, key: &str) -> (u16, Value) {
        let response = self.get_as(path, Some(key)).await;
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Starts the demo prompt as `key`'s tenant and waits for it to end.
    async fn demo_run(&self, key: &str) -> Value {
        let response = self
            .http
            .post(format!("{}/v1/agent/runs", self.base))
            .bearer_auth(key)
            .json(&json!({ "prompt": DEMO }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        let id = response.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        for _ in 0..600 {
            let (status, record) = self.json_as(&format!("/v1/agent/runs/{id}"), key).await;
            assert_eq!(status, 200, "{record}");
            if record["status"] != "running" {
                assert_eq!(record["status"], "succeeded", "{record}");
                return record;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("agent run {id} did not finish");
    }
}

fn assert_invalid_naming(status: u16, json: &Value, field: &str) {
    assert_eq!(status, 400, "{json}");
    assert!(is_error(json, "invalid"), "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.starts_with(field), "{field}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_are_listed_newest_first_a_page_at_a_time_per_tenant() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = keyed_agent_server(data.path(), true).await else {
        return;
    };
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            server.demo_run(KEY_A).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let theirs = server.demo_run(KEY_B).await["id"]
        .as_str()
        .unwrap()
        .to_string();

    let (status, page) = server.json_as("/v1/agent/runs?limit=2", KEY_A).await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[2].as_str(), ids[1].as_str()], "newest first");
    assert_eq!(page["next"], ids[1].as_str());
    let run = &page["runs"][0];
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["prompt"], DEMO);
    assert_eq!(run["backend"], "native");
    assert_eq!(run["model"], "loopback");
    assert_eq!(run["scripted"], true);
    assert_eq!(run["attempts"], 2);
    assert!(run["durationMs"].is_u64(), "{run}");
    assert_eq!(run["artifacts"][0]["path"], "workspacex.pptx");
    assert!(run.get("script").is_none() && run.get("answer").is_none());

    let (status, last) = server
        .json_as(&format!("/v1/agent/runs?limit=2&before={}", ids[1]), KEY_A)
        .await;
    assert_eq!(status, 200, "{last}");
    assert_eq!(last["runs"].as_array().unwrap().len(), 1);
    assert_eq!(last["runs"][0]["id"], ids[0].as_str());
    assert!(last.get("next").is_none(), "the last page: {last}");

    // The default page holds them all; b sees only its own, a none of b's.
    let (_, all) = server.json_as("/v1/agent/runs", KEY_A).await;
    assert_eq!(all["runs"].as_array().unwrap().len(), 3);
    let (_, b) = server.json_as("/v1/agent/runs", KEY_B).await;
    assert_eq!(b["runs"].as_array().unwrap().len(), 1);
    assert_eq!(b["runs"][0]["id"], theirs.as_str());
    // Another tenant's run as a cursor is a run that is not there.
    let (status, json) = server
        .json_as(&format!("/v1/agent/runs?before={theirs}"), KEY_A)
        .await;
    assert_invalid_naming(status, &json, "before");

    for query in ["limit=0", "limit=101", "limit=x", "limit=-1"] {
        let (status, json) = server
            .json_as(&format!("/v1/agent/runs?{query}"), KEY_A)
            .await;
        assert_invalid_naming(status, &json, "limit");
    }
    let (status, json) = server.json_as("/v1/agent/runs?offset=2", KEY_A).await;
    assert_eq!(status, 400, "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("offset"),
        "{json}"
    );

    // Plain runs keep a summary for their tenant's list: no output, the script's first
    // line, the files.
    let plain = |key: &'static str, script: String| {
        server
            .http
            .post(format!("{}/v1/run", server.base))
            .bearer_auth(key)
            .json(&json!({"script": script, "language": "sh"}))
            .send()
    };
    for n in 1..=2 {
        let response = plain(
            KEY_A,
            format!("\n  echo secret-output-{n}; echo {n} > n{n}.txt\nexit {n}"),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(plain(KEY_B, "echo b".into()).await.unwrap().status(), 200);
    let (status, page) = server.json_as("/v1/runs?limit=1", KEY_A).await;
    assert_eq!(status, 200, "{page}");
    let run = &page["runs"][0];
    assert_eq!(
        run["script"], "echo secret-output-2; echo 2 > n2.txt",
        "{run}"
    );
    assert_eq!(run["language"], "sh");
    assert_eq!(run["backend"], "native");
    assert_eq!(run["exitCode"], 2);
    assert_eq!(run["files"][0]["path"], "n2.txt");
    assert!(run["createdMs"].as_i64().unwrap() > 0 && run["durationMs"].is_u64());
    assert!(
        run.get("stdout").is_none()
            && run.get("stderr").is_none()
            && !page.to_string().contains(r"secret-output-2\n"),
        "no output kept: {page}"
    );
    let next = page["next"].as_str().unwrap();
    let (_, older) = server
        .json_as(&format!("/v1/runs?limit=1&before={next}"), KEY_A)
        .await;
    assert_eq!(older["runs"][0]["exitCode"], 1, "{older}");
    assert!(older.get("next").is_none(), "{older}");
    let (_, b) = server.json_as("/v1/runs", KEY_B).await;
    assert_eq!(b["runs"].as_array().unwrap().len(), 1, "{b}");
    assert_eq!(b["runs"][0]["script"], "echo b");
    let b_id = b["runs"][0]["id"].as_str().unwrap();
    let (status, json) = server
        .json_as(&format!("/v1/runs?before={b_id}"), KEY_A)
        .await;
    assert_invalid_naming(status, &json, "before");
    let (status, json) = server.json_as("/v1/runs?limit=500", KEY_A).await;
    assert_invalid_naming(status, &json, "limit");
    assert_eq!(server.get_as("/v1/runs", None).await.status(), 401);

    // What a new run gets here.
    let (status, info) = server.json_as("/v1/agent", KEY_A).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(
        info,
        json!({"model": "loopback", "scripted": true, "skills": ["pptx"]})
    );

    for path in ["/v1/agent/runs", "/v1/agent"] {
        let response = server.get_as(path, None).await;
        assert_eq!(response.status(), 401, "{path}");
        let response = server.get_as(path, Some("not-a-key-of-this-server")).await;
        assert_eq!(response.status(), 401, "{path}");
    }
}

/// Nothing a render made is left: no work dir, no LibreOffice process. (The runner's
/// data dir, where previews live, is the one the tests share.)
async fn assert_nothing_left() {
    // Other tests render on the same data dir at the same time: what is theirs goes
    // within a render's 60 s; what a render left stays.
    let previews = shared_data_dir().join("previews");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(75);
    loop {
        let leftovers: Vec<_> = std::fs::read_dir(&previews)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        // A render's programs run in its sandbox on its deck there.
        let rendering = skillbox_env::testkit::host_processes_with("/workspace/deck.pptx");
        if leftovers.is_empty() && rendering.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left: {leftovers:?}, still rendering: {rendering:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slide_previews_render_a_tenants_deck_and_no_one_elses() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = keyed_agent_server(data.path(), true).await else {
        return;
    };
    let record = server.demo_run(KEY_A).await;
    let sha = record["artifacts"][0]["sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let slides = format!("/v1/objects/{sha}/slides");

    // Another tenant, and no key, learn nothing of it.
    let (status, json) = server.json_as(&slides, KEY_OUTSIDER).await;
    assert_eq!(status, 404, "{json}");
    assert_eq!(server.get_as(&slides, None).await.status(), 401);
    let (status, json) = server.json_as(&format!("{slides}/1"), KEY_OUTSIDER).await;
    assert_eq!(status, 404, "{json}");

    let (png, why) = skillbox_server::preview_report();
    let (status, preview) = server.json_as(&slides, KEY_A).await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["sha256"], sha.as_str());
    let listed = preview["slides"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{preview}");
    assert_eq!(listed[0]["texts"][0], "WorkspaceX");
    assert!(
        listed[2]["texts"]
            .as_array()
            .unwrap()
            .contains(&json!("hello@workspacex.example")),
        "{preview}"
    );
    if !png {
        assert_eq!(preview["format"], "outline", "{preview}");
        skillbox_env::testkit::skip("slide_previews PNG", &why);
        return;
    }
    assert_eq!(preview["format"], "png", "{preview}");
    for (i, slide) in listed.iter().enumerate() {
        let image = slide["image"].as_str().unwrap();
        assert_eq!(image, format!("{slides}/{}", i + 1));
        let response = server.get_as(image, Some(KEY_A)).await;
        assert_eq!(response.status(), 200, "{image}");
        assert_eq!(response.headers()["content-type"], "image/png");
        assert_eq!(response.headers()["x-content-type-options"], "nosniff");
        let bytes = response.bytes().await.unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{image}");
        // -r 50 of a 13.33 in wide slide (LAYOUT_WIDE): about 667 px.
        let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        assert!((300..=1000).contains(&width), "{image}: {width} px");
    }
    // Cached by the deck's SHA-256: the same answer, from disk.
    assert!(
        shared_data_dir()
            .join("previews")
            .join(&sha)
            .join("slides.json")
            .is_file()
    );
    let (_, again) = server.json_as(&slides, KEY_A).await;
    assert_eq!(again, preview);
    assert_nothing_left().await;

    // Bad input names the field.
    let (status, json) = server.json_as("/v1/objects/XYZ/slides", KEY_A).await;
    assert_invalid_naming(status, &json, "sha256");
    for number in ["0", "x", "101"] {
        let (status, json) = server.json_as(&format!("{slides}/{number}"), KEY_A).await;
        assert_invalid_naming(status, &json, "number");
    }
    let (status, json) = server.json_as(&format!("{slides}/4"), KEY_A).await;
    assert_eq!(status, 404, "{json}");
    // A file that is not a deck has no slides.
    let ran = server
        .run_body_as(
            KEY_A,
            json!({"script": "echo notes > notes.txt", "language": "sh"}),
        )
        .await;
    let text_sha = ran["files"][0]["sha256"].as_str().unwrap();
    let (status, json) = server
        .json_as(&format!("/v1/objects/{text_sha}/slides"), KEY_A)
        .await;
    assert_invalid_naming(status, &json, "sha256");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a .pptx"),
        "{json}"
    );
}

/// A deck of `slides` slides saying `text`, made by a run of `key`'s tenant: its sha256.
async fn deck_of(server: &Server, key: &str, text: &str, slides: usize) -> String {
    let script = format!(
        r#"const pptxgen = require("pptxgenjs");
const p = new pptxgen();
for (let i = 0; i < {slides}; i++) p.addSlide().addText("{text} " + i, {{ x: 1, y: 1, w: 8, h: 1 }});
p.writeFile({{ fileName: "deck.pptx" }});
"#
    );
    let ran = server
        .run_body_as(key, json!({"script": script, "language": "node"}))
        .await;
    assert_eq!(ran["exitCode"], 0, "{ran}");
    ran["files"][0]["sha256"].as_str().unwrap().to_string()
}

/// One render a tenant at once: a tenant's second deck asked for while its first
/// renders is 429 with a `Retry-After`, and another tenant's waits its turn instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_renders_one_deck_at_once() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = keyed_agent_server(data.path(), true).await else {
        return;
    };
    let (png, why) = skillbox_server::preview_report();
    if !png {
        skillbox_env::testkit::skip("a tenant renders one deck at once", &why);
        return;
    }
    let stamp = std::process::id();
    let first = deck_of(&server, KEY_A, &format!("first {stamp}"), 12).await;
    let second = deck_of(&server, KEY_A, &format!("second {stamp}"), 2).await;
    let others = deck_of(&server, KEY_B, &format!("others {stamp}"), 2).await;
    let ask = |sha: String, key: &'static str| {
        let http = server.http.clone();
        let url = format!("{}/v1/objects/{sha}/slides", server.base);
        tokio::spawn(async move { http.get(url).bearer_auth(key).send().await.unwrap() })
    };
    // LibreOffice takes over a second to start: the three overlap.
    let a1 = ask(first, KEY_A);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let a2 = ask(second, KEY_A);
    let b = ask(others, KEY_B);
    let (a1, a2, b) = (a1.await.unwrap(), a2.await.unwrap(), b.await.unwrap());
    let mut statuses = [a1.status().as_u16(), a2.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 429]);
    let refused = if a1.status() == 429 { a1 } else { a2 };
    assert_eq!(refused.headers()["retry-after"], "5");
    let json = refused.json::<Value>().await.unwrap();
    assert_eq!(json["error"]["code"], "overloaded", "{json}");
    assert_eq!(b.status(), 200);
    let json = b.json::<Value>().await.unwrap();
    assert_eq!(json["format"], "png", "{json}");
    assert_nothing_left().await;
}

/// A 64×64 red PNG.
const RED_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAEAAAABACAIAAAAlC+aJAAAAb0lEQVR4nO3PAQkAAAyEwO9feoshgnABdLep8QUNyPEFDcjxBQ3I8QUNyPEFDcjxBQ3I8QUNyPEFDcjxBQ3I8QUNyPEFDcjxBQ3I8QUNyPEFDcjxBQ3I8QUNyPEFDcjxBQ3I8QUNyPEFDcjxBQ3IPanc8OLDQitxAAAAAElFTkSuQmCC";

/// A deck is code's output, and LibreOffice follows the links in it: a picture linked
/// to `file:///…` is read from wherever the render runs. Rendered on the server's
/// side, a tenant's deck would show that tenant any picture the server can read. The
/// render's sandbox shows none of the host's files: the linked picture is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deck_linking_the_server_s_files_renders_without_them() {
    use base64::Engine as _;
    let data = tempfile::tempdir().unwrap();
    let Some(server) = keyed_agent_server(data.path(), true).await else {
        return;
    };
    let (png, why) = skillbox_server::preview_report();
    if !png {
        skillbox_env::testkit::skip("a deck linking the server's files", &why);
        return;
    }
    // A picture only the server's host has: red.
    let secret = data.path().join("server-only-red.png");
    let red = base64::engine::general_purpose::STANDARD
        .decode(RED_PNG)
        .unwrap();
    std::fs::write(&secret, &red).unwrap();
    // Slide 1 links it, slide 2 holds the same picture, slide 3 is blank (and hidden:
    // rendered all the same, one page a slide).
    let script = format!(
        r#"const pptxgen = require("pptxgenjs");
const JSZip = require("jszip");
const fs = require("fs");
(async () => {{
  const p = new pptxgen();
  const picture = {{ data: "image/png;base64,{RED_PNG}", x: 0, y: 0, w: 10, h: 5.625 }};
  p.addSlide().addImage(picture);
  p.addSlide().addImage(picture);
  const blank = p.addSlide();
  blank.hidden = true;
  blank.addText("", {{ x: 1, y: 1, w: 1, h: 1 }});
  const zip = await JSZip.loadAsync(await p.write({{ outputType: "nodebuffer" }}));
  const rels = "ppt/slides/_rels/slide1.xml.rels";
  const linked = (await zip.file(rels).async("string")).replace(
    /Target="[^"]*media[^"]*"/,
    'Target="file://{}" TargetMode="External"');
  if (!linked.includes("External")) throw new Error("no picture to link");
  zip.file(rels, linked);
  const slide = (await zip.file("ppt/slides/slide1.xml").async("string")).replace("r:embed=", "r:link=");
  zip.file("ppt/slides/slide1.xml", slide);
  fs.writeFileSync("linked.pptx", await zip.generateAsync({{ type: "nodebuffer" }}));
}})();
"#,
        secret.display()
    );
    let ran = server
        .run_body_as(KEY_A, json!({"script": script, "language": "node"}))
        .await;
    assert_eq!(ran["exitCode"], 0, "{ran}");
    let sha = ran["files"][0]["sha256"].as_str().unwrap().to_string();
    let slides = format!("/v1/objects/{sha}/slides");
    let (status, preview) = server.json_as(&slides, KEY_A).await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["format"], "png", "{preview}");
    let mut pngs = Vec::new();
    for number in 1..=3 {
        let response = server
            .get_as(&format!("{slides}/{number}"), Some(KEY_A))
            .await;
        assert_eq!(response.status(), 200);
        pngs.push(response.bytes().await.unwrap());
    }
    // Rendered where the host's file is, slide 1 is slide 2 (checked by hand with the
    // unsandboxed render this replaced); here it is the blank slide 3.
    assert_ne!(pngs[1], pngs[2], "the red picture renders");
    assert_eq!(
        pngs[0], pngs[2],
        "the linked picture of the server's was rendered"
    );
    assert_eq!(std::fs::read(&secret).unwrap(), red);
    assert_nothing_left().await;

    // LibreOffice's configuration (where an admin may keep an LDAP password) is the
    // renders' alone: a run does not see it.
    assert!(std::path::Path::new("/etc/libreoffice").is_dir());
    let ran = server
        .run_body_as(
            KEY_A,
            json!({
                "script": "ls /etc/libreoffice /etc/fonts 2>&1; echo status $?",
                "language": "sh"
            }),
        )
        .await;
    let stdout = ran["stdout"].as_str().unwrap();
    assert!(stdout.contains("No such file"), "{ran}");
    assert!(stdout.contains("status 2"), "{ran}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_png_previews_a_deck_has_text_outlines() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = keyed_agent_server(data.path(), false).await else {
        return;
    };
    let record = server.demo_run(KEY_A).await;
    let sha = record["artifacts"][0]["sha256"].as_str().unwrap();
    let (status, preview) = server
        .json_as(&format!("/v1/objects/{sha}/slides"), KEY_A)
        .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["format"], "outline");
    assert!(
        preview["note"]
            .as_str()
            .unwrap()
            .contains("PNG previews are off"),
        "{preview}"
    );
    let slides = preview["slides"].as_array().unwrap();
    assert_eq!(slides.len(), 3);
    assert!(slides.iter().all(|s| s.get("image").is_none()), "{preview}");
    assert_eq!(
        slides[1]["texts"],
        json!([
            "Why WorkspaceX",
            "Book a desk in ten seconds",
            "Pay only for the days you use",
            "Every office in one app"
        ])
    );
    let (status, json) = server
        .json_as(&format!("/v1/objects/{sha}/slides/1"), KEY_A)
        .await;
    assert_eq!(status, 404, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_needs_no_key_and_is_served_self_only() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = keyed_agent_server(data.path(), false).await else {
        return;
    };
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
        ("/ui/icon.svg", "image/svg+xml"),
    ] {
        let response = server.get_as(path, None).await;
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("http"),
            "{csp}"
        );
        let body = response.text().await.unwrap();
        // Nothing from another origin: no external script, style, font or image.
        for external in ["src=\"http", "href=\"http", "url(http", "@import", "//cdn"] {
            assert!(!body.contains(external), "{path} has {external}");
        }
        if path == "/" {
            assert!(body.contains("<script src=\"/ui/app.js\" defer></script>"));
            assert_eq!(body.matches("<script").count(), 1, "no inline script");
            assert!(!body.contains(" style="), "no inline style");
        }
    }
    let response = server.get_as("/ui/secrets.txt", None).await;
    assert_eq!(response.status(), 404);
    // The page needs no key; what it shows does.
    assert_eq!(server.get_as("/v1/agent/runs", None).await.status(), 401);
    // The Host check still guards the UI (DNS rebinding).
    let response = server
        .http
        .get(format!("{}/", server.base))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
}
