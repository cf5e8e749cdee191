"""Batched episode runner vs one episode after another, same tiny model, same run.

    python bench/episodes.py                       # 32 episodes (16 tasks x 2 seeds), 2 turns, 8 new tokens
    python bench/episodes.py --episodes 128 --max-turns 3 --max-new-tokens 32 --device cuda

The batched way is `run_episodes` over all episodes: one `generate` call per step for
every waiting agent turn. The naive way calls `run_episodes` once per episode (what a
simple `for task in tasks: while not done: generate(...)` loop does). Both use the
tiny model as the agent, the scripted simulated human and the real sandbox scorer on
the bundled backend tasks (tasks × seeds up to --episodes), greedy decoding.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from colbench.agents import ModelAgent
    from colbench.envs import make_env
    from colbench.episodes import EpisodeConfig, run_episodes
    from colbench.tasks import load_tasks
    from engines import EngineOptions, SamplingParams, load_engine
    from simulators.scripted import ScriptedBackendSimulator

    tasks = load_tasks("builtin:test", env="backend", validate=False)
    n_seeds = -(-args.episodes // len(tasks))  # 32 episodes = 16 tasks x 2 seeds
    tasks, seeds = tasks[: args.episodes // n_seeds], tuple(range(n_seeds))
    pairs = [(t, s) for t in tasks for s in seeds]
    env = make_env("backend", max_turns=args.max_turns)
    engine = load_engine("tiny", EngineOptions(device=args.device, batch_size=args.episodes))
    agent = ModelAgent(engine, SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens), name="tiny")
    sim = ScriptedBackendSimulator()
    config = EpisodeConfig(max_turns=args.max_turns)
    env.score(tasks[:1], ["def warm(): pass"])  # start the sandbox pool outside the timings
    agent.act([])

    t0 = time.perf_counter()
    batched = run_episodes(env, tasks, agent, sim, seeds=seeds, config=config, progress=False)
    t_batched = time.perf_counter() - t0

    t0 = time.perf_counter()
    one_by_one = []
    for t, s in pairs:
        one_by_one += run_episodes(env, [t], agent, sim, seeds=(s,), config=config, progress=False)
    t_naive = time.perf_counter() - t0

    same = sum(a.answer == b.answer for a, b in zip(batched, one_by_one))
    turns = sum(len(ep.agent_turns) for ep in batched)
    print(f"{len(pairs)} episodes, {turns} agent turns, max_turns={args.max_turns}, "
          f"max_new_tokens={args.max_new_tokens}, device={args.device}")
    print(f"batched (one generate per step): {t_batched:8.2f} s  ({len(pairs) / t_batched:.2f} episodes/s)")
    print(f"one episode after another:       {t_naive:8.2f} s  ({len(pairs) / t_naive:.2f} episodes/s)")
    print(f"speed-up: {t_naive / t_batched:.2f}x   (same final answer in {same}/{len(pairs)} episodes; "
          "left padding can change greedy ties)")
    engine.close()
    env.close()


if __name__ == "__main__":
    main()
