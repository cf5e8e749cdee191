"""One rule from recorded turns to training ids, and the batching every trainer shares.

A training example is a list of `Segment`s, each (context ids, action ids), one per
agent turn:

- context = the turn's recorded `prompt_token_ids` (the ids the engine sampled from);
  when the engine reported none (OpenAI-compatible servers, published trajectories),
  the chat template applied to the recorded prompt (`engines.templating.prompt_ids`,
  the same rule the local engines use), logged once.
- action  = the generated `token_ids` (never re-tokenised text: multi-turn tokenisation
  drift) + the end-of-turn id exactly when the model emitted it (`action_ids`):
    finish_reason "stop"         the model emitted its end-of-turn token: appended
                                 (the tokenizer's eos, the id the chat template ends an
                                 assistant turn with);
    "length" or "stop_string"    cut at max_new_tokens or before a caller's stop string:
                                 not appended (the model never sampled it);
    None                         episode files written before the field existed:
                                 appended, as every trainer did then (those engines cut
                                 eos and no agent samples with stop strings, so a turn
                                 ended at eos unless it hit max_new_tokens).
  Every trainer (critic, SWEET stage 2 and its critic scoring, multi-turn DPO, RFT,
  warm start, LOOP) builds its actions here, so scoring and training agree.

Simulator tokens are never in a loss: they only appear inside later turns' contexts,
where the action mask is 0. A multi-turn trajectory is one segment per agent turn, each
scored in its own recorded context, and its log-prob is the sum over turns.

Truncation keeps the action whole: an over-long context loses tokens from the
*middle*: the first `keep_head` tokens (system prompt, task, training-time
information) and the most recent turns survive. (The reference code truncated from
the right and lost the final answer.)

Log-probs (`token_logprobs`, `forward_logprobs`, `scored_head`) are computed only at the
action tokens: the LM head runs on their hidden states in chunks, in the model's dtype,
with a float32 log-softmax per chunk, never on [B, L, vocab] logits (the section's
comment says how; bench/logprob_memory.py measures it).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from colbench.types import Episode, Turn
from engines.base import Message
from engines.templating import prompt_ids

log = logging.getLogger(__name__)
_warned_fallback = False

# Sample/Turn.finish_reason values (engines.base.Sample); None = recorded before the field.
ENDS_TURN = "stop"
FINISH_REASONS = ("stop", "stop_string", "length", None)

# One templating rule for samplers and trainers, so a rebuilt context equals the prompt
# the engine sampled from.
template_ids = prompt_ids


# ---- from a recorded turn to (context, action) ids -------------------------------------


@dataclass(frozen=True)
class Segment:
    """One agent turn to score: `context` [C] ids, then `action` [A] ids (A >= 1)."""

    context: tuple[int, ...]
    action: tuple[int, ...]


def eos_id(tokenizer) -> int:
    """The end-of-turn id appended to actions the model ended itself."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no eos token: cannot mark the end of a turn")
    return int(tokenizer.eos_token_id)


def action_ids(token_ids: Sequence[int], eos_id: int, finish_reason: str | None) -> tuple[int, ...]:
    """a_t: the generated ids, + `eos_id` exactly when the model emitted it
    (finish_reason "stop"; None = an old record, treated as "stop": module docstring)."""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"unknown finish_reason {finish_reason!r}: expected one of {FINISH_REASONS}")
    ids = tuple(int(i) for i in token_ids)
    return ids + (int(eos_id),) if finish_reason in (ENDS_TURN, None) else ids


def context_ids(tokenizer, prompt_token_ids: Sequence[int] | None, prompt) -> tuple[int, ...]:
    """The recorded prompt ids, else the chat template of the recorded prompt (logged once)."""
    global _warned_fallback
    if prompt_token_ids is not None:
        return tuple(int(i) for i in prompt_token_ids)
    if prompt is None:
        raise ValueError("an agent turn has neither prompt_token_ids nor a recorded prompt")
    if not _warned_fallback:
        log.warning("the engine recorded no prompt ids for some turns: rebuilding them with the chat template")
        _warned_fallback = True
    return tuple(prompt_ids(tokenizer, list(prompt)))


def turn_action_ids(tokenizer, turn: Turn, tokenize_missing: bool = False) -> tuple[int, ...]:
    """The action ids of one recorded agent turn (`action_ids` of its generated ids).

    A turn without generated ids (published offline trajectories, scripted agents) is
    an error unless `tokenize_missing`: then its text is tokenised once, the only
    option when the ids were never recorded."""
    if turn.role != "agent":
        raise ValueError(f"only agent turns are trained on, got a {turn.role!r} turn")
    ids = turn.token_ids
    if ids is None:
        if not tokenize_missing:
            raise ValueError("agent turn has no generated token_ids (offline or scripted record): cannot train on it "
                             "exactly; pass --tokenize_missing_actions true to tokenise its text")
        ids = tokenizer(turn.content, add_special_tokens=False)["input_ids"]
    return action_ids(ids, eos_id(tokenizer), turn.finish_reason)


def turn_segment(tokenizer, turn: Turn, tokenize_missing: bool = False) -> Segment:
    """The training segment of one recorded agent turn: its context and `turn_action_ids`."""
    action = turn_action_ids(tokenizer, turn, tokenize_missing)
    return Segment(context_ids(tokenizer, turn.prompt_token_ids, turn.prompt), action)


def episode_segments(tokenizer, episode: Episode, tokenize_missing: bool = False) -> list[Segment]:
    """One segment per agent turn of an episode, in order."""
    return [turn_segment(tokenizer, t, tokenize_missing) for t in episode.agent_turns]


def with_training_info(messages: Sequence[Message], info: str, header: str = "Training-time information") -> list[Message]:
    """The critic's view: the policy's messages plus the hidden information c, added
    to the first (system or user) message so it survives left truncation."""
    msgs = [dict(m) for m in messages]
    note = f"\n\n[{header}, hidden from the agent]\n{info}\n[end of {header.lower()}]"
    msgs[0]["content"] = str(msgs[0]["content"]) + note
    return msgs


# ---- batches and log-probs ----------------------------------------------------------------


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
    in_call = False

    def head_call(h):
        # inside the head's call its own hooks already ran (ZeRO-3 gathered its weights):
        # `forward` directly; a recompute in backward calls the module, hooks and all
        return head.forward(h) if in_call else head(h)

    def score(module, args):
        nonlocal in_call
        hidden = args[0]
        in_call = True
        try:
            scores.append(_chunked_logprobs(head_call, *select(hidden), vocab, softcap, trainable))
        finally:
            in_call = False
        return (hidden[..., :0, :],) + tuple(args[1:])

    def tie(module, args, output):
        # the scores depend on the head's (empty) output, the model's own output: backward
        # then reaches it first, and wrappers that act there run before the recompute
        # (FSDP2 gathers a resharded root module's weights, the head's among them)
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
                  chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ log π(action tokens | context) per segment, and the action token counts: [S], [S].

    Segments are packed `chunk_size` at a time (None: all at once); gradients flow.
    """
    device = next(model.parameters()).device
    sums, counts = [], []
    step = chunk_size or max(1, len(segments))
    for start in range(0, len(segments), step):
        chunk = segments[start : start + step]
        batch = make_batch([(s.context, s.action) for s in chunk], pad_id, max_length, keep_head).to(device)
        total, _ = action_logprob_sum_and_mean(token_logprobs(model, batch), batch.action_mask)
        sums.append(total)
        counts.append(batch.action_mask.sum(-1))
    return torch.cat(sums), torch.cat(counts)
