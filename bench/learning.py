"""Proof of learning on CPU: every algorithm and SWEET-RL's ablations from one warm start.

    python bench/learning.py                                   # 3 seeds (0, 1, 2)
    python bench/learning.py --seeds 3 --seed-start 10         # seeds 10, 11, 12
    python bench/learning.py --seeds 1 --policies sweet,mtdpo --out runs/learning-quick

All policies start from the same warm-started tiny model (sweet/workflows/warm_start.py, built
once into OUT/warm_start) on the CPU test bed (colbench/envs/testbed.py). Per seed,
one set of K episodes per train task is collected with the warm start and every
offline algorithm learns from it; LOOP collects the same number of episodes online.
SWEET-RL and its ablations also sample single-turn candidates at stage 2, as in the
paper: the first variant of a seed samples them, and the others rank those same
candidates with their own critics (`shared_candidates`). Every policy's sample count
(episodes + stage-2 candidates) is counted from what it actually read or generated and
reported, as is its training wall time.

Policies: warm_start, rft, mtdpo, sweet, loop, and the paper's SWEET-RL ablations
  sweet_no_info     critic without the training-time information (--training_info false)
  sweet_value_head  critic with a regression head instead of the LM-head advantage (--head value)
  sweet_sum         sum instead of mean over the action's tokens (--length_normalize false)
and a diagnostic, not one of the paper's ablations (run only when --policies names it):
  sweet_oracle      no critic: stage 2 ranks with the test bed's exact advantage (--critic oracle),
                    to tell a wrong critic from a stage 2 that cannot use a right ranking

Each trained policy is evaluated on the held-out test tasks (sampled episodes per
task). Intervals are 95% percentile-bootstrap intervals over (seed x held-out task)
clusters (colbench.stats.bootstrap_ci), so they stay inside [0, 1]. Outputs in OUT:
summary.json ({"seeds", "policies": {name: {"success_rate", "tests_passed",
"samples", "train_wall_s"}}}), results.md, results.json (per-seed values, sample
breakdown, timings, the critic check below) and learning.png (training curves).

On the test bed, results.md also checks each SWEET-RL critic's stage-2 rankings against
the exact advantage A* (colbench.envs.testbed.optimal_advantage): the share of candidate
pairs it orders as A* does, and how often its top candidate is A*-best (all turns, and the
last turn, where only a right answer scores). That tells a wrong critic from a stage 2
that cannot use a right ranking; `--policies sweet_oracle` trains stage 2 on A* itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Policy(NamedTuple):
    """How a benchmarked policy is trained."""

    algorithm: str
    critic_settings: tuple[tuple[str, object], ...] = ()  # a SWEET variant's critic settings (CriticConfig fields)
    oracle: bool = False  # no critic is trained: stage 2 ranks with --critic oracle


POLICIES: dict[str, Policy] = {
    "rft": Policy("rft"),
    "mtdpo": Policy("mtdpo"),
    "sweet": Policy("sweet"),
    "loop": Policy("loop"),
    "sweet_no_info": Policy("sweet", (("training_info", False),)),
    "sweet_value_head": Policy("sweet", (("head", "value"),)),
    "sweet_sum": Policy("sweet", (("length_normalize", False),)),
    "sweet_oracle": Policy("sweet", oracle=True),
}
DIAGNOSTICS = ("sweet_oracle",)  # run only when --policies names them
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


def train_one(seed: int, name: str, warm: Path, out: Path, setup) -> dict:
    """Train one policy of one seed from its collected episodes (a SWEET variant trains
    its critic first): its model path, samples, training wall time and a note."""
    from sweet.core.trainer import finished
    from sweet.workflows.pipeline import count_samples, train_critic, train_policy

    sd = out / f"seed{seed}"
    episodes = sd / "episodes.jsonl"
    policy = POLICIES[name]
    algo = policy.algorithm
    t0, trained_before = time.perf_counter(), finished(sd / name) is not None
    note = ""
    try:
        critic = None
        if algo == "sweet":
            critic = "oracle" if policy.oracle else train_critic(
                episodes, str(warm), setup, sd / f"critic_{name}", seed=seed, extra=dict(policy.critic_settings))
        model = str(train_policy(algo, episodes, str(warm), setup, sd / name, critic=critic, seed=seed,
                                 extra=shared_candidates(sd, name)))
    except (ValueError, SystemExit) as e:  # RFT with no successful episode, LOOP with no reward variance:
        note = f"untrained ({e})"       # evaluated as the warm start, and said so
        print(f"seed {seed} {name}: {note}", flush=True)
        model = str(warm)
    return {"model": model, "samples": count_samples(algo, episodes, sd / name),
            "train_wall_s": _train_wall(sd / name, t0, trained_before), "note": note}


def shared_candidates(sd: Path, name: str) -> dict[str, str]:
    """A SWEET variant scores the stage-2 candidates that an earlier, finished variant of
    its seed sampled (same warm start, states, K and seed: `--reuse_candidates`), so the
    ablations differ only in how they rank the same candidates, and the samples are drawn
    once (each variant still counts them). None finished (e.g. `--jobs 2`): it samples."""
    from sweet.core.trainer import finished

    if POLICIES[name].algorithm != "sweet":
        return {}
    for other in POLICIES:
        if other == name:
            break
        if POLICIES[other].algorithm == "sweet" and finished(sd / other) is not None:
            return {"reuse_candidates": str(sd / other / "candidates.jsonl")}
    return {}


def evaluate_seed(seed: int, models: dict[str, str], out: Path, setup) -> dict[str, Path]:
    """Every policy of one seed on the held-out tasks: its evaluation episodes file. Each
    seed samples its own evaluation episodes (round `seed` of colbench.rollout's episode
    seeds), so the warm start, the same model in every seed, is evaluated independently
    S times rather than once counted S times."""
    from sweet.workflows.pipeline import evaluate

    sd = out / f"seed{seed}"
    rows = evaluate(models, setup, sd / "eval", seed_round=seed)
    return {row["agent"]: sd / "eval" / "episodes" / f"{row['agent']}.jsonl" for row in rows}


def _worker_init(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def run_all(seeds: list[int], policies: list[str], warm: Path, out: Path, setup, jobs: int = 1) -> dict[int, dict[str, dict]]:
    """Collect each seed's episodes, train every (seed, policy), evaluate each seed.

    jobs > 1 trains and evaluates that many (seed, policy) jobs at once in worker
    processes with cpu_count // jobs torch threads each, longest first: for machines
    with cores to spare. On 2 cores it did not pay: two 1-epoch critics at once on one
    thread each took 92 s against 61.5 s for one on two threads (1.33x the throughput),
    but the whole benchmark's 21 training jobs took 6,350 job-seconds, about 53 min of
    wall time on two workers (on a test-bed variant with slightly more data), against
    about 42 min one after the other. Every job is the
    same code with the same seed either way; only floating-point reduction order may differ."""
    import concurrent.futures as cf
    import multiprocessing

    from sweet.workflows.pipeline import collect_episodes, timed

    for seed in seeds:
        with timed(setup, f"seed{seed}/collect"):
            collect_episodes(str(warm), setup, out / f"seed{seed}" / "episodes.jsonl", seed=seed)
    results: dict[int, dict[str, dict]] = {
        s: {"warm_start": {"model": str(warm), "samples": {"episodes": 0, "candidates": 0}, "train_wall_s": 0.0}}
        for s in seeds}
    order = sorted(((s, n) for s in seeds for n in policies), key=lambda sn: (-COST[POLICIES[sn[1]].algorithm], sn[0]))
    pool = None
    if jobs > 1:
        threads = max(1, (os.cpu_count() or jobs) // jobs)
        pool = cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                      initializer=_worker_init, initargs=(threads,))

    def run(calls):  # [(key, fn, args)] -> {key: result}, in worker processes when jobs > 1
        if pool is None:
            return {key: fn(*args) for key, fn, args in calls}
        futures = {key: pool.submit(fn, *args) for key, fn, args in calls}
        return {key: f.result() for key, f in futures.items()}

    try:
        for (seed, name), info in run([((s, n), train_one, (s, n, warm, out, setup)) for s, n in order]).items():
            results[seed][name] = info
        evals = run([(s, evaluate_seed, (s, {n: r["model"] for n, r in results[s].items()}, out, setup))
                     for s in seeds])
    finally:
        if pool is not None:
            pool.shutdown()
    for seed, files in evals.items():
        for name, path in files.items():
            results[seed][name]["eval_episodes"] = path
    return results


def cluster_metrics(per_seed: dict[int, Path]) -> dict[str, dict]:
    """success_rate and tests_passed over all evaluation episodes of all seeds, with
    bootstrap intervals over (seed, task) clusters."""
    from colbench.stats import bootstrap_ci
    from sweet.core.records import load_episodes

    success: dict[tuple[int, str], list[float]] = {}
    reward: dict[tuple[int, str], list[float]] = {}
    for seed, path in per_seed.items():
        for ep in load_episodes(path, env="testbed"):
            success.setdefault((seed, ep.task_id), []).append(float(ep.success))
            reward.setdefault((seed, ep.task_id), []).append(float(ep.reward))
    return {"success_rate": bootstrap_ci(list(success.values())).to_json(),
            "tests_passed": bootstrap_ci(list(reward.values())).to_json()}


def summarise(results: dict[int, dict[str, dict]], names: list[str]) -> dict:
    """The issue's summary.json: {"seeds": S, "policies": {name: M}}."""
    policies = {}
    for name in names:
        m = cluster_metrics({s: r[name]["eval_episodes"] for s, r in results.items()})
        samples = [sum(r[name]["samples"].values()) for r in results.values()]
        walls = [w for r in results.values() if (w := r[name]["train_wall_s"]) == w]  # NaN: not recorded
        policies[name] = {**m, "samples": int(round(statistics.fmean(samples))),
                          "train_wall_s": round(statistics.fmean(walls), 1) if walls else None}
    return {"seeds": len(results), "policies": policies}


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


def critic_vs_oracle(out: Path, seeds: list[int], policies: list[str], setup) -> dict[str, dict]:
    """How each SWEET-RL variant's critic ranked its stage-2 candidates against the test
    bed's exact advantage A* (colbench.envs.testbed.optimal_advantage), from the scores in
    candidates.jsonl, over all seeds:
      pairs: of candidate pairs at one state whose A* differ, the share the critic orders
             the same way (a critic tie counts half);
      top1:  of states whose candidates' A* differ, the share where the critic's top
             candidate has the best A*; top1_last the same on the last turn only;
      questions: of pairs of two QUESTIONS at one state two turns before the end whose
             A* differ, the share ordered as A*: the one decision where a question's
             worth depends on what was already asked (ask for the constant still
             missing, not again for a known one), so the only one that tests whether
             the critic reads the dialogue rather than the question's wording."""
    from colbench.envs.testbed import MAX_TURNS
    from colbench.protocols import ANSWER_MARKER
    from sweet.algorithms.sweet_rl import SweetConfig, load_states, read_candidates, state_key
    from sweet.critic.oracle import exact_advantages

    checks = {}
    for name in policies:
        if POLICIES[name].algorithm != "sweet":
            continue
        agree = pairs = top = top_n = last = last_n = q_agree = q_pairs = 0.0
        for seed in seeds:
            sd = out / f"seed{seed}"
            rows = read_candidates(sd / name / "candidates.jsonl")
            if not rows:
                continue
            states = {state_key(s): s for s in load_states(SweetConfig(
                episodes=str(sd / "episodes.jsonl"), tasks=setup.train_tasks, env=setup.env, episode_fraction=1.0))}
            for key, row in rows.items():
                state = states[key]
                texts = [c.text for c in row.candidates]
                exact = exact_advantages(state, texts)
                critic = [c.advantage for c in row.candidates]
                asks = state.turn_index == MAX_TURNS - 2
                for i in range(len(exact)):
                    for j in range(i + 1, len(exact)):
                        if exact[i] != exact[j]:
                            d = (critic[i] - critic[j]) * (exact[i] - exact[j])
                            hit = 1.0 if d > 0 else 0.5 if critic[i] == critic[j] else 0.0
                            pairs, agree = pairs + 1, agree + hit
                            if asks and ANSWER_MARKER not in texts[i] and ANSWER_MARKER not in texts[j]:
                                q_pairs, q_agree = q_pairs + 1, q_agree + hit
                if len(set(exact)) > 1:
                    hit = float(exact[max(range(len(critic)), key=critic.__getitem__)] == max(exact))
                    top, top_n = top + hit, top_n + 1
                    if state.turn_index == MAX_TURNS - 1:
                        last, last_n = last + hit, last_n + 1
        if pairs:
            checks[name] = {"pairs": agree / pairs, "n_pairs": int(pairs), "top1": top / max(top_n, 1),
                            "n_states": int(top_n), "top1_last": last / last_n if last_n else None, "n_last": int(last_n),
                            "questions": q_agree / q_pairs if q_pairs else None, "n_questions": int(q_pairs)}
    return checks


def checks_table(checks: dict[str, dict]) -> str:
    lines = ["| critic of | pairs ordered as A* | top candidate is A*-best | same, last turn | question pairs, "
             "two turns before the end |", "|---|---|---|---|---|"]
    for name, c in checks.items():
        last = "n/a" if c["top1_last"] is None else f"{c['top1_last']:.2f} (of {c['n_last']})"
        asks = "n/a" if c.get("questions") is None else f"{c['questions']:.2f} (of {c['n_questions']})"
        lines.append(f"| {name} | {c['pairs']:.2f} (of {c['n_pairs']}) | {c['top1']:.2f} (of {c['n_states']}) | {last} "
                     f"| {asks} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="number of seeds (S)")
    p.add_argument("--seed-start", "--seed_start", type=int, default=0, help="first seed (K): seeds K..K+S-1")
    p.add_argument("--policies", "--algorithms", default=",".join(n for n in POLICIES if n not in DIAGNOSTICS),
                   help=f"comma list from {', '.join(POLICIES)} (warm_start is always evaluated; default: all but "
                        f"the diagnostics {', '.join(DIAGNOSTICS)})")
    p.add_argument("--episodes-per-task", "--episodes_per_task", type=int, default=None,
                   help="K episodes per train task (default: the test bed's, sweet/workflows/pipeline.py)")
    p.add_argument("--train-limit", "--train_limit", type=int, default=None,
                   help="collect on the first N train tasks only (quick checks)")
    p.add_argument("--test-limit", "--test_limit", type=int, default=None, help="evaluate on the first N test tasks")
    p.add_argument("--jobs", type=int, default=1,
                   help="(seed, policy) jobs trained at once in worker processes, each with cpu_count // jobs torch "
                        "threads (default 1: one after the other in this process; on 2 cores, 2 was slower)")
    p.add_argument("--warm-start", "--warm_start", type=Path, default=None,
                   help="a warm-started model folder every policy starts from (default: build it, checked, in "
                        "OUT/warm_start with sweet.workflows.pipeline.warm_start)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
    args = p.parse_args(argv)
    policies = [a for a in args.policies.split(",") if a and a != "warm_start"]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        p.error(f"unknown policies {sorted(unknown)}; choose from {', '.join(POLICIES)}")
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    from sweet.core.config import flush_denormals

    flush_denormals()  # before any torch op starts the thread pool (its threads inherit the flag)

    from sweet.core.runs import trainer_run

    with trainer_run(args.out, command="python bench/learning.py"):  # one writer per --out; Ctrl-C says what is kept
        return run_benchmark(args, p, policies)


def run_benchmark(args, p: argparse.ArgumentParser, policies: list[str]) -> dict:
    """Warm start, every (seed, policy), the summary and the plots into args.out."""
    from sweet.workflows.pipeline import TestbedSetup, warm_start

    setup = TestbedSetup()
    if args.episodes_per_task:
        setup.episodes_per_task = args.episodes_per_task
    setup.train_limit, setup.test_limit = args.train_limit, args.test_limit
    t0 = time.perf_counter()
    if args.warm_start is not None and not (args.warm_start / "config.json").exists():
        p.error(f"--warm-start {args.warm_start}: no model there (no config.json)")
    warm = args.warm_start or warm_start(args.out / "warm_start")
    setup.timings["warm_start"] = time.perf_counter() - t0
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    results = run_all(seeds, policies, warm, args.out, setup, jobs=args.jobs)

    names = ["warm_start", *policies]
    summary = summarise(results, names)
    text = table(summary, results)
    checks = critic_vs_oracle(args.out, seeds, policies, setup) if setup.env == "testbed" else {}
    if checks:
        text += "\n\nStage-2 rankings against the exact advantage A* (1.00 = the oracle's ranking):\n\n" + checks_table(checks)
    print("\n" + text)
    for s, r in results.items():
        for n in names:
            if r[n].get("note"):
                print(f"note: seed {s} {n}: {r[n]['note']}")
    print(f"\nseeds {seeds}; {setup.episodes_per_task} episodes per train task per seed; SWEET-RL variants also "
          f"sample {setup.candidates} candidates per stage-2 state; warm start {setup.timings['warm_start']:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    nan_to_none = lambda v: None if isinstance(v, float) and v != v else v  # noqa: E731 (strict JSON)
    per_seed = {str(s): {n: {k: nan_to_none(r[n].get(k)) for k in ("samples", "train_wall_s", "note")} for n in names}
                for s, r in results.items()}
    (args.out / "results.json").write_text(json.dumps({"per_seed": per_seed, "critic_vs_exact": checks,
                                                       "timings": setup.timings}, indent=2))
    (args.out / "results.md").write_text(text + "\n")
    plot_curves(args.out, policies, seeds)
    print(f"summary: {args.out / 'summary.json'}; table: {args.out / 'results.md'}; curves: {args.out / 'learning.png'}")
    return summary


def plot_curves(out: Path, policies: list[str], seeds: list[int]) -> None:
    """Training curves from each run's metrics.jsonl (loss, and LOOP's reward per iteration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(policies), figsize=(4 * len(policies), 3), squeeze=False)
    for ax, name in zip(axes[0], policies):
        key = CURVE_KEY[POLICIES[name].algorithm]
        for s in seeds:
            path = out / f"seed{s}" / name / "metrics.jsonl"
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

    sys.exit(run_cli(main, prog="python bench/learning.py"))
