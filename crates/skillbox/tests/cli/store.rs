//! `skillbox serve --store s3://…` as the real binary against a real S3 server (moto's,
//! installed by scripts/test.sh): a run's files and a scope's snapshot go to the bucket,
//! not the data dir, and come back from it; a bucket that is not there stops the server
//! at its start with the reason.

use std::path::Path;
use std::process::Command;

use skillbox_env::testkit::s3::MotoServer;

use super::common::{BIN, Serving, native_or_skip, skillbox, text};
use super::shared_data_dir;

fn moto(test: &str) -> Option<MotoServer> {
    MotoServer::start(test, Path::new(env!("CARGO_TARGET_TMPDIR")))
}

/// `skillbox serve --store URL` on the shared data dir, with moto's variables.
fn serve_on(moto: &MotoServer, store: &str) -> (std::process::Child, String) {
    let mut command = Command::new(BIN);
    command.arg("--data-dir").arg(shared_data_dir());
    command.envs(moto.aws_env());
    super::common::start_serve(command, &["--store", store])
}

#[test]
fn a_run_s_files_and_its_scope_s_snapshot_live_in_the_bucket() {
    let test = "a_run_s_files_and_its_scope_s_snapshot_live_in_the_bucket";
    if !native_or_skip(test) {
        return;
    }
    let Some(moto) = moto(test) else { return };
    moto.create_bucket("skillbox");
    let (server, addr) = serve_on(&moto, "s3://skillbox/node-a");
    let server = Serving(server);
    let url = format!("http://{addr}");
    // New bytes and a new scope each time: the shared data dir's snapshot index
    // remembers scopes of earlier runs, whose objects were in an earlier moto.
    let nonce = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let scope = format!("s3-test-{nonce}");
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("make.sh");
    std::fs::write(
        &script,
        format!(
            "printf 'made %s\\n' {nonce} > report.txt\nprintf 'kept %s\\n' {nonce} > note.txt\n"
        ),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let client_data = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--remote", &url, "--scope", &scope, "--json"]);
        skillbox(client_data.path(), &all)
    };
    let first = run(&[
        script.to_str().unwrap(),
        "--out",
        out.path().to_str().unwrap(),
        "--outputs",
        "report.txt",
    ]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let report = format!("made {nonce}\n");
    assert_eq!(
        std::fs::read_to_string(out.path().join("report.txt")).unwrap(),
        report,
        "the file came back through the server from the bucket"
    );
    let sha256 = skillbox_store::sha256_hex(report.as_bytes());
    let key = format!("node-a/objects/{}/{sha256}", &sha256[..2]);
    assert_eq!(
        moto.get("skillbox", &key).as_deref(),
        Some(report.as_bytes()),
        "the object is in the bucket under the prefix"
    );
    assert!(
        !shared_data_dir()
            .join("objects/objects")
            .join(&sha256[..2])
            .join(&sha256)
            .exists(),
        "nothing went to the data dir's store"
    );
    // The scope's snapshot (the files and their manifest) went to the bucket too.
    let keys = moto.keys("skillbox", "node-a/");
    assert!(keys.len() >= 3, "report, note and a manifest: {keys:?}");

    // The next run of the scope starts from that snapshot, restored from the bucket;
    // the server's AWS keys are its own, never in a sandbox's environment.
    let reader = work.path().join("read.sh");
    std::fs::write(&reader, "cat note.txt\nenv\n").unwrap();
    let second = run(&[reader.to_str().unwrap()]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    let stdout = answer["stdout"].as_str().unwrap_or_default();
    assert!(stdout.starts_with(&format!("kept {nonce}\n")), "{answer}");
    assert!(
        !stdout.contains("AWS_") && !stdout.contains("skillbox-test-secret"),
        "the server's S3 credentials reached the sandbox: {stdout}"
    );
    let status = server.stop();
    assert!(status.success(), "serve should stop cleanly: {status:?}");
}

#[test]
fn serve_with_a_bucket_that_is_not_there_stops_at_its_start_saying_why() {
    let test = "serve_with_a_bucket_that_is_not_there_stops_at_its_start_saying_why";
    let Some(moto) = moto(test) else { return };
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(shared_data_dir())
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--store",
            "s3://no-such-bucket/p",
        ])
        .envs(moto.aws_env())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("s3://no-such-bucket/p") && stderr.contains("AWS_ENDPOINT_URL"),
        "{stderr}"
    );
}
