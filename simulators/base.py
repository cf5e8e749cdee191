"""The simulated-human contract, as colbench's episode runner defines it.

`SimRequest`, `SimReply` and `Simulator` live in `colbench.protocols` (the runner
owns its contracts); they are re-exported here for simulator implementations.
A simulator answers a batch of dialogues at once: each request holds the task
(with its hidden information) and the dialogue so far, whose last turn is the
agent's latest message. A reply that fails for good is returned with
`failed=True` and the error; it is recorded on the episode and counted, never
replaced silently by made-up text.
"""

from __future__ import annotations

from typing import Sequence

from colbench.protocols import SimReply, SimRequest, Simulator

__all__ = ["SimReply", "SimRequest", "Simulator", "check_requests"]


def check_requests(requests: Sequence[SimRequest]) -> None:
    """Every request must end with the agent's latest message (a runner bug otherwise)."""
    for r in requests:
        if not r.turns or r.turns[-1].role != "agent":
            raise ValueError(f"task {r.task.task_id}: the last turn of a simulator request must be the agent's")
