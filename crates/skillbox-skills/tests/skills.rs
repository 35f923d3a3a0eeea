//! Skills over real files: the catalog of a workspace, and the stager against good and
//! hostile archives.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use skillbox_skills::{
    Archive, ProjectionConfig, SkillSet, Source, Sources, StageError, StageLimits, stage,
};

const SKILL: &str =
    "---\nname: NAME\ndescription: Does NAME things. Use it when NAME is asked.\n---\n# NAME\n";

fn skill_md(name: &str) -> Vec<u8> {
    SKILL.replace("NAME", name).into_bytes()
}

/// One tar entry, written with a raw name so hostile paths can be made too.
enum Entry<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    Device(&'a str),
}

fn tar_of(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_ustar();
        let (name, data): (&str, &[u8]) = match entry {
            Entry::File(name, data, mode) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                (name, data)
            }
            Entry::Dir(name) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                (name, b"")
            }
            Entry::Symlink(name, target) | Entry::HardLink(name, target) => {
                header.set_entry_type(if matches!(entry, Entry::Symlink(..)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                });
                let link = &mut header.as_old_mut().linkname;
                link[..target.len()].copy_from_slice(target.as_bytes());
                (name, b"")
            }
            Entry::Device(name) => {
                header.set_entry_type(tar::EntryType::Char);
                header.set_mode(0o644);
                (name, b"")
            }
        };
        let raw = &mut header.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn tree(root: &Path) -> Vec<(String, u32)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.path().symlink_metadata().unwrap();
            let rel = entry
                .path()
                .strip_prefix(root)
                .unwrap()
                .display()
                .to_string();
            if meta.is_dir() {
                pending.push(entry.path());
                found.push((format!("{rel}/"), 0));
            } else {
                found.push((rel, meta.permissions().mode() & 0o7777));
            }
        }
    }
    found.sort();
    found
}

fn pack() -> Vec<u8> {
    tar_of(&[
        Entry::File("pack/README.md", b"not a skill", 0o644),
        Entry::Dir("pack/skills/report/"),
        Entry::File("pack/skills/report/SKILL.md", &skill_md("report"), 0o644),
        Entry::File("pack/skills/report/scripts/run.sh", b"echo report\n", 0o644),
        Entry::File(
            "pack/skills/report/scripts/tool",
            b"#!/bin/sh\necho tool\n",
            0o644,
        ),
        Entry::File("pack/skills/report/data.txt", b"plain", 0o4755),
        Entry::File("pack/skills/report/secret.py", b"print(1)\n", 0o000),
        Entry::Symlink("pack/skills/report/latest", "scripts/run.sh"),
        Entry::File("pack/skills/chart/SKILL.md", &skill_md("chart"), 0o644),
        Entry::File(
            "pack/skills/chart/examples/inner/SKILL.md",
            &skill_md("inner"),
            0o644,
        ),
    ])
}

#[test]
fn a_marketplace_archive_is_staged_with_modes_and_restaged_writing_only_what_changed() {
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    std::fs::write(ws.join("keep.txt"), "mine").unwrap();
    let report = stage(ws, "acme", Archive::Tar(&pack()), StageLimits::default()).unwrap();
    assert_eq!(report.skills, ["chart", "report"]);
    let cache = ws.join(".skills-cache/acme");
    assert_eq!(
        tree(&cache),
        [
            ("chart/".to_string(), 0),
            ("chart/SKILL.md".into(), 0o644),
            ("chart/examples/".into(), 0),
            ("chart/examples/inner/".into(), 0),
            ("chart/examples/inner/SKILL.md".into(), 0o644),
            ("report/".into(), 0),
            ("report/SKILL.md".into(), 0o644),
            ("report/data.txt".into(), 0o644),
            ("report/latest".into(), 0o777),
            ("report/scripts/".into(), 0),
            ("report/scripts/run.sh".into(), 0o755),
            ("report/scripts/tool".into(), 0o755),
            ("report/secret.py".into(), 0o644),
        ],
        "scripts made executable only when readable; never setuid; README outside every skill left out"
    );
    assert_eq!(
        std::fs::read_link(cache.join("report/latest")).unwrap(),
        Path::new("scripts/run.sh")
    );
    let before = std::fs::metadata(cache.join("report/scripts/run.sh")).unwrap();

    // The same again: nothing written.
    let again = stage(ws, "acme", Archive::Tar(&pack()), StageLimits::default()).unwrap();
    assert!(again.written.is_empty(), "{again:?}");
    assert_eq!(again.unchanged, 8);
    assert!(again.removed.is_empty());
    let after = std::fs::metadata(cache.join("report/scripts/run.sh")).unwrap();
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );

    // One file changed, one skill gone upstream, one file gone: only those.
    let changed = tar_of(&[
        Entry::File("pack/skills/report/SKILL.md", &skill_md("report"), 0o644),
        Entry::File(
            "pack/skills/report/scripts/run.sh",
            b"echo report v2\n",
            0o644,
        ),
        Entry::File(
            "pack/skills/report/scripts/tool",
            b"#!/bin/sh\necho tool\n",
            0o644,
        ),
        Entry::File("pack/skills/report/data.txt", b"plain", 0o644),
        Entry::Symlink("pack/skills/report/latest", "scripts/run.sh"),
    ]);
    stage(ws, "other", Archive::Tar(&pack()), StageLimits::default()).unwrap();
    let third = stage(ws, "acme", Archive::Tar(&changed), StageLimits::default()).unwrap();
    assert_eq!(third.written, ["report/scripts/run.sh"]);
    assert_eq!(third.removed, ["chart", "report/secret.py"]);
    assert_eq!(
        std::fs::read_to_string(cache.join("report/scripts/run.sh")).unwrap(),
        "echo report v2\n"
    );
    assert!(!cache.join("chart").exists());
    assert!(
        ws.join(".skills-cache/other/chart/SKILL.md").exists(),
        "another source untouched"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("keep.txt")).unwrap(),
        "mine"
    );

    // The catalog sees them where the projection will put them.
    let set = SkillSet::load(&Sources {
        workspace: Some(ws.to_path_buf()),
        user: None,
    });
    let report = set.get("report").unwrap();
    assert_eq!(
        report.source,
        Source::Marketplace {
            source: "acme".into()
        }
    );
    assert_eq!(report.projected, Path::new(".skills-cache/acme/report"));
}

/// Each hostile archive is refused whole: nothing at all is written.
#[test]
fn traversal_link_device_and_bomb_archives_are_refused_with_nothing_written() {
    let good = skill_md("ok");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "traversal",
            tar_of(&[
                Entry::File("ok/SKILL.md", &good, 0o644),
                Entry::File("ok/../../escape.txt", b"x", 0o644),
            ]),
            "`..`",
        ),
        (
            "absolute",
            tar_of(&[
                Entry::File("ok/SKILL.md", &good, 0o644),
                Entry::File("/tmp/skillbox-abs.txt", b"x", 0o644),
            ]),
            "absolute",
        ),
        (
            "symlink out",
            tar_of(&[
                Entry::File("ok/SKILL.md", &good, 0o644),
                Entry::Symlink("ok/passwd", "../../../etc/passwd"),
            ]),
            "leads out of its skill",
        ),
        (
            "absolute symlink",
            tar_of(&[
                Entry::File("ok/SKILL.md", &good, 0o644),
                Entry::Symlink("ok/passwd", "/etc/passwd"),
            ]),
            "leads out of its skill",
        ),
        (
            // Each link looks inside on its own; on disk `up` is `/` (the `..` apply
            // to where `root` points, not to the name `root`).
            "chain of symlinks",
            tar_of(&[
                Entry::File("ok/SKILL.md", &good, 0o644),
                Entry::Symlink("ok/d/root", ".."),
                Entry::Symlink("ok/up", "d/root/../../../.."),
                Entry::Symlink("ok/leak", "up/etc/passwd"),
            ]),
            "goes through another symlink",
        ),
        (
            "hard link",
            tar_of(&[
                Entry::File("ok/SKILL.md", &good, 0o644),
                Entry::HardLink("ok/shadow", "/etc/shadow"),
            ]),
            "hard link",
        ),
        (
            "device",
            tar_of(&[
                Entry::File("ok/SKILL.md", &good, 0o644),
                Entry::Device("ok/null"),
            ]),
            "device",
        ),
    ];
    for (what, archive, words) in cases {
        let workspace = tempfile::tempdir().unwrap();
        let e = stage(
            workspace.path(),
            "m",
            Archive::Tar(&archive),
            StageLimits::default(),
        )
        .expect_err(what);
        assert!(matches!(e, StageError::Refused { .. }), "{what}: {e}");
        assert!(e.to_string().contains(words), "{what}: {e}");
        assert_eq!(
            std::fs::read_dir(workspace.path()).unwrap().count(),
            0,
            "{what}: something was written"
        );
    }
    assert!(!Path::new("/tmp/skillbox-abs.txt").exists());

    // A zip bomb: 64 MiB of zeros that deflate to almost nothing, against a 1 MiB bound,
    // found by what it inflates to.
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    zip.start_file("bomb/SKILL.md", options).unwrap();
    zip.write_all(&skill_md("bomb")).unwrap();
    zip.start_file("bomb/zeros.bin", options).unwrap();
    let zeros = vec![0u8; 1024 * 1024];
    for _ in 0..64 {
        zip.write_all(&zeros).unwrap();
    }
    let bomb = zip.finish().unwrap().into_inner();
    assert!(bomb.len() < 1024 * 1024, "{} bytes", bomb.len());
    let workspace = tempfile::tempdir().unwrap();
    let limits = StageLimits {
        entries: 100,
        bytes: 1024 * 1024,
    };
    let e = stage(workspace.path(), "m", Archive::Zip(&bomb), limits).unwrap_err();
    assert!(matches!(e, StageError::TooLarge(_)), "{e}");
    assert_eq!(std::fs::read_dir(workspace.path()).unwrap().count(), 0);

    // Too many entries.
    let many: Vec<String> = (0..20).map(|i| format!("ok/f{i}")).collect();
    let mut entries = vec![Entry::File("ok/SKILL.md", &good, 0o644)];
    entries.extend(many.iter().map(|n| Entry::File(n, b"x", 0o644)));
    let e = stage(
        workspace.path(),
        "m",
        Archive::Tar(&tar_of(&entries)),
        StageLimits {
            entries: 10,
            bytes: 1024,
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("more than 10 entries"), "{e}");
    assert_eq!(std::fs::read_dir(workspace.path()).unwrap().count(), 0);

    for source in ["user", "../x", ""] {
        let e = stage(
            workspace.path(),
            source,
            Archive::Tar(&pack()),
            StageLimits::default(),
        )
        .unwrap_err();
        assert!(matches!(e, StageError::BadSource(_)), "{source}: {e}");
    }
}

/// Planted in the cache by someone else: a symlink where the source's folder goes is
/// replaced, never followed.
#[test]
fn a_symlink_in_the_cache_is_never_followed() {
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join(".skills-cache")).unwrap();
    std::os::unix::fs::symlink(outside.path(), workspace.path().join(".skills-cache/acme"))
        .unwrap();
    stage(
        workspace.path(),
        "acme",
        Archive::Tar(&pack()),
        StageLimits::default(),
    )
    .unwrap();
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    assert!(
        workspace
            .path()
            .join(".skills-cache/acme/report/SKILL.md")
            .is_file()
    );
    assert!(!workspace.path().join(".skills-cache/acme").is_symlink());
}

#[test]
fn a_zip_and_a_git_repository_stage_alike_and_a_bad_skill_is_skipped_alone() {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().unix_permissions(0o644);
    zip.start_file("repo-main/lint/SKILL.md", options).unwrap();
    zip.write_all(&skill_md("lint")).unwrap();
    zip.start_file("repo-main/lint/check.py", options).unwrap();
    zip.write_all(b"print('ok')\n").unwrap();
    zip.start_file("repo-main/broken/SKILL.md", options)
        .unwrap();
    zip.write_all(b"no front matter\n").unwrap();
    let zipped = zip.finish().unwrap().into_inner();
    let workspace = tempfile::tempdir().unwrap();
    let report = stage(
        workspace.path(),
        "z",
        Archive::Zip(&zipped),
        StageLimits::default(),
    )
    .unwrap();
    assert_eq!(report.skills, ["lint"]);
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert!(
        report.skipped[0].contains("broken/SKILL.md:1"),
        "{report:?}"
    );
    let check = workspace.path().join(".skills-cache/z/lint/check.py");
    assert_eq!(
        std::fs::metadata(&check).unwrap().permissions().mode() & 0o777,
        0o755
    );

    // A local git repository, whose own config would run a command if git read the
    // work tree: `git archive` reads only HEAD, and nothing runs.
    let repo = tempfile::tempdir().unwrap();
    let marker = repo.path().join("pwned");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(repo.path())
            .env("HOME", repo.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"]);
    std::fs::create_dir_all(repo.path().join("skills/deploy")).unwrap();
    std::fs::write(
        repo.path().join("skills/deploy/SKILL.md"),
        skill_md("deploy"),
    )
    .unwrap();
    std::fs::write(repo.path().join("skills/deploy/go.sh"), "echo deploy\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "a skill"]);
    // Uncommitted: not part of HEAD, not staged.
    std::fs::write(repo.path().join("skills/deploy/draft.txt"), "wip").unwrap();
    git(&[
        "config",
        "core.fsmonitor",
        &format!("touch {}", marker.display()),
    ]);
    let report = stage(
        workspace.path(),
        "g",
        Archive::Git(repo.path()),
        StageLimits::default(),
    )
    .unwrap();
    assert_eq!(report.skills, ["deploy"]);
    let staged = workspace.path().join(".skills-cache/g/deploy");
    assert!(staged.join("go.sh").is_file());
    assert!(!staged.join("draft.txt").exists());
    assert!(!marker.exists(), "the repository's fsmonitor ran");
}

#[test]
fn the_catalog_reads_every_source_and_names_what_did_not_load() {
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    let data = tempfile::tempdir().unwrap();
    let write = |dir: PathBuf, text: &[u8]| {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("SKILL.md"), text).unwrap();
    };
    write(ws.join("skills/report"), &skill_md("report"));
    write(ws.join("skills/bad"), b"---\nname: bad\n---\n");
    std::fs::create_dir_all(ws.join("skills/assets")).unwrap();
    std::fs::write(ws.join("skills/README.md"), "about the skills").unwrap();
    std::os::unix::fs::symlink("/etc", ws.join("skills/etc")).unwrap();
    let user_dir = Sources::user_dir(data.path(), "ana");
    write(user_dir.join("notes"), &skill_md("notes"));
    write(user_dir.join("report"), &skill_md("report"));
    let set = SkillSet::load(&Sources {
        workspace: Some(ws.to_path_buf()),
        user: Some(("ana".into(), user_dir.clone())),
    });
    let names: Vec<&str> = set.iter().map(|s| s.meta.name.as_str()).collect();
    assert_eq!(names, ["notes", "report"]);
    assert_eq!(set.get("report").unwrap().source, Source::Workspace);
    assert_eq!(
        set.get("report").unwrap().projected,
        Path::new("skills/report")
    );
    let notes = set.get("notes").unwrap();
    assert_eq!(notes.source, Source::User { user: "ana".into() });
    assert_eq!(notes.projected, Path::new(".skills-cache/user/notes"));
    let errors: Vec<String> = set.errors().iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("skills/bad/SKILL.md:3: no description")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("assets/SKILL.md: not a skill")),
        "{errors:#?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("skills/etc: a symlink")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("the name report is taken")),
        "{errors:#?}"
    );
    assert!(set.missing("bad").contains("no description"));
    assert!(set.missing("nope").contains("notes, report"));
}

/// Links planted in a workspace skill on disk (sandboxed code with `--workdir` can make
/// them; staging would refuse them): each looks inside the root by its text, and the
/// chain leads out of it. Projection reads through links only as the kernel resolves
/// them beneath the root: the outside file is left out, a link to the skill's own file
/// is still projected, and the skill's SKILL.md is never read through a link.
#[test]
fn a_chain_of_links_out_of_a_skill_is_never_projected() {
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    let skill = ws.join("skills/notes");
    std::fs::create_dir_all(skill.join("d0")).unwrap();
    std::fs::write(skill.join("SKILL.md"), skill_md("notes")).unwrap();
    std::fs::write(ws.join("secret.txt"), "HOST SECRET\n").unwrap();
    // d0/root is `skills/` (inside the root); up is d0/root/.. (the workspace itself on
    // disk, though by its text it is skills/notes/d0); leak is up/secret.txt.
    std::os::unix::fs::symlink("../..", skill.join("d0/root")).unwrap();
    std::os::unix::fs::symlink("d0/root/..", skill.join("up")).unwrap();
    std::os::unix::fs::symlink("up/secret.txt", skill.join("leak")).unwrap();
    std::os::unix::fs::symlink("SKILL.md", skill.join("alias.md")).unwrap();
    assert_eq!(
        std::fs::read_to_string(skill.join("leak")).unwrap(),
        "HOST SECRET\n",
        "the chain does lead out on disk"
    );
    let mut cache = skillbox_skills::HashCache::in_memory();
    let projection =
        skillbox_skills::plan(Some(ws), None, &ProjectionConfig::default(), &mut cache).unwrap();
    let paths: Vec<&Path> = projection.files.iter().map(|f| f.path.as_path()).collect();
    assert!(
        !paths.contains(&Path::new("skills/notes/leak")),
        "{paths:?}"
    );
    assert!(
        projection
            .notes
            .iter()
            .any(|n| n.contains("skills/notes/leak: a symlink out of")),
        "{:?}",
        projection.notes
    );
    assert!(
        paths.contains(&Path::new("skills/notes/alias.md")),
        "{paths:?}"
    );
    assert!(
        paths.contains(&Path::new("skills/notes/SKILL.md")),
        "{paths:?}"
    );

    // SKILL.md itself a link (to a file outside the skill): the skill does not load.
    let other = ws.join("skills/other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(ws.join("outside.md"), skill_md("other")).unwrap();
    std::os::unix::fs::symlink("../../outside.md", other.join("SKILL.md")).unwrap();
    let set = SkillSet::load(&Sources {
        workspace: Some(ws.to_path_buf()),
        user: None,
    });
    assert!(set.get("other").is_none(), "a SKILL.md read through a link");
    assert!(set.get("notes").is_some());
}

/// Issue 38, row 4: `echo AWS_SECRET=… > .env; ln -s .env AGENTS.md` in a workspace.
/// The link stays inside the workspace, so a check that only refuses links *out* lets
/// it through, and the sandbox's `/workspace/AGENTS.md` would hold the secret. A
/// projected root that is a symlink (to a file or to a folder) is left out, named in a
/// note, and nothing of `.env` is placed in the sandbox.
#[test]
fn a_projected_root_that_is_a_symlink_is_left_out() {
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    std::fs::write(ws.join(".env"), "AWS_SECRET=hunter2-from-the-host\n").unwrap();
    std::os::unix::fs::symlink(".env", ws.join("AGENTS.md")).unwrap();
    std::fs::create_dir_all(ws.join("notes")).unwrap();
    std::fs::write(ws.join("notes/SKILL.md"), skill_md("notes")).unwrap();
    std::os::unix::fs::symlink("notes", ws.join("skills")).unwrap();
    std::os::unix::fs::symlink(".env", ws.join("knowledge")).unwrap();
    let mut cache = skillbox_skills::HashCache::in_memory();
    let projection =
        skillbox_skills::plan(Some(ws), None, &ProjectionConfig::default(), &mut cache).unwrap();
    assert!(projection.files.is_empty(), "{:?}", projection.files);
    for root in ["AGENTS.md", "skills", "knowledge"] {
        let named = format!(
            "{}: a projected root that is a symlink; left out",
            ws.join(root).display()
        );
        assert!(
            projection.notes.contains(&named),
            "{root}: {:?}",
            projection.notes
        );
    }

    // Placed into a sandbox's workspace (a host env's directory here): no AGENTS.md, and
    // the secret nowhere in what was placed.
    let sandbox = tempfile::tempdir().unwrap();
    let env = skillbox_env::HostEnv::new(sandbox.path(), sandbox.path());
    let config = ProjectionConfig {
        sandbox_root: sandbox.path().to_path_buf(),
        ..ProjectionConfig::default()
    };
    let never = skillbox_env::CancellationToken::new();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(skillbox_skills::apply(&env, &projection, &config, &never))
        .unwrap();
    assert!(!sandbox.path().join("AGENTS.md").exists());
    for (path, _) in tree(sandbox.path()) {
        let content = std::fs::read(sandbox.path().join(&path)).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&content).contains("hunter2"),
            "{path} holds the secret"
        );
    }

    // A real file root is still projected, read without following a link.
    std::fs::remove_file(ws.join("AGENTS.md")).unwrap();
    std::fs::write(ws.join("AGENTS.md"), "# agents\n").unwrap();
    let projection =
        skillbox_skills::plan(Some(ws), None, &ProjectionConfig::default(), &mut cache).unwrap();
    let paths: Vec<&Path> = projection.files.iter().map(|f| f.path.as_path()).collect();
    assert_eq!(paths, [Path::new("AGENTS.md")]);
}
