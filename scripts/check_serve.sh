#!/usr/bin/env bash
# Does the `serve` extra (OpenEnv, for colbench.serve / colbench.client) still resolve
# beside the base dependencies, and beside the `vllm` extra? Run it whenever the serve or
# vllm pins change; not part of the default test suite (it asks PyPI).
#
#   scripts/check_serve.sh          # '.[serve]' and '.[serve,vllm]', dry runs in a throwaway venv
#
# Prints what pip picked (openenv, pillow, torch, vllm) and exits 1 when either fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip >/dev/null
for extras in serve serve,vllm; do
  echo "[check_serve] resolving '.[$extras]' beside the base dependencies"
  if ! "$tmp/venv/bin/python" -m pip install --dry-run --ignore-installed --quiet \
        --report "$tmp/report.json" -e ".[$extras]" >"$tmp/resolve.log" 2>&1; then
    tail -n 30 "$tmp/resolve.log"
    echo "[check_serve] FAIL: '.[$extras]' does not resolve (see above)"
    exit 1
  fi
  "$PY" - "$tmp/report.json" "$extras" <<'PYEOF'
import json, sys
picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
names = ("openenv", "pillow", "torch", "vllm")
print(f"[check_serve] .[{sys.argv[2]}] resolves: " + ", ".join(f"{n}=={picked[n]}" for n in names if n in picked))
PYEOF
done
