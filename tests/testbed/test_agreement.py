"""The agreement with A* a critic needs for stage 2 to reach MT-DPO
(testbed/agreement.py): the measure by hand on a tiny bed, the noisy
critics' curve, the threshold against its table, and the CLI."""

import json

import pytest

from testbed import agreement as ta
from testbed import mdp, predict
from testbed import bed as tb

# 1 fact, 2 turns (as tests/testbed/test_exact.py): ask, the vague question or answer, then answer.
TINY = tb.BedDesign("tiny", facts=1, turns=2, p_state=0.75, p_doc=0.35, p_guess_right=0.5, p_ask=0.75)
PI0 = {"answer": 0.25, "ask": 0.375, "vague": 0.375}  # p_ask 0.75 over two questions


@pytest.fixture(scope="module")
def default_agreement():
    base = predict.predict("default")
    return base, ta.agreement_needed("default", base=base)


def test_population_agreement_by_hand():
    import numpy as np

    bed = mdp.build(TINY)
    oracle = ta.score_table(bed, predict.oracle_scores(bed))
    assert ta.population_agreement(bed, oracle).overall == 1.0  # the oracle orders every pair as itself
    assert ta.population_agreement(bed, -oracle).overall == 0.0  # reversed: none
    flat = ta.population_agreement(bed, np.zeros_like(oracle))  # every pair a tie: half each, none split
    assert flat.overall == 0.5 and flat.per_turn == {0: 0.5} and flat.ties_split == 0.0
    # TINY's one choice is turn 0: answer (Q* = lucky), ask (stated or lucky), vague (doc or lucky). Pairs
    # with differing Q*, weighted by P(c)·π0(a)π0(b) (π0 0.25 / 0.375 / 0.375), all ordered by a critic
    # that scores ask > vague > answer except where the oracle has vague above ask (doc, not stated, unlucky:
    # P = 0.35 · 0.25 · 0.5, the pair ask-vague weight 0.375²)
    ranked = np.tile([1.0, 0.5, 0.0], (len(oracle), 1))
    wrong = 0.35 * 0.25 * 0.5 * 0.375 ** 2
    total = 0.0
    for c, p in mdp.c_types(TINY):
        q = {"answer": float(c.lucky[0]), "ask": float(c.stated[0] or c.lucky[0]), "vague": float(c.doc or c.lucky[0])}
        for a, b in (("answer", "ask"), ("answer", "vague"), ("ask", "vague")):
            total += p * PI0[a] * PI0[b] * (q[a] != q[b])
    assert ta.population_agreement(bed, ranked).overall == pytest.approx(1 - wrong / total)


def test_noisy_critics_go_from_the_oracle_towards_chance(default_agreement):
    import numpy as np

    base, a = default_agreement
    assert set(a.curves) == set(ta.FAMILIES) and [r.sigma for r in a.curves["ties_broken"]] == list(ta.SIGMAS)
    for family, rows in a.curves.items():
        oracle = rows[0]  # σ 0: the oracle itself, agreement 1, the same stage 2 as sweet_oracle
        assert oracle.sigma == 0 and oracle.agreement.overall == 1.0
        assert set(oracle.agreement.per_turn.values()) == {1.0}
        for k in predict.KL_LEVELS:
            assert oracle.success[k] == pytest.approx(base.methods["sweet_oracle"][k].success, abs=1e-12)
        # one draw of ε serves every σ: agreement can only fall along the grid
        agreement = [r.agreement.overall for r in rows]
        assert all(x >= y - 1e-12 for x, y in zip(agreement, agreement[1:])), (family, agreement)
        assert agreement[-1] < 0.8, (family, agreement)
    assert all(r.agreement.ties_split == 1.0 for r in a.curves["ties_broken"][1:])
    assert all(r.agreement.ties_split == 0.0 for r in a.curves["ties_kept"])
    # far noisier than Q*'s 0-1 range: a coin flip per pair
    bed = mdp.build("default")
    oracle = ta.score_table(bed, predict.oracle_scores(bed))
    noise = np.random.default_rng(1).standard_normal((4, *oracle.shape))
    chance = np.mean([ta.population_agreement(bed, oracle + 1e4 * eps, oracle).overall for eps in noise])
    assert chance == pytest.approx(0.5, abs=0.06)


def test_needed_agreement_interpolates_where_stage2_falls_below_mtdpo():
    def row(sigma: float, agree: float, s: float) -> ta.NoisyCritic:
        return ta.NoisyCritic(sigma, ta.Agreement(agree, {0: agree}, 0.0), {1.0: s}, {1.0: 1.0})

    curve = [row(0.0, 1.0, 0.80), row(0.1, 0.9, 0.70), row(0.2, 0.8, 0.60)]
    n = ta.needed_agreement(curve, 1.0, 0.65)  # halfway from 0.70 to 0.60: agreement 0.85, σ 0.15
    assert n.status == "interpolated" and n.agreement == pytest.approx(0.85) and n.sigma == pytest.approx(0.15)
    assert n.per_turn == {0: pytest.approx(0.85)}
    assert ta.needed_agreement(curve, 1.0, 0.81).status == "none"  # not even the oracle
    end = ta.needed_agreement(curve, 1.0, 0.5)  # every critic on the grid: at most the noisiest's
    assert end.status == "grid_end" and end.agreement == 0.8


def test_needed_agreement_on_default_matches_its_table(default_agreement):
    import numpy as np

    _, a = default_agreement
    for family, rows in a.curves.items():
        for k, n in a.needed[family].items():
            target = a.mtdpo[k].success
            # per the theory, the oracle is below MT-DPO at KL 0.5 and 1 on `default`: no agreement suffices
            assert (n.status == "none") == (rows[0].success[k] < target)
            if n.status == "interpolated":  # at the needed agreement, the table's success is MT-DPO's
                i = max(i for i, r in enumerate(rows) if r.sigma <= n.sigma)  # n lies between rows i and i + 1
                sigmas = [r.sigma for r in rows[i: i + 2]]
                assert np.interp(n.sigma, sigmas, [r.success[k] for r in rows[i: i + 2]]) == pytest.approx(target)
                agreement = [r.agreement.overall for r in rows[i: i + 2]]
                assert np.interp(n.sigma, sigmas, agreement) == pytest.approx(n.agreement)
                assert all(r.success[k] >= target for r in rows[: i + 1]) and rows[i + 1].success[k] < target
    assert a.needed["ties_broken"][0.5].status == "none" and a.needed["ties_broken"][1.0].status == "none"
    assert set(a.learned) == {"sweet", "sweet_no_info"}
    assert 0.5 < a.learned["sweet_no_info"].overall <= a.learned["sweet"].overall <= 1.0


def test_the_cli_prints_agreement_needed(capsys, default_agreement):
    assert ta.main(["--bed", "default", "--json"]) == 0
    needed = json.loads(capsys.readouterr().out)
    assert needed == json.loads(json.dumps(default_agreement[1].to_json()))  # the CLI's object is agreement_needed's
    assert set(needed["families"]) == set(ta.FAMILIES)
    assert needed["mtdpo"] == predict.predict("default").to_json()["mtdpo"]
    assert needed["families"]["ties_broken"]["needed"]["1.0"]["status"] == "none"
    assert "agreement needed to reach mtdpo: KL 0.5 none suffices" in ta.format_agreement(default_agreement[1])


@pytest.mark.slow
def test_long_bed_needs_an_agreement_the_oracle_has():
    a = ta.agreement_needed("long")
    for family in ta.FAMILIES:
        for k in (1.0, 2.0):  # the oracle is above MT-DPO on `long`
            n = a.needed[family][k]
            assert n.status != "none" and 0.5 < n.agreement <= 1.0
