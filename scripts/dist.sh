#!/usr/bin/env bash
# The release binary: skillbox as one static-pie executable (glibc linked in, still
# position-independent, so ASLR applies). It starts ~0.4 ms faster than the dynamic
# `cargo build --release` binary: no dynamic loader, no shared libraries to map and
# bind, fewer mappings for the sandbox's init to copy. See docs/benchmarks.md.
#
#   scripts/dist.sh        # builds it and prints its path
#
# Host names (only a live model's URL has one) resolve through glibc's NSS modules,
# which a static glibc loads from the host at run time: run the binary on a host with
# the glibc it was built against, or give the model URL as an IP address.
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  *-linux-gnu) ;;
  *) echo "scripts/dist.sh: host $host: a static-pie build needs a *-linux-gnu target" >&2; exit 1 ;;
esac
# With an explicit --target, these flags reach only what runs on the target (the
# binary and its libraries), not build scripts or proc macros, which cannot be static.
cargo build --release -q -p skillbox --target "$host" \
  --config "target.$host.rustflags=[\"-C\", \"target-feature=+crt-static\"]"
binary=$PWD/target/$host/release/skillbox
# No program interpreter: nothing is loaded at run time but the binary itself.
if readelf -lW "$binary" | grep -q 'Requesting program interpreter'; then
  echo "scripts/dist.sh: $binary is dynamically linked" >&2
  exit 1
fi
echo "$binary"
