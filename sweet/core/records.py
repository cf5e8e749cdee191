"""Training-side records, built from the environment's Episodes.

State      a dialogue prefix at which the agent acts (one per agent turn).
Candidate  one sampled action for a State, with its critic advantage.
Pair       a preference, chosen over rejected, within one task: of Episodes (critic
           training, multi-turn DPO), of Candidates of one State (SWEET-RL stage 2), or
           of the token Segments a DPO trainer sees (sweet.algorithms.policy_trainer).
CandidatesRow  the wire record of stage 2's candidates.jsonl: one State's K sampled
           actions with their critic scores (`read_candidates` is its one reader).

The pairing rules: `make_trajectory_pairs` (episodes of a task, by reward: the critic,
multi-turn DPO) and `make_action_pairs` (a State's candidates, by critic score: stage 2).

Episodes come from our runner's JSONL or from the published offline trajectories;
`colbench.episodes.load_episodes` (re-exported here) reads both.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Iterable, Sequence, TypeVar

from colbench.envs.base import PAIRING_RULES
from colbench.episodes import load_episodes  # noqa: F401  (the one episode reader, re-exported)
from colbench.jsonl import read_rows
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
    finish_reason: str | None = "stop"  # engines.Sample.finish_reason; eos appended only on "stop" (sweet.core.tokens)


def state_key(state: State) -> str:
    """A State's key in candidates.jsonl: `<episode_id>#<turn_index>`."""
    return f"{state.episode_id}#{state.turn_index}"


@dataclass(frozen=True)
class SampledAction:
    """One candidate as stored: the sampler's text, ids, log-probs and finish reason, and
    the critic's advantage A(o_t, a_t, c)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: str | None
    advantage: float

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": list(self.token_ids),
                "logprobs": list(self.logprobs) if self.logprobs is not None else None,
                "finish_reason": self.finish_reason, "advantage": self.advantage}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SampledAction":
        return cls(str(d["text"]), tuple(int(i) for i in d["token_ids"]),
                   tuple(float(x) for x in d["logprobs"]) if d.get("logprobs") else None,
                   d.get("finish_reason"), float(d["advantage"]))


@dataclass(frozen=True)
class CandidatesRow:
    """One line of candidates.jsonl: the K actions sampled at one State, scored."""

    key: str  # state_key(state)
    task_id: str
    episode_id: str
    turn_index: int
    prompt_token_ids: tuple[int, ...] | None  # the sampler's templated context, when it reported it
    candidates: tuple[SampledAction, ...]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "task_id": self.task_id, "episode_id": self.episode_id,
                "turn_index": self.turn_index,
                "prompt_token_ids": list(self.prompt_token_ids) if self.prompt_token_ids is not None else None,
                "candidates": [c.to_json() for c in self.candidates]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CandidatesRow":
        ids = d.get("prompt_token_ids")
        return cls(str(d["key"]), str(d["task_id"]), str(d["episode_id"]), int(d["turn_index"]),
                   tuple(int(i) for i in ids) if ids is not None else None,
                   tuple(SampledAction.from_json(c) for c in d["candidates"]))

    def for_state(self, state: State) -> list["Candidate"]:
        """The row's candidates as Candidates of `state` (the State it was sampled at)."""
        return [Candidate(state, c.text, c.token_ids, c.logprobs, c.advantage, c.finish_reason)
                for c in self.candidates]


def read_candidates(path: str | Path, *, repair: bool = False) -> dict[str, CandidatesRow]:
    """key -> row of a candidates.jsonl (a torn last line from an interrupted write is
    skipped, and cut when `repair`); a bad row elsewhere names file:line."""
    rows = read_rows(path, CandidatesRow.from_json, what="candidates row", repair=repair)
    return {row.key: row for row in rows}


T = TypeVar("T")
# "all" pairing keeps a gap exactly at min_reward_gap; rewards are floats, so 0.7 - 0.6 is
# 0.0999...: gaps within this of the threshold count as at it
GAP_ROUNDING = 1e-9


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
    episodes: Sequence[Episode], success_threshold: float = 1.0, min_reward_gap: float = 0.0,
    pairing_rule: str = "best",
) -> list[Pair[Episode]]:
    """Trajectory pairs within each task whose best episode reaches `success_threshold`
    (colbench.envs.base.TrainingDefaults states each field; trainers take the --env's):

    "best" (the paper; published evaluate_code.py): chosen = the task's best episode,
            rejected = every episode whose reward is lower by more than `min_reward_gap`.
    "all"   (published evaluate_html.py): every two episodes whose rewards differ by at
            least `min_reward_gap` (a gap exactly at it is kept, up to float rounding:
            0.7 against 0.6 pairs at 0.1) and are not equal; the higher is chosen.

    Tasks in sorted order; within a task, episodes in their given order."""
    if pairing_rule not in PAIRING_RULES:
        raise ValueError(f"pairing_rule must be one of {PAIRING_RULES}, got {pairing_rule!r}")
    pairs = []
    for task_id, group in sorted(group_by_task(episodes).items()):
        best = max(group, key=lambda e: e.reward)
        if best.reward < success_threshold:
            continue
        if pairing_rule == "best":
            pairs += [Pair(best, ep, task_id) for ep in group
                      if ep.reward < best.reward - min_reward_gap and ep is not best]
            continue
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                hi, lo = (a, b) if a.reward > b.reward else (b, a)
                if hi.reward > lo.reward and hi.reward - lo.reward >= min_reward_gap - GAP_ROUNDING:
                    pairs.append(Pair(hi, lo, task_id))
    return pairs


def rank_halves(scores: Sequence[float]) -> tuple[list[int], list[int]]:
    """Stage 2's ranking of one state's candidates, pure: the indices of the top and the
    bottom half by score, highest first (a stable sort: tied candidates keep their order;
    an odd count leaves the median out of both halves; fewer than two: no halves). A pair
    is a top one against a bottom one with a lower score. The test bed's exact solver pairs
    with it too (testbed/predict.py)."""
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    half = len(order) // 2
    return (order[:half], order[-half:]) if half else ([], [])


def make_action_pairs(scored: Sequence[tuple[State, Sequence[Candidate]]], pairs_per_state: int,
                      rng: random.Random) -> tuple[list[Pair[Candidate]], dict[str, float]]:
    """Per state: rank candidates by advantage, draw `pairs_per_state` (top-half, bottom-half)
    pairs at random (with replacement). States whose candidates all tie are skipped; drawn
    pairs with equal scores are dropped. Returns the pairs and counts/spread metrics."""
    pairs: list[Pair[Candidate]] = []
    tied = dropped = 0
    stds, ranges = [], []
    for state, cands in scored:
        advs = [c.advantage for c in cands]
        if len(cands) < 2:
            tied += 1
            continue
        stds.append(statistics.pstdev(advs))
        ranges.append(max(advs) - min(advs))
        if max(advs) == min(advs):
            tied += 1
            continue
        top, bottom = ([cands[i] for i in idx] for idx in rank_halves(advs))
        for _ in range(pairs_per_state):
            chosen, rejected = rng.choice(top), rng.choice(bottom)
            if chosen.advantage > rejected.advantage:
                pairs.append(Pair(chosen, rejected, state.task_id, state))
            else:
                dropped += 1
    metrics = {
        "sweet/states": len(scored), "sweet/tied_states": tied, "sweet/dropped_equal_pairs": dropped,
        "sweet/pairs": len(pairs),
        "sweet/critic_score_std": statistics.fmean(stds) if stds else 0.0,
        "sweet/critic_score_range": statistics.fmean(ranges) if ranges else 0.0,
    }
    return pairs, metrics
