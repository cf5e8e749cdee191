"""The test bed's scripted human: deterministic, rule-based, no model.

It reads the agent's latest message for the words "positive" and "negative" and
answers from the task's hidden constants; anything else gets "I don't know." It
never writes code. See testbed/env.py for the task family.

A task of another spec (`meta["spec"]`, testbed/spec.py) is answered by
that spec's rule, `testbed_spec.human_reply`: a deterministic function of the task's
hidden reference and the question (stated literal, "not sure" for an expression, the
docstring for the vague question).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Sequence

from colbench.protocols import ANSWER_MARKER
from colbench.types import Task
from simulators.base import SimReply, SimRequest
from testbed import spec as testbed_spec
from testbed.mdp import optimal_message

DONT_KNOW = testbed_spec.DONT_KNOW


def reply_for(question: str, a: int, b: int) -> str:
    """The human's reply to one agent message, given the hidden constants."""
    q = question.lower()
    parts = []
    # The constant is stated as a formula ("x * 6") rather than in words so that a
    # tiny model can learn to copy it with an induction head in a few hundred steps.
    if "positive" in q:
        parts.append(f"For positive numbers it is x * {a}.")
    if "negative" in q:
        parts.append(f"For negative numbers it is x + {b}.")
    return " ".join(parts) if parts else DONT_KNOW


class TestbedSimulator:
    """Simulator contract (colbench.protocols.Simulator) for the `testbed` environment."""

    __test__ = False  # not a pytest class
    name = "scripted:testbed"

    def __init__(self, env=None, max_reply_chars: int = 400):
        self.max_reply_chars = max_reply_chars

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        out = []
        for r in requests:
            if "spec" in r.task.meta:
                try:
                    text = _reply(r.task, r.turns[-1].content)
                except ValueError as e:  # an unknown spec or a reference that is not the spec's
                    out.append(SimReply("", failed=True, error=f"task {r.task.task_id}: {e}"))
                    continue
                out.append(SimReply(text[: self.max_reply_chars]))
                continue
            if "a" not in r.task.meta or "b" not in r.task.meta:
                out.append(SimReply("", failed=True, error=f"task {r.task.task_id} is not a testbed task"))
                continue
            text = reply_for(r.turns[-1].content, r.task.meta["a"], r.task.meta["b"])
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

    The explorer is testbed.spec's (`sample_explorer`, with `p_ask` in
    place of the spec's); a task of another spec gets that spec's turns, questions,
    guesses and human. `p_other` > 0: the explorer that reads its dialogue (right after a
    side question it asks another side with that probability; testbed_spec.TEACHERS)."""
    spec = replace(testbed_spec.task_spec(task), p_ask=p_ask, p_other=p_other)
    history: list[str] = []
    while True:
        text = testbed_spec.sample_explorer(spec, history, rng)
        if ANSWER_MARKER in text:
            return [("agent" if i % 2 == 0 else "human", t) for i, t in enumerate(history + [text])]
        history += [text, _reply(task, text)]


def optimal_dialogue(task: Task, order: Sequence[int] | None = None) -> list[tuple[str, str]]:
    """A dialogue of the exact solver's optimal agent (testbed.mdp:
    `optimal_message`; `order` relabels its facts) against the scripted human on a spec
    task, as (role, text) pairs: what imitating the optimal policy teaches
    (testbed.warm_start --teacher optimal, optimal_shuffled)."""
    if "spec" not in task.meta:
        raise ValueError(f"task {task.task_id}: the optimal agent needs a spec task (the legacy bed has none)")
    s = testbed_spec.task_spec(task)
    history: list[str] = []
    while True:
        text = optimal_message(s, history, order)
        if ANSWER_MARKER in text:
            return [("agent" if i % 2 == 0 else "human", t) for i, t in enumerate(history + [text])]
        history += [text, _reply(task, text)]


def _reply(task: Task, question: str) -> str:
    if "spec" in task.meta:
        return testbed_spec.human_reply(testbed_spec.task_spec(task), task.hidden, question)
    return reply_for(question, task.meta["a"], task.meta["b"])
