"""The transformers backend on the tiny random Llama (CPU, float32)."""

from __future__ import annotations

import pytest
import torch

from engines import EngineError, EngineOptions, SamplingParams
from engines.hf import HFEngine
from engines.templating import prompt_ids

CONVS = [
    [{"role": "user", "content": "Write a function that adds two numbers."}],
    [
        {"role": "system", "content": "You are a careful assistant who asks questions before answering."},
        {"role": "user", "content": "def f(x):\n    return x"},
        {"role": "assistant", "content": "What should f return for negative x?"},
        {"role": "user", "content": "I don't know."},
    ],
    [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": " there"}]}],
]


def teacher_forced_logprobs(model, prompt, completion):
    """log π(completion[i] | prompt, completion[:i]) from one unpadded forward pass."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logprobs = model(ids).logits[0].float().log_softmax(-1)
    start = len(prompt) - 1
    return [logprobs[start + i, t].item() for i, t in enumerate(completion)]


def test_n_samples_per_conversation(hf_engine):
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=0)
    out = hf_engine.generate(CONVS, params)
    assert len(out) == len(CONVS)
    for conv, samples in zip(CONVS, out):
        assert len(samples) == 3
        assert len({s.token_ids for s in samples}) > 1  # sampled, not copies
        for s in samples:
            assert s.prompt_token_ids == tuple(prompt_ids(hf_engine.tokenizer, conv))
            assert 0 < len(s.token_ids) <= 12 and len(s.logprobs) == len(s.token_ids)
            assert s.finish_reason in ("stop", "length")
            assert hf_engine.tokenizer.decode(list(s.token_ids)) == s.text
    assert hf_engine.generate([], params) == []


def test_prompt_ids_has_one_bos_and_ends_with_generation_prompt(hf_engine):
    tok = hf_engine.tokenizer
    ids = prompt_ids(tok, CONVS[0])
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert tok.decode(ids).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_seed_makes_samples_reproducible(hf_engine):
    params = SamplingParams(n=2, temperature=1.0, top_p=0.9, max_new_tokens=10, seed=123)
    first = hf_engine.generate(CONVS, params)
    torch.rand(5)  # global RNG state must not matter
    assert hf_engine.generate(CONVS, params) == first
    other = hf_engine.generate(CONVS, SamplingParams(n=2, temperature=1.0, top_p=0.9, max_new_tokens=10, seed=124))
    assert other != first


def test_seeded_samples_ignore_global_rng_use_during_generation(hf_engine):
    """A seeded call draws from its own generator: another thread reseeding or drawing
    from the process-wide RNG between decoding steps (LOOP's trainer while the async
    sampler generates) changes nothing, and the process-wide stream is left as it was."""
    params = SamplingParams(n=2, temperature=1.0, top_p=0.9, max_new_tokens=10, seed=123)
    clean = hf_engine.generate(CONVS, params)

    def other_thread_uses_global_rng(module, args):
        torch.manual_seed(999)
        torch.rand(1000)

    handle = hf_engine.model.register_forward_pre_hook(other_thread_uses_global_rng)
    try:
        disturbed = hf_engine.generate(CONVS, params)
    finally:
        handle.remove()
    assert disturbed == clean
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    hf_engine.generate(CONVS, params)
    assert torch.equal(torch.rand(4), expected)


def test_logprobs_match_teacher_forced_forward(hf_engine):
    # temperature and top-p change how tokens are drawn, never the reported log-probs
    params = SamplingParams(n=2, temperature=0.7, top_p=0.8, max_new_tokens=16, seed=7)
    for samples in hf_engine.generate(CONVS, params):
        for s in samples:
            expected = teacher_forced_logprobs(hf_engine.model, s.prompt_token_ids, s.token_ids)
            assert max(abs(a - b) for a, b in zip(s.logprobs, expected)) < 1e-4


def test_left_padding_matches_unbatched_greedy(tiny_path, hf_engine):
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=16)
    batched = hf_engine.generate(CONVS, params)  # prompts of different lengths, one batch
    single = HFEngine.from_model(hf_engine.model, hf_engine.tokenizer, options=EngineOptions(batch_size=1))
    for conv, samples in zip(CONVS, batched):
        alone = single.generate([conv], params)[0]
        assert samples[0].token_ids == samples[1].token_ids == alone[0].token_ids
        assert max(abs(a - b) for a, b in zip(samples[0].logprobs, alone[0].logprobs)) < 1e-4


def test_stop_string_cuts_text_and_ids(hf_engine):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    full = hf_engine.generate(CONVS[:1], greedy)[0][0]
    assert full.finish_reason == "length" and len(full.text) > 12
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]  # a string the model really produces
    cut = hf_engine.generate(CONVS[:1], SamplingParams(temperature=0.0, max_new_tokens=24, stop=(stop,)))[0][0]
    assert cut.finish_reason == "stop_string"  # not an end of turn: trainers append no eos
    assert stop not in cut.text and full.text.startswith(cut.text)
    assert hf_engine.tokenizer.decode(list(cut.token_ids)) == cut.text
    assert full.token_ids[: len(cut.token_ids)] == cut.token_ids
    # the longest prefix: one more token reaches the stop string
    assert stop in hf_engine.tokenizer.decode(list(full.token_ids[: len(cut.token_ids) + 1]))
    assert cut.logprobs == full.logprobs[: len(cut.token_ids)]


def test_stop_string_ends_generation_early(hf_engine):
    """Once every row has hit a stop string, the batch stops: fewer forward steps."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    full = hf_engine.generate(CONVS[:1], greedy)[0][0]
    stop = full.text[4:8]
    steps = []
    hook = hf_engine.model.register_forward_hook(lambda *_: steps.append(1))
    try:
        hf_engine.generate(CONVS[:1], SamplingParams(n=2, temperature=0.0, max_new_tokens=40, stop=(stop,)))
    finally:
        hook.remove()
    assert len(steps) < 20


def test_end_of_turn_token_is_not_returned(tiny_path):
    """A model that always says <|eot_id|>: empty completion, finish 'stop'."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    eos = tok.eos_token_id

    def favour_eos(module, inputs, logits):
        logits = logits.clone()
        logits[..., eos] += 100.0
        return logits

    model.lm_head.register_forward_hook(favour_eos)
    model.train()
    engine = HFEngine.from_model(model, tok)
    assert engine.model is model and engine.tokenizer is tok and engine.spec == "hf:live"
    [[s]] = engine.generate(CONVS[:1], SamplingParams(temperature=1.0, max_new_tokens=8, seed=0))
    assert (s.text, s.token_ids, s.logprobs, s.finish_reason) == ("", (), (), "stop")
    assert model.training  # the trainer's mode is restored


def test_image_parts_are_refused_with_a_clear_error(hf_engine):
    conv = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    with pytest.raises(EngineError, match="'image_url' content part"):
        hf_engine.generate([conv], SamplingParams())


def test_lora_adapter_is_applied(tiny_path, tmp_path, hf_engine):
    """EngineOptions.lora_path: the engine samples from base + adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)  # a fresh adapter is the identity: make it count
    peft_model.save_pretrained(tmp_path / "adapter")
    engine = HFEngine(str(tiny_path), EngineOptions(device="cpu", dtype="float32", lora_path=str(tmp_path / "adapter")))
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    [[adapted]] = engine.generate(CONVS[:1], params)
    [[plain]] = hf_engine.generate(CONVS[:1], params)
    assert adapted.token_ids != plain.token_ids
    expected = teacher_forced_logprobs(peft_model.eval(), adapted.prompt_token_ids, adapted.token_ids)
    assert max(abs(a - b) for a, b in zip(adapted.logprobs, expected)) < 1e-4


def test_sampler_draws_each_token_at_its_probability_and_never_a_cut_one():
    """`_Sampler` (inverse transform, one uniform per row and step): over 20,000 draws each
    token's frequency is within 5 standard errors of softmax(scores), and a token of
    probability zero (cut by top-p: −inf) is never drawn, in either row."""
    from engines.hf import _Sampler, row_generators

    probs = torch.tensor([0.1, 0.2, 0.0, 0.7])
    scores = probs.log().repeat(2, 1)  # log 0 = −inf
    sampler = _Sampler(row_generators(0, [(0, 0), (1, 0)]))
    draws = torch.stack([sampler(None, scores).argmax(-1) for _ in range(10_000)]).flatten()
    counts = torch.bincount(draws, minlength=4).double()
    n = draws.numel()
    assert counts[2] == 0
    stderr = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert ((counts / n - probs.double()).abs() <= 5 * stderr).all(), (counts / n).tolist()


def test_a_rows_draws_do_not_depend_on_its_batch(tiny_path, hf_engine):
    """Each row samples from its own generator (`row_generators`: seed, prompt, copy), so
    one row per batch and eight per batch draw the same tokens (the log-probs differ by
    the float noise of left padding, as in test_left_padding_matches_unbatched_greedy)."""
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=11)
    alone = HFEngine.from_model(hf_engine.model, hf_engine.tokenizer, options=EngineOptions(batch_size=1))
    for unbatched, batched in zip(alone.generate(CONVS, params), hf_engine.generate(CONVS, params), strict=True):
        assert len({s.token_ids for s in batched}) > 1  # three distinct draws per prompt, not copies
        for a, b in zip(unbatched, batched, strict=True):
            assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_n_samples_of_one_prompt_are_prefilled_once(hf_engine):
    """Stage 2's 16 candidates per state: a batch's rows that share a prompt run it once
    (engines.hf's shared prefill), and draw what rows decoded one per batch draw. The
    log-probs differ by float32 noise (another batch shape sums in another order)."""
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=10, seed=5)
    widths = []
    hook = hf_engine.model.register_forward_pre_hook(
        lambda m, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        shared = hf_engine.generate(CONVS[:2], params)  # 16 rows, 2 prompts: one batch (batch_size 8: two)
    finally:
        hook.remove()
    prompt_lengths = sorted(len(prompt_ids(hf_engine.tokenizer, c)) for c in CONVS[:2])
    prefills = [w for w in widths if w[1] > 1]
    assert [w[0] for w in prefills] == [1, 1], widths  # each batch of 8 copies prefilled one row
    assert sorted(w[1] + 1 for w in prefills) == prompt_lengths  # its prompt but the last token
    alone = HFEngine.from_model(hf_engine.model, hf_engine.tokenizer, options=EngineOptions(batch_size=1))
    for one_by_one, together in zip(alone.generate(CONVS[:2], params), shared, strict=True):
        assert len({s.token_ids for s in together}) > 1
        for a, b in zip(one_by_one, together, strict=True):
            assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_decoding_workers_give_the_samples_of_one_process(tiny_path, hf_engine, tmp_path):
    """EngineOptions.workers: the batches are decoded in forked processes (not this one),
    and the samples, seeded or not, are those of one process."""
    import os

    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=5)
    pids = tmp_path / "pids"

    def record_pid(module, args):
        with pids.open("a") as f:
            f.write(f"{os.getpid()}\n")

    forked = HFEngine.from_model(hf_engine.model, hf_engine.tokenizer, options=EngineOptions(batch_size=2, workers=2))
    one = HFEngine.from_model(hf_engine.model, hf_engine.tokenizer, options=EngineOptions(batch_size=2))
    handle = hf_engine.model.register_forward_pre_hook(record_pid)
    try:
        in_processes = forked.generate(CONVS, params)
    finally:
        handle.remove()
    decoders = {int(p) for p in pids.read_text().split()}
    assert len(decoders) == 2 and os.getpid() not in decoders
    assert in_processes == one.generate(CONVS, params)
    torch.manual_seed(3)
    unseeded = forked.generate(CONVS, SamplingParams(n=2, temperature=1.0, max_new_tokens=12))
    torch.manual_seed(3)
    assert unseeded == one.generate(CONVS, SamplingParams(n=2, temperature=1.0, max_new_tokens=12))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    assert forked.generate(CONVS, greedy) == one.generate(CONVS, greedy)


def test_a_failing_decoding_worker_is_an_engine_error(hf_engine):
    """An error in a forked decoder reaches the caller as one EngineError naming it, one line."""
    forked = HFEngine.from_model(hf_engine.model, hf_engine.tokenizer, options=EngineOptions(batch_size=1, workers=2))

    def fail(module, args):
        raise ValueError("boom in the forward\nwith a second line")

    handle = hf_engine.model.register_forward_pre_hook(fail)
    try:
        with pytest.raises(EngineError, match=r"decoding in 2 processes failed: hf-decode-0: ValueError: boom") as err:
            forked.generate(CONVS, SamplingParams(temperature=1.0, max_new_tokens=4, seed=0))
    finally:
        handle.remove()
    assert "\n" not in str(err.value)  # one line per process


def test_auto_precision_is_the_trainers_not_the_checkpoints(tiny_path, tmp_path):
    """A checkpoint saved in bfloat16 (as SmolLM2 ships) samples under `auto` in the trainers'
    dtype (float32 on a CPU), and each episode records the precision that sampled it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from colbench.agents import ModelAgent
    from colbench.episodes import EpisodeConfig, run_episodes
    from engines.base import EngineOptions, SamplingParams
    from sweet.core.models import torch_dtype
    from testbed.env import TestbedEnv, make_tasks
    from testbed.human import TestbedSimulator

    bf16 = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16).save_pretrained(bf16)
    AutoTokenizer.from_pretrained(tiny_path).save_pretrained(bf16)
    engine = HFEngine(str(bf16), EngineOptions(device="cpu"))
    assert engine.precision == str(torch_dtype("auto")).removeprefix("torch.")
    assert engine.precision == "float32" or torch.cuda.is_available()
    assert HFEngine(str(bf16), EngineOptions(device="cpu", dtype="bfloat16")).precision == "bfloat16"
    env = TestbedEnv(max_turns=1)
    try:
        [ep] = run_episodes(env, make_tasks("train", n=1, bed="legacy"),
                            ModelAgent(engine, SamplingParams(max_new_tokens=4), name="tiny"), TestbedSimulator(),
                            seeds=(0,), config=EpisodeConfig(max_turns=1), progress=False)
    finally:
        env.close()
    assert ep.meta["precision"] == engine.precision
