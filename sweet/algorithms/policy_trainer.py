"""The policy losses on the trainer skeleton (sweet/core/trainer.py), shared by SWEET-RL
stage 2, multi-turn DPO, rejection fine-tuning and the warm start.

- DPO (`train_dpo`): each example is a `Pair` of segment tuples (one segment for a
  per-turn pair, one per agent turn for a trajectory); the loss is a mean over PAIRS.
  Reference log-probs are computed ONCE with the initial policy (for LoRA, the base
  model: fresh adapters are the identity), before any checkpoint is restored, split
  over processes, and cached in output_dir/ref_logprobs.pt under a content hash of the
  pairs, the model and the truncation (a rerun with other pairs recomputes them).
- SFT (`train_sft`): each example is one `Segment`; the loss is the NLL averaged over
  the action TOKENS of the whole optimiser step (not per micro-batch).
Both give the same update for any micro_batch_size and process count (the skeleton
normalises over the whole step). Checkpoints every `save_steps` optimiser steps.

Why not TRL's SFTTrainer/DPOTrainer (trl 1.16): both truncate only with `keep_start`,
which cuts the action, where we cut a context in the middle and keep the action whole;
DPOTrainer re-tokenises text, and neither scores a trajectory as a sum of turns each in
its own context (see sweet/algorithms/losses.py). TRL's DPO loss is the test oracle of ours instead
(tests/sweet/test_dpo_loss.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from sweet.algorithms.losses import dpo_loss
from sweet.core.config import ModelConfig, TrainConfig
from sweet.core.fingerprint import begin_run
from sweet.core.records import Pair
from sweet.core.nograd_pass import REFERENCE_CACHE, ReferenceCache, sharded_scores
from sweet.core.tokens import Segment
from sweet.core.trainer import Trainer, mark_finished

REF_CACHE = REFERENCE_CACHE  # sweet.core.nograd_pass's one format


@dataclass
class PolicyTrainConfig(TrainConfig):
    """TrainConfig plus the policy trainers' checkpoint cadence."""

    save_steps: int = field(default=100, metadata={"help": "checkpoint every N optimiser steps (0: only the final model)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.save_steps < 0:
            raise ValueError(f"{type(self).__name__}.save_steps must be >= 0, got {self.save_steps}")


def sequence_logps(model, model_cfg: ModelConfig, pad_id: int, groups: Sequence[Sequence[Segment]],
                   packed: bool = True):
    """Σ over each group's segments of the action log-probs, and the token counts: [G], [G].
    (A trajectory is a group: its log-prob is the sum of its turns' log-probs; a trajectory
    that is one token sequence runs as one row: segment_logps.)"""
    import torch

    from sweet.core.logprobs import segment_logps

    flat = [s for g in groups for s in g]
    sums, counts = segment_logps(model, flat, pad_id=pad_id, max_length=model_cfg.max_length, keep_head=model_cfg.keep_head,
                                 packed=packed)
    owner = torch.tensor([i for i, g in enumerate(groups) for _ in g], device=sums.device)
    out_sums = torch.zeros(len(groups), device=sums.device, dtype=sums.dtype).index_add(0, owner, sums)
    out_counts = torch.zeros(len(groups), device=sums.device, dtype=counts.dtype).index_add(0, owner, counts)
    return out_sums, out_counts


def dpo_loss_fn(pairs: Sequence[Pair], ref_logps, model_cfg: ModelConfig, pad_id: int, beta: float, nll_coef: float,
                anchors: Sequence[tuple[Segment, ...]] | None = None, anchor_coef: float = 0.0,
                loss_type: str = "sigmoid"):
    """The skeleton's loss hook over pair indices: Σ over the micro-batch's pairs of
    L_DPO (or L_IPO) + α·L_NLL [+ α_anchor·L_anchor] (sweet/algorithms/losses.py), chosen,
    rejected and anchor in one forward pass. `ref_logps`: [P, 2] tensor (chosen, rejected)
    of the reference model; `anchors[i]`: pair i's anchor action (its own segments)."""

    def loss_fn(model, idx: Sequence[int]):
        n = len(idx)
        groups = [pairs[i].chosen for i in idx] + [pairs[i].rejected for i in idx]
        if anchors is not None:
            groups += [anchors[i] for i in idx]
        logps, counts = sequence_logps(model, model_cfg, pad_id, groups)
        ref = ref_logps[list(idx)].to(logps.device)
        anchor = {} if anchors is None else {"anchor_logps": logps[2 * n:], "anchor_token_counts": counts[2 * n:],
                                             "anchor_coef": anchor_coef}
        loss, metrics = dpo_loss(logps[:n], logps[n:2 * n], ref[:, 0], ref[:, 1], counts[:n], beta=beta,
                                 nll_coef=nll_coef, loss_type=loss_type, rejected_token_counts=counts[n:2 * n],
                                 **anchor)
        return loss * n, {k: v * n for k, v in metrics.items()}  # means -> sums over pairs

    return loss_fn


def sft_loss_fn(segments: Sequence[Segment], model_cfg: ModelConfig, pad_id: int):
    """The skeleton's loss hook over segment indices: Σ of −log π over action tokens
    (count_fn: the segment's action tokens, so the step's loss is a token mean)."""

    def loss_fn(model, idx: Sequence[int]):
        logps, _ = sequence_logps(model, model_cfg, pad_id, [[segments[i]] for i in idx])
        loss_sum = -logps.sum()
        return loss_sum, {"loss/nll": loss_sum.item()}

    return loss_fn


def pairs_key(pairs: Sequence[Pair], model_cfg: ModelConfig) -> str:
    """Content hash of the pairs' tokens, the reference model and the truncation."""
    h = hashlib.sha256(json.dumps([model_cfg.model, model_cfg.max_length, model_cfg.keep_head]).encode())
    for p in pairs:
        for side in (p.chosen, p.rejected):
            h.update(json.dumps([[list(s.context), list(s.action)] for s in side]).encode())
        h.update(b"|")
    return h.hexdigest()


def reference_logps(trainer, pairs: Sequence[Pair], path: Path):
    """log π_ref(chosen), log π_ref(rejected) of every pair with the trainer's current
    (initial) model: a [P, 2] CPU float64 tensor, cached in `path` under `pairs_key`
    (sweet.core.nograd_pass: the one sharded no-grad pass and reference cache)."""
    import torch

    cache = ReferenceCache(path, pairs_key(pairs, trainer.model_cfg))
    cached = cache.load(len(pairs), trainer.accelerator.print)
    if cached is not None:
        return cached
    pad_id = int(trainer.tokenizer.pad_token_id)

    def score(chunk: list[int]) -> list[tuple[float, float]]:
        logps, _ = sequence_logps(trainer.model, trainer.model_cfg, pad_id,
                                  [pairs[i].chosen for i in chunk] + [pairs[i].rejected for i in chunk])
        n = len(chunk)
        return list(zip(logps[:n].tolist(), logps[n:].tolist()))

    out = torch.tensor(sharded_scores(trainer.accelerator, trainer.model, len(pairs), score,
                                      micro=trainer.train.micro_batch_size), dtype=torch.float64).reshape(len(pairs), 2)
    if trainer.accelerator.is_main_process:
        cache.save(out)
    trainer.accelerator.wait_for_everyone()
    return out


def finished_run(train: TrainConfig, keep: tuple[str, ...] = (), **configs: Any) -> Path | None:
    """Check output_dir against this run (sweet/core/fingerprint.py: another run's
    settings stop it, a fresh start moves an earlier run aside); output_dir/final when
    this same run is already finished."""

    final = Path(train.output_dir) / "final"
    if begin_run(train.output_dir, {**configs, "train": train}, resume=train.resume, keep=keep) is not None:
        print(f"{final} exists: training already finished (use a new output_dir or --resume false)")
        return final
    return None


def _trainer(model_cfg: ModelConfig, train: PolicyTrainConfig, tokenizer, n_items: int, run_config):
    if not n_items:
        raise ValueError(f"no training examples for {train.output_dir}: check the episodes and filters (see the log above)")
    trainer = Trainer(model_cfg, train, tokenizer, run_config=run_config, name="policy")
    trainer.prepare(trainer.steps_per_epoch(n_items) * train.num_epochs)
    return trainer


def train_dpo(pairs: Sequence[Pair], model_cfg: ModelConfig, train: PolicyTrainConfig, tokenizer, *, beta: float,
              nll_coef: float, run_config: dict[str, Any] | None = None, first_metrics: dict[str, float] | None = None,
              anchors: Sequence[tuple[Segment, ...]] | None = None, anchor_coef: float = 0.0,
              loss_type: str = "sigmoid") -> Path:
    """DPO (or IPO: `loss_type`) on `pairs` (each side a tuple of Segments), with `anchors[i]`
    pair i's anchor action when given (weight `anchor_coef`); returns output_dir/final."""
    if anchors is not None and len(anchors) != len(pairs):
        raise ValueError(f"train_dpo: {len(anchors)} anchors for {len(pairs)} pairs (one per pair)")
    trainer = _trainer(model_cfg, train, tokenizer, len(pairs), run_config)
    ref = reference_logps(trainer, pairs, Path(train.output_dir) / REF_CACHE)
    loss_fn = dpo_loss_fn(pairs, ref, model_cfg, int(tokenizer.pad_token_id), beta, nll_coef, anchors, anchor_coef,
                          loss_type)
    final = trainer.fit(list(range(len(pairs))), loss_fn, save_steps=train.save_steps, first_metrics=first_metrics)
    return _mark(trainer, final)


def train_sft(segments: Sequence[Segment], model_cfg: ModelConfig, train: PolicyTrainConfig, tokenizer, *,
              run_config: dict[str, Any] | None = None, first_metrics: dict[str, float] | None = None) -> Path:
    """Token-mean NLL on the action tokens of `segments`; returns output_dir/final."""
    trainer = _trainer(model_cfg, train, tokenizer, len(segments), run_config)
    loss_fn = sft_loss_fn(segments, model_cfg, int(tokenizer.pad_token_id))
    final = trainer.fit(list(range(len(segments))), loss_fn, lambda i: len(segments[i].action),
                        save_steps=train.save_steps, first_metrics=first_metrics)
    return _mark(trainer, final)


def _mark(trainer, final: Path) -> Path:
    """The run is finished: write the marker (main process), after every output."""

    if trainer.is_main:
        mark_finished(trainer.out, final=final.name, step=trainer.step)
    trainer.accelerator.wait_for_everyone()
    return final
