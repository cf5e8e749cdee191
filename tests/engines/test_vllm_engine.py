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


# ---------------------------------------------------------------- CPU: no vLLM needed


def test_engine_kwargs_pass_memory_sleep_and_lora_rank(tmp_path):
    from engines.vllm_engine import COLOCATED_GPU_MEMORY_UTILIZATION, engine_kwargs

    plain = engine_kwargs("m", EngineOptions())
    assert plain["gpu_memory_utilization"] == 0.85 and plain["enable_lora"] is False and "max_lora_rank" not in plain
    assert plain["worker_extension_cls"] == "engines.vllm_worker.WeightSync"
    assert plain["enable_prefix_caching"] is True  # n candidates of a state share their prompt's blocks
    colocated = engine_kwargs("m", EngineOptions(enable_lora=True, max_lora_rank=32, enable_sleep_mode=True,
                                                 gpu_memory_utilization=COLOCATED_GPU_MEMORY_UTILIZATION,
                                                 tensor_parallel_size=2))
    assert colocated["max_lora_rank"] == 32 and colocated["enable_sleep_mode"] is True
    assert colocated["gpu_memory_utilization"] == 0.45 and colocated["tensor_parallel_size"] == 2
    assert engine_kwargs("m", EngineOptions(enable_lora=True, max_lora_rank=24))["max_lora_rank"] == 32  # rounded up
    assert engine_kwargs("m", EngineOptions(enable_lora=True))["max_lora_rank"] == 16  # vLLM's default
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 64}')
    assert engine_kwargs("m", EngineOptions(lora_path=str(adapter)))["max_lora_rank"] == 64  # read from the adapter


def test_lora_rank_limits():
    from engines import EngineError
    from engines.vllm_engine import lora_rank_limit

    assert [lora_rank_limit(r) for r in (1, 2, 8, 16, 17, 32, 100, 512)] == [1, 8, 8, 16, 32, 32, 128, 512]
    with pytest.raises(EngineError, match="larger than vLLM supports"):
        lora_rank_limit(513)


def test_greedy_with_n_copies_is_one_distinct_completion():
    assert SamplingParams(n=16, temperature=0.0).distinct == 1
    assert SamplingParams(n=16, temperature=0.7).distinct == 16


class _LoadingModel:
    """Stands in for vLLM's model inside a worker: `load_weights` takes (HF name, full tensor)."""

    def __init__(self, reference):
        import torch

        self.params = {n: torch.zeros_like(p) for n, p in reference.state_dict().items()}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.params[name].copy_(tensor)


def test_full_weight_update_files_carry_every_tensor_to_the_worker(tiny_path, tmp_path):
    """What update_weights sends (safetensors shards, a DDP 'module.' prefix dropped) is what
    the worker extension loads: the worker's weights equal the trainer's, tied ones included."""
    import torch
    from transformers import AutoModelForCausalLM

    from engines.vllm_engine import write_weight_shards
    from engines.vllm_worker import LOAD_METHOD, WeightSync

    trainer = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn_like(p))
    worker = WeightSync()
    worker.model_runner = type("Runner", (), {})()
    model = _LoadingModel(trainer)
    worker.model_runner.get_model = lambda: model
    names = [(f"module.{n}", p) for n, p in trainer.state_dict().items()]  # what LOOP's Sampler.sync sends
    shards = 0
    for path in write_weight_shards(names, tmp_path, shard_bytes=1):  # a shard per layer
        assert getattr(worker, LOAD_METHOD)(str(path)) > 0
        path.unlink()
        shards += 1
    assert shards >= 3 and not list(tmp_path.iterdir())
    for name, p in trainer.state_dict().items():
        assert torch.equal(model.params[name], p), name


def test_weight_shards_split_on_layer_boundaries(tiny_path, tmp_path):
    """With a shard size a third of one decoder layer (by bytes alone every layer would
    span shards, and vLLM's reload would process a fused q/k/v or gate/up layer with parts
    missing), each layer lies whole in one shard, every tensor is written once, and a
    layer's tensor that comes back after its shard was written is refused."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from engines import EngineError
    from engines.vllm_engine import weight_group, write_weight_shards

    state = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    layer_bytes = sum(t.numel() * 4 for n, t in state.items() if n.startswith("model.layers.0."))
    shards = []
    for path in write_weight_shards(state.items(), tmp_path, shard_bytes=layer_bytes // 3):
        with safe_open(str(path), framework="pt") as f:
            shards.append({n: f.get_tensor(n) for n in f.keys()})
    groups = [{weight_group(n) for n in shard} for shard in shards]
    layers = {weight_group(n) for n in state if ".layers." in n}
    assert len(layers) == 4 and all(sum(layer in g for g in groups) == 1 for layer in layers)
    assert weight_group("model.layers.12.mlp.up_proj.weight") == "model.layers.12"
    assert weight_group("lm_head.weight") == "lm_head.weight"
    assert len(shards) >= 4  # it does split: at least one shard per layer at this size
    written = {n: t for shard in shards for n, t in shard.items()}
    assert written.keys() == state.keys() and all(torch.equal(written[n], state[n]) for n in state)
    items = list(state.items())
    late = [i for i, (n, _) in enumerate(items) if n.startswith("model.layers.0.")][0]
    shuffled = [*items[:late], *items[late + 1:], items[late]]  # layer 0's first tensor after every other layer
    with pytest.raises(EngineError, match="model.layers.0"):
        list(write_weight_shards(shuffled, tmp_path / "x", shard_bytes=layer_bytes // 3))


def test_cpu_share_rule():
    """One process alone binds every core it may use; n sharers get contiguous near-equal
    slices (at least one core each)."""
    from engines.vllm_engine import cpu_share

    assert cpu_share(cores=[0, 1]) == [0, 1]
    assert [cpu_share(i, 2, cores=[0, 1]) for i in range(2)] == [[0], [1]]
    assert [cpu_share(i, 2, cores=[4, 5, 6]) for i in range(2)] == [[4], [5, 6]]
    assert [cpu_share(i, 3, cores=[0, 1]) for i in range(3)] == [[0], [1], [0]]
    import os

    assert cpu_share() == sorted(os.sched_getaffinity(0))


def test_worker_extension_names_do_not_clash_with_vllm_worker_methods():
    """vLLM refuses an extension whose attribute shadows a Worker attribute; ours are prefixed."""
    from engines.vllm_worker import WeightSync

    own = [n for n in vars(WeightSync) if not n.startswith("__")]
    assert own == ["sweet_load_weights"]


def _logprob_error(engine, model, conv, sample) -> float:
    """max |vLLM log-prob − the HF model's| over the sample's tokens."""
    import torch

    ids = torch.tensor([list(sample.prompt_token_ids) + list(sample.token_ids)], device="cuda")
    with torch.no_grad():
        lp = model(ids).logits[0].float().log_softmax(-1)
    start = len(sample.prompt_token_ids) - 1
    return max(abs(a - lp[start + i, t].item()) for i, (a, t) in enumerate(zip(sample.logprobs, sample.token_ids)))


@pytest.mark.gpu
def test_vllm_follows_full_weights_and_lora_updates(tiny_path, tmp_path):
    """After update_weights / load_lora, vLLM samples from the trainer's current model."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from engines.vllm_engine import VLLMEngine

    conv = [{"role": "user", "content": "Write a function that adds two numbers."}]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).cuda()
    engine = VLLMEngine(str(tiny_path), EngineOptions(dtype="float32", gpu_memory_utilization=0.3, max_model_len=512,
                                                      enable_lora=True, max_lora_rank=32), spec="vllm:tiny")
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        engine.update_weights(model.state_dict().items())
        [[full]] = engine.generate([conv], params)
        assert _logprob_error(engine, model, conv, full) < 1e-2
        peft = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear"))
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        peft.save_pretrained(tmp_path / "adapter")
        engine.load_lora(str(tmp_path / "adapter"))
        [[adapted]] = engine.generate([conv], params)
        assert _logprob_error(engine, peft, conv, adapted) < 1e-2
    finally:
        engine.close()


def test_auto_precision_is_the_trainers_rule():
    """vLLM's own "auto" is bf16 on a CPU while the trainers run float32: the engine is given
    the one rule's answer (engines.base.resolve_dtype), an explicit dtype as given."""
    import torch

    from engines.base import resolve_dtype
    from engines.vllm_engine import engine_kwargs
    from sweet.core.models import torch_dtype

    assert engine_kwargs("m", EngineOptions())["dtype"] == resolve_dtype("auto")
    assert getattr(torch, resolve_dtype("auto")) == torch_dtype("auto")
    if not torch.cuda.is_available():
        assert resolve_dtype("auto") == "float32"
    assert engine_kwargs("m", EngineOptions(dtype="bfloat16"))["dtype"] == "bfloat16"
