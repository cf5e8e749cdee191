#!/usr/bin/env bash
# Run every vLLM path of the project for real with vLLM's CPU build (docs/vllm.md). CI runs
# it after the test suite (.ci/run); run it whenever engines/vllm_*.py, sweet/core/sampler.py
# or the vLLM pins change.
#
#   scripts/check_vllm.sh                  # .venv-vllm (scripts/setup_vllm.sh), then every path
#   scripts/check_vllm.sh loop-lora server # some paths (scripts/check_vllm_paths.py names them)
#   scripts/check_vllm.sh --resolve-only   # only: does the GPU extra '.[vllm]' resolve beside the base?
#
# 1. API conformance: tests/engines/test_vllm_api.py in .venv-vllm (signatures, classes,
#    SamplingParams fields, LoRARequest, the worker extension, what collective_rpc sends).
# 2. every path: scripts/check_vllm_paths.py prints one line per path with its measured
#    figure; the exit status is non-zero when any path failed or was skipped.
# --resolve-only: `pip install --dry-run -e '.[vllm]'` in a throwaway venv (PyPI's CUDA
#    vLLM 0.33 beside the base's torch range); nothing is installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"

if [ "${1:-}" = "--resolve-only" ]; then
  echo "[check_vllm] resolving '.[vllm]' beside the base dependencies"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$PY" -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1
  if ! "$tmp/venv/bin/python" -m pip install --dry-run --ignore-installed --quiet \
        --report "$tmp/report.json" -e ".[vllm]" >"$tmp/resolve.log" 2>&1; then
    grep -v "is ignored" "$tmp/resolve.log" | tail -n 30
    echo "[check_vllm] FAIL: '.[vllm]' does not resolve with the base dependencies (see above)"
    exit 1
  fi
  "$PY" - "$tmp/report.json" <<'EOF'
import json, sys
picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
print("[check_vllm] resolves: " + ", ".join(f"{n}=={picked[n]}" for n in ("vllm", "torch", "torchvision", "transformers") if n in picked))
EOF
  exit 0
fi

start=$(date +%s)
source scripts/setup_vllm.sh  # .venv-vllm; exports VLLM_CACHE_ROOT, SWEET_CACHE, HF_HOME inside the repository
export PYTHONPATH="$ROOT" TOKENIZERS_PARALLELISM=false
echo "[check_vllm] machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

status=0
if out=$(.venv-vllm/bin/python -m pytest -q -p no:cacheprovider -rs tests/engines/test_vllm_api.py 2>&1) \
    && ! grep -q "skipped" <<<"$(tail -n 1 <<<"$out")"; then
  echo "[check_vllm] api        ok   $(tail -n 1 <<<"$out")"
else
  echo "$out" | tail -n 20
  echo "[check_vllm] api        FAIL $(tail -n 1 <<<"$out")"
  status=1
fi
.venv-vllm/bin/python scripts/check_vllm_paths.py "$@" || status=1
echo "[check_vllm] $([ $status = 0 ] && echo ok || echo FAILED) in $(( $(date +%s) - start )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
