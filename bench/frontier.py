"""The learning benchmark's protocol maths: success at matched KL along training paths,
and paired bootstrap intervals over (seed, test task) clusters. numpy only.

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
from dataclasses import dataclass
from typing import Sequence

import numpy as np

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
    """

    tasks: tuple[str, ...]
    steps: tuple[int, ...]
    success: np.ndarray
    log_ratio: np.ndarray
    count: np.ndarray

    def points(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(KL [..., P], success [..., P]) of every point with task `weights` [..., T]
        (how often each task was drawn; all ones = the data itself)."""
        n = weights @ self.count.T
        return (weights @ self.log_ratio.T) / np.maximum(n, 1e-12), (weights @ self.success.T) / np.maximum(n, 1e-12)


def interpolate(kl: np.ndarray, success: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Success at KL `level` along paths: kl, success [..., P] in path order (point 0 at KL 0)
    -> (success [...], reached [...] bool, the KL reported at [...]: `level`, or the path's
    largest KL where it never gets there)."""
    kl, success = np.asarray(kl, float), np.asarray(success, float)
    above = kl >= level
    reached = above.any(-1)
    i = np.where(reached, above.argmax(-1), kl.argmax(-1))
    j = np.maximum(i - 1, 0)
    take = lambda x, k: np.take_along_axis(x, k[..., None], -1)[..., 0]  # noqa: E731
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

    def value(self, paths: dict[int, TrainingPath], level: float, weights: dict[int, np.ndarray] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(success, reached, KL) of a policy at `level`: each seed's interpolated value, then
        the seeds' mean weighted by their drawn clusters; reached only where every seed reached.
        `weights` None: the resamples ([B]); else those task weights (e.g. all ones: the data)."""
        weights = self.weights if weights is None else weights
        values, reached, kls, masses = [], [], [], []
        for s in self.seeds:
            path = paths[s]
            if path.tasks != self.tasks[s]:
                raise ValueError(f"seed {s}: a path's test tasks differ from the others' (pairing needs the same)")
            v, r, k = interpolate(*path.points(weights[s]), level)
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
        """{"0.5": {"success_rate": {"value", "ci95"}, "reached": bool, "kl": k}, ...}."""
        out = {}
        for level in levels:
            value, reached, kl = self.value(paths, level, self.ones())
            boots, _, _ = self.value(paths, level)
            out[f"{level:.1f}"] = {"success_rate": _metric(float(value), boots), "reached": bool(reached),
                                   "kl": float(kl)}
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
        p = predicted.get(name)
        return p if isinstance(p, (int, float)) or p is None else p.get(key)

    out = []
    for a, b in itertools.combinations(paths, 2):
        for level in levels:
            key = f"{level:.1f}"
            pa, pb = pred(a, key), pred(b, key)
            out.append({"a": a, "b": b, "kl": key,
                        "predicted_gap": None if pa is None or pb is None else round(pa - pb, 4),
                        **boot.gap(paths[a], paths[b], level)})
    return out
