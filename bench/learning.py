"""Proof of learning on CPU: RFT, multi-turn DPO, SWEET-RL and LOOP from one warm start.

    python bench/learning.py                          # 3 seeds, ~1 hour on 2 cores
    python bench/learning.py --seeds 1 --algorithms sweet,loop --out runs/learning-quick

All algorithms start from the same warm-started tiny model (sweet/warm_start.py) on
the CPU test bed (colbench/envs/testbed.py) and get the same sample budget: K
episodes per train task (the offline algorithms learn from one collected set per
seed; LOOP collects the same number of episodes online). SWEET-RL additionally
samples single-turn candidates per state for stage 2, as in the paper; they are
counted and reported. Each trained policy is evaluated on the held-out test tasks
(sampled episodes per task); the table shows success rate and tests passed with 95%
intervals over seeds, and wall time; learning curves go to learning.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ALGORITHMS = ("rft", "mtdpo", "sweet", "loop")


def ci95(values: list[float]) -> tuple[float, float, float]:
    """Mean and a normal-approximation 95% interval over seeds (t-value for small n)."""
    t = {1: 0.0, 2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78}.get(len(values), 1.96)
    mean = statistics.fmean(values)
    half = t * statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return mean, mean - half, mean + half


def run_seed(seed: int, algorithms: list[str], warm: Path, out: Path, setup) -> dict[str, dict]:
    from sweet.pipeline import collect_episodes, evaluate, timed, train_critic, train_policy

    sd = out / f"seed{seed}"
    with timed(setup, f"seed{seed}/collect"):
        episodes = collect_episodes(str(warm), setup, sd / "episodes.jsonl", seed=seed)
    models = {"warm_start": str(warm)}
    for algo in algorithms:
        t0 = time.perf_counter()
        critic = None
        if algo == "sweet":
            critic = train_critic(episodes, str(warm), setup, sd / "critic", seed=seed)
        models[algo] = str(train_policy(algo, episodes, str(warm), setup, sd / algo, critic=critic, seed=seed))
        setup.timings[f"seed{seed}/{algo}"] = time.perf_counter() - t0
    rows = evaluate(models, setup, sd / "eval")
    return {r["agent"]: r for r in rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--algorithms", default=",".join(ALGORITHMS))
    p.add_argument("--episodes-per-task", type=int, default=4)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
    args = p.parse_args(argv)
    algorithms = [a for a in args.algorithms.split(",") if a]
    unknown = set(algorithms) - set(ALGORITHMS)
    if unknown:
        p.error(f"unknown algorithms {sorted(unknown)}; choose from {ALGORITHMS}")

    from sweet import warm_start
    from sweet.pipeline import TestbedSetup

    setup = TestbedSetup(episodes_per_task=args.episodes_per_task)
    t0 = time.perf_counter()
    warm = warm_start.main(warm_start.WarmStartConfig(output_dir=str(args.out / "warm_start")))
    setup.timings["warm_start"] = time.perf_counter() - t0
    results = [run_seed(s, algorithms, warm, args.out, setup) for s in range(args.seeds)]

    names = ["warm_start", *algorithms]
    lines = ["| policy | success rate (95% CI) | tests passed (95% CI) | train wall s (mean) |", "|---|---|---|---|"]
    summary = {}
    for name in names:
        succ = [r[name]["metrics"]["success_rate"]["value"] for r in results]
        tests = [r[name]["metrics"]["tests_passed"]["value"] for r in results]
        wall = [setup.timings.get(f"seed{s}/{name}", 0.0) for s in range(args.seeds)]
        s_m, s_lo, s_hi = ci95(succ)
        t_m, t_lo, t_hi = ci95(tests)
        summary[name] = {"success": succ, "tests_passed": tests, "wall_s": wall}
        lines.append(f"| {name} | {s_m:.3f} [{s_lo:.3f}, {s_hi:.3f}] | {t_m:.3f} [{t_lo:.3f}, {t_hi:.3f}] | "
                     f"{statistics.fmean(wall):.0f} |")
    table = "\n".join(lines)
    print("\n" + table)
    print(f"\nwarm start: {setup.timings['warm_start']:.0f} s; sample budget: {args.episodes_per_task} episodes per "
          f"train task per seed; SWEET-RL also samples {setup.candidates} candidates per state")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "timings": setup.timings}, indent=2))
    (args.out / "results.md").write_text(table + "\n")
    plot_curves(args.out, algorithms, args.seeds)
    print(f"results: {args.out / 'results.md'}; curves: {args.out / 'learning.png'}")


def plot_curves(out: Path, algorithms: list[str], seeds: int) -> None:
    """Training curves from each run's metrics.jsonl (loss, and LOOP's reward per iteration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(algorithms), figsize=(4 * len(algorithms), 3), squeeze=False)
    for ax, algo in zip(axes[0], algorithms):
        key = {"loop": "env/reward", "rft": "loss/nll", "mtdpo": "loss/dpo", "sweet": "loss/dpo"}[algo]
        for s in range(seeds):
            path = out / f"seed{s}" / algo / "metrics.jsonl"
            if not path.exists():
                continue
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts), label=f"seed {s}")
        ax.set_title(f"{algo}: {key}")
        ax.set_xlabel("iteration" if algo == "loop" else "step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=100)


if __name__ == "__main__":
    main()
