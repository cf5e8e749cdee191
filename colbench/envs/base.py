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


def fill_instructions(template: str, single_turn_note: str, *, max_turns: int, answer_marker: str,
                      single_turn: bool = False) -> str:
    """An agent prompt file with its {max_turns} and {answer_marker} filled in."""
    text = template + (single_turn_note if single_turn else "")
    return text.replace("{max_turns}", str(1 if single_turn else max_turns)).replace(
        "{answer_marker}", answer_marker).strip()


def agent_chat(system: str, description: str, turns: Sequence[Turn]) -> list[Message]:
    """System instructions, the task description as the human's first message, then the
    dialogue (agent turns as "assistant", human turns as "user")."""
    messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": description}]
    for t in turns:
        messages.append({"role": "assistant" if t.role == "agent" else "user", "content": t.content})
    return messages


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
