"""Where the main job's time goes: each step of `python -m testbed.demo`, timed, with its share.

    python bench/main_job.py                                   # the main job at seed 0 into runs/bench-main-job
    python bench/main_job.py --smoke --output_dir /tmp/mj      # its toy sizes (1-2 minutes)
    python bench/main_job.py --threads 1                       # torch threads (default: torch's, the main job's)

It runs the main job itself (testbed.demo.main; a folder that holds a finished step skips
that step, so use a fresh --output_dir), then prints one line per step (warm start, collect,
critic, stage 2 with its validation, evaluate, inspector, the KL) with its wall time and its
share of the whole, the warm start's passes (each phase's folders), the machine's load average
before and after and the thread count. Times on a shared machine are inflated by its load:
state the load beside any figure taken from here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def shares(timings: dict[str, float]) -> list[str]:
    """One line per step: seconds and share of the total, the largest first."""
    total = sum(timings.values()) or 1.0
    rows = sorted(timings.items(), key=lambda kv: -kv[1])
    return [f"{name:>12}: {sec:7.1f} s  {sec / total:6.1%}" for name, sec in rows] + [f"{'total':>12}: {total:7.1f} s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default="runs/bench-main-job")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="the main job's toy sizes")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    args = p.parse_args()

    import torch

    from testbed.demo import DemoConfig
    from testbed.demo import main as demo

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    if (out / "summary.json").exists():
        sys.exit(f"{out} holds a finished main job: its steps would be skipped; give a fresh --output_dir")
    load0, start = os.getloadavg()[0], time.perf_counter()
    demo(DemoConfig(output_dir=str(out), seed=args.seed, smoke=args.smoke))
    wall, load1 = time.perf_counter() - start, os.getloadavg()[0]
    timings = json.loads((out / "timings.json").read_text())
    print(f"\n=== the main job's steps (seed {args.seed}{', smoke' if args.smoke else ''}; "
          f"torch threads {torch.get_num_threads()}; load average {load0:.1f} before, {load1:.1f} after) ===")
    print("\n".join(shares(timings)))
    print(f"{'untimed':>12}: {wall - sum(timings.values()):7.1f} s (imports, summary, solver predictions)")
    passes = sorted(p.name for p in (out / "warm_start").iterdir() if (p / "final").exists()) \
        if (out / "warm_start").exists() else []
    print(f"warm start passes: {', '.join(passes) or 'none'}")


if __name__ == "__main__":
    main()
