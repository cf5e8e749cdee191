"""What a policy does in its test-bed dialogues, read off its episodes as the solver's actions.

    python -m testbed.profile RUN/leaderboard/episodes/*.jsonl --bed default

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
from testbed import bed as tb
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


def episode_actions(s: tb.BedDesign, ep: Episode) -> list[int]:
    """The solver's action of each question the episode asked (its last agent turn, the answer, not included)."""
    messages = [t.content for t in ep.turns]
    return [a for a, _ in abstract_history(s, messages[:-1])] if messages else []


def _repeats(acts: Sequence[int]) -> bool | None:
    return acts[0] == acts[1] if len(acts) >= 2 else None


def asked_twice_repeat(s: tb.BedDesign, ep: Episode) -> bool | None:
    """Whether the episode's second question repeats its first (None: it asked fewer than two)."""
    return _repeats(episode_actions(s, ep))


def profile(bed: str | tb.BedDesign, episodes: Sequence[Episode]) -> DialogueProfile:
    """The profile of `episodes` on test-bed preset `bed` (their dialogues end with the
    agent's answer, as the runner writes them)."""
    s = tb.design(bed)
    values: dict[str, dict[str, list[float]]] = {k: {} for k in FIELDS}

    def add(field: str, task: str, v: float) -> None:
        values[field].setdefault(task, []).append(v)

    twice = 0
    # in the leaderboard's order (task, then seed: colbench.rollout), so that the bootstrap
    # draws the same tasks and the success interval is the leaderboard's to the digit
    for ep in sorted(episodes, key=lambda e: (e.task_id, e.seed)):
        acts = episode_actions(s, ep)
        texts = [t.content for t in ep.turns]
        told = tb.told_values(s, texts[1::2])
        add("success", ep.task_id, float(ep.success))
        add("early", ep.task_id, float(len(acts) < s.turns - 1))
        add("vague_first", ep.task_id, float(bool(acts) and acts[0] == s.facts))
        add("faithful", ep.task_id, float(bool(texts) and tb.answer_values(s, texts[-1]) == tb.guess_values(s, told)))
        if (repeated := _repeats(acts)) is not None:
            twice += 1
            add("repeat", ep.task_id, float(repeated))
    return DialogueProfile(len(episodes), twice, {k: bootstrap_ci(list(values[k].values())) for k in FIELDS})


# ---- does a policy read its dialogue? Its per-history profile beside its teacher's -------------

# the histories the default bed's policies choose at before the last turn, and each one's moves
MOVES = {"first": ("side", "vague", "answer"),
         "after a side": ("other side", "same side", "vague", "answer"),
         "after vague": ("side", "vague", "answer")}


def _move(s: tb.BedDesign, before: Sequence[int], a: int | None) -> tuple[str, str]:
    """(history, move) of an action `a` (None: the answer) after the questions `before`."""
    history = "first" if not before else "after vague" if before[-1] == s.facts else "after a side"
    if a is None:
        return history, "answer"
    if a == s.facts:
        return history, "vague"
    if history == "after a side":
        return history, "same side" if a == before[-1] else "other side"
    return history, "side"


def history_profile(bed: str | tb.BedDesign, episodes: Sequence[Episode]) -> dict[str, dict[str, Metric]]:
    """P(move | history) on the first two turns (`MOVES`), measured on `episodes`, each with
    a 95% bootstrap interval over tasks (a ratio: the episodes that reached the history)."""
    s = tb.design(bed)
    values: dict[tuple[str, str], dict[str, list[float]]] = {(h, m): {} for h, ms in MOVES.items() for m in ms}
    for ep in sorted(episodes, key=lambda e: (e.task_id, e.seed)):
        acts = episode_actions(s, ep)
        for turn in range(min(2, s.turns - 1)):
            if turn > len(acts):
                break
            history, move = _move(s, acts[:turn], acts[turn] if turn < len(acts) else None)
            for m in MOVES[history]:
                values[(history, m)].setdefault(ep.task_id, []).append(float(m == move))
    return {h: {m: bootstrap_ci(list(values[(h, m)].values())) for m in ms} for h, ms in MOVES.items()}


def teacher_history_profile(bed: str | tb.BedDesign) -> dict[str, dict[str, float]]:
    """The explorer's exact P(move | history) (`MOVES`) on `bed` (its p_ask and p_other:
    tb.teacher_design), read from the one explorer (testbed.mdp.explorer_action_probs)."""
    from testbed.mdp import explorer_action_probs

    s = tb.design(bed)
    out: dict[str, dict[str, float]] = {h: dict.fromkeys(ms, 0.0) for h, ms in MOVES.items()}
    for before, node in (((), ()), ((0,), ((0, True),)), ((s.facts,), ((s.facts, False),))):
        for a, p in explorer_action_probs(s, node).items():
            history, move = _move(s, before, None if a == s.facts + 1 else a)
            out[history][move] += p
    return out


@dataclass
class ReadsCheck:
    """A policy's measured repeat rate and per-history profile beside its teacher's exact
    ones (and the blind explorer's): it imitates the teacher where every teacher value lies
    in the measured 95% interval."""

    teacher: str
    repeat: Metric
    teacher_repeat: float
    blind_repeat: float
    measured: dict[str, dict[str, Metric]]
    expected: dict[str, dict[str, float]]
    blind: dict[str, dict[str, float]]

    def cells(self) -> list[tuple[str, Metric, float, float]]:
        """(name, measured, teacher's, blind's) for the repeat rate and every (history, move)."""
        return [("repeat", self.repeat, self.teacher_repeat, self.blind_repeat)] + [
            (f"{h}: {m}", self.measured[h][m], self.expected[h][m], self.blind[h][m])
            for h, ms in MOVES.items() for m in ms]

    @property
    def matched(self) -> int:
        return sum(m.low <= want <= m.high for _, m, want, _ in self.cells())

    def telling(self) -> tuple[int, int, int]:
        """Over the cells where the teacher's value and the blind explorer's differ (the ones
        that tell reading from not reading): (cells, how many intervals hold the teacher's
        value, how many hold the blind explorer's)."""
        cells = [(m, want, blind) for _, m, want, blind in self.cells() if abs(want - blind) > 1e-9]
        return (len(cells), sum(m.low <= want <= m.high for m, want, _ in cells),
                sum(m.low <= blind <= m.high for m, _, blind in cells))

    def reads(self) -> bool:
        """The warm start's reading gate (testbed.pipeline.reads_gate): no telling interval
        holds the blind explorer's value, and at most one misses the teacher's."""
        cells, teacher_in, blind_in = self.telling()
        return blind_in == 0 and teacher_in >= cells - 1

    def to_json(self) -> dict:
        telling, teacher_in, blind_in = self.telling()
        return {"teacher": self.teacher, "matched": self.matched, "cells": len(self.cells()),
                "telling": {"cells": telling, "teacher_within": teacher_in, "blind_within": blind_in},
                **{name: {**m.to_json(), "teacher": round(want, 4), "blind": round(blind, 4)}
                   for name, m, want, blind in self.cells()}}

    def line(self) -> str:
        shown = [c for c in self.cells() if c[0] in ("repeat", "after a side: other side", "after a side: same side")]
        parts = [f"{name} {m.value:.3f} [{m.low:.3f}, {m.high:.3f}] (teacher {want:.3f}, blind {blind:.3f})"
                 for name, m, want, blind in shown]
        telling, teacher_in, blind_in = self.telling()
        return (f"{'; '.join(parts)}; {self.matched} of {len(self.cells())} (repeat rate and every P(move | history)) "
                f"within the 95% intervals; where the teacher and the blind explorer differ, {teacher_in} of {telling} "
                f"intervals hold the teacher's value and {blind_in} the blind one's")


def reads_check(bed: str | tb.BedDesign, teacher: str | None, episodes: Sequence[Episode]) -> ReadsCheck:
    """`episodes` (a policy's, held-out) beside the exact profile of the warm-start `teacher`
    (tb.teacher_design) and of the blind explorer."""
    from testbed.mdp import build
    from testbed.policy_class import repeat_rate

    taught, blind = tb.teacher_design(bed, teacher), tb.teacher_design(bed, "blind")
    prof = profile(taught, episodes)
    rates = [repeat_rate(bed, bed.logp0) for bed in (build(taught), build(blind))]
    return ReadsCheck(teacher or tb.default_teacher(bed), prof.metrics["repeat"], rates[0], rates[1],
                      history_profile(taught, episodes), teacher_history_profile(taught), teacher_history_profile(blind))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("episodes", nargs="+", help="episodes JSONL files (e.g. RUN/leaderboard/episodes/*.jsonl)")
    parser.add_argument("--bed", "--spec", default=tb.DEFAULT_BED,
                        help=f"the test-bed preset the episodes ran on: {', '.join(tb.PRESETS)}")
    parser.add_argument("--json", action="store_true", help="one JSON object, keyed by file")
    args = parser.parse_args(argv)
    try:
        s = tb.design(args.bed)
    except ValueError as e:
        parser.error(str(e))
    if s.legacy:
        parser.error("--bed legacy: the profile reads a bed's facts; the legacy bed has its own readers")
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
