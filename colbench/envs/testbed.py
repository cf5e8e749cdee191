"""A small collaborative test bed for proving that the algorithms learn on a CPU.

Not ColBench: a toy with ColBench's interfaces (Task, Environment, Simulator, real
sandbox scoring), small enough that a ~2M-parameter model learns it in minutes.

Each task hides a function from one parametrised family

    def f(x):
        if x >= 0:
            return x * A        # A in {2, 3}, told only when asked about positive numbers
        return x + B            # B in {10, 20}, told only when asked about negative numbers

The description is vague ("treats positive and negative numbers differently"). The
scripted human (simulators/testbed.py) answers a question about positive numbers
with A and one about negative numbers with B, and "I don't know" otherwise. Five of
the ten hidden tests use positive inputs and five negative ones, so an agent that
asks one question and guesses the other constant earns about half the reward, and
only an agent that asks both questions and copies both numbers into its code earns
full reward: multi-turn credit assignment in miniature.

A and B are single tokens from two disjoint two-value sets, so using a stated
constant is a small lookup, not a copy that a 2M-parameter model needs thousands of
steps to learn. The scripted explorer the warm start imitates (simulators/testbed.py)
chooses per turn between asking about positive numbers, negative numbers, a vague
question and answering now, and writes a never-right default (x * 1, x + 0) for any
constant it was not told: success comes only from asking both useful questions.
"""

from __future__ import annotations

import random
from typing import Sequence

from colbench.envs.backend import BackendEnv
from colbench.envs.base import agent_chat
from colbench.protocols import ANSWER_MARKER
from colbench.types import Task, Turn
from engines.base import Message

DESCRIPTION = "I need a function f(x) for my numbers. It treats positive and negative numbers differently. def f(x)"
SYSTEM = "Ask the human about f, then write " + ANSWER_MARKER + " and the code."
QUESTION_POS = "What happens to positive numbers?"
QUESTION_NEG = "What happens to negative numbers?"
QUESTION_VAGUE = "Can you tell me more?"

# Two values per constant: the 2M-parameter warm start learned to copy which of 8 stated
# values it was told only at chance after 400 steps (it learned *that* it was told), so
# the lookup is kept small and the difficulty stays in which questions to ask.
A_VALUES = (2, 3)
B_VALUES = (10, 20)
N_TRAIN, N_TEST = 56, 16
DEFAULT_A, DEFAULT_B = 1, 0  # the explorer's guess for a constant it was not told: never right
MAX_TURNS = 4  # agent turns: up to three questions, then the answer
REFERENCE = "def f(x):\n    if x >= 0:\n        return x * {a}\n    return x + {b}\n"


def answer_text(a: int, b: int) -> str:
    """The agent's final message for constants (a, b), in the canonical form."""
    return f"{ANSWER_MARKER}\n```python\n{REFERENCE.format(a=a, b=b)}```"


def make_task(index: int, split: str, a: int, b: int, rng: random.Random) -> Task:
    pos = rng.sample(range(1, 10), 5)
    neg = rng.sample(range(-9, 0), 5)
    tests = tuple(f"f({x})" for x in pos + neg)
    return Task(
        task_id=f"testbed-{split}-{index:04d}",
        env="testbed",
        description=DESCRIPTION,
        hidden=REFERENCE.format(a=a, b=b),
        tests=tests,
        meta={"a": a, "b": b, "split": split},
    )


def make_tasks(split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """Deterministic task sets: 56 train and 16 test tasks cycling through the four (A, B)
    pairs, each with its own hidden test inputs. The description is the same for every
    task, so a task's constants are learnable only by asking, never by memorising."""
    sizes = {"train": N_TRAIN, "test": N_TEST}
    if split not in sizes:
        raise ValueError(f"testbed split must be 'train' or 'test', got {split!r}")
    combos = [(a, b) for a in A_VALUES for b in B_VALUES]
    rng = random.Random(f"{split}-{seed}")
    tasks = [make_task(i, split, *combos[i % len(combos)], rng) for i in range(sizes[split])]
    return tasks[:n] if n is not None else tasks


class TestbedEnv(BackendEnv):
    """Backend programming's environment (sandboxed scoring, answer marker) with the
    test bed's short instructions and a 4-turn limit."""

    name = "testbed"
    __test__ = False  # not a pytest class

    def __init__(self, max_turns: int = MAX_TURNS, answer_marker: str = ANSWER_MARKER, workers: int = 2, limits=None):
        super().__init__(answer_marker=answer_marker, max_turns=max_turns, workers=workers, limits=limits)

    def agent_messages(self, task: Task, turns: Sequence[Turn], single_turn: bool = False) -> list[Message]:
        system = SYSTEM if not single_turn else f"Write {self.answer_marker} and the code now."
        return agent_chat(system, task.description, turns)
