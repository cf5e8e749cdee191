"""Log-probs of token batches, computed only at the scored (action) positions.

`token_logprobs`, `forward_logprobs`, `scored_head` and `segment_logps` never build
[B, L, vocab] logits: the LM head runs on the hidden states that predict a scored token,
in chunks, in the model's dtype, with a float32 log-softmax per chunk (bench/
logprob_memory.py measures the saving: 48x less peak memory at 8k tokens x 128k vocab).
The batches themselves (`TokenBatch`, `make_batch`, `Segment`) are sweet/core/tokens.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from sweet.core.tokens import Segment, TokenBatch, make_batch

# ---- log-probs at the scored positions only (chunked) -----------------------------------
#
# The model body runs once, through the outermost module (DDP, FSDP, DeepSpeed, PEFT, the
# value-head wrappers), so every wrapper's hooks run as they would for `model(...).logits`.
# A pre-hook on the LM head takes over its call: the head runs only on the hidden states
# that predict a scored token, a chunk of positions at a time, in the model's dtype (under
# the forward's autocast, if any), with a float32 log-softmax per chunk, and the model's
# own logits come out empty. Never [B, L, vocab] logits: at 8k tokens x 128k vocabulary
# those are 4 GB in float32 per sequence, and their log-softmax as much again. The scoring
# happens inside the head's call, where FSDP and ZeRO-3 hold the head's weights gathered
# (FSDP2 reshards the root right after a no-grad forward). With gradients each chunk is
# recomputed in backward (torch.utils.checkpoint), so a step keeps [N, hidden] per scored
# token, not [N, vocab].

LOGITS_CHUNK_ELEMENTS = 1 << 24  # positions x vocab per chunk: 64 MB of float32 logits (130 rows at 128k)


def _unwrap(model):
    """The causal LM inside DDP/FSDP1/DeepSpeed (`.module`) and our value-head wrappers (`.lm`);
    PEFT models answer `get_output_embeddings` themselves."""
    while True:
        inner = next((m for m in (getattr(model, "module", None), getattr(model, "lm", None))
                      if isinstance(m, torch.nn.Module)), None)
        if inner is None:
            return model
        model = inner


def output_head(model) -> torch.nn.Module:
    """The LM head module (`get_output_embeddings`: tied or not, LoRA-wrapped or not)."""
    head = _unwrap(model).get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(_unwrap(model)).__name__} has no output embeddings (LM head): cannot score tokens")
    return head


def _chunked_logprobs(head_call, hidden: torch.Tensor, targets: torch.Tensor, vocab: int, softcap: float | None,
                      head_trainable: bool) -> torch.Tensor:
    """log softmax(head_call(h))[target] per row: hidden [N, H], targets [N] -> [N] float32
    (float64 for a float64 model), `head_call` on a chunk of rows at a time."""
    def chunk_logprobs(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = head_call(h)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 stays
        if softcap:  # Gemma 2/3 cap their logits
            logits = torch.tanh(logits / softcap) * softcap
        return logits.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    recompute = torch.is_grad_enabled() and (hidden.requires_grad or head_trainable)
    step = max(1, LOGITS_CHUNK_ELEMENTS // vocab)
    out = []
    for start in range(0, hidden.shape[0], step):
        h, t = hidden[start : start + step], targets[start : start + step]
        out.append(checkpoint(chunk_logprobs, h, t, use_reentrant=False) if recompute else chunk_logprobs(h, t))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.promote_types(hidden.dtype, torch.float32))


@contextmanager
def scored_head(model, select):
    """Within the block, each call of the LM head of `model` scores instead of computing
    logits: `select(hidden)` -> (hidden states [N, H], their target ids [N]) picks the rows,
    and their log-probs ([N] float32) are appended to the yielded list; the head's own
    output is cut to zero positions."""
    config = _unwrap(model).config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab, softcap = int(config.vocab_size), getattr(config, "final_logit_softcapping", None)
    head = output_head(model)
    trainable = any(p.requires_grad for p in head.parameters())
    scores: list[torch.Tensor] = []

    def score(module, args):
        # the head's `forward`, never its call: the module's hooks already ran for this call
        # (ZeRO-3 gathered its weights), and a chunk recomputed in backward finds them gathered
        # (`tie`), where ZeRO-3's post-forward hook would release them before the chunk's backward
        hidden = args[0]
        scores.append(_chunked_logprobs(head.forward, *select(hidden), vocab, softcap, trainable))
        return (hidden[..., :0, :],) + tuple(args[1:])

    def tie(module, args, output):
        # the scores depend on the head's (empty) output, the model's own output: backward
        # then reaches it first, and wrappers that act there run before the recompute
        # (FSDP2 gathers a resharded root module's weights, the head's among them; ZeRO-3's
        # pre-backward hook on the head's output gathers the head's)
        if output.requires_grad and scores:
            scores[-1] = scores[-1] + output.sum() * 0

    handles = [head.register_forward_pre_hook(score), head.register_forward_hook(tie)]
    try:
        yield scores
    finally:
        for handle in handles:
            handle.remove()


def forward_logprobs(model, batch: TokenBatch, **kwargs):
    """One forward of `model(input_ids, attention_mask, **kwargs)`: (log π(x_i | x_<i) at
    the action positions, zero elsewhere [B, L] float32; the model's own output, whose
    logits are empty). Position 0 has no prediction; the hidden state at i-1 scores token i."""
    scored = batch.action_mask[:, 1:].bool()

    def select(hidden):
        if tuple(hidden.shape[:2]) != tuple(batch.input_ids.shape):
            raise RuntimeError(f"the LM head got hidden states {list(hidden.shape)}, expected [B, L, H] with "
                               f"[B, L] = {list(batch.input_ids.shape)}")
        return hidden[:, :-1][scored], batch.input_ids[:, 1:][scored]

    with scored_head(model, select) as scores:
        output = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kwargs)
    if len(scores) != 1:
        raise RuntimeError(f"expected one LM head call per forward, got {len(scores)}")
    logp = scores[0]
    dense = torch.zeros(scored.shape, dtype=logp.dtype, device=logp.device).masked_scatter(scored, logp)
    return F.pad(dense, (1, 0)), output


def token_logprobs(model, batch: TokenBatch) -> torch.Tensor:
    """log π(x_i | x_<i) at the action positions (action_mask 1, i >= 1), zero elsewhere:
    [B, L] float32 (`forward_logprobs`)."""
    return forward_logprobs(model, batch)[0]


def action_logprob_sum_and_mean(token_logps: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: Σ and mean of log-probs over action tokens ([B] each)."""
    mask = action_mask.to(token_logps.dtype)
    total = (token_logps * mask).sum(-1)
    return total, total / mask.sum(-1).clamp(min=1)


def segment_logps(model, segments: Sequence[Segment], *, pad_id: int, max_length: int | None, keep_head: int,
                  chunk_size: int | None = None, packed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ log π(action tokens | context) per segment, and the action token counts: [S], [S].

    Segments go `chunk_size` at a time (None: all at once) into packed batches
    (`make_batch(packed=True)`): the turns of a trajectory whose ids continue one another
    are one row and one forward pass, a segment given twice runs once; gradients flow.
    `packed=False`: one row per segment (the reference the packed rows are checked against).
    """
    device = next(model.parameters()).device
    sums, counts = [], []
    step = chunk_size or max(1, len(segments))
    for start in range(0, len(segments), step):
        chunk = segments[start : start + step]
        batch = make_batch([(s.context, s.action) for s in chunk], pad_id, max_length, keep_head, packed=packed).to(device)
        sums.append(batch.example_sums(token_logprobs(model, batch)))
        counts.append(batch.example_counts())
    return torch.cat(sums), torch.cat(counts)
