import json
import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sweet.algorithms.loop import clipped_policy_loss, grpo_advantages, leave_one_out_advantages, turn_gae

ROOT = Path(__file__).resolve().parents[2]


# ---- advantage estimators, by hand ----------------------------------------------------


def test_leave_one_out_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.5]])
    # A_0 = 1 - (0+0.5+0.5)/3 = 2/3 ; A_1 = 0 - (1+0.5+0.5)/3 = -2/3 ; A_2 = 0.5 - (1+0+0.5)/3 = 0
    assert torch.allclose(leave_one_out_advantages(r), torch.tensor([[2 / 3, -2 / 3, 0.0, 0.0]]))
    # equal rewards carry no signal
    assert torch.all(leave_one_out_advantages(torch.tensor([[0.3, 0.3, 0.3]])) == 0)


def test_grpo_advantages_by_hand():
    # rewards 1, 0, 0.5: mean 0.5, unbiased std sqrt(((0.5)^2 + (0.5)^2 + 0) / 2) = 0.5
    a = grpo_advantages(torch.tensor([[1.0, 0.0, 0.5]]))
    assert torch.allclose(a, torch.tensor([[1.0, -1.0, 0.0]]), atol=1e-5)
    assert torch.all(grpo_advantages(torch.tensor([[0.2, 0.2]])) == 0)  # no variance, no signal


def test_turn_gae_by_hand():
    # V = [0.2, 0.5, 0.4], R = 1 after the last turn
    # δ = [0.5-0.2, 0.4-0.5, 1-0.4] = [0.3, -0.1, 0.6]
    adv, target = turn_gae([0.2, 0.5, 0.4], 1.0, lam=1.0)  # λ=1: A_t = R - V_t
    assert adv == pytest.approx([0.8, 0.5, 0.6])
    assert target == pytest.approx([1.0, 1.0, 1.0])  # Monte-Carlo return
    adv, target = turn_gae([0.2, 0.5, 0.4], 1.0, lam=0.5)
    # A_2 = 0.6; A_1 = -0.1 + 0.5*0.6 = 0.2; A_0 = 0.3 + 0.5*0.2 = 0.4
    assert adv == pytest.approx([0.4, 0.2, 0.6])
    assert target == pytest.approx([0.6, 0.7, 1.0])


# ---- the clipped objective, by hand -----------------------------------------------------


def _loss(logp, old, adv, weight=None, level="token", traj_lr=None, ref=None, kl_coef=0.0, behaviour=None):
    logp = torch.tensor(logp, requires_grad=True)
    old = torch.tensor(old)
    weight = torch.full_like(logp, 1 / logp.shape[1]) if weight is None else torch.tensor(weight)
    traj_lr = None if traj_lr is None else torch.tensor(traj_lr)
    ref = None if ref is None else torch.tensor(ref)
    behaviour = None if behaviour is None else torch.tensor(behaviour)
    loss, m = clipped_policy_loss(logp, old, torch.tensor(adv), weight, 1 / 1.1, 1.1, level, traj_lr, ref, kl_coef,
                                  behaviour)
    return loss, m, logp


def test_clipped_objective_inside_and_outside_the_clip_range():
    # token 1: rho = e^0.05 = 1.0513 (inside [0.909, 1.1]); token 2: rho = e^0.5 = 1.6487 (outside)
    # A = +1: l1 = -1.0513; l2 = -min(1.6487, 1.1) = -1.1; trajectory mean = -(1.0513 + 1.1)/2
    loss, m, _ = _loss([[0.05, 0.5]], [[0.0, 0.0]], [1.0])
    assert math.isclose(float(loss), -(math.exp(0.05) + 1.1) / 2, rel_tol=1e-5)
    assert float(m["loop/clip_fraction"]) == pytest.approx(0.5)
    # A = -1 with rho above the range: min(-rho, -1.1) = -rho -> unclipped (pessimistic bound)
    loss, _, _ = _loss([[0.5]], [[0.0]], [-1.0])
    assert math.isclose(float(loss), math.exp(0.5), rel_tol=1e-5)
    # A = -1 with rho below the range: rho = e^-0.5 = 0.6065; min(-0.6065, -0.909) = -0.909 -> clipped
    loss, _, _ = _loss([[-0.5]], [[0.0]], [-1.0])
    assert math.isclose(float(loss), 1 / 1.1, rel_tol=1e-5)


def test_a_trajectory_split_across_micro_batches_by_hand():
    """Trajectory τ has two turns with 1 and 2 action tokens (N_τ = 3), trajectory σ one
    turn with 1 token; A_τ = 1, A_σ = -0.5, rho = 1. The step's loss is the mean over the
    2 trajectories of each one's token mean: ((-1·3)/3 + (+0.5)/1) / 2 = -0.25. Split into
    micro-batches {τ turn 1}, {τ turn 2, σ}, the sums (weights 1/N_τ) add up to
    -1/3 + (-2/3 + 0.5) = -0.5, and the trainer divides by the 2 trajectories: -0.25."""
    w_tau, w_sigma = 1 / 3, 1.0
    l1, _, g1 = _loss([[0.0, 0.0]], [[0.0, 0.0]], [1.0], weight=[[w_tau, 0.0]])
    l2, _, g2 = _loss([[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 2, [1.0, -0.5], weight=[[w_tau, w_tau], [w_sigma, 0.0]])
    assert float(l1) == pytest.approx(-1 / 3) and float(l2) == pytest.approx(-2 / 3 + 0.5)
    assert float(l1 + l2) / 2 == pytest.approx(-0.25)
    # the same rows in one micro-batch give the same sum and the same per-token gradients
    lall, _, gall = _loss([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 3, [1.0, 1.0, -0.5],
                          weight=[[w_tau, 0.0], [w_tau, w_tau], [w_sigma, 0.0]])
    assert float(lall) == pytest.approx(float(l1 + l2))
    (l1 + l2).backward()
    lall.backward()
    assert torch.allclose(torch.cat([g1.grad, g2.grad]), gall.grad)
    # d loss / d logp = -A·rho·w: -1/3 for τ's tokens, +0.5 for σ's
    assert torch.allclose(gall.grad, torch.tensor([[-1 / 3, 0.0], [-1 / 3, -1 / 3], [0.5, 0.0]]))


def test_turn_and_trajectory_ratios_by_hand():
    # one turn, two tokens with log-ratios 0.0 and 0.1: per-turn rho = e^0.05 for both tokens
    # (per token, the second would be e^0.1 = 1.105 and clipped to 1.1)
    loss, _, _ = _loss([[0.0, 0.1]], [[0.0, 0.0]], [1.0], level="turn")
    assert math.isclose(float(loss), -math.exp(0.05), rel_tol=1e-5)
    # trajectory of two turns in two micro-batches, log-ratios 0.0 | 0.05, 0.1 -> mean 0.05
    # -> rho = e^0.05 (inside the range) for every token; loss = -e^0.05 over the 3 tokens
    w = 1 / 3
    l1, _, g1 = _loss([[0.0, 0.0]], [[0.0, 0.0]], [1.0], weight=[[w, 0.0]], level="trajectory", traj_lr=[0.05])
    l2, _, g2 = _loss([[0.05, 0.1]], [[0.0, 0.0]], [1.0], weight=[[w, w]], level="trajectory", traj_lr=[0.05])
    assert float(l1 + l2) == pytest.approx(-math.exp(0.05), rel=1e-5)
    (l1 + l2).backward()
    # d/d logp_i of -e^{mean log ratio} = -e^0.05 / 3 for each of the 3 tokens
    assert torch.allclose(torch.cat([g1.grad[:, :1], g2.grad], 1), torch.full((1, 3), -math.exp(0.05) / 3))


def test_kl_term_by_hand():
    # r = log π_ref − log π = -0.1 - 0 -> k3 = e^r - r - 1 = 0.0048374; rho = 1, A = 0
    loss, m, _ = _loss([[0.0]], [[0.0]], [0.0], weight=[[1.0]], ref=[[-0.1]], kl_coef=2.0)
    k3 = math.exp(-0.1) + 0.1 - 1
    assert float(m["loop/kl"]) == pytest.approx(k3, rel=1e-5)
    assert float(loss) == pytest.approx(2.0 * k3, rel=1e-5)


def test_decoupled_objective_by_hand():
    """ℓ = −w·min(ρ·A, clip(ρ)·A), ρ = π_θ/π_prox, w = π_prox/π_behav (constant). Inside the
    clip range, value and gradient are the standard objective's with π_old = π_behav
    (w·ρ = π_θ/π_behav); the clip binds around π_prox, not π_behav. A = +1, log π_behav = 0."""
    # log π_prox = 0.02, log π_θ = 0.05: ρ = e^0.03, w = e^0.02; standard: ρ = e^0.05, both inside
    dec, m, g_dec = _loss([[0.05]], [[0.02]], [1.0], behaviour=[[math.exp(0.02)]])
    std, _, g_std = _loss([[0.05]], [[0.0]], [1.0])
    assert float(dec) == pytest.approx(-math.exp(0.05), rel=1e-5) and float(std) == pytest.approx(float(dec))
    (dec + std).backward()
    assert float(g_dec.grad) == pytest.approx(-math.exp(0.05), rel=1e-5) == float(g_std.grad)
    assert float(m["loop/behaviour_weight_mean"]) == pytest.approx(math.exp(0.02))
    # log π_prox = 0.3, log π_θ = 0.35: the standard ratio e^0.35 = 1.42 is clipped (no gradient), the
    # decoupled one e^0.05 is not: loss −e^0.3·e^0.05, gradient −e^0.35
    dec, m, g_dec = _loss([[0.35]], [[0.3]], [1.0], behaviour=[[math.exp(0.3)]])
    std, m_std, g_std = _loss([[0.35]], [[0.0]], [1.0])
    (dec + std).backward()
    assert float(dec) == pytest.approx(-math.exp(0.35), rel=1e-5) and float(std) == pytest.approx(-1.1)
    assert float(g_dec.grad) == pytest.approx(-math.exp(0.35), rel=1e-5) and float(g_std.grad) == 0.0
    assert float(m["loop/clip_fraction"]) == 0.0 and float(m_std["loop/clip_fraction"]) == 1.0
    # a weight of 0 (above the cap) takes the token out of the loss
    dec, _, g_dec = _loss([[0.35]], [[0.3]], [1.0], behaviour=[[0.0]])
    dec.backward()
    assert float(dec) == 0.0 and float(g_dec.grad) == 0.0


def test_loop_config_validates():
    from sweet.algorithms.loop import LoopConfig

    with pytest.raises(ValueError, match="episodes_per_task must be >= 2"):
        LoopConfig(episodes_per_task=1)
    with pytest.raises(ValueError, match="ratio_level"):
        LoopConfig(ratio_level="episode")
    with pytest.raises(ValueError, match="advantage"):
        LoopConfig(advantage="gae")
    with pytest.raises(ValueError, match=r"^LoopConfig.staleness must be >= 0, got -1$"):
        LoopConfig(async_rollouts=True, staleness=-1)
    assert LoopConfig(async_rollouts=True, sampler="vllm").sampler == "vllm"  # vLLM plays while the trainer trains
    with pytest.raises(ValueError, match=r"^LoopConfig.sampler must be one of '', 'vllm', got 'sglang'$"):
        LoopConfig(sampler="sglang")
    with pytest.raises(ValueError, match="LoopConfig.behaviour_weight_cap caps the decoupled loss"):
        LoopConfig(behaviour_weight_cap=2.0)
    with pytest.raises(ValueError, match=r"^LoopConfig.behaviour_weight_cap must be >= 1, got 0.5$"):
        LoopConfig(decoupled_loss=True, behaviour_weight_cap=0.5)
    with pytest.raises(ValueError, match="LoopConfig.decoupled_loss .* old_logprobs 'sampler'"):
        LoopConfig(decoupled_loss=True, old_logprobs="sampler")


def test_async_batch_takes_pi_old_from_the_sampler_and_guards_against_its_version():
    """Async rollouts: π_old is the sampler's log-probs, and the gap guard compares them
    with the trainer's recomputation at the sampler's version (`recomputed`), never with
    this pass's current log-probs. Numbers by hand, max_logprob_gap 0.5."""
    from sweet.algorithms.loop import LoopConfig, SampledTurn, build_batch

    turn = SampledTurn((1,), (2, 3, 4), [-1.0, -2.0, -3.0], 0, True, 1, recomputed=[-1.1, -2.9, -3.0])
    current = torch.tensor([-5.0, -2.0, -3.0])  # the trainer now: far from the sampler on token 0 only
    scored = [(current, None, None)]
    batch, gap = build_batch([turn], scored, [1.0], None, LoopConfig(async_rollouts=True, max_logprob_gap=0.5))
    assert batch[0].old.tolist() == [-1.0, -2.0, -3.0]  # the behaviour policy's
    # |sampler − recomputed| = 0.1, 0.9, 0: token 1 masked (token 0 is not, though 4 away from the current)
    assert batch[0].keep.tolist() == [True, False, True] and batch[0].traj_tokens == 2
    assert gap == pytest.approx((0.1 + 0.9 + 0.0) / 3, abs=1e-6)
    sync, sync_gap = build_batch([replace(turn, recomputed=None)], scored, [1.0], None, LoopConfig(max_logprob_gap=0.5))
    assert sync[0].old.tolist() == [-5.0, -2.0, -3.0] and sync[0].keep.tolist() == [False, True, True]
    assert sync_gap == pytest.approx(4 / 3, abs=1e-6)


def test_decoupled_batch_clips_around_the_current_policy_and_weights_by_the_sampler():
    """decoupled_loss, async: π_old is this pass's log-probs (π_prox, the current weights),
    each token carries π_prox / π_behav (the sampler's), 0 above behaviour_weight_cap, and the
    gap guard still compares the sampler with the trainer at the sampler's version."""
    from sweet.algorithms.loop import LoopConfig, SampledTurn, build_batch

    turn = SampledTurn((1,), (2, 3, 4), [-1.0, -2.0, -3.0], 0, True, 1, recomputed=[-1.1, -2.9, -3.0])
    scored = [(torch.tensor([-5.0, -2.0, -2.5]), None, None)]
    cfg = LoopConfig(async_rollouts=True, max_logprob_gap=0.5, decoupled_loss=True)
    batch, _ = build_batch([turn], scored, [1.0], None, cfg)
    assert batch[0].old.tolist() == [-5.0, -2.0, -2.5]
    assert torch.allclose(batch[0].behaviour_weight, torch.tensor([math.exp(-4.0), 1.0, math.exp(0.5)]))
    assert batch[0].keep.tolist() == [True, False, True]
    capped, _ = build_batch([turn], scored, [1.0], None, replace(cfg, behaviour_weight_cap=1.5))
    assert torch.allclose(capped[0].behaviour_weight, torch.tensor([math.exp(-4.0), 1.0, 0.0]))
    standard, _ = build_batch([turn], scored, [1.0], None, replace(cfg, decoupled_loss=False))
    assert standard[0].behaviour_weight is None


def test_defaults_follow_the_environment_and_the_paper(capsys):
    from sweet.algorithms.loop import LoopConfig, LoopTrainConfig, session
    from sweet.core.rollouts import task_pool
    from sweet.train_policy import main

    cfg = LoopConfig(env="backend", tasks="builtin:train", simulator=None)
    assert task_pool(cfg.tasks, cfg.env)
    with session(cfg) as (env, _):
        assert env.max_turns == 10  # ColBench's own limit, not a LOOP default
    with session(LoopConfig(max_turns=2)) as (env, _):
        assert env.max_turns == 2
    from sweet.core.config import ModelConfig, resolve_learning_rate

    # LoRA: the public code's 5e-5; full weights: 1/10 of it (resolved once, after parsing)
    assert LoopTrainConfig().learning_rate is None
    assert resolve_learning_rate(ModelConfig(lora=True), LoopTrainConfig()) == 5e-5
    assert resolve_learning_rate(ModelConfig(), LoopTrainConfig()) == 5e-6
    assert resolve_learning_rate(ModelConfig(lora=True), LoopTrainConfig(learning_rate=1e-3)) == 1e-3
    assert LoopConfig().normalize_advantages is True
    with pytest.raises(SystemExit):
        main(["--algorithm", "loop", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    for flag in ("--advantage", "--kl_coef", "--gae_lambda", "--value_coef", "public code: 5e-5",
                 "5e-06 for full fine-tuning, 5e-05 with --lora", "--normalize_advantages",
                 "trajectories per optimiser step"):
        assert flag in out


# ---- updates on fixed rollouts (the tiny model) -----------------------------------------

REWARDS = {"a": [1.0, 0.0, 0.5], "b": [0.2, 0.2, 0.9]}  # two tasks, K = 3


def fixed_episodes(tok):
    """Multi-turn episodes with recorded ids (turns of 1 to 3 agent turns), rewards REWARDS."""
    from colbench.types import Episode, Score, Turn
    from sweet.core.tokens import template_ids

    texts = ["What happens to positive numbers?", "Can you tell me more?", "I WANT TO ANSWER: def f(x): return x",
             "What happens to negative numbers?"]
    eps = []
    for task, rewards in REWARDS.items():
        for k, r in enumerate(rewards):
            prompt = [{"role": "user", "content": f"task {task}"}]
            turns = []
            for t in range(1 + (k + len(task)) % 3):
                text = texts[(k + t) % len(texts)]
                ids = tok(text, add_special_tokens=False)["input_ids"]
                turns.append(Turn("agent", text, prompt=list(prompt), prompt_token_ids=template_ids(tok, prompt),
                                  token_ids=ids, finish_reason="stop" if t % 2 == 0 else "length",
                                  logprobs=None))
                turns.append(Turn("human", "I don't know."))
                prompt = prompt + [{"role": "assistant", "content": text}, {"role": "user", "content": "I don't know."}]
            eps.append(Episode(task, "testbed", "policy", k, turns[:-1], score=Score(r, r >= 1.0)))
    return eps


class Fixed:
    """A collector whose every iteration has the same (already scored) episodes."""

    def __init__(self, episodes):
        self.fixed = episodes

    def episodes(self, it):
        return self.fixed


def run_update(tmp_path, name, *, micro=16, batch=8, lora=False, sgd=True, **loop_kwargs):
    """One iteration's update on fixed_episodes with the real trainer; returns (weight deltas,
    metrics). `sgd`: the inner optimiser is plain SGD, so the update IS the gradient (Adam's
    first step would hide a gradient's scale)."""
    from engines.tiny import tiny_model_path
    from sweet.algorithms.loop import LoopConfig, LoopTrainConfig, iteration
    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model, load_tokenizer
    from sweet.core.trainer import Trainer
    from sweet.core.value_head import ValueHeadModel

    cfg = LoopConfig(ppo_epochs=loop_kwargs.pop("ppo_epochs", 1), **loop_kwargs)
    model_cfg = ModelConfig(model=str(tiny_model_path()), max_length=256, keep_head=32, lora=lora, lora_r=4)
    train = LoopTrainConfig(output_dir=str(tmp_path / name), micro_batch_size=micro, batch_size=batch,
                            learning_rate=1e-1, max_grad_norm=1e9, report_to="none")
    tok = load_tokenizer(model_cfg.model)
    torch.manual_seed(0)
    model = load_model(model_cfg)
    if cfg.advantage == "ppo":
        model = ValueHeadModel(model, policy=True)
    trainer = Trainer(model_cfg, train, tok, model=model)
    sgd_opt = torch.optim.SGD([p for p in trainer.model.parameters() if p.requires_grad], lr=1e-1) if sgd else None
    trainer.prepare(100, optimizer=sgd_opt)
    named = trainer.accelerator.unwrap_model(trainer.model).named_parameters  # names without DDP's "module."
    before = {n: p.detach().clone() for n, p in named() if p.requires_grad}
    ref = None
    if cfg.kl_coef > 0:
        ref = "disable_adapter" if lora else load_model(model_cfg, trainable=False)
    metrics = iteration(trainer, Fixed(fixed_episodes(tok)), 0, cfg, model_cfg, tok, ref=ref)
    deltas = {n: p.detach() - before[n] for n, p in named() if p.requires_grad}
    return deltas, metrics


def _same(d1, d2, rtol=1e-3):
    """allclose per tensor, the absolute tolerance scaled to the update's largest change over
    all tensors (padding changes float32 sums by ~1e-8; a wrong weighting changes them by
    percents). Not each tensor's own largest: a tensor whose gradient is a sum that nearly
    cancels (measured: a layer norm's weight, its change 2% of the largest) moves by float
    noise that depends on the summation order, e.g. 0.2% of its own change on one thread."""
    scale = max(float(d.abs().max()) for d in d1.values())
    return all(torch.allclose(d1[n], d2[n], rtol=rtol, atol=rtol * scale) for n in d1)


def _cosine(d1, d2):
    a = torch.cat([d.flatten() for d in d1.values()])
    b = torch.cat([d.flatten() for d in d2.values()])
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("level", ["token", "trajectory"])
def test_update_is_the_same_for_any_micro_batch_size(tmp_path, level):
    """One optimiser step over all kept trajectories: micro-batches of 1 turn and of 16
    turns give the same weight update (the trajectory split across micro-batches)."""
    d1, m1 = run_update(tmp_path, "m1", micro=1, ratio_level=level)
    d16, m16 = run_update(tmp_path, "m16", micro=16, ratio_level=level)
    assert m1["loop/optimizer_steps"] == 1.0 and m1["loop/episodes_kept"] == 5.0  # A = 0 for a reward-0.5 episode: dropped
    assert any(d.abs().max() > 0 for d in d1.values())
    assert _same(d1, d16), f"cosine {_cosine(d1, d16):.6f}"
    assert m1["loss/policy"] == pytest.approx(m16["loss/policy"], abs=1e-6)
    # rho = 1 exactly on the first step (pi_old recomputed by the trainer)
    assert m1["loop/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m1["loop/clip_fraction"] == 0.0


def test_kl_penalty_changes_the_update_and_is_logged(tmp_path):
    # two epochs: on the first step π_θ = π_ref (the KL gradient is 0), on the second it is not
    d0, m0 = run_update(tmp_path, "kl0", ppo_epochs=2)
    d1, m1 = run_update(tmp_path, "kl1", ppo_epochs=2, kl_coef=1.0)
    assert "loop/kl" not in m0 and m1["loop/kl"] > 0
    assert not _same(d0, d1)


def test_kl_penalty_with_lora_uses_the_disabled_adapters(tmp_path):
    d0, _ = run_update(tmp_path, "lkl0", ppo_epochs=2, lora=True)
    d1, m1 = run_update(tmp_path, "lkl1", ppo_epochs=2, lora=True, kl_coef=1.0)
    assert m1["loop/kl"] > 0 and not _same(d0, d1)


def test_grpo_and_ppo_switches_train(tmp_path):
    dl, ml = run_update(tmp_path, "loo")
    dg, mg = run_update(tmp_path, "grpo", advantage="grpo")
    assert ml["loop/episodes_kept"] == mg["loop/episodes_kept"]
    assert not _same(dl, dg)  # other advantages, other update
    dp, mp = run_update(tmp_path, "ppo", advantage="ppo", micro=1)
    dp16, _ = run_update(tmp_path, "ppo16", advantage="ppo", micro=16)
    assert mp["loop/episodes_kept"] == 6.0  # PPO keeps every episode: V is its baseline
    assert mp["loss/value"] > 0 and dp["v_head.bias"].abs().item() > 0  # the value head learns
    assert _same(dp, dp16)  # value loss micro-batch invariant too


@pytest.mark.slow
@pytest.mark.distributed
def test_update_on_two_processes_matches_one(tmp_path):
    """The step's turns dealt across 2 gloo processes give the weights of 1 process."""
    script = tmp_path / "run.py"
    script.write_text(f"""
import sys, torch
sys.path.insert(0, {str(ROOT / 'tests' / 'sweet')!r}); sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from test_loop import run_update
deltas, metrics = run_update(Path(sys.argv[1]), "run", micro=1, ppo_epochs=2, batch=3)
import torch.distributed as dist
if not dist.is_initialized() or dist.get_rank() == 0:
    torch.save(deltas, sys.argv[2])
""")
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "a"), str(one)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
              str(ROOT / "sweet/configs/ddp_cpu_2proc.yaml"), "--main_process_port", "29531"]
    res = subprocess.run([*launch, str(script), str(tmp_path / "b"), str(two)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    d1, d2 = torch.load(one), torch.load(two)
    assert any(d.abs().max() > 0 for d in d1.values())
    assert _same(d1, d2), f"cosine {_cosine(d1, d2):.6f}"


# ---- the CLI ---------------------------------------------------------------------------


def test_a_run_that_cannot_learn_says_so(tmp_path):
    """The README's laptop example (the tiny random model never solves a test-bed task):
    every group has the same reward, nothing is learned, and the run says why and exits
    non-zero after saving the (unchanged) model; a rerun resumes and does not redo it."""
    out = tmp_path / "loop"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", "tiny",
           "--iterations", "2", "--tasks_per_iteration", "1", "--k", "3", "--max_new_tokens", "8",
           "--micro_batch_size", "4", "--report_to", "none", "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0, res.stderr[-3000:]
    assert "no reward variance" in res.stderr and "warm start" in res.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["loop/episodes_total"] == 3.0 and r["loop/episodes_kept"] == 0.0 for r in rows)
    assert all(r["loop/groups_without_variance"] == 1.0 and r["loop/optimizer_steps"] == 0.0 for r in rows)
    assert (out / "final" / "config.json").exists()
    episodes = (out / "episodes" / "iter-0000.jsonl").read_text().splitlines()
    assert len(episodes) == 3 and all(json.loads(e)["score"] is not None for e in episodes)
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]  # nothing left to run
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.gpu
def test_one_iteration_with_a_vllm_sampler(tmp_path):
    """The vLLM sampler follows the weights (LoRA adapter reloaded each iteration)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available: the vLLM sampler needs a GPU")
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[vllm]' on a CUDA machine)")
    out = tmp_path / "loop"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", "tiny",
           "--sampler", "vllm", "--lora", "true", "--iterations", "2", "--tasks_per_iteration", "2", "--k", "2",
           "--max_new_tokens", "8", "--report_to", "none", "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert (out / "sampler-adapter" / "adapter_config.json").exists()


def runnable_answer_tasks(path: Path) -> Path:
    """Test-bed tasks whose two tests ("0", "1") do not call f: an answer scores 1 exactly
    when it runs. `number_writer` answers with a bare number (which runs) about half the
    time, so groups of K episodes differ in reward and LOOP has something to learn from (real
    sampling, real sandbox scoring)."""
    from testbed.env import make_tasks

    tasks = [replace(t, tests=("0", "1")) for t in make_tasks("train", n=4, bed="legacy")]
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    return path


NUMBER_WEIGHT = 0.5  # the LM head's weight on the constant dimension for number tokens: ~45% numbers at temperature 1


def number_writer() -> Path:
    """The tiny model, made to write a bare number (a token such as "13") about half the time
    at temperature 1, where the random tiny model writes an answer that runs about one time in
    20 and an iteration's groups of K often all tie. Residual dimension 0 is a constant 1 (in
    every token's embedding; no layer writes to it), about 11 after the final norm, and the LM
    head reads it into the number tokens only: their logits are ~5.6 above the others'. (At
    temperature 3 that would take ~17, and float32's summation-order noise between process
    counts grows with the logits it rides on.) Built once into the tiny models' cache
    (engines.tiny.cache_dir)."""
    import os
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engines.tiny import cache_dir, tiny_model_path

    out = cache_dir() / f"tiny-number-writer-{NUMBER_WEIGHT}"
    if (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
    numbers = [i for i in range(len(tok)) if tok.decode([i]).isdigit()]
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[numbers, 0] = NUMBER_WEIGHT
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    model.save_pretrained(build)
    tok.save_pretrained(build)
    try:
        os.rename(build, out)  # atomic: another test process may have built it meanwhile
    except OSError:
        shutil.rmtree(build, ignore_errors=True)
    return out


def test_the_number_writer_writes_a_number_about_half_the_time():
    """The fixture's premise, on the sampler the runs use: at temperature 1 between 30% and 60%
    of first answers on `runnable_answer_tasks`' tasks are bare numbers (a group of 8 then
    ties with probability below 6%)."""
    from engines import EngineOptions, SamplingParams, load_engine
    from testbed.env import TestbedEnv, make_tasks

    env = TestbedEnv(bed="legacy")
    prompts = [env.agent_messages(t, []) for t in make_tasks("train", n=4, bed="legacy")] * 50
    engine = load_engine(f"hf:{number_writer()}", EngineOptions(device="cpu", dtype="float32"))
    try:
        texts = [s[0].text for s in engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=1, seed=0))]
    finally:
        engine.close()
    assert 0.3 <= sum(t.isdigit() for t in texts) / len(texts) <= 0.6


def runnable_loop_cli(tasks: Path, out: Path, *extra: str, iterations: int = 2, micro: int = 4,
                      launcher: Sequence[str] = (sys.executable, "-m")) -> list[str]:
    """`sweet.train_policy --algorithm loop` on `runnable_answer_tasks` with `number_writer`, as
    the CLI tests run it: one token per turn at temperature 1, 2 tasks x K=8 per iteration, up
    to 2 turns, batches of 3 trajectories, lr 1e-3; `extra` flags are appended."""
    return [*launcher, "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", str(number_writer()),
            "--tasks", str(tasks), "--iterations", str(iterations), "--tasks_per_iteration", "2", "--k", "8",
            "--temperature", "1", "--max_new_tokens", "1", "--max_turns", "2", "--batch_size", "3",
            "--micro_batch_size", str(micro), "--learning_rate", "1e-3", "--report_to", "none",
            "--output_dir", str(out), *extra]


def _final_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.distributed
def test_killed_and_resumed_run_gives_the_uninterrupted_weights(tmp_path):
    """2 iterations, full weights with gradient checkpointing: killed (SIGKILL) once
    iteration 0's checkpoint exists, then rerun, the final weights and metrics equal an
    uninterrupted run's (model, optimiser, schedule, RNGs and task sampling restored)."""
    import signal
    import time

    tasks = runnable_answer_tasks(tmp_path / "tasks.jsonl")

    def cmd(out):
        return runnable_loop_cli(tasks, out, "--gradient_checkpointing", "true")

    whole = tmp_path / "whole"
    res = subprocess.run(cmd(whole), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loop/optimizer_steps"] > 0 for r in rows), rows  # both iterations learned something

    killed = tmp_path / "killed"
    proc = subprocess.Popen(cmd(killed), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900
    while not (killed / "checkpoint-0" / "state.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "final").exists(), "the run finished before it could be killed"
    res = subprocess.run(cmd(killed), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming" in res.stdout + res.stderr
    a, b = _final_weights(whole / "final"), _final_weights(killed / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (killed / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()


@pytest.mark.heavy
def test_async_at_lag_0_is_the_synchronous_run(tmp_path):
    """The async path adds nothing but its lag: at --staleness 0 it trains, bit for bit, the
    weights of the synchronous run that takes π_old from the sampler (as async always does),
    on the same episodes, each played by the current version."""
    tasks = runnable_answer_tasks(tmp_path / "tasks.jsonl")

    runs = {"sync": ("--old_logprobs", "sampler"), "async0": ("--async_rollouts", "true", "--staleness", "0")}
    for name, extra in runs.items():
        res = subprocess.run(runnable_loop_cli(tasks, tmp_path / name, *extra), cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
    a, b = _final_weights(tmp_path / "sync" / "final"), _final_weights(tmp_path / "async0" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in runs}
    assert all(r["loop/optimizer_steps"] > 0 for r in rows["sync"])
    assert [r["loss/policy"] for r in rows["sync"]] == [r["loss/policy"] for r in rows["async0"]]
    assert [r["loop/policy_lag"] for r in rows["async0"]] == [0.0, 0.0]
    for j in range(2):
        played = {name: [(e["task_id"], e["answer"], e["meta"]["policy_version"]) for e in map(
            json.loads, (tmp_path / name / "episodes" / f"iter-{j:04d}.jsonl").read_text().splitlines())]
            for name in runs}
        assert played["sync"] == played["async0"] and {v for _, _, v in played["sync"]} == {j}


def test_async_decoupled_loss_weights_the_lagged_iterations(tmp_path):
    """--decoupled_loss at lag 1 through the CLI: iteration 0 trains on the version it plays
    (π_prox = π_behav: the weight is 1 up to the sampler/trainer float gap); iteration 1 on
    version 0's episodes with version 1's weights, so π_prox / π_behav moves away from 1."""
    tasks = runnable_answer_tasks(tmp_path / "tasks.jsonl")
    out = tmp_path / "decoupled"
    res = subprocess.run(runnable_loop_cli(tasks, out, "--async_rollouts", "true", "--decoupled_loss", "true"),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["loop/policy_lag"] for r in rows] == [0.0, 1.0]
    assert all(r["loop/optimizer_steps"] > 0 for r in rows), rows
    same, lagged = (r["loop/behaviour_weight_mean"] for r in rows)
    assert abs(same - 1) < 1e-5 and rows[0]["loop/sampler_trainer_logprob_gap"] < 1e-5
    assert abs(lagged - 1) > 1e-3, lagged


@pytest.mark.slow
@pytest.mark.timeout(1800)  # four runs of the CLI
def test_async_run_is_exact_across_runs_and_a_kill(tmp_path):
    """Async rollouts at lag 1, 3 iterations: two runs give bit-identical weights, and so
    does a run killed (SIGKILL) once iteration 0's checkpoint exists and rerun; no sampled
    episode is lost (the killed run's episode files equal the whole run's), and every
    episode records the version that played it: iteration j's, max(j − 1, 0)."""
    import signal
    import time

    tasks = runnable_answer_tasks(tmp_path / "tasks.jsonl")

    def cmd(out):
        return runnable_loop_cli(tasks, out, "--gradient_checkpointing", "true", "--async_rollouts", "true",
                                 "--staleness", "1", iterations=3)

    runs = {name: tmp_path / name for name in ("a", "b", "killed")}
    for name in ("a", "b"):
        res = subprocess.run(cmd(runs[name]), cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
    assert "the sampler's model copy holds" in res.stdout + res.stderr
    proc = subprocess.Popen(cmd(runs["killed"]), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900
    while not (runs["killed"] / "checkpoint-0" / "state.json").exists() and time.time() < deadline \
            and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (runs["killed"] / "final").exists(), "the run finished before it could be killed"
    res = subprocess.run(cmd(runs["killed"]), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming" in res.stdout + res.stderr

    a = _final_weights(runs["a"] / "final")
    for name in ("b", "killed"):
        other = _final_weights(runs[name] / "final")
        assert a.keys() == other.keys() and all(torch.equal(a[k], other[k]) for k in a), name
        assert (runs[name] / "metrics.jsonl").read_text() == (runs["a"] / "metrics.jsonl").read_text(), name
    rows = [json.loads(line) for line in (runs["a"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["loop/policy_lag"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["loop/optimizer_steps"] > 0 for r in rows), rows
    for j in range(3):
        name = f"iter-{j:04d}.jsonl"
        stored = (runs["a"] / "episodes" / name).read_text()
        assert (runs["killed"] / "episodes" / name).read_text() == stored
        episodes = [json.loads(line) for line in stored.splitlines()]
        assert {e["meta"]["policy_version"] for e in episodes} == {max(j - 1, 0)}
        assert all(len(e["meta"]["trainer_logprobs"]) == 2 for e in episodes)  # one row per agent turn


def test_snapshots_count_iterations(tmp_path):
    """LOOP's path is counted in iterations (as its checkpoints): --snapshot_steps 1 over 2
    iterations writes path/step-1 and path/step-2, the last one the final model's weights."""
    out = tmp_path / "loop"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", "tiny",
           "--tasks", str(runnable_answer_tasks(tmp_path / "tasks.jsonl")), "--iterations", "2",
           "--tasks_per_iteration", "2", "--k", "4", "--temperature", "3", "--max_new_tokens", "1", "--max_turns", "2",
           "--learning_rate", "1e-3", "--snapshot_steps", "1", "--report_to", "none", "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in (out / "path").iterdir()) == ["step-1", "step-2"]
    a, b = _final_weights(out / "path" / "step-2"), _final_weights(out / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.heavy
def test_ppo_with_lora_and_kl_end_to_end(tmp_path):
    """The CLI with the value-head policy (LoRA, KL to the adapters-off model): it
    samples with the LM inside the wrapper, trains, and saves a loadable policy (no head)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "ppo"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "testbed", "--model", "tiny",
           "--tasks", str(runnable_answer_tasks(tmp_path / "tasks.jsonl")), "--advantage", "ppo", "--kl_coef", "0.1",
           "--lora", "true", "--lora_r", "4", "--iterations", "1", "--tasks_per_iteration", "2", "--k", "8",
           "--temperature", "3", "--max_new_tokens", "1", "--max_turns", "2", "--report_to", "none",
           "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["loop/episodes_kept"] == 16.0 and row["loop/optimizer_steps"] > 0 and "loss/value" in row
    assert "loop/kl" in row
    assert (out / "final-adapter" / "adapter_config.json").exists()
    AutoModelForCausalLM.from_pretrained(out / "final")  # a plain policy


@pytest.mark.slow
@pytest.mark.distributed
def test_two_process_run_matches_one_and_survives_a_kill(tmp_path, checkpoint_layout, kill_tree, dist):
    """The CLI under `accelerate launch` with 2 gloo processes, DDP or FSDP2, or a GPU config
    from $SWEET_DIST_CONFIGS (rollouts on the main one, broadcast; each step's turns dealt
    across both): one iteration gives the same episodes and metrics as 1 process and the
    same weights up to float32 summation order (Adam turns ~1e-9 gradient noise into ~1e-5
    steps); two iterations, SIGKILLed after iteration 0's checkpoint and relaunched, give
    the uninterrupted 2-process weights exactly. Under FSDP each process saves its own shard
    and the sampler's unsharded copy follows the updates (log-prob gap 0).

    Across process counts only iteration 0 is compared: iteration 1 is played by weights
    that agree to summation order, and inverse-transform sampling draws another token
    wherever a uniform lies within that round-off (~1e-8) of a boundary of the CDF."""
    import time

    tasks = runnable_answer_tasks(tmp_path / "tasks.jsonl")
    launch = [*dist.launch(29537), "-m"]

    def cmd(out, launcher=(sys.executable, "-m"), iterations=2):
        return runnable_loop_cli(tasks, out, "--kl_coef", "0.05", micro=1, launcher=launcher, iterations=iterations)

    runs = {"one": ((sys.executable, "-m"), 1), "two-1": (launch, 1), "two": (launch, 2)}
    for name, (launcher, iterations) in runs.items():
        res = subprocess.run(cmd(tmp_path / name, launcher, iterations), cwd=ROOT, capture_output=True, text=True,
                             timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in runs}
    assert all(r["loop/optimizer_steps"] > 0 for r in rows["one"])
    for r1, r2 in zip(rows["one"], rows["two-1"], strict=True):
        assert {k: v for k, v in r1.items() if k.startswith("env/")} == {k: v for k, v in r2.items() if k.startswith("env/")}
        assert r1["loss/policy"] == pytest.approx(r2["loss/policy"], abs=1e-5)
        assert r1["loop/kl"] == pytest.approx(r2["loop/kl"], abs=1e-5)  # π_ref loaded whole, also under ZeRO-3
    assert all(r["loop/sampler_trainer_logprob_gap"] < 1e-5 for r in rows["two"])  # it plays the trained weights
    a, b = _final_weights(tmp_path / "one" / "final"), _final_weights(tmp_path / "two-1" / "final")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=2e-4) for k in a)
    b = _final_weights(tmp_path / "two" / "final")

    killed = tmp_path / "killed"
    proc = subprocess.Popen(cmd(killed, launch), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 900
    while not (killed / "checkpoint-0" / "state.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    kill_tree(proc)  # the launcher and both workers
    time.sleep(1)
    assert not (killed / "final").exists(), "the run finished before it could be killed"
    assert checkpoint_layout(killed / "checkpoint-0") == (2, dist.sharded)
    res = subprocess.run(cmd(killed, launch), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming" in res.stdout + res.stderr
    c = _final_weights(killed / "final")
    assert all(torch.equal(b[k], c[k]) for k in b)


@pytest.mark.slow
@pytest.mark.distributed
def test_async_two_process_run_matches_one(tmp_path, dist):
    """Async rollouts at lag 1 with the decoupled loss under `accelerate launch` with 2 gloo
    processes (each launch config) and micro-batches of 1 turn, against 1 process with
    micro-batches of 4: iterations 0 and 1, both played by version 0, give the same episodes
    and metrics, the losses of version 1 up to float32 summation order (as the synchronous
    test above, which covers the standard loss); iteration 2 is played by version 1 and its
    copy matches the trainer. Iteration 2's episodes are not compared across process counts
    (the synchronous test says why)."""
    tasks = runnable_answer_tasks(tmp_path / "tasks.jsonl")

    runs = {"one": (4, (sys.executable, "-m")), "two": (1, (*dist.launch(29547), "-m"))}
    for name, (micro, launcher) in runs.items():
        cmd = runnable_loop_cli(tasks, tmp_path / name, "--async_rollouts", "true", "--staleness", "1",
                                "--decoupled_loss", "true", iterations=3, micro=micro, launcher=launcher)
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in runs}
    assert [r["loop/policy_lag"] for r in rows["two"]] == [0.0, 1.0, 1.0]
    assert all(r["loop/optimizer_steps"] > 0 for r in rows["one"])
    for r1, r2 in zip(rows["one"][:2], rows["two"][:2], strict=True):
        assert {k: v for k, v in r1.items() if k.startswith("env/")} == {k: v for k, v in r2.items() if k.startswith("env/")}
        assert r1["loss/policy"] == pytest.approx(r2["loss/policy"], abs=1e-5)
        assert r1["loop/behaviour_weight_mean"] == pytest.approx(r2["loop/behaviour_weight_mean"], abs=1e-5)
    assert all(r["loop/sampler_trainer_logprob_gap"] < 1e-5 for r in rows["two"])  # version j's copy vs the trainer at j
    for j in range(3):
        played = {name: [(e["task_id"], e["answer"], e["meta"]["policy_version"]) for e in map(
            json.loads, (tmp_path / name / "episodes" / f"iter-{j:04d}.jsonl").read_text().splitlines())]
            for name in runs}
        assert all({v for _, _, v in played[name]} == {max(j - 1, 0)} for name in runs)
        assert j == 2 or played["one"] == played["two"]


def test_normalize_advantages_by_hand():
    from sweet.algorithms.loop import normalize_advantages

    a = torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=torch.float64)
    n = normalize_advantages(a)
    assert n.tolist() == pytest.approx(((a - 0.5) / a.std()).tolist())
    assert float(n.mean()) == pytest.approx(0.0, abs=1e-12) and float(n.std()) == pytest.approx(1.0)
    assert normalize_advantages(torch.full((3,), 0.7, dtype=torch.float64)).abs().max() == 0


def test_ppo_iteration_zero_has_a_baseline(tmp_path, monkeypatch):
    """The value head starts at zero, so the GAE advantage of every turn is its episode's
    reward at iteration 0: without normalisation that is REINFORCE without a baseline;
    normalised (the default) the turns' advantages have mean 0 and std 1."""
    from sweet.algorithms import loop

    seen = {}
    original = loop.frozen_batch

    def recording(*args, **kwargs):
        items, metrics = original(*args, **kwargs)
        seen["adv"] = [it.advantage for it in items]
        seen["traj"] = [it.trajectory for it in items]
        seen["target"] = [it.value_target for it in items]
        return items, metrics

    monkeypatch.setattr(loop, "frozen_batch", recording)
    raw_update, raw = run_update(tmp_path, "raw", advantage="ppo", normalize_advantages=False)
    raw_adv, raw_target = seen["adv"], seen["target"]
    norm_update, norm = run_update(tmp_path, "norm", advantage="ppo")
    rewards = {0: 1.0, 1: 0.0, 2: 0.5, 3: 0.2, 4: 0.2, 5: 0.9}  # REWARDS by trajectory
    # V = 0 (zero head): A_t = R exactly for every turn of an episode (multi-turn ones too)
    assert len(raw_adv) > 6 and raw_adv == pytest.approx([rewards[g] for g in seen["traj"]], abs=1e-6)
    adv = torch.tensor(seen["adv"], dtype=torch.float64)
    assert float(adv.mean()) == pytest.approx(0.0, abs=1e-9) and float(adv.std()) == pytest.approx(1.0, abs=1e-6)
    assert seen["target"] == pytest.approx(raw_target)  # value targets stay the raw returns
    assert raw["loop/advantage_abs_mean"] == pytest.approx(norm["loop/advantage_abs_mean"])
    assert not _same(raw_update, norm_update)


def test_schedule_ends_at_zero_when_episodes_are_dropped():
    """The linear decay is planned for every episode (P steps per iteration); an iteration
    that dropped episodes takes fewer steps, which are spread over its share, and the
    schedule is moved to the iteration's end: the last step runs near zero and the run
    ends at zero, as with nothing dropped."""
    from sweet.core.trainer import advance_schedule, schedule_offset
    from sweet.core.config import TrainConfig
    from sweet.core.models import make_optimizer

    def run(steps_per_iteration, planned=6):
        w = torch.nn.Parameter(torch.zeros(1))
        opt, sched = make_optimizer(None, TrainConfig(learning_rate=1.0), len(steps_per_iteration) * planned,
                                    optimizer=torch.optim.SGD([w], lr=1.0))
        used = []
        for it, n in enumerate(steps_per_iteration):
            base = sched.last_epoch
            assert base == it * planned
            for j in range(n):
                advance_schedule(sched, base + schedule_offset(j, n, planned))
                used.append(opt.param_groups[0]["lr"])
                opt.step()
                sched.step()
            advance_schedule(sched, (it + 1) * planned)
        return used, sched.get_last_lr()[0]

    full, end_full = run([6, 6, 6])
    assert full == pytest.approx([1 - k / 18 for k in range(18)]) and end_full == 0.0  # plain stepping, unchanged
    dropped, end = run([2, 3, 0, 1])
    assert end == 0.0
    assert dropped == sorted(dropped, reverse=True)  # still a decay
    assert dropped == pytest.approx([1, 1 - 3 / 24, 1 - 6 / 24, 1 - 8 / 24, 1 - 10 / 24, 1 - 18 / 24])
    # before: one schedule step per optimiser step, the run would end at 1 - 6/24 = 0.75 of the peak
