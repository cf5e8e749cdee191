"""What each method reaches when the policy cannot tell some dialogue histories apart.

    python -m testbed.policy_class --bed default          # the table
    python -m testbed.policy_class --bed default --json   # one JSON object

The exact solver (testbed/predict.py) gives every history its own logits: a
tabular policy, which can learn "after asking about positive numbers, ask about negative
ones" as freely as "do not answer at once". A language model's question choice is a
function of features of the dialogue, and the warm start imitates an explorer whose
question choice ignores the dialogue, so nothing in its training asked it to read which
question it already asked. This module ties the tabular logits over classes of histories
(θ_h = φ_class(h); a method's gradient on φ is the sum of its gradient over the class's
histories) and follows the same flows (`testbed.predict.flow`) at the same KL levels:

    history  every history its own logits (the solver's predictions)
    asked    the turn and which questions were asked, not what the replies told
    told     the turn and whether each reply told anything, not which question it was
    turn     the turn alone: whether to answer and what to ask, blind to the dialogue

Also each class's optimum (gradient ascent on the exact success within the class, with
restarts: a class blind to the dialogue reaches its optimum only by a convention, always the
same side first) and, along each method's path, its repeat rate (`repeat_rate`: the chance
that the second question repeats the first), which testbed.profile measures on
real episodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from testbed import mdp, predict
from testbed.bed import BedDesign

CLASSES: dict[str, Callable[[tuple], object]] = {
    "history": lambda h: h,
    "asked": lambda h: (len(h), tuple(sorted(a for a, _ in h))),
    "told": lambda h: (len(h), tuple(told for _, told in h)),
    "turn": lambda h: len(h),
}


def tie_classes(bed: mdp.Bed, name: str) -> np.ndarray:
    """[N] class id of each node of `bed` under policy class `name` (CLASSES). Raises if the
    warm start itself differs inside a class (then the class could not start from it)."""
    if name not in CLASSES:
        raise ValueError(f"unknown policy class {name!r}; one of {', '.join(CLASSES)}")
    ids: dict[object, int] = {}
    tie = np.array([ids.setdefault(CLASSES[name](h), len(ids)) for h in bed.nodes], dtype=np.int64)
    pi0 = np.exp(bed.logp0)  # 0 where illegal, so legality is compared too
    for k in range(len(ids)):
        if not np.allclose(pi0[tie == k], pi0[tie == k][0]):
            raise ValueError(f"policy class {name!r}: the warm start differs between histories of one class")
    return tie


def holds_warm_start(bed: mdp.Bed, name: str) -> bool:
    """Whether policy class `name` holds the bed's warm start (π0 is equal inside each of
    its classes): the blind classes hold the blind explorer, not one that reads its dialogue."""
    try:
        tie_classes(bed, name)
    except ValueError as e:
        if "the warm start differs" in str(e):
            return False
        raise
    return True


def tied(grad, tie: np.ndarray):
    """A flow's gradient on the tied logits, broadcast back to the nodes: dL/dφ_k = Σ_{h in k} dL/dθ_h."""
    def g(logpi: np.ndarray) -> np.ndarray:
        per_node = grad(logpi)
        per_class = np.zeros((int(tie.max()) + 1, per_node.shape[1]))
        np.add.at(per_class, tie, per_node)
        return per_class[tie]

    return g


def success_grad(bed: mdp.Bed):
    """−dS/dθ for S = E_c E_{τ~π}[success]: the exact policy gradient (ascent on success)."""
    def g(logpi: np.ndarray) -> np.ndarray:
        ev = mdp.evaluate(bed, logpi)
        return mdp._scatter(bed, -(bed.pc[bed.c] * ev.prob * bed.success), logpi)

    return g


def class_optimum(bed: mdp.Bed, tie: np.ndarray, restarts: int = 8, steps: int = 2000, lr: float = 2.0,
                  seed: int = 0) -> tuple[float, np.ndarray]:
    """The best success a policy of the class reaches: gradient ascent on the exact success,
    from the warm start and from `restarts` random perturbations of it (the bed is symmetric
    in its sides, and a class blind to the dialogue reaches its optimum only by a convention,
    e.g. always positive first, then negative, which ascent from the symmetric warm start
    never picks). Returns the best success and its log-policy."""
    rng = np.random.default_rng(seed)
    grad = tied(success_grad(bed), tie)
    best: tuple[float, np.ndarray] | None = None
    for r in range(restarts + 1):
        theta = np.where(bed.legal, bed.logp0, 0.0)
        if r:
            theta = theta + rng.normal(0.0, 1.0, (int(tie.max()) + 1, theta.shape[1]))[tie]
        for _ in range(steps):
            theta = theta - lr * grad(mdp.log_policy(bed, theta))
        logpi = mdp.log_policy(bed, theta)
        success = mdp.evaluate(bed, logpi).success
        if best is None or success > best[0] + 1e-9:
            best = (success, logpi)
    return best


def repeat_rate(bed: mdp.Bed, logpi: np.ndarray) -> float:
    """P(the second question repeats the first | the dialogue asks twice before answering):
    1/3 for the default bed's warm start (uniform over three questions), and for any policy
    whose two questions ignore each other and are symmetric between the sides; 0 for one
    that reads which question it asked (or follows a convention). NaN where no dialogue
    asks twice."""
    ev = mdp.evaluate(bed, logpi)
    A, n = bed.n_actions, bed.design.facts
    if bed.fi.shape[1] < 3:
        return float("nan")
    w = bed.pc[bed.c] * ev.prob
    acts = np.where(bed.fi < bed.sentinel, bed.fi % A, n + 1)
    twice = (acts[:, 0] <= n) & (acts[:, 1] <= n)
    total = w[twice].sum()
    return float(w[twice & (acts[:, 0] == acts[:, 1])].sum() / total) if total > 0 else float("nan")


@dataclass
class ClassPrediction:
    """One policy class: its size, optimum, and each method's success at each KL level."""

    name: str
    n_classes: int
    optimum: float
    methods: dict[str, dict[float, predict.Point]]
    repeat_rate: dict[str, dict[float, float]]  # each method's policy where its path crosses each level

    def to_json(self) -> dict:
        return {"classes": self.n_classes, "optimum": round(self.optimum, 4),
                **{m: {f"{k:.1f}": round(p.success, 4) for k, p in pts.items()} for m, pts in self.methods.items()},
                "reached": {m: {f"{k:.1f}": p.reached for k, p in pts.items()} for m, pts in self.methods.items()},
                "repeat_rate": {m: {f"{k:.1f}": _r(v) for k, v in by.items()} for m, by in self.repeat_rate.items()}}


def _r(x: float) -> float | None:
    return None if x != x else round(x, 4)


TIED_METHODS = ("mtdpo", "sweet", "sweet_no_info", "sweet_oracle")  # RFT's one-round limit is no flow to tie


def predict_classes(design: str | BedDesign, classes: Sequence[str] = tuple(CLASSES),
                    levels: Sequence[float] = predict.KL_LEVELS, episodes_per_task: int = 8, candidates: int = 8,
                    beta: float = 0.1, critic_steps: int = 400,
                    methods: Sequence[str] = TIED_METHODS) -> tuple[float, list[ClassPrediction]]:
    """The warm start's success and, per policy class, what mtdpo, sweet (the LM-head critic
    with c, fitted on the trajectory pairs as in `testbed.predict.predict`), sweet_no_info and
    sweet_oracle (or those of them in `methods`) reach at each KL level when the policy's
    logits are tied within the class."""
    bad = [m for m in methods if m not in TIED_METHODS]
    if bad or not methods:
        raise ValueError(f"methods: {', '.join(bad) or '(none)'}; one or more of {', '.join(TIED_METHODS)}")
    bed = mdp.build(design)
    pairs = predict.trajectory_pairs(bed, episodes_per_task)
    fits = {"sweet": True, "sweet_no_info": False}
    critics = {m: (predict.oracle_scores(bed) if m == "sweet_oracle" else predict.fit_critic(bed, pairs, fits[m], critic_steps).score)
               for m in methods if m != "mtdpo"}
    grads = {**({"mtdpo": predict.mtdpo_grad(bed, pairs, beta)} if "mtdpo" in methods else {}),
             **{m: predict.per_turn_grad(bed, predict.stage2_measure(bed, score, candidates), beta)
                for m, score in critics.items()}}
    out = []
    for name in classes:
        tie = tie_classes(bed, name)
        best, _ = class_optimum(bed, tie)
        methods, repeats = {}, {}
        for m, grad in grads.items():
            methods[m], at_level = _flow_with_policies(bed, tied(grad, tie), levels)
            repeats[m] = {k: repeat_rate(bed, logpi) for k, logpi in at_level.items()}
        out.append(ClassPrediction(name, int(tie.max()) + 1, best, methods, repeats))
    return mdp.evaluate(bed, bed.logp0).success, out


def _flow_with_policies(bed: mdp.Bed, grad, levels: Sequence[float]) -> tuple[dict[float, predict.Point], dict[float, np.ndarray]]:
    """`testbed.predict.flow`, and per level the first policy of the path at or past it (the
    path's last where it stops short), for the repeat rate."""
    seen: list[tuple[float, np.ndarray]] = [(0.0, bed.logp0)]
    points = predict.flow(bed, grad, levels, on_step=lambda kl, logpi: seen.append((kl, logpi)))
    return points, {k: next((lp for kl, lp in seen if kl >= k), seen[-1][1]) for k in levels}


def format_table(bed: str, warm: float, preds: list[ClassPrediction], warm_repeat: float) -> str:
    levels = list(next(iter(preds[0].methods.values())))
    methods = list(preds[0].methods)
    head = "KL " + " / ".join(format(k, "g") for k in levels)
    lines = [f"test bed {bed!r}: the solver's flows with the tabular logits tied within a policy class",
             f"(population limit; warm start {warm:.3f}, its repeat rate {warm_repeat:.2f}; * = the path stops short of that KL,",
             "shown where it stops; r = the repeat rate there: P(second question = first | two asked))",
             f"{'class':<8}{'classes':>8}{'optimum':>9}  " + "".join(f"{m + ' ' + head:>31}" for m in methods)]
    for p in preds:
        cells = [" / ".join(f"{pt.success:.3f}{'*' if not pt.reached else ''}" for pt in p.methods[m].values())
                 for m in methods]
        rates = [" / ".join(f"r {v:.2f}" for v in p.repeat_rate[m].values()) for m in methods]
        lines.append(f"{p.name:<8}{p.n_classes:>8}{p.optimum:>9.3f}  " + "".join(f"{c:>31}" for c in cells))
        lines.append(f"{'':<25}  " + "".join(f"{c:>31}" for c in rates))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.policy_class",
                                     description=__doc__.split("\n\n")[0])
    predict.add_solver_arguments(parser)
    parser.add_argument("--classes", default=",".join(CLASSES), help=f"comma-separated, of {', '.join(CLASSES)}")
    args = parser.parse_args(argv)
    predict.check_solver_arguments(parser, args, {})
    classes = [c for c in args.classes.split(",") if c]
    bad = [c for c in classes if c not in CLASSES]
    if bad or not classes:
        parser.error(f"--classes: unknown {', '.join(bad) or '(none given)'}; one of {', '.join(CLASSES)}")
    warm, preds = predict_classes(args.bed, classes, episodes_per_task=args.episodes_per_task,
                                  candidates=args.candidates, beta=args.beta)
    if args.json:
        print(json.dumps({"bed": args.bed, "warm_start": round(warm, 4), **{p.name: p.to_json() for p in preds}}))
    else:
        bed = mdp.build(args.bed)
        print(format_table(args.bed, warm, preds, repeat_rate(bed, bed.logp0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
