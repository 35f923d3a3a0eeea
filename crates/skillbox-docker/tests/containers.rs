//! What the docker and gvisor backends promise beyond the shared suites: the container's
//! hardened configuration (read back from the daemon), nothing left behind, and a clear
//! `unavailable` (never a fallback) when something they need is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use skillbox_docker::{
    DockerBackend, DockerSandbox, LABEL_OWNER, LABEL_SANDBOX, Runtime, image_tag,
};
use skillbox_env::testkit::{limits, skip};
use skillbox_env::{
    CancellationToken, ErrorCode, ExecEvent, ExecRequest, FileSystem, SandboxSpec, Shell,
};

fn image() -> String {
    image_tag(&skillbox_run::NodeRuntime::new(std::path::Path::new("/")).id())
}

fn spec() -> SandboxSpec {
    SandboxSpec {
        limits: limits(),
        ..SandboxSpec::default()
    }
}

async fn backend(runtime: Runtime, test: &str) -> Option<DockerBackend> {
    match DockerBackend::connect(runtime, image()).await {
        Ok(backend) => Some(backend),
        Err(e) => {
            skip(test, &e.to_string());
            None
        }
    }
}

async fn docker() -> Docker {
    Docker::connect_with_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
}

/// True while the daemon still has the container (in any state).
async fn exists(docker: &Docker, id: &str) -> bool {
    docker
        .inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .is_ok()
}

async fn assert_removed(docker: &Docker, id: &str, what: &str) {
    for _ in 0..100 {
        if !exists(docker, id).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: container {id} is still there");
}

async fn check_hardened(runtime: Runtime) {
    let test = "the_container_is_hardened";
    let Some(backend) = backend(runtime, test).await else {
        return;
    };
    let sandbox = backend.create(spec()).await.unwrap();
    let docker = docker().await;
    let info = docker
        .inspect_container(
            sandbox.container_id(),
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let host = info.host_config.clone().unwrap();
    let config = info.config.clone().unwrap();
    let limits = limits();
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.privileged, Some(false));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert!(host.cap_add.unwrap_or_default().is_empty());
    let security = host.security_opt.unwrap_or_default();
    assert!(
        security.iter().any(|o| o.starts_with("no-new-privileges")),
        "{security:?}"
    );
    // Docker's default seccomp profile stays on (no seccomp=unconfined, no custom one).
    assert!(
        !security.iter().any(|o| o.starts_with("seccomp")),
        "{security:?}"
    );
    let memory = limits.memory_bytes.unwrap() as i64;
    assert_eq!(host.memory, Some(memory));
    assert_eq!(
        host.memory_swap,
        Some(memory),
        "no swap beyond the memory limit"
    );
    assert!(host.nano_cpus.unwrap_or(0) > 0, "NanoCpus must be set");
    let pids = host.pids_limit.unwrap_or(0);
    assert!(pids > 0, "PidsLimit must be set");
    let ulimits: HashMap<String, i64> = host
        .ulimits
        .unwrap_or_default()
        .into_iter()
        .map(|u| (u.name.unwrap(), u.hard.unwrap()))
        .collect();
    assert_eq!(ulimits["fsize"], limits.file_size_bytes.unwrap() as i64);
    assert_eq!(ulimits["nofile"], limits.open_files.unwrap() as i64);
    match runtime {
        Runtime::Runc => assert_eq!(pids, i64::from(limits.pids.unwrap())),
        // Under runsc the cgroup counts gVisor's own host tasks; the sandbox's
        // processes are bounded by RLIMIT_NPROC inside gVisor's kernel.
        Runtime::Runsc => {
            assert!(pids > i64::from(limits.pids.unwrap()));
            assert_eq!(ulimits["nproc"], i64::from(limits.pids.unwrap()));
        }
    }
    assert_eq!(host.runtime.as_deref(), Some(runtime.docker_name()));
    // Size-limited tmpfs for /tmp and /workspace, and no host mounts at all.
    let tmpfs = host.tmpfs.unwrap_or_default();
    assert!(
        tmpfs["/tmp"].contains(&format!("size={}", limits.tmp_size())),
        "{tmpfs:?}"
    );
    assert!(tmpfs["/workspace"].contains("size="), "{tmpfs:?}");
    assert!(host.binds.unwrap_or_default().is_empty());
    assert!(host.mounts.unwrap_or_default().is_empty());
    let mounts = info.mounts.unwrap_or_default();
    assert!(mounts.is_empty(), "host mounts: {mounts:?}");
    // Not root, and skillbox's own init as pid 1 (it reaps orphans and is what kills).
    let user = config.user.unwrap_or_default();
    assert!(
        !user.is_empty() && !user.starts_with("0") && !user.starts_with("root"),
        "{user}"
    );
    let entrypoint = config.entrypoint.unwrap_or_default();
    assert!(
        entrypoint.iter().any(|a| a.contains("skillbox-init")),
        "{entrypoint:?}"
    );
    let labels = config.labels.unwrap_or_default();
    assert_eq!(labels[LABEL_SANDBOX], runtime.backend().as_str());
    assert!(labels[LABEL_OWNER].contains(&format!("/{}/", std::process::id())));
    // Orphans are reaped: a double-forked child that exits does not stay a zombie.
    let out = sandbox
        .exec(
            ExecRequest::shell(
                "(sh -c 'exit 0' &) ; sleep 0.5; \
                 for s in /proc/[0-9]*/stat; do cut -d' ' -f3 \"$s\"; done | grep -c Z || true",
            ),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_text().trim(), "0", "zombies left: {out:?}");
    sandbox.cleanup().await.unwrap();
    assert_removed(&docker, sandbox.container_id(), "after cleanup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_container_is_hardened() {
    check_hardened(Runtime::Runc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gvisor_container_is_hardened() {
    check_hardened(Runtime::Runsc).await;
}

/// A sandbox dropped without cleanup (its caller was cancelled) still goes, with what
/// ran in it; so does one whose exec timed out or was cancelled, after cleanup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_left_behind() {
    let test = "nothing_is_left_behind";
    let Some(backend) = backend(Runtime::Runc, test).await else {
        return;
    };
    let docker = docker().await;

    let sandbox = backend.create(spec()).await.unwrap();
    let id = sandbox.container_id().to_string();
    let mut stream = sandbox
        .exec_stream(
            ExecRequest::shell("echo ready; sleep 1000").timeout(Duration::from_secs(3600)),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    match stream.next().await {
        Some(Ok(ExecEvent::Stdout(chunk))) => assert_eq!(&chunk[..], b"ready\n"),
        other => panic!("expected the ready line, got {other:?}"),
    }
    drop(sandbox);
    assert_removed(&docker, &id, "after drop").await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = stream.next().await {
            if event.is_err() {
                return true;
            }
        }
        false
    })
    .await
    .expect("the stream of a dropped sandbox must end");
    assert!(ended, "the stream must end with an error");

    for cancel_it in [false, true] {
        let sandbox: DockerSandbox = backend.create(spec()).await.unwrap();
        let id = sandbox.container_id().to_string();
        let cancel = CancellationToken::new();
        let request = ExecRequest::shell("sleep 1000 & sleep 1000");
        let result = if cancel_it {
            let trigger = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                trigger.cancel();
            });
            sandbox.exec(request, &cancel).await
        } else {
            sandbox
                .exec(request.timeout(Duration::from_millis(500)), &cancel)
                .await
        };
        match result {
            Ok(out) => assert!(out.timed_out && !cancel_it, "{out:?}"),
            Err(e) => assert!(cancel_it && e.code == ErrorCode::Aborted, "{e}"),
        }
        // The sandbox is reset, not broken: the next exec runs, and nothing of the
        // last one is still running.
        let out = sandbox
            .exec(
                ExecRequest::shell(
                    "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done \
                     | grep -c '^sleep 1000' || true",
                ),
                &CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(
            out.stdout_text().trim(),
            "0",
            "left after the kill: {out:?}"
        );
        sandbox.cleanup().await.unwrap();
        assert_removed(&docker, &id, "after cleanup").await;
    }
}

/// Field 22 of `/proc/<pid>/stat`: when `pid` started, in clock ticks since boot.
fn start_time(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_string()
}

/// The inode of `pid`'s pid namespace.
fn pid_namespace(pid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .unwrap()
        .ino()
}

/// Removes a container a test made, whatever its state.
async fn remove(docker: &Docker, id: &str) {
    let _ = docker
        .remove_container(
            id,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
}

/// A started sandbox-labelled container (`sleep`) whose owner label is `owner`.
async fn labelled_container(docker: &Docker, owner: String) -> String {
    let body = bollard::models::ContainerCreateBody {
        image: Some(image()),
        entrypoint: Some(vec!["sleep".into(), "1000".into()]),
        labels: Some(HashMap::from([
            (LABEL_SANDBOX.to_string(), "docker".to_string()),
            (LABEL_OWNER.to_string(), owner),
        ])),
        host_config: Some(bollard::models::HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            body,
        )
        .await
        .unwrap();
    docker
        .start_container(
            &created.id,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .unwrap();
    created.id
}

fn boot_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    boot.trim().to_string()
}

/// A container whose owner (a skillbox process) is gone is removed by the next backend
/// that connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_of_a_dead_skillbox_are_swept() {
    let test = "containers_of_a_dead_skillbox_are_swept";
    let Some(_) = backend(Runtime::Runc, test).await else {
        return;
    };
    let docker = docker().await;
    // A real dead process: its pid and start time name the owner, in the label's
    // current form (with this pid namespace) and in the older one (without).
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let started = start_time(pid);
    let namespace = pid_namespace(pid);
    child.wait().unwrap();
    let boot = boot_id();
    let current = labelled_container(&docker, format!("{boot}/{namespace}/{pid}/{started}")).await;
    let older = labelled_container(&docker, format!("{boot}/{pid}/{started}")).await;
    DockerBackend::connect(Runtime::Runc, image())
        .await
        .unwrap();
    assert_removed(&docker, &current, "after the sweep").await;
    assert_removed(&docker, &older, "after the sweep (an older label)").await;
}

/// A skillbox in another pid namespace on the same daemon (one in a container beside
/// one on the host) keeps its containers when this one sweeps: its pid names nothing
/// here, or another process (its pid 1 is not this namespace's), and is not judged
/// through this `/proc`. The owner is a live process that is pid 1 of a namespace of
/// its own; before pid namespaces were in the label, the sweep removed its container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_of_a_skillbox_in_another_pid_namespace_are_kept() {
    let test = "containers_of_a_skillbox_in_another_pid_namespace_are_kept";
    let Some(_) = backend(Runtime::Runc, test).await else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skillbox_env::testkit::skip(test, "needs root for a pid namespace of its own");
        return;
    }
    let docker = docker().await;
    let mut unshare = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sleep", "1000"])
        .spawn()
        .unwrap();
    // The forked child: pid 1 of the new namespace, seen here by its host pid.
    let mut owner = None;
    for _ in 0..100 {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.id()))
                .unwrap_or_default();
        if let Some(child) = children.split_whitespace().next() {
            let child: u32 = child.parse().unwrap();
            owner = Some((pid_namespace(child), start_time(child)));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (namespace, started) = owner.expect("unshare's child");
    assert_ne!(namespace, pid_namespace(std::process::id()));
    let id = labelled_container(&docker, format!("{}/{namespace}/1/{started}", boot_id())).await;
    DockerBackend::connect(Runtime::Runc, image())
        .await
        .unwrap();
    let kept = exists(&docker, &id).await;
    let _ = unshare.kill();
    let _ = unshare.wait();
    remove(&docker, &id).await;
    assert!(
        kept,
        "the sweep removed a live owner's container in another pid namespace"
    );
}

/// Missing parts fail with `unavailable`, saying which and how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_unavailable_not_a_fallback() {
    let test = "a_missing_image_is_unavailable";
    let Some(_) = backend(Runtime::Runc, test).await else {
        return;
    };
    for runtime in [Runtime::Runc, Runtime::Runsc] {
        let e = DockerBackend::connect(runtime, "skillbox-runtime:no-such-build")
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
        assert!(e.message.contains("skillbox-runtime:no-such-build"), "{e}");
        assert!(e.message.contains("skillbox image build"), "{e}");
    }
}

/// A run in a child process with DOCKER_HOST pointed elsewhere (the variable is process
/// wide, so each case is its own process: this test binary, re-run with a filter).
fn child_case(case: &str, docker_host: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unreachable_daemon_child",
            "--nocapture",
            "--ignored",
        ])
        .env("DOCKER_HOST", docker_host)
        .env("SKILLBOX_CHILD_CASE", case)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child half of the DOCKER_HOST cases, run only by child_case"]
async fn unreachable_daemon_child() {
    let case = std::env::var("SKILLBOX_CHILD_CASE").expect("run through child_case");
    let runtime = if case == "gvisor" {
        Runtime::Runsc
    } else {
        Runtime::Runc
    };
    match DockerBackend::connect(runtime, image()).await {
        Ok(_) => println!("CASE_RESULT connected"),
        Err(e) => println!("CASE_RESULT {} {}", e.code, e.message),
    }
}

#[test]
fn no_daemon_is_unavailable_and_says_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-docker.sock");
    let output = child_case("docker", &format!("unix://{}", socket.display()));
    assert!(output.contains("CASE_RESULT unavailable"), "{output}");
    assert!(output.contains("no-docker.sock"), "{output}");
    assert!(output.contains("start it"), "{output}");
}

/// A daemon without `runsc` registered: gvisor is unavailable and says how to register
/// it; docker still works. The daemon here is a stand-in that answers like one without
/// runsc (this host's real one has it).
#[test]
fn gvisor_without_runsc_is_unavailable_and_says_how_to_register_it() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fake-docker.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let mut request = String::new();
                    if reader.read_line(&mut request).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut line = String::new();
                    while reader.read_line(&mut line).unwrap_or(0) > 2 {
                        line.clear();
                    }
                    let path = request.split_whitespace().nth(1).unwrap_or("");
                    let body = if path.contains("/version") {
                        r#"{"Version":"20.10.24","ApiVersion":"1.41","MinAPIVersion":"1.12"}"#
                    } else if path.contains("/info") {
                        r#"{"Runtimes":{"runc":{"path":"runc"}},"DefaultRuntime":"runc"}"#
                    } else if path.contains("/_ping") {
                        "OK"
                    } else {
                        "{}"
                    };
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nApi-Version: 1.41\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let output = child_case("gvisor", &format!("unix://{}", socket.display()));
    assert!(output.contains("CASE_RESULT unavailable"), "{output}");
    assert!(output.contains("runsc"), "{output}");
    assert!(output.contains("runtimeArgs"), "{output}");
    assert!(output.contains("--network=none"), "{output}");
}

/// The caller's environment reaches the command only, never skillbox's exec wrapper:
/// PERL5OPT or LD_PRELOAD cannot run code before the wrapper's seccomp filter is in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_env_cannot_subvert_the_exec_wrapper() {
    let test = "request_env_cannot_subvert_the_exec_wrapper";
    let Some(backend) = backend(Runtime::Runc, test).await else {
        return;
    };
    let sandbox = backend.create(spec()).await.unwrap();
    let request = ExecRequest::shell(
        "echo \"OPT=$PERL5OPT\"; \
         python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
         r = l.syscall(425, 1, None); print(\"IOURING\", r, ctypes.get_errno())'",
    )
    .env(
        "PERL5OPT",
        "-MPOSIX;print(\"INJECTED\\n\");exec(\"/bin/true\");",
    )
    .env("PERL5LIB", "/tmp")
    .env("LD_PRELOAD", "/tmp/nothing-here.so");
    let out = sandbox
        .exec(request, &CancellationToken::new())
        .await
        .unwrap();
    let stdout = out.stdout_text();
    assert!(
        !stdout.lines().any(|l| l == "INJECTED"),
        "{}",
        out.stdout_text()
    );
    assert!(
        stdout.contains("OPT=-MPOSIX"),
        "the command sees its variables: {out:?}"
    );
    // io_uring_setup: allowed by Docker's default profile on this daemon, refused by
    // skillbox's filter (EPERM), so the filter is in place.
    assert!(stdout.contains("IOURING -1 1"), "{out:?}");
    sandbox.cleanup().await.unwrap();
}

/// Under runc the memory limit kills a process inside and the container lives on: the
/// exec wrapper's own count of the cgroup's out-of-memory kills says so, whoever the
/// victim was. A shell whose child was killed exits 137 (no signal of its own), and an
/// exec that only uses memory reports no limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_kill_under_runc_is_reported_whoever_the_victim_was() {
    let test = "a_memory_kill_under_runc_is_reported_whoever_the_victim_was";
    let Some(backend) = backend(Runtime::Runc, test).await else {
        return;
    };
    let sandbox = backend.create(spec()).await.unwrap();
    let run = |script: &str| {
        let request = ExecRequest::shell(script);
        let sandbox = &sandbox;
        async move {
            sandbox
                .exec(request, &CancellationToken::new())
                .await
                .unwrap()
        }
    };
    let bomb = "python3 -c 'b = bytearray(512 << 20); print(len(b))'; exit $?";
    let out = run(bomb).await;
    assert_eq!(out.exit_code, Some(137), "{out:?}");
    assert_eq!(
        out.limit_hit,
        Some(skillbox_env::LimitKind::Memory),
        "{out:?}"
    );
    assert!(!out.stdout_text().contains("536870912"), "{out:?}");
    let fits = run("python3 -c 'b = bytearray(64 << 20); print(len(b))'; exit $?").await;
    assert_eq!(fits.stdout_text(), "67108864\n", "{fits:?}");
    assert_eq!(fits.limit_hit, None, "{fits:?}");
    // The next kill is counted too (the count is read around each command).
    let again = run(bomb).await;
    assert_eq!(
        again.limit_hit,
        Some(skillbox_env::LimitKind::Memory),
        "{again:?}"
    );
    sandbox.cleanup().await.unwrap();
}

/// Under runc, skillbox's own helpers (init, the exec wrapper, the file helper) run from
/// execute-only interpreters: the sandbox user cannot read them, so the kernel makes
/// every process started from them non-dumpable from its first instruction. The
/// sandbox's code (the same uid) never has a moment in which it could write a helper's
/// memory. The plain interpreter, for contrast, starts dumpable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helpers_are_never_dumpable_under_runc() {
    let test = "helpers_are_never_dumpable_under_runc";
    let Some(backend) = backend(Runtime::Runc, test).await else {
        return;
    };
    let sandbox = backend.create(spec()).await.unwrap();
    let out = sandbox
        .exec(
            ExecRequest::shell(
                "/usr/lib/skillbox/perl -e 'print \"perl \", syscall(157, 3, 0, 0, 0, 0), \"\\n\"'; \
                 /usr/lib/skillbox/python3 -I -S -c 'import ctypes; print(\"python\", ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))'; \
                 /usr/bin/perl -e 'print \"plain \", syscall(157, 3, 0, 0, 0, 0), \"\\n\"'; \
                 cat /usr/lib/skillbox/perl > /dev/null 2>&1 || echo unreadable-perl; \
                 cat /usr/lib/skillbox/python3 > /dev/null 2>&1 || echo unreadable-python",
            ),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    let lines: Vec<String> = out.stdout_text().lines().map(str::to_string).collect();
    assert_eq!(
        lines,
        [
            "perl 0",
            "python 0",
            "plain 1",
            "unreadable-perl",
            "unreadable-python"
        ],
        "{out:?}"
    );
    // The file helper runs from the private python, and works.
    sandbox
        .write(
            std::path::Path::new("/workspace/f"),
            b"x",
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        sandbox
            .read_text(
                std::path::Path::new("/workspace/f"),
                &CancellationToken::new()
            )
            .await
            .unwrap(),
        "x"
    );
    sandbox.cleanup().await.unwrap();
}

/// The ids of the running containers this test process made.
async fn ours(docker: &Docker) -> Vec<String> {
    let filters = HashMap::from([("label".to_string(), vec![LABEL_SANDBOX.to_string()])]);
    let options = bollard::query_parameters::ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    let me = format!("/{}/", std::process::id());
    docker
        .list_containers(Some(options))
        .await
        .unwrap()
        .into_iter()
        .filter(|c| {
            c.labels
                .as_ref()
                .and_then(|l| l.get(LABEL_OWNER))
                .is_some_and(|owner| owner.contains(&me))
        })
        .filter_map(|c| c.id)
        .collect()
}

/// Waits (bounded) until the pool holds `n` ready containers.
async fn pool_holds(backend: &DockerBackend, n: usize) {
    for _ in 0..300 {
        if backend.pooled() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the pool holds {} containers, not {n}", backend.pooled());
}

/// A pool hands out containers it started before the create, each once, only to the
/// spec it was made for; it refills; shutdown leaves no container behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_hands_out_each_started_container_once() {
    let test = "a_pool_hands_out_each_started_container_once";
    let Some(backend) = backend(Runtime::Runc, test).await else {
        return;
    };
    let docker = docker().await;
    let backend = backend.with_pool(2, &spec()).unwrap();
    pool_holds(&backend, 2).await;
    let started = ours(&docker).await;
    assert_eq!(started.len(), 2, "{started:?}");

    let first = backend.create(spec()).await.unwrap();
    // Its place is refilled when it is cleaned up, not while it runs: the pool does not
    // start a container beside a run it serves (it would have started one by now).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        backend.pooled(),
        1,
        "the pool refilled while its sandbox ran"
    );
    assert_eq!(
        ours(&docker).await.len(),
        2,
        "a container was started beside the run"
    );
    // The timeout is the exec's, not the container's: still the pool's spec.
    let quick = SandboxSpec {
        limits: skillbox_env::Limits {
            timeout_ms: 1000,
            ..limits()
        },
        ..SandboxSpec::default()
    };
    let second = backend.create(quick).await.unwrap();
    for sandbox in [&first, &second] {
        assert!(
            started.iter().any(|id| id == sandbox.container_id()),
            "{} was not one of the pooled containers {started:?}",
            sandbox.container_id()
        );
    }
    assert_ne!(first.container_id(), second.container_id());
    // A pooled sandbox is a whole sandbox: it runs code under the wrapper, with files.
    first
        .write(
            std::path::Path::new("/workspace/in.txt"),
            b"pooled",
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    let out = first
        .exec(
            ExecRequest::shell("cat in.txt; id -u; grep Seccomp: /proc/self/status"),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let text = out.stdout_text();
    assert!(text.starts_with("pooled65532\n"), "{out:?}");
    assert!(text.contains("Seccomp:\t2"), "{out:?}");
    // Its execs take the caller's limits: the one-second timeout ends a sleep.
    let timed = second
        .exec(ExecRequest::shell("sleep 30"), &CancellationToken::new())
        .await
        .unwrap();
    assert!(timed.timed_out, "{timed:?}");

    // Refilled in the background, with new containers.
    pool_holds(&backend, 2).await;
    let now = ours(&docker).await;
    assert_eq!(now.len(), 4, "{now:?}");

    // A spec that makes another container is not served from the pool.
    let other = SandboxSpec {
        limits: skillbox_env::Limits {
            memory_bytes: Some(300 * 1024 * 1024),
            ..limits()
        },
        ..SandboxSpec::default()
    };
    let fresh = backend.create(other).await.unwrap();
    assert!(!now.iter().any(|id| id == fresh.container_id()));
    assert_eq!(backend.pooled(), 2);

    // Used once: a cleaned-up sandbox's container is removed, never pooled again.
    for sandbox in [&first, &second, &fresh] {
        sandbox.cleanup().await.unwrap();
        assert_removed(&docker, sandbox.container_id(), "after cleanup").await;
    }
    // A cleanup refills the place of what it removed.
    let taken = backend.create(spec()).await.unwrap();
    assert_eq!(backend.pooled(), 1);
    taken.cleanup().await.unwrap();
    pool_holds(&backend, 2).await;
    // A pooled container removed from outside is not handed out.
    let pooled = ours(&docker).await;
    for id in &pooled {
        docker
            .remove_container(
                id,
                Some(bollard::query_parameters::RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
    }
    let replacement = backend.create(spec()).await.unwrap();
    assert!(!pooled.iter().any(|id| id == replacement.container_id()));
    let out = replacement
        .exec(ExecRequest::shell("echo ok"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stdout_text(), "ok\n", "{out:?}");
    replacement.cleanup().await.unwrap();

    backend.shutdown().await;
    for _ in 0..100 {
        if ours(&docker).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("containers left after shutdown: {:?}", ours(&docker).await);
}

/// A pooled sandbox dropped without cleanup (a cancelled caller) is removed, and its
/// place is refilled once it is gone, as after a cleanup, though its take did not empty
/// the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_pooled_sandbox_has_its_place_refilled() {
    let test = "a_dropped_pooled_sandbox_has_its_place_refilled";
    let Some(backend) = backend(Runtime::Runc, test).await else {
        return;
    };
    let docker = docker().await;
    let backend = backend.with_pool(2, &spec()).unwrap();
    pool_holds(&backend, 2).await;
    let sandbox = backend.create(spec()).await.unwrap();
    assert_eq!(backend.pooled(), 1);
    let dropped = sandbox.container_id().to_string();
    drop(sandbox);
    assert_removed(&docker, &dropped, "after a drop").await;
    pool_holds(&backend, 2).await;
    let now = ours(&docker).await;
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(!now.contains(&dropped), "{now:?}");

    backend.shutdown().await;
    for _ in 0..100 {
        if ours(&docker).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("containers left after shutdown: {:?}", ours(&docker).await);
}

/// Shutdown right after the pool starts filling, and then the process's runtime goes
/// (as when `serve` returns): the containers still being started are removed before
/// shutdown returns, not left behind by starts the runtime's end cut short.
#[test]
fn shutdown_removes_pooled_containers_still_starting() {
    let test = "shutdown_removes_pooled_containers_still_starting";
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let serving = runtime();
    let ran = serving.block_on(async {
        let Some(backend) = backend(Runtime::Runc, test).await else {
            return false;
        };
        let backend = backend.with_pool(3, &spec()).unwrap();
        // Let the creates reach the daemon, but (mostly) not finish.
        tokio::time::sleep(Duration::from_millis(50)).await;
        backend.shutdown().await;
        assert_eq!(backend.pooled(), 0);
        true
    });
    // Whatever is still running on it is cut short here.
    drop(serving);
    if !ran {
        return;
    }
    runtime().block_on(async {
        let docker = docker().await;
        let left = ours(&docker).await;
        assert!(left.is_empty(), "left after shutdown: {left:?}");
        // Nor does one appear later from a create the daemon had already accepted.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let late = ours(&docker).await;
        assert!(late.is_empty(), "appeared after shutdown: {late:?}");
    });
}

/// The command tries to forge the exec wrapper's status line. It looks for the secret
/// in every process's command line and environment (where the nonce used to be) and
/// writes a status line with each candidate, claiming `exit 0`, while it keeps running.
/// It leaves processes behind that read every stderr they can open (their own, and
/// under gVisor the wrapper's through `/proc/<pid>/fd/2`) for the wrapper's real line,
/// to write a forged one with its tag after it. Then it exits 3. No forged status may
/// be taken: the exec reports 3, or, when a thief took the real line away, that the
/// command was killed (what killing it would have done too), never `exit 0`.
async fn check_status_line_cannot_be_forged(runtime: Runtime) {
    let test = "the_status_line_cannot_be_forged";
    let Some(backend) = backend(runtime, test).await else {
        return;
    };
    let sandbox = backend.create(spec()).await.unwrap();
    let script = r#"
import glob, os, re, sys, time
hexword = re.compile(rb'(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])')
found = set()
for d in glob.glob('/proc/[0-9]*'):
    for f in ('cmdline', 'environ'):
        try:
            found.update(hexword.findall(open(d + '/' + f, 'rb').read()))
        except OSError:
            pass
print('CANDIDATES', len(found), flush=True)
for secret in found:
    os.write(2, b'\0skillbox-status:' + secret + b':exit 0\n')
def ancestors():
    pid = os.getppid()
    while pid > 1:
        yield pid
        try:
            stat = open('/proc/%d/stat' % pid).read()
        except OSError:
            return
        pid = int(stat[stat.rindex(')') + 2:].split()[1])
def thief(path):
    if os.fork() != 0:
        return
    os.setsid()
    try:
        src = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        dst = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        os._exit(0)
    stolen, end = b'', time.time() + 10
    while time.time() < end:
        try:
            stolen += os.read(src, 65536)
        except BlockingIOError:
            time.sleep(0.002)
            continue
        m = re.search(rb'\0skillbox-status:([0-9a-f]{32}):', stolen)
        if m:
            os.write(dst, b'\0skillbox-status:' + m.group(1) + b':exit 0\n')
            os._exit(0)
    os._exit(0)
for pid in ['self'] + list(ancestors()):
    thief('/proc/%s/fd/2' % pid)
print('THIEVES', flush=True)
time.sleep(1)
sys.exit(3)
"#;
    let out = sandbox
        .exec(
            ExecRequest::argv(["python3", "-c", script]),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    let stdout = out.stdout_text();
    assert!(
        stdout.contains("CANDIDATES") && stdout.contains("THIEVES"),
        "the attack did not run: {out:?}"
    );
    let honest = (out.exit_code, out.signal) == (Some(3), None);
    let taken_away = (out.exit_code, out.signal) == (None, Some(libc::SIGKILL));
    if taken_away {
        eprintln!("{test}: a thief took the real status line away: reported as killed");
    }
    assert!(
        (honest || taken_away) && !out.timed_out,
        "a forged status line was taken: {out:?}"
    );
    // The sandbox still reports honestly afterwards.
    let next = sandbox
        .exec(ExecRequest::shell("exit 5"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(next.exit_code, Some(5), "{next:?}");
    sandbox.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_status_line_cannot_be_forged() {
    check_status_line_cannot_be_forged(Runtime::Runc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gvisor_status_line_cannot_be_forged() {
    check_status_line_cannot_be_forged(Runtime::Runsc).await;
}

/// The sandbox points a workspace name at a setuid-root binary of the image; the file
/// view then writes that name. The write replaces the symlink with a plain 0644 file:
/// it neither follows the link nor copies the target's setuid bit, so no setuid file is
/// left in the workspace, nor on the host through a `--workdir`.
async fn check_write_never_copies_setuid(runtime: Runtime) {
    use std::os::unix::fs::MetadataExt;
    let test = "a_write_through_a_symlink_never_copies_setuid";
    let Some(backend) = backend(runtime, test).await else {
        return;
    };
    let host = tempfile::tempdir().unwrap();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // A root-owned workdir is refused; the sandbox user owns this one.
        std::os::unix::fs::chown(host.path(), Some(65532), Some(65532)).unwrap();
    }
    // A caller's directory cannot be disk-bounded: this one asks for no bound.
    let on_host = SandboxSpec {
        workspace: Some(host.path().to_path_buf()),
        limits: skillbox_env::Limits {
            disk_bytes: None,
            disk_inodes: None,
            ..limits()
        },
        ..SandboxSpec::default()
    };
    let never = CancellationToken::new();
    for spec in [spec(), on_host] {
        let on_host = spec.workspace.is_some();
        let sandbox = backend.create(spec).await.unwrap();
        let out = sandbox
            .exec(
                ExecRequest::shell(
                    "ln -s /usr/bin/passwd tool && echo '#!/bin/sh' > kept && chmod 0750 kept && \
                     python3 -c 'import os; print(oct(os.stat(\"tool\").st_mode & 0o7777))'",
                ),
                &never,
            )
            .await
            .unwrap();
        assert_eq!(
            out.stdout_text().trim(),
            "0o4755",
            "the image's passwd is not setuid: {out:?}"
        );
        let tool = std::path::Path::new("/workspace/tool");
        sandbox
            .write(tool, b"#!/bin/sh\nid\n", &never)
            .await
            .unwrap();
        let info = sandbox.file_info(tool, &never).await.unwrap();
        assert_eq!(info.kind, skillbox_env::FileKind::File, "{info:?}");
        assert_eq!(info.mode, 0o644, "{test}: mode {:o}", info.mode);
        // A regular file keeps its permission bits when replaced.
        let kept = std::path::Path::new("/workspace/kept");
        sandbox.write(kept, b"#!/bin/sh\n", &never).await.unwrap();
        let info = sandbox.file_info(kept, &never).await.unwrap();
        assert_eq!(info.mode, 0o750, "{test}: mode {:o}", info.mode);
        // The link's target is untouched.
        let out = sandbox
            .exec(
                ExecRequest::argv([
                    "python3",
                    "-c",
                    "import os; p = '/usr/bin/passwd'; print(oct(os.stat(p).st_mode & 0o7777), \
                     open(p, 'rb').read(4) == b'\\x7fELF')",
                ]),
                &never,
            )
            .await
            .unwrap();
        assert_eq!(out.stdout_text(), "0o4755 True\n", "{out:?}");
        if on_host {
            let meta = std::fs::symlink_metadata(host.path().join("tool")).unwrap();
            assert!(meta.is_file(), "{meta:?}");
            assert_eq!(
                meta.mode() & 0o7777,
                0o644,
                "on the host: {:o}",
                meta.mode()
            );
        }
        sandbox.cleanup().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_write_through_a_symlink_never_copies_setuid() {
    check_write_never_copies_setuid(Runtime::Runc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_write_through_a_symlink_never_copies_setuid() {
    check_write_never_copies_setuid(Runtime::Runsc).await;
}

/// The sandbox plants a FIFO (no writer: a plain open for reading would wait forever),
/// a unix socket, and links to devices. Every read and append of the file view refuses
/// each at once, saying what it is; a batch read lists them as not files. Each call is
/// bounded here only so that a regression fails instead of hanging the suite.
async fn check_special_files_refused(runtime: Runtime) {
    let test = "special_files_are_refused_at_once";
    let Some(backend) = backend(runtime, test).await else {
        return;
    };
    let sandbox = backend.create(spec()).await.unwrap();
    let never = CancellationToken::new();
    let out = sandbox
        .exec(
            ExecRequest::shell(
                "mkfifo pipe && ln -s /dev/zero zero && ln -s pipe pipelink && \
                 python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && \
                 echo PLANTED",
            ),
            &never,
        )
        .await
        .unwrap();
    assert!(out.stdout_text().contains("PLANTED"), "{out:?}");
    let bound = Duration::from_secs(30);
    let cases = [
        ("pipe", "a FIFO"),
        ("pipelink", "a FIFO"),
        ("sock", "a socket"),
        ("zero", "a character device"),
        ("/dev/null", "a character device"),
    ];
    for (name, what) in cases {
        let path = std::path::Path::new(name);
        let results = [
            (
                "read_bytes",
                tokio::time::timeout(bound, sandbox.read_bytes(path, &never))
                    .await
                    .map(|r| r.map(drop)),
            ),
            (
                "read_text",
                tokio::time::timeout(bound, sandbox.read_text(path, &never))
                    .await
                    .map(|r| r.map(drop)),
            ),
            (
                "read_text_lines",
                tokio::time::timeout(bound, sandbox.read_text_lines(path, 10, &never))
                    .await
                    .map(|r| r.map(drop)),
            ),
            (
                "append",
                tokio::time::timeout(bound, sandbox.append(path, b"x", &never)).await,
            ),
        ];
        for (op, result) in results {
            let result = result.unwrap_or_else(|_| panic!("{test}: {op} {name} blocked"));
            let e = result.expect_err(&format!("{test}: {op} {name} succeeded"));
            assert_eq!(e.code, ErrorCode::Invalid, "{op} {name}: {e}");
            assert!(
                e.message.contains(what) && e.message.contains("not a regular file"),
                "{op} {name}: {e}"
            );
        }
    }
    let paths: Vec<std::path::PathBuf> = ["pipe", "sock", "zero"]
        .iter()
        .map(|p| std::path::PathBuf::from(format!("/workspace/{p}")))
        .collect();
    let read = tokio::time::timeout(bound, sandbox.read_files(&paths, 1024, &never))
        .await
        .expect("read_files blocked")
        .unwrap();
    assert_eq!(read, vec![skillbox_env::FileRead::NotFile; 3]);
    // Nothing was replaced: the FIFO and the socket are still what was planted.
    let out = sandbox
        .exec(
            ExecRequest::argv([
                "python3",
                "-c",
                "import os, stat; print(stat.S_ISFIFO(os.lstat('pipe').st_mode), \
                 stat.S_ISSOCK(os.lstat('sock').st_mode))",
            ]),
            &never,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_text(), "True True\n", "{out:?}");
    sandbox.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_special_files_are_refused_at_once() {
    check_special_files_refused(Runtime::Runc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gvisor_special_files_are_refused_at_once() {
    check_special_files_refused(Runtime::Runsc).await;
}

/// The peak resident memory of this test process (`VmHWM`), in bytes.
fn peak_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// The sandbox's code, running while the file view reads, watches for the file helper
/// and opens its stdout, then its stderr (`/proc/<pid>/fd/N`: gVisor lets a process of
/// the same uid open the fds of a non-dumpable one; runc's helpers never let it), to
/// push 512 MiB into each. A `read_bytes_max` of a small file with a 1 MiB bound still
/// takes at most about the bound from the helper: it answers the file's bytes, or that
/// there is more than a bound, and this process never holds the pushed bytes.
async fn check_read_bytes_max_holds_against_a_stuffed_helper(runtime: Runtime) {
    let test = "read_bytes_max_holds_against_a_stuffed_helper";
    let Some(backend) = backend(runtime, test).await else {
        return;
    };
    let sandbox = std::sync::Arc::new(backend.create(spec()).await.unwrap());
    let never = CancellationToken::new();
    let small = std::path::Path::new("/workspace/small");
    sandbox.write(small, b"0123456789", &never).await.unwrap();
    let script = r#"
import glob, os, sys, time
fd = sys.argv[1]
start = time.time()
grabbed = None
while grabbed is None and time.time() < start + 10:
    for d in glob.glob('/proc/[0-9]*'):
        try:
            argv = open(d + '/cmdline', 'rb').read().split(b'\0')
        except OSError:
            continue
        if b'readmax' in argv:
            try:
                grabbed = os.open(d + '/fd/' + fd, os.O_WRONLY)
                break
            except OSError:
                pass
print('GRABBED' if grabbed is not None else 'MISSED', flush=True)
if grabbed is not None:
    chunk, sent = b'x' * (1 << 20), 0
    try:
        while sent < (512 << 20) and time.time() < start + 15:
            sent += os.write(grabbed, chunk)
    except OSError as e:
        print('STOPPED', e, flush=True)
    print('SENT', sent, flush=True)
"#;
    for fd in ["1", "2"] {
        let attacker = {
            let sandbox = sandbox.clone();
            tokio::spawn(async move {
                sandbox
                    .exec(
                        ExecRequest::argv(["python3", "-c", script, fd]),
                        &CancellationToken::new(),
                    )
                    .await
                    .unwrap()
            })
        };
        let before = peak_memory();
        let started = std::time::Instant::now();
        while !attacker.is_finished() && started.elapsed() < Duration::from_secs(30) {
            let read = tokio::time::timeout(
                Duration::from_secs(60),
                sandbox.read_bytes_max(small, 1 << 20, &never),
            )
            .await
            .unwrap_or_else(|_| panic!("{test}: read_bytes_max is still waiting"));
            match read {
                Ok(bytes) => assert_eq!(bytes, b"0123456789"),
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::ResourceExhausted, "{e}");
                    assert!(e.message.contains("more than"), "{e}");
                }
            }
        }
        let grown = peak_memory().saturating_sub(before);
        let out = attacker.await.unwrap();
        let said = out.stdout_text();
        eprintln!(
            "{test}: fd {fd}: {said:?}, peak memory grew {} MiB",
            grown >> 20
        );
        if runtime == Runtime::Runsc {
            assert!(
                said.starts_with("GRABBED"),
                "{test}: the attack did not run: {out:?}"
            );
        }
        assert!(
            grown < 64 << 20,
            "{test}: reads with a 1 MiB bound took {} MiB through fd {fd}: {out:?}",
            grown >> 20
        );
    }
    sandbox.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_read_bytes_max_holds_against_a_stuffed_helper() {
    check_read_bytes_max_holds_against_a_stuffed_helper(Runtime::Runc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gvisor_read_bytes_max_holds_against_a_stuffed_helper() {
    check_read_bytes_max_holds_against_a_stuffed_helper(Runtime::Runsc).await;
}

/// The attack on a run's collection: the command leaves a process behind that stops
/// the walk the exec wrapper makes after the command (SIGSTOP, as the same user may).
/// The walk is cut at its bound, the exec reports the command's own exit in time (not
/// a timeout), and the walk after it is made afresh and sees what the attack left.
async fn check_a_stalled_walk_is_cut_at_its_bound(runtime: Runtime) {
    let test = "a_stalled_walk_is_cut_at_its_bound";
    let Some(backend) = backend(runtime, test).await else {
        return;
    };
    let sandbox = backend.create(spec()).await.unwrap();
    // The stopper waits for a child of the wrapper other than the command's shell (the
    // walk's fork), stops it, and says so in a file. 3000 files make the walk last
    // long enough to be seen.
    let stopper = r#"
import os, signal, sys, time
wrapper, shell = int(sys.argv[1]), int(sys.argv[2])
open('/workspace/ready', 'w').close()
end = time.time() + 20
while time.time() < end:
    for p in os.listdir('/proc'):
        if not p.isdigit() or int(p) in (shell, os.getpid()):
            continue
        try:
            stat = open('/proc/%s/stat' % p).read()
        except OSError:
            continue
        if int(stat[stat.rindex(')') + 2:].split()[1]) == wrapper:
            os.kill(int(p), signal.SIGSTOP)
            open('/workspace/stopped', 'w').write(p)
            sys.exit(0)
"#;
    let script = "mkdir many && python3 -c \"$MANY\" && \
                  { python3 -c \"$STOPPER\" $PPID $$ </dev/null >/dev/null 2>&1 & } && \
                  while [ ! -e ready ]; do sleep 0.01; done";
    let walk = skillbox_env::WalkAfter {
        root: "/workspace".into(),
        prune: Vec::new(),
        max_entries: 10_000,
    };
    let timeout = Duration::from_secs(13);
    let started = std::time::Instant::now();
    let out = sandbox
        .exec(
            ExecRequest::shell(script)
                .env(
                    "MANY",
                    "for i in range(3000): open('many/%d' % i, 'w').close()",
                )
                .env("STOPPER", stopper)
                .timeout(timeout)
                .walk_after(walk),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        (out.exit_code, out.signal, out.timed_out),
        (Some(0), None, false),
        "{out:?}"
    );
    assert!(took < timeout, "the exec took {took:?} of its {timeout:?}");
    let walked = sandbox
        .walk(
            std::path::Path::new("/workspace"),
            &[],
            10_000,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(
        walked.iter().any(|e| e.path == "stopped"),
        "the stopper never stopped the walk: {} entries",
        walked.len()
    );
    assert_eq!(
        walked
            .iter()
            .filter(|e| e.path.starts_with("many/"))
            .count(),
        3000
    );
    sandbox.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_docker_walk_is_cut_at_its_bound() {
    check_a_stalled_walk_is_cut_at_its_bound(Runtime::Runc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_gvisor_walk_is_cut_at_its_bound() {
    check_a_stalled_walk_is_cut_at_its_bound(Runtime::Runsc).await;
}
