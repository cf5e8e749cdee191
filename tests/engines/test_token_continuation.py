"""Token in, token out: a turn's prompt ids continue the previous turn's prompt ids and the
ids the model generated (engines.templating.continued_prompt_ids), on every tokenizer the
project ships (tiny, SmolLM2) and on Llama-3- and Qwen2-style templates kept here (no
template ships offline with transformers)."""

from __future__ import annotations

import pytest

from engines.templating import continued_prompt_ids, prompt_ids, render_prompt

# Qwen2's published chat template (ChatML with a default system prompt), on SmolLM2's ChatML tokens.
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama-3's published template (the tiny tokenizer's special tokens), with its BOS and headers.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# A template that rewrites what it was given (trims every message): no continuation holds.
TRIMMING_TEMPLATE = LLAMA3_TEMPLATE.replace("message['content'] ", "message['content'] | trim ")

# Replies that tokenise across the boundary with what the template writes around them.
REPLIES = [" ints, please", "\n\nblank lines first\n\n", "```python\nx = 1\n```", "🙂", "y", "  two  spaces "]
ACTIONS = ["Which inputs?", "ok\n\n", "🙂 sure", "x", " leading space", "```"]


def _tokenizer(name: str):
    from transformers import AutoTokenizer

    from engines.smollm2 import smollm2_model_path
    from engines.tiny import tiny_model_path

    base, template = {"tiny": (tiny_model_path, None), "smollm2": (smollm2_model_path, None),
                      "qwen2-style": (smollm2_model_path, QWEN2_TEMPLATE),
                      "llama3-style": (tiny_model_path, LLAMA3_TEMPLATE),
                      "trimming": (tiny_model_path, TRIMMING_TEMPLATE)}[name]
    tok = AutoTokenizer.from_pretrained(base())
    if template is not None:
        tok.chat_template = template
    return tok


def _dialogue(tok, with_system: bool):
    """Prompt ids of each agent turn of a 6-turn dialogue, built by the rule, with the chats."""
    chat = ([{"role": "system", "content": "You write Python functions."}] if with_system else []) + \
        [{"role": "user", "content": "Write f, please."}]
    ids = prompt_ids(tok, chat)
    turns = []
    for action, reply in zip(ACTIONS, REPLIES):
        generated = tok(action, add_special_tokens=False)["input_ids"]
        turns.append((chat, ids, generated))
        nxt = chat + [{"role": "assistant", "content": tok.decode(generated)}, {"role": "user", "content": reply}]
        ids = continued_prompt_ids(tok, chat, ids, generated, nxt)
        if ids is None:
            return turns, None
        chat = nxt
    return turns, (chat, ids)


@pytest.mark.parametrize("name", ["tiny", "smollm2", "qwen2-style", "llama3-style"])
@pytest.mark.parametrize("with_system", [True, False])
def test_each_turn_continues_the_last_and_decodes_to_the_templates_rendering(name, with_system):
    tok = _tokenizer(name)
    turns, last = _dialogue(tok, with_system)
    assert last is not None, f"{name}: the continuation was refused after {len(turns)} turns"
    turns.append((last[0], last[1], []))
    for (chat, ids, generated), (nxt_chat, nxt_ids, _) in zip(turns, turns[1:]):
        head = list(ids) + list(generated)
        assert nxt_ids[:len(head)] == head  # one token sequence: nothing before is re-tokenised
        assert nxt_ids[len(head)] == tok.eos_token_id  # what a trainer appends to a turn the model ended
        assert tok.decode(nxt_ids, skip_special_tokens=False) == render_prompt(tok, nxt_chat)


def test_the_tiny_tokenizer_templated_whole_is_not_one_sequence():
    # Why the rule exists: templating the whole chat again re-tokenises the boundary. On the
    # tiny tokenizer the generation header's last token merges with the reply that follows.
    tok = _tokenizer("tiny")
    turns, _ = _dialogue(tok, True)
    broken = 0
    for (chat, ids, generated), (nxt_chat, _, _) in zip(turns, turns[1:]):
        whole = prompt_ids(tok, nxt_chat)
        broken += whole[:len(ids) + len(generated)] != list(ids) + list(generated)
    assert broken > 0


def test_a_template_that_rewrites_earlier_turns_is_not_continued():
    tok = _tokenizer("trimming")
    turns, last = _dialogue(tok, True)
    assert last is None and len(turns) == 2  # "ok\n\n" is rendered trimmed: templated whole from there


def test_a_chat_that_does_not_extend_the_last_one_is_not_continued():
    tok = _tokenizer("smollm2")
    chat = [{"role": "user", "content": "Write f."}]
    ids, generated = prompt_ids(tok, chat), tok("Which inputs?", add_special_tokens=False)["input_ids"]
    reply = {"role": "user", "content": "ints"}
    assert continued_prompt_ids(tok, chat, ids, generated, chat + [{"role": "assistant", "content": "Which inputs?"},
                                                                   reply]) is not None
    # the agent's message is not the decoded generated ids (an env that edits it)
    assert continued_prompt_ids(tok, chat, ids, generated, chat + [{"role": "assistant", "content": "Which?"},
                                                                   reply]) is None
    # an earlier message changed (an env that rewrites its instructions)
    other = [{"role": "user", "content": "Write g."}]
    assert continued_prompt_ids(tok, chat, ids, generated, other + [{"role": "assistant", "content": "Which inputs?"},
                                                                    reply]) is None
    # the recorded ids are not the rendering of the earlier chat
    assert continued_prompt_ids(tok, chat, ids[:-1], generated, chat + [{"role": "assistant",
                                                                          "content": "Which inputs?"}, reply]) is None
    # no assistant message where the earlier chat ends
    assert continued_prompt_ids(tok, chat, ids, generated, chat + [reply]) is None
