#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (see bench/gpu_check.py for what it measures).
#
#   scripts/gpu_check.sh                 # 8B-shaped model, random bf16 weights: < 8 minutes on one H100/H200
#   SCALE=tiny scripts/gpu_check.sh      # the same stages, tiny model (what the test suite runs on CPU)
#
# Runs from the source tree with the machine's own torch / transformers / peft / accelerate
# (no install, no network, no vLLM): PYTHONPATH=. and offline hubs. Results go to
# $OUT/gpu_check.json and $OUT/summary.txt ($OUT defaults to runs/gpu_check).
# Exit status: 0 when every stage ran, 1 when one failed (its error is in the JSON), 124 on timeout.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/gpu_check}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
PY="${PYTHON:-python3}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
# 480 s hard limit: stages not started after --budget_s (420 s) are skipped and reported.
timeout 480 "$PY" bench/gpu_check.py --scale "${SCALE:-8b}" --out "$OUT" "$@" 2> >(tee "$OUT/stderr.log" >&2)
