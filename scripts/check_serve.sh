#!/usr/bin/env bash
# Does the `serve` extra (OpenEnv, for colbench.serve / colbench.client) resolve beside the
# base dependencies, and how does it sit beside the `vllm` extra? Run it whenever the serve
# or vllm pins change; not part of the default test suite (it asks PyPI; the vLLM
# resolution downloads large wheels once).
#
#   scripts/check_serve.sh
#
# 1. '.[serve]' must resolve (exit 1 otherwise).
# 2. '.[serve,vllm]' is reported: today it cannot resolve, for two reasons in OpenEnv's own
#    requirements, not ours: every openenv / openenv-core release requires gradio, which caps
#    pillow below 13 while vLLM 0.33 needs pillow >= 13; and openenv caps fastmcp below 4,
#    whose mcp < 2 clashes with vLLM's mcp >= 2.2. When it starts to resolve, this says so.
# 3. The documented way to have both (docs/interop.md): '.[vllm]' plus fastmcp 4, websockets
#    and requests, then `pip install --no-deps openenv==0.10.0` (openenv imports neither gradio
#    nor a fastmcp-3-only API on the server/client paths we use). That resolution must succeed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip >/dev/null

resolve() {  # resolve NAME REQUIREMENTS...: 0 and a summary line when pip finds a solution
  local name="$1"; shift
  if "$tmp/venv/bin/python" -m pip install --dry-run --ignore-installed --report "$tmp/report.json" "$@" \
        >"$tmp/resolve.log" 2>&1; then
    "$PY" - "$tmp/report.json" "$name" <<'PYEOF'
import json, sys
picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
names = ("openenv", "fastmcp", "mcp", "pillow", "torch", "vllm")
print(f"[check_serve] {sys.argv[2]} resolves: " + ", ".join(f"{n}=={picked[n]}" for n in names if n in picked))
PYEOF
    return 0
  fi
  return 1
}

echo "[check_serve] 1/3 '.[serve]' beside the base dependencies"
if ! resolve ".[serve]" -e ".[serve]"; then
  grep -v '^WARNING: Location' "$tmp/resolve.log" | tail -n 30
  echo "[check_serve] FAIL: '.[serve]' does not resolve (see above)"
  exit 1
fi

echo "[check_serve] 2/3 '.[serve,vllm]'"
if resolve ".[serve,vllm]" -e ".[serve,vllm]"; then
  echo "[check_serve] note: '.[serve,vllm]' now resolves; docs/interop.md's two-step install is no longer needed"
else
  conflicts="$(grep -E '^ *(vllm|gradio|fastmcp) [^ ]+ depends on (pillow|mcp)' "$tmp/resolve.log" | sed 's/^ *//' \
                | awk '!seen[$1 FS $5]++' | tr '\n' ';' || true)"
  echo "[check_serve] .[serve,vllm] does not resolve (known, OpenEnv's pins): ${conflicts}"
fi

echo "[check_serve] 3/3 '.[vllm]' + fastmcp 4, then openenv --no-deps (the documented GPU install)"
if ! resolve ".[vllm]+fastmcp4" -e ".[vllm]" "fastmcp>=4,<5" websockets requests; then
  grep -v '^WARNING: Location' "$tmp/resolve.log" | tail -n 30
  echo "[check_serve] FAIL: the documented vLLM + OpenEnv install does not resolve (see above)"
  exit 1
fi
