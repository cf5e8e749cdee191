"""The solver's pairing is stage 2's own: `testbed.predict` builds its sampled stage-2 pairs on
`sweet.algorithms.sweet_rl.rank_halves`, the pure function behind `make_action_pairs`, and its
population-limit pairing (`candidate_pairs`, the expectation) agrees with `make_action_pairs`
on sampled candidates."""

import random

import numpy as np
import pytest

from sweet.algorithms.sweet_rl import make_action_pairs, rank_halves
from sweet.core.records import Candidate, State
from testbed import predict


def test_rank_halves_is_a_stable_sort_highest_first_and_leaves_an_odd_median_out():
    assert rank_halves([0.9, 0.1, 0.5, 0.3, 0.7]) == ([0, 4], [3, 1])
    assert rank_halves([0.2, 0.2, 0.2, 0.2]) == ([0, 1], [2, 3])  # ties keep their order
    assert rank_halves([1.0]) == ([], []) and rank_halves([]) == ([], [])


@pytest.mark.parametrize("probs, ranks, n", [((0.5, 0.3, 0.2), (2, 1, 0), 4),
                                             ((0.4, 0.4, 0.2), (1, 1, 0), 4),  # a tie in the top rank
                                             ((0.25, 0.25, 0.25, 0.25), (0, 2, 1, 2), 6)])
def test_the_solvers_expected_pairs_are_make_action_pairs_on_sampled_candidates(probs, ranks, n):
    rng, draws_per_state, states = random.Random(0), 4, 6000
    scored = []
    for i in range(states):
        state = State("t", f"t/a/{i}", 0, ({"role": "user", "content": "x"},), None, "c")
        actions = rng.choices(range(len(probs)), weights=probs, k=n)
        scored.append((state, [Candidate(state, str(a), (a,), advantage=float(ranks[a])) for a in actions]))
    pairs, _ = make_action_pairs(scored, draws_per_state, random.Random(1))
    seen = np.zeros((len(probs), len(probs)))
    for p in pairs:
        seen[int(p.chosen.text), int(p.rejected.text)] += 1
    expected = np.array(predict.candidate_pairs(probs, ranks, n))
    np.testing.assert_allclose(seen / (states * draws_per_state), expected, atol=0.012)


def test_sampled_stage2_pairs_as_before_the_shared_rule():
    """sampled_stage2 on rank_halves gives bit for bit the measure of its former inline ranking."""
    from testbed import mdp

    def inline(bed, task_c, rows, score, rng, n_candidates=8, pairs_per_state=4):
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
                    cands = rng.choice(A, size=n_candidates, p=p0[h])
                    ranked = sorted(rng.permutation(cands).tolist(), key=lambda a: -scores[a])
                    top, bottom = ranked[:half], ranked[-half:]
                    for _ in range(pairs_per_state):
                        a, b = top[rng.integers(half)], bottom[rng.integers(half)]
                        if scores[a] > scores[b] + 1e-9:
                            measure[h, a, b] += 1.0
        return measure / max(measure.sum(), 1.0)

    bed = mdp.build("default")
    task_c, rows = predict.sample_episodes(bed, 56, 8, np.random.default_rng(0))
    pairs = predict.sampled_pairs(bed, rows)
    for score in (predict.oracle_scores(bed), predict.fit_critic(bed, pairs, False, 50).score):
        got = predict.sampled_stage2(bed, task_c, rows, score, np.random.default_rng(1))
        want = inline(bed, task_c, rows, score, np.random.default_rng(1))
        assert got.sum() == pytest.approx(1.0) and np.array_equal(got, want)


def test_the_solvers_trajectory_pairs_follow_the_environments_pairing_rule(monkeypatch):
    """testbed.predict pairs sampled episodes by the test bed's own rule (its environment's
    TrainingDefaults.pairing_rule, as make_trajectory_pairs does): the best against each worse,
    or every success against every failure."""
    from colbench.envs import TrainingDefaults, env_class
    from testbed import mdp

    bed = mdp.build("default")
    ok, bad = np.nonzero(bed.success == 1)[0], np.nonzero(bed.success == 0)[0]
    rows = np.array([[ok[0], ok[1], bad[0]], [bad[1], bad[2], bad[3]]])  # two successes and a failure; none
    assert predict.pairing_rule() == "best"
    best = predict.sampled_pairs(bed, rows)
    assert [(a.tolist(), b.tolist()) for a, b, _ in best.blocks] == [([ok[0]], [bad[0]])]
    monkeypatch.setattr(env_class("testbed"), "training_defaults", TrainingDefaults(pairing_rule="all"))
    every = predict.sampled_pairs(bed, rows)
    assert [(a.tolist(), b.tolist()) for a, b, _ in every.blocks] == [([ok[0], ok[1]], [bad[0]])]
    # population limit: E[pairs per task] with K episodes of success p
    assert predict.expected_pairs_per_task("best", 0.5, 4) == pytest.approx(4 * 0.5 * (1 - 0.5 ** 3))
    assert predict.expected_pairs_per_task("all", 0.5, 4) == pytest.approx(4 * 3 * 0.25)
