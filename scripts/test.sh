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
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing: ${missing[*]} (not root or no apt-get: install them to run every test)" >&2
  fi
}

install_missing

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
