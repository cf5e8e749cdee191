"""The environment contract: what the episode runner needs from a benchmark.

An environment knows how to show a task to the agent, when the agent has answered,
what the answer is, and how to score answers (in batches, in parallel, never in
our process when the answer is untrusted code or HTML).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from colbench.types import Score, Task, Turn
from engines.base import Message

DEFAULT_ANSWER_MARKER = "I WANT TO ANSWER:"


@runtime_checkable
class Environment(Protocol):
    name: str  # "backend", "frontend", ...
    answer_marker: str  # the agent ends the dialogue with this marker
    max_turns: int  # agent turns at most (paper: 10)

    def agent_messages(self, task: Task, turns: Sequence[Turn], single_turn: bool = False) -> list[Message]:
        """The chat the agent sees before its next turn: system/instructions with the
        task description, then the dialogue (agent turns as "assistant", human turns
        as "user")."""
        ...

    def is_final(self, agent_text: str) -> bool:
        """Whether this agent message ends the dialogue (it holds the answer marker)."""
        ...

    def extract_answer(self, agent_text: str) -> str:
        """The answer to score from a final agent message (code or HTML)."""
        ...

    def score(self, tasks: Sequence[Task], answers: Sequence[str]) -> list[Score]:
        """Score answers against their tasks' hidden information. A crash, hang or
        timeout scores 0 for that answer (recorded in Score.error), never raises."""
        ...

    def training_info(self, task: Task) -> str:
        """Training-time information for the SWEET critic (never shown to the policy)."""
        ...

    def close(self) -> None: ...
