"""LOOP: leave-one-out PPO for long-horizon agents (arXiv 2502.01600), online.

    python -m sweet.train_policy --algorithm loop --env testbed --model runs/warm_start/final \
        --iterations 10 --k 6 --output_dir runs/loop                      # CPU test bed
    python -m sweet.train_policy --algorithm loop --env backend --sampler vllm --lora true \
        --model hf:meta-llama/Llama-3.1-8B-Instruct --simulator openai:...@http://localhost:8000/v1 \
        --output_dir runs/loop-8b                                         # 1 GPU, vLLM rollouts

Each iteration (paper, Algorithm 1):
  1. sample `tasks_per_iteration` tasks and run K episodes per task with the current
     policy (transformers: the very model in memory; `--sampler vllm`: a vLLM engine
     that loads the new LoRA adapter or weights after every update);
  2. reward R_k = the environment's score (fraction of tests passed);
  3. leave-one-out advantage  A_k = R_k − 1/(K−1) Σ_{j≠k} R_j   (no division by the
     standard deviation: normalising cost the paper 9 points; `--normalize_std` turns it
     on for the GRPO-style ablation);
  4. drop episodes with |A_k| < 0.01;
  5. `ppo_epochs` passes over the kept episodes (off-policy reuse) with the PPO clipped
     objective per token:  L = −min(ρ·A, clip(ρ, 1/1.1, 1.1)·A),  ρ = π_θ / π_old,
     averaged over each trajectory's action tokens, then over trajectories.
No value network, no reference model, no KL term (all by default; `--kl_coef` adds a
KL penalty to the initial model, which then is computed once per iteration).

LOOP runs in one process (rollouts, then updates, on one device); it does not yet
shard rollouts across `accelerate launch` processes.

Departures, stated: the importance ratio can be per token (default, the paper's best),
per turn or per trajectory (the paper's ablation). π_old defaults to the trainer's
own recomputation at the start of the iteration (so ρ = 1 exactly on the first
minibatch); the sampler's log-probs are compared with it and the gap is logged, and
tokens whose gap exceeds `max_logprob_gap` are masked out (guard against a sampler
that drifted, e.g. a vLLM engine with stale weights). Each agent turn is its own
training sequence (its recorded prompt ids + its generated ids + end of turn), so
simulator tokens never enter the loss and nothing is re-tokenised.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from colbench.types import Episode
from sweet.training import ModelConfig, TrainConfig


@dataclass
class LoopConfig:
    env: str = field(default="testbed", metadata={"help": "environment: testbed, backend, frontend"})
    tasks: str = field(default="builtin:train", metadata={"help": "task source (file, builtin:train, hf:<id>)"})
    simulator: str | None = field(default="scripted:testbed", metadata={"help": "simulator spec"})
    iterations: int = field(default=10, metadata={"help": "LOOP iterations"})
    tasks_per_iteration: int = field(default=8, metadata={"help": "tasks sampled per iteration"})
    k: int = field(default=6, metadata={"help": "episodes per task (K)"})
    ppo_epochs: int = field(default=2, metadata={"help": "passes over each batch (off-policy reuse)"})
    trajectories_per_step: int = field(default=8, metadata={"help": "trajectories per optimiser step"})
    clip_low: float = field(default=1 / 1.1, metadata={"help": "lower clip of the importance ratio"})
    clip_high: float = field(default=1.1, metadata={"help": "upper clip of the importance ratio"})
    ratio_level: str = field(default="token", metadata={"help": "importance ratio per token, turn or trajectory"})
    normalize_std: bool = field(default=False, metadata={"help": "divide advantages by their std (GRPO-style ablation)"})
    min_abs_advantage: float = field(default=0.01, metadata={"help": "drop episodes with |A| below this"})
    kl_coef: float = field(default=0.0, metadata={"help": "KL penalty to the initial model (0 = none, as LOOP)"})
    old_logprobs: str = field(default="trainer", metadata={"help": "pi_old from the 'trainer' (recomputed) or the 'sampler'"})
    max_logprob_gap: float = field(default=2.0, metadata={"help": "mask tokens whose sampler/trainer log-prob gap exceeds this"})
    sampler: str = field(default="", metadata={"help": "'' = the live policy via transformers; 'vllm' = a vLLM engine "
                                                   "that follows the weights (LoRA adapter or weight copy) each iteration"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    max_new_tokens: int = field(default=96, metadata={"help": "tokens per agent turn"})
    max_turns: int = field(default=4, metadata={"help": "agent turns per episode"})

    def __post_init__(self) -> None:
        if self.k < 2:
            raise ValueError(f"LoopConfig.k must be >= 2 for leave-one-out advantages, got {self.k}")
        if self.ratio_level not in ("token", "turn", "trajectory"):
            raise ValueError(f"LoopConfig.ratio_level must be token, turn or trajectory, got {self.ratio_level!r}")
        if self.old_logprobs not in ("trainer", "sampler"):
            raise ValueError(f"LoopConfig.old_logprobs must be 'trainer' or 'sampler', got {self.old_logprobs!r}")
        if self.sampler not in ("", "vllm"):
            raise ValueError(f"LoopConfig.sampler must be '' (live transformers model) or 'vllm', got {self.sampler!r}")
        if not 0 < self.clip_low <= 1 <= self.clip_high:
            raise ValueError(f"LoopConfig clip range must satisfy 0 < clip_low <= 1 <= clip_high, got "
                             f"[{self.clip_low}, {self.clip_high}]")


CONFIGS = (LoopConfig, ModelConfig, TrainConfig)


# ---- the maths ---------------------------------------------------------------------


def leave_one_out_advantages(rewards: torch.Tensor, normalize_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """A_k = R_k − mean_{j≠k} R_j for rewards [..., K] of the same task.

    Equivalently K/(K−1) · (R_k − mean R). With `normalize_std`, divide by the std of
    the K rewards (the GRPO-style variant the paper found 9 points worse)."""
    k = rewards.shape[-1]
    others_mean = (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)
    adv = rewards - others_mean
    if normalize_std:
        adv = adv / (rewards.std(-1, keepdim=True) + eps)
    return adv


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    group: torch.Tensor,
    n_groups: int,
    clip_low: float,
    clip_high: float,
    ratio_level: str = "token",
    turn: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped objective, averaged over each trajectory's tokens, summed over the
    trajectories present and divided by `n_groups` (the trajectories in the step).

    logp, old_logp: [B, L] log π_θ and log π_old of each token; mask: [B, L] 1 on action
    tokens; advantages: [B] (one per sequence, i.e. its trajectory's A); group: [B]
    trajectory index of each sequence; turn: [B] unique turn index (ratio_level "turn").
    """
    mask = mask.to(logp.dtype)
    log_ratio = (logp - old_logp) * mask
    if ratio_level == "token":
        log_rho = log_ratio
    else:
        # one ratio per turn / trajectory: exp(mean over its tokens of log π_θ − log π_old)
        key = turn if ratio_level == "turn" else group
        n_keys = int(key.max()) + 1
        num = torch.zeros(n_keys, dtype=logp.dtype, device=logp.device).index_add(0, key, log_ratio.sum(-1))
        den = torch.zeros(n_keys, dtype=logp.dtype, device=logp.device).index_add(0, key, mask.sum(-1))
        log_rho = (num / den.clamp(min=1))[key][:, None].expand_as(logp)
    rho = torch.exp(log_rho)
    adv = advantages[:, None].to(logp.dtype)
    per_token = -torch.minimum(rho * adv, torch.clamp(rho, clip_low, clip_high) * adv)
    # average over each trajectory's tokens (tokens may span several sequences of the group)
    n_groups_present = int(group.max()) + 1
    tok_per_group = torch.zeros(n_groups_present, dtype=logp.dtype, device=logp.device).index_add(0, group, mask.sum(-1))
    loss_per_group = torch.zeros(n_groups_present, dtype=logp.dtype, device=logp.device).index_add(
        0, group, (per_token * mask).sum(-1))
    present = tok_per_group > 0
    loss = (loss_per_group[present] / tok_per_group[present]).sum() / n_groups
    rho = rho.detach()
    clipped = ((rho < clip_low) | (rho > clip_high)).to(logp.dtype) * mask
    metrics = {
        "loop/clip_fraction": float(clipped.sum() / mask.sum().clamp(min=1)),
        "loop/ratio_mean": float((rho * mask).sum() / mask.sum().clamp(min=1)),
    }
    return loss, metrics


# ---- data --------------------------------------------------------------------------


@dataclass
class TurnExample:
    """One agent turn as a training sequence, with its trajectory's advantage."""

    context: list[int]
    action: list[int]  # generated ids + end-of-turn id
    sampler_logprobs: list[float] | None  # for the generated ids (not the end-of-turn id)
    advantage: float
    group: int  # trajectory index within the iteration
    turn: int  # unique turn index within the iteration


def turn_examples(episodes: Sequence[Episode], advantages: Sequence[float], tokenizer) -> list[TurnExample]:
    from sweet.tokens import template_ids

    out = []
    for g, (ep, adv) in enumerate(zip(episodes, advantages)):
        for t in ep.agent_turns:
            if not t.token_ids:
                continue
            context = list(t.prompt_token_ids) if t.prompt_token_ids is not None else template_ids(tokenizer, t.prompt)
            out.append(TurnExample(context, list(t.token_ids) + [tokenizer.eos_token_id], t.logprobs, adv, g, len(out)))
    return out


def _batch(examples: Sequence[TurnExample], pad_id: int, max_length: int, keep_head: int):
    from sweet.tokens import make_batch

    batch = make_batch([(e.context, e.action) for e in examples], pad_id, max_length, keep_head)
    adv = torch.tensor([e.advantage for e in examples])
    groups = {g: i for i, g in enumerate(dict.fromkeys(e.group for e in examples))}
    group = torch.tensor([groups[e.group] for e in examples])
    turn = torch.arange(len(examples))
    return batch, adv, group, turn


def _action_positions(batch, i: int) -> torch.Tensor:
    return batch.action_mask[i].nonzero().squeeze(-1)


# ---- the loop ----------------------------------------------------------------------


def load_env_and_tasks(cfg: LoopConfig):
    from colbench.envs import make_env
    from colbench.tasks import load_tasks

    env = make_env(cfg.env)
    env.max_turns = cfg.max_turns
    tasks = load_tasks(cfg.tasks, env=cfg.env, validate=False)
    if not tasks:
        raise ValueError(f"--tasks {cfg.tasks}: no tasks for env {cfg.env!r}")
    return env, tasks


class Sampler:
    """The engine that plays the episodes, always following the trained weights.

    hf (default): wraps the live policy in memory, so it needs no syncing.
    vllm: a vLLM engine started from the initial model; after each update `sync`
    loads the new LoRA adapter (saved to output_dir/sampler-adapter) or copies the
    full weights in, and the sampler/trainer log-prob gap measures any drift.
    """

    def __init__(self, kind: str, policy, tokenizer, model_path: str, lora: bool, out: Path):
        from engines.hf import HFEngine

        self.kind, self.policy, self.tokenizer, self.out = kind, policy, tokenizer, out
        if kind == "vllm":
            from engines.base import EngineOptions
            from engines.vllm_engine import COLOCATED_GPU_MEMORY_UTILIZATION, VLLMEngine

            # the sampler shares the GPU with the policy being trained (arithmetic in engines.vllm_engine)
            options = EngineOptions(enable_lora=lora, gpu_memory_utilization=COLOCATED_GPU_MEMORY_UTILIZATION,
                                    max_lora_rank=policy.peft_config["default"].r if lora else None)
            self.engine = VLLMEngine(model_path, options, spec=f"vllm:{model_path}")
            self.lora = lora
            self.sync()  # a resumed policy differs from the initial weights
        else:
            self.engine = HFEngine.from_model(policy, tokenizer, spec="hf:loop-policy")

    def sync(self) -> None:
        if self.kind != "vllm":
            return
        if self.lora:
            path = self.out / "sampler-adapter"
            self.policy.save_pretrained(path)
            self.engine.load_lora(str(path))
        else:
            self.engine.update_weights(self.policy.state_dict().items())


def collect(sampler: Sampler, env, simulator, tasks, cfg: LoopConfig, seed: int, out_path: Path) -> list[Episode]:
    """K episodes per task with the current policy."""
    from colbench.agents import ModelAgent
    from colbench.rollout import episode_seeds, rollout
    from engines.base import SamplingParams

    agent = ModelAgent(sampler.engine, SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
                       name="policy")
    return rollout(env, tasks, agent, simulator, seeds=episode_seeds(seed, cfg.k), max_turns=cfg.max_turns,
                   out_path=out_path)


@torch.no_grad()
def recompute_old_logprobs(model, examples, pad_id, model_cfg, micro: int) -> list[torch.Tensor]:
    """π_old per example (action positions only), from the trainer's forward pass."""
    from sweet.tokens import token_logprobs

    model.eval()
    out = []
    for s in range(0, len(examples), micro):
        chunk = examples[s: s + micro]
        batch, *_ = _batch(chunk, pad_id, model_cfg.max_length, model_cfg.keep_head)
        lp = token_logprobs(model, batch.to(next(model.parameters()).device)).cpu()
        out += [lp[i, _action_positions(batch, i)] for i in range(len(chunk))]
    return out


def logprob_gap(examples: Sequence[TurnExample], trainer_old: Sequence[torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
    """Mean |sampler − trainer| log-prob over generated tokens, and per-example guard masks
    (1 = keep) that drop tokens whose gap exceeds the threshold later."""
    gaps, total = [], 0
    for e, t in zip(examples, trainer_old):
        if e.sampler_logprobs is None:
            gaps.append(torch.zeros(len(e.action)))
            continue
        s = torch.tensor(list(e.sampler_logprobs) + [float(t[-1])])  # end-of-turn: no sampler value
        gaps.append((s - t).abs())
        total += len(e.sampler_logprobs)
    mean = float(sum(g[:-1].sum() for g in gaps) / max(total, 1))
    return mean, gaps


def iteration_update(model, optimizer, scheduler, accelerator, examples, old, gaps, cfg: LoopConfig, model_cfg,
                     train_cfg, pad_id: int) -> dict[str, float]:
    """`ppo_epochs` passes over the kept trajectories; returns averaged metrics."""
    from sweet.tokens import token_logprobs

    model.train()
    by_group: dict[int, list[int]] = {}
    for i, e in enumerate(examples):
        by_group.setdefault(e.group, []).append(i)
    groups = list(by_group)
    sums: dict[str, float] = {}
    n = 0
    for epoch in range(cfg.ppo_epochs):
        random.shuffle(groups)
        for s in range(0, len(groups), cfg.trajectories_per_step):
            step_groups = groups[s: s + cfg.trajectories_per_step]
            idx = [i for g in step_groups for i in by_group[g]]
            optimizer.zero_grad()
            for m in range(0, len(idx), train_cfg.micro_batch_size):
                chunk = idx[m: m + train_cfg.micro_batch_size]
                batch, adv, group, turn = _batch([examples[i] for i in chunk], pad_id, model_cfg.max_length,
                                                 model_cfg.keep_head)
                # groups numbered within the step so the loss divides by the step's trajectories
                group = torch.tensor([step_groups.index(examples[i].group) for i in chunk])
                old_lp = torch.zeros_like(batch.input_ids, dtype=torch.float32)
                keep = batch.action_mask.clone()
                for j, i in enumerate(chunk):
                    pos = _action_positions(batch, j)
                    old_lp[j, pos] = old[i]
                    keep[j, pos] = (gaps[i] <= cfg.max_logprob_gap).long()
                device = next(model.parameters()).device
                batch = batch.to(device)
                logp = token_logprobs(model, batch)
                loss, metrics = clipped_policy_loss(
                    logp, old_lp.to(device), adv.to(device), keep.to(device), group.to(device), len(step_groups),
                    cfg.clip_low, cfg.clip_high, cfg.ratio_level, turn.to(device))
                accelerator.backward(loss)
                for k, v in {**metrics, "loss/policy": float(loss.detach())}.items():
                    sums[k] = sums.get(k, 0.0) + v
                n += 1
            if train_cfg.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), train_cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
        sums["loop/epochs"] = epoch + 1
    out = {k: v / max(n, 1) for k, v in sums.items() if k != "loop/epochs"}
    out["loop/off_policy_reuse"] = float(cfg.ppo_epochs)
    return out


def main(loop_cfg: LoopConfig, model_cfg: ModelConfig, train_cfg: TrainConfig) -> Path:
    """Run LOOP; returns the path of the final checkpoint (HF format)."""
    from colbench.types import Episode as _Episode  # noqa: F401  (episodes are written as JSONL)
    from simulators import load_simulator
    from sweet.training import (MetricsLogger, latest_checkpoint, load_model, load_tokenizer, load_trainer_state,
                                make_accelerator, make_optimizer, resolve_model_path, save_checkpoint, save_final,
                                save_resolved_config, set_seed)

    out = Path(train_cfg.output_dir)
    set_seed(train_cfg.seed)
    env, tasks = load_env_and_tasks(loop_cfg)
    simulator = load_simulator(loop_cfg.simulator, env)
    accelerator = make_accelerator(train_cfg)
    tokenizer = load_tokenizer(model_cfg.model)
    ckpt = latest_checkpoint(out) if train_cfg.resume else None
    model = load_model(model_cfg, adapter=str(ckpt) if ckpt and model_cfg.lora else None)
    if ckpt and not model_cfg.lora:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(ckpt)
    steps_per_iter = loop_cfg.ppo_epochs * max(1, loop_cfg.tasks_per_iteration * loop_cfg.k // loop_cfg.trajectories_per_step)
    optimizer, scheduler = make_optimizer(model, train_cfg, loop_cfg.iterations * steps_per_iter)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    if ckpt:
        start = load_trainer_state(ckpt, optimizer, scheduler)["iteration"] + 1
        accelerator.print(f"resuming LOOP from {ckpt} (iteration {start})")
    save_resolved_config(out, loop=loop_cfg, model=model_cfg, train=train_cfg)
    logger = MetricsLogger(out, train_cfg.report_to, accelerator.is_main_process)
    rng = random.Random(train_cfg.seed)
    for _ in range(start):  # keep the task sampling identical after a resume
        rng.sample(tasks, min(loop_cfg.tasks_per_iteration, len(tasks)))
    policy = accelerator.unwrap_model(model)
    sampler = Sampler(loop_cfg.sampler, policy, tokenizer, resolve_model_path(model_cfg.model), model_cfg.lora, out)
    for it in range(start, loop_cfg.iterations):
        batch_tasks = rng.sample(tasks, min(loop_cfg.tasks_per_iteration, len(tasks)))
        episodes = collect(sampler, env, simulator, batch_tasks, loop_cfg, train_cfg.seed * 100_003 + it,
                           out / "episodes" / f"iter-{it:04d}.jsonl")
        metrics = _train_on(episodes, loop_cfg, model, policy, optimizer, scheduler, accelerator, model_cfg,
                            train_cfg, tokenizer)
        logger.log(metrics, step=it)
        accelerator.print(f"[loop] iteration {it}: " + json.dumps({k: round(v, 4) for k, v in metrics.items()}))
        save_checkpoint(accelerator, model, tokenizer, optimizer, scheduler, out, it, {"iteration": it})
        sampler.sync()
    logger.close()
    env.close()
    return save_final(accelerator, model, tokenizer, out)


def _train_on(episodes, loop_cfg, model, policy, optimizer, scheduler, accelerator, model_cfg, train_cfg, tokenizer):
    by_task: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_task.setdefault(ep.task_id, []).append(ep)
    kept_eps, kept_adv, all_adv = [], [], []
    for group in by_task.values():
        adv = leave_one_out_advantages(torch.tensor([e.reward for e in group]), loop_cfg.normalize_std)
        all_adv += adv.tolist()
        for ep, a in zip(group, adv.tolist()):
            if abs(a) >= loop_cfg.min_abs_advantage:
                kept_eps.append(ep)
                kept_adv.append(a)
    rewards = torch.tensor([e.reward for e in episodes])
    metrics = {
        "env/reward": float(rewards.mean()),
        "env/success_rate": float(sum(e.success for e in episodes) / len(episodes)),
        "env/turns": float(sum(len(e.agent_turns) for e in episodes) / len(episodes)),
        "loop/advantage_mean": float(torch.tensor(all_adv).mean()),
        "loop/advantage_std": float(torch.tensor(all_adv).std()),
        "loop/advantage_abs_mean": float(torch.tensor(all_adv).abs().mean()),
        "loop/episodes_kept": float(len(kept_eps)),
        "loop/episodes_total": float(len(episodes)),
    }
    examples = turn_examples(kept_eps, kept_adv, tokenizer)
    metrics["loop/leave_one_out_updates"] = float(len(kept_eps))
    if not examples:
        return metrics
    old = recompute_old_logprobs(policy, examples, tokenizer.pad_token_id, model_cfg, train_cfg.micro_batch_size)
    gap, gaps = logprob_gap(examples, old)
    metrics["loop/sampler_trainer_logprob_gap"] = gap
    if loop_cfg.old_logprobs == "sampler":
        old = [torch.tensor(list(e.sampler_logprobs) + [float(t[-1])]) if e.sampler_logprobs is not None else t
               for e, t in zip(examples, old)]
    metrics.update(iteration_update(model, optimizer, scheduler, accelerator, examples, old, gaps, loop_cfg,
                                    model_cfg, train_cfg, tokenizer.pad_token_id))
    return metrics
