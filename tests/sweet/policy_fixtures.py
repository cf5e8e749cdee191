"""Episodes for the policy-trainer tests, produced by real runs.

The tiny random-weight model talks to the scripted test-bed human
(testbed.env, real sandbox scoring) through the real episode runner. It
never solves a task, so to get reward differences the last agent turn of some
episodes is replaced by the canonical correct answer (ids from the tokenizer, as a
model emitting that text would produce) and re-scored by the environment's scorer.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from colbench.types import Episode, Score

# The trainers' CLI flags every policy test uses: the tiny model, fp32, short contexts.
FAST = ["--model", "tiny", "--dtype", "float32", "--report_to", "none", "--max_length", "512", "--keep_head", "64"]


def tiny_engine():
    import torch

    from engines import EngineOptions, load_engine

    torch.set_num_threads(2)
    return load_engine("tiny", EngineOptions(device="cpu", dtype="float32", batch_size=16))


def run_tiny_episodes(out_dir: Path, n_tasks: int = 3, seeds=(0, 1), max_turns: int = 2, max_new_tokens: int = 12,
                      solve_seed: int | None = 0) -> tuple[Path, Path, list[Episode]]:
    """Run tiny-model episodes on `n_tasks` test-bed tasks; episodes with seed ==
    `solve_seed` get the correct final answer. Writes episodes.jsonl and tasks.jsonl."""
    from colbench.agents import ModelAgent
    from testbed.env import TestbedEnv, answer_text, make_tasks
    from colbench.episodes import EpisodeConfig, run_episodes
    from engines.base import SamplingParams
    from testbed.human import TestbedSimulator

    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks("train", n=n_tasks, bed="legacy")
    env = TestbedEnv(max_turns=max_turns)
    engine = tiny_engine()
    try:
        agent = ModelAgent(engine, SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens), name="tiny")
        episodes = run_episodes(env, tasks, agent, TestbedSimulator(), seeds=seeds,
                                config=EpisodeConfig(max_turns=max_turns), progress=False)
        by_id = {t.task_id: t for t in tasks}
        tok = engine.tokenizer
        out = []
        for ep in episodes:
            if ep.seed == solve_seed:
                task = by_id[ep.task_id]
                text = answer_text(task.meta["a"], task.meta["b"])
                last = ep.agent_turns[-1]
                ids = tok(text, add_special_tokens=False)["input_ids"]
                turns = list(ep.turns)
                turns[turns.index(last)] = replace(last, content=text, token_ids=ids, logprobs=None)
                answer = env.extract_answer(text)
                score: Score = env.score([task], [answer])[0]
                ep = replace(ep, turns=turns, answer=answer, score=score, stop_reason="answered")
            out.append(ep)
    finally:
        env.close()
    eps_path, tasks_path = out_dir / "episodes.jsonl", out_dir / "tasks.jsonl"
    eps_path.write_text("".join(ep.dumps() + "\n" for ep in out))
    tasks_path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    return eps_path, tasks_path, out


_CACHE: dict[tuple, tuple[Path, Path, list[Episode]]] = {}


def cached_tiny_episodes(out_dir: Path, **kwargs) -> tuple[Path, Path, list[Episode]]:
    """run_tiny_episodes once per test process (several test modules share it)."""
    key = tuple(sorted(kwargs.items()))
    if key not in _CACHE:
        _CACHE[key] = run_tiny_episodes(Path(out_dir) / f"episodes-{len(_CACHE)}", **kwargs)
    return _CACHE[key]


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
