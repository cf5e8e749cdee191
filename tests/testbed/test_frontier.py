"""testbed/frontier.py: success at matched KL along a path, and the paired bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from testbed import frontier


def test_interpolation_between_the_bracketing_snapshots():
    kl = [0.0, 0.4, 1.2, 2.5]
    s = [0.50, 0.60, 0.70, 0.80]
    # KL 0.5 lies between 0.4 and 1.2: 0.60 + (0.5 - 0.4) / 0.8 * 0.10 = 0.6125
    v, reached, at = frontier.interpolate(kl, s, 0.5)
    assert v == pytest.approx(0.6125) and reached and at == 0.5
    v, _, _ = frontier.interpolate(kl, s, 1.0)  # 0.60 + 0.6 / 0.8 * 0.10 = 0.675
    assert v == pytest.approx(0.675)
    v, _, _ = frontier.interpolate(kl, s, 2.0)  # 0.70 + 0.8 / 1.3 * 0.10
    assert v == pytest.approx(0.70 + 0.8 / 1.3 * 0.10)
    v, _, _ = frontier.interpolate(kl, s, 1.2)  # exactly on a snapshot
    assert v == pytest.approx(0.70)


def test_a_path_that_never_reaches_the_level_is_reported_at_its_largest_kl():
    v, reached, at = frontier.interpolate([0.0, 0.3, 0.9, 0.6], [0.5, 0.55, 0.58, 0.7], 2.0)
    assert not reached and v == 0.58 and at == 0.9  # the largest-KL point, not the last one
    v, reached, at = frontier.interpolate([0.0], [0.49], 0.5)  # the warm start alone: KL 0
    assert not reached and v == 0.49 and at == 0.0


def test_the_first_crossing_counts_and_batches_interpolate_row_by_row():
    kl = np.array([[0.0, 1.5, 0.8, 3.0], [0.0, 0.25, 0.75, 1.0]])
    s = np.array([[0.1, 0.4, 0.9, 0.9], [0.2, 0.3, 0.5, 0.6]])
    v, reached, _ = frontier.interpolate(kl, s, 0.5)
    assert v == pytest.approx([0.1 + 0.5 / 1.5 * 0.3, 0.4]) and reached.all()


def _path(tasks, success_rows, ratio_rows, n=4):
    success, ratio = np.array(success_rows, float) * n, np.array(ratio_rows, float) * n
    return frontier.TrainingPath(tuple(tasks), tuple(range(len(success_rows))), success, ratio,
                                 np.full(success.shape, n, float))


def _policy(shift=0.0, kl_scale=1.0):
    """Two seeds x three tasks; per task its success and KL along a 3-point path."""
    rng = np.random.default_rng(1)
    paths = {}
    for seed in (0, 1):
        base = rng.uniform(0.1, 0.6, size=(3, 3)).cumsum(0) / 3
        kls = np.array([[0, 0, 0], [0.6, 0.8, 0.4], [2.1, 2.5, 1.9]]) * kl_scale
        paths[seed] = _path(["t0", "t1", "t2"], base + shift, kls)
    return paths


def test_identical_policies_give_gap_zero_and_interval_zero():
    a = _policy()
    boot = frontier.Bootstrap({0: a[0].tasks, 1: a[1].tasks}, n_boot=300)
    for level in frontier.LEVELS:
        g = boot.gap(a, _policy(), level)
        assert g["measured_gap"] == 0.0 and g["ci95"] == [0.0, 0.0]


def test_a_constant_shift_is_the_gap_on_every_resample():
    a, b = _policy(), _policy(shift=0.125)
    boot = frontier.Bootstrap({0: a[0].tasks, 1: a[1].tasks}, n_boot=300)
    g = boot.gap(b, a, 1.0)
    assert g["measured_gap"] == pytest.approx(0.125) and g["ci95"] == pytest.approx([0.125, 0.125])
    at = boot.at_kl(a)
    assert set(at) == {"0.5", "1.0", "2.0"} and all(m["reached"] for m in at.values())
    lo, hi = at["1.0"]["success_rate"]["ci95"]
    assert lo <= at["1.0"]["success_rate"]["value"] <= hi and hi > lo  # task noise: a real interval


def test_pairs_are_antisymmetric_and_carry_the_predicted_gap():
    paths = {"rft": _policy(), "mtdpo": _policy(shift=0.05, kl_scale=0.8), "loop": _policy(shift=-0.02)}
    boot = frontier.Bootstrap({0: paths["rft"][0].tasks, 1: paths["rft"][1].tasks}, n_boot=300)
    predicted = {"rft": {"0.5": 0.55, "1.0": 0.556, "2.0": 0.556}, "mtdpo": {"0.5": 0.6, "1.0": 0.7, "2.0": 0.78},
                 "loop": None}
    rows = frontier.pairs(boot, paths, predicted)
    assert len(rows) == 3 * 3  # 3 pairs x 3 levels
    one = next(r for r in rows if r["a"] == "rft" and r["b"] == "mtdpo" and r["kl"] == "1.0")
    assert one["predicted_gap"] == pytest.approx(0.556 - 0.7)
    assert next(r for r in rows if r["b"] == "loop")["predicted_gap"] is None
    swapped = frontier.pairs(boot, {"mtdpo": paths["mtdpo"], "rft": paths["rft"]}, predicted)
    back = next(r for r in swapped if r["kl"] == "1.0")
    assert back["measured_gap"] == pytest.approx(-one["measured_gap"])
    assert back["ci95"] == pytest.approx([-one["ci95"][1], -one["ci95"][0]])
    assert back["predicted_gap"] == pytest.approx(-one["predicted_gap"])


def test_a_predicted_gap_is_reproduced_undecided_or_reversed_by_its_paired_interval():
    def row(g, lo, hi):
        return {"a": "x", "b": "y", "kl": "0.5", "predicted_gap": g, "measured_gap": (lo + hi) / 2, "ci95": [lo, hi]}

    rows = [row(0.09, 0.01, 0.05), row(-0.06, -0.08, -0.002),  # reproduced, either sign
            row(0.05, -0.01, 0.04),                             # the interval holds zero
            row(-0.07, 0.003, 0.03), row(0.2, -0.1, -0.01),     # excluded on the wrong side
            row(0.049, 0.02, 0.05), row(None, 0.1, 0.2)]        # not predicted apart: not counted
    assert [frontier.verdict(r) for r in rows] == ["reproduced", "reproduced", "undecided", "reversed",
                                                   "reversed", None, None]
    assert frontier.replication(rows) == {"predicted_apart": 5, "reproduced": 2, "undecided": 1, "reversed": 2}
    table = frontier.pairs_table({"pairs": rows}).splitlines()
    assert [line.endswith("] ! |") for line in table[2:9]] == [False, False, True, False, False, False, False]
    assert [line.endswith("] !! |") for line in table[2:9]] == [False, False, False, True, True, False, False]
    assert table[-1].startswith("Of the 5 (pair, KL) gaps") and "2 reproduced" in table[-1] and "2 reversed" in table[-1]


def test_the_centred_critic_is_predicted_by_the_solvers_sweet():
    from testbed.frontier import PREDICTED, solver_name

    assert solver_name("sweet_centred") == "sweet" and solver_name("mtdpo") == "mtdpo"
    assert solver_name("sweet_anchor") not in PREDICTED  # its stage 2 has no tabular counterpart


def test_the_repeat_rate_is_pooled_over_the_dialogues_that_asked_twice_and_interpolated_in_kl():
    # one seed, two tasks, a 2-point path: KL 0 then 1; task 0 asked twice 4 and 2 times, task 1 none then 2
    path = frontier.TrainingPath(("t0", "t1"), (0, 1), success=np.zeros((2, 2)),
                                 log_ratio=np.array([[0.0, 0.0], [4.0, 4.0]]), count=np.full((2, 2), 4.0),
                                 repeat=np.array([[2.0, 0.0], [0.0, 1.0]]), twice=np.array([[4.0, 0.0], [2.0, 2.0]]))
    boot = frontier.Bootstrap({0: path.tasks}, n_boot=50)
    kl, rate = path.points(np.ones(2), "repeat")
    assert kl.tolist() == [0.0, 1.0] and rate.tolist() == [0.5, 0.25]  # 2/4, then (0 + 1)/(2 + 2)
    v, reached, _ = boot.value({0: path}, 0.5, boot.ones(), "repeat")
    assert v == pytest.approx(0.375) and reached
    at = boot.at_kl({0: path})
    assert at["0.5"]["repeat_rate"]["value"] == pytest.approx(0.375)
    assert at["0.5"]["repeat_rate"]["ci95"][0] <= 0.375 <= at["0.5"]["repeat_rate"]["ci95"][1]
    # a path without repeat counts (the legacy bed) has no repeat rate
    plain = frontier.TrainingPath(path.tasks, path.steps, path.success, path.log_ratio, path.count)
    assert "repeat_rate" not in boot.at_kl({0: plain})["0.5"]
