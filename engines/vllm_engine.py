"""vLLM offline backend: `vllm.LLM` in this process (its engine core is a process of its own:
a script that starts one needs an `if __name__ == "__main__":` guard).

    pip install '.[vllm]'            # on a CUDA machine
    bash scripts/setup_vllm.sh       # CPU: vLLM's CPU build in .venv-vllm (docs/vllm.md)
    engine = load_engine("vllm:meta-llama/Llama-3.1-8B-Instruct",
                         EngineOptions(tensor_parallel_size=2, enable_lora=True, max_lora_rank=32))

Prompts are templated and tokenised here (`engines.templating.prompt_ids`) and passed
as token prompts, so `Sample.prompt_token_ids` is exactly what the model saw and a
trainer can rebuild it. Sampling asks for `logprobs=0`: vLLM then returns the
log-prob of each sampled token, computed from the raw logits (vLLM's default
`logprobs_mode="raw_logprobs"`), the convention of `engines.base`. Greedy with n > 1
(which vLLM refuses) generates once and repeats, like the other backends.

Following a trainer (LOOP):
- `load_lora(path)`: generate with the LoRA adapter saved at `path` from now on; each
  call is a new `LoRARequest` (new int id), so vLLM reloads a path that was overwritten.
- `update_weights(named_tensors)`: full weights through vLLM's worker-extension hook
  (`engines.vllm_worker`): shards written as safetensors files, loaded by every
  tensor-parallel worker with the model's own `load_weights` via `collective_rpc`.
- `sleep()` / automatic wake-up before the next generate, with `enable_sleep_mode`.

Colocated memory (trainer and sampler on one GPU): `COLOCATED_GPU_MEMORY_UTILIZATION`.
"""

from __future__ import annotations

import itertools
import json
import re
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from engines.base import (BatchError, ContextOverflow, Conversation, EngineError, EngineOptions, Sample, SamplingParams,
                          fit_prompt, resolve_dtype)
from engines.memory import release_memory
from engines.templating import cut_completion, end_token_ids, prompt_ids
from engines.vllm_worker import LOAD_METHOD, WORKER_EXTENSION

NOT_INSTALLED = "vLLM is not installed: pip install '.[vllm]' on a CUDA machine, bash scripts/setup_vllm.sh on CPU"

# gpu_memory_utilization for a vLLM sampler sharing one 80 GB GPU (79.6 GiB usable) with an
# 8B bf16 LoRA policy (Llama-3.1-8B; 1 GiB = 2**30 bytes):
#   trainer: weights 8.03e9 x 2 B = 15.0 GiB; LoRA r=16 params, grads, Adam 0.5 GiB;
#            checkpointed activations at 8k tokens 32 x 8192 x 4096 x 2 B = 2.0 GiB plus one
#            recomputed layer ~1.5 GiB; logits 8192 x 128256 in bf16 2.0 GiB, float32
#            log-softmax 2 x 3.9 GiB; CUDA context and allocator slack ~2 GiB      => ~31 GiB
#   sampler: 0.45 x 79.6 = 35.8 GiB = weights 15.0 + activations/CUDA graphs ~3 GiB + KV cache
#            ~18 GiB (128 KiB per token: 32 layers x 8 KV heads x 128 x 2 (K,V) x 2 B)
#            = ~147k tokens in flight                                                => 35.8 GiB
#   together ~67 GiB of 79.6, and vLLM's start-up check (free >= 0.45 x total) passes with
#   the policy's 15 GiB already resident. Full-weight training of an 8B model does not fit
#   one 80 GB GPU at all (Adam states alone are 64 GiB); with `enable_sleep_mode` the
#   sampler's 35.8 GiB are released while the trainer runs.
COLOCATED_GPU_MEMORY_UTILIZATION = 0.45
# LoRA ranks vLLM accepts for max_lora_rank; a rank in between is rounded up.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's CPU build reads gpu_memory_utilization as the share of the machine's memory it
# reserves (weights + KV cache), and refuses to start when less is free: 0.1 of 24 GB holds
# a 135M model in float32 and ~30k tokens of its KV cache, and leaves room for a trainer and
# a second server (`EngineOptions(extra={"cpu_memory_utilization": ...})` to change it).
CPU_MEMORY_UTILIZATION = 0.1
WEIGHT_SHARD_BYTES = 2 << 30  # full-weight updates go through files of at most this size


# vLLM's CPU build binds its OpenMP threads to the cores named in this variable; its own
# default ('auto') leaves one core free, half of a 2-core machine.
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
_bound_here: str | None = None  # the value bind_cpu_threads set (a user's own value is never replaced)


def cpu_share(share: int = 0, shares: int = 1, cores: Sequence[int] | None = None) -> list[int]:
    """The cores process `share` of `shares` processes that run at the same time may use:
    the share-th of `shares` contiguous, near-equal slices of `cores` (default: the cores
    this process may use, os.sched_getaffinity), at least one core (more sharers than
    cores: they take the cores in turn). One process alone gets them all."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if not 0 <= share < shares:
        raise EngineError(f"cpu share {share} of {shares}: expected 0 <= share < shares")
    if shares > len(cores):
        return [cores[share % len(cores)]]
    return cores[share * len(cores) // shares: (share + 1) * len(cores) // shares]


def bind_cpu_threads(share: int = 0, shares: int = 1) -> str | None:
    """Set VLLM_CPU_OMP_THREADS_BIND for a vLLM engine (CPU build) started from this
    process to `cpu_share(share, shares)`, unless the user set the variable (their value is
    kept); returns the value in force. vLLM reads it when the engine starts."""
    global _bound_here
    if os.environ.get(THREADS_BIND) in (None, _bound_here):
        _bound_here = os.environ[THREADS_BIND] = ",".join(map(str, cpu_share(share, shares)))
    return os.environ[THREADS_BIND]


def _is_cpu_build(vllm_module: Any) -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except (ImportError, AttributeError):
        return False


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise EngineError(NOT_INSTALLED) from e
    return vllm


def lora_rank_limit(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of rank `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise EngineError(f"LoRA rank {rank} is larger than vLLM supports ({LORA_RANKS[-1]})")


def engine_kwargs(model: str, options: EngineOptions) -> dict[str, Any]:
    """The `vllm.LLM(...)` arguments for `options` (pure; checked against vLLM's signature
    by scripts/check_vllm.sh)."""
    lora = options.enable_lora or bool(options.lora_path)
    kwargs: dict[str, Any] = dict(
        model=model,
        tensor_parallel_size=options.tensor_parallel_size,
        gpu_memory_utilization=options.gpu_memory_utilization,
        dtype=resolve_dtype(options.dtype),  # the trainers' rule (vLLM's own "auto" is bf16 on a CPU)
        enable_lora=lora,
        enable_sleep_mode=options.enable_sleep_mode,
        # a state's n candidates, and a multi-turn episode's turns (one token sequence), share
        # their prompt's KV cache blocks instead of prefilling them again
        enable_prefix_caching=True,
        worker_extension_cls=WORKER_EXTENSION,
    )
    if lora:
        rank = options.max_lora_rank
        if rank is None and options.lora_path:
            rank = adapter_rank(options.lora_path)
        kwargs["max_lora_rank"] = lora_rank_limit(rank or 16)
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    kwargs.update(options.extra.get("vllm_kwargs", {}))  # e.g. enforce_eager, max_num_seqs
    return kwargs


def adapter_rank(path: str | Path) -> int:
    """The rank `r` in a saved PEFT adapter's adapter_config.json."""
    config = Path(path) / "adapter_config.json"
    try:
        return int(json.loads(config.read_text())["r"])
    except (OSError, ValueError, KeyError) as e:
        raise EngineError(f"{config}: not a readable PEFT adapter config with a rank 'r' ({e})") from None


def to_vllm_sampling(params: SamplingParams, vllm_module: Any) -> Any:
    """Our SamplingParams -> vllm.SamplingParams (greedy asks for one completion)."""
    return vllm_module.SamplingParams(
        n=params.distinct,
        temperature=params.temperature,
        top_p=params.top_p,
        max_tokens=params.max_new_tokens,
        stop=list(params.stop) or None,
        seed=params.seed,
        logprobs=0,  # the sampled token's log-prob only
    )


LAYER_PREFIX = re.compile(r"^(.*?\.layers\.\d+)\.")  # model.layers.7.self_attn.q_proj.weight -> model.layers.7


def weight_group(name: str) -> str:
    """The unit a weight must be loaded with: its decoder layer ('model.layers.7'), whose
    q/k/v and gate/up projections vLLM fuses, or the tensor itself outside the layers."""
    match = LAYER_PREFIX.match(name)
    return match.group(1) if match else name


def write_weight_shards(named_tensors: Iterable[tuple[str, Any]], folder: str | Path,
                        shard_bytes: int = WEIGHT_SHARD_BYTES) -> Iterable[Path]:
    """Write (name, tensor) pairs as safetensors files, yielding each path once written (the
    caller loads and deletes it, so at most one shard is on disk). A shard closes at the
    first layer boundary (`weight_group`) once it holds `shard_bytes`, so every decoder layer
    lies whole in one shard, however small `shard_bytes` is. A layer's tensors must come
    together (state_dict order); one that comes back after its layer's shard was written is
    an EngineError. Names lose a DDP 'module.' prefix; tensors are copied to CPU (tied
    weights included)."""
    from safetensors.torch import save_file

    Path(folder).mkdir(parents=True, exist_ok=True)
    shard: dict[str, Any] = {}
    size, index, group, written = 0, 0, None, set()

    def flush():
        nonlocal shard, size, index
        path = Path(folder) / f"shard-{index:05d}.safetensors"
        save_file(shard, str(path))
        written.update(weight_group(n) for n in shard)
        shard, size, index = {}, 0, index + 1
        return path

    for name, tensor in named_tensors:
        name = name.removeprefix("module.")
        if weight_group(name) in written:
            raise EngineError(f"update_weights: {name} comes after its layer {weight_group(name)} was sent; "
                              "give each layer's tensors together (state_dict order)")
        if weight_group(name) != group:  # a layer boundary: the shard may close here
            group = weight_group(name)
            if shard and size >= shard_bytes:
                yield flush()
        shard[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += shard[name].numel() * shard[name].element_size()
    if shard:
        yield flush()


def max_model_len(llm: Any) -> int | None:
    """The context a started `vllm.LLM` serves (its model config's `max_model_len`), None
    where this vLLM version keeps it elsewhere (then vLLM's own check is the only one)."""
    engine = getattr(llm, "llm_engine", None)
    for config in (getattr(llm, "model_config", None), getattr(engine, "model_config", None),
                   getattr(getattr(engine, "vllm_config", None), "model_config", None)):
        value = getattr(config, "max_model_len", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class VLLMEngine:
    """Chat generation with vLLM's offline `LLM` engine."""

    def __init__(self, model: str, options: EngineOptions | None = None, *, spec: str | None = None) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer, GenerationConfig

        self.options = options or EngineOptions()
        self.spec = spec or f"vllm:{model}"
        self.model_name = model
        kwargs = engine_kwargs(model, self.options)
        self.threads_bind = None
        if _is_cpu_build(vllm):  # CPU build: its share of the cores, and of the memory (not the GPU's share)
            self.threads_bind = bind_cpu_threads(*self.options.extra.get("cpu_share", (0, 1)))
            kwargs["gpu_memory_utilization"] = self.options.extra.get("cpu_memory_utilization", CPU_MEMORY_UTILIZATION)
        self.llm = vllm.LLM(**kwargs)
        self.context_length = max_model_len(self.llm)
        self.precision = kwargs["dtype"]  # recorded per episode
        self._lora_rank = kwargs.get("max_lora_rank")  # None: started without LoRA
        self._asleep = False
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        try:
            gen_config = GenerationConfig.from_pretrained(model)
        except OSError:
            gen_config = None
        self.end_ids = end_token_ids(self.tokenizer, gen_config)
        self._lora_ids = itertools.count(1)
        self.lora_request = None
        if self.options.lora_path:
            self.load_lora(self.options.lora_path)

    def load_lora(self, path: str) -> None:
        """Use the LoRA adapter saved at `path` for all subsequent generations.

        Every call is a new `LoRARequest` with a fresh int id, so vLLM loads the files
        again even when the path is reused (LOOP saves each iteration's adapter to the
        same folder); the previous adapter is removed from the engine's cache.
        """
        if self._lora_rank is None:
            raise EngineError(f"{self.spec}: load_lora needs EngineOptions(enable_lora=True) at start-up")
        rank = adapter_rank(path)
        if rank > self._lora_rank:
            raise EngineError(f"{self.spec}: adapter {path} has rank {rank} > max_lora_rank {self._lora_rank}: "
                              f"start the engine with EngineOptions(max_lora_rank={rank})")
        from vllm.lora.request import LoRARequest

        previous = self.lora_request
        lora_id = next(self._lora_ids)
        self.lora_request = LoRARequest(lora_name=f"adapter-{lora_id}", lora_int_id=lora_id, lora_path=str(path))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy full model weights (HF parameter names, e.g. `policy.state_dict().items()`)
        into the running engine, on every tensor-parallel worker.

        The tensors go through safetensors files of about WEIGHT_SHARD_BYTES
        (`EngineOptions(extra={"weight_shard_bytes": ...})`), each decoder layer whole in one
        (`write_weight_shards`), in /dev/shm when it exists, and `collective_rpc` with the
        worker extension's `sweet_load_weights(path)`, vLLM's in-place reload
        (`engines.vllm_worker`). Only a path is sent to the workers, so every tensor-parallel
        worker must see the folder (true on one node; a multi-node engine needs a shared
        folder: `EngineOptions(extra={"weights_dir": ...})`). The prefix cache is dropped
        afterwards so no KV entry of the old weights is reused.
        """
        self._wake()
        root, shard_bytes = self.options.extra.get("weights_dir"), self.options.extra.get("weight_shard_bytes",
                                                                                         WEIGHT_SHARD_BYTES)
        if (root is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
                and shutil.disk_usage("/dev/shm").free > 2 * shard_bytes):  # containers often have 64 MB
            root = "/dev/shm"  # RAM: no disk round trip for 16 GB of weights
        folder = tempfile.mkdtemp(prefix="sweet-weights-", dir=root)
        loaded = 0
        try:
            for path in write_weight_shards(named_tensors, folder, shard_bytes):
                counts = self.llm.collective_rpc(LOAD_METHOD, args=(str(path),))
                loaded += counts[0]
                path.unlink()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if loaded == 0:
            raise EngineError(f"{self.spec}: update_weights got no tensors")
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Release the GPU memory of weights and KV cache until the next generate
        (needs EngineOptions(enable_sleep_mode=True); level 1 keeps the weights in CPU memory)."""
        if not self.options.enable_sleep_mode:
            raise EngineError(f"{self.spec}: sleep needs EngineOptions(enable_sleep_mode=True) at start-up")
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams) -> list[list[Sample]]:
        """Return `params.n` samples per conversation; vLLM schedules the whole batch.

        A prompt that does not fit `context_length` (`fit_prompt`) is not sent (vLLM would
        refuse the whole batch): `BatchError` holds its `ContextOverflow` beside the others'
        samples; one near the end of the context generates less (`capped_max_new_tokens`)."""
        return self.generate_from_ids([prompt_ids(self.tokenizer, conv) for conv in conversations], params)

    def generate_from_ids(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Sample]]:
        """`generate` from prompts already tokenized (a multi-turn sequence continued token
        for token: engines.templating.continued_prompt_ids), never re-templated."""
        vllm = _import_vllm()
        self._wake()
        prompts = [[int(i) for i in p] for p in prompts]
        results: list[Any] = [None] * len(prompts)
        sent, budgets = [], []
        for i, p in enumerate(prompts):
            try:
                budgets.append(fit_prompt(len(p), params.max_new_tokens, self.context_length, self.spec))
                sent.append(i)
            except ContextOverflow as e:
                results[i] = e
        if sent:
            outputs = self.llm.generate(
                [{"prompt_token_ids": prompts[i]} for i in sent],
                [to_vllm_sampling(replace(params, max_new_tokens=b), vllm) for b in budgets],  # one per prompt
                lora_request=self.lora_request,
                use_tqdm=False,
            )
            for i, budget, out in zip(sent, budgets, outputs):
                samples = [self._to_sample(c, prompts[i], params) for c in sorted(out.outputs, key=lambda c: c.index)]
                if budget < params.max_new_tokens:
                    samples = [replace(s, capped_max_new_tokens=budget) for s in samples]
                results[i] = [samples[k % len(samples)] for k in range(params.n)]  # greedy: n copies
        if len(sent) < len(prompts):
            raise BatchError(results)
        return results

    def _to_sample(self, completion: Any, prompt: list[int], params: SamplingParams) -> Sample:
        """vLLM CompletionOutput -> Sample; ids cut so that decode(ids) == text."""
        raw_ids = list(completion.token_ids)
        raw_lps = [
            step[token].logprob if step and token in step else float("nan")
            for token, step in zip(raw_ids, completion.logprobs or [None] * len(raw_ids))
        ]
        ids, text, reason = cut_completion(self.tokenizer, raw_ids, params.stop, self.end_ids)
        # vLLM's own stop match also ends a completion even if our cut found none;
        # its stop_reason is the stop string (str), a stop token (int) or None (eos)
        if reason == "length" and completion.finish_reason == "stop":
            reason = "stop_string" if isinstance(getattr(completion, "stop_reason", None), str) else "stop"
        return Sample(
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(raw_lps[: len(ids)]) if completion.logprobs is not None else None,
            finish_reason=reason,
            prompt_token_ids=tuple(prompt),
        )

    def close(self) -> None:
        """Shut the engine down and free GPU memory (as far as vLLM allows in-process)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        del llm
        release_memory()
