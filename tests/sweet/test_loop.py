import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sweet.loop import clipped_policy_loss, leave_one_out_advantages

ROOT = Path(__file__).resolve().parents[2]


def test_leave_one_out_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.5]])
    # A_0 = 1 - (0+0.5+0.5)/3 = 2/3 ; A_1 = 0 - (1+0.5+0.5)/3 = -2/3 ; A_2 = 0.5 - (1+0+0.5)/3 = 0
    assert torch.allclose(leave_one_out_advantages(r), torch.tensor([[2 / 3, -2 / 3, 0.0, 0.0]]))
    # equal rewards carry no signal
    assert torch.all(leave_one_out_advantages(torch.tensor([[0.3, 0.3, 0.3]])) == 0)


def test_leave_one_out_std_normalisation_is_a_switch():
    r = torch.tensor([[1.0, 0.0]])
    assert torch.allclose(leave_one_out_advantages(r), torch.tensor([[1.0, -1.0]]))
    std = r.std()  # unbiased: sqrt(0.5)
    assert torch.allclose(leave_one_out_advantages(r, normalize_std=True), torch.tensor([[1.0, -1.0]]) / (std + 1e-6))


def _loss(logp, old, adv, level="token", mask=None, group=None, turn=None, n_groups=None):
    logp = torch.tensor(logp)
    old = torch.tensor(old)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask, dtype=torch.float32)
    group = torch.zeros(logp.shape[0], dtype=torch.long) if group is None else torch.tensor(group)
    turn = torch.arange(logp.shape[0]) if turn is None else torch.tensor(turn)
    n_groups = n_groups or int(group.max()) + 1
    return clipped_policy_loss(logp, old, torch.tensor(adv), mask, group, n_groups, 1 / 1.1, 1.1, level, turn)


def test_clipped_objective_inside_and_outside_the_clip_range():
    # token 1: rho = e^0.05 = 1.0513 (inside [0.909, 1.1]); token 2: rho = e^0.5 = 1.6487 (outside)
    # A = +1: l1 = -1.0513; l2 = -min(1.6487, 1.1) = -1.1; trajectory mean = -(1.0513 + 1.1)/2
    loss, m = _loss([[0.05, 0.5]], [[0.0, 0.0]], [1.0])
    assert math.isclose(float(loss), -(math.exp(0.05) + 1.1) / 2, rel_tol=1e-5)
    assert m["loop/clip_fraction"] == pytest.approx(0.5)
    # A = -1 with rho above the range: min(-rho, -1.1) = -rho -> unclipped (pessimistic bound)
    loss, _ = _loss([[0.5]], [[0.0]], [-1.0])
    assert math.isclose(float(loss), math.exp(0.5), rel_tol=1e-5)
    # A = -1 with rho below the range: rho = e^-0.5 = 0.6065; min(-0.6065, -0.909) = -0.909 -> clipped
    loss, _ = _loss([[-0.5]], [[0.0]], [-1.0])
    assert math.isclose(float(loss), 1 / 1.1, rel_tol=1e-5)


def test_loss_averages_tokens_within_trajectory_then_over_trajectories():
    # two trajectories, the first over two sequences (turns) with 1 + 2 tokens, rho = 1 everywhere
    # traj 0: tokens' losses are -A0 = -1 -> mean -1; traj 1: one token, -A1 = +0.5 -> loss = (-1 + 0.5) / 2
    loss, _ = _loss([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 3, [1.0, 1.0, -0.5],
                    mask=[[1, 0], [1, 1], [1, 0]], group=[0, 0, 1])
    assert math.isclose(float(loss), -0.25, rel_tol=1e-6)


def test_turn_and_trajectory_ratios_use_the_mean_log_ratio():
    # one sequence, two tokens with log-ratios 0.0 and 0.1: per-turn rho = e^0.05 for both tokens
    # (per token, the second would be e^0.1 = 1.105 and clipped to 1.1)
    loss, _ = _loss([[0.0, 0.1]], [[0.0, 0.0]], [1.0], level="turn")
    assert math.isclose(float(loss), -math.exp(0.05), rel_tol=1e-5)
    # trajectory over two sequences: log-ratios 0.0 | 0.05, 0.1 -> mean 0.05 -> rho = e^0.05 (inside the range)
    loss, _ = _loss([[0.0, 0.0], [0.05, 0.1]], [[0.0, 0.0]] * 2, [1.0, 1.0], level="trajectory",
                    mask=[[1, 0], [1, 1]], group=[0, 0])
    assert math.isclose(float(loss), -math.exp(0.05), rel_tol=1e-5)


def test_ratio_is_one_on_the_first_epoch_and_params_change(tmp_path):
    """Old log-probs recomputed by the trainer make rho exactly 1 before any update;
    one update step then moves the weights."""
    from colbench.types import Episode, Score, Turn
    from engines.tiny import tiny_model_path
    from sweet.loop import LoopConfig, _batch, recompute_old_logprobs, turn_examples
    from sweet.tokens import template_ids, token_logprobs
    from sweet.training import ModelConfig, load_model, load_tokenizer

    torch.manual_seed(0)
    cfg = ModelConfig(model=str(tiny_model_path()), max_length=256, keep_head=32)
    model, tok = load_model(cfg), load_tokenizer(cfg.model)
    prompt = [{"role": "user", "content": "hello"}]
    eps = []
    for k, text in enumerate(["What happens to positive numbers?", "Can you tell me more?"]):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        turn = Turn("agent", text, prompt=prompt, prompt_token_ids=template_ids(tok, prompt), token_ids=ids)
        eps.append(Episode("t", "testbed", "p", k, [turn], score=Score(float(k == 0), k == 0)))
    examples = turn_examples(eps, [0.5, -0.5], tok)
    old = recompute_old_logprobs(model, examples, tok.pad_token_id, cfg, micro=2)
    batch, adv, group, turn = _batch(examples, tok.pad_token_id, cfg.max_length, cfg.keep_head)
    old_lp = torch.zeros_like(batch.input_ids, dtype=torch.float32)
    for j in range(2):
        old_lp[j, batch.action_mask[j].nonzero().squeeze(-1)] = old[j]
    model.eval()
    logp = token_logprobs(model, batch)
    loss, metrics = clipped_policy_loss(logp, old_lp, adv, batch.action_mask, group, 2, 1 / 1.1, 1.1)
    assert metrics["loop/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["loop/clip_fraction"] == 0.0
    before = [p.detach().clone() for p in model.parameters()]
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert LoopConfig().clip_low == pytest.approx(1 / 1.1)


def test_loop_config_validates():
    from sweet.loop import LoopConfig

    with pytest.raises(ValueError, match="k must be >= 2"):
        LoopConfig(k=1)
    with pytest.raises(ValueError, match="ratio_level"):
        LoopConfig(ratio_level="episode")


def test_one_full_iteration_on_the_tiny_model(tmp_path):
    """The CLI end to end: sample K episodes per task with the live policy, score them in
    the sandbox, update, checkpoint, and write a loadable final model."""
    out = tmp_path / "loop"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", "tiny",
           "--iterations", "1", "--tasks_per_iteration", "2", "--k", "2", "--max_new_tokens", "8", "--max_turns", "2",
           "--micro_batch_size", "4", "--learning_rate", "1e-4", "--report_to", "none", "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and rows[0]["loop/episodes_total"] == 4.0
    assert (out / "final" / "config.json").exists()
    episodes = (out / "episodes" / "iter-0000.jsonl").read_text().splitlines()
    assert len(episodes) == 4 and all(json.loads(e)["score"] is not None for e in episodes)
    # resume: a rerun with the same output finds the finished iteration and does not redo it
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.gpu
def test_one_iteration_with_a_vllm_sampler(tmp_path):
    """The vLLM sampler follows the weights (LoRA adapter reloaded each iteration)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available: the vLLM sampler needs a GPU")
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[vllm]' on a CUDA machine)")
    out = tmp_path / "loop"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", "tiny",
           "--sampler", "vllm", "--lora", "true", "--iterations", "2", "--tasks_per_iteration", "2", "--k", "2",
           "--max_new_tokens", "8", "--max_turns", "2", "--report_to", "none", "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert (out / "sampler-adapter" / "adapter_config.json").exists()
