"""The training skeleton (sweet/core/trainer.py): one optimiser step is the gradient of the
loss averaged over the WHOLE step, whatever the micro-batch size; hand-computed DPO on
trajectories whose log-prob is the sum of their turns' log-probs.

Gradients are read off an SGD step with lr 1 and no clipping: Δθ = −∇L exactly.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from sweet.core.config import ModelConfig, TrainConfig
from sweet.core.logprobs import segment_logps
from sweet.core.models import load_model
from sweet.core.records import Pair
from sweet.core.tokens import Segment
from sweet.core.trainer import Trainer, deal, epoch_order

MODEL = ModelConfig(model="tiny", dtype="float32", max_length=128, keep_head=16)


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _fresh(one_torch_thread):
    _reset_accelerate()
    yield
    _reset_accelerate()


def _segments(n: int, seed: int = 0) -> list[Segment]:
    """Random contexts (3-20 ids) and actions (1-9 ids): unequal token counts matter here."""
    rng = random.Random(seed)
    return [Segment(tuple(rng.randrange(5, 250) for _ in range(rng.randint(3, 20))),
                    tuple(rng.randrange(5, 250) for _ in range(rng.randint(1, 9)))) for _ in range(n)]


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _sgd_delta(tmp_path, micro: int, batch: int, loss_fn, count_fn, n_items: int, tokenizer) -> dict[str, torch.Tensor]:
    """Δθ of one SGD(lr=1) step of the skeleton over items 0..n_items-1."""
    _reset_accelerate()
    train = TrainConfig(output_dir=str(tmp_path / f"m{micro}"), batch_size=batch, micro_batch_size=micro,
                        max_grad_norm=1e9, report_to="none")
    trainer = Trainer(MODEL, train, tokenizer)
    before = _params(trainer.model)
    trainer.prepare(1, optimizer=torch.optim.SGD(trainer.model.parameters(), lr=1.0))
    trainer.optimizer_step(list(range(n_items)), loss_fn, count_fn)
    after = _params(trainer.accelerator.unwrap_model(trainer.model))
    return {k: after[k] - before[k] for k in before}


def _grad(loss_of_model) -> dict[str, torch.Tensor]:
    model = load_model(MODEL)
    loss_of_model(model).backward()
    return {k: -p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for k, p in model.named_parameters()}


def _assert_same(a: dict, b: dict) -> None:
    scale = max(v.abs().max().item() for v in b.values())
    assert scale > 0
    for k in b:
        assert torch.allclose(a[k], b[k], atol=1e-5 * scale, rtol=1e-4), k


# ---- dealing items -------------------------------------------------------------------------


def test_deal_gives_every_item_once_and_pads_with_weight_zero():
    items = list(range(7))
    world, micro = 2, 2
    accum = 2  # 8 slots for 7 items
    dealt = [deal(items, rank=r, world=world, micro=micro, accum=accum) for r in range(world)]
    assert all(len(d) == accum for d in dealt)  # the same number of passes on every process
    real = sorted(i for d in dealt for mb, w in d if w for i in mb)
    assert real == items
    pads = [(mb, w) for d in dealt for mb, w in d if not w]
    assert pads == []  # 7 items fill slots 0..3 (the last holds one item)
    dealt = [deal(items[:3], rank=r, world=world, micro=micro, accum=accum) for r in range(world)]
    assert [(mb, w) for mb, w in dealt[1]] == [([2], 1.0), ([0], 0.0)]  # an empty slot re-runs item 0, weight 0
    with pytest.raises(ValueError, match="do not fit"):
        deal(list(range(9)), rank=0, world=world, micro=micro, accum=accum)
    assert epoch_order(10, 0, 3) == epoch_order(10, 0, 3) != epoch_order(10, 1, 3)


# ---- token mean over the whole step (RFT, warm start) ---------------------------------------


def _token_mean_case(segs, tokenizer):
    """SFT's loss hook and count over `segs`, and the hand-computed gradient of
    L = −Σ_i log π(a_i|c_i) / Σ_i |a_i| over all of them."""
    from sweet.algorithms.policy_trainer import sft_loss_fn

    pad = int(tokenizer.pad_token_id)
    n_tokens = sum(len(s.action) for s in segs)

    def expected(model):
        sums, _ = segment_logps(model, segs, pad_id=pad, max_length=MODEL.max_length, keep_head=MODEL.keep_head)
        return -sums.sum() / n_tokens

    return sft_loss_fn(segs, MODEL, pad), (lambda i: len(segs[i].action)), _grad(expected)


def test_token_mean_step_is_the_same_for_any_micro_batch(tmp_path, tiny_tokenizer):
    loss_fn, count_fn, want = _token_mean_case(_segments(5), tiny_tokenizer)
    for micro in (1, 2, 5):  # 5 micro-batches, 3 (the last partial), 1
        _assert_same(_sgd_delta(tmp_path, micro, 5, loss_fn, count_fn, 5, tiny_tokenizer), want)


# ---- DPO on trajectories: a trajectory's log-prob is the sum over its turns -----------------


def test_multi_turn_dpo_step_by_hand(tmp_path, tiny_tokenizer):
    from sweet.algorithms.policy_trainer import dpo_loss_fn, sequence_logps

    segs = _segments(7, seed=1)
    # pair 0: 2-turn chosen vs 1-turn rejected; pair 1: 1 turn vs 3 turns
    pairs = [Pair((segs[0], segs[1]), (segs[2],), "t0"), Pair((segs[3],), (segs[4], segs[5], segs[6]), "t1")]
    pad, beta, alpha = int(tiny_tokenizer.pad_token_id), 0.5, 0.1
    ref = torch.tensor([[-30.0, -20.0], [-12.0, -40.0]], dtype=torch.float64)
    loss_fn = dpo_loss_fn(pairs, ref, MODEL, pad, beta, alpha)

    def by_hand(model):
        """Each turn scored ALONE in its own context, then summed per trajectory:
        h = β[(Σ_t log π(c_t) − ref_c) − (Σ_t log π(r_t) − ref_r)],
        L = mean over the 2 pairs of  −log σ(h) + α · (−Σ_t log π(c_t) / Σ_t |c_t|)."""
        one = lambda s: segment_logps(model, [s], pad_id=pad, max_length=MODEL.max_length,  # noqa: E731
                                      keep_head=MODEL.keep_head)[0][0]
        total = 0.0
        for k, p in enumerate(pairs):
            lc, lr = sum(one(s) for s in p.chosen), sum(one(s) for s in p.rejected)
            h = beta * ((lc - ref[k, 0].item()) - (lr - ref[k, 1].item()))
            total = total + (-torch.nn.functional.logsigmoid(h)) + alpha * (-lc / sum(len(s.action) for s in p.chosen))
        return total / len(pairs)

    # the hook: Σ over its pairs (the skeleton divides by the step's pair count)
    model = load_model(MODEL)
    loss_sum, metrics = loss_fn(model, [0, 1])
    assert loss_sum.item() / 2 == pytest.approx(by_hand(model).item(), rel=1e-5)
    logps, _ = sequence_logps(model, MODEL, pad, [pairs[0].chosen])
    one_by_one = sum(segment_logps(model, [s], pad_id=pad, max_length=128, keep_head=16)[0][0] for s in pairs[0].chosen)
    assert logps[0].item() == pytest.approx(one_by_one.item(), rel=1e-5)  # padding in a batch changes nothing
    assert metrics["loss/dpo"] / 2 + alpha * metrics["loss/nll"] / 2 == pytest.approx(loss_sum.item() / 2, rel=1e-5)

    want = _grad(by_hand)
    for micro in (1, 2):  # the pairs split across micro-batches, or together
        _assert_same(_sgd_delta(tmp_path, micro, 2, loss_fn, None, 2, tiny_tokenizer), want)


def test_multi_turn_ipo_step_by_hand_for_any_micro_batch(tmp_path, tiny_tokenizer):
    """`loss_type="ipo"` through the hook: per-token log-ratios over a trajectory's summed
    action tokens, L = mean over pairs of (Δ − 1/(2β))² + α·NLL, and the same SGD step
    for micro-batches of 1 and 2."""
    from sweet.algorithms.policy_trainer import dpo_loss_fn

    segs = _segments(7, seed=1)
    pairs = [Pair((segs[0], segs[1]), (segs[2],), "t0"), Pair((segs[3],), (segs[4], segs[5], segs[6]), "t1")]
    pad, beta, alpha = int(tiny_tokenizer.pad_token_id), 0.5, 0.1
    ref = torch.tensor([[-30.0, -20.0], [-12.0, -40.0]], dtype=torch.float64)
    loss_fn = dpo_loss_fn(pairs, ref, MODEL, pad, beta, alpha, loss_type="ipo")
    tokens = lambda side: sum(len(s.action) for s in side)  # noqa: E731

    def by_hand(model):
        one = lambda s: segment_logps(model, [s], pad_id=pad, max_length=MODEL.max_length,  # noqa: E731
                                      keep_head=MODEL.keep_head)[0][0]
        total = 0.0
        for k, p in enumerate(pairs):
            lc, lr = sum(one(s) for s in p.chosen), sum(one(s) for s in p.rejected)
            delta = (lc - ref[k, 0].item()) / tokens(p.chosen) - (lr - ref[k, 1].item()) / tokens(p.rejected)
            total = total + (delta - 1 / (2 * beta)) ** 2 + alpha * (-lc / tokens(p.chosen))
        return total / len(pairs)

    model = load_model(MODEL)
    loss_sum, _ = loss_fn(model, [0, 1])
    assert loss_sum.item() / 2 == pytest.approx(by_hand(model).item(), rel=1e-5)
    want = _grad(by_hand)
    for micro in (1, 2):
        _assert_same(_sgd_delta(tmp_path, micro, 2, loss_fn, None, 2, tiny_tokenizer), want)


def test_dpo_step_with_anchors_by_hand(tmp_path, tiny_tokenizer):
    """SWEET-RL stage 2's anchor (`anchor_coef`): each pair also carries an action whose
    per-token NLL is added with weight α_anchor, in the same forward pass; the step is the
    same for any micro-batch."""
    from sweet.algorithms.policy_trainer import dpo_loss_fn

    segs = _segments(6, seed=3)
    pairs = [Pair((segs[0],), (segs[1],), "t0"), Pair((segs[2],), (segs[3],), "t1")]
    anchors = [(segs[4],), (segs[5],)]
    pad, beta, alpha, alpha_anchor = int(tiny_tokenizer.pad_token_id), 0.1, 0.1, 2.0
    ref = torch.tensor([[-25.0, -22.0], [-18.0, -30.0]], dtype=torch.float64)
    loss_fn = dpo_loss_fn(pairs, ref, MODEL, pad, beta, alpha, anchors, alpha_anchor)
    plain = dpo_loss_fn(pairs, ref, MODEL, pad, beta, alpha)

    def by_hand(model):
        one = lambda s: segment_logps(model, [s], pad_id=pad, max_length=MODEL.max_length,  # noqa: E731
                                      keep_head=MODEL.keep_head)[0][0]
        total = 0.0
        for k, p in enumerate(pairs):
            lc, lr, la = one(p.chosen[0]), one(p.rejected[0]), one(anchors[k][0])
            h = beta * ((lc - ref[k, 0].item()) - (lr - ref[k, 1].item()))
            total = (total + (-torch.nn.functional.logsigmoid(h)) + alpha * (-lc / len(p.chosen[0].action))
                     + alpha_anchor * (-la / len(anchors[k][0].action)))
        return total / len(pairs)

    model = load_model(MODEL)
    loss_sum, metrics = loss_fn(model, [0, 1])
    assert loss_sum.item() / 2 == pytest.approx(by_hand(model).item(), rel=1e-5)
    plain_sum, _ = plain(model, [0, 1])
    assert (loss_sum - plain_sum).item() / 2 == pytest.approx(alpha_anchor * metrics["loss/anchor"] / 2, rel=1e-5)
    assert metrics["loss/anchor"] > 0
    want = _grad(by_hand)
    for micro in (1, 2):
        _assert_same(_sgd_delta(tmp_path, micro, 2, loss_fn, None, 2, tiny_tokenizer), want)


@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_resume_restores_model_optimiser_scheduler(tmp_path, tiny_tokenizer, lora):
    """fit() with a checkpoint every step; a rerun from the first checkpoint ends on the same weights
    (LoRA: the adapters, and the merged final model)."""
    from dataclasses import replace

    from sweet.algorithms.policy_trainer import sft_loss_fn

    segs = _segments(6, seed=2)
    pad = int(tiny_tokenizer.pad_token_id)
    loss_fn, count_fn = sft_loss_fn(segs, MODEL, pad), (lambda i: len(segs[i].action))
    train = TrainConfig(output_dir=str(tmp_path / "run"), batch_size=2, micro_batch_size=1, learning_rate=1e-3,
                        warmup_ratio=0.3, report_to="none")

    def run():
        _reset_accelerate()
        trainer = Trainer(replace(MODEL, lora=lora, lora_r=4), train, tiny_tokenizer)
        trainer.prepare(trainer.steps_per_epoch(len(segs)) * train.num_epochs)
        final = trainer.fit(list(range(len(segs))), loss_fn, count_fn, save_steps=1)
        return final, _params(trainer.accelerator.unwrap_model(trainer.model)), trainer

    final, first, trainer = run()
    if lora:
        assert (tmp_path / "run" / "final-adapter").exists()
        from safetensors.torch import load_file

        saved = load_file(str(tmp_path / "run" / "checkpoint-1" / "model.safetensors"))
        assert saved and all("lora_" in k for k in saved)  # the frozen base model is not copied
    merged = {k: v.clone() for k, v in load_model(replace(MODEL, model=str(final))).state_dict().items()}
    assert trainer.step == 3 and sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == \
        ["checkpoint-1", "checkpoint-2"]
    import shutil

    shutil.rmtree(final)
    shutil.rmtree(tmp_path / "run" / "checkpoint-2")  # "killed" after the first checkpoint
    final, again, trainer = run()
    for k in first:
        assert torch.equal(first[k], again[k]), k
    merged_again = load_model(replace(MODEL, model=str(final))).state_dict()
    assert all(torch.equal(merged[k], merged_again[k]) for k in merged)
    assert math.isclose(trainer.scheduler.get_last_lr()[0], 0.0, abs_tol=1e-12)  # the schedule ran to its end


def test_snapshots_along_the_path_change_nothing_and_are_the_checkpoints_weights(tmp_path, tiny_tokenizer):
    """snapshot_steps 3 over 4 steps: path/step-3 (the cadence) and path/step-4 (the end),
    model only, in HF format. The run ends bitwise where a run without snapshots ends; step-3
    holds checkpoint-3's weights, step-4 the final ones; a resume keeps the existing snapshots."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from sweet.algorithms.policy_trainer import sft_loss_fn
    from sweet.core.trainer import SNAPSHOT_DIR

    segs = _segments(8, seed=5)
    loss_fn, count_fn = sft_loss_fn(segs, MODEL, int(tiny_tokenizer.pad_token_id)), (lambda i: len(segs[i].action))

    def run(name: str, snapshot_steps: int):
        _reset_accelerate()
        train = TrainConfig(output_dir=str(tmp_path / name), batch_size=2, micro_batch_size=1, learning_rate=1e-3,
                            warmup_ratio=0.25, report_to="none", snapshot_steps=snapshot_steps)
        trainer = Trainer(MODEL, train, tiny_tokenizer)
        trainer.prepare(trainer.steps_per_epoch(len(segs)))
        final = trainer.fit(list(range(len(segs))), loss_fn, count_fn, save_steps=1)
        return final, _params(trainer.accelerator.unwrap_model(trainer.model))

    def weights(folder):
        return load_model(replace(MODEL, model=str(folder))).state_dict()

    _, plain = run("plain", 0)
    final, snapped = run("snap", 3)
    assert all(torch.equal(plain[k], snapped[k]) for k in plain)
    path = tmp_path / "snap" / SNAPSHOT_DIR
    assert sorted(p.name for p in path.iterdir()) == ["step-3", "step-4"]
    assert not list((tmp_path / "plain").glob(f"{SNAPSHOT_DIR}/*"))
    step3 = path / "step-3"
    assert (step3 / "config.json").exists() and not list(step3.glob("optimizer*"))
    ckpt = load_file(str(tmp_path / "snap" / "checkpoint-3" / "model.safetensors"))
    got = weights(step3)
    assert ckpt and all(torch.equal(got[k], v) for k, v in ckpt.items())
    assert not all(torch.equal(got[k], snapped[k]) for k in snapped)  # step 3 is not the end
    end, last = weights(path / "step-4"), weights(final)
    assert all(torch.equal(end[k], last[k]) for k in last)

    import shutil

    stamp = (step3 / "model.safetensors").stat().st_mtime_ns
    shutil.rmtree(final)
    shutil.rmtree(tmp_path / "snap" / "checkpoint-3")  # "killed" after snapshot 3, before its checkpoint
    shutil.rmtree(path / "step-4")
    _, again = run("snap", 3)
    assert all(torch.equal(again[k], snapped[k]) for k in snapped)
    assert (step3 / "model.safetensors").stat().st_mtime_ns == stamp  # kept as it was
    end = weights(path / "step-4")
    assert all(torch.equal(end[k], last[k]) for k in last)


def test_reference_cache_is_keyed_by_the_pairs_content(tmp_path, tiny_tokenizer):
    """Same count, other pairs: recomputed. Same pairs: read back from the cache."""

    from sweet.algorithms.policy_trainer import REF_CACHE, reference_logps, sequence_logps

    segs = _segments(8, seed=3)
    first = [Pair((segs[0],), (segs[1],), "a"), Pair((segs[2], segs[3]), (segs[4],), "b")]
    other = [Pair((segs[5],), (segs[6],), "a"), Pair((segs[7],), (segs[0],), "b")]  # the same count
    train = TrainConfig(output_dir=str(tmp_path), report_to="none", micro_batch_size=1)
    trainer = Trainer(MODEL, train, tiny_tokenizer)
    path = tmp_path / REF_CACHE
    pad = int(tiny_tokenizer.pad_token_id)

    def direct(pairs):
        with torch.no_grad():
            c, _ = sequence_logps(trainer.model, MODEL, pad, [p.chosen for p in pairs])
            r, _ = sequence_logps(trainer.model, MODEL, pad, [p.rejected for p in pairs])
        return torch.stack([c, r], 1).double()

    got = reference_logps(trainer, first, path)
    assert torch.allclose(got, direct(first), atol=1e-4)
    got = reference_logps(trainer, other, path)  # a count check alone would reuse the stale values
    assert torch.allclose(got, direct(other), atol=1e-4) and not torch.allclose(got, direct(first), atol=1e-2)

    blob = torch.load(path, weights_only=False)
    blob["values"] = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], dtype=torch.float64)  # mark the cache: the same
    torch.save(blob, path)                                                               # pairs must read it back
    assert reference_logps(trainer, other, path).tolist() == [[-1.0, -2.0], [-3.0, -4.0]]


def test_a_step_larger_than_batch_size_takes_more_accumulation_rounds(tmp_path, tiny_tokenizer):
    """LOOP's steps hold whole trajectories (a variable number of turns): 5 items with
    batch_size 2 and micro 1 still give the gradient of the 5 items' token mean."""
    loss_fn, count_fn, want = _token_mean_case(_segments(5, seed=4), tiny_tokenizer)
    _assert_same(_sgd_delta(tmp_path, 1, 2, loss_fn, count_fn, 5, tiny_tokenizer), want)


FLUSH_CHECK = """
import sys, numpy, torch
from sweet.core.config import ModelConfig, parse_configs
x = torch.from_numpy(numpy.full(1 << 22, 1e-40, dtype=numpy.float32))  # denormals; no torch op yet
if sys.argv[1] == "late":
    (x * 1.0).sum()  # a torch op first: it starts the CPU thread pool
parse_configs([ModelConfig], [])
print(int((x * 1.0).count_nonzero()), torch.get_num_threads())
"""


@pytest.mark.parametrize("when", ["first", "late"])
def test_entry_points_flush_denormal_floats_on_every_thread(when):
    # A saturated loss drives gradients into the denormal range, many times slower on x86
    # (the sum critic: 3-5 s steps instead of 0.8). The flag is per thread and inherited by
    # new threads, so the entry points set it while parsing, before the pool starts.
    import subprocess
    import sys

    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormal floats")
    run = subprocess.run([sys.executable, "-c", FLUSH_CHECK, when], capture_output=True, text=True, check=True)
    nonzero, threads = map(int, run.stdout.split())
    if when == "first":
        assert nonzero == 0
    elif threads > 1:  # why it must come first: set later, the pool's other threads keep denormals
        assert nonzero > 0
