"""Leaderboard metrics with 95% confidence intervals, and agent behaviour statistics.

Intervals: percentile bootstrap over tasks (each resample draws tasks with
replacement and keeps all of a task's seeds), 2,000 resamples from a fixed RNG
seed, so the same episodes always give the same interval. Resampling tasks rather
than episodes accounts for seeds of one task being correlated.

Metrics (values are fractions in [0, 1] except clip_similarity, a cosine):
    tests_passed     mean fraction of unit tests passed (backend reward)
    success_rate     share of episodes passing all tests
    clip_similarity  mean CLIP cosine of the final render vs the target (frontend reward)
    tgc              appworld: task goal completion, share of episodes whose task passes all
                     AppWorld tests (the reward)
    sgc              appworld: scenario goal completion, share of (scenario, seed) pairs whose
                     tasks all pass; the interval resamples scenarios
    win_rate         share of tasks where the agent's mean reward over seeds beats the
                     baseline agent's; ties count half (the baseline scores 0.5)
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from colbench.types import STOP_ENGINE_ERROR, STOP_UNUSABLE, Episode

N_BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0

# Simulator replies that admit ignorance (the paper's simulator is told to say so).
DONT_KNOW = re.compile(
    r"\b(?:i\s+)?(?:do\s*n[o']?t|don't|dont|do not)\s+know\b|\bnot\s+sure\b|\bno\s+idea\b|\bunsure\b"
    r"|\bcan(?:no|')?t\s+(?:say|tell)\b|\bnot\s+(?:specified|mentioned)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Metric:
    value: float
    low: float
    high: float

    def to_json(self) -> dict:
        return {"value": self.value, "ci95": [self.low, self.high]}

    @classmethod
    def from_json(cls, d: dict) -> "Metric":
        return cls(d["value"], d["ci95"][0], d["ci95"][1])


def bootstrap_ci(per_task: Sequence[Sequence[float]], *, n_boot: int = N_BOOTSTRAP,
                 seed: int = BOOTSTRAP_SEED) -> Metric:
    """Mean over all values (every episode weighs the same) and its 95%
    percentile-bootstrap interval over tasks.

    per_task: one list of values per task (one value per seed).
    """
    groups = [np.asarray(v, dtype=float) for v in per_task if len(v)]
    if not groups:
        return Metric(float("nan"), float("nan"), float("nan"))
    return bootstrap_sums([g.sum() for g in groups], [len(g) for g in groups], n_boot=n_boot, seed=seed)


def bootstrap_sums(sums: Sequence[float], counts: Sequence[float], *, n_boot: int = N_BOOTSTRAP,
                   seed: int = BOOTSTRAP_SEED) -> Metric:
    """`bootstrap_ci` from each task's sum of values and their count (tasks with count 0
    are left out): the pooled mean and its 95% percentile interval over tasks."""
    keep = [i for i, n in enumerate(counts) if n > 0]
    if not keep:
        return Metric(float("nan"), float("nan"), float("nan"))
    sums = np.asarray([float(sums[i]) for i in keep])
    counts = np.asarray([float(counts[i]) for i in keep])
    value = float(sums.sum() / counts.sum())
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(sums), size=(n_boot, len(sums)))  # [B, n_tasks] task indices
    boots = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    low, high = np.percentile(boots, [2.5, 97.5])
    # Float noise must not put the point estimate outside its own interval.
    return Metric(value, float(min(low, value)), float(max(high, value)))


def by_task(episodes: Sequence[Episode], value: Callable[[Episode], float]) -> dict[str, list[float]]:
    """Group a per-episode value by task id (order of first appearance)."""
    out: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        out[ep.task_id].append(value(ep))
    return dict(out)


def win_outcomes(episodes: Sequence[Episode], baseline: Sequence[Episode]) -> list[float]:
    """Per task shared with the baseline: 1 if the agent's mean reward over seeds is
    higher, 0.5 on a tie, 0 otherwise."""
    mine = {t: float(np.mean(v)) for t, v in by_task(episodes, lambda e: e.reward).items()}
    base = {t: float(np.mean(v)) for t, v in by_task(baseline, lambda e: e.reward).items()}
    return [1.0 if mine[t] > base[t] else 0.5 if mine[t] == base[t] else 0.0 for t in mine if t in base]


def env_metrics(env: str, episodes: Sequence[Episode], baseline: Sequence[Episode] | None = None) -> dict[str, Metric]:
    """The leaderboard metrics of one agent's episodes (see module docstring)."""
    rewards = list(by_task(episodes, lambda e: e.reward).values())
    metrics: dict[str, Metric] = {}
    if env == "frontend":
        metrics["clip_similarity"] = bootstrap_ci(rewards)
    elif env == "appworld":
        metrics["tgc"] = bootstrap_ci(list(by_task(episodes, lambda e: float(e.success)).values()))
        metrics["sgc"] = bootstrap_ci(scenario_outcomes(episodes))
    else:
        metrics["tests_passed"] = bootstrap_ci(rewards)
        metrics["success_rate"] = bootstrap_ci(list(by_task(episodes, lambda e: float(e.success)).values()))
    if baseline is not None:
        metrics["win_rate"] = bootstrap_ci([[w] for w in win_outcomes(episodes, baseline)])
    return metrics


def scenario_outcomes(episodes: Sequence[Episode]) -> list[list[float]]:
    """AppWorld's scenario goal completion per scenario: for each seed, 1.0 when every task of
    the scenario played with that seed succeeded (appworld.evaluator's min over a scenario's
    tasks), one list per scenario."""
    from colbench.envs.appworld import scenario_id

    grouped: dict[str, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for ep in episodes:
        grouped[scenario_id(ep.task_id)][ep.seed].append(ep.success)
    return [[float(all(ok)) for ok in seeds.values()] for seeds in grouped.values()]


def _asked(ep: Episode) -> int:
    """Questions the agent asked: agent turns the simulated human answered (or failed on)."""
    return sum(1 for t in ep.turns if t.role == "human")


def behaviour_stats(episodes: Sequence[Episode]) -> dict[str, float | int | dict[str, int]]:
    """How an agent behaves: dialogue length, asking vs answering, simulator replies. Over
    the episodes it played: those of unusable tasks (never played) count in `stop_reasons` only."""
    if not episodes:
        return {}
    stop_reasons = dict(sorted(Counter(ep.stop_reason for ep in episodes).items()))
    episodes = [ep for ep in episodes if ep.stop_reason != STOP_UNUSABLE]
    if not episodes:
        return {"stop_reasons": stop_reasons}
    agent_turns = [t for ep in episodes for t in ep.agent_turns]
    replies = [t for ep in episodes for t in ep.turns if t.role == "human" and not t.failed]
    dont_know = sum(1 for t in replies if DONT_KNOW.search(t.content))
    engine_failed = [ep for ep in episodes if ep.stop_reason == STOP_ENGINE_ERROR]
    n = len(episodes)
    return {
        "mean_turns": float(np.mean([len(ep.agent_turns) for ep in episodes])),
        "mean_questions": float(np.mean([_asked(ep) for ep in episodes])),
        "asked_before_answering": sum(1 for ep in episodes if _asked(ep) > 0) / n,
        "answered_without_asking": sum(1 for ep in episodes if _asked(ep) == 0) / n,
        "mean_agent_reply_chars": float(np.mean([len(t.content) for t in agent_turns])) if agent_turns else 0.0,
        "simulator_replies": len(replies),
        "simulator_dont_know_rate": dont_know / len(replies) if replies else 0.0,
        "simulator_failures": sum(ep.n_simulator_failures for ep in episodes),
        "scoring_errors": sum(1 for ep in episodes if ep.score is not None and ep.score.error
                              and ep.stop_reason != STOP_ENGINE_ERROR),
        "engine_errors": len(engine_failed),
        "first_engine_error": _engine_error(engine_failed[0]) if engine_failed else None,
        "stop_reasons": stop_reasons,
        **_backend_stats(episodes),
    }


def _backend_stats(episodes: Sequence[Episode]) -> dict[str, float | int]:
    """Backend only: how often the final answer parses as Python defining a function, and
    the leak guard's counts (colbench.leaks): human replies that revealed the reference, per
    episode, and how many of them the fixed reply replaced."""
    if not episodes or episodes[0].env != "backend":
        return {}
    from colbench.leaks import count_leaks
    from colbench.scoring.backend import defines

    leaks = [count_leaks(ep.meta) for ep in episodes]
    return {
        "answer_parses": sum(1 for ep in episodes if defines(ep.answer, None)) / len(episodes),
        "leaks_per_episode": sum(n for n, _ in leaks) / len(episodes),
        "leaks": sum(n for n, _ in leaks),
        "leaks_replaced": sum(r for _, r in leaks),
    }


def _engine_error(ep: Episode) -> str:
    """Why the agent's engine failed on this episode (as the runner recorded it)."""
    return str(ep.meta.get("error") or (ep.score.error if ep.score else None) or "unknown error")
