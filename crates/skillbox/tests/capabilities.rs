//! `skillbox cap run` through the real binary: the examples run as declared, only after
//! a grant, in exactly their environment, and hand back only what they may write.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::{BIN, example, native_or_skip, text};

fn data_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-cap-tests")
}

/// `skillbox cap …` on the examples, in `project`, with `env` set.
fn cap(data: &Path, project: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .arg("--data-dir")
        .arg(data)
        .args(["cap", "--project"])
        .arg(project)
        .arg("--root")
        .arg(example("capabilities"))
        .args(args)
        .env("SKILLBOX_WASM_HOME", common::wasm_home())
        .current_dir(project);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

#[test]
fn a_native_capability_runs_only_granted_and_hands_back_what_it_may_write() {
    if !native_or_skip("a_native_capability_runs_only_granted") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let notes = project.path().join("notes.txt");
    std::fs::write(&notes, "the cat and the dog and the cat\n").unwrap();
    let out = project.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let run = |data: &Path| {
        cap(
            data,
            project.path(),
            &[
                "run",
                "word-count",
                "--input",
                notes.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--json",
            ],
            &[],
        )
    };
    let refused = run(data.path());
    assert_eq!(refused.status.code(), Some(125));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("permission_denied") && stderr.contains("skillbox cap grant word-count"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "it ran ungranted"
    );

    assert!(
        cap(data.path(), project.path(), &["grant", "word-count"], &[])
            .status
            .success()
    );
    let ran = run(data.path());
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    let json: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(json["grant"], "project");
    // Only the file its write_file permission names comes back: not the input.
    let files: Vec<&str> = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["word-count.json"], "{json}");
    let counted: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("word-count.json")).unwrap())
            .unwrap();
    assert_eq!(counted[0], serde_json::json!({"word": "the", "count": 3}));
    // It ran in the sandbox: the capability dir read-only, no network.
    assert!(json["output"]["exitCode"] == 0, "{json}");
}

#[test]
fn a_host_capability_runs_once_per_once_grant() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let done = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(project.path())
            .env("HOME", project.path())
            .output()
            .unwrap();
        assert!(done.status.success(), "{}", text(&done.stderr));
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "the first commit"]);
    let refused = cap(data.path(), project.path(), &["grant", "git-report"], &[]);
    assert_eq!(refused.status.code(), Some(2), "no project grant for host");
    assert!(
        cap(
            data.path(),
            project.path(),
            &["grant", "git-report", "--scope", "once"],
            &[]
        )
        .status
        .success()
    );
    let ran = cap(
        data.path(),
        project.path(),
        &["run", "git-report"],
        &[("HOME", project.path().to_str().unwrap())],
    );
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    assert!(
        text(&ran.stdout).contains("the first commit"),
        "{}",
        text(&ran.stdout)
    );
    let again = cap(data.path(), project.path(), &["run", "git-report"], &[]);
    assert_eq!(again.status.code(), Some(125), "a once grant ran twice");
}

/// The docker example runs in docker; with no daemon it is `unavailable`, never a
/// native run instead.
#[test]
fn a_docker_capability_runs_in_docker_or_not_at_all() {
    let data = data_dir();
    std::fs::create_dir_all(&data).unwrap();
    let project = tempfile::tempdir().unwrap();
    let csv = project.path().join("sales.csv");
    std::fs::write(&csv, "region,amount\nnorth,10\nsouth,30\n").unwrap();
    let out = project.path().join("out");
    std::fs::create_dir(&out).unwrap();
    assert!(
        cap(&data, project.path(), &["grant", "csv-summary"], &[])
            .status
            .success()
    );
    let args = [
        "run",
        "csv-summary",
        "--input",
        csv.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let nowhere = format!("unix://{}/no-daemon.sock", project.path().display());
    let down = cap(&data, project.path(), &args, &[("DOCKER_HOST", &nowhere)]);
    assert_eq!(down.status.code(), Some(125), "{}", text(&down.stderr));
    assert!(
        text(&down.stderr).contains("unavailable"),
        "{}",
        text(&down.stderr)
    );
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "it ran somewhere else"
    );

    let doctor = Command::new(BIN)
        .arg("--data-dir")
        .arg(&data)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let docker = report["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "docker")
        .unwrap();
    if docker["available"] != true {
        skillbox_env::testkit::skip(
            "a_docker_capability_runs_in_docker",
            docker["reason"].as_str().unwrap_or(""),
        );
        return;
    }
    let ran = cap(&data, project.path(), &args, &[]);
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["sales.csv"]["rows"], 2, "{summary}");
    assert_eq!(summary["sales.csv"]["means"]["amount"], 20.0, "{summary}");
}

/// The wasm examples: a Python word count (oneshot) and a JavaScript transform
/// (ondemand, stdin and arguments from the call), each a WASI guest.
#[test]
fn wasm_capabilities_run_python_and_javascript_guests() {
    if !common::wasm_guests_or_skip("wasm_capabilities") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let notes = project.path().join("notes.txt");
    std::fs::write(&notes, "the cat and the dog and the cat\n").unwrap();
    let out = project.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for name in ["wasm-word-count", "json-transform"] {
        let granted = cap(data.path(), project.path(), &["grant", name], &[]);
        assert!(granted.status.success(), "{}", text(&granted.stderr));
        assert!(
            text(&granted.stderr).contains("run_capability:wasm"),
            "{}",
            text(&granted.stderr)
        );
    }
    let counted = cap(
        data.path(),
        project.path(),
        &[
            "run",
            "wasm-word-count",
            "--input",
            notes.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(counted.status.success(), "{}", text(&counted.stderr));
    let totals: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("word-totals.json")).unwrap())
            .unwrap();
    assert_eq!(
        totals["notes.txt"],
        serde_json::json!({"words": 8, "distinct": 4})
    );

    let rows = project.path().join("rows.json");
    std::fs::write(
        &rows,
        r#"[{"name":"a","price":3,"secret":1},{"name":"b","price":4}]"#,
    )
    .unwrap();
    let transformed = cap(
        data.path(),
        project.path(),
        &[
            "run",
            "json-transform",
            "--stdin",
            rows.to_str().unwrap(),
            "--json",
            "--",
            "name",
            "price",
        ],
        &[],
    );
    assert!(
        transformed.status.success(),
        "{}",
        text(&transformed.stderr)
    );
    let json: Value = serde_json::from_slice(&transformed.stdout).unwrap();
    assert_eq!(
        json["output"]["stdout"], "[{\"name\":\"a\",\"price\":3},{\"name\":\"b\",\"price\":4}]\n",
        "{json}"
    );
    assert_eq!(json["files"][0]["path"], "transformed.json", "{json}");
    // Bad input is the capability's own error, fed back as its exit code and stderr.
    std::fs::write(&rows, "{not json").unwrap();
    let bad = cap(
        data.path(),
        project.path(),
        &[
            "run",
            "json-transform",
            "--stdin",
            rows.to_str().unwrap(),
            "--json",
            "--",
            "name",
        ],
        &[],
    );
    let json: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(json["output"]["exitCode"], 1, "{json}");
    assert!(
        json["output"]["stderr"]
            .as_str()
            .unwrap()
            .contains("stdin is not JSON"),
        "{json}"
    );
}

/// The ondemand native formatter: a fresh process per call, its stdin from the call.
#[test]
fn an_ondemand_formatter_gets_a_fresh_process_per_call() {
    if !native_or_skip("an_ondemand_formatter") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    assert!(
        cap(data.path(), project.path(), &["grant", "fmt-json"], &[])
            .status
            .success()
    );
    let doc = project.path().join("doc.json");
    for (input, expected) in [
        (
            r#"{"b":1,"a":[1,2]}"#,
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}\n",
        ),
        (r#"{"z":null}"#, "{\n  \"z\": null\n}\n"),
    ] {
        std::fs::write(&doc, input).unwrap();
        let ran = cap(
            data.path(),
            project.path(),
            &[
                "run",
                "fmt-json",
                "--stdin",
                doc.to_str().unwrap(),
                "--json",
            ],
            &[],
        );
        assert!(ran.status.success(), "{}", text(&ran.stderr));
        let json: Value = serde_json::from_slice(&ran.stdout).unwrap();
        assert_eq!(json["output"]["stdout"], expected, "{json}");
    }
}
