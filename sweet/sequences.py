"""Policy training sequences: what the policy saw, and exactly what it generated.

A policy example is a list of `Segment`s, each (context ids, action ids):

- context = the turn's recorded `prompt_token_ids` (the ids the engine sampled from);
  when the engine reported none (OpenAI-compatible servers, published trajectories),
  the chat template applied to the recorded prompt (`engines.templating.prompt_ids`,
  the same rule the local engines use), logged once.
- action  = the generated `token_ids` + the end-of-turn token when the generation
  ended there. Generated text is never re-tokenised (multi-turn tokenisation drift).

Simulator tokens are never in a loss: they only appear inside later turns' contexts,
where the action mask is 0. A multi-turn trajectory is one segment per agent turn,
each scored in its own recorded context, and its log-prob is the sum over turns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from colbench.types import Episode, Turn

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
_warned_fallback = False


@dataclass(frozen=True)
class Segment:
    """One agent turn to score: `context` [C] ids, then `action` [A] ids (A >= 1)."""

    context: tuple[int, ...]
    action: tuple[int, ...]


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
    from engines.templating import prompt_ids

    return tuple(prompt_ids(tokenizer, list(prompt)))


def action_ids(token_ids: Sequence[int], eos_id: int, ended: bool = True) -> tuple[int, ...]:
    """Generated ids + the end-of-turn token when the generation stopped there
    (a generation cut at max_new_tokens gets no eos: the model did not choose to stop)."""
    ids = tuple(int(i) for i in token_ids)
    return ids + (eos_id,) if ended else ids


def turn_segment(tokenizer, turn: Turn, tokenize_missing: bool = False) -> Segment:
    """The training segment of one recorded agent turn.

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
    return Segment(context_ids(tokenizer, turn.prompt_token_ids, turn.prompt), action_ids(ids, eos_id(tokenizer)))


def episode_segments(tokenizer, episode: Episode, tokenize_missing: bool = False) -> list[Segment]:
    """One segment per agent turn of an episode, in order."""
    return [turn_segment(tokenizer, t, tokenize_missing) for t in episode.agent_turns]


def eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no eos token: cannot mark the end of a turn")
    return int(tokenizer.eos_token_id)


def segment_logps(model, segments: Sequence[Segment], *, pad_id: int, max_length: int | None, keep_head: int,
                  chunk_size: int | None = None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Σ log π(action tokens | context) per segment, and the action token counts: [S], [S].

    Segments are packed `chunk_size` at a time (None: all at once); gradients flow.
    """
    import torch

    from sweet.tokens import action_logprob_sum_and_mean, make_batch, token_logprobs

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
