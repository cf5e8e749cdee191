"""The vLLM backend on the tiny model (GPU only: skipped without CUDA and vLLM)."""

from __future__ import annotations

import importlib.util

import pytest

from engines import EngineOptions, SamplingParams


def _skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install '.[vllm]' on a CUDA machine)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


@pytest.mark.gpu
def test_vllm_samples_match_hf_conventions(tiny_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    from engines.templating import prompt_ids
    from engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        str(tiny_path), EngineOptions(dtype="float32", gpu_memory_utilization=0.3, max_model_len=512), spec="vllm:tiny"
    )
    convs = [[{"role": "user", "content": "Write a function that adds two numbers."}], [{"role": "user", "content": "hi"}]]
    try:
        out = engine.generate(convs, SamplingParams(n=3, temperature=1.0, max_new_tokens=16, seed=0))
        again = engine.generate(convs, SamplingParams(n=3, temperature=1.0, max_new_tokens=16, seed=0))
        greedy = engine.generate(convs[:1], SamplingParams(temperature=0.0, max_new_tokens=24))[0][0]
        stop = greedy.text[len(greedy.text) // 2 : len(greedy.text) // 2 + 3]
        cut = engine.generate(convs[:1], SamplingParams(temperature=0.0, max_new_tokens=24, stop=(stop,)))[0][0]
    finally:
        engine.close()
    assert out == again
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).cuda()
    for conv, samples in zip(convs, out):
        assert len(samples) == 3
        for s in samples:
            assert s.prompt_token_ids == tuple(prompt_ids(engine.tokenizer, conv))
            assert engine.tokenizer.decode(list(s.token_ids)) == s.text
            ids = torch.tensor([list(s.prompt_token_ids) + list(s.token_ids)], device="cuda")
            with torch.no_grad():
                lp = model(ids).logits[0].float().log_softmax(-1)
            start = len(s.prompt_token_ids) - 1
            expected = [lp[start + i, t].item() for i, t in enumerate(s.token_ids)]
            assert max(abs(a - b) for a, b in zip(s.logprobs, expected)) < 1e-2
    assert cut.finish_reason == "stop_string" and stop not in cut.text and greedy.text.startswith(cut.text)
