"""The policy training loop shared by SWEET-RL stage 2, multi-turn DPO and rejection
fine-tuning: examples in, a checkpoint out (output_dir/final, HF format).

- Examples are `PreferenceItem`s (DPO: chosen and rejected segment lists, one segment
  for a per-turn pair, one per agent turn for a trajectory) or `Segment`s (SFT).
- DPO reference log-probs are computed ONCE, before the first update, with the
  initial policy (for LoRA, the base model: fresh adapters are the identity), split
  over processes, and saved to output_dir/ref_logps.json: a single model is in memory.
- Data order is a seeded permutation per epoch, split over processes and padded by
  cycling so that every process runs the same number of micro-batches (DDP needs it);
  a resumed run skips exactly the micro-batches already done.
- Checkpoints every `save_steps` optimiser steps (sweet.training.save_checkpoint);
  `resume` restarts from the latest one with its optimiser, scheduler and RNG.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from sweet.sequences import Segment, segment_logps
from sweet.training import (
    MetricsLogger,
    ModelConfig,
    TrainConfig,
    latest_checkpoint,
    load_model,
    load_trainer_state,
    make_accelerator,
    make_optimizer,
    save_checkpoint,
    save_final,
    set_seed,
)


@dataclass
class PolicyTrainConfig(TrainConfig):
    """TrainConfig plus the policy trainers' checkpoint cadence."""

    save_steps: int = field(default=100, metadata={"help": "checkpoint every N optimiser steps (0: only the final model)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.save_steps < 0:
            raise ValueError(f"{type(self).__name__}.save_steps must be >= 0, got {self.save_steps}")


@dataclass
class PreferenceItem:
    """One DPO pair. For per-turn pairs each side is one segment; for trajectory pairs,
    one segment per agent turn. Reference log-probs are filled before training."""

    chosen: tuple[Segment, ...]
    rejected: tuple[Segment, ...]
    ref_chosen_logps: float | None = None
    ref_rejected_logps: float | None = None


def epoch_micro_batches(n_items: int, *, epoch: int, seed: int, rank: int, world: int, micro: int,
                        accum: int = 1) -> list[list[int]]:
    """This process's micro-batches (item indices) for one epoch: a seeded permutation,
    padded by cycling to a multiple of world × micro × accum (so every optimiser step
    has `accum` full micro-batches on every process), dealt out round-robin."""
    order = list(range(n_items))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    per_round = world * micro
    per_step = per_round * accum
    padded = order + [order[i % n_items] for i in range((-n_items) % per_step)]
    rounds = [padded[i : i + per_round] for i in range(0, len(padded), per_round)]
    return [r[rank * micro : (rank + 1) * micro] for r in rounds]


def sequence_logps(model, model_cfg: ModelConfig, pad_id: int, groups: Sequence[Sequence[Segment]]):
    """Σ over each group's segments of the action log-probs, and the token counts: [G], [G]."""
    import torch

    flat = [s for g in groups for s in g]
    sums, counts = segment_logps(model, flat, pad_id=pad_id, max_length=model_cfg.max_length, keep_head=model_cfg.keep_head)
    owner = torch.tensor([i for i, g in enumerate(groups) for _ in g], device=sums.device)
    out_sums = torch.zeros(len(groups), device=sums.device, dtype=sums.dtype).index_add(0, owner, sums)
    out_counts = torch.zeros(len(groups), device=sums.device, dtype=counts.dtype).index_add(0, owner, counts)
    return out_sums, out_counts


def dpo_loss_fn(model_cfg: ModelConfig, pad_id: int, beta: float, nll_coef: float) -> Callable:
    """loss_fn(model, items) for PreferenceItems: chosen and rejected in one forward pass."""
    import torch

    from sweet.dpo import dpo_loss

    def loss_fn(model, items: Sequence[PreferenceItem]):
        logps, counts = sequence_logps(model, model_cfg, pad_id, [it.chosen for it in items] + [it.rejected for it in items])
        n = len(items)
        ref = torch.tensor([[it.ref_chosen_logps, it.ref_rejected_logps] for it in items], device=logps.device)
        return dpo_loss(logps[:n], logps[n:], ref[:, 0], ref[:, 1], counts[:n], beta=beta, nll_coef=nll_coef)

    return loss_fn


def sft_loss_fn(model_cfg: ModelConfig, pad_id: int) -> Callable:
    """loss_fn(model, segments): token-mean NLL over the action tokens."""
    from sweet.dpo import sft_loss

    def loss_fn(model, items: Sequence[Segment]):
        logps, counts = sequence_logps(model, model_cfg, pad_id, [[s] for s in items])
        return sft_loss(logps, counts)

    return loss_fn


def fill_ref_logps(accelerator, model, model_cfg: ModelConfig, pad_id: int, items: Sequence[PreferenceItem],
                   path: Path, micro: int) -> None:
    """Reference log-probs of every item with the current (initial) model, cached in `path`."""
    import torch
    from accelerate.utils import gather_object

    if path.exists():
        cached = json.loads(path.read_text())
        if len(cached) != len(items):
            raise ValueError(f"{path}: {len(cached)} reference log-probs for {len(items)} pairs; delete it or use a new output_dir")
        for it, (c, r) in zip(items, cached):
            it.ref_chosen_logps, it.ref_rejected_logps = c, r
        return
    mine = list(range(accelerator.process_index, len(items), accelerator.num_processes))
    values = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(mine), micro):
            chunk = [items[i] for i in mine[start : start + micro]]
            logps, _ = sequence_logps(model, model_cfg, pad_id, [it.chosen for it in chunk] + [it.rejected for it in chunk])
            n = len(chunk)
            values += [(i, float(c), float(r)) for i, c, r in zip(mine[start : start + n], logps[:n].tolist(), logps[n:].tolist())]
    model.train()
    for i, c, r in gather_object(values):
        items[i].ref_chosen_logps, items[i].ref_rejected_logps = c, r
    if accelerator.is_main_process:
        path.write_text(json.dumps([[it.ref_chosen_logps, it.ref_rejected_logps] for it in items]))
    accelerator.wait_for_everyone()


def load_policy(model_cfg: ModelConfig, ckpt: Path | None):
    """The trainable policy, from the latest checkpoint when resuming."""
    if ckpt is None:
        return load_model(model_cfg)
    if model_cfg.lora:
        return load_model(model_cfg, adapter=str(ckpt))
    return load_model(replace(model_cfg, model=str(ckpt), lora=False))


def run_training(
    items: Sequence[Any],
    loss_fn_factory: Callable[[int], Callable],
    model_cfg: ModelConfig,
    train: PolicyTrainConfig,
    tokenizer,
    *,
    preference: bool,
    run_config: dict[str, Any] | None = None,
    extra_metrics: dict[str, float] | None = None,
) -> Path:
    """Train on `items` and save output_dir/final. `loss_fn_factory(pad_id)` builds
    loss_fn(model, micro_items) -> (loss, metrics). For `preference` items the
    reference log-probs are filled first. Returns the final model's folder."""
    from tqdm.auto import tqdm

    out = Path(train.output_dir)
    if train.resume and (out / "final" / "config.json").exists():
        print(f"{out / 'final'} exists: training already finished (use a new output_dir or --resume false)")
        return out / "final"
    if not items:
        raise ValueError(f"no training examples for {out}: check the episodes and filters (see the log above)")
    accelerator = make_accelerator(train)
    set_seed(train.seed)
    pad_id = int(tokenizer.pad_token_id)
    ckpt = latest_checkpoint(out) if train.resume else None
    model = load_policy(model_cfg, ckpt).to(accelerator.device)
    model.train()
    if preference:
        fill_ref_logps(accelerator, model, model_cfg, pad_id, items, out / "ref_logps.json", train.micro_batch_size)

    world, rank, micro = accelerator.num_processes, accelerator.process_index, train.micro_batch_size
    accum = accelerator.gradient_accumulation_steps
    per_epoch = [epoch_micro_batches(len(items), epoch=e, seed=train.seed, rank=rank, world=world, micro=micro,
                                     accum=accum) for e in range(train.num_epochs)]
    steps_per_epoch = len(per_epoch[0]) // accum
    total_steps = steps_per_epoch * train.num_epochs
    optimizer, scheduler = make_optimizer(model, train, total_steps)
    if accelerator.state.deepspeed_plugin is not None:  # no dataloader to infer it from
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = micro
    model, optimizer = accelerator.prepare(model, optimizer)
    step = 0
    if ckpt is not None:
        step = load_trainer_state(ckpt, optimizer, scheduler)["step"]
        accelerator.print(f"resuming from {ckpt} (step {step} of {total_steps})")
        if accelerator.is_main_process:
            _trim_metrics(out / "metrics.jsonl", step)
    logger = MetricsLogger(out, train.report_to, accelerator.is_main_process, run_config)
    if extra_metrics and step == 0:
        logger.log(extra_metrics, step=0)
    loss_fn = loss_fn_factory(pad_id)
    bar = tqdm(total=total_steps, initial=step, desc="policy", disable=not accelerator.is_main_process)
    while step < total_steps:
        epoch, k = divmod(step, steps_per_epoch)
        group = per_epoch[epoch][k * accum : (k + 1) * accum]
        metrics = _optimizer_step(accelerator, model, optimizer, scheduler, loss_fn, items, group, train)
        step += 1
        bar.update(1)
        if step % train.logging_steps == 0 or step == total_steps:
            logger.log({**metrics, "train/lr": scheduler.get_last_lr()[0], "train/epoch": step / steps_per_epoch}, step)
        if train.save_steps and step % train.save_steps == 0 and step < total_steps:
            save_checkpoint(accelerator, model, tokenizer, optimizer, scheduler, out, step, {"total_steps": total_steps})
    bar.close()
    logger.close()
    final = save_final(accelerator, model, tokenizer, out)
    accelerator.print(f"saved {final} (use it as --agent hf:{final})")
    return final


def _optimizer_step(accelerator, model, optimizer, scheduler, loss_fn, items, group, train) -> dict[str, float]:
    """Accumulate gradients over the micro-batches of `group`, step, return mean metrics
    (averaged over micro-batches and processes)."""
    import contextlib

    import torch

    sums: dict[str, float] = {}
    for i, idx in enumerate(group):  # len(group) == accum (epoch_micro_batches pads)
        last = i == len(group) - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            loss, metrics = loss_fn(model, [items[j] for j in idx])
            accelerator.backward(loss)  # divides by the accumulation steps
        for key, v in metrics.items():
            sums[key] = sums.get(key, 0.0) + v / len(group)
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), train.max_grad_norm)
    grad_norm = float("nan") if grad_norm is None else float(grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    keys = sorted(sums)
    values = torch.tensor([sums[k] for k in keys] + [grad_norm], device=accelerator.device)
    values = accelerator.reduce(values, reduction="mean")
    return {**dict(zip(keys, values[:-1].tolist())), "train/grad_norm": values[-1].item()}


def _trim_metrics(path: Path, last_step: int) -> None:
    """Drop rows logged after the checkpoint we resume from (they are logged again)."""
    if path.exists():
        rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
        path.write_text("".join(r + "\n" for r in rows))
