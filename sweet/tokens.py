"""Token-level plumbing shared by every trainer: contexts, actions, batches, log-probs.

A training example is (context ids, action ids). Actions are always the ids the
engine generated (Turn.token_ids / Candidate.token_ids), so what we train on is
exactly what was sampled; contexts are the policy's recorded prompt ids when the
engine reported them, else the chat template applied to the recorded prompt.

Truncation keeps the action whole: an over-long context loses tokens from the
*middle*: the first `keep_head` tokens (system prompt, task, training-time
information) and the most recent turns survive. (The reference code truncated from
the right and lost the final answer.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from engines.base import Message
from engines.templating import prompt_ids


# One templating rule for samplers and trainers, so a rebuilt context equals the prompt
# the engine sampled from.
template_ids = prompt_ids


def with_training_info(messages: Sequence[Message], info: str, header: str = "Training-time information") -> list[Message]:
    """The critic's view: the policy's messages plus the hidden information c, added
    to the first (system or user) message so it survives left truncation."""
    msgs = [dict(m) for m in messages]
    note = f"\n\n[{header}, hidden from the agent]\n{info}\n[end of {header.lower()}]"
    msgs[0]["content"] = str(msgs[0]["content"]) + note
    return msgs


def truncate_context(context: Sequence[int], max_context: int, keep_head: int) -> list[int]:
    """Drop tokens from the middle so that len <= max_context, keeping the first
    `keep_head` tokens and the latest ones."""
    context = list(context)
    if len(context) <= max_context:
        return context
    keep_head = min(keep_head, max_context)
    tail = max_context - keep_head
    return context[:keep_head] + (context[-tail:] if tail > 0 else [])


@dataclass
class TokenBatch:
    """Right-padded sequences of context + action.

    input_ids:      [B, L]
    attention_mask: [B, L]  1 on real tokens
    action_mask:    [B, L]  1 on action tokens (the ones a loss is taken over)
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor

    def to(self, device) -> "TokenBatch":
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device), self.action_mask.to(device))


def make_batch(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    max_length: int | None = None,
    keep_head: int = 256,
) -> TokenBatch:
    """Pack (context_ids, action_ids) pairs; contexts are truncated, actions never."""
    seqs, masks = [], []
    for context, action in examples:
        action = list(action)
        if not action:
            raise ValueError("empty action: every training example needs at least one action token")
        if max_length is not None:
            if len(action) >= max_length:
                raise ValueError(f"action of {len(action)} tokens does not fit max_length={max_length}")
            context = truncate_context(context, max_length - len(action), keep_head)
        seqs.append(list(context) + action)
        masks.append([0] * len(context) + [1] * len(action))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    act = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        act[i, : len(m)] = torch.tensor(m)
    return TokenBatch(ids, attn, act)


def token_logprobs(model, batch: TokenBatch) -> torch.Tensor:
    """log π(x_i | x_<i) for every position i >= 1, zero elsewhere: [B, L].

    Position 0 has no prediction; logits at i-1 score token i.
    """
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logp = torch.gather(F.log_softmax(logits[:, :-1], dim=-1), 2, batch.input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(logp, (1, 0))


def action_logprob_sum_and_mean(token_logps: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: Σ and mean of log-probs over action tokens ([B] each)."""
    mask = action_mask.to(token_logps.dtype)
    total = (token_logps * mask).sum(-1)
    return total, total / mask.sum(-1).clamp(min=1)
