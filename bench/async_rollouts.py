"""Asynchronous vs synchronous LOOP rollouts: iteration throughput where rollouts wait on a
slow simulated human, and (optionally) what each learns on the test bed.

    python bench/async_rollouts.py                        # throughput, lag 1, 4 s per reply
    python bench/async_rollouts.py --latency 0.5 --ppo-epochs 2 --staleness 2
    python bench/async_rollouts.py --learning --seeds 3   # instead: success after the same episodes
    python bench/async_rollouts.py --learning --decoupled # and async with the decoupled PPO loss
    python bench/async_rollouts.py --learning --decoupled --eval-tasks val   # the same runs, validation tasks
    python bench/async_rollouts.py --decoupled            # throughput, the async run with that loss

Throughput: LOOP (`sweet.train_policy --algorithm loop`) on the backend environment with an
LLM simulated human (`simulators.llm`) whose OpenAI-compatible server (a local HTTP server,
tests/local_http.py) answers every request after `--latency` seconds. The tiny policy
samples one token per turn at temperature 3 and the tasks' tests do not call the function,
so an answer scores 1 exactly when it runs. `min_abs_advantage 0` keeps every episode, so
every iteration does the same training work whatever its rewards. Both runs play the same
episodes per iteration and iterations.

R (rollout: play and score one iteration's episodes) and T (the rest: the no-grad pass and
the updates) are the synchronous run's means per iteration; a two-stage pipeline at lag 1
gives at most (R + T) / max(R, T), so the defaults (4 s per reply, of which R is then mostly
waiting, and 3 epochs) put R near T, where the pipeline can matter; with R >> T or T >> R
it cannot. Async iteration times run from the loop's start (after the pipeline fill: the
first s iterations' rollouts) to each iteration's log line. The headline ratio is the
steady state, sync / (mean async iteration that trained while a rollout played); the last
s iterations have nothing left to play and are reported apart, and a second line gives the
whole run's ratio with the fill and that drain included.

Learning (`--learning`): sync and async LOOP from the test bed's warm start (the main
job's, `testbed.pipeline.warm_start`), the test bed's LOOP settings (testbed/pipeline.py), the
same iterations and so the same episodes, then `colbench.evaluate` on the test tasks;
success with a 95% interval over (seed x test task) clusters, and each async variant minus
sync, paired. `--decoupled` adds async LOOP with `--decoupled_loss` (the trust region around
the trainer's current policy, the lag corrected by the weight π_prox / π_behav).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from statistics import fmean as mean

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the local OpenAI-compatible server (tests/local_http.py)


def human_server(latency: float):
    """An OpenAI-compatible chat server that answers every request with one fixed
    two-sentence reply after `latency` seconds (requests are served concurrently)."""
    from http.server import BaseHTTPRequestHandler

    from local_http import LocalServer, send_json

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(latency)
            send_json(self, 200, {"id": "x", "object": "chat.completion", "model": "human", "choices": [
                {"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "I am not sure. Please just try."}}]})

        def log_message(self, *args):
            pass

    return LocalServer(Handler)


def runnable_backend_tasks(path: Path, n: int) -> Path:
    """Backend tasks whose two tests ("0", "1") do not call the function: an answer scores 1
    exactly when it runs."""
    from colbench.tasks import load_tasks

    tasks = [replace(t, tests=("0", "1"), meta={}) for t in load_tasks("builtin:train", env="backend")[:n]]
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    return path


class Clock:
    """Times LOOP's rollouts (`Collector.play`) and iterations (`report`) in this process."""

    def __init__(self):
        from sweet.algorithms import loop
        from sweet.core.sampler import Collector

        self.loop, self.collector, self.plays, self.marks = loop, Collector, [], []
        self.play, self.report, self.start = Collector.play, loop.report, Collector.start

    def __enter__(self):
        clock = self

        def play(collector, *args, **kwargs):
            t0 = time.perf_counter()
            out = clock.play(collector, *args, **kwargs)
            clock.plays.append(time.perf_counter() - t0)
            return out

        def start(collector, first):
            t0 = time.perf_counter()
            clock.start(collector, first)
            clock.fill = time.perf_counter() - t0
            clock.marks.append(time.perf_counter())

        def report(*args, **kwargs):
            clock.marks.append(time.perf_counter())
            return clock.report(*args, **kwargs)

        self.collector.play, self.collector.start, self.loop.report = play, start, report
        return self

    def __exit__(self, *exc):
        self.collector.play, self.collector.start, self.loop.report = self.play, self.start, self.report

    @property
    def iteration_times(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def run_loop(out: Path, flags: dict) -> Clock:
    from sweet.algorithms import loop
    from colbench.cli import make_configs

    with Clock() as clock:
        try:
            loop.main(*make_configs(loop.CONFIGS, {**flags, "output_dir": str(out), "report_to": "none"}))
        except SystemExit as e:
            # every group of K tied (the tiny model's answer runs about one time in 20): with
            # min_abs_advantage 0 each iteration still did its updates, which is what is timed
            if not str(e.code).startswith("LOOP:"):
                raise
            print(f"{out.name}: {e.code}", file=sys.stderr)
    return clock


def throughput(args, work: Path) -> None:
    import torch

    torch.set_num_threads(args.threads)
    server = human_server(args.latency)
    flags = {"env": "backend", "model": "tiny", "tasks": str(runnable_backend_tasks(work / "tasks.jsonl", 8)),
             "simulator": f"openai:human@{server.url}", "iterations": args.iterations,
             "tasks_per_iteration": args.tasks_per_iteration, "k": args.k, "temperature": 3.0,
             "max_new_tokens": 1, "max_turns": args.max_turns, "batch_size": args.batch_size,
             "micro_batch_size": 8, "ppo_epochs": args.ppo_epochs, "learning_rate": 1e-3, "seed": 0,
             "min_abs_advantage": 0.0}
    try:
        sync = run_loop(work / "sync", flags)
        lagged = run_loop(work / "async", {**flags, "async_rollouts": True, "staleness": args.staleness,
                                           "decoupled_loss": args.decoupled})
    finally:
        server.close()
    print_throughput(summarize(sync, lagged, args.staleness), args)


def summarize(sync: Clock, lagged: Clock, staleness: int) -> dict[str, float]:
    """The throughput figures from the two runs' clocks.

    Sync: R = mean rollout, T = mean iteration − R. Async at lag s: the loop's iterations
    0..N−s−1 each train while a background rollout plays iteration i+s; the last s
    iterations have nothing left to sample and take only T. The steady state (what a long
    run gets per iteration) is the mean of the former; the whole run adds the pipeline fill
    (the first s rollouts, before the loop) and the s drain iterations."""
    n = len(lagged.iteration_times)
    if n <= staleness:
        raise ValueError(f"--iterations must exceed --staleness ({staleness}) to time an overlapped iteration")
    r, it_sync = mean(sync.plays), mean(sync.iteration_times)
    steady = mean(lagged.iteration_times[: n - staleness])
    whole_async = lagged.fill + sum(lagged.iteration_times)
    return {"R": r, "T": it_sync - r, "sync": it_sync, "steady": steady, "fill": lagged.fill,
            "drain": mean(lagged.iteration_times[n - staleness:]), "background": mean(lagged.plays[staleness:]),
            "ratio": it_sync / steady, "whole_ratio": sum(sync.iteration_times) / whole_async,
            "bound": it_sync / max(r, it_sync - r), "iterations": n}


def print_throughput(f: dict[str, float], args) -> None:
    episodes = args.tasks_per_iteration * args.k
    print(f"simulated human: a local OpenAI-compatible server answering after {args.latency:g} s per reply; "
          f"{f['iterations']} iterations x {episodes} episodes ({args.tasks_per_iteration} tasks x K={args.k}), "
          f"up to {args.max_turns} agent turns, {args.ppo_epochs} epochs of batch {args.batch_size}, both runs")
    print(f"sync:  R (rollout) {f['R']:.2f} s + T (training) {f['T']:.2f} s = {f['sync']:.2f} s per iteration; "
          f"bound at lag 1: (R+T)/max(R,T) = {f['bound']:.2f}x")
    loss = ", decoupled loss" if args.decoupled else ""
    print(f"async (lag {args.staleness}{loss}): {f['steady']:.2f} s per overlapped iteration, background rollouts "
          f"{f['background']:.2f} s each (R'); pipeline fill {f['fill']:.2f} s, last {args.staleness} "
          f"iteration(s) without rollout {f['drain']:.2f} s")
    print(f"whole run, fill and drain included: async / sync {f['whole_ratio']:.2f}x over {f['iterations']} iterations")
    print(f"async / sync iteration throughput: {f['ratio']:.1f}x ({f['ratio']:.2f}; steady state)   "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, torch threads {args.threads})")


def learning(args, work: Path) -> None:
    from colbench.stats import bootstrap_ci
    from sweet.core.records import load_episodes
    from testbed.pipeline import TestbedSetup, evaluate, train_policy, warm_start

    setup = TestbedSetup(test_limit=args.test_limit)
    if args.eval_tasks == "val":  # the same trained runs, scored on the validation tasks instead
        setup = replace(setup, test_tasks=setup.val_tasks)
    eval_dir = "eval" if args.eval_tasks == "test" else "eval_val"
    warm = Path(args.warm_start) if args.warm_start else warm_start(work / "warm_start")
    lagged = {"async_rollouts": True, "staleness": args.staleness}
    variants = {"sync": {}, "async": lagged}
    if args.decoupled:
        variants["async_decoupled"] = {**lagged, "decoupled_loss": True}
    success: dict[str, dict] = {v: {} for v in ("warm_start", *variants)}
    episodes = args.learning_iterations * 8 * 6  # testbed/pipeline.py's LOOP: 8 tasks x K=6 per iteration
    for seed in range(args.seeds):
        sd = work / "learning" / f"seed{seed}"
        models = {"warm_start": str(warm)}
        for v, extra in variants.items():  # the same seed: the same tasks and episode seeds per iteration
            models[v] = str(train_policy("loop", sd, str(warm), setup, sd / v, seed=seed,
                                         extra={**extra, "iterations": args.learning_iterations}))
            print(f"seed {seed}: {v} LOOP trained ({models[v]})", flush=True)
        evaluate(models, setup, sd / eval_dir, seed_round=seed)
        for v in models:
            for ep in load_episodes(sd / eval_dir / "episodes" / f"{v}.jsonl", env="testbed"):
                success[v].setdefault((seed, ep.task_id), []).append(float(ep.success))
    print(f"learning: test bed ({setup.test_tasks}, first {args.test_limit or 'all'} tasks x {setup.eval_seeds} "
          f"episodes), warm start {warm}, {args.seeds} seeds, {episodes} training episodes per LOOP run, "
          f"async at lag {args.staleness}")
    for v in success:
        ci = bootstrap_ci(list(success[v].values()))
        print(f"  {v:10s} success {ci.value:.3f} [{ci.low:.3f}, {ci.high:.3f}] (95%, (seed x task) clusters)")
    lagged_variants = [v for v in variants if v != "sync"]
    for seed in range(args.seeds):
        rates = {v: mean([x for (s, _), xs in success[v].items() if s == seed for x in xs]) for v in success}
        print(f"  seed {seed}: " + ", ".join(f"{v} {r:.3f}" for v, r in rates.items())
              + "".join(f", {v} - sync {rates[v] - rates['sync']:+.3f}" for v in lagged_variants))
    for v in lagged_variants:
        diff = bootstrap_ci([[mean(success[v][c]) - mean(success["sync"][c])] for c in success["sync"]])
        print(f"{v} - sync success: {diff.value:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] (95%, paired by "
              f"(seed x task); the interval holds the tasks' sampling noise, not the runs' own: see the seeds)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latency", type=float, default=4.0, help="seconds the simulated human takes per reply")
    p.add_argument("--staleness", type=int, default=1, help="async lag s in policy versions")
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--tasks-per-iteration", type=int, default=4)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=2, help="trajectories per optimiser step")
    p.add_argument("--ppo-epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: on 2 cores, one for each stage)")
    p.add_argument("--learning", action="store_true", help="compare what sync and async LOOP learn (instead of "
                                                                "the throughput)")
    p.add_argument("--seeds", type=int, default=3, help="--learning: seeds")
    p.add_argument("--decoupled", action="store_true", help="async LOOP with --decoupled_loss (--learning: as a "
                                                                "third run beside sync and async)")
    p.add_argument("--learning-iterations", type=int, default=9, help="--learning: LOOP iterations per run "
                                                                         "(the test bed's: 9, 432 episodes)")
    p.add_argument("--test-limit", type=int, default=0, help="--learning: the first N test tasks (0: all)")
    p.add_argument("--eval-tasks", choices=("test", "val"), default="test",
                   help="--learning: score the runs on the test bed's test tasks or its validation tasks")
    p.add_argument("--warm-start", default=None, help="--learning: an existing warm start, e.g. the main job's "
                                                     "runs/demo/warm_start/behave/final (default: train one)")
    p.add_argument("--output-dir", default=None, help="where the runs go (default: a temporary folder)")
    args = p.parse_args()
    if not args.learning and args.iterations <= args.staleness:  # before any run: nothing to time otherwise
        p.error(f"--iterations ({args.iterations}) must exceed --staleness ({args.staleness}) to time an "
                f"overlapped iteration")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.output_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        (learning if args.learning else throughput)(args, work)


if __name__ == "__main__":
    main()
