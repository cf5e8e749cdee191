"""The exact solver (testbed/mdp.py, testbed/predict.py): hand-checked values on a tiny bed,
the theory's figures on the default bed, and agreement with Monte-Carlo rollouts of the
real env, scripted human and sandbox."""

import json
import itertools
import math

import pytest

from testbed.agents import ScriptedTestbedAgent
from testbed import mdp, predict
from testbed import bed as tb
from testbed.env import TestbedEnv, make_tasks
from colbench.rollout import rollout
from testbed.human import TestbedSimulator

# 1 fact, 2 turns: ask (or the vague question, or answer) once, then answer.
TINY = tb.BedDesign("tiny", facts=1, turns=2, p_state=0.75, p_doc=0.35, p_guess_right=0.5, p_ask=0.75)
# P(success | first action), the second turn answering with what was told and the guess:
Q_ANSWER = 0.5  # the guess is right on half of the tasks
Q_ASK = 0.75 + 0.25 * 0.5  # stated (0.75), else the guess: 0.875
Q_VAGUE = 0.35 + 0.65 * 0.5  # a docstring (0.35), else the guess: 0.675
PI0 = {"answer": 0.25, "ask": 0.375, "vague": 0.375}  # p_ask 0.75 over two questions
WARM = 0.25 * Q_ANSWER + 0.375 * Q_ASK + 0.375 * Q_VAGUE  # 0.125 + 0.328125 + 0.253125 = 0.70625


def test_tiny_bed_by_hand():
    bed = mdp.build(TINY)
    assert len(bed.cs) == 8 and sum(bed.pc) == pytest.approx(1.0)  # stated x doc x lucky
    assert mdp.evaluate(bed, bed.logp0).success == pytest.approx(WARM)
    best, policy = mdp.optimum(bed)
    assert best == pytest.approx(Q_ASK) and policy[()] == 0  # ask, then answer: 0.875
    # one round of RFT: π1(a) = π0(a)·Q(a)/V, so success Σ π0 Q² / V and KL Σ π1 log(Q/V)
    rft = mdp.evaluate(bed, predict.rft_round(bed, bed.logp0))
    q = {"answer": Q_ANSWER, "ask": Q_ASK, "vague": Q_VAGUE}
    pi1 = {a: PI0[a] * q[a] / WARM for a in q}
    assert rft.success == pytest.approx(sum(pi1[a] * q[a] for a in q))  # 0.52046875 / 0.70625 = 0.73695
    assert rft.kl == pytest.approx(sum(pi1[a] * math.log(q[a] / WARM) for a in q))
    # RFT's flow reaches KL 0.01 on its way to its round (KL 0.022) and stops there, flagged;
    # the DPO flows move toward asking and reach both levels
    points = predict.predict(TINY, levels=(0.01, 0.5))
    assert not points.methods["rft"][0.5].reached and points.methods["rft"][0.5].kl == pytest.approx(rft.kl)
    assert points.methods["rft"][0.01].reached and WARM < points.methods["rft"][0.01].success < rft.success
    for name in ("mtdpo", "sweet_oracle", "sweet"):
        low, high = points.methods[name][0.01], points.methods[name][0.5]
        assert low.reached and high.reached and WARM < low.success < high.success <= Q_ASK


def test_an_explorer_that_never_answers_early_gives_impossible_dialogues_no_mass():
    """p_ask 1 (the warm start's copy phase) or 0: π0 gives some actions no mass; those
    dialogues are dropped, so probabilities sum to 1 and success is the hand value."""
    from dataclasses import replace

    always = replace(TINY, p_ask=1.0)  # ask or the vague question, half each, then answer
    bed = mdp.build(always)
    ev = mdp.evaluate(bed, bed.logp0)
    assert (bed.pc[bed.c] * ev.prob).sum() == pytest.approx(1.0)
    assert ev.success == pytest.approx(0.5 * Q_ASK + 0.5 * Q_VAGUE)
    never = mdp.build(replace(TINY, p_ask=0.0))
    assert mdp.evaluate(never, never.logp0).success == pytest.approx(Q_ANSWER)
    # default: questions uniform on both turns, never answering early: 0.60625
    # (testbed/results/2026-12-02-default-critic-credit.md)
    default = mdp.build(replace(tb.design("default"), p_ask=1.0))
    assert mdp.evaluate(default, default.logp0).success == pytest.approx(0.60625)


def test_simple_rules_by_hand():
    """RULES: uniform over what a rule allows. TINY has one question turn: never answering
    early asks or asks the vague question, half each; asking a side before the vague
    question leaves only the side question, the optimum."""
    points = predict.rule_points(mdp.build(TINY))
    never_early, no_repeat, sides_first = (points[name] for name in predict.RULES)
    assert never_early.success == pytest.approx(0.5 * Q_ASK + 0.5 * Q_VAGUE)
    assert never_early.kl == pytest.approx(2 * 0.5 * math.log(0.5 / PI0["ask"]))  # the answer turn is forced
    assert no_repeat == never_early  # nothing to repeat in one question
    assert sides_first.success == pytest.approx(Q_ASK) and sides_first.kl == pytest.approx(-math.log(PI0["ask"]))
    # legacy (4 turns, every constant stated, the guess never right): three questions that
    # never repeat ask both sides, so success is certain; never answering early is not enough
    legacy = predict.rule_points(mdp.build("legacy"))
    assert legacy["and never repeat a question"].success == pytest.approx(1.0)
    assert legacy["never answer early"].success < 0.5
    # default: never answering early is the explorer with p_ask 1 (0.60625, by another road);
    # not repeating a question, which needs no c, goes well past 40% of the way
    # (testbed/results/2026-12-02-default-critic-credit.md)
    default = predict.rule_points(mdp.build("default"))
    assert default["never answer early"].success == pytest.approx(0.60625)
    assert default["and never repeat a question"].success == pytest.approx(0.678, abs=5e-4)
    assert default["and ask a side before the vague question"].success == pytest.approx(0.700, abs=5e-4)


def test_exact_advantage_by_hand():
    unlucky = "def f(x):\n    return x * 3\n"  # stated, no docstring, the guess (2) wrong: V* = 1 by asking
    lucky = 'def f(x):\n    return x * int("2")\n'  # not stated, but the guess is right: V* = 1 by answering
    ask, vague = "What happens to positive numbers?", "Can you tell me more?"
    guess, right = tb.answer_text(TINY, (2,)), tb.answer_text(TINY, (3,))
    assert [mdp.exact_advantage(TINY, unlucky, [], a, 2) for a in (ask, vague, guess, right)] == [0, -1, -1, 0]
    told = ["For positive numbers it is x * 3."]
    assert [mdp.exact_advantage(TINY, unlucky, told, a, 1) for a in (right, guess, ask)] == [0, -1, -1]
    assert [mdp.exact_advantage(TINY, lucky, [], a, 2) for a in (ask, vague, guess)] == [0, 0, 0]
    with pytest.raises(ValueError, match="turns_left"):
        mdp.exact_advantage(TINY, lucky, [], ask, 0)


def test_stage2_pairs_by_hand():
    # two candidates from (0.5, 0.5): one of each with p 0.5, then the better vs the worse
    assert predict.candidate_pairs((0.5, 0.5), (1, 0), 2) == ((0.0, 0.5), (0.0, 0.0))
    assert predict.candidate_pairs((0.5, 0.5), (0, 0), 2) == ((0.0, 0.0), (0.0, 0.0))  # ties are dropped
    # four candidates from (1/2, 1/2, 0): top half two, bottom half two
    m = predict.candidate_pairs((0.5, 0.5, 0.0), (1, 0, -1), 4)
    # counts (4,0): none; (3,1): p 1/4, top = 2 a, bottom = 1 a + 1 b -> P(a, b) = 1/2; (2,2): p 3/8, 1;
    # (1,3): p 1/4, top = a + b, bottom = 2 b -> 1/2; (0,4): none
    assert m[0][1] == pytest.approx(0.25 * 0.5 + 0.375 * 1 + 0.25 * 0.5) and m[1][0] == 0.0


def test_default_bed_reproduces_the_theory(capsys):
    assert predict.main(["--bed", "default", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"warm_start", "optimum", "rft", "mtdpo", "sweet", "sweet_no_info", "sweet_oracle"} <= set(out)
    # exactly the independent analysis's figures (in brackets in testbed/predict.py's docstring)
    assert out["warm_start"] == pytest.approx(0.490, abs=5e-4) and out["optimum"] == pytest.approx(0.784, abs=5e-4)
    assert [r["success"] for r in out["rft_rounds"]] == pytest.approx([0.556, 0.608], abs=5e-4)
    assert out["kl"]["rft"]["1.0"] == pytest.approx(0.073, abs=5e-4) and not out["reached"]["rft"]["1.0"]
    assert out["pair_accuracy"]["sweet"] == 1.0 and out["pair_accuracy"]["sweet_no_info"] == pytest.approx(0.921, abs=2e-3)
    # the theory's DPO figures within 0.025 (its pairing weights differ: see the module doc)
    theory = {"mtdpo": (0.704, 0.782), "sweet": (0.696, 0.766), "sweet_no_info": (0.643, 0.734)}
    for name, (kl1, kl2) in theory.items():
        assert out[name]["1.0"] == pytest.approx(kl1, abs=0.025) and out[name]["2.0"] == pytest.approx(kl2, abs=0.025)
    for kl in ("0.5", "1.0", "2.0"):
        assert out["rft"][kl] < out["mtdpo"][kl] and out["rft"][kl] < out["sweet"][kl]
        assert out["sweet_no_info"][kl] < out["sweet"][kl] <= out["optimum"]
    assert list(out["rules"]) == list(predict.RULES) and out["rules"]["never answer early"]["success"] == 0.6062


@pytest.mark.slow
def test_long_bed_puts_the_exact_critic_above_trajectory_dpo():
    p = predict.predict("long")
    gaps = {k: p.methods["sweet_oracle"][k].success - p.methods["mtdpo"][k].success for k in predict.KL_LEVELS}
    assert max(gaps.values()) >= 0.05, gaps


@pytest.mark.parametrize("design", ["default", "long"])
def test_the_relabelled_optimal_agent_is_optimal_and_reads_its_questions(design):
    """Every order of the facts gives an optimal agent (the facts share their
    probabilities), so their mixture ("optimal_shuffled") reaches the optimum exactly; its
    second question depends on which side it asked first, so no policy that ignores the
    question asked can imitate it."""
    bed = mdp.build(design)
    s = bed.design
    best = mdp.optimum(bed)[0]
    assert mdp.evaluate(bed, mdp.optimal_logpi(bed, shuffled=True)).success == pytest.approx(best, abs=1e-12)
    assert all(mdp.optimal_action(s, h) == a for h, a in mdp.optimal_policy(s).items())
    first = {mdp.optimal_action(s, (), order) for order in itertools.permutations(range(s.facts))}
    assert first == set(range(s.facts))  # a random order asks a random side first
    # told on fact 0 or on fact 1: the relabelled agents ask different next questions, never the same one again
    for order in itertools.permutations(range(s.facts)):
        q = mdp.optimal_action(s, (), order)
        nxt = mdp.optimal_action(s, ((q, True),), order)
        assert nxt != q and nxt < s.facts + 1
    with pytest.raises(ValueError, match="not a permutation"):
        mdp.optimal_action(s, (), (0, 0) + tuple(range(2, s.facts)))


def _mc(design: str, split: str, seeds: int):
    """Explorer and optimal-agent rollouts of the real env + scripted human + sandbox."""
    tasks = make_tasks(split, bed=design)
    env = TestbedEnv(bed=design)
    try:
        return tasks, {kind: rollout(env, tasks, ScriptedTestbedAgent(kind), TestbedSimulator(), seeds=range(seeds))
                       for kind in ("explorer", "optimal")}
    finally:
        env.close()


def _check_mc(design: str, split: str, seeds: int) -> None:
    tasks, eps = _mc(design, split, seeds)
    for kind, episodes in eps.items():
        rate = sum(e.success for e in episodes) / len(episodes)
        exact = mdp.expected_success_on(design, tasks, kind)
        half = 1.96 * math.sqrt(max(exact * (1 - exact), 1e-12) / len(episodes))  # episode noise, tasks fixed
        assert abs(rate - exact) <= half + 1e-9, (kind, rate, exact, half)
        if kind == "optimal":  # deterministic given c: every episode of a task alike
            assert rate == pytest.approx(exact)


@pytest.mark.parametrize("design", ["default", "legacy"])
def test_warm_start_and_optimum_equal_real_rollouts(design):
    _check_mc(design, "train", seeds=4)  # 224 episodes per agent, a few seconds of sandbox


@pytest.mark.slow
def test_long_bed_equals_real_rollouts():
    _check_mc("long", "test", seeds=8)


def test_population_values_are_the_task_average_in_the_limit():
    """The solver's population warm start equals its exact per-task expectation averaged
    over the bed's c distribution (checked on every c, each as one task)."""
    bed = mdp.build("default")
    per_c = mdp.success_given_c(bed, bed.logp0)
    assert sum(p * per_c[c] for c, p in zip(bed.cs, bed.pc)) == pytest.approx(mdp.evaluate(bed, bed.logp0).success)
    s = tb.design("default")
    for c in bed.cs[:8]:
        h = tb.Hidden(tuple(f.values[0] if lucky else f.values[1] for f, lucky in zip(s.fact_list, c.lucky)),
                      c.stated, c.doc)
        assert mdp.c_of_reference(s, tb.reference_source(s, h)) == c


def test_finite_samples_use_the_papers_pairing_and_the_budget():
    import numpy as np

    bed = mdp.build(TINY)
    win, lose = [int(m) for m in np.nonzero(bed.success == 1)[0][:1]], [int(m) for m in np.nonzero(bed.success == 0)[0][:2]]
    rows = np.array([[lose[0], win[0], lose[1], win[0]],  # chosen = the first success, rejected = both failures
                     [win[0]] * 4,  # no failure: no pair
                     [lose[0]] * 4])  # no success: no pair
    pairs = predict.sampled_pairs(bed, rows)
    assert len(pairs.blocks) == 1
    chosen, rejected, w = pairs.blocks[0]
    assert chosen.tolist() == win and rejected.tolist() == lose and w.tolist() == [[0.5, 0.5]]
    rng = np.random.default_rng(0)
    task_c, sampled = predict.sample_episodes(bed, 56, 8, rng)
    assert sampled.shape == (56, 8) and all(bed.c[r] == c for c, rs in zip(task_c, sampled) for r in rs)
    finite = predict.predict_finite(TINY, reps=2, levels=(0.01, 0.5))
    assert set(finite) == set(predict.METHODS)
    for name, by_level in finite.items():
        for mean, se, reached in by_level.values():
            assert 0 <= mean <= Q_ASK + 1e-9 and se >= 0 and 0 <= reached <= 1  # the optimum bounds every policy
