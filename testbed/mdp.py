"""The test bed as an exact MDP: values, A*, the optimal policy (numpy only, no torch).

For a bed (testbed/bed.py) the dialogue is a finite MDP over histories:
each agent turn chooses ask(fact j), the vague question or answer (the last turn always
answers); the scripted human's reply is a function of the question and c (the hidden
reference: which constants are literals, whether there is a docstring, which untold
guesses are right), so for a fixed c the dialogue is deterministic and for the policy,
which does not see c, it is random. Policies are tabular over the histories the policy
sees (questions and the kind of each reply).

Computed: V*/Q* given c (`optimal_value`, `exact_advantage`: the oracle critic's per-turn
advantage A*(h, a, c) = Q* − V*, on real message texts), the bed's trajectories (`build`),
a tabular policy's success and KL from the warm start (`evaluate`), the optimal policy
(`optimum`, `optimal_action`, `optimal_message`) and exact success on a task set
(`expected_success_on`). What each method reaches from the warm start is testbed/predict.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from colbench.protocols import ANSWER_MARKER
from testbed import bed as tb
from testbed.bed import BedDesign


# ---- c, and what the human reveals -------------------------------------------------------------


@dataclass(frozen=True)
class C:
    """A task's hidden information as the dialogue feels it: per fact whether its constant
    is stated and whether the fixed guess is right, and whether there is a docstring."""

    stated: tuple[bool, ...]
    doc: bool
    lucky: tuple[bool, ...]


def c_types(s: BedDesign) -> list[tuple[C, float]]:
    """Every C with a positive probability under the design, with that probability."""
    def bern(p: float, v: bool) -> float:
        return p if v else 1.0 - p

    out = []
    n = s.facts
    for stated in itertools.product((True, False), repeat=n):
        for doc in (True, False):
            for lucky in itertools.product((True, False), repeat=n):
                p = bern(s.p_doc, doc) * math.prod(bern(s.p_state, x) for x in stated) \
                    * math.prod(bern(s.p_guess_right, x) for x in lucky)
                if p > 0:
                    out.append((C(stated, doc, lucky), p))
    return out


def c_of_reference(s: BedDesign, reference: str) -> C:
    """The C of a task's hidden reference (its source: literals, docstring, values)."""
    if s.legacy:
        return C((True,) * s.facts, False, (False,) * s.facts)
    h = tb.read_reference(s, reference)
    return C(h.stated, h.doc, tuple(v == g for v, g in zip(h.values, tb.guess(s))))


def revealed(s: BedDesign, c: C, asked: Sequence[int] | None) -> frozenset[int]:
    """Facts a question tells: `asked` = the facts it names (None or empty: the vague
    question, which tells every fact when there is a docstring)."""
    if not asked:
        return frozenset(range(s.facts)) if c.doc else frozenset()
    if s.one_side:
        asked = asked[:1]
    return frozenset(j for j in asked if c.stated[j])


def succeeds(c: C, known: frozenset[int]) -> bool:
    """The explorer-style answer (told constants, the guess for the rest) passes every test."""
    return all(j in known or lucky for j, lucky in enumerate(c.lucky))


@lru_cache(maxsize=None)
def optimal_value(s: BedDesign, c: C, known: frozenset[int], turns_left: int) -> float:
    """V*(known, turns_left; c): the best success probability from here for an agent that
    knows c (deterministic given c, so 0 or 1). A question on the last turn is scored as
    the answer (no code: 0), so the last turn answers."""
    best = float(succeeds(c, known))
    if turns_left <= 1 or best == 1.0:
        return best
    for asked in [[j] for j in range(s.facts)] + [[]]:
        best = max(best, optimal_value(s, c, known | revealed(s, c, asked), turns_left - 1))
    return best


def exact_advantage(design: str | BedDesign, reference: str, replies: Sequence[str], action: str,
                    turns_left: int) -> float:
    """A*(h, a, c) = Q*(h, a; c) − V*(h; c) of a real agent message on a task of `design`,
    in success probability: what the oracle critic ranks candidates by.

    reference:  the task's hidden reference (c); replies: the human's messages so far (the
    agent knows a constant once a reply stated its true value); action: the agent's
    message, an answer if it holds the marker or on the last turn (turns_left == 1), then
    scored 1 if every constant it writes is right; otherwise a question, which tells the
    facts it names (the scripted human's rule, testbed.bed.human_reply). V* is over the
    bed's actions (one fact, the vague question, the answer), so on the legacy bed, whose
    human answers every side a message names, a message naming several can score above 0.
    The one oracle of every preset: `--critic oracle` (testbed/oracle.py) ranks by it."""
    s = tb.design(design)
    if turns_left < 1:
        raise ValueError(f"turns_left must be >= 1, got {turns_left}")
    c = c_of_reference(s, reference)
    values = tb.read_reference(s, reference).values
    known = frozenset(j for j, v in enumerate(tb.told_values(s, replies)) if v is not None and v == values[j])
    if ANSWER_MARKER in action or turns_left == 1:
        q = float(tb.answer_values(s, action) == values)
    else:
        q = optimal_value(s, c, known | revealed(s, c, tb.named_facts(s, action)), turns_left - 1)
    return q - optimal_value(s, c, known, turns_left)


# ---- the MDP over histories ------------------------------------------------------------------


@dataclass
class Bed:
    """A bed's dialogue MDP, enumerated. Actions 0..n-1 ask fact j, n the vague question,
    n+1 answer. A node is a history the policy sees: ((action, told-anything), ...).

    Trajectory arrays, one row per (c, action sequence) with positive probability:
      fi [M, T]: flat (node * A + action) index per turn, padded with the sentinel N*A;
      c [M]: index into `cs`; success [M]; lp0 [M]: log π0(τ | c).
    """

    design: BedDesign
    cs: list[C]
    pc: np.ndarray  # [n_c]
    nodes: list[tuple]  # node id -> history
    legal: np.ndarray  # [N, A] bool
    logp0: np.ndarray  # [N, A] log π0 (-inf where illegal)
    fi: np.ndarray
    c: np.ndarray
    success: np.ndarray
    known: list[list[frozenset[int]]] = field(default_factory=list)  # per row: what is known at each turn
    keys: dict[tuple[int, int], int] = field(default_factory=dict)  # (node, c) visited -> key id (critic with c)
    lp0: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def n_actions(self) -> int:
        return self.design.facts + 2

    @property
    def sentinel(self) -> int:
        return len(self.nodes) * self.n_actions


def build(design: str | BedDesign) -> Bed:
    s = tb.design(design)
    n, A, T = s.facts, s.facts + 2, s.turns
    weighted = c_types(s)
    cs, pc = [c for c, _ in weighted], np.array([p for _, p in weighted])
    node_ids: dict[tuple, int] = {}
    rows: list[tuple[list[int], int, bool, list[frozenset[int]]]] = []

    def node(h: tuple) -> int:
        return node_ids.setdefault(h, len(node_ids))

    for ci, c in enumerate(cs):
        def walk(h: tuple, known: frozenset[int], path: list[int], knows: list[frozenset[int]]) -> None:
            here = node(h)
            last = len(h) == T - 1
            for a in range(A):
                if last and a != n + 1:
                    continue
                if a == n + 1:
                    rows.append((path + [here * A + a], ci, succeeds(c, known), knows + [known]))
                    continue
                new = revealed(s, c, [a] if a < n else [])
                walk(h + ((a, bool(new)),), known | new, path + [here * A + a], knows + [known])

        walk((), frozenset(), [], [])
    nodes = list(node_ids)
    legal = np.zeros((len(nodes), A), dtype=bool)
    logp0 = np.full((len(nodes), A), -np.inf)
    for h, i in node_ids.items():
        for a, p in explorer_action_probs(s, h).items():
            if p > 0:
                legal[i, a] = True
                logp0[i, a] = math.log(p)
    sentinel = len(nodes) * A
    fi = np.full((len(rows), T), sentinel, dtype=np.int64)
    for m, (path, _, _, _) in enumerate(rows):
        fi[m, : len(path)] = path
    bed = Bed(s, cs, pc, nodes, legal, logp0, fi, np.array([r[1] for r in rows]),
              np.array([r[2] for r in rows], dtype=float), [r[3] for r in rows])
    # π0 may give an action no mass (p_ask 1: never answers early): such rows never occur
    keep = np.isfinite(np.append(logp0.ravel(), 0.0)[fi]).all(axis=1)  # not _flat: it zeroes the -inf
    bed.fi, bed.c, bed.success = bed.fi[keep], bed.c[keep], bed.success[keep]
    bed.known = [k for k, ok in zip(bed.known, keep) if ok]
    for m in range(len(bed.fi)):
        for f in bed.fi[m]:
            if f != sentinel:
                bed.keys.setdefault((int(f) // A, int(bed.c[m])), len(bed.keys))
    bed.lp0 = _flat(bed, logp0)[bed.fi].sum(axis=1)
    return bed


def explorer_action_probs(s: BedDesign, h: tuple) -> dict[int, float]:
    """π0 at an abstract history: `testbed.bed.explorer_probs` (the one explorer) read on
    a rendered dialogue with that history, its messages mapped back to actions."""
    facts, history = s.fact_list, []
    for a, told in h:
        if a < s.facts:
            history += [tb.question(facts[a]),
                        tb.stated_sentence(facts[a], facts[a].values[1]) if told else tb.not_sure_sentence(facts[a])]
        else:
            history += [tb.QUESTION_VAGUE, " ".join(tb.stated_sentence(f, f.values[1]) for f in facts) if told
                        else tb.DONT_KNOW]
    out: dict[int, float] = {}
    for text, p in tb.explorer_probs(s, history).items():
        a = s.facts + 1 if ANSWER_MARKER in text else (tb.named_facts(s, text) or [s.facts])[0]
        out[a] = out.get(a, 0.0) + p
    return out


def _flat(bed: Bed, x: np.ndarray) -> np.ndarray:
    """[N, A] -> flat with a trailing 0 for the sentinel."""
    return np.append(np.where(bed.legal, x, 0.0).ravel(), 0.0)


def log_policy(bed: Bed, theta: np.ndarray) -> np.ndarray:
    """log softmax over the legal actions of each node ([N, A], -inf where illegal)."""
    z = np.where(bed.legal, theta, -np.inf)
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


@dataclass
class Eval:
    logp: np.ndarray  # [M] log π(τ | c)
    prob: np.ndarray  # [M] π(τ | c)
    success: float
    kl: float


def evaluate(bed: Bed, logpi: np.ndarray) -> Eval:
    lp = _flat(bed, logpi)[bed.fi].sum(axis=1)
    lp0 = bed.lp0
    prob = np.exp(lp)
    w = bed.pc[bed.c] * prob
    with np.errstate(invalid="ignore"):
        kl = np.where(prob > 0, w * (lp - lp0), 0.0).sum()
    return Eval(lp, prob, float(w @ bed.success), float(kl))


def _sum_at(index: np.ndarray, per_row: np.ndarray, size: int) -> np.ndarray:
    """out[i] = Σ per_row[m] over the (m, t) with index[m, t] == i."""
    return np.bincount(index.ravel(), weights=np.repeat(per_row, index.shape[1]), minlength=size)


def _scatter(bed: Bed, g_traj: np.ndarray, logpi: np.ndarray) -> np.ndarray:
    """dL/dθ [N, A] from dL/dlog π(τ) per trajectory row (softmax Jacobian per node)."""
    g = _sum_at(bed.fi, g_traj, bed.sentinel + 1)[:-1].reshape(bed.legal.shape)
    pi = np.where(bed.legal, np.exp(logpi), 0.0)
    return np.where(bed.legal, g - pi * g.sum(axis=1, keepdims=True), 0.0)


def abstract_history(s: BedDesign, history: Sequence[str]) -> tuple:
    """The node of a real dialogue (agent and human messages alternating, agent first):
    per question the action it is (the first fact it names, else vague) and whether the
    reply told anything."""
    h = []
    for question_text, reply in zip(history[0::2], history[1::2]):
        named = tb.named_facts(s, question_text)
        told = tb.told_values(s, [reply])
        a = named[0] if named else s.facts
        h.append((a, told[a] is not None if a < s.facts else any(v is not None for v in told)))
    return tuple(h)


@lru_cache(maxsize=8)
def optimal_policy(design: BedDesign) -> dict[tuple, int]:
    """The optimal policy's action per history (`optimum`), built once per bed."""
    return optimum(build(design))[1]


def optimal_action(s: BedDesign, h: tuple, order: Sequence[int] | None = None) -> int:
    """The optimal policy's action at node `h`; with `order` (a permutation of the facts),
    the same agent with its facts relabelled, fact order[k] taking the part of fact k.
    On the presets every fact has the same probabilities, so a relabelled agent is as good
    (tests/testbed/test_exact.py checks it on default and long); with a random
    order per dialogue it asks a random side first, and what it asks next depends on which
    question it asked (the fixed order needs only the turn and whether it was told)."""
    order = tuple(range(s.facts)) if order is None else tuple(order)
    if sorted(order) != list(range(s.facts)):
        raise ValueError(f"order {order}: not a permutation of the {s.facts} facts")
    rank = {f: k for k, f in enumerate(order)}
    a = optimal_policy(s).get(tuple((rank.get(b, b), told) for b, told in h), s.facts + 1)
    return order[a] if a < s.facts else a


def optimal_message(design: str | BedDesign, history: Sequence[str], order: Sequence[int] | None = None) -> str:
    """The optimal scripted agent's next message after a real dialogue: the question the
    optimal policy asks, or its answer (what was told, the guess for the rest); `order`
    relabels its facts (`optimal_action`)."""
    s = tb.design(design)
    h = abstract_history(s, history)
    a = optimal_action(s, h, order)
    if a == s.facts + 1 or len(h) >= s.turns - 1:
        return tb.answer_text(s, tb.guess_values(s, tb.told_values(s, history[1::2])))
    return s.questions()[a]


# ---- reference points: warm start, optimum, one round of RFT -------------------------------------


def optimum(bed: Bed) -> tuple[float, dict[tuple, int]]:
    """The best success a policy that does not see c reaches, and its action per history:
    U(h) = max_a Σ_{c consistent with h} P(c)·(success after a), by backward induction."""
    s, n = bed.design, bed.design.facts

    def value(h: tuple, members: list[tuple[int, frozenset[int]]], policy: dict) -> float:
        best, best_a = -1.0, n + 1
        for a in range(n + 2):
            if len(h) == s.turns - 1 and a != n + 1:
                continue
            if a == n + 1:
                v = sum(bed.pc[ci] for ci, known in members if succeeds(bed.cs[ci], known))
            else:
                split: dict[bool, list] = {True: [], False: []}
                for ci, known in members:
                    new = revealed(s, bed.cs[ci], [a] if a < n else [])
                    split[bool(new)].append((ci, known | new))
                v = sum(value(h + ((a, told),), ms, policy) for told, ms in split.items() if ms)
            if v > best + 1e-12:
                best, best_a = v, a
        policy[h] = best_a
        return best

    policy: dict[tuple, int] = {}
    return value((), [(ci, frozenset()) for ci in range(len(bed.cs))], policy), policy


def success_given_c(bed: Bed, logpi: np.ndarray) -> dict[C, float]:
    """P(success | c) of a tabular policy, per c."""
    ev = evaluate(bed, logpi)
    per = np.bincount(bed.c, weights=ev.prob * bed.success, minlength=len(bed.cs))
    return dict(zip(bed.cs, per.tolist()))


def optimal_logpi(bed: Bed, shuffled: bool = False) -> np.ndarray:
    """The optimal agent's log-policy over the bed's nodes; `shuffled`: the mixture of its
    relabelled copies (`optimal_action`), one order of the facts drawn per dialogue."""
    orders = list(itertools.permutations(range(bed.design.facts))) if shuffled else [None]
    prob = np.zeros(bed.legal.shape)
    for order in orders:
        for i, h in enumerate(bed.nodes):
            prob[i, optimal_action(bed.design, h, order)] += 1.0 / len(orders)
    with np.errstate(divide="ignore"):
        return np.log(prob)


def expected_success_on(design: str | BedDesign, tasks: Sequence, policy: str = "explorer") -> float:
    """The exact mean success of the explorer (π0), the optimal policy or the optimal agent
    with its facts in a random order per dialogue ("optimal_shuffled", `optimal_action`) on
    these tasks (each task's c read from its reference): what rollouts of the real env
    estimate."""
    bed = build(design)
    if policy == "explorer":
        logpi = bed.logp0
    elif policy in ("optimal", "optimal_shuffled"):
        logpi = optimal_logpi(bed, shuffled=policy == "optimal_shuffled")
    else:
        raise ValueError(f"policy must be 'explorer', 'optimal' or 'optimal_shuffled', got {policy!r}")
    per_c = success_given_c(bed, logpi)
    return sum(per_c[c_of_reference(bed.design, t.hidden)] for t in tasks) / len(tasks)
