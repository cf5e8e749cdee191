"""The test bed solved exactly: what each algorithm can reach, in the population limit.

    python -m testbed.predict --bed default          # the predicted table
    python -m testbed.predict --bed long --json      # one JSON object

For a bed (testbed/bed.py) the dialogue is a finite MDP over histories:
each agent turn chooses ask(fact j), the vague question or answer (the last turn always
answers); the scripted human's reply is a function of the question and c (the hidden
reference: which constants are literals, whether there is a docstring, which untold
guesses are right), so for a fixed c the dialogue is deterministic and for the policy,
which does not see c, it is random. Policies are tabular over the histories the policy
sees (questions and the kind of each reply). numpy only, no torch.

Computed:
- V*/Q* given c (`optimal_value`, `exact_advantage`: the oracle critic's per-turn
  advantage A*(h, a, c) = Q* − V*, on real message texts), the warm start's (the scripted
  explorer, `testbed.bed.explorer_probs`) and the optimal policy's success.
- Each method's population limit at KL 0.5 / 1 / 2 nats from the warm start, KL measured
  on the policy's own trajectories (E_π log π(τ)/π0(τ)), so learning rates and epochs drop
  out; each is a gradient flow in the tabular logits from π0, stopped at the target KL:
  - rft:   SFT on the warm start's successes (its limit is one round, π0·Q/V); a level
           beyond its limit is reported at the limit and flagged.
  - mtdpo: trajectory DPO on the paper's pairs (per task, K episodes: chosen = a best
           episode that succeeds, rejected = each worse one), β 0.1.
  - sweet_oracle / sweet / sweet_no_info: per-turn DPO (SWEET-RL stage 2) on every state
           the warm start visits: N candidates from π0 ranked by a critic, random
           top-half vs bottom-half pairs, equal scores dropped (sweet.algorithms.sweet_rl.make_action_pairs);
           the critic is A* given c (oracle), or the LM-head log-ratio critic
           A = log π_ψ/π0 fitted by Bradley-Terry on the same trajectory pairs, tabular
           over (history, c) or over histories alone.
- Simple rules' success and KL (`RULES`: never answer early; and never repeat a question;
  and ask a side before the vague question), each uniform over what it allows: how far
  one lesson of a critic goes.
A method that cannot reach a level (its flow converges first) is reported where it stops,
and flagged (`reached`). `--finite REPS` also trains every method on REPS sampled data sets
of the benchmark's budget (56 tasks x 8 episodes), evaluated exactly. The agreement with A*
a critic needs for per-turn DPO to reach MT-DPO is testbed/agreement.py; what
each method reaches when the policy cannot tell some histories apart (e.g. blind to which
question it asked) is testbed/policy_class.py.

Figures (`--bed default`; an earlier independent analysis's in brackets): warm start
0.490 (0.490), optimum 0.784 (0.784), one round of RFT 0.556 at KL 0.073 (0.556 at 0.07),
two rounds 0.608 (0.608); at KL 1 / 2: mtdpo 0.716 / 0.782 (0.704 / 0.782), sweet 0.718 /
0.769, stopping at KL 1.71 (0.696 / 0.766), sweet_no_info 0.632 / 0.731 (0.643 / 0.734),
pair accuracy 1.000 / 0.920 (1.000 / 0.921); sweet_oracle 0.697 / 0.783. The KL-1 values
move by about ±0.01 with how the K-episode pairing weights the tasks (K = 2: mtdpo 0.704),
which the theory does not state. `--bed long` (3 facts, 5 turns): warm start 0.370,
optimum 0.785, mtdpo 0.553 / 0.660, sweet_oracle 0.607 / 0.731 (+0.054 / +0.071),
sweet 0.568 / 0.653, sweet_no_info 0.521 / 0.567, RFT 0.493 at KL 0.19.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from sweet.algorithms.sweet_rl import rank_halves
from testbed import bed as tb
from testbed.mdp import (
    Bed,
    _flat,
    _scatter,
    _sum_at,
    build,
    evaluate,
    log_policy,
    optimal_value,
    optimum,
    revealed,
    succeeds,
)
from testbed.bed import BedDesign

KL_LEVELS = (0.5, 1.0, 2.0)
METHODS = ("rft", "mtdpo", "sweet", "sweet_no_info", "sweet_oracle")


# Simple rules a policy could learn, each uniform over the actions it allows: how far one
# lesson goes. Rule(history, action, n_facts, last_turn) -> allowed; the last turn answers.
def _never_early(h: tuple, a: int, n: int, last: bool) -> bool:
    return (a == n + 1) == last


def _no_repeat(h: tuple, a: int, n: int, last: bool) -> bool:
    return _never_early(h, a, n, last) and (last or a not in {b for b, _ in h})


def _sides_first(h: tuple, a: int, n: int, last: bool) -> bool:
    return _no_repeat(h, a, n, last) and (last or a < n or all(b < n for b, _ in h) and len(h) > 0)


RULES = {
    "never answer early": _never_early,  # what a critic that only blames early answers teaches
    "and never repeat a question": _no_repeat,  # visible in the dialogue: needs no c
    "and ask a side before the vague question": _sides_first,
}


def rule_policy(bed: Bed, allowed) -> np.ndarray:
    """The tabular policy uniform over the legal actions `allowed(h, a, n, last)` keeps at
    each history (log-probs [N, A]); a history where it keeps none follows π0."""
    n, logpi = bed.design.facts, bed.logp0.copy()
    for i, h in enumerate(bed.nodes):
        keep = [a for a in range(n + 2) if bed.legal[i, a] and allowed(h, a, n, len(h) == bed.design.turns - 1)]
        if keep:
            logpi[i] = -np.inf
            logpi[i, keep] = -math.log(len(keep))
    return logpi


def rule_points(bed: Bed) -> dict[str, Point]:
    """Success and KL from the warm start of each of RULES (a policy, not a method: no flag)."""
    out = {}
    for name, allowed in RULES.items():
        ev = evaluate(bed, rule_policy(bed, allowed))
        out[name] = Point(ev.success, ev.kl, True)
    return out


def rft_round(bed: Bed, logpi: np.ndarray) -> np.ndarray:
    """One round of RFT in the population limit: π ∝ π_old·Q/V, i.e. π_old conditioned on
    success, fitted per history (histories no success visits keep π_old)."""
    ev = evaluate(bed, logpi)
    w = bed.pc[bed.c] * ev.prob * bed.success
    counts = _sum_at(bed.fi, w, bed.sentinel + 1)[:-1].reshape(bed.legal.shape)
    total = counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        new = np.where(total > 0, np.log(counts / total), logpi)
    return np.where(bed.legal, new, -np.inf)


# ---- gradient flows to a target KL -------------------------------------------------------------


@dataclass
class Point:
    """A method at one KL level: its success, the KL it got to, and whether that is the level."""

    success: float
    kl: float
    reached: bool


def flow(bed: Bed, grad, levels: Sequence[float] = KL_LEVELS, max_steps: int = 4000,
         step: float = 0.05, max_dkl: float = 0.02, on_step=None) -> dict[float, Point]:
    """Follow the gradient flow of a loss (`grad(logpi) -> dL/dθ`) from π0 in the tabular
    logits, in normalised steps whose KL increments stay small (the path, not the speed,
    is the flow's), recording success and KL; each level's success is interpolated where
    the path crosses it. A path that stops short (the loss converged, or max_steps) gives
    its last point for the levels beyond, flagged not reached. `on_step(kl, logpi)`, if given,
    sees each accepted point of the path."""
    theta = np.where(bed.legal, bed.logp0, 0.0)
    logpi = log_policy(bed, theta)
    last = evaluate(bed, logpi)
    out: dict[float, Point] = {}
    todo = sorted(levels)
    previous = None
    for _ in range(max_steps):
        if not todo or step < 1e-7:
            break  # every level reached, or the flow converged (steps shrank on oscillation)
        g = grad(logpi)
        norm = float(np.sqrt((g * g).sum()))
        if norm < 1e-12:
            break
        g = g / norm
        if previous is not None and float((g * previous).sum()) < 0:
            step /= 2  # the direction flipped: at (or around) the loss's minimum
        previous = g
        while True:
            cand = theta - step * g
            new_logpi = log_policy(bed, cand)
            new = evaluate(bed, new_logpi)
            if new.kl - last.kl > max_dkl and step > 1e-7:
                step /= 2
                continue
            break
        if 0 <= new.kl - last.kl < max_dkl / 5:
            step = min(step * 1.25, 10.0)
        while todo and new.kl >= todo[0]:
            f = (todo[0] - last.kl) / (new.kl - last.kl) if new.kl > last.kl else 1.0
            out[todo[0]] = Point(last.success + f * (new.success - last.success), todo[0], True)
            todo.pop(0)
        theta, logpi, last = cand, new_logpi, new
        if on_step is not None:
            on_step(new.kl, new_logpi)
    for level in todo:
        out[level] = Point(last.success, last.kl, False)
    return out


def sft_grad(bed: Bed, weights: np.ndarray | None = None):
    """RFT's loss: −E_{c, τ ~ π0}[success · log π(τ)] (or −Σ weights · log π(τ) over rows,
    e.g. sampled successes); the population flow's limit is `rft_round`."""
    w = bed.pc[bed.c] * evaluate(bed, bed.logp0).prob * bed.success if weights is None else weights
    return lambda logpi: _scatter(bed, -w, logpi)


@dataclass
class TrajectoryPairs:
    """The trajectory pairs of the test bed's pairing rule (`pairing_rule`) in the population
    limit, per c: chosen ~ π0(τ | c, success), rejected ~ π0(τ | c, failure), with weight
    P(c)·E[pairs per task], p = π0's success on c, K episodes per task:
    "best" (the paper: the first success against every failure): E[#failures · 1(some
    success)] = K(1 − p)(1 − (1 − p)^(K−1));
    "all" (every two episodes whose rewards differ: every success against every failure):
    E[#successes · #failures] = K(K − 1)p(1 − p).
    Normalised to sum 1."""

    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per c: (chosen rows, rejected rows, [S, F] weights)


def pairing_rule() -> str:
    """The test bed's trajectory pairing rule: its environment's default (colbench.envs.
    training_defaults("testbed").pairing_rule), as sweet.core.records.make_trajectory_pairs
    applies it to the test bed's episodes."""
    from colbench.envs import training_defaults

    return training_defaults("testbed").pairing_rule


def expected_pairs_per_task(rule: str, p: float, k: int) -> float:
    """E[pairs of one task] among k episodes with success probability p (binary rewards)."""
    if rule == "best":
        return k * (1 - p) * (1 - (1 - p) ** (k - 1))
    if rule == "all":
        return k * (k - 1) * p * (1 - p)
    raise ValueError(f"unknown pairing rule {rule!r}")


def trajectory_pairs(bed: Bed, k: int = 8, rule: str | None = None) -> TrajectoryPairs:
    rule = rule or pairing_rule()
    prob = evaluate(bed, bed.logp0).prob
    blocks = []
    for ci in range(len(bed.cs)):
        rows = np.nonzero(bed.c == ci)[0]
        win, lose = rows[bed.success[rows] == 1], rows[bed.success[rows] == 0]
        p = float(prob[win].sum())
        if not len(win) or not len(lose) or p <= 0 or p >= 1:
            continue
        weight = bed.pc[ci] * expected_pairs_per_task(rule, p, k)
        blocks.append((win, lose, weight * np.outer(prob[win] / p, prob[lose] / (1 - p))))
    total = sum(w.sum() for _, _, w in blocks)
    return TrajectoryPairs([(a, b, w / total) for a, b, w in blocks])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def mtdpo_grad(bed: Bed, pairs: TrajectoryPairs, beta: float = 0.1):
    """Trajectory DPO: Σ w · softplus(−β[(log π/π0)(chosen) − (log π/π0)(rejected)])."""
    def grad(logpi: np.ndarray) -> np.ndarray:
        r = _flat(bed, logpi)[bed.fi].sum(axis=1) - bed.lp0
        g = np.zeros(len(r))
        for win, lose, w in pairs.blocks:
            m = w * _sigmoid(-beta * (r[win][:, None] - r[lose][None, :]))
            g[win] -= beta * m.sum(axis=1)
            g[lose] += beta * m.sum(axis=0)
        return _scatter(bed, g, logpi)

    return grad


def per_turn_grad(bed: Bed, measure: np.ndarray, beta: float = 0.1):
    """Per-turn DPO (stage 2): Σ_h Σ_{a,b} M[h,a,b] · softplus(−β[lr(h,a) − lr(h,b)]),
    lr = log π/π0, M the expected pair counts (`stage2_measure`)."""
    def grad(logpi: np.ndarray) -> np.ndarray:
        lr = np.where(bed.legal, logpi - np.where(bed.legal, bed.logp0, 0.0), 0.0)
        m = measure * _sigmoid(-beta * (lr[:, :, None] - lr[:, None, :]))
        g = -beta * m.sum(axis=2) + beta * m.sum(axis=1)
        pi = np.where(bed.legal, np.exp(logpi), 0.0)
        return np.where(bed.legal, g - pi * g.sum(axis=1, keepdims=True), 0.0)

    return grad


# ---- stage 2's pairs: candidates from π0, ranked by a critic ----------------------------------


@lru_cache(maxsize=None)
def candidate_pairs(probs: tuple[float, ...], ranks: tuple[int, ...], n: int = 8) -> tuple[tuple[float, ...], ...]:
    """E[#pairs (a chosen, b rejected)] per drawn pair at one state: n candidates i.i.d.
    from `probs`, sorted by score (`ranks`: higher is better; ties in random order), a
    random one of the top n//2 against a random one of the bottom n//2, pairs with equal
    scores dropped, as sweet.algorithms.sweet_rl.make_action_pairs does."""
    A, half = len(probs), n // 2
    out = np.zeros((A, A))
    actions = [a for a in range(A) if probs[a] > 0]
    for counts in _compositions(n, len(actions)):
        cnt = dict(zip(actions, counts))
        p = math.factorial(n) * math.prod(probs[a] ** c / math.factorial(c) for a, c in cnt.items())
        top, bottom = {}, {}
        pos = 0
        for level in sorted({ranks[a] for a in actions}, reverse=True):
            group = [a for a in actions if ranks[a] == level and cnt[a]]
            m = sum(cnt[a] for a in group)
            k_top = max(0, min(pos + m, half) - pos)
            k_bot = max(0, pos + m - max(pos, n - half))
            for a in group:
                top[a], bottom[a] = cnt[a] * k_top / m, cnt[a] * k_bot / m
            pos += m
        for a in top:
            for b in bottom:
                if ranks[a] > ranks[b]:
                    out[a, b] += p * top[a] * bottom[b] / (half * half)
    return tuple(map(tuple, out))


def _compositions(n: int, k: int):
    if k == 1:
        yield (n,)
        return
    for first in range(n + 1):
        for rest in _compositions(n - first, k - 1):
            yield (first,) + rest


def _ranks(scores: Sequence[float], legal: Sequence[bool]) -> tuple[int, ...]:
    """Dense ranks of the legal actions' scores (equal up to 1e-9 tie)."""
    levels: list[float] = []
    for v in sorted(x for x, ok in zip(scores, legal) if ok):
        if not levels or v - levels[-1] > 1e-9:
            levels.append(v)
    return tuple(next(i for i, l in enumerate(levels) if abs(v - l) <= 1e-9) if ok else -1
                 for v, ok in zip(scores, legal))


def state_visits(bed: Bed) -> dict[tuple[int, int], float]:
    """d0(h, c) = P(c)·P_π0(reach h | c) for every non-final node: stage 2's states."""
    prob = evaluate(bed, bed.logp0).prob
    visits: dict[tuple[int, int], float] = {}
    A = bed.n_actions
    for m in range(len(bed.fi)):
        w = bed.pc[bed.c[m]] * prob[m]
        for t, f in enumerate(bed.fi[m]):
            if f == bed.sentinel:
                break
            key = (int(f) // A, int(bed.c[m]))
            visits[key] = visits.get(key, 0.0) + w  # every trajectory through h adds its mass once
    return visits


def stage2_measure(bed: Bed, score, n_candidates: int = 8) -> np.ndarray:
    """M[h, a, b] = Σ_c d0(h, c)·E[pairs (a, b) | h, c] for a critic `score(node, c_index)
    -> scores per action` (a critic that does not see c ignores c_index)."""
    A = bed.n_actions
    measure = np.zeros((len(bed.nodes), A, A))
    p0 = np.where(bed.legal, np.exp(bed.logp0), 0.0)
    for (h, ci), d in state_visits(bed).items():
        if bed.legal[h].sum() < 2:
            continue  # a forced answer: every candidate ties
        ranks = _ranks(score(h, ci), bed.legal[h])
        measure[h] += d * np.array(candidate_pairs(tuple(p0[h]), ranks, n_candidates))
    return measure


def oracle_scores(bed: Bed):
    """Q*(h, a; c): the exact expected success given c after action a (the oracle critic)."""
    s, n = bed.design, bed.design.facts
    known_at = {}
    for m in range(len(bed.fi)):
        for t, f in enumerate(bed.fi[m]):
            if f == bed.sentinel:
                break
            known_at[(int(f) // bed.n_actions, int(bed.c[m]))] = bed.known[m][t]

    def score(h: int, ci: int) -> list[float]:
        c, known, left = bed.cs[ci], known_at[(h, ci)], s.turns - len(bed.nodes[h])
        return [float(succeeds(c, known)) if a == n + 1 else
                optimal_value(s, c, known | revealed(s, c, [a] if a < n else []), left - 1) for a in range(n + 2)]

    return score


# ---- the learned critic: LM-head log-ratio, Bradley-Terry on the trajectory pairs --------------


@dataclass
class Critic:
    """A fitted critic: A(key, a) = β_c·(log π_ψ(a | key) − log π0(a | h)) per key (a
    (history, c) pair, or a history when it does not see c), and its pair accuracy."""

    advantage: np.ndarray  # [n_keys, A]
    key_of: dict[tuple[int, int], int]  # (node, c) -> key
    pair_accuracy: float
    loss: float

    def score(self, h: int, ci: int) -> list[float]:
        return list(self.advantage[self.key_of[(h, ci)]])


def fit_critic(bed: Bed, pairs: TrajectoryPairs, with_c: bool, steps: int = 400, lr: float = 20.0,
               beta_c: float = 1.0, momentum: float = 0.9) -> Critic:
    """Fit the LM-head critic by gradient descent on the Bradley-Terry loss
    Σ w·softplus(−[ΣA(chosen turns) − ΣA(rejected turns)]) from ψ = log π0 (A = 0), as
    sweet/train_critic.py does (there: an LM over the dialogue and, with c, the reference).
    Tabular over (history, c) with c, over histories without: the critic without c must
    give every task the same score at a history. `steps`·`lr` is the training budget;
    with c the pairs are separable, so the loss falls towards 0 without a finite minimum
    and only the ranking, which settles early, matters. Heavy-ball momentum: 400 steps
    reach the ranking (and pair accuracy) of 5,000 plain ones on the default bed."""
    A = bed.n_actions
    if with_c:
        key_of = dict(bed.keys)
    else:
        key_of = {(h, ci): h for (h, ci) in bed.keys}
    n_keys = max(key_of.values()) + 1
    node_of_key = np.zeros(n_keys, dtype=np.int64)
    for (h, _), k in key_of.items():
        node_of_key[k] = h
    kfi = np.full(bed.fi.shape, n_keys * A, dtype=np.int64)
    for m in range(len(bed.fi)):
        for t, f in enumerate(bed.fi[m]):
            if f == bed.sentinel:
                break
            kfi[m, t] = key_of[(int(f) // A, int(bed.c[m]))] * A + int(f) % A
    legal = bed.legal[node_of_key]
    logp0 = np.where(legal, bed.logp0[node_of_key], 0.0)
    psi = logp0.copy()
    velocity = np.zeros_like(psi)

    def advantages(psi: np.ndarray) -> np.ndarray:
        z = np.where(legal, psi, -np.inf)
        mx = z.max(axis=1, keepdims=True)
        logq = z - mx - np.log(np.exp(z - mx).sum(axis=1, keepdims=True))
        return np.where(legal, beta_c * (logq - logp0), 0.0), np.where(legal, np.exp(logq), 0.0)

    def sums(adv: np.ndarray) -> np.ndarray:
        return np.append(adv.ravel(), 0.0)[kfi].sum(axis=1)

    for _ in range(steps):
        adv, q = advantages(psi)
        S = sums(adv)
        g = np.zeros(len(S))
        for win, lose, w in pairs.blocks:
            m = w * _sigmoid(-(S[win][:, None] - S[lose][None, :]))
            g[win] -= m.sum(axis=1)
            g[lose] += m.sum(axis=0)
        ga = beta_c * _sum_at(kfi, g, n_keys * A + 1)[:-1].reshape(n_keys, A)
        velocity = momentum * velocity - lr * np.where(legal, ga - q * ga.sum(axis=1, keepdims=True), 0.0)
        psi += velocity
    adv, _ = advantages(psi)
    S = sums(adv)
    acc = loss = 0.0
    for win, lose, w in pairs.blocks:
        d = S[win][:, None] - S[lose][None, :]
        acc += float((w * (d > 1e-9)).sum())
        loss += float((w * np.logaddexp(0.0, -d)).sum())
    return Critic(adv, key_of, acc, loss)



# ---- finite samples: the benchmark's budget ---------------------------------------------------


def sample_episodes(bed: Bed, n_tasks: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(task c indices [n_tasks], trajectory rows [n_tasks, k]): tasks drawn from the bed,
    k warm-start episodes each."""
    prob = evaluate(bed, bed.logp0).prob
    task_c = rng.choice(len(bed.cs), size=n_tasks, p=bed.pc / bed.pc.sum())
    rows = np.zeros((n_tasks, k), dtype=np.int64)
    for i, ci in enumerate(task_c):
        idx = np.nonzero(bed.c == ci)[0]
        rows[i] = rng.choice(idx, size=k, p=prob[idx] / prob[idx].sum())
    return task_c, rows


def sampled_pairs(bed: Bed, rows: np.ndarray, rule: str | None = None) -> TrajectoryPairs:
    """The test bed's pairing on sampled episodes (sweet.core.records.make_trajectory_pairs with
    `pairing_rule()`): per task whose best episode succeeds, "best": chosen = its first success,
    rejected = every failure; "all": every success against every failure."""
    rule = rule or pairing_rule()
    if rule not in ("best", "all"):
        raise ValueError(f"unknown pairing rule {rule!r}")
    blocks = []
    for task_rows in rows:
        ok = bed.success[task_rows] == 1
        if ok.any() and not ok.all():
            win, lose = (task_rows[ok][:1] if rule == "best" else task_rows[ok]), task_rows[~ok]
            blocks.append((win, lose, np.ones((len(win), len(lose)))))
    total = sum(w.sum() for _, _, w in blocks) or 1.0
    return TrajectoryPairs([(a, b, w / total) for a, b, w in blocks])


def sampled_stage2(bed: Bed, task_c: np.ndarray, rows: np.ndarray, score, rng: np.random.Generator,
                   n_candidates: int = 8, pairs_per_state: int = 4) -> np.ndarray:
    """Stage 2's pairs on sampled episodes: at every non-final state of every episode,
    `n_candidates` from π0 ranked by the critic (ties in random order), `pairs_per_state`
    random top-half vs bottom-half pairs, equal scores dropped: the halves are stage 2's own
    (`rank_halves`, as in sweet.algorithms.sweet_rl.make_action_pairs)."""
    A, half = bed.n_actions, n_candidates // 2
    measure = np.zeros((len(bed.nodes), A, A))
    p0 = np.where(bed.legal, np.exp(bed.logp0), 0.0)
    for ci, task_rows in zip(task_c, rows):
        for m in task_rows:
            for f in bed.fi[m]:
                h = int(f) // A
                if f == bed.sentinel or bed.legal[h].sum() < 2:
                    continue
                scores = score(h, int(ci))
                cands = rng.permutation(rng.choice(A, size=n_candidates, p=p0[h])).tolist()
                top, bottom = ([cands[i] for i in idx] for idx in rank_halves([scores[a] for a in cands]))
                for _ in range(pairs_per_state):
                    a, b = top[rng.integers(half)], bottom[rng.integers(half)]
                    if scores[a] > scores[b] + 1e-9:
                        measure[h, a, b] += 1.0
    return measure / max(measure.sum(), 1.0)


def predict_finite(design: str | BedDesign, reps: int = 30, n_tasks: int = 56, k: int = 8, seed: int = 0,
                   levels: Sequence[float] = KL_LEVELS, candidates: int = 8, beta: float = 0.1,
                   critic_steps: int = 400) -> dict[str, dict[float, tuple[float, float, float]]]:
    """Each method trained on `reps` independent data sets of n_tasks x k warm-start episodes
    (the benchmark's budget: 56 x 8), evaluated exactly (success and KL on the policy's own
    distribution): per method and level (mean success, its standard error, the share of
    repetitions that reached the level)."""
    bed = build(design)
    rng = np.random.default_rng(seed)
    results: dict[str, dict[float, list[Point]]] = {m: {k_: [] for k_ in levels} for m in METHODS}
    oracle = oracle_scores(bed)
    for _ in range(reps):
        task_c, rows = sample_episodes(bed, n_tasks, k, rng)
        pairs = sampled_pairs(bed, rows)
        wins = np.bincount(rows.ravel(), weights=bed.success[rows.ravel()], minlength=len(bed.fi))
        runs = {"rft": flow(bed, sft_grad(bed, wins / max(wins.sum(), 1.0)), levels),
                "mtdpo": flow(bed, mtdpo_grad(bed, pairs, beta), levels)}
        for name, score in (("sweet", fit_critic(bed, pairs, True, critic_steps).score),
                            ("sweet_no_info", fit_critic(bed, pairs, False, critic_steps).score),
                            ("sweet_oracle", oracle)):
            measure = sampled_stage2(bed, task_c, rows, score, rng, candidates)
            runs[name] = flow(bed, per_turn_grad(bed, measure, beta), levels)
        for name, points in runs.items():
            for level, point in points.items():
                results[name][level].append(point)
    return {name: {level: (float(np.mean([p.success for p in pts])),
                           float(np.std([p.success for p in pts], ddof=1) / math.sqrt(len(pts))) if len(pts) > 1 else 0.0,
                           float(np.mean([p.reached for p in pts])))
                   for level, pts in by_level.items()} for name, by_level in results.items()}


# ---- the prediction: every method at every KL level -------------------------------------------


@dataclass
class Prediction:
    """What the solver predicts for a bed (population limit)."""

    bed: str
    warm_start: float
    optimum: float
    methods: dict[str, dict[float, Point]]
    rft_rounds: list[tuple[float, float]]  # (success, KL) after 1, 2 rounds of ideal RFT
    pair_accuracy: dict[str, float]  # the learned critics' on the trajectory pairs
    critics: dict[str, Critic] = field(default_factory=dict, repr=False)  # the learned critics themselves
    rules: dict[str, Point] = field(default_factory=dict)  # simple rules' success and KL (RULES)

    def to_json(self) -> dict:
        out: dict = {"bed": self.bed, "warm_start": round(self.warm_start, 4), "optimum": round(self.optimum, 4)}
        for name, points in self.methods.items():
            out[name] = {f"{k:.1f}": round(p.success, 4) for k, p in points.items()}
        out["kl"] = {name: {f"{k:.1f}": round(p.kl, 4) for k, p in points.items()}
                     for name, points in self.methods.items()}
        out["reached"] = {name: {f"{k:.1f}": p.reached for k, p in points.items()}
                          for name, points in self.methods.items()}
        out["rft_rounds"] = [{"success": round(s, 4), "kl": round(k, 4)} for s, k in self.rft_rounds]
        out["pair_accuracy"] = {k: round(v, 4) for k, v in self.pair_accuracy.items()}
        out["rules"] = {k: {"success": round(p.success, 4), "kl": round(p.kl, 4)} for k, p in self.rules.items()}
        return out


def predict(design: str | BedDesign, levels: Sequence[float] = KL_LEVELS, episodes_per_task: int = 8,
            candidates: int = 8, beta: float = 0.1, critic_steps: int = 400) -> Prediction:
    """Warm start, optimum and each method's population limit at each KL level."""
    bed = build(design)
    warm = evaluate(bed, bed.logp0).success
    best, _ = optimum(bed)
    pairs = trajectory_pairs(bed, episodes_per_task)
    rounds, logpi = [], bed.logp0
    for _ in range(2):
        logpi = rft_round(bed, logpi)
        ev = evaluate(bed, logpi)
        rounds.append((ev.success, ev.kl))
    methods = {"rft": _rft_points(bed, levels, rounds[0]), "mtdpo": flow(bed, mtdpo_grad(bed, pairs, beta), levels)}
    critics = {"sweet": fit_critic(bed, pairs, True, critic_steps),
               "sweet_no_info": fit_critic(bed, pairs, False, critic_steps)}
    for name, score in (("sweet", critics["sweet"].score), ("sweet_no_info", critics["sweet_no_info"].score),
                        ("sweet_oracle", oracle_scores(bed))):
        methods[name] = flow(bed, per_turn_grad(bed, stage2_measure(bed, score, candidates), beta), levels)
    return Prediction(bed.design.name, warm, best, methods, rounds,
                      {name: c.pair_accuracy for name, c in critics.items()}, critics, rule_points(bed))


def _rft_points(bed: Bed, levels: Sequence[float], limit: tuple[float, float]) -> dict[float, Point]:
    """RFT's SFT flow below its one-round limit; at and beyond it, the limit (flagged)."""
    below = [k for k in levels if k < limit[1]]
    points = flow(bed, sft_grad(bed), below) if below else {}
    for k in levels:
        if k not in points or not points[k].reached:
            points[k] = Point(limit[0], limit[1], False)
    return dict(sorted(points.items()))


def _closed(p: Prediction, success: float) -> float:
    return (success - p.warm_start) / (p.optimum - p.warm_start) if p.optimum > p.warm_start else float("nan")


def format_table(p: Prediction) -> str:
    levels = list(next(iter(p.methods.values())))
    lines = [f"test bed {p.bed!r} (testbed/bed.py), population limit",
             f"warm start {p.warm_start:.3f}   optimum {p.optimum:.3f}   ideal RFT rounds: "
             + ", ".join(f"{s:.3f} at KL {k:.2f}" for s, k in p.rft_rounds),
             f"critic pair accuracy: with c {p.pair_accuracy['sweet']:.3f}, without c {p.pair_accuracy['sweet_no_info']:.3f}",
             "simple rules, each uniform over the actions it allows (share of the way from warm start to optimum):",
             *(f"  {name:<42} {pt.success:.3f} at KL {pt.kl:.2f} ({_closed(p, pt.success):.0%})"
               for name, pt in p.rules.items()),
             "", "success at KL from the warm start (* = the method stops short of that KL: shown where it stops)",
             f"{'method':<15}" + "".join(f"{'KL ' + format(k, 'g'):>16}" for k in levels)]
    for name, points in p.methods.items():
        cells = [f"{pt.success:.3f}" + (f" (*{pt.kl:.2f})" if not pt.reached else "") for pt in points.values()]
        lines.append(f"{name:<15}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def add_solver_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags the solver's command lines share (this module's, testbed.agreement's)."""
    parser.add_argument("--bed", "--spec", default=tb.DEFAULT_BED,
                        help=f"the test-bed preset: {', '.join(tb.PRESETS)}")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--episodes-per-task", type=int, default=8, help="K episodes per task behind the pairs")
    parser.add_argument("--candidates", type=int, default=8, help="stage-2 candidates per state")
    parser.add_argument("--beta", type=float, default=0.1, help="DPO β")


def check_solver_arguments(parser: argparse.ArgumentParser, args, more: dict[str, int]) -> None:
    """A bad --bed, or a flag below its least value (`more`: flag -> its value minus its
    least), is one line from argparse."""
    try:
        tb.design(args.bed)
    except ValueError as e:
        parser.error(str(e))
    for name, value in {"--episodes-per-task": args.episodes_per_task - 1, "--candidates": args.candidates - 2,
                        **more}.items():
        if value < 0:
            parser.error(f"{name}: too small")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.predict", description=__doc__.split("\n\n")[0])
    add_solver_arguments(parser)
    parser.add_argument("--finite", type=int, default=0, metavar="REPS",
                        help="also train on REPS sampled data sets of --tasks x --episodes-per-task (0: population only)")
    parser.add_argument("--tasks", type=int, default=56, help="train tasks per sampled data set (--finite)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampled data sets (--finite)")
    args = parser.parse_args(argv)
    check_solver_arguments(parser, args, {"--finite": args.finite, "--tasks": args.tasks - 1})
    p = predict(args.bed, episodes_per_task=args.episodes_per_task, candidates=args.candidates, beta=args.beta)
    finite = (predict_finite(args.bed, args.finite, args.tasks, args.episodes_per_task, args.seed,
                             candidates=args.candidates, beta=args.beta) if args.finite else None)
    if args.json:
        out = p.to_json()
        if finite is not None:
            out["finite"] = {"reps": args.finite, "tasks": args.tasks, "episodes_per_task": args.episodes_per_task,
                             **{name: {f"{k:.1f}": {"mean": round(m, 4), "se": round(se, 4), "reached": round(r, 3)}
                                       for k, (m, se, r) in by.items()} for name, by in finite.items()}}
        print(json.dumps(out))
    else:
        print(format_table(p))
        if finite is not None:
            print(format_finite(finite, args.finite, args.tasks, args.episodes_per_task))
    return 0


def format_finite(finite: dict, reps: int, n_tasks: int, k: int) -> str:
    levels = list(next(iter(finite.values())))
    lines = ["", f"finite samples: {reps} data sets of {n_tasks} tasks x {k} episodes, mean ± s.e. "
             "(* = some repetitions stopped short of that KL)",
             f"{'method':<15}" + "".join(f"{'KL ' + format(k_, 'g'):>18}" for k_ in levels)]
    for name, by in finite.items():
        cells = [f"{m:.3f} ± {se:.3f}" + ("*" if r < 1 else "") for m, se, r in by.values()]
        lines.append(f"{name:<15}" + "".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
