"""The learning benchmark's protocol (testbed/learning.py): success at matched KL along
training paths, paired bootstrap intervals over (seed, test task) clusters, the solver's
predictions beside them, and their tables and plot. The maths is numpy only; reading
evaluation episodes and measuring their KL (sweet.core.kl) import the project lazily.

A policy's *path* (`TrainingPath`) in one seed is its snapshots in training order, the warm start first
(KL 0 by definition), each evaluated on the same test tasks. A point holds, per test task,
the sum of its episodes' successes, the sum of their log-ratios log π(τ) − log π0(τ)
(sweet.core.kl) and their count, so that any resample of tasks can recompute each point's
success and KL as pooled means.

- `interpolate`: success at a KL level, linearly in KL between the two consecutive points
  of the path that first bracket the level (kl_{i-1} < level <= kl_i). A path that never
  reaches the level is reported at its largest-KL point, `reached` False.
- A policy's value at a level is the mean of its seeds' interpolated values (each seed
  weighted by its clusters in the resample: equal weights on the data itself).
- `Bootstrap`: B resamples of the (seed, task) clusters, drawn ONCE and shared by every
  policy, so a difference of two policies is recomputed on the same resample (paired):
  percentile 95% intervals, 2,000 resamples, a fixed seed (as colbench.stats).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from colbench.io import atomic_write

LEVELS = (0.5, 1.0, 2.0)
N_BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class TrainingPath:
    """One seed's training path of one policy, on that seed's test tasks (in `tasks` order).

    steps:    [P]     the points' optimiser steps (0: the warm start)
    success:  [P, T]  per point and task, the sum of the episodes' successes
    log_ratio:[P, T]  the same episodes' summed log π(τ) − log π0(τ)
    count:    [P, T]  their number
    repeat:   [P, T]  of those that asked twice, how many repeated the first question in the
                      second (testbed.profile; None on the legacy bed)
    twice:    [P, T]  how many asked twice
    reward:   [P, T]  the sum of the episodes' rewards (the share of tests passed)
    """

    tasks: tuple[str, ...]
    steps: tuple[int, ...]
    success: np.ndarray
    log_ratio: np.ndarray
    count: np.ndarray
    repeat: np.ndarray | None = None
    twice: np.ndarray | None = None
    reward: np.ndarray | None = None

    ARRAYS = ("success", "log_ratio", "count", "repeat", "twice", "reward")

    def to_json(self) -> dict:
        """Plain data (a benchmark's seed record, testbed/learning.py): exact for the counts,
        log-ratios and rewards to 1e-9."""
        def plain(a: np.ndarray | None):
            return None if a is None else [[round(float(x), 9) for x in row] for row in a]

        return {"tasks": list(self.tasks), "steps": list(self.steps), **{k: plain(getattr(self, k)) for k in self.ARRAYS}}

    @classmethod
    def from_json(cls, d: dict) -> "TrainingPath":
        shape = (len(d["steps"]), len(d["tasks"]))
        arrays = {k: None if d.get(k) is None else np.asarray(d[k], dtype=float).reshape(shape) for k in cls.ARRAYS}
        return cls(tuple(d["tasks"]), tuple(int(s) for s in d["steps"]), **arrays)

    def points(self, weights: np.ndarray, quantity: str = "success") -> tuple[np.ndarray, np.ndarray]:
        """(KL [..., P], the quantity [..., P]) of every point with task `weights` [..., T]
        (how often each task was drawn; all ones = the data itself). quantity: "success",
        or "repeat" (the repeat rate among the episodes that asked twice)."""
        n = weights @ self.count.T
        kl = (weights @ self.log_ratio.T) / np.maximum(n, 1e-12)
        if quantity == "repeat":
            return kl, (weights @ self.repeat.T) / np.maximum(weights @ self.twice.T, 1e-12)
        return kl, (weights @ self.success.T) / np.maximum(n, 1e-12)


def interpolate(kl: np.ndarray, success: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Success at KL `level` along paths: kl, success [..., P] in path order (point 0 at KL 0)
    -> (success [...], reached [...] bool, the KL reported at [...]: `level`, or the path's
    largest KL where it never gets there)."""
    kl, success = np.asarray(kl, float), np.asarray(success, float)
    above = kl >= level
    reached = above.any(-1)
    i = np.where(reached, above.argmax(-1), kl.argmax(-1))
    j = np.maximum(i - 1, 0)
    def take(x: np.ndarray, k: np.ndarray) -> np.ndarray:
        return np.take_along_axis(x, k[..., None], -1)[..., 0]

    k0, k1, s0, s1 = take(kl, j), take(kl, i), take(success, j), take(success, i)
    span = k1 - k0
    frac = np.where((i > 0) & (span > 0), (level - k0) / np.where(span > 0, span, 1.0), 1.0)
    value = np.where(reached, s0 + frac * (s1 - s0), s1)
    return value, reached, np.where(reached, level, k1)


class Bootstrap:
    """Resamples of the (seed, task) clusters, shared by every policy (the pairing)."""

    def __init__(self, clusters: dict[int, Sequence[str]], n_boot: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED):
        self.seeds = sorted(clusters)
        self.tasks = {s: tuple(clusters[s]) for s in self.seeds}
        flat = [(s, t) for s in self.seeds for t in range(len(self.tasks[s]))]
        draws = np.random.default_rng(seed).integers(0, len(flat), size=(n_boot, len(flat)))
        counts = np.stack([np.bincount(row, minlength=len(flat)) for row in draws]).astype(float)  # [B, C]
        self.weights: dict[int, np.ndarray] = {}
        start = 0
        for s in self.seeds:
            n = len(self.tasks[s])
            self.weights[s] = counts[:, start:start + n]  # [B, T_s]
            start += n

    def value(self, paths: dict[int, TrainingPath], level: float, weights: dict[int, np.ndarray] | None = None,
              quantity: str = "success") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(success, reached, KL) of a policy at `level`: each seed's interpolated value, then
        the seeds' mean weighted by their drawn clusters; reached only where every seed reached.
        `weights` None: the resamples ([B]); else those task weights (e.g. all ones: the data).
        quantity "repeat": the repeat rate instead of success (TrainingPath.points)."""
        weights = self.weights if weights is None else weights
        values, reached, kls, masses = [], [], [], []
        for s in self.seeds:
            path = paths[s]
            if path.tasks != self.tasks[s]:
                raise ValueError(f"seed {s}: a path's test tasks differ from the others' (pairing needs the same)")
            v, r, k = interpolate(*path.points(weights[s], quantity), level)
            values.append(v)
            reached.append(r)
            kls.append(k)
            masses.append(weights[s].sum(-1))
        m = np.stack(masses)
        mass = np.maximum(m.sum(0), 1e-12)
        return (m * np.stack(values)).sum(0) / mass, np.stack(reached).all(0), (m * np.stack(kls)).sum(0) / mass

    def ones(self) -> dict[int, np.ndarray]:
        return {s: np.ones(len(self.tasks[s])) for s in self.seeds}

    def at_kl(self, paths: dict[int, TrainingPath], levels: Sequence[float] = LEVELS) -> dict[str, dict]:
        """{"0.5": {"success_rate": {"value", "ci95"}, "reached": bool, "kl": k}, ...}, and
        "repeat_rate" {"value", "ci95"} beside success where the paths count repeats."""
        out = {}
        repeats = all(p.repeat is not None for p in paths.values())
        for level in levels:
            value, reached, kl = self.value(paths, level, self.ones())
            boots, _, _ = self.value(paths, level)
            out[f"{level:.1f}"] = {"success_rate": _metric(float(value), boots), "reached": bool(reached),
                                   "kl": float(kl)}
            if repeats:
                value = self.value(paths, level, self.ones(), "repeat")[0]
                out[f"{level:.1f}"]["repeat_rate"] = _metric(float(value), self.value(paths, level, None, "repeat")[0])
        return out

    def gap(self, a: dict[int, TrainingPath], b: dict[int, TrainingPath], level: float) -> dict:
        """a − b at `level` and its paired 95% interval (the same resamples for both)."""
        va, _, _ = self.value(a, level, self.ones())
        vb, _, _ = self.value(b, level, self.ones())
        boots = self.value(a, level)[0] - self.value(b, level)[0]
        m = _metric(float(va - vb), boots)
        return {"measured_gap": m["value"], "ci95": m["ci95"]}

    def frontier(self, paths: dict[int, TrainingPath], grid: Sequence[float]) -> list[dict]:
        """The success-vs-KL curve on `grid` (levels every seed reaches), with 95% bands."""
        rows = []
        for level in grid:
            value, reached, _ = self.value(paths, level, self.ones())
            if level > 0 and not bool(reached):
                break
            rows.append({"kl": float(level), **_metric(float(value), self.value(paths, level)[0])})
        return rows


def _metric(value: float, boots: np.ndarray) -> dict:
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"value": value, "ci95": [float(min(lo, value)), float(max(hi, value))]}


def pairs(boot: Bootstrap, paths: dict[str, dict[int, TrainingPath]], predicted: dict[str, dict[str, float] | float | None],
          levels: Sequence[float] = LEVELS) -> list[dict]:
    """Every pair of policies (in the given order, a before b) at every level: the solver's
    predicted gap a − b (None where either has no prediction; a single number, the warm
    start's, holds at every level) and the measured one with its paired interval."""
    def pred(name: str, key: str) -> float | None:
        return _at_level(predicted.get(name), key)

    out = []
    for a, b in itertools.combinations(paths, 2):
        for level in levels:
            key = f"{level:.1f}"
            pa, pb = pred(a, key), pred(b, key)
            out.append({"a": a, "b": b, "kl": key,
                        "predicted_gap": None if pa is None or pb is None else round(pa - pb, 4),
                        **boot.gap(paths[a], paths[b], level)})
    return out


# ---- paths from evaluation episodes, predictions, tables, the plot ---------------------------


def tasks_of(path: str | Path) -> tuple[str, ...]:
    """The sorted task ids of an evaluation episodes file (a seed's clusters)."""
    from sweet.core.records import load_episodes

    return tuple(sorted({ep.task_id for ep in load_episodes(path, env="testbed")}))


def log_ratios(model: str, warm: str, episodes, file: Path) -> list[float]:
    """Each episode's log π(τ) − log π0(τ) (sweet.core.kl), cached beside the evaluation in
    <eval>/kl/<agent>.json (keyed by both models and the episode ids)."""
    from sweet.core.kl import kl_from_models

    cache = file.parent.parent / "kl" / f"{file.stem}.json"
    ids = [ep.episode_id for ep in episodes]
    if cache.exists():
        d = json.loads(cache.read_text())
        if d["model"] == model and d["reference"] == warm and set(ids) <= set(d["ratios"]):
            return [d["ratios"][i] for i in ids]
    ratios = kl_from_models(model, warm, episodes)
    atomic_write(cache, json.dumps({"model": model, "reference": warm, "ratios": dict(zip(ids, ratios))}))
    return ratios


def training_path(points: list[tuple[int, str]], files: list[str], warm: Path, tasks: tuple[str, ...],
                  bed: str | None = None):
    """A seed's path (testbed/frontier.py TrainingPath) from its points' evaluation episodes:
    per point and test task, the successes, the log-ratios against the warm start (the warm
    start itself: 0) and the episode count; with a (non-legacy) test bed `bed`, also how
    many asked twice and repeated their first question (testbed.profile)."""
    from sweet.core.records import load_episodes
    from testbed import profile as testbed_profile
    from testbed import bed as testbed_bed

    index = {t: i for i, t in enumerate(tasks)}
    shape = (len(points), len(tasks))
    success, ratio, count, reward = np.zeros(shape), np.zeros(shape), np.zeros(shape), np.zeros(shape)
    s = testbed_bed.design(bed) if bed is not None and not testbed_bed.design(bed).legacy else None
    repeat, twice = (np.zeros(shape), np.zeros(shape)) if s is not None else (None, None)
    for k, ((step, model), file) in enumerate(zip(points, files)):
        eps = load_episodes(file, env="testbed")
        ratios = [0.0] * len(eps) if step == 0 else log_ratios(model, str(warm), eps, Path(file))
        for ep, r in zip(eps, ratios):
            if ep.task_id not in index:
                raise ValueError(f"{file}: task {ep.task_id!r} is not one of the warm start's evaluation tasks")
            j = index[ep.task_id]
            success[k, j] += float(ep.success)
            reward[k, j] += float(ep.reward)
            ratio[k, j] += r
            count[k, j] += 1
            if s is not None and (rep := testbed_profile.asked_twice_repeat(s, ep)) is not None:
                repeat[k, j] += float(rep)
                twice[k, j] += 1
    return TrainingPath(tasks, tuple(step for step, _ in points), success, ratio, count, repeat, twice, reward)


def paths_of(results: dict[int, dict[str, dict]], names: list[str], warm: Path, bed: str | None = None):
    """(the paired bootstrap over every seed's test tasks, {policy: {seed: TrainingPath}});
    `bed`: count repeats too (training_path)."""
    clusters = {s: tasks_of(r["warm_start"]["eval_episodes"]) for s, r in results.items()}
    paths = {n: {s: training_path(r[n]["points"], r[n]["point_episodes"], warm, clusters[s], bed)
                 for s, r in results.items()} for n in names}
    return Bootstrap(clusters), paths


PREDICTED = ("rft", "mtdpo", "sweet", "sweet_no_info", "sweet_oracle")  # the policies the solver models
# The solver's `sweet` critic is tabular over (history, c) with the answer's content no
# choice of the policy: a forced action, whose log-ratio is 0. The paper's LM-head critic
# has no such constraint; the centred critic (sweet/critic/baseline.py) enforces it, so
# `sweet` is also the solver's prediction for `sweet_centred`.
PREDICTED_AS = {"sweet_centred": "sweet"}


def solver_name(policy: str) -> str:
    """The solver's method that predicts `policy` (itself, or PREDICTED_AS)."""
    return PREDICTED_AS.get(policy, policy)


def prediction(bed: str, setup, finite_reps: int, out: Path, teacher: str | None = None) -> dict:
    """The exact solver's success per policy and KL level (testbed.predict:
    `predict`, the population limit, or `predict_finite` at the benchmark's budget with
    --predict-finite REPS), with the warm start's and the optimum, all from the warm
    start's teacher (testbed_bed.teacher_design: its exact tabular policy is π0); cached in
    OUT/prediction.json under its settings."""
    from testbed import mdp, predict
    from testbed import bed as testbed_bed

    design = testbed_bed.teacher_design(bed, teacher)
    key = {"bed": bed, "episodes_per_task": setup.episodes_per_task, "candidates": setup.candidates,
           "finite_reps": finite_reps, "n_tasks": setup.n_train,
           "teacher": teacher or testbed_bed.default_teacher(bed), "p_other": design.p_other}
    cache = out / "prediction.json"
    if cache.exists() and testbed_bed.bed_record((d := json.loads(cache.read_text())).get("key", {})) == key \
            and "policy_class" in d:
        return d
    p = predict.predict(design, episodes_per_task=setup.episodes_per_task, candidates=setup.candidates).to_json()
    methods = {m: p[m] for m in PREDICTED}
    if finite_reps:
        finite = predict.predict_finite(design, finite_reps, setup.n_train, setup.episodes_per_task,
                                              candidates=setup.candidates)
        methods = {m: {f"{k:.1f}": round(v[0], 4) for k, v in by.items()} for m, by in finite.items()}
    d = {"key": key, "source": "predict_finite" if finite_reps else "predict",
         "warm_start": p["warm_start"], "optimum": p["optimum"], "methods": methods, "solver": p,
         "policy_class": policy_classes(design, setup)}
    out.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(d, indent=2))
    return d


def policy_classes(design, setup) -> dict:
    """The solver's flows with the logits tied over the turn alone (a policy blind to the
    dialogue, testbed.policy_class; only where that class holds the warm start, i.e. a
    blind teacher's) beside the tabular ones: per class and method, success and the repeat
    rate at each KL level (population limit)."""
    from testbed import mdp, predict
    from testbed import policy_class as testbed_policy_class

    bed = mdp.build(design)
    # the turn class (blind to the dialogue) holds a blind warm start only, not the reading teacher's
    names = tuple(c for c in ("history", "turn") if testbed_policy_class.holds_warm_start(bed, c))
    _, preds = testbed_policy_class.predict_classes(design, names, episodes_per_task=setup.episodes_per_task,
                                                    candidates=setup.candidates)
    return {"warm_start_repeat_rate": round(testbed_policy_class.repeat_rate(bed, bed.logp0), 4),
            **{p.name: {"optimum": round(p.optimum, 4), "methods": {m: p.to_json()[m] for m in p.methods},
                        "repeat_rate": p.to_json()["repeat_rate"]} for p in preds}}


def _ci(m: dict) -> str:
    return f"{m['value']:.3f} [{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}]"


def _at_level(p: dict[str, float] | float | None, key: str) -> float | None:
    """A prediction at KL level `key`: per level, or one number for every level (the warm start's)."""
    return p.get(key) if isinstance(p, dict) else p


def _num(x) -> str:
    return "n/a" if x is None else format(x, ".3f")


def kl_table(summary: dict) -> str:
    """Success at KL 0.5 / 1 / 2 with 95% intervals, the solver's prediction beside it (and,
    where computed, its prediction for a policy blind to the dialogue: `blind`);
    `*KL k`: the path never got there, shown at its largest KL k."""
    levels = ["0.5", "1.0", "2.0"]
    blind = any("predicted_blind" in m for m in summary["policies"].values())
    head = " | predicted | blind" if blind else " | predicted"
    lines = ["| policy | final KL | " + " | ".join(f"KL {k}: measured [95% CI]{head}" for k in levels) + " |",
             "|---|---|" + ("---|---|---|" if blind else "---|---|") * len(levels)]
    for name, m in summary["policies"].items():
        cells = []
        for k in levels:
            at = m["at_kl"][k]
            flag = "" if at["reached"] else f" *KL {at['kl']:.2f}"
            cell = f"{_ci(at['success_rate'])}{flag} | {_num(_at_level(m['predicted'], k))}"
            if blind:
                cell += f" | {_num(_at_level(m.get('predicted_blind'), k))}"
            cells.append(cell)
        lines.append(f"| {name} | {m['kl']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def repeat_table(summary: dict) -> str:
    """The repeat rate (P(second question = first | two asked)) at matched KL, measured with
    95% intervals, beside the solver's for a tabular policy and for one blind to the dialogue."""
    levels = ["0.5", "1.0", "2.0"]
    lines = ["| policy | " + " | ".join(f"KL {k}: measured [95% CI] | tabular | blind" for k in levels) + " |",
             "|---|" + "---|---|---|" * len(levels)]
    for name, m in summary["policies"].items():
        if "repeat_rate" not in m["at_kl"]["0.5"]:
            continue
        pr = m.get("predicted_repeat") or {}
        cells = []
        for k in levels:
            at = m["at_kl"][k]
            flag = "" if at["reached"] else f" *KL {at['kl']:.2f}"
            cells.append(f"{_ci(at['repeat_rate'])}{flag} | {_num(_at_level(pr.get('history'), k))} | "
                         f"{_num(_at_level(pr.get('turn'), k))}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PREDICTED_APART = 0.05  # a predicted gap this large is one the benchmark must reproduce


def verdict(row: dict) -> str | None:
    """A pair row's verdict against its prediction: None where the solver predicts no gap of
    at least PREDICTED_APART; "reproduced" where the paired interval excludes zero on the
    predicted side, "reversed" where it excludes zero on the other, else "undecided"."""
    g = row["predicted_gap"]
    if g is None or abs(g) < PREDICTED_APART:
        return None
    lo, hi = row["ci95"]
    if (lo > 0) if g > 0 else (hi < 0):
        return "reproduced"
    return "reversed" if ((hi < 0) if g > 0 else (lo > 0)) else "undecided"


def replication(rows: list[dict]) -> dict[str, int]:
    """How many (pair, KL level) rows the solver predicts at least PREDICTED_APART apart, and
    how many of them are reproduced, reversed or undecided (`verdict`)."""
    verdicts = [v for v in map(verdict, rows) if v is not None]
    return {"predicted_apart": len(verdicts),
            **{k: verdicts.count(k) for k in ("reproduced", "undecided", "reversed")}}


def pairs_table(summary: dict) -> str:
    """Every pair's gap a − b, predicted and measured (paired 95% interval), `!` marking a
    predicted gap of at least PREDICTED_APART that is not reproduced (`!!` reversed), and a
    last line with the counts (`replication`)."""
    lines = ["| a − b | KL | predicted | measured [paired 95% CI] |", "|---|---|---|---|"]
    marks = {"undecided": " !", "reversed": " !!"}
    for r in summary["pairs"]:
        g = r["predicted_gap"]
        lo, hi = r["ci95"]
        lines.append(f"| {r['a']} − {r['b']} | {r['kl']} | {'n/a' if g is None else format(g, '+.3f')} | "
                     f"{r['measured_gap']:+.3f} [{lo:+.3f}, {hi:+.3f}]{marks.get(verdict(r), '')} |")
    n = replication(summary["pairs"])
    lines.append(f"\nOf the {n['predicted_apart']} (pair, KL) gaps the solver predicts at least {PREDICTED_APART} "
                 f"apart, {n['reproduced']} reproduced (paired interval excludes zero on the predicted side), "
                 f"{n['undecided']} undecided (the interval holds zero), {n['reversed']} reversed.")
    return "\n".join(lines)


X_MAX = 3.0  # frontier.png shows KL 0..3 nats


def plot_frontier(out: Path, boot, paths: dict, summary: dict) -> None:
    """Success vs KL per method (mean over seeds, 95% bootstrap band) up to the largest KL
    every seed's path reaches; the solver's predictions as markers at KL 0.5 / 1 / 2."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from testbed import bed as testbed_bed

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (name, by_seed) in enumerate(paths.items()):
        color = f"C{k % 10}"
        top = min(float(p.points(boot.ones()[s])[0].max()) for s, p in by_seed.items())
        rows = boot.frontier(by_seed, np.linspace(0.0, min(top, X_MAX), 41)) if top > 0 else []
        if rows:
            kl = [r["kl"] for r in rows]
            ax.plot(kl, [r["value"] for r in rows], color=color, label=name)
            ax.fill_between(kl, [r["ci95"][0] for r in rows], [r["ci95"][1] for r in rows], color=color, alpha=0.15)
        pred = summary["policies"][name]["predicted"]
        if isinstance(pred, dict):
            ax.plot([float(x) for x in pred], list(pred.values()), "x", color=color, markersize=8)
        elif pred is not None:
            ax.plot([0.0], [pred], "x", color=color, markersize=8)
        if not rows:
            v = summary["policies"][name]["at_kl"]["0.5"]["success_rate"]["value"]
            ax.plot([0.0], [v], "o", color=color, label=name)
    if summary.get("predicted"):
        ax.axhline(summary["predicted"]["optimum"], color="grey", linestyle=":", label="optimum (solver)")
    ax.set_xlim(-0.05, X_MAX)  # the levels compared; DPO paths can run on to tens of nats
    ax.set_xlabel("KL(π‖π0) from the warm start (nats, on the policy's own test episodes)")
    ax.set_ylabel("test success rate")
    ax.set_title(f"bed {testbed_bed.bed_record(summary)['bed']}: success vs KL (bands 95%, x = solver)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "frontier.png", dpi=100)
    plt.close(fig)
