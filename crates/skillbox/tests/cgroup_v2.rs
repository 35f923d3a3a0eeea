//! cgroup v2, on a kernel that has nothing else. This host mounts the memory, pids and
//! cpu controllers as cgroup v1, so its v2 hierarchy has none, while most users' hosts
//! are pure v2. This test boots the host's own Debian kernel in qemu (software
//! emulation) with only a v2 hierarchy, shares the host's root read-only over 9p, and
//! runs this build's `skillbox` there: as root in the root cgroup, and as an ordinary
//! user in a subtree delegated to it (as `systemd-run --scope -p Delegate=yes` gives).
//! Each run performs the real thing (a memory bomb, a fork bomb) and checks what the
//! kernel did and that no cgroup is left, through `exec` and through `serve`'s API
//! (its spawner process and its pool of prepared inits, each born in its cgroup).
//!
//! Needs root, qemu-system-x86_64, a kernel in /boot with its 9p modules, a static
//! busybox and cpio (`scripts/test.sh` installs them); skips otherwise, and fails
//! instead under `SKILLBOX_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::BIN;
use serde_json::Value;
use skillbox_env::testkit::skip;

/// Modules the guest needs for its root over 9p, in no particular order: their
/// dependencies are read from `modules.dep`.
const MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];
/// The uid of the ordinary user in the guest (its name does not matter).
const USER: u32 = 1000;

/// The guest's `/init`: mounts the host's root (9p, read-only) with fresh proc, sys,
/// dev, a v2-only `/sys/fs/cgroup` and a scratch tmpfs (on a host directory that does
/// not hold the binary under test, named in `/scratch`), then switches to it (a chroot
/// would keep user namespaces from being created) and runs the script the test wrote.
const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in $($B cat /modules/order); do
  $B insmod /modules/$m.ko || echo "guest: insmod $m failed"
done
H=/newroot
$B mkdir -p $H
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose hostroot $H || echo "guest: cannot mount the host root"
$B mount -t proc proc $H/proc
$B mount -t sysfs sys $H/sys
$B mount -t cgroup2 cgroup2 $H/sys/fs/cgroup
$B mount -t devtmpfs dev $H/dev
$B mount -t tmpfs tmpfs $H$($B cat /scratch)
$B cp /script /api.py $H$($B cat /scratch)/
exec $B switch_root $H /bin/sh $($B cat /scratch)/script
"#;

/// The guest's client of `skillbox serve` on the port it is given: waits for the server,
/// runs a script, waits for the native pool to fill, runs one in a sandbox made ahead
/// and a fork bomb, and prints what came back with the pool's counters as one JSON line.
const API: &str = r#"import json, os, sys, time, urllib.error, urllib.request
base = "http://127.0.0.1:" + sys.argv[1]
server = sys.argv[2]
def get(path):
    return urllib.request.urlopen(base + path, timeout=60).read().decode()
def run(script):
    body = json.dumps({"script": script, "language": "sh", "backend": "native"}).encode()
    request = urllib.request.Request(base + "/v1/run", data=body, headers={"Content-Type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(request, timeout=300))
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()}
def metric(name):
    for line in get("/metrics").splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
def wait(what, until, seconds):
    deadline = time.time() + seconds
    while True:
        try:
            if until():
                return
        except OSError:
            pass
        if not os.path.exists("/proc/" + server):
            print(json.dumps({"error": "the server exited, waiting for " + what}))
            sys.exit()
        if time.time() > deadline:
            print(json.dumps({"error": "timed out: " + what}))
            sys.exit()
        time.sleep(0.5)
wait("the server", lambda: get("/healthz"), 240)
out = {"first": run("cat /proc/self/cgroup; echo hi")}
wait("the native pool", lambda: metric("skillbox_warm_sandboxes_ready") == 2, 240)
out["warm"] = run("cat /proc/self/cgroup; echo hi")
out["pids"] = run("for i in $(seq 300); do sleep 60 & done; wait")
for outcome in ["taken", "missed"]:
    out[outcome] = metric('skillbox_warm_sandboxes_total{outcome="' + outcome + '"}')
wait("the native pool, again", lambda: metric("skillbox_warm_sandboxes_ready") >= 1, 240)
out["ready"] = metric("skillbox_warm_sandboxes_ready")
print(json.dumps(out))
"#;

/// What the guest runs, as root in the root cgroup and then as `USER` in a delegated
/// subtree. Results go to the second serial port, one `@@name value` line each (the
/// console carries the kernel's messages, which could interleave).
fn script(bin: &str, scratch: &str, runtimes: &str) -> String {
    format!(
        r#"exec 3>/dev/ttyS1
S={bin}
# 100 MB in one line: tail holds all of it in memory.
BOMB='head -c 100000000 /dev/zero | tail | wc -c'
mark() {{ name=$1; shift; printf '@@%s ' "$name" >&3; "$@" 2>&1 | tr -d '\n' >&3; echo >&3; }}
left() {{ find /sys/fs/cgroup -mindepth 1 -type d -name 'skillbox-*' ! -name skillbox-supervisor | tr '\n' ' '; }}
as_root() {{ "$S" --data-dir {scratch}/root "$@"; }}
mark kernel uname -r
mark controllers cat /sys/fs/cgroup/cgroup.controllers
mark root_doctor as_root doctor --json
mark root_memory as_root exec --json --memory 64M --pids none -- sh -c "$BOMB"
mark root_memory_fits as_root exec --json --memory 256M --pids none -- sh -c "$BOMB"
mark root_pids as_root exec --json --memory none --pids 8 -- sh -c 'for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 2 & done; wait'
mark root_defaults as_root exec --json -- sh -c 'cat /proc/self/cgroup; echo hi'
# This kernel cannot clone a detached mount: root's disk bound is a tmpfs kept as the
# only mount of a mount namespace of its own, never mounted on the host.
mark root_disk as_root exec --json --disk 8M -- sh -c 'head -c 20000000 /dev/zero > /workspace/big'
mark root_disk_mounts grep -c '{scratch}/root/native' /proc/self/mountinfo
mark root_left left
# The API: runs through the spawner process and the native pool of prepared inits, each
# born in its cgroup (CLONE_INTO_CGROUP). Stopped, the server leaves no cgroup.
/bin/busybox ip link set lo up
# serve installs the Node runtime at start: the host set one up (the guest has no network).
cp -a {runtimes} {scratch}/root/
"$S" --data-dir {scratch}/root serve --addr 127.0.0.1:8091 --warm-containers 0 2>{scratch}/root-serve.log &
server=$!
mark root_serve python3 {scratch}/api.py 8091 $server
# Its pool's sandboxes are alive now, each with its /workspace tmpfs (3/4 of the 1G
# bound): none of them is mounted on the host. (The control shows the grep finds one
# that is.)
mark root_serve_mounts grep -c 'size=786432k' /proc/self/mountinfo
mkdir {scratch}/control
mark mounts_control sh -c 'mount -t tmpfs -o size=786432k control "$1" && grep -c size=786432k /proc/self/mountinfo; umount "$1"' sh {scratch}/control
kill -TERM $server; wait $server
mark root_serve_log tail -c 3000 {scratch}/root-serve.log
mark root_serve_left left

# Delegation, as `systemd-run --scope -p Delegate=yes` gives it: each run starts alone
# in a fresh cgroup that the user owns, with its control files.
echo '+memory +pids +cpu' > /sys/fs/cgroup/cgroup.subtree_control
mkdir {scratch}/user
chown {USER}:{USER} {scratch}/user
delegated() {{
  scope=$(mktemp -d -p /sys/fs/cgroup user.XXXXXX)
  chown {USER}:{USER} "$scope" "$scope/cgroup.procs" "$scope/cgroup.subtree_control" "$scope/cgroup.threads"
  echo "$scope"
}}
as_user() {{
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$(delegated)" \
    env HOME={scratch}/user setpriv --reuid {USER} --regid {USER} --clear-groups "$S" --data-dir {scratch}/user/data "$@"
}}
mark user_id setpriv --reuid {USER} --regid {USER} --clear-groups id -u
mark user_doctor as_user doctor --json
# Unprivileged on this kernel a detached mount cannot be cloned into an exec: the
# sandbox's tmpfs is kept attached in its helper's own namespaces, each exec attaches a
# clone made there, and nothing is mounted on the host.
mark user_disk as_user exec --json --disk 8M -- sh -c 'head -c 20000000 /dev/zero > /workspace/big'
mark user_memory as_user exec --json --memory 64M --pids none -- sh -c "$BOMB"
mark user_memory_fits as_user exec --json --memory 256M --pids none -- sh -c "$BOMB"
mark user_pids as_user exec --json --memory none --pids 8 -- sh -c 'for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 2 & done; wait'
mark user_defaults as_user exec --json -- sh -c 'echo hi; grep -c " /workspace " /proc/self/mountinfo'
mark user_no_disk as_user exec --json --disk none -- sh -c 'echo hi'
mark user_left left
# The API as the user, alone in its delegated cgroup, with the default disk bound.
cp -a {runtimes} {scratch}/user/data/
chown -R {USER}:{USER} {scratch}/user/data/runtimes
# (Not through as_user: a function in the background is a subshell, and $! its pid.)
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$(delegated)" \
  env HOME={scratch}/user setpriv --reuid {USER} --regid {USER} --clear-groups \
  "$S" --data-dir {scratch}/user/data serve --addr 127.0.0.1:8092 --warm-containers 0 \
  2>{scratch}/user-serve.log &
server=$!
mark user_serve python3 {scratch}/api.py 8092 $server
# Its pool's sandboxes are alive now, each with its /workspace tmpfs (3/4 of the 1G
# bound): none of them is mounted on the host.
mark user_serve_mounts grep -c 'size=786432k' /proc/self/mountinfo
kill -TERM $server; wait $server
mark user_serve_log tail -c 3000 {scratch}/user-serve.log
mark user_serve_left left
# A delegated cgroup shared with another process (the shell stays in it): v2 cannot hand
# controllers down, and doctor says why and what to do.
shared=$(mktemp -d -p /sys/fs/cgroup user.XXXXXX)
chown {USER}:{USER} "$shared" "$shared/cgroup.procs" "$shared/cgroup.subtree_control" "$shared/cgroup.threads"
mark user_shared sh -c 'echo $$ > "$1/cgroup.procs"; env HOME={scratch}/user setpriv --reuid {USER} --regid {USER} --clear-groups "$2" --data-dir {scratch}/user/data doctor --json' sh "$shared" "$S"
mark done true
echo o > /proc/sysrq-trigger
sleep 30
"#
    )
}

/// A host directory for the guest's scratch tmpfs: one that exists (a mount point on
/// the read-only root) and does not hold the binary under test, which the tmpfs would
/// hide.
fn scratch_dir() -> String {
    ["/run", "/srv", "/mnt", "/opt", "/media", "/tmp"]
        .into_iter()
        .find(|dir| Path::new(dir).is_dir() && !Path::new(BIN).starts_with(dir))
        .expect("a directory for the guest's scratch space")
        .to_string()
}

/// Why this host cannot boot the guest, if it cannot.
fn missing() -> Option<String> {
    if !cfg!(target_arch = "x86_64") {
        return Some("the guest is an x86_64 kernel".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (the guest's 9p root is exported by qemu as root)".into());
    }
    for tool in ["qemu-system-x86_64", "cpio"] {
        if !on_path(tool) {
            return Some(format!("{tool} is missing (scripts/test.sh installs it)"));
        }
    }
    if !is_static(Path::new("/bin/busybox")) {
        return Some("no static /bin/busybox (Debian: busybox-static)".into());
    }
    None
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            fs::metadata(dir.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// An ELF without a program interpreter: it runs with no libraries around it.
fn is_static(path: &Path) -> bool {
    let Ok(out) = Command::new("readelf").arg("-lW").arg(path).output() else {
        return false;
    };
    out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("program interpreter")
}

/// The newest kernel in /boot whose modules include 9p, with its modules directory.
fn kernel() -> Result<(PathBuf, PathBuf), String> {
    let mut found: Vec<(PathBuf, PathBuf)> = Vec::new();
    for entry in fs::read_dir("/boot").map_err(|e| format!("/boot: {e}"))? {
        let name = entry.map_err(|e| format!("/boot: {e}"))?.file_name();
        let Some(version) = name.to_str().and_then(|n| n.strip_prefix("vmlinuz-")) else {
            continue;
        };
        let modules = Path::new("/lib/modules").join(version);
        if modules.join("modules.dep").is_file() {
            found.push((Path::new("/boot").join(&name), modules));
        }
    }
    found.sort();
    found
        .pop()
        .ok_or_else(|| "no kernel in /boot with modules (Debian: linux-image-amd64)".into())
}

/// `modules` and what they depend on, dependencies first, as (name, path below the
/// modules dir). Built-in modules are left out: there is nothing to load.
fn load_order(modules_dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let dep_file = modules_dir.join("modules.dep");
    let text = fs::read_to_string(&dep_file).map_err(|e| format!("{}: {e}", dep_file.display()))?;
    let builtin = fs::read_to_string(modules_dir.join("modules.builtin")).unwrap_or_default();
    let name_of = |path: &str| -> String {
        let file = path.rsplit('/').next().unwrap_or(path);
        file.split(".ko").next().unwrap_or(file).replace('-', "_")
    };
    let deps: BTreeMap<String, (String, Vec<String>)> = text
        .lines()
        .filter_map(|line| {
            let (module, rest) = line.split_once(':')?;
            Some((
                name_of(module),
                (
                    module.to_string(),
                    rest.split_whitespace().map(str::to_string).collect(),
                ),
            ))
        })
        .collect();
    fn visit(
        name: &str,
        deps: &BTreeMap<String, (String, Vec<String>)>,
        name_of: &dyn Fn(&str) -> String,
        order: &mut Vec<(String, PathBuf)>,
    ) {
        if order.iter().any(|(n, _)| n == name) {
            return;
        }
        let Some((path, needs)) = deps.get(name) else {
            return;
        };
        for need in needs {
            visit(&name_of(need), deps, name_of, order);
        }
        order.push((name.to_string(), PathBuf::from(path)));
    }
    let mut order = Vec::new();
    for module in MODULES {
        if deps.contains_key(module) {
            visit(module, &deps, &name_of, &mut order);
        } else if !builtin.lines().any(|l| name_of(l) == module) {
            return Err(format!(
                "kernel module {module}: neither in modules.dep nor built in"
            ));
        }
    }
    Ok(order)
}

/// A module's bytes, uncompressed (busybox's insmod takes plain `.ko` files).
fn module_bytes(path: &Path) -> Result<Vec<u8>, String> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".ko.xz") {
        Some("xz")
    } else if name.ends_with(".ko.zst") {
        Some("zstd")
    } else if name.ends_with(".ko.gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => fs::read(path).map_err(|e| format!("{name}: {e}")),
        Some(tool) => {
            let out = Command::new(tool)
                .args(["-dc"])
                .arg(path)
                .output()
                .map_err(|e| format!("{tool} -dc {name}: {e}"))?;
            if !out.status.success() {
                return Err(format!("{tool} -dc {name} failed"));
            }
            Ok(out.stdout)
        }
    }
}

/// The guest's initramfs, gzip-compressed newc cpio of `root`.
fn initramfs(root: &Path, out: &Path) {
    let list = Command::new("sh")
        .arg("-c")
        .arg("find . | cpio -o -H newc --quiet | gzip -1")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .expect("run cpio");
    assert!(list.status.success(), "cpio failed");
    fs::write(out, list.stdout).unwrap();
}

fn write_executable(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Boots the guest and returns its `@@name value` lines, and the console for messages.
fn boot(
    dir: &Path,
    runtimes: &Path,
    kernel: &Path,
    modules_dir: &Path,
    order: &[(String, PathBuf)],
) -> (BTreeMap<String, String>, String) {
    let root = dir.join("initramfs");
    for sub in ["bin", "proc", "sys", "dev", "modules"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    let mut names = String::new();
    for (name, path) in order {
        let bytes = module_bytes(&modules_dir.join(path)).unwrap_or_else(|e| panic!("{e}"));
        fs::write(root.join("modules").join(format!("{name}.ko")), bytes).unwrap();
        names.push_str(name);
        names.push('\n');
    }
    fs::write(root.join("modules/order"), names).unwrap();
    write_executable(&root.join("init"), INIT);
    let scratch = scratch_dir();
    fs::write(root.join("scratch"), &scratch).unwrap();
    fs::write(
        root.join("script"),
        script(BIN, &scratch, &runtimes.to_string_lossy()),
    )
    .unwrap();
    fs::write(root.join("api.py"), API).unwrap();
    let initrd = dir.join("initrd.gz");
    initramfs(&root, &initrd);

    let results = dir.join("results");
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "1"])
        .args(["-nographic", "-no-reboot", "-net", "none"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            "console=ttyS0 quiet panic=-1 rdinit=/init",
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-serial",
            "mon:stdio",
            "-serial",
        ])
        .arg(format!("file:{}", results.display()))
        .stdin(Stdio::null());
    // The guest powers itself off; a hung guest is killed by `timeout`.
    let out = Command::new("timeout")
        .arg("600")
        .arg(qemu.get_program())
        .args(qemu.get_args())
        .stdin(Stdio::null())
        .output()
        .expect("run qemu");
    let console =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let text = fs::read_to_string(&results).unwrap_or_default();
    let marks = text
        .lines()
        .filter_map(|line| {
            let line = line.trim_end_matches('\r').strip_prefix("@@")?;
            let (name, value) = line.split_once(' ').unwrap_or((line, ""));
            Some((name.to_string(), value.to_string()))
        })
        .collect();
    (marks, console)
}

fn json(marks: &BTreeMap<String, String>, name: &str, console: &str) -> Value {
    let text = marks
        .get(name)
        .unwrap_or_else(|| panic!("the guest printed no {name}; console:\n{console}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {text}"))
}

/// The native backend's `layer` in a `doctor --json`.
fn native_layer(doctor: &Value, layer: &str) -> Value {
    doctor["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == "native"))
        .map(|native| native["layers"][layer].clone())
        .unwrap_or_default()
}

/// `doctor` says the disk bound holds, by a tmpfs kept in a mount namespace of its own
/// (this kernel cannot clone a detached mount).
fn assert_kept(doctor: &Value) {
    let disk = native_layer(doctor, "disk_limit");
    assert_eq!(disk["available"], true, "{disk}");
    assert!(
        disk["detail"]
            .as_str()
            .unwrap_or("")
            .contains("kept in a mount namespace of its own"),
        "{disk}"
    );
}

fn cgroup_detail(doctor: &Value) -> String {
    native_layer(doctor, "cgroup")["detail"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// What the guest's API client saw: each run in a cgroup of its own (the root of its
/// cgroup namespace), one of them in a sandbox made ahead, and the pids limit held.
fn assert_serve(serve: &Value) {
    assert_eq!(serve["error"], Value::Null, "{serve}");
    for run in ["first", "warm"] {
        assert_eq!(serve[run]["exitCode"], 0, "{run}: {serve}");
        assert_eq!(serve[run]["stdout"], "0::/\nhi\n", "{run}: {serve}");
    }
    assert_eq!(serve["pids"]["limitHit"], "pids", "{serve}");
    assert!(
        serve["taken"].as_u64().is_some_and(|n| n >= 1),
        "no run took a sandbox made ahead: {serve}"
    );
}

#[test]
fn limits_hold_on_a_pure_cgroup_v2_kernel() {
    let test = "limits_hold_on_a_pure_cgroup_v2_kernel";
    if let Some(reason) = missing() {
        skip(test, &reason);
        return;
    }
    let found = kernel().and_then(|(kernel, modules)| {
        let order = load_order(&modules)?;
        Ok((kernel, modules, order))
    });
    let (kernel, modules_dir, order) = match found {
        Ok(found) => found,
        Err(reason) => {
            skip(test, &reason);
            return;
        }
    };
    // The Node runtime `serve` installs at start, set up here (the guest has no
    // network) beside the binary, which the guest's scratch tmpfs never hides.
    let prepared = Path::new(BIN).with_file_name("cgroup-v2-data");
    let setup = Command::new(BIN)
        .arg("--data-dir")
        .arg(&prepared)
        .args(["setup", "--no-wasm"])
        .output()
        .expect("run skillbox setup");
    assert!(
        setup.status.success(),
        "skillbox setup: {}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let (marks, console) = boot(
        dir.path(),
        &prepared.join("runtimes"),
        &kernel,
        &modules_dir,
        &order,
    );
    let show = |name: &str| -> String { marks.get(name).cloned().unwrap_or_default() };
    // Shown when the test fails (nextest keeps a passing test's output to itself).
    for (name, value) in &marks {
        eprintln!("guest: {name}: {value}");
    }
    assert!(
        marks.contains_key("done"),
        "the guest did not finish; console:\n{console}"
    );
    let controllers = show("controllers");
    for controller in ["memory", "pids", "cpu"] {
        assert!(
            controllers.split_whitespace().any(|c| c == controller),
            "the guest's v2 hierarchy lacks {controller}: {controllers}"
        );
    }

    // Root, in the root cgroup.
    let doctor = json(&marks, "root_doctor", &console);
    let detail = cgroup_detail(&doctor);
    assert!(detail.starts_with("v2 at /sys/fs/cgroup "), "{detail}");
    assert_kept(&doctor);
    let memory = json(&marks, "root_memory", &console);
    assert_eq!(memory["limitHit"], "memory", "{memory}");
    assert_ne!(memory["stdout"], "100000000\n", "{memory}");
    let fits = json(&marks, "root_memory_fits", &console);
    assert_eq!(fits["stdout"], "100000000\n", "{fits}");
    assert_eq!(fits["limitHit"], Value::Null, "{fits}");
    let pids = json(&marks, "root_pids", &console);
    assert_eq!(pids["limitHit"], "pids", "{pids}");
    let defaults = json(&marks, "root_defaults", &console);
    assert_eq!(defaults["exitCode"], 0, "{defaults}");
    // Its own cgroup namespace: the sandbox sees its cgroup as the root.
    assert_eq!(defaults["stdout"], "0::/\nhi\n", "{defaults}");
    let disk = json(&marks, "root_disk", &console);
    assert_eq!(disk["limitHit"], "disk", "{disk}");
    assert!(
        disk["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("No space left"),
        "{disk}"
    );
    assert_eq!(
        show("root_disk_mounts"),
        "0",
        "the sandbox's tmpfs is still mounted"
    );
    assert_eq!(show("root_left"), "", "cgroups left behind");
    let serve = json(&marks, "root_serve", &console);
    assert_serve(&serve);
    assert_eq!(
        show("mounts_control"),
        "1",
        "the grep for a sandbox's tmpfs does not find one mounted on purpose"
    );
    assert_eq!(
        show("root_serve_mounts"),
        "0",
        "a sandbox's tmpfs is mounted on the host"
    );
    assert_eq!(show("root_serve_left"), "", "cgroups left behind by serve");

    // An ordinary user in a delegated subtree.
    assert_eq!(show("user_id"), USER.to_string());
    let detail = cgroup_detail(&json(&marks, "user_doctor", &console));
    assert!(detail.starts_with("v2 at /sys/fs/cgroup/user."), "{detail}");
    assert_kept(&json(&marks, "user_doctor", &console));
    let disk = json(&marks, "user_disk", &console);
    assert_eq!(disk["limitHit"], "disk", "{disk}");
    assert!(
        disk["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("No space left"),
        "{disk}"
    );

    let memory = json(&marks, "user_memory", &console);
    assert_eq!(memory["limitHit"], "memory", "{memory}");
    assert_ne!(memory["stdout"], "100000000\n", "{memory}");
    let fits = json(&marks, "user_memory_fits", &console);
    assert_eq!(fits["stdout"], "100000000\n", "{fits}");
    let pids = json(&marks, "user_pids", &console);
    assert_eq!(pids["limitHit"], "pids", "{pids}");
    let defaults = json(&marks, "user_defaults", &console);
    assert_eq!(defaults["exitCode"], 0, "{defaults}");
    assert_eq!(defaults["stdout"], "hi\n1\n", "{defaults}");
    let no_disk = json(&marks, "user_no_disk", &console);
    assert_eq!(no_disk["stdout"], "hi\n", "{no_disk}");
    assert_eq!(show("user_left"), "", "cgroups left behind");
    let serve = json(&marks, "user_serve", &console);
    assert_serve(&serve);
    assert!(serve["ready"].as_u64().is_some_and(|n| n >= 1), "{serve}");
    assert_eq!(
        show("user_serve_mounts"),
        "0",
        "a sandbox's tmpfs is mounted on the host"
    );
    assert_eq!(show("user_serve_left"), "", "cgroups left behind by serve");
    let detail = cgroup_detail(&json(&marks, "user_shared", &console));
    assert!(
        detail.starts_with("none: cannot enable") && detail.contains("Delegate=yes"),
        "{detail}"
    );
}
