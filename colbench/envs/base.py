"""What the bundled environments share: filling the agent's instructions,
building the chat the agent sees, and the trainers' defaults for turning rewards into
training data (`TrainingDefaults`). The contract itself is
`colbench.protocols.Environment`.
"""

from __future__ import annotations

from dataclasses import dataclass
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


PAIRING_RULES = ("best", "all")  # TrainingDefaults.pairing_rule (sweet.core.records.make_trajectory_pairs)


@dataclass(frozen=True)
class TrainingDefaults:
    """How trainers turn this environment's rewards into training data when no flag
    says otherwise (an environment class's `training_defaults` attribute; read through
    `colbench.envs.training_defaults(name)`, shown in the trainers' --help).

    pairing_rule:      how trajectory pairs of one task are made (the critic, multi-turn
                       DPO's paper pairing, the inspector):
                       "best": the best episode against each worse one (the paper; the
                               published backend script, evaluate_code.py);
                       "all":  every two episodes whose rewards differ by at least
                               `min_reward_gap`, the higher chosen (the published frontend
                               script, evaluate_html.py).
    success_threshold: pairs come from tasks whose best episode reaches this reward, and
                       RFT imitates episodes that reach it.
    min_reward_gap:    "best": a rejected episode's reward is below the best one's by more
                       than this; "all": two rewards at least this far apart make a pair
                       (a gap exactly at it is kept; equal rewards never pair).
    rft_top_fraction:  RFT also keeps only the best `rft_top_fraction` of all episodes
                       by reward (1.0: no rank filter).

    The default is the paper's backend rule: the best episode succeeds (reward 1.0 = all
    tests pass), any strictly worse episode is rejected, RFT imitates successes.
    """

    pairing_rule: str = "best"
    success_threshold: float = 1.0
    min_reward_gap: float = 0.0
    rft_top_fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.pairing_rule not in PAIRING_RULES:
            raise ValueError(f"TrainingDefaults: pairing_rule must be one of {PAIRING_RULES}, "
                             f"got {self.pairing_rule!r}")
        if self.min_reward_gap < 0 or not 0.0 < self.rft_top_fraction <= 1.0:
            raise ValueError(f"TrainingDefaults: min_reward_gap must be >= 0 and rft_top_fraction in (0, 1], got {self}")
