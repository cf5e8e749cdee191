"""vLLM offline backend (GPU): `vllm.LLM` in this process.

    pip install '.[vllm]'            # on a CUDA machine, in an environment made for vLLM
    engine = load_engine("vllm:meta-llama/Llama-3.1-8B-Instruct",
                         EngineOptions(tensor_parallel_size=2, enable_lora=True))

Prompts are templated and tokenised here (`engines.templating.prompt_ids`) and passed
as token prompts, so `Sample.prompt_token_ids` is exactly what the model saw and a
trainer can rebuild it. Sampling asks for `logprobs=0`: vLLM then returns the
log-prob of each sampled token, computed from the raw logits (vLLM's default
`logprobs_mode="raw_logprobs"`), the convention of `engines.base`.

LOOP support:
- `load_lora(path)`: generate with a LoRA adapter from now on (needs `enable_lora`);
  each call registers a new adapter id, so reloading a path after training works.
- `update_weights(named_tensors)`: load full weights into the running model, best
  effort across vLLM versions (see its docstring).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

from engines.base import Conversation, EngineError, EngineOptions, Sample, SamplingParams
from engines.templating import cut_completion, end_token_ids, prompt_ids

NOT_INSTALLED = "vLLM is not installed: pip install '.[vllm]' on a CUDA machine"


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise EngineError(NOT_INSTALLED) from e
    return vllm


class VLLMEngine:
    """Chat generation with vLLM's offline `LLM` engine."""

    def __init__(self, model: str, options: EngineOptions | None = None, *, spec: str | None = None) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer, GenerationConfig

        self.options = options or EngineOptions()
        self.spec = spec or f"vllm:{model}"
        self.model_name = model
        kwargs: dict[str, Any] = dict(
            model=model,
            tensor_parallel_size=self.options.tensor_parallel_size,
            gpu_memory_utilization=self.options.gpu_memory_utilization,
            dtype=self.options.dtype,
            enable_lora=self.options.enable_lora or bool(self.options.lora_path),
        )
        if self.options.max_model_len is not None:
            kwargs["max_model_len"] = self.options.max_model_len
        kwargs.update(self.options.extra.get("vllm_kwargs", {}))  # e.g. max_lora_rank, enforce_eager
        self.llm = vllm.LLM(**kwargs)
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

        Every call gets a fresh adapter id, so vLLM reloads the files even when the
        path is reused (LOOP saves each iteration's adapter to the same folder).
        """
        if not (self.options.enable_lora or self.options.lora_path):
            raise EngineError(f"{self.spec}: load_lora needs EngineOptions(enable_lora=True) at start-up")
        from vllm.lora.request import LoRARequest

        lora_id = next(self._lora_ids)
        self.lora_request = LoRARequest(f"adapter-{lora_id}", lora_id, str(path))

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy full model weights (HF parameter names) into the running engine.

        Best effort: uses `LLM.apply_model` (vLLM >= 0.9), which calls the model's
        `load_weights` in every worker, then drops the prefix cache so no stale KV
        entries are reused. With tensor parallelism the tensors are pickled to each
        worker; for large models prefer LoRA (`load_lora`) or a restart. vLLM's V1
        engine with worker processes only ships functions to them when
        VLLM_ALLOW_INSECURE_SERIALIZATION=1 is set.
        """
        weights = [(name, tensor.detach().cpu()) for name, tensor in named_tensors]
        if not hasattr(self.llm, "apply_model"):
            raise EngineError(f"{self.spec}: this vLLM version has no LLM.apply_model; reload the engine instead")
        self.llm.apply_model(lambda model: model.load_weights(weights))
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams) -> list[list[Sample]]:
        """Return `params.n` samples per conversation; vLLM schedules the whole batch."""
        vllm = _import_vllm()
        prompts = [prompt_ids(self.tokenizer, conv) for conv in conversations]
        sampling = vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=0,  # the sampled token's log-prob only
        )
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            sampling,
            lora_request=self.lora_request,
            use_tqdm=False,
        )
        return [
            [self._to_sample(c, prompt, params) for c in sorted(out.outputs, key=lambda c: c.index)]
            for out, prompt in zip(outputs, prompts)
        ]

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
        import gc

        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
