"""The simulated-human contract.

A simulator answers a batch of dialogues at once: each request holds the task
(with its hidden information) and the dialogue so far, whose last turn is the
agent's latest message. A reply that fails for good is returned with
`failed=True` and the error; it is recorded on the episode and counted, never
replaced silently by made-up text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from colbench.types import Task, Turn


@dataclass(frozen=True)
class SimRequest:
    task: Task
    turns: Sequence[Turn]  # dialogue so far; turns[-1] is the agent's latest message


@dataclass(frozen=True)
class SimReply:
    text: str
    failed: bool = False
    error: str | None = None
    render: str | None = None  # frontend: screenshot of the agent's page that was compared


def check_requests(requests: Sequence[SimRequest]) -> None:
    """Every request must end with the agent's latest message (a runner bug otherwise)."""
    for r in requests:
        if not r.turns or r.turns[-1].role != "agent":
            raise ValueError(f"task {r.task.task_id}: the last turn of a simulator request must be the agent's")


@runtime_checkable
class Simulator(Protocol):
    name: str

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        """One reply per request, in order. Never raises for one request's failure."""
        ...

    def close(self) -> None: ...
