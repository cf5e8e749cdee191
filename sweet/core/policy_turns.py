"""An episode's agent turns as token rows, and their log-probs under a model (no grad).

The one turn -> tokens rule of the online trainers (`sweet.core.tokens.turn_segment`: the
turn's recorded prompt ids + its generated ids), shared by LOOP's frozen batch and by the
sampler that recomputes the trainer's log-probs of the episodes it played
(`sweet.core.sampler`).

    turns = sampled_turns(episodes, tokenizer)
    scored = score_turns(model, turns, accelerator, tokenizer.pad_token_id, model_cfg, micro=4)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from colbench.types import Episode
from sweet.core.config import ModelConfig
from sweet.core.nograd_pass import sharded_scores
from sweet.core.tokens import make_batch, turn_segment

if TYPE_CHECKING:
    import torch

TRAINER_LOGPROBS = "trainer_logprobs"  # Episode.meta: async rollouts' recomputation, per agent turn with ids


@dataclass(frozen=True, eq=False)
class SampledTurn:
    """One agent turn as played: its recorded prompt ids and generated ids (`turn_segment`),
    the sampler's log-probs of those ids ([A] or None), the trainer's log-probs of them at
    the sampler's policy version ([A], async rollouts: `Collector`; else None), its
    trajectory and place in it."""

    context: tuple[int, ...]
    action: tuple[int, ...]
    sampler_logprobs: list[float] | None
    trajectory: int
    first: bool  # the trajectory's first turn: counts the trajectory once in the step's normaliser
    n_turns: int  # T_τ, the trajectory's agent turns with generated ids
    recomputed: list[float] | None = None


def sampled_turns(episodes: Sequence[Episode], tokenizer) -> list[SampledTurn]:
    """Every agent turn with generated ids, in trajectory order (the one turn->tokens rule)."""
    out: list[SampledTurn] = []
    for g, ep in enumerate(episodes):
        turns = [t for t in ep.agent_turns if t.token_ids]
        recomputed = ep.meta.get(TRAINER_LOGPROBS) or [None] * len(turns)
        for i, (t, rc) in enumerate(zip(turns, recomputed)):
            seg = turn_segment(tokenizer, t)
            out.append(SampledTurn(seg.context, seg.action, t.logprobs, g, i == 0, len(turns), rc))
    return out


def turn_batch(turns: Sequence[SampledTurn], pad_id: int, model_cfg: ModelConfig):
    """The turns as one padded batch (context + action rows, `sweet.core.tokens.make_batch`)."""
    return make_batch([(t.context, t.action) for t in turns], pad_id, model_cfg.max_length, model_cfg.keep_head)


def turn_forward(model, batch, with_value: bool):
    """Per-token log π [B, L], and V(s_t) [B] at each row's last context token (value head)."""
    import torch

    from sweet.core.logprobs import forward_logprobs

    logp, output = forward_logprobs(model, batch)
    if not with_value:
        return logp, None
    values = output[1]
    last_context = batch.action_mask.argmax(-1) - 1
    return logp, values[torch.arange(len(values)), last_context]


def action_rows(logp: torch.Tensor, batch) -> list[torch.Tensor]:
    """Each row's values at its action tokens."""
    return [logp[i, batch.action_mask[i].bool()] for i in range(logp.shape[0])]


def score_turns(model, turns: Sequence[SampledTurn], acc, pad_id: int, model_cfg: ModelConfig, micro: int,
                with_value: bool = False, ref=None) -> list[tuple[torch.Tensor, torch.Tensor | None, float | None]]:
    """(log π [A], log π_ref [A] or None, V(s_t) or None) per turn, no grad, the turns dealt
    across processes and gathered (sweet.core.nograd_pass.sharded_scores)."""
    def score(idx: list[int]):
        return score_rows(model, [turns[i] for i in idx], pad_id, model_cfg, with_value, ref, acc)

    return sharded_scores(acc, model, len(turns), score, micro=micro)


def score_rows(model, turns: Sequence[SampledTurn], pad_id: int, model_cfg: ModelConfig, with_value: bool,
               ref=None, acc=None) -> list[tuple[torch.Tensor, torch.Tensor | None, float | None]]:
    """`score_turns` on one micro-batch of turns, on this process (the caller holds no_grad)."""
    from sweet.core.logprobs import token_logprobs

    device = acc.device if acc is not None else next(model.parameters()).device
    batch = turn_batch(turns, pad_id, model_cfg).to(device)
    logp, values = turn_forward(model, batch, with_value)
    ref_rows: list = [None] * batch.input_ids.shape[0]
    if ref == "disable_adapter":  # LoRA: π_ref = the base model, adapters switched off
        unwrapped = acc.unwrap_model(model)
        with (unwrapped.lm if with_value else unwrapped).disable_adapter():
            ref_rows = action_rows(turn_forward(model, batch, with_value)[0], batch)
    elif ref is not None:
        ref_rows = action_rows(token_logprobs(ref, batch), batch)
    rows = action_rows(logp, batch)
    return [(rows[j].float().cpu(), None if ref_rows[j] is None else ref_rows[j].float().cpu(),
             None if values is None else float(values[j])) for j in range(len(turns))]

