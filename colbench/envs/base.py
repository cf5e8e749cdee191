"""What the bundled environments share: filling the agent's instructions and
building the chat the agent sees. The contract itself is
`colbench.protocols.Environment`.
"""

from __future__ import annotations

from typing import Sequence

from colbench.types import Turn
from engines.base import Message


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
