"""LOOP: leave-one-out PPO for long-horizon agents (arXiv 2502.01600), online.

    python -m sweet.train_policy --algorithm loop --env testbed --model runs/warm_start/final \
        --iterations 10 --episodes_per_task 6 --output_dir runs/loop                      # CPU test bed
    python -m sweet.train_policy --algorithm loop --env backend --sampler vllm --lora true \
        --model hf:meta-llama/Llama-3.1-8B-Instruct --simulator openai:...@http://localhost:8000/v1 \
        --output_dir runs/loop-8b                                         # 1 GPU, vLLM rollouts
    ... --advantage grpo        # the paper's GRPO row (58.0); --advantage ppo: PPO + value head (50.8)
    ... --async_rollouts true --staleness 1 --decoupled_loss true  # play i+1's episodes while training i's

Each iteration (paper, Algorithm 1):
  1. sample `tasks_per_iteration` tasks and run K episodes per task with the current
     policy (`sweet.core.sampler`: the live model, or `--sampler vllm`, a vLLM engine that
     follows the weights); `--async_rollouts`: with the policy s = `staleness` iterations
     ago, played in a background thread during the previous iterations' training;
  2. reward R_k = the environment's score (fraction of tests passed);
  3. advantage, `--advantage`:
       loo  (LOOP, default)  A_k = R_k − 1/(K−1) Σ_{j≠k} R_j, not divided by the std;
       grpo                  A_k = (R_k − mean R) / (std R + 1e-6), std over the K (unbiased);
       ppo                   a scalar value head on the policy's last hidden state predicts
                             V(s_t) at each agent turn; the only reward R comes after the last
                             turn (γ = 1): δ_t = V_{t+1} − V_t (δ_{T−1} = R − V_{T−1}),
                             A_t = Σ_l λ^l δ_{t+l} (GAE over turns, `gae_lambda`), value
                             targets A_t + V_t, value loss `value_coef` · ½(V − target)²;
                             the policy's A_t normalised over the iteration's turns (below);
  4. loo/grpo: drop episodes with |A_k| < `min_abs_advantage` (ppo keeps all);
  5. `ppo_epochs` passes over the kept trajectories (off-policy reuse), `batch_size`
     trajectories per optimiser step, with the PPO clipped objective per token
         ℓ = −min(ρ·A, clip(ρ, 1/1.1, 1.1)·A) [+ kl_coef · KL],   ρ = π_θ / π_old,
     and the step's loss = mean over its trajectories of the mean over ALL the
     trajectory's action tokens (all its turns) of ℓ. `--decoupled_loss` (for stale
     episodes): the decoupled objective (Hilton et al. 2022, arXiv 2110.00641; AReaL)
         ℓ = −(π_prox / π_behav) · min(ρ·A, clip(ρ)·A),   ρ = π_θ / π_prox,
     π_prox the trainer's policy at the iteration's start and π_behav the sampler's, so the
     trust region sits around the current policy while the weight corrects the lag
     (tokens whose weight exceeds `behaviour_weight_cap` leave the loss);
No value network, no reference model, no KL term by default (LOOP).

Its actions are its own sampler's, at most `max_new_tokens` ids each (eos included), and an
action is never cut (sweet.core.tokens.fits): a `--max_new_tokens` of `--max_length` or more
could write one that no step can train on, and is refused before the run starts.

Exactness (any micro-batch size, process count, kill-and-resume), the PPO row and the
departures from the paper: docs/loop.md. The policy copy that samples: sweet.core.sampler.
"""

from __future__ import annotations

import json
import math
import random
import sys
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Sequence

from colbench.prompts import check_prompt_flags
from colbench.types import Episode
from engines.base import SamplingParams
from engines.vllm_engine import COLOCATED_GPU_MEMORY_UTILIZATION
from sweet.core.config import (LearningRates, ModelConfig, TrainConfig, agent_prompt_field, check_action_room,
                               check_choice, check_range, human_prompt_field, lr_field, max_reply_chars_field,
                               resolved_config, save_resolved_config, strict_tasks_field)
from sweet.core.fingerprint import begin_run
from sweet.core.models import load_model, load_tokenizer, set_seed
from sweet.core.policy_turns import SampledTurn, sampled_turns, score_turns, turn_batch, turn_forward
from sweet.core.rollouts import rollout_session, task_pool
from sweet.core.sampler import BACKENDS as SAMPLER_BACKENDS, Collector, Sampler, episode_metrics, iteration_seed
from sweet.core.trainer import Trainer, mark_finished, process_state, schedule_offset

if TYPE_CHECKING:
    import torch

ADVANTAGES = ("loo", "grpo", "ppo")
NO_VARIANCE_HINT = ("no reward variance: every group of K episodes got the same reward, so no episode has an "
                    "advantage and nothing was learned; start from a warm start, e.g. --model runs/warm_start/final "
                    "(python -m testbed.warm_start), or raise --episodes_per_task / --temperature")


@dataclass
class LoopConfig:
    engine_spec_fields = ("simulator",)  # a class attribute, not a flag: adds --request_timeout etc. (colbench.cli)
    env: str = field(default="testbed", metadata={"help": "environment: testbed, backend, frontend"})
    tasks: str = field(default="builtin:train", metadata={"help": "task source (file, builtin:train, hf:<id>)"})
    simulator: str | None = field(default="scripted:testbed", metadata={"help": "simulator spec"})
    iterations: int = field(default=10, metadata={"help": "LOOP iterations"})
    tasks_per_iteration: int = field(default=8, metadata={"help": "tasks sampled per iteration"})
    episodes_per_task: int = field(default=6, metadata={"help": "K: episodes per task per iteration (paper: 6)",
                                                         "aliases": ["--k"]})
    ppo_epochs: int = field(default=2, metadata={"help": "passes over each batch (off-policy reuse; public code: 2)"})
    clip_low: float = field(default=1 / 1.1, metadata={"help": "lower clip of the importance ratio"})
    clip_high: float = field(default=1.1, metadata={"help": "upper clip of the importance ratio"})
    ratio_level: str = field(default="token", metadata={"help": "importance ratio per token (the paper's), turn, trajectory"})
    advantage: str = field(default="loo", metadata={"help": "loo: leave-one-out (LOOP); grpo: group mean/std "
                                                            "normalised; ppo: learned value head + GAE over turns"})
    gae_lambda: float = field(default=1.0, metadata={"help": "ppo: GAE λ over turns, γ = 1 (1 = return minus "
                                                                 "V(s_t)); the paper does not give its PPO's settings"})
    value_coef: float = field(default=0.5, metadata={"help": "ppo: weight of the value loss"})
    normalize_advantages: bool = field(default=True, metadata={"help": "ppo: the advantages normalised over the "
                                                               "iteration's turns (standard PPO; docs/loop.md)"})
    min_abs_advantage: float = field(default=0.01, metadata={"help": "loo/grpo: drop episodes with |A| below this"})
    kl_coef: float = field(default=0.0, metadata={"help": "per-token KL penalty to the initial model (0: LOOP's none)"})
    old_logprobs: str = field(default="trainer", metadata={"help": "pi_old: the 'trainer' at the iteration's start "
                                                                   "(rho = 1 on its first step) or the 'sampler'"})
    max_logprob_gap: float = field(default=2.0, metadata={"help": "mask tokens whose sampler/trainer log-prob gap "
                                                                  "exceeds this (a guard the paper does not have)"})
    sampler: str = field(default="", metadata={"help": "'' = the live policy via transformers; 'vllm' = a vLLM engine "
                                                   "that follows the weights (LoRA adapter or weight copy) each iteration"})
    decoupled_loss: bool = field(default=False, metadata={"help": "clip around pi_prox (the trainer at the iteration's "
                                                         "start), weight tokens by pi_prox / pi_behav (AReaL)"})
    behaviour_weight_cap: float | None = field(default=None, metadata={
        "help": "decoupled_loss: tokens whose pi_prox / pi_behav exceeds this leave the loss (None: no cap)"})
    async_rollouts: bool = field(default=False, metadata={"help": "play iteration i+s's episodes (version i) in a "
                                                          "background thread while training on i's; pi_old: the sampler's"})
    staleness: int = field(default=1, metadata={"help": "async_rollouts: the fixed lag s in policy versions"})
    sampler_gpu_memory_utilization: float = field(default=COLOCATED_GPU_MEMORY_UTILIZATION, metadata={
        "help": "vllm sampler: its GPU share beside the policy (fits 8B LoRA on 80 GB: engines/vllm_engine.py)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    max_new_tokens: int = field(default=96, metadata={"help": "tokens per agent turn (< --max_length: an action is "
                                                              "never cut)"})
    max_turns: int | None = field(default=None, metadata={"help": "agent turns per episode (default: the env's limit)"})
    strict_tasks: bool = strict_tasks_field()
    agent_prompt: str | None = agent_prompt_field(collects=True)
    human_prompt: str | None = human_prompt_field()
    max_reply_chars: int | None = max_reply_chars_field()

    @property
    def k(self) -> int:
        """The paper's K: episodes per task (`episodes_per_task`)."""
        return self.episodes_per_task

    def __post_init__(self) -> None:
        check_prompt_flags(self.env, self.simulator, self.agent_prompt, self.human_prompt)  # PromptError: one line
        if self.episodes_per_task < 2:
            raise ValueError("LoopConfig.episodes_per_task must be >= 2 for leave-one-out advantages, "
                             f"got {self.episodes_per_task}")
        for names, low, high in ((("iterations", "tasks_per_iteration", "ppo_epochs", "max_new_tokens", "max_turns",
                                   "max_reply_chars"), 1, None), (("clip_low", "clip_high", "min_abs_advantage"), None, None),
                                 (("temperature", "staleness", "kl_coef", "value_coef"), 0, None), (("gae_lambda",), 0, 1)):
            for name in names:
                check_range(self, name, low=low, high=high)
        check_range(self, "max_logprob_gap", low=0, strict=True)
        if self.sampler == "vllm" and self.temperature > 2:
            raise ValueError(f"LoopConfig.temperature must be <= 2 with --sampler vllm, got {self.temperature}")
        if self.behaviour_weight_cap is not None:
            check_range(self, "behaviour_weight_cap", low=1)
            if not self.decoupled_loss:
                raise ValueError("LoopConfig.behaviour_weight_cap caps the decoupled loss's weight: it needs "
                                 "decoupled_loss true")
        if self.decoupled_loss and self.old_logprobs == "sampler":
            raise ValueError("LoopConfig.decoupled_loss clips around the trainer's policy (pi_prox) and weights by "
                             "the sampler's: old_logprobs 'sampler' contradicts it (leave it 'trainer')")
        check_range(self, "sampler_gpu_memory_utilization", low=0, high=1, strict=True)
        for name, choices in (("ratio_level", ("token", "turn", "trajectory")), ("advantage", ADVANTAGES),
                              ("old_logprobs", ("trainer", "sampler")), ("sampler", SAMPLER_BACKENDS)):
            check_choice(self, name, choices)
        if not 0 < self.clip_low <= 1 <= self.clip_high:
            raise ValueError(f"LoopConfig clip range must satisfy 0 < clip_low <= 1 <= clip_high, got "
                             f"[{self.clip_low}, {self.clip_high}]")


@dataclass
class LoopTrainConfig(TrainConfig):
    """TrainConfig with LOOP's meaning of a batch and the public code's learning rate."""

    LEARNING_RATES: ClassVar[LearningRates] = LearningRates(
        5e-6, 5e-5, "LOOP's public code: 5e-5 for its LoRA adapters; no full weights: 1/10 by the usual LoRA rule")
    learning_rate: float | None = lr_field(LEARNING_RATES)
    batch_size: int = field(default=8, metadata={"help": "trajectories per optimiser step, across all processes"})
    micro_batch_size: int = field(default=2, metadata={"help": "agent turns per forward pass per process (does not "
                                                               "change the update)"})


CONFIGS = (ModelConfig, LoopTrainConfig, LoopConfig)


# ---- advantages (step 3) ----------------------------------------------------------------


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_k = R_k − mean_{j≠k} R_j for rewards [..., K] of the same task (= K/(K−1)·(R_k − mean R))."""
    k = rewards.shape[-1]
    others_mean = (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)
    return rewards - others_mean


def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_k = (R_k − mean R) / (std R + eps) over the K rewards [..., K] (unbiased std)."""
    return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + eps)


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """PPO's batch normalisation: (A − mean A) / (std A + eps) over all the batch's turns
    (unbiased std); all equal: all zero."""
    import torch

    centred, std = advantages - advantages.mean(), advantages.std()
    if float(std) <= eps:  # no spread: nothing to prefer (and no rounding noise blown up by 1/eps)
        return torch.zeros_like(advantages)
    return centred / (std + eps)


def turn_gae(values: Sequence[float], reward: float, lam: float) -> tuple[list[float], list[float]]:
    """Per-turn advantages and value targets of one trajectory whose only reward R comes
    after its last turn (γ = 1): δ_t = V_{t+1} − V_t, δ_{T−1} = R − V_{T−1};
    A_t = Σ_l λ^l δ_{t+l}; target_t = A_t + V_t. λ = 1: A_t = R − V_t."""
    adv, running = [0.0] * len(values), 0.0
    for t in reversed(range(len(values))):
        nxt = values[t + 1] if t + 1 < len(values) else reward
        running = (nxt - values[t]) + lam * running
        adv[t] = running
    return adv, [a + v for a, v in zip(adv, values)]


def ppo_advantages(values: Sequence[Sequence[float]], rewards: Sequence[float], lam: float,
                   normalize: bool) -> tuple[torch.Tensor, list[float], torch.Tensor]:
    """PPO's advantage: `turn_gae` over each trajectory's turns (values[g]: V(s_t) of
    trajectory g's turns, rewards[g]: its R), concatenated in trajectory order. Returns
    (the policy's A_t, normalised over all the turns when `normalize`; the value targets
    A_t + V_t, never normalised; the raw A_t, float64)."""
    import torch

    raw, targets = [], []
    for v, r in zip(values, rewards):
        a, target = turn_gae(v, r, lam)
        raw += a
        targets += target
    raw_t = torch.tensor(raw, dtype=torch.float64)
    policy = normalize_advantages(raw_t) if normalize and len(raw) > 1 else raw_t
    return policy, targets, raw_t


def episode_advantages(episodes: Sequence[Episode], cfg: LoopConfig) -> tuple[list[Episode], list[float], dict]:
    """loo/grpo: each task group's advantages; returns the kept episodes (|A| ≥
    `min_abs_advantage`), their A and metrics. ppo: every episode, no A (its advantage
    comes per turn from the value head, `ppo_advantages`), the same group metrics."""
    import torch

    by_task: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_task.setdefault(ep.task_id, []).append(ep)
    kept, kept_adv, all_adv, flat = [], [], [], 0
    for group in by_task.values():
        rewards = torch.tensor([e.reward for e in group], dtype=torch.float64)
        flat += int(bool(torch.all(rewards == rewards[0])))
        if len(group) < 2:
            continue
        adv = grpo_advantages(rewards) if cfg.advantage == "grpo" else leave_one_out_advantages(rewards)
        all_adv += adv.tolist()
        for ep, a in zip(group, adv.tolist()):
            if abs(a) >= cfg.min_abs_advantage:
                kept.append(ep)
                kept_adv.append(a)
    a = torch.tensor(all_adv or [0.0])
    metrics = {"loop/advantage_std": float(a.std()) if len(all_adv) > 1 else 0.0,
               "loop/advantage_abs_mean": float(a.abs().mean()),
               "loop/groups_without_variance": flat / max(len(by_task), 1)}
    if cfg.advantage == "ppo":
        return list(episodes), [], metrics
    return kept, kept_adv, metrics


# ---- the loss (step 5) ------------------------------------------------------------------


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weight: torch.Tensor,
                        clip_low: float, clip_high: float, ratio_level: str = "token",
                        traj_log_ratio: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
                        kl_coef: float = 0.0, behaviour_weight: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Σ_tokens weight · ℓ, ℓ = −w_behav · min(ρ·A, clip(ρ)·A) + kl_coef · KL, and Σ weight · metric.

    logp, old_logp, ref_logp: [B, L] log π_θ, log π_old, log π_ref per token; weight: [B, L]
    (0 off the loss; 1/N_τ on the kept action tokens of trajectory τ, so that summing over
    any split of the trajectory's turns gives its token mean); advantages: [B] (the row's A).
    ratio_level: "token" ρ = π_θ/π_old per token; "turn" ρ = exp(mean over the row's tokens
    of log π_θ − log π_old); "trajectory" ρ = exp(traj_log_ratio [B]), the trajectory's mean
    log ratio at the current weights (computed beforehand, detached), with the gradient of
    that mean flowing through each of its tokens (the rows of a trajectory may sit in
    different micro-batches).
    behaviour_weight: [B, L] w_behav = π_prox / π_behav, constant (the decoupled objective:
    old_logp is then log π_prox); None: w_behav = 1, the standard objective."""
    import torch

    on = (weight > 0).to(logp.dtype)
    log_ratio = (logp - old_logp) * on
    if ratio_level == "token":
        log_rho = log_ratio
    elif ratio_level == "turn":
        row = log_ratio.sum(-1) / on.sum(-1).clamp(min=1)
        log_rho = row[:, None].expand_as(logp)
    elif ratio_level == "trajectory":
        if traj_log_ratio is None:
            raise ValueError("ratio_level 'trajectory' needs traj_log_ratio")
        # value: the trajectory's mean log ratio; gradient: d log π_θ(token) (its share of the mean
        # comes from the 1/N_τ weight)
        log_rho = traj_log_ratio.detach()[:, None].to(logp.dtype) + (logp - logp.detach())
    else:
        raise ValueError(f"ratio_level must be token, turn or trajectory, got {ratio_level!r}")
    rho = torch.exp(log_rho)
    adv = advantages[:, None].to(logp.dtype)
    per_token = -torch.minimum(rho * adv, torch.clamp(rho, clip_low, clip_high) * adv)
    w = weight.to(logp.dtype)
    if behaviour_weight is not None:
        per_token = per_token * behaviour_weight.detach().to(logp.dtype)
    policy = (per_token * w).sum()
    loss = policy
    rho_d = rho.detach()
    sums = {
        "loss/policy": policy.detach(),
        "loop/clip_fraction": (((rho_d < clip_low) | (rho_d > clip_high)).to(w.dtype) * w).sum(),
        "loop/ratio_mean": (rho_d * w).sum(),
    }
    if behaviour_weight is not None:
        sums["loop/behaviour_weight_mean"] = (behaviour_weight.detach().to(w.dtype) * w).sum()
    if ref_logp is not None and kl_coef > 0:
        r = (ref_logp - logp) * on
        kl = torch.exp(r) - r - 1  # k3: unbiased, >= 0
        loss = loss + kl_coef * (kl * w).sum()
        sums["loop/kl"] = (kl.detach() * w).sum()
    return loss, sums


def value_loss(values: torch.Tensor, targets: torch.Tensor, n_turns: torch.Tensor) -> torch.Tensor:
    """PPO's value loss per turn, ½(V(s_t) − target_t)² / T_τ ([B]): summed over a
    trajectory's turns it is the trajectory's turn mean."""
    return 0.5 * (values - targets) ** 2 / n_turns


# ---- the batch (step 4: built by the no-grad pass, never changed) -----------------------


@dataclass(frozen=True, eq=False)
class LoopTurn:
    """One agent turn as a training item, as the no-grad pass leaves it. `old`, `ref`:
    log π_old / log π_ref of the action tokens ([A]; ref None without KL; decoupled_loss:
    old is log π_prox); `keep`: [A] bool, tokens inside the gap guard; `traj_tokens`: N_τ,
    the trajectory's kept action tokens; `advantage`: the turn's A; `value_target`: ppo's
    A_t + V_t; `behaviour_weight`: decoupled_loss's π_prox / π_behav ([A], 0 above the cap);
    `traj_log_ratio`: ratio_level 'trajectory', set per step on a copy."""

    turn: SampledTurn
    advantage: float
    old: torch.Tensor
    ref: torch.Tensor | None
    keep: torch.Tensor
    traj_tokens: int
    value_target: float | None = None
    behaviour_weight: torch.Tensor | None = None
    traj_log_ratio: float = 0.0

    @property
    def trajectory(self) -> int:
        return self.turn.trajectory


def build_batch(turns: Sequence[SampledTurn], scored, advantages: Sequence[float],
                value_targets: Sequence[float] | None, cfg: LoopConfig) -> tuple[tuple[LoopTurn, ...], float]:
    """The iteration's immutable batch (π_old, π_ref, the gap guard per turn) and the mean
    |sampler − trainer| log-prob gap, the trainer's at the sampler's version: `scored` (this
    pass; sync rollouts) or the turn's `recomputed` (async). π_old: the trainer's, or the
    sampler's with `old_logprobs sampler` and always with `async_rollouts` (the ratio
    corrects the lag). `decoupled_loss`: π_old is π_prox (this pass's) and each token carries
    π_prox / π_behav (1 where the sampler recorded none), 0 above `behaviour_weight_cap`."""
    import torch

    sampler_old = (cfg.old_logprobs == "sampler" or cfg.async_rollouts) and not cfg.decoupled_loss
    gap_sum, n_gap, olds, keeps, weights = 0.0, 0, [], [], []
    for t, (lp, _, _) in zip(turns, scored):
        trainer_lp = lp if t.recomputed is None else torch.tensor(t.recomputed, dtype=torch.float32)
        old = (lp if cfg.decoupled_loss else trainer_lp).clone()
        keep = torch.ones(len(lp), dtype=torch.bool)
        weight = torch.ones(len(lp)) if cfg.decoupled_loss else None
        if t.sampler_logprobs is not None:
            n = min(len(t.sampler_logprobs), len(trainer_lp))
            s = torch.tensor(t.sampler_logprobs[:n], dtype=torch.float32)
            gap = (s - trainer_lp[:n]).abs()
            keep[:n] = gap <= cfg.max_logprob_gap
            gap_sum, n_gap = gap_sum + float(gap.sum()), n_gap + n
            if sampler_old:
                old[:n] = s
            if weight is not None:
                weight[:n] = torch.exp(lp[:n] - s)
        if weight is not None and cfg.behaviour_weight_cap is not None:
            weight[weight > cfg.behaviour_weight_cap] = 0.0
        olds.append(old)
        keeps.append(keep)
        weights.append(weight)
    tokens: dict[int, int] = {}
    for t, keep in zip(turns, keeps):
        tokens[t.trajectory] = tokens.get(t.trajectory, 0) + int(keep.sum())
    batch = tuple(LoopTurn(t, float(a), old, rf, keep, tokens[t.trajectory],
                           None if value_targets is None else value_targets[i], w)
                  for i, (t, a, old, (_, rf, _), keep, w)
                  in enumerate(zip(turns, advantages, olds, scored, keeps, weights)))
    return batch, gap_sum / max(n_gap, 1)


# ---- one iteration -----------------------------------------------------------------------


def make_loss_fn(cfg: LoopConfig, model_cfg: ModelConfig, pad_id: int, with_value: bool):
    """The trainer's loss hook: Σ over the micro-batch's turns of their trajectories' share
    of the step's loss (token weights 1/N_τ; the trainer divides by the trajectory count)."""
    import torch

    def loss_fn(model, items: Sequence[LoopTurn]):
        device = next(model.parameters()).device
        batch = turn_batch([it.turn for it in items], pad_id, model_cfg).to(device)
        logp, values = turn_forward(model, batch, with_value)
        old = torch.zeros_like(logp)
        ref = torch.zeros_like(logp) if cfg.kl_coef > 0 else None
        weight = torch.zeros_like(logp)
        behaviour = torch.ones_like(logp) if cfg.decoupled_loss else None
        for j, it in enumerate(items):
            pos = batch.action_mask[j].bool()
            old[j, pos] = it.old.to(device)
            if ref is not None:
                ref[j, pos] = it.ref.to(device)
            if behaviour is not None:
                behaviour[j, pos] = it.behaviour_weight.to(device, logp.dtype)
            weight[j, pos] = it.keep.to(device, logp.dtype) / max(it.traj_tokens, 1)
        adv = torch.tensor([it.advantage for it in items], device=device)
        traj_lr = torch.tensor([it.traj_log_ratio for it in items], device=device)
        loss, sums = clipped_policy_loss(logp, old, adv, weight, cfg.clip_low, cfg.clip_high, cfg.ratio_level,
                                         traj_lr, ref, cfg.kl_coef, behaviour)
        if with_value:
            target = torch.tensor([it.value_target for it in items], device=device)
            per_turn = value_loss(values, target, torch.tensor([it.turn.n_turns for it in items], device=device))
            loss = loss + cfg.value_coef * per_turn.sum()
            sums["loss/value"] = per_turn.detach().sum()
        return loss, {k: float(v) for k, v in sums.items()}

    return loss_fn


def trajectory_log_ratios(trainer, items: Sequence[LoopTurn], pad_id: int, model_cfg: ModelConfig,
                          with_value: bool) -> list[LoopTurn]:
    """ratio_level 'trajectory': copies of `items` carrying their trajectory's mean
    log π_θ − log π_old at the current weights."""
    scored = score_turns(trainer.model, [it.turn for it in items], trainer.accelerator, pad_id, model_cfg,
                         trainer.train.micro_batch_size, with_value)
    num: dict[int, float] = {}
    for it, (lp, _, _) in zip(items, scored):
        num[it.trajectory] = num.get(it.trajectory, 0.0) + float(((lp - it.old) * it.keep).sum())
    return [replace(it, traj_log_ratio=num[it.trajectory] / max(it.traj_tokens, 1)) for it in items]


def frozen_batch(trainer, turns: Sequence[SampledTurn], kept: Sequence[Episode], episode_adv: Sequence[float],
                 cfg: LoopConfig, model_cfg: ModelConfig, pad_id: int, ref=None) -> tuple[tuple[LoopTurn, ...], dict]:
    """Step 4, the no-grad pass at the current weights: log π (π_old and the gap guard's
    reference when rollouts are synchronous), log π_ref, and ppo's V(s_t), from which its
    advantages come (`ppo_advantages`; loo/grpo: `episode_adv` per kept trajectory).
    Returns the immutable batch and the pass's metrics."""
    import torch

    with_value = cfg.advantage == "ppo"
    scored = score_turns(trainer.model, turns, trainer.accelerator, pad_id, model_cfg, trainer.train.micro_batch_size,
                         with_value, ref)
    metrics, targets = {}, None
    if with_value:
        values: list[list[float]] = [[] for _ in kept]
        for t, (_, _, v) in zip(turns, scored):
            values[t.trajectory].append(v)
        policy_adv, targets, raw = ppo_advantages(values, [e.reward for e in kept], cfg.gae_lambda,
                                                  cfg.normalize_advantages)
        advantages = policy_adv.tolist()
        metrics = {"loop/advantage_abs_mean": float(raw.abs().mean()),  # before normalising (nothing to learn: 0)
                   "loop/advantage_std": float(raw.std()) if len(raw) > 1 else 0.0,
                   "loop/value_mean": float(torch.tensor([s[2] for s in scored]).mean())}
    else:
        advantages = [episode_adv[t.trajectory] for t in turns]
    batch, metrics["loop/sampler_trainer_logprob_gap"] = build_batch(turns, scored, advantages, targets, cfg)
    return batch, metrics


def minibatches(batch: Sequence[LoopTurn], size: int, seed: int, epoch: int) -> list[list[LoopTurn]]:
    """Epoch `epoch`'s optimiser steps: the batch's trajectories in a seeded order, `size`
    whole trajectories (all their turns) per step."""
    by_traj: dict[int, list[LoopTurn]] = {}
    for it in batch:
        by_traj.setdefault(it.trajectory, []).append(it)
    order = list(by_traj)
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [[it for g in order[s: s + size] for it in by_traj[g]] for s in range(0, len(order), size)]


def iteration(trainer, collector, it: int, cfg: LoopConfig, model_cfg: ModelConfig, tokenizer, ref=None,
              per_iteration: int = 0) -> dict[str, float]:
    """One LOOP iteration, the module docstring's steps; returns its metrics (the steps'
    means). `collector.episodes(it)`: the scored episodes (`Collector`); `per_iteration`:
    the iteration's share of the schedule, spread over the steps it takes (0: one schedule
    step per optimiser step)."""
    episodes = collector.episodes(it)  # 1-2: played and scored
    metrics = episode_metrics(episodes, it)
    kept, episode_adv, m = episode_advantages(episodes, cfg)  # 3-4 (ppo: from the values, below)
    metrics.update(m, **{"loop/episodes_kept": float(len(kept)), "loop/optimizer_steps": 0.0})
    turns, pad, with_value = sampled_turns(kept, tokenizer), tokenizer.pad_token_id, cfg.advantage == "ppo"
    if turns:
        batch, m = frozen_batch(trainer, turns, kept, episode_adv, cfg, model_cfg, pad, ref)  # no grad, immutable
        metrics.update(m)
        loss_fn = make_loss_fn(cfg, model_cfg, pad, with_value)
        seed, size = iteration_seed(trainer.train.seed, it), trainer.train.batch_size
        total = cfg.ppo_epochs * math.ceil(len({t.trajectory for t in turns}) / size)  # the steps it takes
        base, sums, n = trainer.scheduler.last_epoch, {}, 0
        trainer.model.train()
        for epoch in range(cfg.ppo_epochs):  # 5: epochs x minibatches of whole trajectories
            for step_items in minibatches(batch, size, seed, epoch):
                if per_iteration:
                    trainer.advance_schedule(base + schedule_offset(n, total, per_iteration))
                if cfg.ratio_level == "trajectory":
                    step_items = trajectory_log_ratios(trainer, step_items, pad, model_cfg, with_value)
                step = trainer.optimizer_step(step_items, loss_fn, lambda x: 1.0 if x.turn.first else 0.0)
                for k, v in step.items():
                    sums[k] = sums.get(k, 0.0) + v
                n += 1
        metrics.update({k: v / n for k, v in sums.items()}, **{"loop/optimizer_steps": float(n)})
    if per_iteration:
        trainer.advance_schedule((it + 1) * per_iteration)  # the iteration's share, whatever it dropped
    return metrics


# ---- the loop ----------------------------------------------------------------------------


def session(cfg: LoopConfig, main_process: bool = True):
    """The run's environment and human (`rollout_session`); only the main process, which plays, loads the human."""
    return rollout_session(cfg.env, cfg.simulator if main_process else None, max_turns=cfg.max_turns,
                           agent_prompt=cfg.agent_prompt, human_prompt=cfg.human_prompt if main_process else None,
                           max_reply_chars=cfg.max_reply_chars)


def report(trainer, it: int, metrics: dict[str, float]) -> bool:
    """Log iteration `it`; returns whether it learned (some update with some advantage:
    min_abs_advantage 0 keeps A = 0 episodes), warning when not."""
    learned = metrics["loop/optimizer_steps"] > 0 and metrics["loop/advantage_abs_mean"] > 0
    trainer.step = it  # LOOP counts checkpoints and metric rows in iterations
    trainer.log(metrics, step=it)
    trainer.accelerator.print(f"[loop] iteration {it}: " + json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    if not learned:
        trainer.accelerator.print(f"[loop] WARNING iteration {it}: nothing learned. " + (
            NO_VARIANCE_HINT if metrics["loop/groups_without_variance"] == 1.0 else
            "no kept episode has generated token ids to train on"), file=sys.stderr)
    return learned


def main(model_cfg: ModelConfig, train_cfg: TrainConfig, loop_cfg: LoopConfig) -> Path:
    """Run LOOP; returns the path of the final model (HF format)."""
    from sweet.core.value_head import ValueHeadModel

    out, configs = Path(train_cfg.output_dir), {"loop": loop_cfg, "model": model_cfg, "train": train_cfg}
    check_action_room(loop_cfg, "max_new_tokens", model_cfg)  # its actions are its sampler's: refused, not skipped
    if begin_run(out, configs, resume=train_cfg.resume) is not None:
        print(f"{out / 'final'} exists: training already finished (use a new output_dir or --resume false)")
        return out / "final"
    tasks = task_pool(loop_cfg.tasks, loop_cfg.env, strict=loop_cfg.strict_tasks)
    with session(loop_cfg, process_state().is_main_process) as (env, simulator):
        tokenizer = load_tokenizer(model_cfg.model)
        set_seed(train_cfg.seed)
        model = load_model(model_cfg)
        model = ValueHeadModel(model, policy=True) if loop_cfg.advantage == "ppo" else model
        trainer = Trainer(model_cfg, train_cfg, tokenizer, model=model, name="loop",
                          run_config=resolved_config(**configs))
        sampler = Sampler(trainer, model_cfg, tokenizer, backend=loop_cfg.sampler, keep_copy=loop_cfg.async_rollouts,
                          with_value=loop_cfg.advantage == "ppo",
                          gpu_memory_utilization=loop_cfg.sampler_gpu_memory_utilization)  # its copy: before sharding
        if loop_cfg.async_rollouts:
            trainer.accelerator.print(f"[loop] async rollouts at lag {loop_cfg.staleness}: the sampler's model copy holds "
                                      f"{sampler.copy_bytes / 2**20:.1f} MiB" + ("" if loop_cfg.decoupled_loss else
                                      "; --decoupled_loss true clips around the current policy instead of the stale "
                                      "one (docs/benchmarks.md, 'What async LOOP learns')"))
        per_iteration = loop_cfg.ppo_epochs * math.ceil(loop_cfg.tasks_per_iteration * loop_cfg.k
                                                        / train_cfg.batch_size)
        trainer.prepare(loop_cfg.iterations * per_iteration)
        # π_ref = the initial model: LoRA disables its adapters, full weights keep a frozen copy
        ref = None if loop_cfg.kl_coef == 0 else "disable_adapter" if model_cfg.lora else \
            load_model(model_cfg, trainable=False).to(trainer.accelerator.device)
        rng, n_tasks = random.Random(train_cfg.seed), min(loop_cfg.tasks_per_iteration, len(tasks))
        start = trainer.resume_iterations(replay=lambda: rng.sample(tasks, n_tasks))  # the same tasks after a resume
        if trainer.is_main:
            save_resolved_config(out, **configs)
        collector = Collector(trainer, sampler, env, simulator, draw=lambda: rng.sample(tasks, n_tasks),
                              iterations=loop_cfg.iterations, k=loop_cfg.k, lag=loop_cfg.staleness
                              if loop_cfg.async_rollouts else None, sampling=SamplingParams(
                                  temperature=loop_cfg.temperature, max_new_tokens=loop_cfg.max_new_tokens))
        ran = updated = 0
        with closing(sampler):
            collector.start(start)
            for it in range(start, loop_cfg.iterations):
                metrics = iteration(trainer, collector, it, loop_cfg, model_cfg, tokenizer, ref, per_iteration)
                collector.wait()  # the background rollout's episodes are on disk before the checkpoint
                ran, updated = ran + 1, updated + report(trainer, it, metrics)
                if trainer.snapshot_due(it + 1):  # LOOP's path is counted in iterations, as its checkpoints
                    trainer.snapshot(it + 1)
                trainer.save_checkpoint({"iteration": it})
    if train_cfg.snapshot_steps:
        trainer.snapshot(loop_cfg.iterations)  # the end of the path
    final = trainer.save_final()
    if trainer.is_main:
        mark_finished(out, final=final.name, step=trainer.step, updated_iterations=updated)
    trainer.accelerator.wait_for_everyone()
    if ran and not updated:
        raise SystemExit(f"LOOP: {ran} iteration(s) ran and none had a reward signal to learn from "
                         f"({NO_VARIANCE_HINT}). The unchanged model was saved to {final}.")
    return final
