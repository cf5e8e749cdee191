"""Training-side records, built from the environment's Episodes.

State      a dialogue prefix at which the agent acts (one per agent turn).
Candidate  one sampled action for a State, with its critic advantage.
Pair       a preference, chosen over rejected, within one task: of Episodes (critic
           training, multi-turn DPO), of Candidates of one State (SWEET-RL stage 2), or
           of the token Segments a DPO trainer sees (sweet.policy_trainer).

Episodes come from our runner's JSONL or from the published offline trajectories;
`colbench.episodes.load_episodes` (re-exported here) reads both.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Generic, Iterable, Sequence, TypeVar

from colbench.episodes import load_episodes  # noqa: F401  (the one episode reader, re-exported)
from colbench.types import Episode
from engines.base import Message


@dataclass(frozen=True)
class State:
    """What the policy saw before agent turn `turn_index` of an episode.

    prompt:           the chat messages the policy was given.
    prompt_token_ids: the exact templated ids (None when the engine did not report them).
    training_info:    hidden information for the critic only (reference code / target HTML).
    """

    task_id: str
    episode_id: str
    turn_index: int  # index among the episode's agent turns
    prompt: tuple[Message, ...]
    prompt_token_ids: tuple[int, ...] | None
    training_info: str


@dataclass(frozen=True)
class Candidate:
    """One action for a State. `token_ids` are the generated ids, never re-tokenised."""

    state: State
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    advantage: float | None = None  # critic score A(o_t, a_t, c)
    finish_reason: str | None = "stop"  # engines.Sample.finish_reason; eos appended only on "stop" (sweet.tokens)


T = TypeVar("T")


@dataclass(frozen=True)
class Pair(Generic[T]):
    """`chosen` is preferred to `rejected`; both belong to task `task_id` (and, for
    per-turn pairs, to `state`). T: Episode, Candidate, or tuple[Segment, ...]."""

    chosen: T
    rejected: T
    task_id: str
    state: State | None = None


def episode_states(episode: Episode, training_info: str) -> list[State]:
    """One State per agent turn that carries its prompt."""
    states = []
    for i, turn in enumerate(episode.agent_turns):
        if turn.prompt is None:
            raise ValueError(f"episode {episode.episode_id}: agent turn {i} has no recorded prompt")
        ids = tuple(turn.prompt_token_ids) if turn.prompt_token_ids is not None else None
        states.append(State(episode.task_id, episode.episode_id, i, tuple(turn.prompt), ids, training_info))
    return states


def group_by_task(episodes: Iterable[Episode]) -> dict[str, list[Episode]]:
    groups: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        groups[ep.task_id].append(ep)
    return dict(groups)


def make_trajectory_pairs(
    episodes: Sequence[Episode], success_threshold: float = 1.0, min_reward_gap: float = 0.0
) -> list[Pair[Episode]]:
    """The paper's pairing: for each task whose best episode reaches `success_threshold`,
    chosen = that best episode, rejected = every episode with a strictly lower reward
    (by more than `min_reward_gap`)."""
    pairs = []
    for task_id, group in sorted(group_by_task(episodes).items()):
        best = max(group, key=lambda e: e.reward)
        if best.reward < success_threshold:
            continue
        for ep in group:
            if ep.reward < best.reward - min_reward_gap and ep is not best:
                pairs.append(Pair(best, ep, task_id))
    return pairs
