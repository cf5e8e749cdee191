"""Warm start for the CPU test bed: supervised training on a scripted explorer.

A random-weight tiny model cannot hold a dialogue, so every algorithm starts from
the same warm start: the tiny model fine-tuned on dialogues of the scripted
exploratory agent (colbench/envs/testbed.py), which asks the right questions only
some of the time. The warm-started policy therefore has a modest, non-zero success
rate, and there is something for RL to improve.

    python -m sweet.warm_start --output_dir runs/warm_start          # ~1-2 min on CPU

The scripted dialogues are written as Episodes (agent turns carry prompt ids and
action ids from the tokenizer, since no engine generated them), so this is plain
rejection fine-tuning with no reward filter, reusing the same training code.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from colbench.types import STOP_ANSWERED, Episode, Score, Turn


@dataclass
class WarmStartConfig:
    output_dir: str = field(default="runs/warm_start", metadata={"help": "where the warm-started model goes (final/)"})
    model: str = field(default="tiny", metadata={"help": "model to fine-tune"})
    n_dialogues: int = field(default=1200, metadata={"help": "scripted dialogues to train on"})
    p_ask: float = field(default=0.55, metadata={"help": "probability that the explorer asks each question"})
    epochs: int = field(default=2, metadata={"help": "passes over the dialogues"})
    learning_rate: float = field(default=3e-3, metadata={"help": "AdamW learning rate"})
    batch_size: int = field(default=32, metadata={"help": "examples per step"})
    seed: int = field(default=0, metadata={"help": "random seed"})


def scripted_episodes(tokenizer, n: int, p_ask: float, seed: int) -> list[Episode]:
    """`n` scripted explorer episodes on the test bed's train tasks, tokenised."""
    from colbench.envs.testbed import TestbedEnv, make_tasks
    from sweet.tokens import template_ids

    env = TestbedEnv()
    tasks = make_tasks("train")
    rng = random.Random(seed)
    episodes = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        turns: list[Turn] = []
        for role, text in _dialogue(task, rng, p_ask):
            if role == "agent":
                prompt = env.agent_messages(task, turns)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                turns.append(Turn("agent", text, prompt=prompt, prompt_token_ids=template_ids(tokenizer, prompt), token_ids=ids))
            else:
                turns.append(Turn("human", text))
        episodes.append(Episode(task.task_id, "testbed", "scripted-explorer", i, turns, answer=turns[-1].content,
                                stop_reason=STOP_ANSWERED))
    answers = [env.extract_answer(ep.answer) for ep in episodes]
    for ep, score in zip(episodes, env.score([tasks[i % len(tasks)] for i in range(n)], answers)):
        ep.score = score
    env.close()
    return episodes


def _dialogue(task, rng, p_ask):
    from colbench.envs.testbed import scripted_dialogue

    return scripted_dialogue(task, rng, p_ask=p_ask)


def write_episodes(episodes: list[Episode], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for ep in episodes:
            f.write(json.dumps(ep.to_json()) + "\n")
