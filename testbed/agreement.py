"""The agreement with the exact advantage A* that a critic needs for SWEET-RL's stage 2 to
reach trajectory DPO, computed with the exact solver (testbed/predict.py).

    python -m testbed.agreement --bed long           # the table
    python -m testbed.agreement --bed default --json # one JSON object

Stage 2 is driven by the oracle critic plus Gaussian noise σ on Q* (`noisy_critics`), on a
σ grid, in two families: the noise fixed per (history, c, action), or per (history, c,
value of Q*) so that actions the oracle ties stay tied. Each critic's agreement with A* is
measured as testbed/critic_check.py measures a learned critic's, in the population
(`population_agreement`: of candidate pairs whose A* differ, the share ordered as A*,
overall and per agent turn; and the share of equal-A* pairs it scores apart), and per KL
level `agreement_needed` reports the agreement at which stage 2 falls to MT-DPO's success,
beside the solver's own learned critics by the same measure.

Figures: on `default` no agreement suffices at KL 0.5 / 1 (the oracle is below mtdpo) and
KL 2 takes 1.00; on `long` a critic that keeps the oracle's ties needs 0.71 / 0.70 / 0.81 at
KL 0.5 / 1 / 2, and one whose noise splits them falls below mtdpo even at agreement 1.00.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from testbed.mdp import Bed, build
from testbed.predict import (
    KL_LEVELS,
    Point,
    Prediction,
    add_solver_arguments,
    check_solver_arguments,
    flow,
    oracle_scores,
    per_turn_grad,
    predict,
    stage2_measure,
    state_visits,
)
from testbed.bed import BedDesign

SIGMAS = (0.0, 0.05, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0)  # noise scales, on Q* in success probability
FAMILIES = ("ties_broken", "ties_kept")  # the noise per (history, c, action), or per (history, c, value of Q*)


def score_table(bed: Bed, score) -> np.ndarray:
    """A critic `score(node, c_index)` as a table [n_keys, A] over stage 2's states
    (`bed.keys`: the visited (history, c) pairs)."""
    table = np.zeros((len(bed.keys), bed.n_actions))
    for (h, ci), k in bed.keys.items():
        table[k] = score(h, ci)
    return table


def table_scores(bed: Bed, table: np.ndarray):
    """The critic `score(node, c_index)` of a table [n_keys, A] (`score_table`'s inverse)."""
    return lambda h, ci: table[bed.keys[(h, ci)]]


@dataclass
class Agreement:
    """A critic's agreement with A* in the population, as testbed/critic_check.py measures it
    on its candidates: of candidate pairs at one state whose A* differ, the share the critic
    orders the same way (a critic tie counts half), overall and per agent turn (0 = first).
    ties_split: of candidate pairs whose A* are equal, the share the critic scores apart;
    stage 2 drops pairs of equal scores, so each of these becomes a preference pair that
    the exact critic would not give."""

    overall: float
    per_turn: dict[int, float]
    ties_split: float

    def to_json(self) -> dict:
        return {"overall": round(self.overall, 4), "per_turn": {str(t): round(v, 4) for t, v in self.per_turn.items()},
                "ties_split": round(self.ties_split, 4)}


def population_agreement(bed: Bed, critic: np.ndarray, oracle: np.ndarray | None = None,
                         visits: dict[tuple[int, int], float] | None = None) -> Agreement:
    """`Agreement` of a critic table [n_keys, A] (`score_table`) with the oracle's Q*
    (A* = Q* − V* orders a state's actions as Q* does), each (history, c) weighted by its
    stage-2 visits d0(h, c) (`state_visits`) and each pair of actions (a, b) by the chance
    π0(a)·π0(b) that two of the state's candidates are a and b. `oracle` and `visits`:
    `score_table(bed, oracle_scores(bed))` and `state_visits(bed)`, if already at hand."""
    oracle = score_table(bed, oracle_scores(bed)) if oracle is None else oracle
    visits = state_visits(bed) if visits is None else visits
    keys = list(bed.keys.items())
    nodes = np.array([h for (h, _), _ in keys])
    rows = np.array([k for _, k in keys])
    d = np.array([visits[key] for key, _ in keys])
    p = np.where(bed.legal, np.exp(bed.logp0), 0.0)[nodes]  # [K, A]; 0 where illegal
    dq = oracle[rows][:, :, None] - oracle[rows][:, None, :]
    ds = critic[rows][:, :, None] - critic[rows][:, None, :]
    pair = d[:, None, None] * p[:, :, None] * p[:, None, :]
    w = pair * (dq > 1e-9)  # each unordered pair with differing A* once, the better action first
    hit = np.where(np.abs(ds) <= 1e-9, 0.5, (ds > 0).astype(float))
    turn = np.array([len(bed.nodes[h]) for h in nodes])
    num = np.bincount(turn, weights=(w * hit).sum(axis=(1, 2)))
    den = np.bincount(turn, weights=w.sum(axis=(1, 2)))
    same = pair * np.triu(np.abs(dq) <= 1e-9, 1)  # unordered pairs of two actions with equal A*
    split = float((same * (np.abs(ds) > 1e-9)).sum() / same.sum()) if same.sum() > 0 else 0.0
    return Agreement(float(num.sum() / den.sum()), {t: float(num[t] / den[t]) for t in range(len(den)) if den[t] > 0},
                     split)


@dataclass
class NoisyCritic:
    """Per-turn DPO driven by the oracle plus noise σ (`noisy_critics`), over the draws:
    mean agreement with A* and, per KL level, mean success and the share of draws whose
    flow reached the level (the others count where they stop)."""

    sigma: float
    agreement: Agreement
    success: dict[float, float]
    reached: dict[float, float]


def noisy_critics(bed: Bed, sigmas: Sequence[float] = SIGMAS, draws: int = 4, seed: int = 0,
                  levels: Sequence[float] = KL_LEVELS, candidates: int = 8, beta: float = 0.1,
                  keep_ties: bool = False) -> list[NoisyCritic]:
    """A family of critics from the oracle (σ 0) towards chance: Q*(h, a; c) + σ·ε, ε
    standard normal and fixed per (history, c, action) — or, `keep_ties`, per (history, c,
    value of Q*), so actions the oracle ties stay tied — each critic a deterministic
    function. `draws` draws of ε from `numpy.random.default_rng(seed)`, the same for every σ,
    so agreement falls with σ on each draw. Each critic drives stage 2 as `predict` does
    (stage2_measure, per_turn_grad, flow); σ 0 needs one draw and is `sweet_oracle`."""
    oracle = score_table(bed, oracle_scores(bed))
    noise = np.random.default_rng(seed).standard_normal((draws, *oracle.shape))
    if keep_ties:  # every action takes the noise of the first action with its value of Q*
        first = np.argmax(np.abs(oracle[:, None, :] - oracle[:, :, None]) <= 1e-9, axis=2)  # [K, A]
        noise = noise[:, np.arange(len(oracle))[:, None], first]
    visits = state_visits(bed)
    out = []
    for sigma in sigmas:
        tables = [oracle] if sigma == 0 else [oracle + sigma * eps for eps in noise]
        agreements = [population_agreement(bed, t, oracle, visits) for t in tables]
        points = [flow(bed, per_turn_grad(bed, stage2_measure(bed, table_scores(bed, t), candidates), beta), levels)
                  for t in tables]
        mean = lambda xs: float(np.mean(xs))  # noqa: E731
        agreement = Agreement(mean([a.overall for a in agreements]),
                              {t: mean([a.per_turn[t] for a in agreements]) for t in agreements[0].per_turn},
                              mean([a.ties_split for a in agreements]))
        out.append(NoisyCritic(float(sigma), agreement, {k: mean([p[k].success for p in points]) for k in levels},
                               {k: mean([p[k].reached for p in points]) for k in levels}))
    return out


@dataclass
class Needed:
    """The agreement at which the noisy critics' stage 2 reaches MT-DPO's success at one KL
    level. status: "interpolated" (between two σ of the grid), "grid_end" (every critic on
    the grid reaches it: the agreement is at most the noisiest one's) or "none" (not even
    the oracle reaches it: no agreement suffices; agreement, per_turn and sigma are None)."""

    status: str
    agreement: float | None = None
    per_turn: dict[int, float] | None = None
    sigma: float | None = None

    def to_json(self) -> dict:
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {"status": self.status, "agreement": r(self.agreement), "sigma": r(self.sigma),
                "per_turn": None if self.per_turn is None else {str(t): r(v) for t, v in self.per_turn.items()}}


def needed_agreement(curve: Sequence[NoisyCritic], level: float, target: float) -> Needed:
    """Walk from the oracle towards noisier critics while stage 2 still reaches `target`;
    the needed agreement is where it drops below, interpolated linearly in success between
    the last σ that reaches it and the first that does not."""
    curve = sorted(curve, key=lambda r: r.sigma)
    if curve[0].success[level] < target:
        return Needed("none")
    i = 0
    while i + 1 < len(curve) and curve[i + 1].success[level] >= target:
        i += 1
    if i + 1 == len(curve):
        last = curve[-1]
        return Needed("grid_end", last.agreement.overall, dict(last.agreement.per_turn), last.sigma)
    a, b = curve[i], curve[i + 1]
    f = (a.success[level] - target) / (a.success[level] - b.success[level])
    mix = lambda x, y: x + f * (y - x)  # noqa: E731
    return Needed("interpolated", mix(a.agreement.overall, b.agreement.overall),
                  {t: mix(v, b.agreement.per_turn[t]) for t, v in a.agreement.per_turn.items()}, mix(a.sigma, b.sigma))


@dataclass
class AgreementNeeded:
    """The agreement figure: per noise family (`FAMILIES`) and KL level, the agreement
    with A* a critic needs for per-turn DPO to reach trajectory DPO, the noisy-critic curve
    behind it, and where the learned critics (`sweet`, `sweet_no_info`, fitted as `predict`
    fits them) sit by the same measure."""

    bed: str
    draws: int
    curves: dict[str, list[NoisyCritic]]
    mtdpo: dict[float, Point]
    needed: dict[str, dict[float, Needed]]
    learned: dict[str, Agreement]

    def to_json(self) -> dict:
        def curve(rows: list[NoisyCritic]) -> list[dict]:
            return [{"sigma": r.sigma, "agreement": r.agreement.to_json(),
                     "success": {f"{k:.1f}": round(v, 4) for k, v in r.success.items()},
                     "reached": {f"{k:.1f}": round(v, 3) for k, v in r.reached.items()}} for r in rows]

        return {"bed": self.bed, "draws": self.draws,
                "families": {f: {"curve": curve(rows),
                                 "needed": {f"{k:.1f}": n.to_json() for k, n in self.needed[f].items()}}
                             for f, rows in self.curves.items()},
                "mtdpo": {f"{k:.1f}": round(p.success, 4) for k, p in self.mtdpo.items()},
                "learned": {name: a.to_json() for name, a in self.learned.items()}}


def agreement_needed(design: str | BedDesign, sigmas: Sequence[float] = SIGMAS, draws: int = 4, seed: int = 0,
                     levels: Sequence[float] = KL_LEVELS, episodes_per_task: int = 8, candidates: int = 8,
                     beta: float = 0.1, critic_steps: int = 400, families: Sequence[str] = FAMILIES,
                     base: Prediction | None = None) -> AgreementNeeded:
    """Per noise family and KL level, the smallest agreement with A* (overall, and per turn
    at that σ) at which per-turn DPO driven by a noisy exact critic (`noisy_critics`)
    reaches MT-DPO's success (`needed_agreement`), and the learned critics' agreement by
    the same measure. `base`: a `predict` of the same bed and settings, whose MT-DPO and
    critics are reused."""
    bed = build(design)
    if base is None or not base.critics:
        base = predict(design, levels, episodes_per_task, candidates, beta, critic_steps)
    curves = {f: noisy_critics(bed, sigmas, draws, seed, levels, candidates, beta, keep_ties=f == "ties_kept")
              for f in families}
    mtdpo = {k: base.methods["mtdpo"][k] for k in levels}
    oracle = score_table(bed, oracle_scores(bed))
    learned = {name: population_agreement(bed, score_table(bed, c.score), oracle) for name, c in base.critics.items()}
    needed = {f: {k: needed_agreement(rows, k, mtdpo[k].success) for k in levels} for f, rows in curves.items()}
    return AgreementNeeded(bed.design.name, draws, curves, mtdpo, needed, learned)


def format_agreement(a: AgreementNeeded) -> str:
    levels = list(a.mtdpo)
    turns = sorted({t for rows in a.curves.values() for r in rows for t in r.agreement.per_turn})
    per_turn = lambda ag: ", ".join(f"turn {t} {ag[t]:.2f}" for t in turns if t in ag)  # noqa: E731
    width = 23 + 8 * len(turns)
    lines = ["", "the agreement a critic needs: per-turn DPO driven by Q* + σ·noise against mtdpo, "
             f"{a.draws} draws; agreement = share of candidate pairs with differing A* ordered as A*, "
             "ties split = share of pairs with equal A* scored apart (* = some draws stop short of that KL)"]
    for family, rows in a.curves.items():
        per = "value of Q* (ties kept)" if family == "ties_kept" else "action"
        lines += ["", f"noise fixed per history, c and {per}:",
                  f"{'σ':>6}{'agreement':>11}" + "".join(f"{'turn ' + str(t):>8}" for t in turns)
                  + f"{'ties split':>12}"
                  + "".join(f"{'KL ' + format(k, 'g'):>10}" for k in levels)]
        for r in rows:
            lines.append(f"{r.sigma:>6.2f}{r.agreement.overall:>11.3f}"
                         + "".join(f"{r.agreement.per_turn.get(t, float('nan')):>8.3f}" for t in turns)
                         + f"{r.agreement.ties_split:>12.3f}"
                         + "".join(f"{r.success[k]:>9.3f}" + ("*" if r.reached[k] < 1 else " ") for k in levels))
        lines.append(f"{'mtdpo':<{width}}" + "".join(f"{p.success:>9.3f} " for p in a.mtdpo.values()))
        cells = []
        for k, n in a.needed[family].items():
            if n.status == "none":
                cells.append(f"KL {k:g} none suffices (the oracle {rows[0].success[k]:.3f} < {a.mtdpo[k].success:.3f})")
            else:
                cells.append(f"KL {k:g} {'<= ' if n.status == 'grid_end' else ''}{n.agreement:.3f} "
                             f"({per_turn(n.per_turn)}; σ {n.sigma:.2f})")
        lines.append("agreement needed to reach mtdpo: " + "; ".join(cells))
    lines += ["", "learned critics (as predict fits them), same measure: " + "; ".join(
        f"{name} {ag.overall:.3f} ({per_turn(ag.per_turn)}; ties split {ag.ties_split:.2f})"
        for name, ag in a.learned.items())]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.agreement",
                                     description=__doc__.split("\n\n")[0])
    add_solver_arguments(parser)
    parser.add_argument("--draws", type=int, default=4, help="noise draws per σ")
    args = parser.parse_args(argv)
    check_solver_arguments(parser, args, {"--draws": args.draws - 1})
    a = agreement_needed(args.bed, draws=args.draws, episodes_per_task=args.episodes_per_task,
                         candidates=args.candidates, beta=args.beta)
    print(json.dumps(a.to_json()) if args.json else format_agreement(a).lstrip("\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
