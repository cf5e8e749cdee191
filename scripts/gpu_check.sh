#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (see bench/gpu_check.py for what it measures).
#
#   scripts/gpu_check.sh                 # 8B-shaped model, random bf16 weights: < 8 minutes on one H100/H200
#   SCALE=tiny scripts/gpu_check.sh      # the same stages, tiny model (what the test suite runs on CPU)
#   DIST=1 scripts/gpu_check.sh          # then the 2-process tests under the GPU launch configs (>= 2 GPUs)
#   scripts/gpu_check.sh --stages loop_async   # opt-in: LOOP sync vs async rollouts (~5 minutes at 8B)
#
# vlm_critic_step builds a second model in memory, Qwen2-VL-7B-shaped (8.3e9 parameters, random
# bf16 weights), and times one step of the frontend's vision-language critic on each head
# (not yet timed on a GPU).
#
# The last stage, trl_comparison (bench/trainer_vs_trl.py: our DPO/SFT steps vs TRL's), runs
# four processes that each load the model (about 2 minutes at 8B, not yet timed on a GPU): it
# gets what is left of the budget and is reported as failed if that runs out.
#
# Runs from the source tree with the machine's own torch / transformers / peft / accelerate
# (no install, no network, no vLLM): PYTHONPATH=. and offline hubs. Results go to
# $OUT/gpu_check.json and $OUT/summary.txt ($OUT defaults to runs/gpu_check).
#
# Distributed step (opt-in with DIST=1: it does not fit the 8 minutes above; each config
# launches about a dozen 2-process runs): with >= 2 GPUs (nvidia-smi -L) it runs the slow
# 2-process tests (critic, SWEET stage 2, LOOP: the weights of 1 process, and killed after a
# checkpoint then resumed; tests/sweet/conftest.py dist_config) with
# SWEET_DIST_CONFIGS=multi_gpu.yaml,fsdp.yaml,deepspeed_zero2.yaml,deepspeed_zero3.yaml (the
# DeepSpeed ones only if deepspeed imports; DIST_CONFIGS=... to choose), within DIST_TIMEOUT
# seconds (default 900; needs pytest). One JSON line per config in $OUT/distributed.json
# ({"config", "status": passed|failed|skipped, "reason", "tests"}), pytest's summary lines
# appended to $OUT/summary.txt, its whole output in $OUT/distributed.log. Without DIST=1 or
# with < 2 GPUs it records why ("skipped: 1 GPU(s)"). DIST_DRY_RUN=1: only collect (prints
# the command and which tests each config would run).
#
# Exit status: 0 when every stage ran (and no distributed config failed), 1 when one failed
# (its error is in the JSON), 124 on a timeout (the bench's or DIST_TIMEOUT).
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
rc=$?

# ---- distributed step ---------------------------------------------------------------------
DIST_JSON="$OUT/distributed.json"
skip_all() {  # one "skipped" line for the whole step, in the JSON and the summary
    echo "{\"config\": \"all\", \"status\": \"skipped\", \"reason\": \"$1\"}" > "$DIST_JSON"
    echo "distributed: skipped: $1" | tee -a "$OUT/summary.txt"
}
n_gpus=$( (command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null) | grep -c '^GPU ')
if (( n_gpus < 2 )); then
    skip_all "$n_gpus GPU(s)"; exit $rc
fi
if [[ "${DIST:-0}" != 1 ]]; then
    skip_all "$n_gpus GPUs, DIST=1 not set"; exit $rc
fi
if ! "$PY" -m pytest --version >/dev/null 2>&1; then
    skip_all "pytest not available"; exit $rc
fi
configs=() excluded=()
IFS=, read -ra wanted <<< "${DIST_CONFIGS:-multi_gpu.yaml,fsdp.yaml,deepspeed_zero2.yaml,deepspeed_zero3.yaml}"
for c in "${wanted[@]}"; do
    if [[ "$c" == deepspeed* ]] && ! "$PY" -c "import deepspeed" >/dev/null 2>&1; then excluded+=("$c"); else configs+=("$c"); fi
done
dist_configs=$(IFS=,; echo "${configs[*]}")
tests=(tests/sweet/test_train_critic.py::test_two_processes_killed_and_resumed_match_uninterrupted
       tests/sweet/test_policy_invariance.py::test_sweet_stage2_two_processes_match_one_and_survive_a_kill
       tests/sweet/test_loop.py::test_two_process_run_matches_one_and_survives_a_kill)
# -k: only the configs asked for (the two CPU ones always run in the test suite itself);
# SIGINT on timeout so that pytest still writes its summary and the JUnit XML.
cmd=("$PY" -m pytest -p no:cacheprovider -q -rA -m slow -k "not cpu_2proc" --junitxml "$OUT/distributed.xml" "${tests[@]}")
[[ "${DIST_DRY_RUN:-0}" == 1 ]] && cmd+=(--collect-only)
echo "distributed: SWEET_DIST_CONFIGS=$dist_configs timeout -s INT -k 60 ${DIST_TIMEOUT:-900} $(printf '%q ' "${cmd[@]}")" \
    | tee -a "$OUT/summary.txt"
: > "$OUT/distributed.log"
dist_rc=5  # pytest's "no tests collected", when every config asked for was excluded
if [[ -n "$dist_configs" ]]; then
    SWEET_DIST_CONFIGS="$dist_configs" timeout -s INT -k 60 "${DIST_TIMEOUT:-900}" "${cmd[@]}" > "$OUT/distributed.log" 2>&1
    dist_rc=$?
fi
{
# pytest's own summary (its "short test summary info" section onward), then one line per config;
# the JSON lines come from the JUnit XML (or, in a dry run, from the collected ids).
sed -n '/short test summary info/,$p' "$OUT/distributed.log" | grep . || tail -n 5 "$OUT/distributed.log"
"$PY" - "$OUT" "$dist_rc" "${DIST_TIMEOUT:-900}" "${DIST_DRY_RUN:-0}" "$dist_configs" "$(IFS=,; echo "${excluded[*]}")" <<'EOF'
import json, re, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, rc, limit, dry = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
configs, excluded = [c for c in sys.argv[5].split(",") if c], [c for c in sys.argv[6].split(",") if c]
log = (out / "distributed.log").read_text()

def config_of(name):  # test_x[fsdp.yaml-lm-29631] -> fsdp.yaml
    m = re.search(r"\[(.*)\]", name)
    return next((c for c in configs if m and c in m.group(1).split("-")), None)

cases = {c: [] for c in configs}  # config -> [(test, outcome, message)]
if dry:
    for line in log.splitlines():
        if "::" in line and config_of(line):
            cases[config_of(line)].append((line.strip(), "collected", ""))
elif (out / "distributed.xml").exists():
    for tc in ET.parse(out / "distributed.xml").getroot().iter("testcase"):
        name = tc.get("name", "")
        if (c := config_of(name)) is None:
            continue
        bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
        if bad is not None:
            cases[c].append((name, "failed", (bad.get("message") or "")[:300]))
        elif tc.find("skipped") is not None:
            cases[c].append((name, "skipped", tc.find("skipped").get("message") or ""))
        else:
            cases[c].append((name, "passed", ""))

lines = []
for c in configs:
    got = cases[c]
    counts = {k: sum(o == k for _, o, _ in got) for k in ("passed", "failed", "skipped", "collected") if any(o == k for _, o, _ in got)}
    if dry:
        status, reason = "dry-run", f"would run {len(got)} test(s)"
    elif counts.get("failed"):
        status, reason = "failed", "; ".join(f"{n}: {m}" for n, o, m in got if o == "failed")
    elif rc in (124, 137):  # `timeout` stopped pytest: this config's tests may not all have run
        status, reason = "failed", f"timed out after {limit} s (DIST_TIMEOUT)"
    elif not got:
        status, reason = "failed", f"no test ran (pytest exit {rc}, see distributed.log)"
    elif counts.get("passed"):
        status, reason = "passed", ""
    else:
        status, reason = "skipped", got[0][2]
    lines.append({"config": c, "status": status, "reason": reason, "tests": counts})
lines += [{"config": c, "status": "skipped", "reason": "deepspeed not importable", "tests": {}} for c in excluded]
(out / "distributed.json").write_text("".join(json.dumps(r) + "\n" for r in lines))
for r in lines:
    print(f"distributed: {r['config']}: {r['status']}" + (f" ({r['reason']})" if r["reason"] else ""))
EOF
} | tee -a "$OUT/summary.txt"
if (( rc == 0 )) && (( dist_rc == 124 || dist_rc == 137 )); then rc=124
elif (( rc == 0 )) && grep -q '"status": "failed"' "$DIST_JSON"; then rc=1; fi
exit $rc
