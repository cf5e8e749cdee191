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
scored in its own recorded context, and its log-prob is the sum over turns. Where the
trajectory is one token sequence (each turn's context starts with the turn before's
context and action: the token-in/token-out rollouts of colbench.agents.turn_prompt_ids),
`make_batch(packed=True)` runs it as one row and one forward pass, each turn's action
read from its span; turns that do not continue one another (published data, text-only
servers, a template that rewrites earlier turns) or whose context must be cut to fit
`max_length` keep rows of their own, the same values either way.

Truncation keeps the action whole: an over-long context loses tokens from the
*middle*: the first `keep_head` tokens (system prompt, task, training-time
information) and the most recent turns survive. (The reference code truncated from
the right and lost the final answer.) An action is never cut (a cut action is another
quantity: a prefix's NLL or log-ratio), so an action that leaves no room in
`max_length` (`fits`) cannot be trained on: `make_batch` refuses it, and every trainer
skips the examples that hold one when its data loads, before any step, with one
warning line naming the count (`skip_long_actions`). A trainer whose own sampler
writes the actions (LOOP, the centred critic's baseline samples) refuses a
`max_new_tokens` that could write one instead (sweet.core.config.check_action_room).

Log-probs of these batches (computed only at the action tokens, never on [B, L, vocab]
logits) are sweet/core/logprobs.py.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypeVar

from colbench.types import Episode, Turn
from engines.base import Message
from engines.templating import prompt_ids

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
_warned_fallback = False
T = TypeVar("T")

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


def text_ids(tokenizer, text: str) -> tuple[int, ...]:
    """Ids of text that no engine generated (scripted demonstrations, published offline
    turns): tokenised once, without special tokens (the end of turn is `action_ids`')."""
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


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
        ids = text_ids(tokenizer, turn.content)
    return action_ids(ids, eos_id(tokenizer), turn.finish_reason)


def turn_segment(tokenizer, turn: Turn, tokenize_missing: bool = False) -> Segment:
    """The training segment of one recorded agent turn: its context and `turn_action_ids`."""
    action = turn_action_ids(tokenizer, turn, tokenize_missing)
    return Segment(context_ids(tokenizer, turn.prompt_token_ids, turn.prompt), action)


def episode_segments(tokenizer, episode: Episode, tokenize_missing: bool = False) -> list[Segment]:
    """One segment per agent turn of an episode, in order."""
    return [turn_segment(tokenizer, t, tokenize_missing) for t in episode.agent_turns]


def with_training_info(messages: Sequence[Message], info: str, header: str = "Training-time information",
                       template: str | None = None) -> list[Message]:
    """The critic's view: the policy's messages plus the hidden information c, added
    to the first (system or user) message so it survives left truncation.
    `template`: the text of a critic_context template (colbench.prompts; placeholder
    `{training_info}`), added after a blank line, stripped; None: the note built from
    `header` (critics trained before the template file; the shipped file gives the same text
    with the default header)."""
    msgs = [dict(m) for m in messages]
    if template is not None:
        from colbench.prompts import fill_text

        note = "\n\n" + fill_text(template.strip(), "critic_context", training_info=info)
    else:
        note = f"\n\n[{header}, hidden from the agent]\n{info}\n[end of {header.lower()}]"
    msgs[0]["content"] = str(msgs[0]["content"]) + note
    return msgs


# ---- batches and log-probs ----------------------------------------------------------------


def fits(action_len: int, max_length: int | None) -> bool:
    """Whether an action of `action_len` tokens can be trained on in rows of `max_length`
    tokens (None: no limit): whole, after at least one context token (position 0 predicts
    nothing, so an action's first token needs one before it). The one condition: `make_batch`
    refuses what fails it, `skip_long_actions` skips it when the data loads."""
    return max_length is None or action_len < max_length


def agent_turn(episode_id: str, turn_index: int) -> str:
    """How a skipped action is named: `episode {id}, agent turn {t}` (t counts agent turns from 0)."""
    return f"episode {episode_id}, agent turn {turn_index}"


def skip_long_actions(units: Sequence[T], actions: Callable[[T], Iterable[tuple[str, int]]], max_length: int | None,
                      *, source: str, what: str) -> list[T]:
    """The training units (a turn, a pair, ...) whose every action `fits` `max_length`, in
    their order. `actions(unit)`: each of the unit's actions as (name, token count), the
    name from `agent_turn`. When some do not fit, ONE warning line (warnings.warn, the
    channel of colbench.episodes' skipped episodes) names how many, the source and the first:

        {source}: skipping {n} of {N} {what} with an action too long for max_length={M}
        (first: episode {id}, agent turn {t}: {k} tokens; actions are never cut)

    A trainer calls it on its data as it loads, before any step; nothing is skipped
    silently, and a unit is kept or skipped whole (a pair never loses one side)."""
    if max_length is None:
        return list(units)
    kept: list[T] = []
    first: tuple[str, int] | None = None
    for unit in units:
        long = next(((name, n) for name, n in actions(unit) if not fits(n, max_length)), None)
        if long is None:
            kept.append(unit)
        elif first is None:
            first = long
    if first is not None:
        warnings.warn(f"{source}: skipping {len(units) - len(kept)} of {len(units)} {what} with an action too long "
                      f"for max_length={max_length} (first: {first[0]}: {first[1]} tokens; actions are never cut)",
                      stacklevel=2)
    return kept


def one_pass_summary(trajectories: Iterable[Sequence[tuple[Sequence[int], Sequence[int]]]], max_length: int | None,
                     *, source: str) -> str:
    """How `make_batch(packed=True)` will run these trajectories, each its turns' (context,
    action) ids in order, as ONE line for the trainer's log:

        {source}: {a} of {N} trajectories run as one pass each; {b} as per-turn rows (their
        turns are not one token sequence: templated whole, text only, or published); {c}
        longer than max_length={M} (the turns past it run as rows of their own, cut)

    A trajectory is one pass when each turn's context starts with the turn before's
    context and action, and its last turn fits `max_length` uncut; the parts that count 0
    are left out."""
    trajectories = [list(t) for t in trajectories]
    split = {"one": 0, "text": 0, "long": 0}
    for turns in trajectories:
        seqs = [list(c) + list(a) for c, a in turns]
        continued = all(later[:len(seq)] == seq for seq, later in zip(seqs, seqs[1:]))
        if not continued:
            split["text"] += 1
        elif max_length is not None and seqs and len(seqs[-1]) > max_length:
            split["long"] += 1
        else:
            split["one"] += 1
    parts = [f"{split['one']} of {len(trajectories)} trajectories run as one pass each"]
    if split["text"]:
        parts.append(f"{split['text']} as per-turn rows (their turns are not one token sequence: templated whole, "
                     "text only, or published)")
    if split["long"]:
        parts.append(f"{split['long']} longer than max_length={max_length} (the turns past it run as rows of their "
                     "own, cut)")
    return f"{source}: " + "; ".join(parts)


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
    """Right-padded rows of context + action ids, and where each example's action lies.

    input_ids:      [R, L]
    attention_mask: [R, L]  1 on real tokens
    action_mask:    [R, L]  1 on the tokens some example's action covers (what is scored)
    spans:          per example (in the order given to `make_batch`): (row, start, end),
                    its action at input_ids[row, start:end]

    Unpacked, row i is example i. Packed (`make_batch(..., packed=True)`), examples whose
    ids continue one another share a row: a trajectory whose every turn's context starts
    with the turn before's context + action is one row, each turn's action read from its
    span (the ids before a position are the same either way, so is what the model gives
    there), and an example seen twice is run once. Reductions per example: `example_sums`.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    spans: tuple[tuple[int, int, int], ...] = ()

    def to(self, device) -> "TokenBatch":
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device), self.action_mask.to(device),
                          self.spans)

    def example_sums(self, values: torch.Tensor) -> torch.Tensor:
        """Σ over each example's action positions of `values` [R, L] (per-token log-probs,
        values): [N], in the values' dtype."""
        import torch

        rows = torch.tensor([r for r, _, _ in self.spans], device=values.device, dtype=torch.long)
        pos = torch.arange(values.shape[1], device=values.device)
        start = torch.tensor([s for _, s, _ in self.spans], device=values.device)[:, None]
        end = torch.tensor([e for _, _, e in self.spans], device=values.device)[:, None]
        return (values[rows] * ((pos >= start) & (pos < end)).to(values.dtype)).sum(-1)

    def example_counts(self) -> torch.Tensor:
        """Each example's action tokens: [N] long."""
        import torch

        return torch.tensor([e - s for _, s, e in self.spans], dtype=torch.long, device=self.input_ids.device)


def make_batch(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    max_length: int | None = None,
    keep_head: int = 256,
    packed: bool = False,
) -> TokenBatch:
    """Rows of (context_ids, action_ids) examples; contexts are truncated, actions never.
    `packed`: examples that continue one another share a row (TokenBatch), as long as the
    row fits `max_length` untruncated; an example that needs its context cut keeps a row
    of its own, cut as unpacked (the per-turn rule: a trajectory longer than max_length is
    scored turn by turn)."""
    import torch

    rows: list[list[int]] = []
    whole: list[bool] = []  # rows that others may share: nothing was cut
    spans: list[tuple[int, int, int]] = []
    for context, action in examples:
        action = list(action)
        if not action:
            raise ValueError("empty action: every training example needs at least one action token")
        if max_length is not None and not fits(len(action), max_length):  # trainers skip these when data loads
            raise ValueError(f"action of {len(action)} tokens does not fit max_length={max_length}")
        cut = truncate_context(context, max_length - len(action), keep_head) if max_length is not None else list(context)
        seq = cut + action
        span = (len(cut), len(seq))
        row = _shared_row(rows, whole, seq) if packed and len(cut) == len(context) else None
        if row is None:
            rows.append(seq)
            whole.append(len(cut) == len(context))
            row = len(rows) - 1
        elif len(seq) > len(rows[row]):
            rows[row] = seq  # the row continued by this example
        spans.append((row, *span))
    width = max(len(s) for s in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    act = torch.zeros((len(rows), width), dtype=torch.long)
    for i, seq in enumerate(rows):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
    for r, s, e in spans:
        act[r, s:e] = 1
    return TokenBatch(ids, attn, act, tuple(spans))


def _shared_row(rows: list[list[int]], whole: list[bool], seq: list[int]) -> int | None:
    """A row that `seq` is a prefix of, or that is a prefix of `seq` (continued by it)."""
    for r, row in enumerate(rows):
        if not whole[r]:
            continue
        n = min(len(row), len(seq))
        if row[:n] == seq[:n]:
            return r
    return None
