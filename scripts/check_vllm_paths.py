"""Every vLLM path of the framework, run for real with vLLM's CPU build on the tiny model
(scripts/check_vllm.sh runs it in .venv-vllm; docs/vllm.md). One line per path with its
measured figure; the exit status is the number of failed paths (a skipped one fails).

    .venv-vllm/bin/python scripts/check_vllm_paths.py                  # every path
    .venv-vllm/bin/python scripts/check_vllm_paths.py loop-lora server # some

Paths: engine (generation, log-probs, full-weight and LoRA sync against transformers),
stage2 (--sampler vllm:tiny), loop-lora, loop-full (--sampler vllm, 2 iterations each),
loop-async (--sampler vllm --async_rollouts), server (vLLM's OpenAI server as the simulated
human of an evaluate run), replicas (two servers, one killed mid-run), binding (the cores
each engine bound).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BOUND: list[str] = []  # the VLLM_CPU_OMP_THREADS_BIND each started server reported


def run(*args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} ... exited {proc.returncode}: {proc.stderr[-1500:]}")
    return proc


def runnable_tasks(path: Path) -> Path:
    """Test-bed tasks whose tests ("0", "1") do not call f: an answer scores 1 when it runs, so
    K episodes of the random tiny model at temperature 3 differ in reward (tests/sweet/test_loop.py)."""
    from testbed.env import make_tasks

    tasks = [replace(t, tests=("0", "1")) for t in make_tasks("train", n=4, bed="legacy")]
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    return path


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def path_engine(work: Path) -> str:
    xml = work / "engine.xml"
    run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/engines/test_vllm_cpu.py",
        f"--junitxml={xml}", timeout=900)
    cases = ET.parse(xml).getroot().iter("testcase")
    props = {p.get("name"): p.get("value") for case in cases for p in case.iter("property")}
    skipped = sum(1 for case in ET.parse(xml).getroot().iter("testcase") if case.find("skipped") is not None)
    if skipped or not props:
        raise RuntimeError(f"{skipped} test(s) skipped, figures {props}")
    return ", ".join(f"{k} {v}" for k, v in props.items())


def path_stage2(work: Path) -> str:
    tasks = runnable_tasks(work / "tasks.jsonl")
    run("-m", "colbench.evaluate", "--env", "testbed", "--agent", "tiny=tiny", "--simulator", "scripted:testbed",
        "--tasks", str(tasks), "--limit", "2", "--max_new_tokens", "8", "--dtype", "float32",
        "--output", str(work / "collect"))
    out = work / "stage2"
    run("-m", "sweet.train_policy", "--algorithm", "sweet", "--stage", "sample", "--model", "tiny",
        "--sampler", "vllm:tiny", "--critic", "oracle", "--env", "testbed", "--tasks", str(tasks),
        "--episodes", str(work / "collect" / "episodes" / "tiny.jsonl"), "--candidates_per_state", "4",
        "--max_new_tokens", "8", "--report_to", "none", "--output_dir", str(out))
    rows = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines()]
    cands = [c for r in rows for c in r["candidates"]]
    with_lp = sum(1 for c in cands if c.get("logprobs") and len(c["logprobs"]) == len(c["token_ids"]))
    if not rows or with_lp != len(cands):
        raise RuntimeError(f"{len(rows)} states, {with_lp}/{len(cands)} candidates with log-probs")
    return f"{len(rows)} states x 4 candidates sampled by vLLM, {with_lp}/{len(cands)} with token log-probs"


def loop(work: Path, name: str, *extra: str) -> list[dict]:
    out = work / name
    run("-m", "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", "tiny", "--sampler", "vllm",
        "--tasks", str(runnable_tasks(work / "tasks.jsonl")), "--iterations", "2", "--tasks_per_iteration", "2",
        "--k", "8", "--temperature", "2", "--max_new_tokens", "1", "--max_turns", "2", "--batch_size", "4",
        "--learning_rate", "1e-3", "--dtype", "float32", "--report_to", "none", "--output_dir", str(out), *extra,
        timeout=900)
    rows = metrics(out)  # the random tiny model: an iteration whose K episodes all score alike learns nothing
    if len(rows) != 2 or not any(r["loop/optimizer_steps"] > 0 for r in rows):
        raise RuntimeError(f"expected 2 iterations, one at least that learned, got {rows}")
    return rows


def gaps(rows: list[dict]) -> str:
    """The sampler/trainer log-prob gap of each iteration that trained ('-': nothing to train on)."""
    return "gap per iteration " + ", ".join(f"{r['loop/sampler_trainer_logprob_gap']:.1e}"
                                            if "loop/sampler_trainer_logprob_gap" in r else "-" for r in rows)


def path_loop_lora(work: Path) -> str:
    rows = loop(work, "loop-lora", "--lora", "true", "--lora_r", "4")
    return f"2 iterations, LoRA adapter reloaded each; {gaps(rows)}"


def path_loop_full(work: Path) -> str:
    rows = loop(work, "loop-full", "--decoupled_loss", "true", "--behaviour_weight_cap", "2")
    weights = ", ".join(f"{r['loop/behaviour_weight_mean']:.7f}" if "loop/behaviour_weight_mean" in r else "-"
                        for r in rows)
    return f"2 iterations, full weights reloaded each; {gaps(rows)}; decoupled pi_prox/pi_behav mean {weights}"


def path_loop_async(work: Path) -> str:
    rows = loop(work, "loop-async", "--async_rollouts", "true", "--staleness", "1", "--decoupled_loss", "true")
    lags = [r["loop/policy_lag"] for r in rows]
    if lags != [0.0, 1.0]:
        raise RuntimeError(f"policy lags {lags}, expected [0, 1]")
    weights = ", ".join(f"{r['loop/behaviour_weight_mean']:.7f}" if "loop/behaviour_weight_mean" in r else "-"
                        for r in rows)
    return f"lags {lags}; {gaps(rows)}; pi_prox/pi_behav mean {weights}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(work: Path, share: str) -> tuple[subprocess.Popen, str]:
    from engines.tiny import tiny_model_path

    port = free_port()
    log = open(work / f"server-{port}.log", "w")
    proc = subprocess.Popen([PY, "-m", "engines.vllm_serve", "--cpu-share", share, "--model", str(tiny_model_path()),
                             "--served-model-name", "tiny", "--port", str(port), "--dtype", "float32",
                             "--max-model-len", "2048"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 600) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server {url} exited {proc.returncode}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server {url} not ready after {timeout:.0f} s")


def bound(work: Path) -> list[str]:
    return [line.split("CPU threads bound to ")[1].split(" ")[0] for log in sorted(work.glob("server-*.log"))
            for line in log.read_text().splitlines() if "CPU threads bound to" in line]


def evaluate_with(work: Path, name: str, urls: list[str], on_first=None) -> tuple[int, int, int]:
    """An evaluate run on 3 backend tasks x 2 seeds whose simulated human is the server(s);
    returns (episodes, simulator failures, episodes expected)."""
    out = work / name
    cmd = [PY, "-m", "colbench.evaluate", "--env", "backend", "--agent", "tiny=tiny", "--simulator",
           f"openai:tiny@{','.join(urls)}", "--tasks", "builtin:train", "--limit", "3", "--episodes_per_task", "2",
           "--max_new_tokens", "16", "--simulator_max_new_tokens", "16", "--max_turns", "3", "--dtype", "float32",
           "--max_concurrent", "2", "--output", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    episodes = out / "episodes" / "tiny.jsonl"
    if on_first is not None:
        while proc.poll() is None and not (episodes.exists() and episodes.read_text().strip()):
            time.sleep(0.2)
        on_first()
    log, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"evaluate exited {proc.returncode}: {log[-1500:]}")
    rows = [json.loads(line) for line in episodes.read_text().splitlines()]
    return len(rows), sum(r.get("n_simulator_failures", 0) for r in rows), 6


def path_server(work: Path) -> str:
    proc, url = start_server(work, "0/1")
    try:
        wait_ready(proc, url)
        n, failures, expected = evaluate_with(work, "eval-server", [url])
    finally:
        proc.terminate()
        proc.wait(60)
    if n != expected or failures:
        raise RuntimeError(f"{n}/{expected} episodes, {failures} simulator failures")
    return f"{n}/{expected} backend episodes with vLLM's server as the human, {failures} simulator failures"


def path_replicas(work: Path) -> str:
    servers = [start_server(work, share) for share in ("0/2", "1/2")]
    try:
        for proc, url in servers:
            wait_ready(proc, url)
        victim = servers[1][0]
        n, failures, expected = evaluate_with(work, "eval-replicas", [u for _, u in servers], on_first=victim.kill)
    finally:
        for proc, _ in servers:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)
    if n != expected or failures:
        raise RuntimeError(f"{n}/{expected} episodes, {failures} simulator failures after a replica was killed")
    return f"{n}/{expected} episodes, {failures} simulator failures, one of two servers killed after the first episode"


def path_binding(work: Path) -> str:
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    binds = bound(work)
    if not binds:
        raise RuntimeError("no server reported its binding (run server/replicas first)")
    return f"affinity {cores}; servers bound to {' | '.join(binds)} (alone: all; 2 servers: one half each)"


PATHS = {"engine": path_engine, "stage2": path_stage2, "loop-lora": path_loop_lora, "loop-full": path_loop_full,
         "loop-async": path_loop_async, "server": path_server, "replicas": path_replicas, "binding": path_binding}


def main(argv: list[str]) -> int:
    names = argv or list(PATHS)
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        print(f"unknown path(s) {unknown}: expected some of {', '.join(PATHS)}", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory(prefix="check-vllm-", dir=ROOT / ".venv-vllm") as tmp:
        for name in names:
            work = Path(tmp)
            t0 = time.perf_counter()
            try:
                figure = PATHS[name](work)
                print(f"[check_vllm] {name:<10} ok   {time.perf_counter() - t0:5.0f} s  {figure}", flush=True)
            except Exception as e:  # noqa: BLE001 - one line per failed path, then the others
                failed += 1
                print(f"[check_vllm] {name:<10} FAIL {time.perf_counter() - t0:5.0f} s  {e}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
