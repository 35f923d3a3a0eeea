//! The copy-out door, attacked for real: sandboxed scripts that try to reach the host
//! through `--out DIR` (a git hook in a checkout, an overwritten file, a planted symlink,
//! a dotfile, an exec or setuid bit), each run by the real binary, with the host checked
//! afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use common::{BIN, assert_workspacex_deck, native_or_skip, text};

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

/// Files a sandboxed script plants for host tools to act on once copied out, and the
/// host commands that would act on them. Each payload is live: [`Attack::assert_live`]
/// plants it by hand and sees every command run it.
///
/// - a directory git opens as a repository (`src/HEAD`, `src/config` with a
///   `core.fsmonitor` command and `worktree = .`, `src/objects/`, `src/refs/`): run by
///   `cd src && git status`, also inside a checkout;
/// - an unchecked-hash `__pycache__/utils.cpython-311.pyc` beside the host's `utils.py`:
///   run by `python3 main.py`;
/// - `--checkpoint=1` and `--checkpoint-action=exec=sh x.sh`: run by `tar cf x.tar *`.
struct Attack {
    markers: tempfile::TempDir,
    files: Vec<(String, Vec<u8>)>,
}

impl Attack {
    fn new() -> Attack {
        let markers = tempfile::tempdir().unwrap();
        let marker = |name: &str| markers.path().join(name).display().to_string();
        let config = format!(
            "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n\tfsmonitor = \"touch {}; false\"\n",
            marker("git")
        );
        let pyc = {
            let dir = tempfile::tempdir().unwrap();
            let source = dir.path().join("utils.py");
            std::fs::write(
                &source,
                format!("open({:?}, 'w').close()\n", marker("python")),
            )
            .unwrap();
            let compiled = dir.path().join("utils.pyc");
            let out = Command::new("/usr/bin/python3")
                .args([
                    "-c",
                    "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], \
                     invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)",
                ])
                .arg(&source)
                .arg(&compiled)
                .output()
                .unwrap();
            assert!(out.status.success(), "py_compile: {}", text(&out.stderr));
            std::fs::read(compiled).unwrap()
        };
        let files = vec![
            ("src/HEAD".into(), b"ref: refs/heads/main\n".to_vec()),
            ("src/config".into(), config.into_bytes()),
            ("src/objects/info/packs".into(), b"\n".to_vec()),
            ("src/refs/heads/x".into(), Vec::new()),
            ("__pycache__/utils.cpython-311.pyc".into(), pyc),
            ("--checkpoint=1".into(), Vec::new()),
            ("--checkpoint-action=exec=sh x.sh".into(), Vec::new()),
            (
                "x.sh".into(),
                format!("touch {}\n", marker("tar")).into_bytes(),
            ),
            ("report.txt".into(), b"the real output\n".to_vec()),
        ];
        Attack { markers, files }
    }

    /// A shell script that writes every file.
    fn sh_script(&self) -> String {
        use base64::Engine;
        self.files
            .iter()
            .map(|(path, bytes)| {
                format!(
                    "mkdir -p -- \"$(dirname -- '{path}')\" && printf '%s' '{}' | base64 -d > '{path}'\n",
                    base64::engine::general_purpose::STANDARD.encode(bytes)
                )
            })
            .collect()
    }

    /// A node script that writes every file and the demo deck (so an agent's run
    /// succeeds, with a verified artifact).
    fn node_script(&self) -> String {
        use base64::Engine;
        let files: serde_json::Map<String, serde_json::Value> = self
            .files
            .iter()
            .map(|(path, bytes)| {
                (
                    path.clone(),
                    base64::engine::general_purpose::STANDARD
                        .encode(bytes)
                        .into(),
                )
            })
            .collect();
        format!(
            "const fs = require('fs'), path = require('path');\n\
             const files = {};\n\
             for (const [p, b] of Object.entries(files)) {{\n\
               fs.mkdirSync(path.dirname(p), {{ recursive: true }});\n\
               fs.writeFileSync(p, Buffer.from(b, 'base64'));\n\
             }}\n{}",
            serde_json::Value::Object(files),
            std::fs::read_to_string(common::example("workspacex-deck.js")).unwrap()
        )
    }

    /// A directory as a user has it: a `src/` of their own, a `main.py` that imports
    /// their `utils.py`; inside a git checkout when `checkout`.
    fn victim(checkout: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if checkout {
            git(dir.path(), &["init", "-q"]);
        }
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/lib.c"), "int x;\n").unwrap();
        std::fs::write(dir.path().join("main.py"), "import utils\n").unwrap();
        std::fs::write(dir.path().join("utils.py"), "pass\n").unwrap();
        dir
    }

    /// The markers the payload's commands leave when they run.
    fn ran(&self) -> Vec<String> {
        let mut ran: Vec<String> = std::fs::read_dir(self.markers.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        ran.sort();
        ran
    }

    /// Runs the host commands in `dir` and in every directory beneath it.
    fn host_commands(&self, dir: &Path) {
        let mut dirs = vec![dir.to_path_buf()];
        dirs.extend(
            tree(dir)
                .into_iter()
                .filter(|p| !p.starts_with(".git"))
                .map(|p| dir.join(p))
                .filter(|p| p.is_dir() && !p.is_symlink()),
        );
        for dir in dirs {
            let home = tempfile::tempdir().unwrap();
            let quiet = |command: &mut Command| {
                command
                    .current_dir(&dir)
                    .env("HOME", home.path())
                    .env("GIT_CONFIG_NOSYSTEM", "1")
                    .output()
                    .unwrap()
            };
            quiet(Command::new("git").arg("status"));
            if dir.join("main.py").exists() {
                quiet(Command::new("/usr/bin/python3").arg("main.py"));
            }
            quiet(Command::new("sh").args(["-c", "tar cf \"$HOME/x.tar\" *"]));
        }
    }

    /// The payload planted by hand runs all three commands: the attack is real here.
    fn assert_live(&self) {
        let dir = Attack::victim(false);
        for (path, bytes) in &self.files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        self.host_commands(dir.path());
        assert_eq!(
            self.ran(),
            ["git", "python", "tar"],
            "the payload is not live here"
        );
        for marker in self.ran() {
            std::fs::remove_file(self.markers.path().join(marker)).unwrap();
        }
    }

    /// After a copy-out into `dir` (`how`): the host commands run nothing, no planted
    /// name is there, and the real output arrived somewhere beneath `dir`.
    fn assert_harmless(&self, dir: &Path, how: &str) {
        self.host_commands(dir);
        assert_eq!(
            self.ran(),
            Vec::<String>::new(),
            "{how}: a host command ran the payload"
        );
        // The checkout's own .git is the user's.
        let names: Vec<String> = tree(dir)
            .into_iter()
            .filter(|p| !p.starts_with(".git"))
            .collect();
        for name in &names {
            let last = name.rsplit('/').next().unwrap();
            assert!(
                last != "HEAD" && !last.ends_with(".pyc") && !last.starts_with('-'),
                "{how}: {name} was written: {names:?}"
            );
        }
        assert!(
            names.iter().any(|n| n.ends_with("report.txt")),
            "{how}: the real output did not arrive: {names:?}"
        );
    }
}

/// A `skillbox serve` on the doors tests' data dir, stopped (SIGTERM, then waited for)
/// when dropped, also when a test fails.
struct Serve {
    child: std::process::Child,
    url: String,
}

impl Serve {
    fn start() -> Serve {
        let mut command = Command::new(BIN);
        command.arg("--data-dir").arg(data_dir());
        let (child, addr) = common::start_serve(command, &[]);
        Serve {
            child,
            url: format!("http://{addr}"),
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // SAFETY: signalling the server this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// `skillbox run --out` with the payload of [`Attack`], locally and through a
/// `skillbox serve` (`--remote`), with nothing declared (the files land in a directory
/// of their own) and with everything declared (`--outputs '**'`, into the directory
/// itself, where the names a host tool acts on are still never written): in a checkout
/// and in a plain directory, no host command runs anything.
#[test]
fn run_out_never_plants_what_a_host_tool_runs() {
    if !native_or_skip("run_out_never_plants_what_a_host_tool_runs") {
        return;
    }
    let attack = Attack::new();
    attack.assert_live();
    let server = Serve::start();
    let remote = server.url.clone();
    let script = attack.sh_script();
    for (how, args) in [
        ("run", vec![]),
        (
            "run --outputs '**'",
            vec!["--outputs", "**", "--outputs", "*"],
        ),
        ("run --remote", vec!["--remote", remote.as_str()]),
        (
            "run --remote --outputs '**'",
            vec!["--remote", remote.as_str(), "--outputs", "**"],
        ),
    ] {
        for checkout in [true, false] {
            let dir = Attack::victim(checkout);
            let mut all = vec!["--out", "."];
            all.extend(&args);
            let out = run_in(dir.path(), "x.sh", &script, &all);
            let stderr = text(&out.stderr);
            // The refused files are named; what was declared or not, report.txt arrives.
            assert_eq!(out.status.code(), Some(125), "{how}: {stderr}");
            assert!(stderr.contains("never written"), "{how}: {stderr}");
            attack.assert_harmless(dir.path(), how);
            if args.contains(&"**") {
                assert_eq!(
                    std::fs::read_to_string(dir.path().join("report.txt")).unwrap(),
                    "the real output\n",
                    "{how}"
                );
            } else {
                // Nothing lands beside the user's files: one new directory holds it all.
                let own: Vec<String> = std::fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("run-"))
                    .collect();
                assert_eq!(own.len(), 1, "{how}: {:?}", tree(dir.path()));
                assert!(stderr.contains(&own[0]), "{how}: {stderr}");
                assert_eq!(
                    std::fs::read_to_string(dir.path().join(&own[0]).join("report.txt")).unwrap(),
                    "the real output\n"
                );
                assert_eq!(
                    std::fs::read_to_string(dir.path().join("src/lib.c")).unwrap(),
                    "int x;\n"
                );
            }
        }
    }
}

/// `skillbox agent --out`: the verified deck lands in the directory, and the payload the
/// same script wrote beside it runs nothing on the host.
#[test]
fn agent_out_never_plants_what_a_host_tool_runs() {
    if !native_or_skip("agent_out_never_plants_what_a_host_tool_runs") {
        return;
    }
    let attack = Attack::new();
    attack.assert_live();
    let transcript = tempfile::NamedTempFile::new().unwrap();
    let turns = serde_json::json!({"turns": [
        {"text": "Making the deck.", "toolCalls": [{"name": "run_script",
            "arguments": {"language": "node", "script": attack.node_script()}}]},
        {"text": "Done."},
    ]});
    std::fs::write(transcript.path(), turns.to_string()).unwrap();
    for checkout in [true, false] {
        let dir = Attack::victim(checkout);
        let out = Command::new(BIN)
            .arg("--data-dir")
            .arg(data_dir())
            .args(["agent", "Make a deck.", "--out", ".", "--transcript"])
            .arg(transcript.path())
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(stderr.contains("never written"), "{stderr}");
        assert_workspacex_deck(&dir.path().join("workspacex.pptx"));
        attack.assert_harmless(dir.path(), "agent");
        assert!(
            !dir.path().join("report.txt").exists(),
            "an unverified file landed beside the user's: {:?}",
            tree(dir.path())
        );
    }
}

/// `skillbox session get --out`: a file the session's code planted is not written under
/// a name a host tool acts on, whatever the user asked for, and an existing file is kept.
#[test]
fn session_get_never_plants_what_a_host_tool_runs() {
    if !native_or_skip("session_get_never_plants_what_a_host_tool_runs") {
        return;
    }
    let attack = Attack::new();
    attack.assert_live();
    let server = Serve::start();
    let client = tempfile::tempdir().unwrap();
    let session = |args: &[&str]| {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(client.path())
            .arg("session")
            .args(["--remote", &server.url])
            .args(args)
            .env_remove("SKILLBOX_API_KEY")
            .output()
            .unwrap()
    };
    let created = session(&["create"]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let id = text(&created.stdout).trim().to_string();
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), attack.sh_script()).unwrap();
    let put = session(&["put", &id, script.path().to_str().unwrap(), "plant.sh"]);
    assert!(put.status.success(), "{}", text(&put.stderr));
    let planted = session(&["exec", &id, "--", "sh", "plant.sh"]);
    assert!(planted.status.success(), "{}", text(&planted.stderr));

    let dir = Attack::victim(true);
    for (path, _) in &attack.files {
        // Into the directory under the file's own name, and at a name the user gave.
        let into = dir
            .path()
            .join(path.rsplit_once('/').map_or("", |(d, _)| d));
        std::fs::create_dir_all(&into).unwrap();
        // A name that starts with `-` is given as ./NAME, as a user would.
        let remote = format!("./{path}");
        let got = session(&["get", &id, &remote, "--out", into.to_str().unwrap()]);
        let named = session(&[
            "get",
            &id,
            &remote,
            "--out",
            dir.path().join(path).to_str().unwrap(),
        ]);
        let refused = path.ends_with("HEAD") || path.ends_with(".pyc") || path.starts_with('-');
        if refused {
            for got in [got, named] {
                let stderr = text(&got.stderr);
                assert_eq!(got.status.code(), Some(2), "{path}: {stderr}");
                assert!(stderr.contains("never written"), "{path}: {stderr}");
            }
        } else {
            // The first is written; the second finds it there and keeps it.
            assert!(got.status.success(), "{path}: {}", text(&got.stderr));
            assert_eq!(
                named.status.code(),
                Some(125),
                "{path}: {}",
                text(&named.stderr)
            );
        }
    }
    attack.assert_harmless(dir.path(), "session get");
    // An existing file is kept unless --overwrite.
    let kept = session(&[
        "get",
        &id,
        "report.txt",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(kept.status.code(), Some(125), "{}", text(&kept.stderr));
    assert!(
        text(&kept.stderr).contains("--overwrite"),
        "{}",
        text(&kept.stderr)
    );
    std::fs::write(dir.path().join("report.txt"), "mine").unwrap();
    let replaced = session(&[
        "get",
        &id,
        "report.txt",
        "--out",
        dir.path().join("report.txt").to_str().unwrap(),
        "--overwrite",
    ]);
    assert!(replaced.status.success(), "{}", text(&replaced.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("report.txt")).unwrap(),
        "the real output\n"
    );
    let deleted = session(&["delete", &id]);
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
}

/// The attack from an earlier review: in a git checkout, a script writes `.git/config`
/// with a `core.fsmonitor` command and overwrites a tracked file. Undeclared, everything
/// lands in a directory of its own; declared, the tracked file is kept unless
/// `--overwrite`, and `.git` is never written. The next `git status` runs nothing.
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
    // Nothing declared: a directory of the run's own, nothing beside the user's files.
    let out = run_in(repo, "x.py", &script, &["--out", "."]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let own: Vec<String> = tree(repo)
        .into_iter()
        .filter(|p| p.starts_with("run-") && !p.contains('/'))
        .collect();
    assert_eq!(own.len(), 1, "{:?}", tree(repo));
    assert_eq!(
        std::fs::read_to_string(repo.join(&own[0]).join("README.md")).unwrap(),
        "pwned\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "mine\n"
    );
    assert!(!repo.join(&own[0]).join(".envrc").exists());
    let status = git(repo, &["status", "--porcelain"]);
    assert!(!marker.exists(), "a hook ran on git status");
    assert_eq!(text(&status.stdout), format!("?? {}/\n", own[0]));
    std::fs::remove_dir_all(repo.join(&own[0])).unwrap();

    // Declared: the tracked file is kept, and that is an error that names it.
    let declared = [
        "--out",
        ".",
        "--outputs",
        "README.md",
        "--outputs",
        "report.txt",
    ];
    let out = run_in(repo, "x.py", &script, &declared);
    let stderr = text(&out.stderr);
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
    assert!(
        !tree(repo).iter().any(|p| p.contains("skillbox-partial")),
        "{:?}",
        tree(repo)
    );
    let status = git(repo, &["status", "--porcelain"]);
    assert!(!marker.exists(), "a hook ran on git status");
    assert_eq!(text(&status.stdout), "?? report.txt\n");

    // --overwrite replaces the file the user declared, and .git is still never written,
    // even when a glob spells it.
    std::fs::remove_file(repo.join("report.txt")).unwrap();
    let mut overwrite = declared.to_vec();
    overwrite.extend(["--overwrite", "--outputs", ".git/config"]);
    let out = run_in(repo, "x.py", &script, &overwrite);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("never written"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "pwned\n"
    );
    assert_eq!(
        std::fs::read(repo.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!repo.join(".envrc").exists());

    // A hidden file comes out only when declared by a glob that spells its dot.
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
        &["--out", out_dir.path().to_str().unwrap(), "--outputs", "**"],
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
        &["--out", ".", "--overwrite", "--outputs", "victim"],
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
    let script = "mkdir -m 1777 bin && printf '#!/bin/sh\\necho owned\\n' > bin/tool && \
                  chmod 0755 bin/tool && { chmod 6755 bin/tool 2>/dev/null; true; } && \
                  ls -l bin/tool";
    // The modes are 0644/0755 less the umask the user ran skillbox with (not the
    // private one skillbox keeps its own files under).
    for (umask, file, dir) in [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)] {
        let out_dir = tempfile::tempdir().unwrap();
        let scripts = tempfile::tempdir().unwrap();
        let file_path = scripts.path().join("x.sh");
        std::fs::write(&file_path, script).unwrap();
        let mut command = Command::new(BIN);
        command
            .arg("--data-dir")
            .arg(data_dir())
            .arg("run")
            .arg(&file_path)
            .args(["--out", ".", "--outputs", "bin/*"])
            .current_dir(out_dir.path());
        // SAFETY: umask is async-signal-safe and touches only the child.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                libc::umask(umask);
                Ok(())
            });
        }
        let out = command.output().unwrap();
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
        assert_eq!(
            mode("bin/tool"),
            file,
            "umask {umask:o}: mode {:o}",
            mode("bin/tool")
        );
        assert_eq!(mode("bin"), dir, "umask {umask:o}: mode {:o}", mode("bin"));
    }
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

/// Another workspace root, end to end: `run --workspace-root` runs the script there
/// with the run's skill placed beneath it, a scope's snapshot comes back there, and the
/// declared file is copied out; a `serve --workspace-root` session execs there, and its
/// file routes take paths beneath it (or relative to it) and refuse `/workspace`.
#[test]
fn another_workspace_root_is_where_runs_and_sessions_work() {
    if !native_or_skip("another_workspace_root_is_where_runs_and_sessions_work") {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(project.path().join("skills/notes")).unwrap();
    std::fs::write(
        project.path().join("skills/notes/SKILL.md"),
        "---\nname: notes\ndescription: Keeps notes.\n---\n# notes\n",
    )
    .unwrap();
    let root = "/srv/agent";
    let scope = format!(
        "root-{}",
        project.path().file_name().unwrap().to_str().unwrap()
    );
    let first = format!(
        "test \"$PWD\" = {root} && test -f {root}/skills/notes/SKILL.md && test ! -e /workspace \
         && echo kept > {root}/kept.txt && echo made > out.txt"
    );
    let second = format!("cat {root}/kept.txt > seen.txt");
    for (script, declared, want) in [
        (&first, "out.txt", "made\n"),
        (&second, "seen.txt", "kept\n"),
    ] {
        let out = run_in(
            project.path(),
            "x.sh",
            script,
            &[
                "--workspace-root",
                root,
                "--skill",
                "notes",
                "--scope",
                &scope,
                "--out",
                ".",
                "--outputs",
                declared,
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            std::fs::read_to_string(project.path().join(declared)).unwrap(),
            want
        );
    }
    // A root where backends keep their own things is refused, naming the places.
    let out = run_in(
        project.path(),
        "x.sh",
        "true",
        &["--workspace-root", "/usr/w"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("/home"), "{}", text(&out.stderr));

    let mut command = Command::new(BIN);
    command.arg("--data-dir").arg(data_dir());
    let (child, addr) =
        common::start_serve(command, &["--workspace-root", "/home/agentscope/workspace"]);
    let _server = Serve {
        child,
        url: format!("http://{addr}"),
    };
    let client = tempfile::tempdir().unwrap();
    let session = |args: &[&str]| {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(client.path())
            .arg("session")
            .args(["--remote", &format!("http://{addr}")])
            .args(args)
            .env_remove("SKILLBOX_API_KEY")
            .output()
            .unwrap()
    };
    let created = session(&["create"]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let id = text(&created.stdout).trim().to_string();
    let note = client.path().join("note.txt");
    std::fs::write(&note, "hello\n").unwrap();
    let put = session(&[
        "put",
        &id,
        note.to_str().unwrap(),
        "/home/agentscope/workspace/in/note.txt",
    ]);
    assert!(put.status.success(), "{}", text(&put.stderr));
    let pwd = session(&["exec", &id, "--", "sh", "-c", "pwd; cat in/note.txt"]);
    assert_eq!(
        text(&pwd.stdout),
        "/home/agentscope/workspace\nhello\n",
        "{}",
        text(&pwd.stderr)
    );
    let got = session(&["get", &id, "in/note.txt"]);
    assert_eq!(text(&got.stdout), "hello\n", "{}", text(&got.stderr));
    let outside = session(&["ls", &id, "/workspace"]);
    assert!(!outside.status.success());
    assert!(
        text(&outside.stderr).contains("outside /home/agentscope/workspace"),
        "{}",
        text(&outside.stderr)
    );
    assert!(session(&["delete", &id]).status.success());
}
