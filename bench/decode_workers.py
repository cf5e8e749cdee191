"""Sampling on the CPU: per-row inverse transform, and batches decoded in forked processes
(`EngineOptions.workers`), against torch.multinomial in one process.

    python bench/decode_workers.py                    # tiny model, the test bed's 256 test tasks x 2
    python bench/decode_workers.py --model hf:runs/demo/warm_start/behave/final --workers 2

The prompts are the first turns of the test bed's test tasks (the main job's collection and
evaluation: temperature 1, 64 new tokens, 16 rows per batch). Three runs of the same engine:
1. "multinomial": the sampler every row used to share, torch.multinomial from one generator per
   call (it draws a vocabulary's worth of exponentials per row and step);
2. "inverse transform": the engine's sampler, one uniform per row and step from the row's
   own generator (engines.hf.row_generators), in one process;
3. "workers": the same, its batches dealt to `--workers` forked processes.
It prints each run's wall time and the ratios, and whether runs 2 and 3 drew the same tokens
(they must: a row's draws depend on the seed and the row only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class MultinomialSampler:
    """The naive way: torch.multinomial over softmax(scores), one generator for the call."""

    def __init__(self, generator) -> None:
        self.generator = generator

    def __call__(self, input_ids, scores):
        import torch

        tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1, generator=self.generator)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens, 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="hf:tiny")
    p.add_argument("--limit", type=int, default=None, help="test tasks (default: all 256)")
    p.add_argument("--episodes_per_task", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    import torch

    import engines.hf as hf
    from engines import EngineOptions, SamplingParams, load_engine
    from testbed.env import TestbedEnv, make_tasks

    env = TestbedEnv()
    tasks = make_tasks("test")[: args.limit]
    prompts = [env.agent_messages(t, []) for t in tasks] * args.episodes_per_task
    params = SamplingParams(temperature=1.0, max_new_tokens=64, seed=0)
    engine = load_engine(args.model, EngineOptions(device="cpu", dtype="float32"))

    def timed(workers: int):
        engine.options.workers = workers
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        return time.perf_counter() - start, [s[0].token_ids for s in out]

    shared = torch.Generator().manual_seed(0)
    inverse = hf._Sampler
    hf._Sampler = lambda generators: MultinomialSampler(shared)  # noqa: E731  (the naive sampler, this run only)
    try:
        naive, _ = timed(1)
    finally:
        hf._Sampler = inverse
    one, tokens1 = timed(1)
    many, tokens2 = timed(args.workers)
    print(f"\n{len(prompts)} prompts ({len(tasks)} tasks x {args.episodes_per_task}), {sum(map(len, tokens1))} tokens, "
          f"torch threads {torch.get_num_threads()}: multinomial {naive:.1f} s, inverse transform {one:.1f} s "
          f"({naive / one:.2f}x), --workers {args.workers} {many:.1f} s ({one / many:.2f}x over one process, "
          f"{naive / many:.2f}x over multinomial); tokens of one process and the workers "
          f"{'identical' if tokens1 == tokens2 else 'DIFFER'}")


if __name__ == "__main__":
    main()
