"""Proof of learning on CPU: every algorithm and SWEET-RL's ablations from one warm start,
compared under one rule at matched KL from the warm start.

    python -m testbed.learning                                   # --bed default, 3 seeds (0, 1, 2)
    python -m testbed.learning --seeds 3 --seed-start 10         # seeds 10, 11, 12
    python -m testbed.learning --seeds 1 --policies sweet,mtdpo --hp-grid 1 --out runs/learning-quick
    python -m testbed.learning --bed legacy                     # the first bed (testbed/env.py)
    python -m testbed.learning --records A/records/seed0.json B/records/seed1.json --out runs/both

All policies start from the same warm-started tiny model (testbed.pipeline.warm_start,
built once into OUT/warm_start, or --warm-start) on a test bed (testbed/bed.py).

Budget. Per seed, one set of K episodes per train task (n_train x K) is collected with the
warm start and every offline algorithm learns from it; LOOP generates the same number
online. SWEET-RL's stage-2 candidates and LOOP's online episodes are counted from what was
read or generated and reported apart, per policy (`budget`). The first SWEET variant of a
seed samples the candidates and the others rank those same candidates with their own
critics (`shared_candidates`).

Paths. Each method trains --path-epochs epochs (LOOP: its iterations) with a model-only
snapshot every --snapshot-steps optimiser steps (LOOP: every iteration) and at the end
(TrainConfig.snapshot_steps). The warm start (KL 0 by definition) and the snapshots (at most
--eval-points per path, geometrically spaced, the first and last always: evaluation is the cost) are
evaluated on the test tasks (the setup's eval_seeds episodes per task at its evaluation
temperature, 1.0 on non-legacy beds: the policy itself), and each snapshot's KL(π‖π0) is measured
on those same episodes (sweet.core.kl: Σ over agent turns and action tokens of log π − log
π0; on the legacy bed, sampled at 0.7, it is a proxy). Success at KL 0.5 / 1 / 2 is
interpolated along each path (testbed/frontier.py); a path that never gets there is reported
at its largest KL, `"reached": false`, `*KL` in the table.

One rule for hyper-parameters: each method's base learning rate (testbed/pipeline.py)
times a multiplier from --hp-grid, chosen on the first seed alone by the highest mean
validation success over the three KL levels (validation tasks: the bed's, drawn from the
train stream, never test tasks; --val-episodes per task), then used for every seed.

Intervals: 95% percentile bootstrap over (seed x test task) clusters; differences of two
policies (`pairs`) use the same resamples for both (paired). Predictions: the exact solver
(testbed.predict `predict`, or `predict_finite` with --predict-finite REPS at the
benchmark's budget), cached in OUT/prediction.json.

Policies: warm_start, rft, mtdpo, sweet, loop, and the paper's SWEET-RL ablations
  sweet_no_info     critic without the training-time information (--training_info false)
  sweet_value_head  critic with a regression head instead of the LM-head advantage (--head value)
  sweet_sum         sum instead of mean over the action's tokens (--length_normalize false)
and diagnostics, not the paper's ablations (run only when --policies names them):
  sweet_oracle      no critic: stage 2 ranks with the test bed's exact advantage (--critic oracle),
                    to tell a wrong critic from a stage 2 that cannot use a right ranking
  sweet_anchor      SWEET-RL's critic, stage 2 with an NLL anchor on the states its critic
                    leaves unranked (--anchor_coef 1): does likelihood displacement break it?
  sweet_centred     a critic centred by 4 samples of the warm start per turn (--baseline_samples_per_state
                    4, sweet/critic/baseline.py): does it credit the questions?

Outputs in OUT: summary.json ({"bed", "seeds", "predicted": {"warm_start", "optimum"},
"policies": {name: {"success_rate", "tests_passed", "samples", "train_wall_s", "budget",
"kl", "at_kl", "predicted"}}, "pairs": [...], "replication": {"predicted_apart", "reproduced",
"undecided", "reversed"}, "hp": {...}, "machines": {seed: machine}}), results.md (the tables),
results.json (per-seed values and paths, the search, the critic check, timings),
frontier.png (success vs KL, 95% bands, predictions as markers) and learning.png (training
curves). The final policies' success_rate/tests_passed are today's fields (their last snapshot).

Seed records. Every table and figure is computed from OUT/records/seed<S>.json, one per seed,
written once its points are evaluated: per policy its path (per point and test task the
sums of successes, rewards, log-ratios and repeats, and the counts: frontier.TrainingPath),
samples and training time; the critics' counts against A* and their credit splits; the
bed, teacher, warm start (its weights' sha256), protocol, setup, search record, commit and
machine (CPU, the vector instructions torch uses there, library versions: float bits differ
between CPU types, so the summary names every machine its seeds ran on).
No model is needed to summarise them: `--records FILE...` combines the records of separate
runs (seeds measured by other runs or on other machines) into one summary, training
nothing, and refuses records whose protocol, warm start or policies differ.

results.md also checks each SWEET-RL critic's stage-2 rankings against the exact advantage
A* (testbed.oracle.exact_advantages, for the bed), overall and per turn: the share of
candidate pairs it orders as A* does, and how often its top candidate is A*-best; beside it
the agreement the exact solver says a critic needs for stage 2 to reach MT-DPO per KL level
(summary.json "critic_agreement_needed", testbed.agreement.agreement_needed,
cached in OUT/agreement_needed.json), and each learned critic's credit split: how much of
its margin on its own pairs sits on the answer and how much on the questions
(summary.json "critic_credit", sweet/critic/inspect.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from colbench.io import atomic_write
from testbed.critic_check import (
    agreement_needed,
    checks_table,
    credit_table,
    critic_counts,
    needed_table,
    pool_checks,
    pool_credit,
    seed_credit,
)
from testbed.frontier import (  # the protocol's maths, tables and plot
    LEVELS,
    PREDICTED,
    Bootstrap,
    TrainingPath,
    kl_table,
    pairs,
    pairs_table,
    paths_of,
    plot_frontier,
    prediction,
    repeat_table,
    replication,
    solver_name,
    tasks_of,
    training_path,
)

ROOT = Path(__file__).resolve().parent.parent


class Policy(NamedTuple):
    """How a benchmarked policy is trained."""

    algorithm: str
    critic_settings: tuple[tuple[str, object], ...] = ()  # a SWEET variant's critic settings (CriticConfig fields)
    oracle: bool = False  # no critic is trained: stage 2 ranks with --critic oracle
    stage2_settings: tuple[tuple[str, object], ...] = ()  # stage-2 settings beside the protocol's (SweetConfig fields)


POLICIES: dict[str, Policy] = {
    "rft": Policy("rft"),
    "mtdpo": Policy("mtdpo"),
    "sweet": Policy("sweet"),
    "loop": Policy("loop"),
    "sweet_no_info": Policy("sweet", (("training_info", False),)),
    "sweet_value_head": Policy("sweet", (("head", "value"),)),
    "sweet_sum": Policy("sweet", (("length_normalize", False),)),
    "sweet_oracle": Policy("sweet", oracle=True),
    "sweet_anchor": Policy("sweet", stage2_settings=(("anchor_coef", 1.0),)),
    "sweet_centred": Policy("sweet", (("baseline_samples_per_state", 4),)),
}
DIAGNOSTICS = ("sweet_oracle", "sweet_anchor", "sweet_centred")  # run only when --policies names them
CURVE_KEY = {"rft": "loss/nll", "mtdpo": "loss/dpo", "sweet": "loss/dpo", "loop": "env/reward"}


def _train_wall(policy_dir: Path, t0: float, trained_before: bool) -> float:
    """The policy's training wall time (critic included), kept beside its outputs so that
    a resumed benchmark, which skips finished steps, reports the time they took (NaN:
    trained by a run that kept no record)."""
    record = policy_dir / "train_wall_s.json"
    if record.exists():
        return float(json.loads(record.read_text())["train_wall_s"])
    if trained_before:
        return float("nan")
    wall = time.perf_counter() - t0
    policy_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"train_wall_s": wall}))
    return wall


# Rough relative cost of training each algorithm on the test bed (critic included), to
# start the longest jobs first when --jobs > 1.
COST = {"sweet": 4, "loop": 2, "mtdpo": 1, "rft": 0}


@dataclass(frozen=True)
class Protocol:
    """How every method's path is trained, evaluated and tuned (the same for all)."""

    path_epochs: int = 6  # epochs of each offline method's path (RFT, MT-DPO, SWEET stage 2)
    snapshot_steps: int = 8  # a snapshot every N optimiser steps (LOOP: every iteration)
    eval_points: int = 8  # snapshots evaluated per path at most: geometrically spaced, first and last always
    hp_grid: tuple[float, ...] = (1.0, 1 / 3, 3.0)  # learning-rate multipliers searched (1.0 first)
    val_episodes: int = 2  # episodes per validation task in the search
    predict_finite: int = 0  # the solver's repetitions at the benchmark's budget (0: population limit)


def policy_dir(sd: Path, name: str, mult: float) -> Path:
    """A policy's run folder in a seed's folder: `name`, or `name.lr<mult>` off the base rate."""
    return sd / name if mult == 1.0 else sd / f"{name}.lr{mult:.3g}"


def snapshots(folder: Path) -> list[tuple[int, str]]:
    """(step, model) of a run's snapshots (sweet.core.trainer.SNAPSHOT_DIR), in step order."""
    from sweet.core.trainer import SNAPSHOT_DIR

    found = [(int(p.name.split("-")[1]), str(p)) for p in (folder / SNAPSHOT_DIR).glob("step-*")
             if p.is_dir() and not p.name.endswith(".tmp")]
    return sorted(found)


def train_one(seed: int, name: str, warm: Path, out: Path, setup, proto: Protocol = Protocol(),
              mult: float = 1.0) -> dict:
    """Train one policy of one seed from its collected episodes (a SWEET variant trains
    its critic first) along a snapshotted path: its final model, path, samples, training
    wall time and a note."""
    from sweet.core.trainer import finished
    from testbed.pipeline import count_samples, train_critic, train_policy

    sd = out / f"seed{seed}"
    episodes = sd / "episodes.jsonl"
    policy = POLICIES[name]
    algo = policy.algorithm
    folder = policy_dir(sd, name, mult)
    t0, trained_before = time.perf_counter(), finished(folder) is not None
    note = ""
    path = {"snapshot_steps": 1} if algo == "loop" else {"snapshot_steps": proto.snapshot_steps,
                                                         "num_epochs": proto.path_epochs}
    try:
        critic = None
        if algo == "sweet":
            critic = "oracle" if policy.oracle else train_critic(
                episodes, str(warm), setup, sd / f"critic_{critic_owner(name)}", seed=seed,
                extra=dict(policy.critic_settings))
        model = str(train_policy(algo, episodes, str(warm), setup, folder, critic=critic, seed=seed,
                                 extra={**shared_candidates(sd, name, mult), **dict(policy.stage2_settings), **path},
                                 lr_scale=mult))
    except (ValueError, SystemExit) as e:  # RFT with no successful episode, LOOP with no reward variance:
        note = f"untrained ({e})"       # evaluated as the warm start, and said so
        print(f"seed {seed} {name}: {note}", flush=True)
        model = str(warm)
    return {"model": model, "folder": str(folder),
            "samples": count_samples(algo, episodes, folder, critic if isinstance(critic, Path) else None),
            "train_wall_s": _train_wall(folder, t0, trained_before), "note": note, "mult": mult,
            "points": [(0, str(warm))] + ([] if note else spaced(snapshots(folder), proto.eval_points))}


def spaced(items: list, n: int) -> list:
    """At most `n` of `items`, geometrically spaced along them (item ceil(L^(k/(n-1))) of L,
    k = 0..n-1), the first and the last always among them. Early points are dense because
    that is where a path crosses KL 0.5 / 1 / 2: the DPO paths' KL grows faster than
    linearly in the steps and runs on to tens of nats (measured on the default bed: SWEET-RL
    stage 2 at 0.26 nats after one epoch at its base rate, 9.7 at three times it)."""
    if len(items) <= n:
        return list(items)
    if n == 1:
        return [items[-1]]
    picked = sorted({math.ceil(len(items) ** (k / (n - 1)) - 1e-9) - 1 for k in range(n)})
    for i in range(len(items)):  # rounding merged some early points: take the next unused ones
        if len(picked) >= n:
            break
        if i not in picked:
            picked = sorted(picked + [i])
    return [items[i] for i in picked]


def critic_owner(name: str) -> str:
    """The policy whose critic folder a SWEET variant uses: the first one with the same
    critic settings (sweet_anchor trains no critic of its own: it uses sweet's)."""
    mine = POLICIES[name].critic_settings
    return next(o for o, p in POLICIES.items() if p.algorithm == "sweet" and not p.oracle and p.critic_settings == mine)


def shared_candidates(sd: Path, name: str, mult: float = 1.0) -> dict[str, str]:
    """A SWEET variant scores the stage-2 candidates that an earlier, finished run of its
    seed sampled (same warm start, states, K and seed: `--reuse_candidates`): its own run
    at the base learning rate (a searched multiplier), else an earlier variant's, so the
    ablations differ only in how they rank the same candidates, and the samples are drawn
    once (each variant still counts them). None finished (e.g. `--jobs 2`): it samples."""
    from sweet.core.trainer import finished

    if POLICIES[name].algorithm != "sweet":
        return {}
    if mult != 1.0 and finished(sd / name) is not None:
        return {"reuse_candidates": str(sd / name / "candidates.jsonl")}
    for other in POLICIES:
        if other == name:
            break
        if POLICIES[other].algorithm == "sweet" and finished(sd / other) is not None:
            return {"reuse_candidates": str(sd / other / "candidates.jsonl")}
    return {}


def run_label(name: str, run: dict) -> str:
    """The name a run's points are evaluated under: its folder's (`mtdpo`, `mtdpo.lr3`), so
    that runs of one policy at other learning rates never share (or resume) evaluation
    episodes; the warm start is itself."""
    return Path(run["folder"]).name if run.get("folder") else name


def point_name(name: str, step: int) -> str:
    """The evaluated agent of a path point: the warm start, or `<policy>.step-<N>`."""
    return "warm_start" if step == 0 else f"{name}.step-{step}"


def evaluate_seed(seed: int, runs: dict[str, dict], out: Path, setup, folder: str = "eval") -> dict[str, Path]:
    """Every point of every policy's path of one seed (the warm start once) on the setup's
    test tasks: agent name -> its evaluation episodes file. Each seed samples its own
    evaluation episodes (round `seed` of colbench.rollout's episode seeds), so the warm
    start, the same model in every seed, is evaluated independently S times rather than
    once counted S times; within a seed every point plays the same episode seeds (paired)."""
    from testbed.pipeline import evaluate

    agents = {point_name(run_label(name, run), step): model for name, run in runs.items()
              for step, model in run["points"]}
    sd = out / f"seed{seed}"
    rows = evaluate(agents, setup, sd / folder, seed_round=seed)
    return {row["agent"]: sd / folder / "episodes" / f"{row['agent']}.jsonl" for row in rows}


def _worker_init(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


class Jobs:
    """Calls run here (jobs 1) or in `jobs` spawned worker processes with cpu_count // jobs
    torch threads each: `map([(key, fn, args)]) -> {key: result}`."""

    def __init__(self, jobs: int):
        import concurrent.futures as cf
        import multiprocessing

        self.pool = None
        if jobs > 1:
            threads = max(1, (os.cpu_count() or jobs) // jobs)
            self.pool = cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                               initializer=_worker_init, initargs=(threads,))

    def map(self, calls) -> dict:
        if self.pool is None:
            return {key: fn(*args) for key, fn, args in calls}
        futures = {key: self.pool.submit(fn, *args) for key, fn, args in calls}
        return {key: f.result() for key, f in futures.items()}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def _order(pairs):
    """(seed, policy) jobs, the longest first (for --jobs > 1)."""
    return sorted(pairs, key=lambda sn: (-COST[POLICIES[sn[1]].algorithm], sn[0]))


def run_all(seeds: list[int], policies: list[str], warm: Path, out: Path, setup, jobs: int = 1,
            proto: Protocol = Protocol()) -> tuple[dict[int, dict[str, dict]], dict]:
    """Collect each seed's episodes, choose each method's learning-rate multiplier on the
    validation tasks (`search`), train every (seed, policy) with it, evaluate each seed's
    paths: (results[seed][policy], the search's record).

    jobs > 1 trains and evaluates that many (seed, policy) jobs at once in worker
    processes with cpu_count // jobs torch threads each, longest first: for machines
    with cores to spare. On 2 cores it did not pay: two 1-epoch critics at once on one
    thread each took 92 s against 61.5 s for one on two threads (1.33x the throughput),
    but the whole benchmark's 21 training jobs took 6,350 job-seconds, about 53 min of
    wall time on two workers (on a test-bed variant with slightly more data), against
    about 42 min one after the other. Every job is the
    same code with the same seed either way; only floating-point reduction order may differ."""
    from testbed.pipeline import collect_episodes, timed

    for seed in seeds:
        with timed(setup, f"seed{seed}/collect"):
            collect_episodes(str(warm), setup, out / f"seed{seed}" / "episodes.jsonl", seed=seed)
    warm_run = {"model": str(warm), "samples": {"episodes": 0, "candidates": 0}, "train_wall_s": 0.0, "note": "",
                "mult": 1.0, "points": [(0, str(warm))]}
    results: dict[int, dict[str, dict]] = {s: {"warm_start": dict(warm_run)} for s in seeds}
    pool = Jobs(jobs)
    try:
        hp = search(seeds[0], policies, warm, out, setup, proto, pool)
        calls = [((s, n), train_one, (s, n, warm, out, setup, proto, hp["choice"][n])) for s, n in
                 _order((s, n) for s in seeds for n in policies)]
        for (seed, name), info in pool.map(calls).items():
            results[seed][name] = info
        with timed(setup, "evaluate"):
            evals = pool.map([(s, evaluate_seed, (s, results[s], out, setup)) for s in seeds])
    finally:
        pool.close()
    for seed, files in evals.items():
        for name, run in results[seed].items():
            run["point_episodes"] = [str(files[point_name(run_label(name, run), step)]) for step, _ in run["points"]]
            run["eval_episodes"] = run["point_episodes"][-1]  # the final policy: its path's end
    return results, hp


def search(seed: int, policies: list[str], warm: Path, out: Path, setup, proto: Protocol, pool: Jobs) -> dict:
    """The one hyper-parameter rule: per method, the learning-rate multiplier of
    `proto.hp_grid` whose path has the highest mean validation success at KL 0.5 / 1 / 2
    (interpolated as on the test tasks; a level the path does not reach counts at its
    largest KL), on the first seed only; ties go to the earlier multiplier (1.0 first)."""
    rule = (f"learning rate = base x m, m in {[round(m, 3) for m in proto.hp_grid]}, chosen per method on seed "
            f"{seed}'s validation tasks ({f'the first {setup.val_limit}, ' if setup.val_limit else ''}"
            f"{proto.val_episodes} episodes each) by the highest mean success at KL "
            f"{', '.join(map(str, LEVELS))}; then used for every seed")
    if len(proto.hp_grid) == 1:
        return {"rule": f"no search (--hp-grid {proto.hp_grid[0]:g})", "grid": list(proto.hp_grid),
                "choice": {n: proto.hp_grid[0] for n in policies}, "validation": {}}
    if not setup.val_tasks:
        raise ValueError(f"--hp-grid: the bed {setup.bed!r} has no validation tasks; give --hp-grid 1")
    val = replace(setup, test_tasks=setup.val_tasks, eval_seeds=proto.val_episodes, test_limit=setup.val_limit)
    calls = [((n, m), train_one, (seed, n, warm, out, setup, proto, m)) for n in policies for m in proto.hp_grid]
    runs = pool.map(calls)
    sd_runs = {"warm_start": {"points": [(0, str(warm))]}}
    sd_runs.update({f"{n}.lr{m:.3g}": r for (n, m), r in runs.items()})
    files = evaluate_seed(seed, sd_runs, out, val, folder="validation")
    clusters = {seed: tasks_of(files["warm_start"])}
    boot = Bootstrap(clusters, n_boot=1)
    validation: dict[str, dict[str, dict]] = {}
    choice = {}
    for n in policies:
        scores = {}
        for m in proto.hp_grid:
            run = runs[(n, m)]
            eps = [files[point_name(run_label(n, run), step)] for step, _ in run["points"]]
            path = training_path(run["points"], eps, warm, clusters[seed])
            at = {f"{lv:.1f}": float(boot.value({seed: path}, lv, boot.ones())[0]) for lv in LEVELS}
            scores[f"{m:.3g}"] = {**{k: round(v, 4) for k, v in at.items()}, "mean": round(statistics.fmean(at.values()), 4)}
        validation[n] = scores
        best = max(proto.hp_grid, key=lambda m: (scores[f"{m:.3g}"]["mean"], -proto.hp_grid.index(m)))
        choice[n] = best
        print(f"hp search {n}: " + ", ".join(f"x{k} {v['mean']:.3f}" for k, v in scores.items()) + f" -> x{best:.3g}",
              flush=True)
    return {"rule": rule, "grid": list(proto.hp_grid), "choice": choice, "validation": validation}


# ---- seed records: what the summary needs of a seed, without its models ----------------------

RECORD_VERSION = 1
RECORD_RUN_KEYS = ("samples", "train_wall_s", "note", "mult", "folder")
# what every combined record must share (the rest may differ: the seed, the commit, folders)
RECORD_SHARED = ("version", "bed", "teacher", "warm_start", "protocol", "setup", "policies", "hp")


def write_records(results: dict[int, dict[str, dict]], hp: dict, names: list[str], warm: Path, args,
                  proto: Protocol, setup, commit: str) -> list[dict]:
    """Each seed's record in OUT/records/seed<S>.json, returned as read back, so that a run
    and a later `--records` summary of its files compute on the same numbers. `commit`: the
    code's, read when the run started."""
    from sweet.core.fingerprint import file_sha256
    from testbed import bed as testbed_bed

    bed = setup.bed if setup.env == "testbed" else None
    _, paths = paths_of(results, names, warm, bed)
    meta = {"version": RECORD_VERSION, "bed": args.bed,
            "teacher": args.teacher or (testbed_bed.default_teacher(args.bed) if setup.env == "testbed" else None),
            "warm_start": {"model": str(warm), "sha256": file_sha256(Path(warm) / "model.safetensors")},
            "protocol": {k: list(v) if isinstance(v, tuple) else v for k, v in proto.__dict__.items()},
            "setup": {"episodes_per_task": setup.episodes_per_task, "candidates": setup.candidates,
                      "eval_seeds": setup.eval_seeds, "train_limit": setup.train_limit,
                      "test_limit": setup.test_limit, "val_limit": setup.val_limit},
            "hp": hp, "commit": commit, "machine": machine()}
    folder = args.out / "records"
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for seed, runs in results.items():
        policies = [n for n in names if n != "warm_start"]
        record = {**meta, "seed": seed,
                  "policies": {n: {**{k: nan_to_none(runs[n].get(k)) for k in RECORD_RUN_KEYS},
                                   "path": paths[n][seed].to_json()} for n in names},
                  "critic_counts": critic_counts(args.out, seed, policies, setup) if bed else {},
                  "credit": seed_credit(args.out, seed, policies, setup)}
        file = folder / f"seed{seed}.json"
        atomic_write(file, json.dumps(record, allow_nan=False))
        records.append(json.loads(file.read_text()))
    return records


def nan_to_none(v):
    """NaN (a time not recorded) as null: records are strict JSON."""
    return None if isinstance(v, float) and v != v else v


def machine() -> dict[str, str | int]:
    """What a record's float bits depend on beyond the code: the CPU, the vector instructions
    torch's kernels use on it (two machines that differ there train other weights from the
    same seed), and the library versions."""
    import platform

    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count() or 0, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def git_commit() -> str:
    """The checkout's commit, `+changes` when tracked files differ from it ("unknown" outside git)."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def read_records(files: list[Path], p: argparse.ArgumentParser) -> list[dict]:
    """--records: seed records written by earlier runs (`write_records`); they must share
    RECORD_SHARED and name distinct seeds, else a one-line usage error naming the file and
    the field."""
    records = []
    for file in files:
        try:
            record = json.loads(Path(file).read_text())
        except (OSError, ValueError) as e:
            p.error(f"--records {file}: not a seed record ({e})")
        if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
            p.error(f"--records {file}: not a version-{RECORD_VERSION} seed record of testbed.learning")
        if records:
            first = records[0]
            for key in RECORD_SHARED:
                mine, theirs = record.get(key), first.get(key)
                if key == "policies":
                    mine, theirs = list(mine or {}), list(theirs or {})
                elif key == "warm_start":  # the same weights, wherever each run found them
                    mine, theirs = (mine or {}).get("sha256"), (theirs or {}).get("sha256")
                if mine != theirs:
                    p.error(f"--records {file}: field {key!r} differs from {files[0]}'s; only seeds of one protocol, "
                            "warm start and policy list combine")
            if any(r["seed"] == record["seed"] for r in records):
                p.error(f"--records {file}: seed {record['seed']} is already given")
        records.append(record)
    return records


def unpack_records(records: list[dict]) -> tuple[dict, dict, dict, dict, dict]:
    """(results[seed][policy] = its run's RECORD_RUN_KEYS, paths[policy][seed] = TrainingPath,
    critic counts per seed, credit splits per seed, the search record)."""
    results: dict[int, dict[str, dict]] = {}
    paths: dict[str, dict[int, TrainingPath]] = {}
    counts, credit = {}, {}
    for r in sorted(records, key=lambda r: r["seed"]):
        s = int(r["seed"])
        results[s] = {n: {k: run.get(k) for k in RECORD_RUN_KEYS} for n, run in r["policies"].items()}
        for n, run in r["policies"].items():
            paths.setdefault(n, {})[s] = TrainingPath.from_json(run["path"])
        counts[s], credit[s] = r["critic_counts"], r["credit"]
    for runs in results.values():
        for run in runs.values():
            run["train_wall_s"] = float("nan") if run["train_wall_s"] is None else run["train_wall_s"]
    return results, paths, counts, credit, records[0]["hp"]


def final_metrics(paths: dict[int, TrainingPath]) -> dict[str, dict]:
    """success_rate and tests_passed of the paths' last points (the final policies) over
    all their episodes, with bootstrap intervals over (seed, task) clusters."""
    from colbench.stats import bootstrap_sums

    seeds = sorted(paths)
    count = [c for s in seeds for c in paths[s].count[-1]]
    return {"success_rate": bootstrap_sums([x for s in seeds for x in paths[s].success[-1]], count).to_json(),
            "tests_passed": bootstrap_sums([x for s in seeds for x in paths[s].reward[-1]], count).to_json()}


def summarise(results: dict[int, dict[str, dict]], names: list[str], boot: Bootstrap,
              paths: dict[str, dict[int, TrainingPath]], predicted: dict | None = None) -> dict:
    """summary.json: {"seeds": S, "policies": {name: M}}: per policy its final metrics,
    samples, budget, final KL and success at each KL level (`paths`), with the solver's
    `prediction` beside them, the top-level prediction and every pair's gap."""
    policies = {}
    for name in names:
        m = final_metrics(paths[name])
        samples = [sum(r[name]["samples"].values()) for r in results.values()]
        walls = [w for r in results.values() if (w := r[name]["train_wall_s"]) == w]  # NaN: not recorded
        policies[name] = {**m, "samples": int(round(statistics.fmean(samples))),
                          "train_wall_s": round(statistics.fmean(walls), 1) if walls else None,
                          "budget": budget(name, results)}
    out = {"seeds": len(results), "policies": policies}
    pred = {n: (predicted["warm_start"] if n == "warm_start" else predicted["methods"].get(solver_name(n))) if predicted else None
            for n in names}
    classes = (predicted or {}).get("policy_class")
    for name in names:
        policies[name].update({"kl": final_kl(paths[name]), "at_kl": boot.at_kl(paths[name]),
                               "predicted": pred[name]})
        if classes:  # the solver's flows for a policy blind to the dialogue, and both repeat rates
            m = solver_name(name)
            kinds = [c for c in ("history", "turn") if c in classes]  # turn: only from a blind warm start
            if name == "warm_start":
                w = classes["warm_start_repeat_rate"]
                policies[name].update({"predicted_repeat": {c: w for c in kinds},
                                       **({"predicted_blind": predicted["warm_start"]} if "turn" in kinds else {})})
            elif m in classes["history"]["methods"]:  # (rft is not tied: its one-round limit has no flow)
                policies[name].update({"predicted_repeat": {c: classes[c]["repeat_rate"][m] for c in kinds},
                                       **({"predicted_blind": classes["turn"]["methods"][m]} if "turn" in kinds else {})})
    out["predicted"] = ({"warm_start": predicted["warm_start"], "optimum": predicted["optimum"],
                         "source": predicted["source"]} if predicted else None)
    out["pairs"] = pairs(boot, {n: paths[n] for n in names}, pred)
    out["replication"] = replication(out["pairs"])
    return out


def budget(name: str, results: dict[int, dict[str, dict]]) -> dict[str, float]:
    """What a policy consumed per seed (mean over seeds), each kind apart: the shared
    interactive episodes collected with the warm start (offline methods), the episodes
    LOOP generated online, and SWEET-RL's stage-2 candidates."""
    online = name in POLICIES and POLICIES[name].algorithm == "loop"
    rows = [r[name]["samples"] for r in results.values()]
    return {"episodes": 0 if online else statistics.fmean(x["episodes"] for x in rows),
            "online_episodes": statistics.fmean(x["episodes"] for x in rows) if online else 0,
            "candidates": statistics.fmean(x["candidates"] for x in rows)}


def final_kl(paths: dict) -> float:
    """KL of the final policies (their paths' last points), episodes pooled over seeds."""
    ratio = sum(float(p.log_ratio[-1].sum()) for p in paths.values())
    return round(ratio / max(sum(float(p.count[-1].sum()) for p in paths.values()), 1.0), 4)


def table(summary: dict, results: dict[int, dict[str, dict]]) -> str:
    lines = ["| policy | success rate [95% CI] | tests passed [95% CI] | samples (episodes + candidates) | train wall s |",
             "|---|---|---|---|---|"]
    for name, m in summary["policies"].items():
        s, t = m["success_rate"], m["tests_passed"]
        ep = statistics.fmean(r[name]["samples"]["episodes"] for r in results.values())
        ca = statistics.fmean(r[name]["samples"]["candidates"] for r in results.values())
        lines.append(f"| {name} | {s['value']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] | "
                     f"{t['value']:.3f} [{t['ci95'][0]:.3f}, {t['ci95'][1]:.3f}] | "
                     f"{m['samples']} ({ep:.0f} + {ca:.0f}) | "
                     f"{'n/a' if m['train_wall_s'] is None else format(m['train_wall_s'], '.0f')} |")
    return "\n".join(lines)


def _grid(text: str) -> tuple[float, ...]:
    """--hp-grid: comma list of positive learning-rate multipliers, 1 first (the base rate)."""
    try:
        values = [float(_number(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hp-grid {text!r}: expected a comma list of numbers such as 1/3,1,3")
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"--hp-grid {text!r}: multipliers must be > 0")
    return tuple(sorted(set(values), key=lambda v: (v != 1.0, values.index(v))))


def _number(text: str) -> float:
    """'1/3' -> 0.333..., '3' -> 3.0."""
    num, _, den = text.strip().partition("/")
    return float(num) / float(den) if den else float(num)


def main(argv: list[str] | None = None) -> dict:
    """`python -m testbed.learning`: parse and check the command line, then `run_benchmark`."""
    p = parser()
    args = p.parse_args(argv)
    policies = checked_policies(args, p)
    from sweet.core.config import flush_denormals

    flush_denormals()  # before any torch op starts the thread pool (its threads inherit the flag)

    from sweet.core.runs import trainer_run

    with trainer_run(args.out, command="python -m testbed.learning"):  # one writer per --out; Ctrl-C says what is kept
        return run_benchmark(args, p, policies)


def parser() -> argparse.ArgumentParser:
    """The benchmark's command line."""
    from testbed.bed import DEFAULT_BED, PRESETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bed", "--spec", default=DEFAULT_BED, choices=list(PRESETS),
                   help="the test-bed preset (testbed/bed.py)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds (S)")
    p.add_argument("--seed-start", "--seed_start", type=int, default=0, help="first seed (K): seeds K..K+S-1")
    p.add_argument("--policies", "--algorithms", default=",".join(n for n in POLICIES if n not in DIAGNOSTICS),
                   help=f"comma list from {', '.join(POLICIES)} (warm_start is always evaluated; default: all but "
                        f"the diagnostics {', '.join(DIAGNOSTICS)})")
    p.add_argument("--episodes-per-task", "--episodes_per_task", type=int, default=None,
                   help="K episodes per train task (default: the test bed's, testbed/pipeline.py)")
    p.add_argument("--train-limit", "--train_limit", type=int, default=None,
                   help="collect on the first N train tasks only (quick checks)")
    p.add_argument("--test-limit", "--test_limit", type=int, default=None, help="evaluate on the first N test tasks")
    p.add_argument("--val-limit", "--val_limit", type=int, default=None,
                   help="search on the first N validation tasks only (quick checks; default: all)")
    d = Protocol()
    p.add_argument("--path-epochs", type=int, default=d.path_epochs,
                   help="epochs of each offline method's training path (RFT, MT-DPO, SWEET-RL stage 2)")
    p.add_argument("--snapshot-steps", type=int, default=d.snapshot_steps,
                   help="a snapshot every N optimiser steps along each path (LOOP: every iteration), each evaluated")
    p.add_argument("--eval-points", type=int, default=d.eval_points,
                   help="snapshots evaluated per path at most (geometrically spaced along it: dense early, the last always)")
    p.add_argument("--hp-grid", type=_grid, default=None,
                   help="learning-rate multipliers searched per method on the first seed's validation tasks "
                        "(default 1,1/3,3 where the bed has validation tasks, else 1; 1: no search)")
    p.add_argument("--val-episodes", type=int, default=d.val_episodes, help="episodes per validation task (search)")
    p.add_argument("--predict-finite", type=int, default=0, metavar="REPS",
                   help="predict with the solver's finite-sample runs at the benchmark's budget (REPS data sets; "
                        "default: the population limit)")
    p.add_argument("--jobs", type=int, default=1,
                   help="(seed, policy) jobs trained at once in worker processes, each with cpu_count // jobs torch "
                        "threads (default 1: one after the other in this process; on 2 cores, 2 was slower)")
    p.add_argument("--warm-start", "--warm_start", type=Path, default=None,
                   help="a warm-started model folder every policy starts from (default: build it, checked, in "
                        "OUT/warm_start with testbed.pipeline.warm_start)")
    p.add_argument("--teacher", choices=("reads", "blind"), default=None,
                   help="the warm start's teacher (testbed/bed.py TEACHERS; default: reads on a non-legacy bed, the "
                        "explorer that reads its dialogue; blind on the legacy bed); the solver predicts from it")
    p.add_argument("--records", type=Path, nargs="+", default=None, metavar="FILE",
                   help="summarise these seed records (OUT/records/seed<S>.json of earlier runs, e.g. of other "
                        "machines) into --out, training and evaluating nothing: seeds combine across runs")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
    return p


def checked_policies(args, p: argparse.ArgumentParser) -> list[str]:
    """The policies to train; a bad flag value exits through `p.error` with one line."""
    policies = [a for a in args.policies.split(",") if a and a != "warm_start"]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        p.error(f"unknown policies {sorted(unknown)}; choose from {', '.join(POLICIES)}")
    for flag, value in (("--seeds", args.seeds), ("--path-epochs", args.path_epochs),
                        ("--snapshot-steps", args.snapshot_steps), ("--val-episodes", args.val_episodes),
                        ("--eval-points", args.eval_points)):
        if value < 1:
            p.error(f"{flag} must be >= 1")
    if args.predict_finite < 0:
        p.error("--predict-finite must be >= 0")
    if args.teacher is not None:
        from testbed import bed as testbed_bed
        try:
            testbed_bed.teacher_design(args.bed, args.teacher)
        except ValueError as e:
            p.error(f"--teacher: {e}")
    for flag, value in (("--train-limit", args.train_limit), ("--test-limit", args.test_limit),
                        ("--val-limit", args.val_limit)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1 (or left out: all tasks)")
    return policies


def run_benchmark(args, p: argparse.ArgumentParser, policies: list[str]) -> dict:
    """Warm start, every (seed, policy) path, the summary, tables and plots into args.out."""
    from testbed.pipeline import TestbedSetup, warm_start

    if args.records:  # the records' own bed, teacher, protocol, setup and policies, whatever the flags say
        records = read_records(args.records, p)
        first = records[0]
        args.bed, args.teacher, policies = first["bed"], first["teacher"], list(first["policies"])[1:]
        setup = TestbedSetup.for_bed(args.bed)
        for key, value in first["setup"].items():
            setattr(setup, key, value)
        proto = Protocol(**{**first["protocol"], "hp_grid": tuple(first["protocol"]["hp_grid"])})
        setup.timings["warm_start"] = float("nan")
        print(f"summarising {len(records)} seed records ({', '.join(map(str, args.records))}); nothing is trained",
              flush=True)
    else:
        commit = git_commit()  # before anything runs: the code this run loads
        setup = TestbedSetup.for_bed(args.bed)
        if args.episodes_per_task:
            setup.episodes_per_task = args.episodes_per_task
        setup.train_limit, setup.test_limit, setup.val_limit = args.train_limit, args.test_limit, args.val_limit
        grid = args.hp_grid or (Protocol.hp_grid if setup.val_tasks else (1.0,))  # legacy: no validation tasks
        proto = Protocol(path_epochs=args.path_epochs, snapshot_steps=args.snapshot_steps, hp_grid=grid,
                         val_episodes=args.val_episodes, predict_finite=args.predict_finite,
                         eval_points=args.eval_points)
        if len(proto.hp_grid) > 1 and not setup.val_tasks:
            p.error(f"--hp-grid: the bed {args.bed!r} has no validation tasks; give --hp-grid 1")
        t0 = time.perf_counter()
        if args.warm_start is not None and not (args.warm_start / "config.json").exists():
            p.error(f"--warm-start {args.warm_start}: no model there (no config.json)")
        warm = args.warm_start or warm_start(args.out / "warm_start", bed=setup.bed, teacher=args.teacher)
        setup.timings["warm_start"] = time.perf_counter() - t0
        seeds = list(range(args.seed_start, args.seed_start + args.seeds))
        print(f"one rule for every method: {search_rule(proto)}", flush=True)
        results, hp = run_all(seeds, policies, warm, args.out, setup, jobs=args.jobs, proto=proto)
        records = write_records(results, hp, ["warm_start", *policies], warm, args, proto, setup, commit)
    results, paths, counts, credit, hp = unpack_records(records)
    seeds = sorted(results)
    boot = Bootstrap({s: paths["warm_start"][s].tasks for s in seeds})

    names = ["warm_start", *policies]
    with_prediction = [n for n in names if solver_name(n) in PREDICTED]
    predicted = (prediction(args.bed, setup, proto.predict_finite, args.out, args.teacher)
                 if setup.env == "testbed" else None)
    summary = {"bed": args.bed, **summarise(results, names, boot, paths, predicted), "hp": hp}
    folders = {n: {s: r[n]["folder"] for s, r in results.items()} for n in policies}
    text = (f"test bed {args.bed!r}; hyper-parameters: {hp['rule']} (chosen "
            + ", ".join(f"{n} x{m:.3g}" for n, m in hp["choice"].items()) + ")\n\n"
            + table(summary, results) + "\n\nSuccess at matched KL from the warm start (predicted: "
            + (predicted["source"] if predicted else "none") + f", {', '.join(with_prediction) or 'no policy'}; "
            + (f"warm start {predicted['warm_start']:.3f}, optimum {predicted['optimum']:.3f}" if predicted else "")
            + "):\n\n" + kl_table(summary) + "\n\nPairs (gap a − b):\n\n" + pairs_table(summary))
    if any("repeat_rate" in m["at_kl"]["0.5"] for m in summary["policies"].values()):
        text += ("\n\nHow often the second question repeats the first (of the dialogues that ask twice), at matched "
                 "KL; the solver's for a tabular policy and for one blind to the dialogue (python -m "
                 "testbed.policy_class):\n\n" + repeat_table(summary))
    checks = pool_checks([counts[s] for s in seeds])
    if checks:
        text += "\n\nStage-2 rankings against the exact advantage A* (1.00 = the oracle's ranking):\n\n" + checks_table(checks)
        summary["critic_agreement_needed"] = agreement_needed(args.bed, setup, args.out)
        text += ("\n\nThe agreement (pairs ordered as A*) a critic needs for stage 2 to reach MT-DPO, per the exact "
                 "solver (population limit; python -m testbed.agreement):\n\n"
                 + needed_table(summary["critic_agreement_needed"]))
    splits = pool_credit({s: credit[s] for s in seeds})
    if splits:
        summary["critic_credit"] = splits
        text += ("\n\nWhere each learned critic puts its margin on its own pairs of equal length (the answer: the "
                 "last agent turn; the questions: the turns before it; sweet/critic/inspect.py), pooled over seeds:\n\n"
                 + credit_table(splits))
    print("\n" + text)
    for s, r in results.items():
        for n in names:
            if r[n].get("note"):
                print(f"note: seed {s} {n}: {r[n]['note']}")
    print(f"\nseeds {seeds}; {setup.episodes_per_task} episodes per train task per seed; SWEET-RL variants also "
          f"sample {setup.candidates} candidates per stage-2 state; warm start {setup.timings['warm_start']:.0f} s; "
          f"commits {', '.join(sorted({r['commit'] for r in records}))}")
    machines = {json.dumps(r.get("machine"), sort_keys=True): r.get("machine") for r in records}
    summary["machines"] = {str(r["seed"]): r.get("machine") for r in records}
    print("machines: " + "; ".join(
        "not recorded" if m is None else f"{m['cpu']} ({m['cores']} cores, torch {m['torch']} on {m['torch_cpu_capability']})"
        for m in machines.values())
          + (" (the seeds ran on different machines: float bits differ between CPU types)" if len(machines) > 1 else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    per_seed = {str(s): {n: {**{k: nan_to_none(r[n].get(k)) for k in ("samples", "train_wall_s", "note", "mult")},
                             "path": [{"step": st, "kl": round(float(kl), 4), "success_rate": round(float(sr), 4)}
                                      for st, kl, sr in zip(paths[n][s].steps, *paths[n][s].points(
                                          boot.ones()[s]))]} for n in names}
                for s, r in results.items()}
    (args.out / "results.json").write_text(json.dumps({"per_seed": per_seed, "hp": hp, "critic_vs_exact": checks,
                                                       "timings": setup.timings}, indent=2))
    (args.out / "results.md").write_text(text + "\n")
    plot_curves(args.out, policies, seeds, folders)
    plot_frontier(args.out, boot, paths, summary)
    print(f"summary: {args.out / 'summary.json'}; table: {args.out / 'results.md'}; curves: {args.out / 'learning.png'}; "
          f"frontier: {args.out / 'frontier.png'}")
    return summary


def search_rule(proto: Protocol) -> str:
    if len(proto.hp_grid) == 1:
        m = proto.hp_grid[0]
        return ("no search (--hp-grid 1): each method's base learning rate" if m == 1.0 else
                f"no search (--hp-grid {m:g}): each method's base learning rate x {m:g}")
    return (f"learning rate = base x m, m in {[round(m, 3) for m in proto.hp_grid]}, per method, on the first seed's "
            "validation tasks, highest mean success at KL 0.5/1/2")


def plot_curves(out: Path, policies: list[str], seeds: list[int], folders: dict | None = None) -> None:
    """Training curves from each run's metrics.jsonl (loss, and LOOP's reward per iteration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(policies), figsize=(4 * len(policies), 3), squeeze=False)
    for ax, name in zip(axes[0], policies):
        key = CURVE_KEY[POLICIES[name].algorithm]
        for s in seeds:
            path = Path((folders or {}).get(name, {}).get(s, out / f"seed{s}" / name)) / "metrics.jsonl"
            if not path.exists():
                continue
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            pts = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
            if pts:
                ax.plot(*zip(*pts), label=f"seed {s}")
        ax.set_title(f"{name}: {key}")
        ax.set_xlabel("iteration" if name == "loop" else "step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    from sweet.core.runs import run_cli

    sys.exit(run_cli(main, prog="python -m testbed.learning"))
