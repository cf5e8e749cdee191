"""What a policy does in its test-bed dialogues, read off its episodes as the solver's actions.

    python -m testbed.profile RUN/leaderboard/episodes/*.jsonl --spec default

Each agent message is mapped to the solver's action (testbed.mdp:
`abstract_history`): ask about one fact, the vague question, or answer. Per episodes file:

    success       the episodes' success rate
    early         answered before the last turn
    repeat        P(the second question repeats the first | two questions asked): 1/3 for
                  the default bed's warm start and for any policy whose second question
                  ignores the first (testbed.policy_class: such a policy,
                  moved from the symmetric warm start, stops near 0.60 by every method); it
                  falls towards 0 as a policy learns to read which question it asked
    vague_first   the first turn asks the vague question
    faithful      the answer writes what the dialogue told and the fixed guess for the rest
                  (what the warm start was taught; below 1: the answers themselves broke)

Each with a 95% bootstrap interval over tasks (colbench.stats.bootstrap_ci, tasks in the
leaderboard's order: success and its interval are the leaderboard's).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from colbench.episodes import read_episodes
from colbench.stats import Metric, bootstrap_ci
from colbench.types import Episode
from testbed import spec as ts
from testbed.mdp import abstract_history

FIELDS = ("success", "early", "repeat", "vague_first", "faithful")


@dataclass
class DialogueProfile:
    """The profile of one set of episodes (FIELDS, each a Metric over its episodes' tasks)."""

    episodes: int
    asked_twice: int
    metrics: dict[str, Metric]

    def to_json(self) -> dict:
        return {"episodes": self.episodes, "asked_twice": self.asked_twice,
                **{k: m.to_json() for k, m in self.metrics.items()}}

    def line(self) -> str:
        return "  ".join(f"{k} {m.value:.3f} [{m.low:.3f}, {m.high:.3f}]" for k, m in self.metrics.items())


def episode_actions(s: ts.TestbedSpec, ep: Episode) -> list[int]:
    """The solver's action of each question the episode asked (its last agent turn, the answer, not included)."""
    messages = [t.content for t in ep.turns]
    return [a for a, _ in abstract_history(s, messages[:-1])] if messages else []


def _repeats(acts: Sequence[int]) -> bool | None:
    return acts[0] == acts[1] if len(acts) >= 2 else None


def asked_twice_repeat(s: ts.TestbedSpec, ep: Episode) -> bool | None:
    """Whether the episode's second question repeats its first (None: it asked fewer than two)."""
    return _repeats(episode_actions(s, ep))


def profile(spec: str | ts.TestbedSpec, episodes: Sequence[Episode]) -> DialogueProfile:
    """The profile of `episodes` on test-bed preset `spec` (their dialogues end with the
    agent's answer, as the runner writes them)."""
    s = ts.spec(spec)
    values: dict[str, dict[str, list[float]]] = {k: {} for k in FIELDS}

    def add(field: str, task: str, v: float) -> None:
        values[field].setdefault(task, []).append(v)

    twice = 0
    # in the leaderboard's order (task, then seed: colbench.rollout), so that the bootstrap
    # draws the same tasks and the success interval is the leaderboard's to the digit
    for ep in sorted(episodes, key=lambda e: (e.task_id, e.seed)):
        acts = episode_actions(s, ep)
        texts = [t.content for t in ep.turns]
        told = ts.told_values(s, texts[1::2])
        add("success", ep.task_id, float(ep.success))
        add("early", ep.task_id, float(len(acts) < s.turns - 1))
        add("vague_first", ep.task_id, float(bool(acts) and acts[0] == s.facts))
        add("faithful", ep.task_id, float(bool(texts) and ts.answer_values(s, texts[-1]) == ts.guess_values(s, told)))
        if (repeated := _repeats(acts)) is not None:
            twice += 1
            add("repeat", ep.task_id, float(repeated))
    return DialogueProfile(len(episodes), twice, {k: bootstrap_ci(list(values[k].values())) for k in FIELDS})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("episodes", nargs="+", help="episodes JSONL files (e.g. RUN/leaderboard/episodes/*.jsonl)")
    parser.add_argument("--spec", default=ts.DEFAULT_SPEC, help=f"the test-bed preset the episodes ran on: {', '.join(ts.PRESETS)}")
    parser.add_argument("--json", action="store_true", help="one JSON object, keyed by file")
    args = parser.parse_args(argv)
    try:
        s = ts.spec(args.spec)
    except ValueError as e:
        parser.error(str(e))
    if s.legacy:
        parser.error("--spec legacy: the profile reads a spec's facts; the legacy bed has its own readers")
    out = {}
    for path in args.episodes:
        if not Path(path).is_file():
            parser.error(f"{path}: no such episodes file")
        p = profile(s, read_episodes(Path(path)))
        out[path] = p
        if not args.json:
            print(f"{path} ({p.episodes} episodes, {p.asked_twice} ask twice)\n  {p.line()}")
    if args.json:
        print(json.dumps({k: p.to_json() for k, p in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
