"""The test bed's scripted human: deterministic, rule-based, no model.

It reads the agent's latest message for the words "positive" and "negative" and
answers from the task's hidden constants; anything else gets "I don't know." It
never writes code. See colbench/envs/testbed.py for the task family.
"""

from __future__ import annotations

from typing import Sequence

from simulators.base import SimReply, SimRequest

DONT_KNOW = "I don't know."


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
    """Simulator contract (simulators.base.Simulator) for the `testbed` environment."""

    __test__ = False  # not a pytest class
    name = "scripted:testbed"

    def __init__(self, env=None, max_reply_chars: int = 400):
        self.max_reply_chars = max_reply_chars

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        out = []
        for r in requests:
            if "a" not in r.task.meta or "b" not in r.task.meta:
                out.append(SimReply("", failed=True, error=f"task {r.task.task_id} is not a testbed task"))
                continue
            text = reply_for(r.turns[-1].content, r.task.meta["a"], r.task.meta["b"])
            out.append(SimReply(text[: self.max_reply_chars]))
        return out

    def close(self) -> None:
        pass
