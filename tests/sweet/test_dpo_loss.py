"""The DPO + NLL loss and the SFT loss against hand-computed values, and DPO against TRL's DPOTrainer."""

import math

import pytest
import torch

from sweet.algorithms.losses import dpo_loss


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


def test_ipo_loss_one_pair_by_hand():
    # per-token log-ratios: chosen (−10 + 12) / 4 = 0.5, rejected (−15 + 14) / 2 = −0.5, Δ = 1.0
    # β = 0.25: target 1/(2β) = 2; L_IPO = (1 − 2)² = 1; dL/dπc = 2(Δ − 2)/4 = −0.5, dL/dπr = −2(Δ − 2)/2 = 1
    pc, pr = _t(-10.0).requires_grad_(), _t(-15.0).requires_grad_()
    loss, m = dpo_loss(pc, pr, _t(-12.0), _t(-14.0), _t(4), beta=0.25, loss_type="ipo", rejected_token_counts=_t(2))
    assert loss.item() == pytest.approx(1.0) and m["loss/dpo"] == pytest.approx(1.0)
    assert m["rewards/margin"] == pytest.approx(0.25 * (2 + 1))  # the implicit rewards, whatever the loss
    loss.backward()
    assert pc.grad.item() == pytest.approx(-0.5) and pr.grad.item() == pytest.approx(1.0)


def test_ipo_stops_at_its_target_margin_where_dpo_keeps_pushing():
    """At Δ = 1/(2β), IPO's gradient is zero and past it IPO pulls back; DPO's never vanishes."""
    for rejected, sign in ((-14.0 - 10.0, 0), (-14.0 - 12.0, 1)):  # Δ = 5 = 1/(2·0.1), then Δ = 6
        pc, pr = _t(-12.0).requires_grad_(), _t(rejected).requires_grad_()
        loss, _ = dpo_loss(pc, pr, _t(-12.0), _t(-14.0), _t(1), beta=0.1, loss_type="ipo", rejected_token_counts=_t(2))
        loss.backward()
        assert pr.grad.item() == pytest.approx(-sign * 2 * 1 / 2)  # dL/dπr = −2(Δ − 5)/2: raises the rejected back
        pd = _t(rejected).requires_grad_()
        dpo, _ = dpo_loss(_t(-12.0), pd, _t(-12.0), _t(-14.0), _t(1), beta=0.1)
        dpo.backward()
        assert pd.grad.item() > 0  # DPO still lowers the rejected action


def test_unknown_loss_type_and_ipo_without_counts_are_refused():
    with pytest.raises(ValueError, match="loss_type must be one of 'sigmoid', 'ipo', got 'hinge'"):
        dpo_loss(_t(-1.0), _t(-2.0), _t(-1.0), _t(-1.0), _t(1), loss_type="hinge")
    with pytest.raises(ValueError, match="needs rejected_token_counts"):
        dpo_loss(_t(-1.0), _t(-2.0), _t(-1.0), _t(-1.0), _t(1), loss_type="ipo")


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_loss_matches_trl_dpo_trainer(tmp_path, loss_type):
    """TRL's DPOTrainer (loss_type [loss_type, "sft"], weights [1, α]) as the oracle, on the
    tiny model with a policy moved away from its reference: same loss from the same
    sequences. (TRL's "sft" term is a token mean over the batch's chosen tokens; with one
    pair per batch it is our per-token NLL of the chosen action.)"""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from engines.tiny import tiny_model_path
    from sweet.core.logprobs import segment_logps
    from sweet.core.models import load_tokenizer
    from sweet.core.tokens import Segment

    torch.manual_seed(0)
    tok = load_tokenizer("tiny")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.float32)
    data = Dataset.from_list([{"prompt": "Is the word apple?", "chosen": " yes it is", "rejected": " no, river"}])
    beta, alpha = 0.5, 0.3
    args = DPOConfig(output_dir=str(tmp_path), beta=beta, loss_type=[loss_type, "sft"], loss_weights=[1.0, alpha],
                     per_device_train_batch_size=1, report_to=[], use_cpu=True, max_length=None, bf16=False,
                     save_strategy="no")
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the reference model is TRL's own frozen copy
    batch = next(iter(trainer.get_train_dataloader()))  # rows: [chosen, rejected]
    trainer.model.train()
    want = trainer.compute_loss(trainer.model, batch).item()

    segments = []
    for ids, attn, completion in zip(batch["input_ids"], batch["attention_mask"], batch["completion_mask"]):
        real, comp = ids[attn.bool()].tolist(), completion[attn.bool()].tolist()
        segments.append(Segment(tuple(real[: comp.index(1)]), tuple(real[comp.index(1):])))
    pad = int(tok.pad_token_id)
    with torch.no_grad():
        logps, counts = segment_logps(trainer.model, segments, pad_id=pad, max_length=None, keep_head=0)
        ref, _ = segment_logps(trainer.ref_model, segments, pad_id=pad, max_length=None, keep_head=0)
    loss, m = dpo_loss(logps[:1], logps[1:], ref[:1], ref[1:], counts[:1], beta=beta, nll_coef=alpha,
                       loss_type=loss_type, rejected_token_counts=counts[1:])
    assert counts[0] != counts[1]  # IPO's per-token log-ratios differ from a shared length's
    assert m["loss/dpo"] > 0.01 and m["rewards/margin"] != 0  # a real DPO term, not log 2 at margin 0
    assert loss.item() == pytest.approx(want, rel=1e-5)
