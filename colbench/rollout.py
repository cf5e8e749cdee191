"""Agent + simulator + environment -> scored episodes: the one call that evaluation
and every trainer make to collect episodes.

    from colbench.rollout import episode_seeds, rollout
    agent = ModelAgent(engine, SamplingParams(temperature=1.0, max_new_tokens=256), name="policy")
    episodes = rollout(env, tasks, agent, simulator, seeds=episode_seeds(iteration, k=6),
                       out_path=out / "episodes.jsonl")

The caller builds (and closes) the agent, the simulator and the environment: colbench
never imports the simulators package (the evaluate CLI and the trainers wire it in).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from colbench.episodes import EpisodeConfig, run_episodes
from colbench.leaks import LeakGuard
from colbench.protocols import Agent, Environment, Simulator
from colbench.types import Episode, Task

SEED_STRIDE = 1000  # seeds of round r are r*1000 .. r*1000+k-1: disjoint across rounds while k <= 1000


def episode_seeds(seed: int, k: int) -> list[int]:
    """The episode seeds of the k episodes per task of round (or iteration) `seed`.
    Round 0 gives 0..k-1, what `python -m colbench.evaluate --episodes_per_task k` runs."""
    if k < 1 or k > SEED_STRIDE:
        raise ValueError(f"episodes per task must be in 1..{SEED_STRIDE}, got {k}")
    return [seed * SEED_STRIDE + j for j in range(k)]


def rollout(
    env: Environment,
    tasks: Sequence[Task],
    agent: Agent,
    simulator: Simulator | None,
    *,
    seeds: Sequence[int] = (0,),
    max_turns: int | None = None,
    single_turn: bool = False,
    max_concurrent: int | None = None,
    out_path: str | Path | None = None,
    progress: bool = False,
    leak_guard: LeakGuard | bool | None = None,
) -> list[Episode]:
    """Run and score one episode per task × seed (task-then-seed order).

    max_turns: agent turns at most (default: the environment's, which its prompt states).
    The simulator is not consulted by agents that answer at once (`needs_simulator`
    False) or in single-turn mode, so their episodes record none. Episodes already in
    `out_path` are reused by id, so a crashed collection resumes where it stopped.
    leak_guard: the guard on the simulated human's replies (colbench.leaks; None: on for
    backend, False: off).
    """
    asks = getattr(agent, "needs_simulator", True) and not single_turn
    config = EpisodeConfig(max_turns=max_turns or env.max_turns, single_turn=single_turn,
                           max_concurrent=max_concurrent, leak_guard=leak_guard)
    return run_episodes(env, tasks, agent, simulator if asks else None, seeds=seeds, config=config,
                        out_path=Path(out_path) if out_path is not None else None, progress=progress)
