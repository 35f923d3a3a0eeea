//! `skillbox skills` through the real binary: skills read from the host, a marketplace
//! archive staged, the workspace projected into a sandbox once (and not again while
//! nothing changed), a skill's script run by name through its projected path on every
//! backend, and skills and scopes in `run` and `agent`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::{BIN, native_or_skip, text, wasm_guests_or_skip, wasm_home};

fn skills(data: &Path, workspace: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--data-dir")
        .arg(data)
        .args(["skills", "--workspace"])
        .arg(workspace)
        .args(args)
        .env("SKILLBOX_WASM_HOME", wasm_home())
        .env_remove("SKILLBOX_USER")
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// A workspace with a `report` skill (a shell script, a Python and a JS one, and a data
/// file they read next to them), a broken skill, and a file of the user's own.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write(
        &ws.join("skills/report/SKILL.md"),
        "---\nname: report\ndescription: >\n  Writes a short report.\n  Use it for reports.\nallowed-tools: Bash\n---\n# report\nRun scripts/run.sh.\n",
    );
    write(
        &ws.join("skills/report/scripts/run.sh"),
        "here=$(dirname \"$0\")\necho \"report from $0: $(cat \"$here/../data.txt\") $*\"\n",
    );
    write(
        &ws.join("skills/report/scripts/total.py"),
        "import os, sys\nhere = os.path.dirname(os.path.abspath(sys.argv[0]))\nprint('total', sys.argv[0], sum(int(a) for a in sys.argv[1:]), open(os.path.join(here, '..', 'data.txt')).read().strip())\n",
    );
    write(
        &ws.join("skills/report/scripts/shout.js"),
        "console.log('shout ' + scriptArgs.slice(1).join(' ').toUpperCase());\n",
    );
    write(&ws.join("skills/report/data.txt"), "42 apples");
    write(&ws.join("skills/broken/SKILL.md"), "---\nname: broken\n");
    write(&ws.join("AGENTS.md"), "# agents\n");
    write(&ws.join("mine.txt"), "not projected");
    dir
}

#[test]
fn skills_are_listed_from_the_host_and_a_bad_one_is_named() {
    let data = tempfile::tempdir().unwrap();
    let ws = workspace();
    let user = data.path().join("users/local/skills/notes");
    write(
        &user.join("SKILL.md"),
        "---\nname: notes\ndescription: Keeps notes.\n---\n",
    );
    let listed = skills(data.path(), ws.path(), &["list", "--json"]);
    let listed = json(&listed);
    let names: Vec<&str> = listed["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["notes", "report"], "{listed}");
    assert_eq!(listed["skills"][1]["projected"], "skills/report");
    assert_eq!(
        listed["skills"][1]["description"],
        "Writes a short report. Use it for reports."
    );
    assert_eq!(listed["skills"][0]["projected"], ".skills-cache/user/notes");
    let errors = listed["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{listed}");
    assert!(
        errors[0].as_str().unwrap().contains(
            "skills/broken/SKILL.md:1: the front matter opened on line 1 is never closed"
        ),
        "{listed}"
    );
    let shown = json(&skills(
        data.path(),
        ws.path(),
        &["show", "report", "--json"],
    ));
    assert_eq!(shown["sandboxDir"], "/workspace/skills/report");
    assert_eq!(
        shown["scripts"],
        serde_json::json!(["scripts/run.sh", "scripts/shout.js", "scripts/total.py"])
    );
    let missing = skills(data.path(), ws.path(), &["show", "nope"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).contains("there are: notes, report"));
}

#[test]
fn a_skill_script_runs_by_name_through_its_projected_path_and_a_staged_one_too() {
    if !native_or_skip("a_skill_script_runs_by_name") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let ws = workspace();
    let ran = skills(
        data.path(),
        ws.path(),
        &["run", "report", "scripts/run.sh", "--", "in", "a box"],
    );
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    assert_eq!(
        text(&ran.stdout),
        "report from /workspace/skills/report/scripts/run.sh: 42 apples in a box\n"
    );
    let ran = json(&skills(
        data.path(),
        ws.path(),
        &[
            "run",
            "report",
            "scripts/total.py",
            "--json",
            "--",
            "1",
            "2",
        ],
    ));
    assert_eq!(
        ran["output"]["stdout"],
        "total /workspace/skills/report/scripts/total.py 3 42 apples\n"
    );
    assert_eq!(
        ran["command"],
        serde_json::json!([
            "python3",
            "/workspace/skills/report/scripts/total.py",
            "1",
            "2"
        ])
    );
    let outside = skills(data.path(), ws.path(), &["run", "report", "../../mine.txt"]);
    assert_eq!(outside.status.code(), Some(2), "{}", text(&outside.stderr));

    // A marketplace archive, staged, then run by name the same way.
    let pack = tempfile::tempdir().unwrap();
    write(
        &pack.path().join("lint/SKILL.md"),
        "---\nname: lint\ndescription: Lints.\n---\n",
    );
    write(
        &pack.path().join("lint/check.py"),
        "import sys\nprint('lint ok', sys.argv[0])\n",
    );
    let archive = pack.path().join("pack.tar.gz");
    let tarred = Command::new("tar")
        .arg("-C")
        .arg(pack.path())
        .args(["-czf"])
        .arg(&archive)
        .arg("lint")
        .output()
        .unwrap();
    assert!(tarred.status.success());
    let staged = json(&skills(
        data.path(),
        ws.path(),
        &["stage", "acme", archive.to_str().unwrap(), "--json"],
    ));
    assert_eq!(staged["skills"], serde_json::json!(["lint"]));
    assert_eq!(staged["written"].as_array().unwrap().len(), 2);
    let again = json(&skills(
        data.path(),
        ws.path(),
        &["stage", "acme", archive.to_str().unwrap(), "--json"],
    ));
    assert_eq!(
        again["written"],
        serde_json::json!([]),
        "a re-stage writes nothing"
    );
    let ran = skills(data.path(), ws.path(), &["run", "lint", "check.py"]);
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    assert_eq!(
        text(&ran.stdout),
        "lint ok /workspace/.skills-cache/acme/lint/check.py\n"
    );
}

/// Issue 38, row 4, as reported: `echo AWS_SECRET=… > .env; ln -s .env AGENTS.md;
/// skillbox skills run …`. The link stays inside the workspace, so it used to be
/// projected as the file it points to, and the sandbox's `/workspace/AGENTS.md` held the
/// secret. A projected root that is a symlink is left out (with a note).
#[test]
fn a_projected_root_linked_to_the_workspace_s_env_file_is_left_out() {
    if !native_or_skip("a_projected_root_linked_to_the_workspace_s_env_file_is_left_out") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let ws = workspace();
    write(
        &ws.path().join(".env"),
        "AWS_SECRET=hunter2-from-the-host\n",
    );
    std::fs::remove_file(ws.path().join("AGENTS.md")).unwrap();
    std::os::unix::fs::symlink(".env", ws.path().join("AGENTS.md")).unwrap();
    write(
        &ws.path().join("skills/report/scripts/agents.sh"),
        "cat /workspace/AGENTS.md 2>/dev/null || echo 'no AGENTS.md'\n",
    );
    let ran = skills(
        data.path(),
        ws.path(),
        &["run", "report", "scripts/agents.sh"],
    );
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    assert!(
        !text(&ran.stdout).contains("hunter2"),
        "{}",
        text(&ran.stdout)
    );
    assert_eq!(text(&ran.stdout), "no AGENTS.md\n");
    let projected = project_into(data.path(), ws.path(), ordinary_workdir().path());
    assert!(
        projected["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .ends_with("AGENTS.md: a projected root that is a symlink; left out")),
        "{projected}"
    );
}

/// A kept workdir for projections: as root, it must belong to an ordinary user (the
/// sandbox runs as it).
fn ordinary_workdir() -> tempfile::TempDir {
    let workdir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(workdir.path(), Some(65534), Some(65534)).unwrap();
    workdir
}

/// `skills project --workdir WORKDIR --json` of the skills workspace `ws`: its report.
fn project_into(data: &Path, ws: &Path, workdir: &Path) -> Value {
    json(&skills(
        data,
        ws,
        &["project", "--workdir", workdir.to_str().unwrap(), "--json"],
    ))
}

/// The marker of what was projected is the run's to write: whatever a run left there in
/// place of it (bytes that are not text, a file of 64 MiB, a FIFO) is no fingerprint,
/// read no further than one could be, and the skills are projected again over it.
#[test]
fn a_marker_a_run_replaced_is_read_no_further_than_a_fingerprint() {
    if !native_or_skip("a_marker_a_run_replaced_is_read_no_further_than_a_fingerprint") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let ws = workspace();
    let workdir = ordinary_workdir();
    let project = || project_into(data.path(), ws.path(), workdir.path());
    let first = project();
    assert_eq!(first["copied"], true, "{first}");
    let marker = workdir.path().join(".skillbox/projection");
    assert!(marker.is_file());
    for what in ["bytes that are not text", "a file of 64 MiB", "a FIFO"] {
        std::fs::remove_file(&marker).unwrap();
        match what {
            "bytes that are not text" => std::fs::write(&marker, b"\xff\xfe not utf-8").unwrap(),
            "a file of 64 MiB" => std::fs::write(&marker, vec![b'a'; 64 << 20]).unwrap(),
            _ => {
                let path = std::ffi::CString::new(marker.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: mkfifo(3) of a path this test names.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
            }
        }
        let again = project();
        assert_eq!(again["copied"], true, "{what}: {again}");
        assert_eq!(again["fingerprint"], first["fingerprint"], "{what}");
        assert_eq!(
            std::fs::read_to_string(&marker).unwrap().trim(),
            first["fingerprint"].as_str().unwrap(),
            "{what}"
        );
    }
}

/// Projected into a kept workdir twice: the second time nothing is copied; a changed
/// skill file is copied again; what the workdir holds besides is never touched.
#[test]
fn an_unchanged_projection_copies_nothing_and_a_changed_one_only_the_tree() {
    if !native_or_skip("an_unchanged_projection_copies_nothing") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let ws = workspace();
    let workdir = ordinary_workdir();
    write(&workdir.path().join("results.txt"), "the run's own");
    let project = || project_into(data.path(), ws.path(), workdir.path());
    let first = project();
    assert_eq!(first["copied"], true, "{first}");
    assert_eq!(first["files"], 7, "{first}");
    let run_sh = workdir.path().join("skills/report/scripts/run.sh");
    assert_eq!(
        std::fs::read_to_string(&run_sh).unwrap(),
        std::fs::read_to_string(ws.path().join("skills/report/scripts/run.sh")).unwrap()
    );
    assert!(workdir.path().join("AGENTS.md").is_file());
    assert!(
        !workdir.path().join("mine.txt").exists(),
        "only the configured roots"
    );
    let second = project();
    assert_eq!(second["copied"], false, "{second}");
    assert_eq!(second["fingerprint"], first["fingerprint"]);

    write(&ws.path().join("skills/report/data.txt"), "43 apples");
    // The run changed a projected file and made one of its own: the skill's own wins,
    // the run's file stays.
    write(
        &workdir.path().join("skills/report/scripts/run.sh"),
        "edited by the run",
    );
    write(
        &workdir.path().join("skills/report/made-by-run.txt"),
        "mine",
    );
    let third = project();
    assert_eq!(third["copied"], true, "{third}");
    assert_ne!(third["fingerprint"], first["fingerprint"]);
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("skills/report/data.txt")).unwrap(),
        "43 apples"
    );
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("results.txt")).unwrap(),
        "the run's own"
    );
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("skills/report/made-by-run.txt")).unwrap(),
        "mine"
    );
}

/// The same script, by name, in every other sandbox: docker, gvisor (shell and Python)
/// and wasm (Python and JavaScript guests).
#[test]
fn a_skill_script_runs_by_name_on_docker_gvisor_and_wasm() {
    let data = tempfile::tempdir().unwrap();
    let ws = workspace();
    for backend in ["docker", "gvisor"] {
        if !common::backend_or_skip(backend, "a_skill_script_runs_by_name_on_containers") {
            continue;
        }
        let ran = skills(
            data.path(),
            ws.path(),
            &[
                "run",
                "report",
                "scripts/run.sh",
                "--backend",
                backend,
                "--",
                "x",
            ],
        );
        assert!(ran.status.success(), "{backend}: {}", text(&ran.stderr));
        assert_eq!(
            text(&ran.stdout),
            "report from /workspace/skills/report/scripts/run.sh: 42 apples x\n",
            "{backend}"
        );
        let ran = skills(
            data.path(),
            ws.path(),
            &[
                "run",
                "report",
                "scripts/total.py",
                "--backend",
                backend,
                "--",
                "5",
                "6",
            ],
        );
        assert!(ran.status.success(), "{backend}: {}", text(&ran.stderr));
        assert_eq!(
            text(&ran.stdout),
            "total /workspace/skills/report/scripts/total.py 11 42 apples\n",
            "{backend}"
        );
    }
    if wasm_guests_or_skip("a_skill_script_runs_by_name_on_wasm") {
        let ran = skills(
            data.path(),
            ws.path(),
            &[
                "run",
                "report",
                "scripts/total.py",
                "--backend",
                "wasm",
                "--",
                "7",
                "8",
            ],
        );
        assert!(ran.status.success(), "wasm: {}", text(&ran.stderr));
        assert_eq!(
            text(&ran.stdout),
            "total /workspace/skills/report/scripts/total.py 15 42 apples\n"
        );
        let ran = skills(
            data.path(),
            ws.path(),
            &[
                "run",
                "report",
                "scripts/shout.js",
                "--backend",
                "wasm",
                "--",
                "hi",
                "there",
            ],
        );
        assert!(ran.status.success(), "wasm: {}", text(&ran.stderr));
        assert_eq!(text(&ran.stdout), "shout HI THERE\n");
    }
}

/// `skillbox run --skill --scope`: the skill is placed at its path, the scope's last
/// workspace comes back first (what the run "installed" stays), changed skill code wins
/// over the restored copy, an unchanged one is not copied again, and restored files that
/// the run leaves as they were do not come back as its outputs.
#[test]
fn runs_use_skills_and_start_from_their_scopes_snapshot() {
    if !native_or_skip("runs_use_skills_and_start_from_their_scopes_snapshot") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let ws = workspace();
    let script = ws.path().join("use.py");
    write(
        &script,
        "import os, subprocess, sys\n\
         out = subprocess.run([sys.executable, '/workspace/skills/report/scripts/total.py', '1', '2'], capture_output=True, text=True)\n\
         print(out.stdout.strip() or out.stderr)\n\
         p = '/workspace/deps/installed.txt'\n\
         print('had', open(p).read() if os.path.exists(p) else 'nothing')\n\
         os.makedirs('/workspace/deps', exist_ok=True)\n\
         open(p, 'w').write('pkg 1.0')\n",
    );
    let run = |scope: &str| {
        let out = Command::new(BIN)
            .arg("--data-dir")
            .arg(data.path())
            .args([
                "run",
                script.to_str().unwrap(),
                "--skill",
                "report",
                "--scope",
                scope,
                "--json",
            ])
            .current_dir(ws.path())
            .output()
            .unwrap();
        json(&out)
    };
    let first = run("build");
    assert_eq!(
        first["stdout"],
        "total /workspace/skills/report/scripts/total.py 3 42 apples\nhad nothing\n",
        "{first}"
    );
    assert_eq!(
        first["skills"]["skills"][0]["path"],
        "/workspace/skills/report"
    );
    assert_eq!(first["skills"]["copied"], true);
    assert!(first["snapshot"].get("restored").is_none(), "{first}");
    let saved = first["snapshot"]["saved"].as_str().unwrap().to_string();
    let files: Vec<&str> = first["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        ["deps/installed.txt"],
        "skill files are inputs, not outputs: {first}"
    );

    write(&ws.path().join("skills/report/data.txt"), "43 apples");
    let second = run("build");
    assert_eq!(
        second["stdout"],
        "total /workspace/skills/report/scripts/total.py 3 43 apples\nhad pkg 1.0\n",
        "{second}"
    );
    assert_eq!(second["snapshot"]["restored"], saved.as_str());
    assert_eq!(
        second["skills"]["copied"], true,
        "the changed skill is placed over the restored one"
    );
    assert_eq!(
        second["files"],
        serde_json::json!([]),
        "restored and unchanged: no output"
    );

    let third = run("build");
    assert_eq!(
        third["skills"]["copied"], false,
        "the restored workspace had this very skill"
    );
    assert_eq!(
        third["stdout"].as_str().unwrap().lines().nth(1),
        Some("had pkg 1.0")
    );

    let other = run("another");
    assert_eq!(
        other["stdout"].as_str().unwrap().lines().nth(1),
        Some("had nothing")
    );
    assert!(other["snapshot"].get("restored").is_none());

    let missing = Command::new(BIN)
        .arg("--data-dir")
        .arg(data.path())
        .args(["run", script.to_str().unwrap(), "--skill", "nope"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("skills[0]: no skill nope (there are: report)"),
        "{}",
        text(&missing.stderr)
    );
}

/// `skillbox agent --skill --scope --workspace`: the skill is placed, the model runs its
/// script by name (`run_skill`) and the deck it makes comes back (no file of the skill's
/// own does); a second run with the same scope, from the workspace itself (the default
/// `--workspace`), sees what the first left; a name that is not there, or a bad key, is
/// bad usage.
#[test]
fn agent_runs_use_skills_by_name_and_keep_their_scope() {
    if !native_or_skip("agent_runs_use_skills_by_name_and_keep_their_scope") {
        return;
    }
    // Where the CLI tests keep the Node runtime, installed once.
    let data = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-cli-tests");
    let ws = workspace();
    write(
        &ws.path().join("skills/deck/SKILL.md"),
        "---\nname: deck\ndescription: Makes a one-slide deck titled by its arguments.\n---\nRun scripts/make.js TITLE.\n",
    );
    write(
        &ws.path().join("skills/deck/scripts/make.js"),
        "const pptxgen = require(\"pptxgenjs\");\nconst pres = new pptxgen();\npres.addSlide().addText(process.argv.slice(2).join(\" \"), { x: 0.5, y: 0.5, w: 9, h: 1, fontSize: 32 });\npres.writeFile({ fileName: \"/workspace/deck.pptx\" }).then((name) => console.log(\"wrote \" + name));\n",
    );
    let key = format!("cli-{}", ws.path().file_name().unwrap().to_str().unwrap());
    let elsewhere = tempfile::tempdir().unwrap();
    let agent = |turns: Value, cwd: &Path, extra: &[&str]| {
        let transcript = elsewhere.path().join("transcript.json");
        std::fs::write(&transcript, serde_json::json!({"turns": turns}).to_string()).unwrap();
        Command::new(BIN)
            .arg("--data-dir")
            .arg(&data)
            .args(["agent", "Make a deck", "--transcript"])
            .arg(&transcript)
            .args(["--skill", "deck", "--scope", &key, "--json"])
            .args(extra)
            .current_dir(cwd)
            .env_remove("SKILLBOX_USER")
            .output()
            .unwrap()
    };
    let deck = |title: &str| serde_json::json!({"name": "run_skill", "arguments": {"skill": "deck", "script": "scripts/make.js", "args": [title]}});

    let first = agent(
        serde_json::json!([
            {"toolCalls": [deck("First"), {"name": "run_script", "arguments": {"language": "sh", "script": "echo kept > stamp.txt"}}]},
            {"expect": {"exitCode": 0, "filesInclude": "stamp.txt"}, "text": "Made deck.pptx."}
        ]),
        elsewhere.path(),
        &["--workspace", ws.path().to_str().unwrap()],
    );
    let first = json(&first);
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(
        first["placed"]["skills"],
        serde_json::json!([{"name": "deck", "path": "/workspace/skills/deck"}]),
        "{first}"
    );
    assert_eq!(
        first["attempts"][0]["script"],
        "# run_skill deck scripts/make.js\nnode /workspace/skills/deck/scripts/make.js First\n",
        "{first}"
    );
    let mut made: Vec<&str> = first["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    made.sort();
    assert_eq!(made, ["deck.pptx", "stamp.txt"], "{first}");
    let saved = first["snapshot"]["saved"].as_str().unwrap().to_string();

    let second = agent(
        serde_json::json!([
            {"toolCalls": [deck("Second"), {"name": "run_script", "arguments": {"language": "sh", "script": "cat stamp.txt"}}]},
            {"expect": {"exitCode": 0, "resultContains": "kept"}, "text": "Made it again."}
        ]),
        ws.path(),
        &[],
    );
    let second = json(&second);
    assert_eq!(second["status"], "succeeded", "{second}");
    assert_eq!(second["snapshot"]["restored"], saved.as_str(), "{second}");
    assert_eq!(second["attempts"][1]["stdout"], "kept\n", "{second}");
    let made: Vec<&str> = second["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        made,
        ["deck.pptx"],
        "the restored stamp.txt is an input: {second}"
    );

    for (args, needle) in [
        (
            vec!["--skill", "nope"],
            "skills[0]: no skill nope (there are: deck, report)",
        ),
        (vec!["--scope", "has space"], "--scope"),
        (vec!["--builtin", "excel"], "--builtin excel"),
    ] {
        let out = Command::new(BIN)
            .arg("--data-dir")
            .arg(&data)
            .args(["agent", "x"])
            .args(&args)
            .current_dir(ws.path())
            .env_remove("SKILLBOX_USER")
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
