"""Completion cutting and prompt templating shared by the local backends."""

from __future__ import annotations

import pytest

from engines import EngineError
from engines.templating import cut_completion, prompt_ids, render_prompt, stop_prefix_length


@pytest.fixture(scope="module")
def tok(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.mark.parametrize("text, stop", [
    ("def f(x):\n    return x\n\nprint(f(1))", "\n\n"),
    ("I WANT TO ANSWER: héllo wörld ✓ done", "✓"),  # multi-byte stop: split across byte tokens
    ("abc ```python\nx = 1\n```", "```"),
])
def test_cut_at_longest_prefix_before_stop(tok, text, stop):
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    kept, out, reason = cut_completion(tok, ids, [stop], {tok.eos_token_id})
    assert reason == "stop_string" and stop not in out and tok.decode(kept) == out
    assert text.startswith(out) and kept == ids[: len(kept)]
    assert stop in tok.decode(ids[: len(kept) + 4])  # a few more tokens (one character) reach it
    assert stop_prefix_length(tok, ids, ["not there"]) is None


def test_eos_ends_the_completion_without_stop(tok):
    ids = tok("hello world", add_special_tokens=False)["input_ids"]
    kept, out, reason = cut_completion(tok, ids + [tok.eos_token_id, 17, 18], [], {tok.eos_token_id})
    assert (kept, out, reason) == (ids, "hello world", "stop")
    assert cut_completion(tok, ids, [], {tok.eos_token_id}) == (ids, "hello world", "length")


def test_text_parts_are_joined_and_prompt_ids_tokenise_the_template(tok):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    plain = [{"role": "user", "content": "ab"}]
    assert render_prompt(tok, parts) == render_prompt(tok, plain)
    assert prompt_ids(tok, plain) == tok(render_prompt(tok, plain), add_special_tokens=False)["input_ids"]


def test_missing_chat_template_is_a_clear_error(tok):
    import copy

    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.raises(EngineError, match="has no chat template"):
        prompt_ids(bare, [{"role": "user", "content": "x"}])
