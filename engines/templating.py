"""Chat-template and completion helpers shared by the local backends (hf, vllm) and trainers.

Two rules keep sampled tokens and trained tokens identical:

- A prompt is `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`
  tokenised WITHOUT extra special tokens (the template already writes the BOS token).
- A completion's ids are cut where its text ends: at the first end-of-turn token, and
  before a stop string, so `tokenizer.decode(token_ids) == text` always holds.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from engines.base import Conversation, EngineError, Message


def text_content(message: Message) -> str:
    """The text of one message; content-part lists are joined, images are refused.

    Text-only chat templates concatenate `message['content']` as a string, so a list of
    `{"type": "text", "text": ...}` parts is flattened here. Image parts need a vision
    model behind an OpenAI-compatible server (`openai:` backend).
    """
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise EngineError(
                    f"message with role {message.get('role')!r} has a {kind!r} content part: local text "
                    "backends accept only text parts; serve a vision model and use 'openai:<model>@<url>'"
                )
            texts.append(part.get("text", ""))
        return "".join(texts)
    raise EngineError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def normalize_messages(messages: Conversation) -> list[dict[str, Any]]:
    """Copies of `messages` with string contents (what text chat templates expect)."""
    return [{**m, "content": text_content(m)} for m in messages]


def render_prompt(tokenizer: Any, messages: Conversation) -> str:
    """The templated prompt text, ending with the assistant generation prompt."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise EngineError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "use an instruct/chat model or set tokenizer.chat_template"
        )
    return tokenizer.apply_chat_template(
        normalize_messages(messages), tokenize=False, add_generation_prompt=True
    )


def prompt_ids(tokenizer: Any, messages: Conversation) -> list[int]:
    """Token ids of the templated prompt (generation prompt added, no extra special tokens).

    Trainers use this to rebuild exactly the prompt a local engine sampled from.
    """
    return list(tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"])


def continued_prompt_ids(tokenizer: Any, before: Conversation, before_ids: Sequence[int],
                         generated_ids: Sequence[int], messages: Conversation) -> list[int] | None:
    """Token-in/token-out: the prompt ids of `messages`, a chat that continues `before` by
    the assistant's reply (`messages[len(before)]`) and what followed it, built from ids:

        before_ids + generated_ids + ids of the template's text after the reply

    where `before_ids` are the ids the model was prompted with for `before` and
    `generated_ids` the ids it generated (end-of-turn token cut: `cut_completion`). The
    template's text after the reply (its end-of-turn, the next messages, the next
    generation header) is tokenised on its own, so the ids already in the sequence are
    never re-tokenised: a turn's prompt ids start with the previous turn's prompt ids and
    action ids (sweet.core.tokens' one-sequence rule). The ids decode to the template's
    rendering of `messages`.

    None when that does not hold, and the caller templates `messages` whole (`prompt_ids`):
    `messages` does not extend `before` by an assistant message whose text is the decoded
    `generated_ids`; the template renders `messages` other than as `before`'s rendering
    followed by the reply (a template that rewrites earlier turns: trims, moves a system
    prompt); `before_ids` do not decode to `before`'s rendering; or the text after the
    reply does not open with the tokenizer's eos token (the id trainers append to a turn
    the model ended: sweet.core.tokens.action_ids)."""
    n = len(before)
    if len(messages) <= n or messages[n].get("role") != "assistant":
        return None
    if normalize_messages(messages[:n]) != normalize_messages(before):
        return None
    reply = text_content(messages[n])
    ids = [int(i) for i in generated_ids]
    if tokenizer.decode(ids) != reply:
        return None
    head, full = render_prompt(tokenizer, before), render_prompt(tokenizer, messages)
    if not full.startswith(head + reply) or tokenizer.decode(list(before_ids), skip_special_tokens=False) != head:
        return None
    tail = list(tokenizer(full[len(head) + len(reply):], add_special_tokens=False)["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None or tail[:1] != [int(eos)]:
        return None
    return [int(i) for i in before_ids] + ids + tail


def end_token_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    """Ids that end a turn: the tokenizer's eos plus the model's generation eos list."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Iterable):
        ids.update(int(i) for i in eos)
    return ids


def _reaches_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s in text for s in stop)


def stop_prefix_length(tokenizer: Any, ids: Sequence[int], stop: Sequence[str]) -> int | None:
    """Length of the longest prefix of `ids` whose decoding contains no stop string
    (and is a prefix of the full decoding: no half-decoded character at its end).

    None when the full decoding contains none. Containment grows with the prefix, so
    a binary search finds the first prefix that reaches a stop string; a linear scan
    backs it up for tokenizers where partial decodings are not prefixes of each other.
    """
    stop = [s for s in stop if s]
    full = tokenizer.decode(list(ids))
    if not stop or not _reaches_stop(full, stop):
        return None
    lo, hi = 1, len(ids)  # invariant: decode(ids[:hi]) reaches a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if _reaches_stop(tokenizer.decode(list(ids[:mid])), stop):
            hi = mid
        else:
            lo = mid + 1
    k = hi - 1
    if _reaches_stop(tokenizer.decode(list(ids[:k])), stop):  # non-monotone decoding: plain scan
        k = next(i for i in range(len(ids)) if _reaches_stop(tokenizer.decode(list(ids[: i + 1])), stop))
    # Drop the leading bytes of a character the stop string starts with: they decode
    # to U+FFFD, which is not part of the completion's text.
    while k > 0 and not full.startswith(tokenizer.decode(list(ids[:k]))):
        k -= 1
    return k


def cut_completion(
    tokenizer: Any,
    token_ids: Sequence[int],
    stop: Sequence[str],
    end_ids: set[int],
) -> tuple[list[int], str, str]:
    """Cut generated ids at the first end-of-turn token and before any stop string.

    Returns `(kept_ids, text, finish_reason)` with `text == tokenizer.decode(kept_ids)`;
    `finish_reason` is "stop" when an end-of-turn token ended the completion,
    "stop_string" when a stop string did (first), else "length" (see `Sample`).
    """
    ids = [int(t) for t in token_ids]
    reason = "length"
    for i, t in enumerate(ids):
        if t in end_ids:
            ids, reason = ids[:i], "stop"
            break
    k = stop_prefix_length(tokenizer, ids, stop)
    if k is not None:
        ids, reason = ids[:k], "stop_string"
    return ids, tokenizer.decode(ids), reason
