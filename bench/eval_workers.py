"""Evaluation with agents rolled out in forked processes (`colbench.evaluate --workers`) against one process.

    python bench/eval_workers.py                          # 2 agents, the test bed's 256 test tasks x 2
    python bench/eval_workers.py --agents 5 --limit 128   # the main job's validation: 5 snapshots x 128

The agents are the tiny model under several names (the same model, so every process does the
same work) on the test bed with its scripted human, the main job's settings (temperature 1,
64 new tokens). Each run writes into a fresh folder. It prints each run's wall time, the
ratio, torch's threads, and whether the two leaderboards and every episode's tokens agree
(they must: each process draws from the same per-call seeds). A small model's generation keeps
about one core busy, so on 2 cores two processes take about the time of one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--limit", type=int, default=None, help="test tasks (default: all 256)")
    p.add_argument("--episodes_per_task", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    import torch

    from colbench.episodes import read_episodes
    from colbench.evaluate import EvalConfig, evaluate

    names = [f"tiny{k}" for k in range(args.agents)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, args.workers):
            out = Path(tmp) / f"workers-{workers}"
            start = time.perf_counter()
            evaluate(EvalConfig(output=str(out), env="testbed", simulator="scripted:testbed",
                                tasks="builtin:default/test", agent=[f"{n}=hf:tiny" for n in names], limit=args.limit,
                                episodes_per_task=args.episodes_per_task, max_new_tokens=64, temperature=1.0,
                                device="cpu", dtype="float32", progress=False, workers=workers))
            wall = time.perf_counter() - start
            rows = [r["metrics"] for r in json.loads((out / "leaderboard.json").read_text())]
            tokens = {n: [[t.token_ids for t in e.agent_turns] for e in read_episodes(out / "episodes" / f"{n}.jsonl")]
                      for n in names}
            results[workers] = (wall, rows, tokens)
    (one, rows1, tok1), (many, rows2, tok2) = results[1], results[args.workers]
    print(f"\n{args.agents} agents x {args.limit or 256} tasks x {args.episodes_per_task} episodes, torch threads "
          f"{torch.get_num_threads()}: 1 process {one:.1f} s, --workers {args.workers} {many:.1f} s, "
          f"ratio {one / many:.2f}x; leaderboards {'identical' if rows1 == rows2 else 'DIFFER'}, episode tokens "
          f"{'identical' if tok1 == tok2 else 'DIFFER'}")


if __name__ == "__main__":
    main()
