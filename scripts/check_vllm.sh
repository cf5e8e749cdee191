#!/usr/bin/env bash
# Check the project against the vLLM its `vllm` extra installs. Run it whenever
# engines/vllm_engine.py, engines/vllm_worker.py or the torch/vLLM pins change; it is not
# part of the default test suite (the first run downloads several GB of CUDA wheels).
#
#   scripts/check_vllm.sh                  # resolve, build (cached), API-conformance test on CPU
#   scripts/check_vllm.sh --resolve-only   # only: does '.[vllm]' still resolve beside the base?
#
# 1. resolve: `pip install --dry-run -e '.[vllm]'` in a throwaway venv; fails (exit 1) when
#    the extra stops resolving, e.g. the base's torch range no longer admits vLLM's pin.
# 2. build:   a venv with the package and the vllm + test extras under
#    ${SWEET_VLLM_VENV:-~/.cache/sweet/vllm-venv-<hash of the torch/vllm pins>}: rebuilt when
#    those pins change, brought up to date by one (cheap) pip install when anything else in
#    pyproject.toml changes.
# 3. check:   tests/engines/test_vllm_api.py in that venv (CPU: signatures, classes,
#    SamplingParams fields, LoRARequest, the worker extension and what collective_rpc
#    serialises). It is skipped in the default suite, where vLLM is not installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
key="$(grep -E '"(torch|torchvision|vllm)[^a-z_-]' pyproject.toml | sha1sum | cut -c1-12)"
stamp="installed-$(sha1sum pyproject.toml | cut -c1-12)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sweet"
mkdir -p "$CACHE"

echo "[check_vllm] 1/3 resolving '.[vllm]' beside the base dependencies"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip >/dev/null
if ! "$tmp/venv/bin/python" -m pip install --dry-run --ignore-installed --quiet \
      --report "$tmp/report.json" -e ".[vllm]" >"$tmp/resolve.log" 2>&1; then
  tail -n 30 "$tmp/resolve.log"
  echo "[check_vllm] FAIL: '.[vllm]' does not resolve with the base dependencies (see above)"
  exit 1
fi
"$PY" - "$tmp/report.json" <<'EOF'
import json, sys
picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
print("[check_vllm] resolves: " + ", ".join(f"{n}=={picked[n]}" for n in ("vllm", "torch", "torchvision", "transformers") if n in picked))
EOF
[ "${1:-}" = "--resolve-only" ] && exit 0

VENV="${SWEET_VLLM_VENV:-$CACHE/vllm-venv-$key}"
echo "[check_vllm] 2/3 environment $VENV"
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
if [ ! -f "$VENV/.$stamp" ]; then
  # No pre-installed torch here: vLLM's exact torch pin decides (CUDA wheels from PyPI).
  "$VENV/bin/python" -m pip install -q -e ".[vllm,test]"
  rm -f "$VENV"/.installed-*
  touch "$VENV/.complete" "$VENV/.$stamp"
fi
"$VENV/bin/python" -c "import vllm, torch; print('[check_vllm] vllm', vllm.__version__, 'torch', torch.__version__)"

echo "[check_vllm] 3/3 API conformance (CPU)"
# The editable install points at this checkout; the tiny model is built into the cache if missing.
"$VENV/bin/python" -m engines.tiny >/dev/null
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/engines/test_vllm_api.py "$@"
