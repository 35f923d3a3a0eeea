//! The copy-out door, attacked for real: sandboxed scripts that try to reach the host
//! through `--out DIR` (a git hook in a checkout, an overwritten file, a planted symlink,
//! a dotfile, an exec or setuid bit), each run by the real binary, with the host checked
//! afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use common::{BIN, native_or_skip, text};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-door-tests")
}

/// `skillbox run SCRIPT ARGS…` from `cwd`, the script written to a file outside it.
fn run_in(cwd: &Path, name: &str, script: &str, args: &[&str]) -> Output {
    let scripts = tempfile::tempdir().unwrap();
    let file = scripts.path().join(name);
    std::fs::write(&file, script).unwrap();
    Command::new(BIN)
        .arg("--data-dir")
        .arg(data_dir())
        .arg("run")
        .arg(&file)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// Every path under `dir`, relative, sorted (symlinks listed, not followed).
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, into: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            into.push(path.strip_prefix(root).unwrap().display().to_string());
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                walk(root, &path, into);
            }
        }
    }
    let mut all = Vec::new();
    walk(dir, dir, &mut all);
    all.sort();
    all
}

fn git(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    out
}

/// The attack from the issue: in a git checkout, `skillbox run x.py --out .` with a
/// script that writes `.git/config` with a `core.fsmonitor` command and overwrites a
/// tracked file. Neither reaches the checkout, the next `git status` runs nothing, and
/// the script's other file still arrives.
#[test]
fn run_out_in_a_git_checkout_cannot_plant_a_hook_or_overwrite_a_tracked_file() {
    if !native_or_skip("run_out_in_a_git_checkout") {
        return;
    }
    let checkout = tempfile::tempdir().unwrap();
    let repo = checkout.path();
    git(repo, &["init", "-q"]);
    std::fs::write(repo.join("README.md"), "mine\n").unwrap();
    git(repo, &["add", "README.md"]);
    git(repo, &["commit", "-qm", "init"]);
    let config_before = std::fs::read(repo.join(".git/config")).unwrap();
    let marker = repo.join("HOOK-RAN");
    let script = format!(
        r#"import os
os.makedirs(".git", exist_ok=True)
with open(".git/config", "w") as f:
    f.write('[core]\n\tfsmonitor = "touch {marker}; false"\n')
with open("README.md", "w") as f:
    f.write("pwned\n")
with open(".envrc", "w") as f:
    f.write("touch {marker}\n")
with open("report.txt", "w") as f:
    f.write("the real output\n")
"#,
        marker = marker.display()
    );
    let out = run_in(repo, "x.py", &script, &["--out", "."]);
    let stderr = text(&out.stderr);
    // The tracked file was not replaced, and that is an error that names it.
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("README.md exists; not overwritten") && stderr.contains("--overwrite"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "mine\n"
    );
    // Only what was written is said to be made: not the file that was kept.
    let made: Vec<&str> = stderr.lines().filter(|l| l.contains(": made ")).collect();
    assert!(
        made.len() == 1 && made[0].contains("report.txt"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(repo.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!repo.join(".envrc").exists());
    assert_eq!(
        std::fs::read_to_string(repo.join("report.txt")).unwrap(),
        "the real output\n"
    );
    assert!(
        !tree(repo).iter().any(|p| p.contains("skillbox-partial")),
        "{:?}",
        tree(repo)
    );
    let status = git(repo, &["status", "--porcelain"]);
    assert!(!marker.exists(), "a hook ran on git status");
    assert_eq!(text(&status.stdout), "?? report.txt\n");

    // --overwrite replaces the file the user allowed, and still no hidden path.
    std::fs::remove_file(repo.join("report.txt")).unwrap();
    let out = run_in(repo, "x.py", &script, &["--out", ".", "--overwrite"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "pwned\n"
    );
    assert_eq!(
        std::fs::read(repo.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!repo.join(".envrc").exists());

    // A hidden file comes out only when asked for by a glob that spells its dot, and
    // then only what the globs select.
    let fresh = tempfile::tempdir().unwrap();
    let out = run_in(
        fresh.path(),
        "x.py",
        &script,
        &["--out", ".", "--outputs", ".envrc"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(tree(fresh.path()), [".envrc"]);
    git(repo, &["status", "--porcelain"]);
    assert!(!marker.exists(), "a hook ran on git status");
}

/// A symlink planted in the output directory (by anyone) is refused, never followed:
/// nothing lands where it points, and the script's other files are still written.
#[test]
fn run_out_refuses_a_symlink_planted_in_the_output_dir() {
    if !native_or_skip("run_out_refuses_a_symlink") {
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), out_dir.path().join("deck")).unwrap();
    std::os::unix::fs::symlink(
        elsewhere.path().join("victim"),
        out_dir.path().join("victim"),
    )
    .unwrap();
    let script =
        "mkdir -p deck && echo x > deck/slides.txt && echo v > victim && echo ok > top.txt";
    let out = run_in(
        out_dir.path(),
        "x.sh",
        script,
        &["--out", out_dir.path().to_str().unwrap()],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("is a symlink"), "{stderr}");
    assert!(stderr.contains("victim exists"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).unwrap().count(),
        0,
        "something was written through the symlink"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("top.txt")).unwrap(),
        "ok\n"
    );
    // --overwrite replaces the link itself, never what it points to.
    let out = run_in(
        out_dir.path(),
        "x.sh",
        "echo v > victim",
        &["--out", ".", "--overwrite"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    let victim = out_dir.path().join("victim");
    assert!(!std::fs::symlink_metadata(&victim).unwrap().is_symlink());
}

/// Whatever mode bits the sandbox gave a file, it comes out 0644 (and its directory
/// 0755): no exec, setuid, setgid or sticky bit reaches the host.
#[test]
fn run_out_writes_plain_modes_whatever_the_sandbox_set() {
    if !native_or_skip("run_out_writes_plain_modes") {
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let script = "mkdir -m 1777 bin && printf '#!/bin/sh\\necho owned\\n' > bin/tool && \
                  chmod 0755 bin/tool && { chmod 6755 bin/tool 2>/dev/null; true; } && \
                  ls -l bin/tool";
    let out = run_in(out_dir.path(), "x.sh", script, &["--out", "."]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("-rwx"),
        "the sandbox did set an exec bit: {}",
        text(&out.stdout)
    );
    let mode = |p: &str| {
        std::fs::metadata(out_dir.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("bin/tool") & !0o644, 0, "mode {:o}", mode("bin/tool"));
    assert_eq!(mode("bin") & !0o755, 0, "mode {:o}", mode("bin"));
}

/// `skillbox agent --out DIR` goes through the same door: an existing deck is kept, the
/// error names it, and the exit status says the deck was not delivered.
#[test]
fn agent_out_keeps_an_existing_file() {
    if !native_or_skip("agent_out_keeps_an_existing_file") {
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    std::fs::write(out_dir.path().join("workspacex.pptx"), "mine").unwrap();
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(data_dir())
        .args([
            "agent",
            "Make a 3-slide pitch deck for WorkspaceX.",
            "--out",
        ])
        .arg(out_dir.path())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("workspacex.pptx exists"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("workspacex.pptx")).unwrap(),
        "mine"
    );
    assert_eq!(tree(out_dir.path()), ["workspacex.pptx"]);
}
