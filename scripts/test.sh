#!/usr/bin/env bash
# The one test command: installs what the tests need when it can, then the format
# check, clippy with warnings as errors, and every test.
#
#   scripts/test.sh                      # local: tests that cannot run here skip, with a reason
#   SKILLBOX_REQUIRE_ALL=1 scripts/test.sh   # CI: a skip is a failure
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n==> %s\n' "$*"; }

install_missing() {
  local missing=()
  command -v bwrap >/dev/null || missing+=(bubblewrap)
  command -v hyperfine >/dev/null || missing+=(hyperfine)
  command -v python3 >/dev/null || missing+=(python3)
  command -v setpriv >/dev/null || missing+=(util-linux)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v runsc >/dev/null || missing+=(runsc)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  # The release binary's checks read its machine code (scripts/check_entry.py).
  command -v objdump >/dev/null || missing+=(binutils)
  # The egress tests make network namespaces and put an address on their lo.
  command -v ip >/dev/null || missing+=(iproute2)
  # pip and npm install through the egress proxy, from the sandbox's /usr/bin/python3.
  /usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  # The web UI's browser test (crates/skillbox/tests/ui.rs) drives Debian's chromium, and
  # its slide previews render with LibreOffice and pdftoppm; without their recommends.
  local lean=()
  command -v chromium >/dev/null || lean+=(chromium)
  command -v soffice >/dev/null || lean+=(libreoffice-impress)
  command -v pdftoppm >/dev/null || lean+=(poppler-utils)
  # The records' tests on Postgres (serve --db) start clusters of their own with it.
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || lean+=(postgresql)
  # scripts/cluster.sh puts three nodes behind it.
  [ -x /usr/sbin/haproxy ] || lean+=(haproxy)
  # The cgroup v2 test boots the host's kernel in qemu (crates/skillbox/tests/cgroup_v2.rs);
  # installed without their recommends (qemu's would bring a GUI).
  local vm=()
  if [ "$(uname -m)" = x86_64 ]; then
    command -v qemu-system-x86_64 >/dev/null || vm+=(qemu-system-x86)
    command -v cpio >/dev/null || vm+=(cpio)
    compgen -G '/boot/vmlinuz-*' >/dev/null || vm+=(linux-image-amd64)
    { [ -x /bin/busybox ] && ! readelf -lW /bin/busybox | grep -q 'program interpreter'; } || vm+=(busybox-static)
  fi
  [ ${#missing[@]} -eq 0 ] && [ ${#vm[@]} -eq 0 ] && [ ${#lean[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} ${vm[*]} ${lean[*]}"
    apt-get update -qq
    if [ ${#missing[@]} -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if [ ${#vm[@]} -gt 0 ] || [ ${#lean[@]} -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${vm[@]}" "${lean[@]}" >/dev/null
    fi
  else
    echo "missing: ${missing[*]} ${vm[*]} ${lean[*]} (not root or no apt-get: install them to run every test)" >&2
  fi
}

install_missing

# gVisor's runsc, registered with the daemon. Without --network=none it refuses to
# start in the root network namespace on this kind of machine.
register_runsc() {
  [ "$(id -u)" = 0 ] && command -v runsc >/dev/null || return 1
  python3 - "$(command -v runsc)" <<'PY'
import json, os, sys
path = '/etc/docker/daemon.json'
config = {}
if os.path.exists(path):
    with open(path) as f:
        text = f.read()
    config = json.loads(text) if text.strip() else {}
want = {'path': sys.argv[1], 'runtimeArgs': ['--network=none']}
if config.get('runtimes', {}).get('runsc') == want:
    sys.exit(1)
config.setdefault('runtimes', {})['runsc'] = want
os.makedirs('/etc/docker', exist_ok=True)
with open(path, 'w') as f:
    json.dump(config, f, indent=2)
print('registered runsc in', path)
PY
}

daemon_answers() { timeout 10 docker info >/dev/null 2>&1; }

start_docker() {
  local changed=0
  register_runsc && changed=1
  if daemon_answers; then
    # A running daemon reads the new runtime on SIGHUP.
    if [ "$changed" = 1 ] && pidof dockerd >/dev/null; then kill -HUP "$(pidof dockerd)"; sleep 1; fi
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
    say "starting dockerd (log: /var/log/skillbox-dockerd.log)"
    nohup dockerd >/var/log/skillbox-dockerd.log 2>&1 &
    for _ in $(seq 60); do daemon_answers && return 0; sleep 1; done
    tail -20 /var/log/skillbox-dockerd.log >&2 || true
  fi
  echo "no Docker daemon answers: the docker and gvisor tests will skip" >&2
  return 1
}

if start_docker; then
  say "skillbox image build (the docker/gvisor runtime image; skipped when up to date)"
  cargo build -p skillbox
  if ! target/debug/skillbox --data-dir target/skillbox-image-data image build; then
    echo "image build failed: the docker and gvisor tests will fail or skip" >&2
    [ "${SKILLBOX_REQUIRE_ALL:-}" = 1 ] && exit 1
  fi
fi

# The wasm backend's guests (CPython and QuickJS for WASI, pinned by SHA-256) and their
# compile for this host, shared by every wasm test through SKILLBOX_WASM_HOME.
say "wasm guests (scripts/wasm-guests.sh; skipped when up to date)"
export SKILLBOX_WASM_HOME=$PWD/target/wasm-home
cargo build -p skillbox
if ! target/debug/skillbox --data-dir target/skillbox-image-data setup; then
  echo "skillbox setup failed: the wasm guest tests will fail or skip" >&2
  if [ "${SKILLBOX_REQUIRE_ALL:-}" = 1 ]; then exit 1; fi
fi

# A venv at DIR/venv holding the pins of the requirements file PINS, redone only when
# PINS changed since (DIR/venv/pinned.txt keeps the copy installed). Without venv or pip
# (offline) it says so, as WHO, naming WHAT will skip, and goes on.
pinned_venv() {
  local dir=$1 pins=$2 who=$3 what=$4
  mkdir -p "$dir"
  if [ ! -x "$dir/venv/bin/python" ] && ! python3 -m venv "$dir/venv"; then
    rm -rf "$dir/venv"
    echo "$who: python3 -m venv failed (apt-get install python3-venv): $what will skip" >&2
  elif ! cmp -s "$pins" "$dir/venv/pinned.txt"; then
    if "$dir/venv/bin/python" -m pip install -q --disable-pip-version-check -r "$pins"; then
      cp "$pins" "$dir/venv/pinned.txt"
    else
      echo "$who: pip could not install $pins: $what will skip" >&2
    fi
  fi
}

# The MCP clients skillbox did not write, for crates/skillbox/tests/mcp.rs: the Python
# `mcp` package (pinned in crates/skillbox/tests/mcp_clients/requirements.txt) in a venv,
# and the MCP Inspector (pinned with its package-lock.json) by npm ci, both under
# target/mcp-clients and redone only when a pin changes. Offline, or without venv, pip or
# npm, this says so and goes on: those tests then skip (fail under SKILLBOX_REQUIRE_ALL=1).
say "MCP clients (mcp from PyPI, the MCP Inspector from npm; skipped when up to date)"
mcp_clients() {
  local dir=$PWD/target/mcp-clients pins=crates/skillbox/tests/mcp_clients
  pinned_venv "$dir" "$pins/requirements.txt" "MCP clients" "the Python MCP client tests"
  if ! command -v npm >/dev/null; then
    echo "MCP clients: no npm: the MCP Inspector test will skip" >&2
  elif ! cmp -s "$pins/inspector/package-lock.json" "$dir/inspector/package-lock.json"; then
    rm -rf "$dir/inspector" && mkdir -p "$dir/inspector"
    cp "$pins/inspector/package.json" "$pins/inspector/package-lock.json" "$dir/inspector/"
    if ! (cd "$dir/inspector" && npm ci --no-audit --no-fund --loglevel=error >/dev/null); then
      rm -rf "$dir/inspector"
      echo "MCP clients: npm ci of the MCP Inspector failed: its test will skip" >&2
    fi
  fi
}
mcp_clients

# The web UI's browser test (crates/skillbox/tests/ui.rs): Python Playwright (pinned in
# crates/skillbox/tests/ui_browser/requirements.txt) in a venv under target/ui-browser,
# redone only when the pin changes. It drives Debian's chromium: Playwright's own browser
# download is never run. Offline, or without venv or pip, this says so and goes on: the
# test then skips (a failure under SKILLBOX_REQUIRE_ALL=1).
say "Playwright for the UI test (from PyPI; skipped when up to date)"
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 pinned_venv "$PWD/target/ui-browser" \
  crates/skillbox/tests/ui_browser/requirements.txt "UI test" "the browser test"

# A real S3 server for the tests of `serve --store s3://…` (crates/skillbox-store/tests/s3.rs,
# crates/skillbox/tests/cli/store.rs): moto's, pinned with what it pulls in
# (scripts/s3/requirements.txt), in a venv under target/s3, redone only when a pin changes.
# Offline, or without venv or pip, this says so and goes on: those tests then skip (a
# failure under SKILLBOX_REQUIRE_ALL=1).
say "moto's S3 server (from PyPI; skipped when up to date)"
pinned_venv "$PWD/target/s3" scripts/s3/requirements.txt "S3 tests" "they"

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

say "tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast
else
  cargo test --workspace --all-features --no-fail-fast
fi

# The Python client (clients/python): ruff (format and lint) and mypy --strict over the
# package and its tests, then pytest against a real `skillbox serve` that the tests start
# (target/debug/skillbox). The tools and the package (editable) go into a venv under
# target/. Without Python 3.11+ or pip this says so and goes on; under
# SKILLBOX_REQUIRE_ALL=1 that fails.
say "python client (clients/python: ruff, mypy, pytest)"
python_client() {
  local venv=$PWD/target/python-client-venv bin=$PWD/target/debug/skillbox
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "python client: no python3 >= 3.11 here: its tests did not run" >&2
    return 2
  fi
  if [ ! -x "$venv/bin/python" ] && ! python3 -m venv "$venv"; then
    rm -rf "$venv"
    echo "python client: python3 -m venv failed (no venv or pip; apt-get install python3-venv): its tests did not run" >&2
    return 2
  fi
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "clients/python[test]"; then
    echo "python client: pip could not install the package and its test tools: its tests did not run" >&2
    return 2
  fi
  (cd clients/python && "$venv/bin/ruff" format --check . && "$venv/bin/ruff" check .) || return 1
  (cd clients/python && "$venv/bin/mypy") || return 1
  (cd clients/python && SKILLBOX_BIN=$bin "$venv/bin/python" -m pytest -q) || return 1
}
python_status=0
python_client || python_status=$?
if [ "$python_status" = 1 ] || { [ "$python_status" = 2 ] && [ "${SKILLBOX_REQUIRE_ALL:-}" = 1 ]; }; then
  exit 1
fi

# Three nodes on one Postgres database and one bucket, behind HAProxy, each in a network
# namespace of its own (scripts/cluster.sh), with the debug binary the tests used. It
# needs root; under SKILLBOX_REQUIRE_ALL=1 a machine that cannot run it fails.
say "three nodes behind a balancer (scripts/cluster.sh)"
if [ "$(id -u)" = 0 ] && [ -x /usr/sbin/haproxy ] && [ -x target/s3/venv/bin/moto_server ] &&
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  scripts/cluster.sh target/debug/skillbox
else
  echo "cluster: needs root, haproxy, postgresql and moto's server (target/s3/venv): not run" >&2
  if [ "${SKILLBOX_REQUIRE_ALL:-}" = 1 ]; then exit 1; fi
fi

# The release binary is built differently (static-pie): check that it is static and that
# it runs a sandbox, with the check of issue 2's first "Done means".
say "the release binary (scripts/dist.sh)"
binary=$(scripts/dist.sh)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/data" "$scratch/ws"
"$binary" --data-dir "$scratch/data" exec --workdir "$scratch/ws" --json -- \
  sh -c 'id -u; echo hi > /workspace/x; cat /etc/shadow' > "$scratch/out.json" || true
python3 - "$scratch" <<'PY'
import json, os, sys
scratch = sys.argv[1]
out = json.load(open(os.path.join(scratch, "out.json")))
uid = out["stdout"].split()[0]
problems = []
if uid == "0":
    problems.append("the sandbox ran as uid 0")
if out["exitCode"] == 0 or "/etc/shadow" not in out["stderr"]:
    problems.append("reading /etc/shadow did not fail")
if open(os.path.join(scratch, "ws", "x")).read() != "hi\n":
    problems.append("/workspace/x was not written")
if problems:
    sys.exit(f"release binary: {'; '.join(problems)}: {out}")
print(f"release binary: uid {uid}, wrote /workspace/x, /etc/shadow refused")
PY
# wasmtime in the static-pie binary: a CPython guest (from the cache the tests used)
# prints its answer and cannot read the host's /etc/passwd.
wasm_out=$("$binary" --data-dir "$scratch/data" exec --backend wasm -- python3 -c \
  "print(1+1)
try:
    open('/etc/passwd').read(); print('ESCAPED')
except OSError as e:
    print('refused', type(e).__name__)")
if [ "$wasm_out" != "$(printf '2\nrefused FileNotFoundError')" ]; then
  echo "release binary: the wasm guest printed: $wasm_out" >&2
  exit 1
fi
echo "release binary: a wasm CPython guest ran, /etc/passwd refused"
# Its entry point sends a plain exec to `skillbox warm` before glibc has relocated the
# binary: its machine code must need nothing glibc sets up, and every path of it must
# answer as exec does (a slip there shows only in this binary).
python3 scripts/check_entry.py "$binary" | tail -1
python3 scripts/check_warm_client.py "$binary"
