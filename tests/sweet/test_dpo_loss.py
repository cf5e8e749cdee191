"""The DPO + NLL loss and the SFT loss against hand-computed values."""

import math

import pytest
import torch

from sweet.dpo import dpo_loss, sft_loss


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_dpo_loss_one_pair_by_hand():
    # chosen reward   = β (πc − refc) = 0.1 (−10 + 12) = 0.2
    # rejected reward = β (πr − refr) = 0.1 (−15 + 14) = −0.1
    # h = 0.3; L_DPO = −log σ(0.3) = log(1 + e^−0.3) = 0.554355...
    # L_NLL = 10 / 4 tokens = 2.5; L = 0.554355 + 0.01 · 2.5
    loss, m = dpo_loss(_t(-10.0), _t(-15.0), _t(-12.0), _t(-14.0), _t(4), beta=0.1, nll_coef=0.01)
    expected_dpo = math.log1p(math.exp(-0.3))
    assert expected_dpo == pytest.approx(0.5543552, abs=1e-7)
    assert loss.item() == pytest.approx(expected_dpo + 0.025, abs=1e-9)
    assert m["loss/dpo"] == pytest.approx(expected_dpo)
    assert m["loss/nll"] == pytest.approx(2.5)
    assert m["rewards/chosen"] == pytest.approx(0.2)
    assert m["rewards/rejected"] == pytest.approx(-0.1)
    assert m["rewards/margin"] == pytest.approx(0.3)
    assert m["rewards/accuracy"] == 1.0
    assert m["logps/chosen"] == -10.0 and m["logps/rejected"] == -15.0


def test_dpo_loss_batch_mean_and_wrong_way_pair():
    # pair 2: chosen reward 0.1 (−3 + 2) = −0.1, rejected 0.1 (−3 + 4) = 0.1, h = −0.2
    # L_DPO(pair 2) = log(1 + e^0.2) = 0.798139...; NLL(pair 2) = 3 / 2 = 1.5
    loss, m = dpo_loss(_t(-10.0, -3.0), _t(-15.0, -3.0), _t(-12.0, -2.0), _t(-14.0, -4.0), _t(4, 2),
                       beta=0.1, nll_coef=0.0)
    dpo1, dpo2 = math.log1p(math.exp(-0.3)), math.log1p(math.exp(0.2))
    assert dpo2 == pytest.approx(0.7981389, abs=1e-7)
    assert loss.item() == pytest.approx((dpo1 + dpo2) / 2)
    assert m["loss/nll"] == pytest.approx((2.5 + 1.5) / 2)  # reported even with α = 0
    assert m["rewards/accuracy"] == 0.5
    assert m["rewards/margin"] == pytest.approx((0.3 - 0.2) / 2)


def test_dpo_gradients_by_hand():
    # dL/dπc = −β σ(−h) − α / |y_w|,  dL/dπr = +β σ(−h);  h = 0.3
    pc, pr = _t(-10.0).requires_grad_(), _t(-15.0).requires_grad_()
    loss, _ = dpo_loss(pc, pr, _t(-12.0), _t(-14.0), _t(4), beta=0.1, nll_coef=0.01)
    loss.backward()
    s = 1 / (1 + math.exp(0.3))  # σ(−0.3)
    assert pc.grad.item() == pytest.approx(-0.1 * s - 0.01 / 4)
    assert pr.grad.item() == pytest.approx(0.1 * s)


def test_beta_scales_the_margin():
    _, m1 = dpo_loss(_t(-1.0), _t(-2.0), _t(-1.0), _t(-1.0), _t(1), beta=0.1)
    _, m2 = dpo_loss(_t(-1.0), _t(-2.0), _t(-1.0), _t(-1.0), _t(1), beta=0.5)
    assert m1["rewards/margin"] == pytest.approx(0.1) and m2["rewards/margin"] == pytest.approx(0.5)
    assert m2["loss/dpo"] == pytest.approx(math.log1p(math.exp(-0.5)))


def test_sft_loss_is_token_mean():
    # −(−6 − 2) / (3 + 1) = 2
    loss, m = sft_loss(_t(-6.0, -2.0), _t(3, 1))
    assert loss.item() == pytest.approx(2.0)
    assert m["logps/action_mean"] == pytest.approx((-2.0 + -2.0) / 2)
