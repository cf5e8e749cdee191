"""Prompts against the model's context (engines.base.fit_prompt), in every engine: a prompt that
does not fit fails on its own (BatchError holding a ContextOverflow) while the others of the
call are generated; one near the end of the context generates less, recorded; forward
batches keep to a token budget. The tiny model for real, vLLM with a stand-in LLM object,
OpenAI-compatible servers on loopback."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest
from local_http import LocalServer, send_json

from engines import EngineOptions, SamplingParams
from engines.base import BatchError, ContextOverflow, Sample, fit_prompt
from engines.hf import NO_LIMIT, context_length_of, plan_batches
from engines.templating import prompt_ids

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
SHORT = [{"role": "user", "content": "Write a function that adds two numbers."}]
OTHER = [{"role": "user", "content": "hi"}]


def words(n: int) -> list[dict]:
    return [{"role": "user", "content": "word " * n}]


def conversation_of(tokenizer, n_tokens: int) -> list[dict]:
    """A conversation whose templated prompt is exactly `n_tokens` tokens (tiny: one token per "word ")."""
    n = n_tokens
    while True:
        conv = words(n)
        have = len(prompt_ids(tokenizer, conv))
        if have == n_tokens:
            return conv
        n += n_tokens - have


# ------------------------------------------------------------------------------ the rule


def test_fit_prompt_gives_the_budget_caps_it_near_the_end_and_refuses_what_cannot_generate():
    assert fit_prompt(100, 64, 4096) == 64
    assert fit_prompt(4090, 64, 4096) == 6  # capped to the room left
    assert fit_prompt(4095, 64, 4096) == 1
    assert fit_prompt(10**6, 64, None) == 64  # unknown context: no limit
    with pytest.raises(ContextOverflow, match=r"^tiny: prompt of 5000 tokens exceeds the context of 4096$") as e:
        fit_prompt(5000, 64, 4096, "tiny")
    assert (e.value.n_prompt, e.value.context) == (5000, 4096)
    with pytest.raises(ContextOverflow, match=r"prompt of 4096 tokens exceeds the context of 4096 \(no room"):
        fit_prompt(4096, 64, 4096)


def test_the_context_is_the_configs_or_a_smaller_real_tokenizer_limit_never_the_sentinel(hf_engine):
    assert hf_engine.context_length == 4096  # tiny's max_position_embeddings
    assert hf_engine.tokenizer.model_max_length >= NO_LIMIT  # transformers' "no limit" sentinel, ignored
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=8192))
    assert context_length_of(model, SimpleNamespace(model_max_length=int(1e30))) == 8192
    assert context_length_of(model, SimpleNamespace(model_max_length=2048)) == 2048
    assert context_length_of(SimpleNamespace(config=SimpleNamespace()), SimpleNamespace(model_max_length=1e30)) is None


# ------------------------------------------------------------------------------ hf (tiny, for real)


def test_an_oversized_prompt_fails_alone_and_the_others_are_generated_as_without_it(hf_engine):
    alone = hf_engine.generate([SHORT, OTHER], GREEDY)
    with pytest.raises(BatchError) as e:
        hf_engine.generate([SHORT, words(6000), OTHER], GREEDY)
    first, overflow, last = e.value.results
    n = len(prompt_ids(hf_engine.tokenizer, words(6000)))
    assert isinstance(overflow, ContextOverflow)
    assert str(overflow) == f"tiny: prompt of {n} tokens exceeds the context of 4096"
    assert [first, last] == alone


def test_a_prompt_near_the_end_of_the_context_generates_only_what_fits_and_says_so(hf_engine):
    near = conversation_of(hf_engine.tokenizer, 4096 - 3)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0, n=2)
    out = hf_engine.generate([SHORT, near], params)
    assert all(s.capped_max_new_tokens is None for s in out[0])
    for s in out[1]:
        assert s.capped_max_new_tokens == 3
        assert len(s.token_ids) <= 3 and len(s.prompt_token_ids) == 4093


def test_plan_batches_keeps_rows_times_tokens_under_the_budget_and_one_budget_per_batch():
    lengths = [100, 100, 300, 300, 900, 4000]
    budgets = {0: 50, 1: 50, 2: 50, 3: 50, 4: 50, 5: 20}
    rows = [(c, 0) for c in range(6)]
    chunks = plan_batches(rows, lengths, budgets, batch_size=3, max_tokens=1000)
    assert chunks == [(rows[0:2], 50), (rows[2:4], 50), (rows[4:5], 50), (rows[5:], 20)]
    for chunk, budget in chunks[:-1]:  # a row over the budget alone still goes
        assert len(chunk) * (max(lengths[c] for c, _ in chunk) + budget) <= 1000
    assert plan_batches(rows, lengths, budgets, batch_size=3, max_tokens=None) == \
        [(rows[0:3], 50), (rows[3:5], 50), (rows[5:], 20)]
    assert plan_batches(rows, lengths, budgets, batch_size=16, max_tokens=None) == [(rows[:5], 50), (rows[5:], 20)]


def test_the_engine_batches_within_its_token_budget(tiny_path, monkeypatch):
    from engines.hf import HFEngine

    engine = HFEngine(str(tiny_path), EngineOptions(device="cpu", dtype="float32", batch_size=16,
                                                    max_batch_tokens=600), spec="tiny")
    seen = []
    real = engine._generate_batch

    def spy(batch_prompts, params, generators=None):
        seen.append((len(batch_prompts), max(map(len, batch_prompts)), params.max_new_tokens))
        return real(batch_prompts, params, generators)

    monkeypatch.setattr(engine, "_generate_batch", spy)
    try:
        out = engine.generate([words(90 + 10 * i) for i in range(8)], GREEDY)
        assert len(out) == 8
        assert len(seen) > 1 and all(rows * (width + new) <= 600 for rows, width, new in seen)
        assert engine._max_batch_tokens() == 600
        engine.options.max_batch_tokens = None
        assert engine._max_batch_tokens() == 16384  # the CPU's default
    finally:
        engine.close()


# ------------------------------------------------------------------------------ vllm (a stand-in LLM)


class _FakeLLM:
    """What VLLMEngine.generate uses of vllm.LLM; records what it was sent."""

    def __init__(self, max_model_len: int):
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len))
        self.sent = []

    def generate(self, prompts, sampling, lora_request=None, use_tqdm=False):
        self.sent.append((prompts, sampling))
        if any(len(p["prompt_token_ids"]) >= self.llm_engine.model_config.max_model_len for p in prompts):
            raise ValueError("The decoder prompt is longer than the maximum model length")  # vLLM fails them all
        done = SimpleNamespace(index=0, token_ids=[5], logprobs=None, finish_reason="length")
        return [SimpleNamespace(outputs=[done]) for _ in prompts]


def test_vllm_sends_only_prompts_that_fit_each_with_its_own_budget(hf_engine, monkeypatch):
    import engines.vllm_engine as ve

    monkeypatch.setattr(ve, "_import_vllm", lambda: SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw)))
    llm = _FakeLLM(max_model_len=300)
    assert ve.max_model_len(llm) == 300
    assert ve.max_model_len(SimpleNamespace(llm_engine=SimpleNamespace())) is None
    engine = ve.VLLMEngine.__new__(ve.VLLMEngine)
    engine.llm, engine.spec, engine.context_length, engine._asleep = llm, "vllm:tiny", 300, False
    engine.tokenizer, engine.end_ids, engine.lora_request = hf_engine.tokenizer, hf_engine.end_ids, None
    near = conversation_of(hf_engine.tokenizer, 296)
    with pytest.raises(BatchError) as e:
        engine.generate([SHORT, words(400), near], GREEDY)
    ok, overflow, capped = e.value.results
    assert isinstance(overflow, ContextOverflow) and "exceeds the context of 300" in str(overflow)
    (prompts, sampling), = llm.sent
    assert len(prompts) == 2 and [s.max_tokens for s in sampling] == [8, 4]
    assert ok[0].capped_max_new_tokens is None and capped[0].capped_max_new_tokens == 4


# ------------------------------------------------------------------------------ openai (loopback server)


class ContextServer(LocalServer):
    """Refuses, as vLLM serve does, any request whose prompt + max_tokens pass `context`;
    the prompt's tokens are the characters of its messages."""

    def __init__(self, context: int):
        outer = self
        self.max_tokens: list[int] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = sum(len(m["content"]) for m in body["messages"])
                want = body.get("max_tokens") or body.get("max_completion_tokens")
                outer.max_tokens.append(want)
                if n + want > context:
                    send_json(self, 400, {"error": {"message": (
                        f"This model's maximum context length is {context} tokens. However, you requested "
                        f"{n + want} tokens ({n} in the messages, {want} in the completion). Please reduce the "
                        "length of the messages or completion."), "type": "BadRequestError", "code": 400}})
                    return
                send_json(self, 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                   "finish_reason": "stop"}]})

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def test_a_server_context_refusal_fails_its_conversation_as_a_context_overflow_or_is_resent_capped():
    from engines.openai_engine import OpenAIEngine, ReplyError

    server = ContextServer(context=100)
    engine = OpenAIEngine("m", server.url, EngineOptions(max_retries=0), retry_backoff=0.0)
    try:
        assert engine.context_length is None
        convs = [[{"role": "user", "content": "x" * 20}], [{"role": "user", "content": "x" * 150}],
                 [{"role": "user", "content": "x" * 95}]]
        with pytest.raises(BatchError) as e:
            engine.generate(convs, SamplingParams(temperature=0.0, max_new_tokens=10))
        ok, overflow, capped = e.value.results
        assert isinstance(ok[0], Sample) and ok[0].capped_max_new_tokens is None
        assert isinstance(overflow, ContextOverflow) and not isinstance(overflow, ReplyError)
        assert str(overflow) == f"{engine.spec}: prompt of 150 tokens exceeds the context of 100"
        assert capped[0].text == "ok" and capped[0].capped_max_new_tokens == 5  # resent with the room left
        assert sorted(server.max_tokens) == [5, 10, 10, 10]
        assert engine._features["max_tokens"]  # a context refusal is not a refused max_tokens field
    finally:
        engine.close()
        server.close()


def test_a_context_refusal_without_the_prompts_size_is_the_servers_reply_as_a_context_overflow():
    from engines.openai_engine import ReplyError, ServerContextOverflow, context_numbers

    assert context_numbers("This model's maximum context length is 2048 tokens. However, your request has 3000 "
                           "input tokens. Please reduce the length of the input messages.") == (3000, 2048)
    assert context_numbers("'max_tokens' or 'max_completion_tokens' is too large: 1024. This model's maximum "
                           "context length is 2048 tokens and your request has 1500 input tokens") == (1500, 2048)
    assert context_numbers("The decoder prompt (length 9000) is longer than the maximum model length of 8192.") == \
        (9000, 8192)
    assert context_numbers("maximum context length is 4096 tokens") == (None, 4096)
    assert context_numbers("temperature must be >= 0") is None
    e = ServerContextOverflow("u returned HTTP 400 (not retried): m", 400, "m", n_prompt=None, context=4096)
    assert isinstance(e, ReplyError) and isinstance(e, ContextOverflow) and e.context == 4096
