"""The test bed's scripted human: deterministic, rule-based, no model.

Every task is answered by its bed's rule (testbed.bed.task_bed; none: legacy),
testbed.bed.human_reply: a deterministic function of the task's hidden reference and
the agent's latest message (the constant of each branch it names, stated if a literal,
"not sure" if an expression; the docstring, or "I don't know.", for a message naming
none). It never writes code. See testbed/env.py for the tasks.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Sequence

from colbench.protocols import ANSWER_MARKER
from colbench.types import Task
from simulators.base import SimReply, SimRequest
from testbed import bed as testbed_bed
from testbed.mdp import optimal_message

DONT_KNOW = testbed_bed.DONT_KNOW


class TestbedSimulator:
    """Simulator contract (colbench.protocols.Simulator) for the `testbed` environment."""

    __test__ = False  # not a pytest class
    name = "scripted:testbed"

    def __init__(self, env=None, max_reply_chars: int = 400):
        self.max_reply_chars = max_reply_chars

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        out = []
        for r in requests:
            try:
                text = _reply(r.task, r.turns[-1].content)
            except ValueError as e:  # an unknown bed or a reference that is not the bed's
                out.append(SimReply("", failed=True, error=f"task {r.task.task_id} is not a testbed task: {e}"))
                continue
            out.append(SimReply(text[: self.max_reply_chars]))
        return out

    def close(self) -> None:
        pass


# ---- the scripted exploratory agent used for the warm start -------------------------

def scripted_dialogue(task: Task, rng: random.Random, p_ask: float = 0.6,
                      p_other: float = 0.0) -> list[tuple[str, str]]:
    """A dialogue of the exploratory scripted agent against the scripted human, as
    (role, text) pairs: the warm start imitates it.

    At each turn before the last it asks a question with probability `p_ask` (else
    it answers at once), choosing uniformly among the useful questions about positive
    and negative numbers and the vague one, whatever it already knows. It answers
    with the constants it was told and a fixed wrong default (x * 1, x + 0) for any
    constant it was not told. So every turn is a choice that matters and success
    (about 0.13 at p_ask = 0.6) needs the right question at each turn, a per-turn
    credit assignment problem, while copying a stated number stays easy.

    The explorer is testbed.bed's (`sample_explorer`, with `p_ask` in
    place of the bed's); a task of another bed gets that bed's turns, questions,
    guesses and human. `p_other` > 0: the explorer that reads its dialogue (right after a
    side question it asks another side with that probability; testbed_bed.TEACHERS)."""
    design = replace(testbed_bed.task_design(task), p_ask=p_ask, p_other=p_other)
    history: list[str] = []
    while True:
        text = testbed_bed.sample_explorer(design, history, rng)
        if ANSWER_MARKER in text:
            return [("agent" if i % 2 == 0 else "human", t) for i, t in enumerate(history + [text])]
        history += [text, _reply(task, text)]


def optimal_dialogue(task: Task, order: Sequence[int] | None = None) -> list[tuple[str, str]]:
    """A dialogue of the exact solver's optimal agent (testbed.mdp:
    `optimal_message`; `order` relabels its facts) against the scripted human on a bed
    task, as (role, text) pairs: what imitating the optimal policy teaches
    (testbed.warm_start --teacher optimal, optimal_shuffled)."""
    if testbed_bed.task_bed(task) is None:
        raise ValueError(f"task {task.task_id}: the optimal agent needs a non-legacy task (the legacy bed has none)")
    s = testbed_bed.task_design(task)
    history: list[str] = []
    while True:
        text = optimal_message(s, history, order)
        if ANSWER_MARKER in text:
            return [("agent" if i % 2 == 0 else "human", t) for i, t in enumerate(history + [text])]
        history += [text, _reply(task, text)]


def _reply(task: Task, question: str) -> str:
    return testbed_bed.human_reply(testbed_bed.task_design(task), task.hidden, question)
