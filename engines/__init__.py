"""Inference engines shared by agents, simulated humans and trainers.

Model spec strings (used by every CLI):

    tiny                          the project's tiny offline Llama (built once, cached)
    hf:<path or hub id>           transformers, CPU or GPU, batched with left padding
    vllm:<path or hub id>         vLLM offline engine (GPU; `pip install .[vllm]`)
    openai:<model>@<base_url>     any OpenAI-compatible server (vLLM serve, OpenAI, ...)
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import (
    Conversation,
    Engine,
    EngineError,
    EngineOptions,
    Message,
    Sample,
    SamplingParams,
    SpecError,
)

__all__ = [
    "Conversation",
    "Engine",
    "EngineError",
    "EngineOptions",
    "Message",
    "ModelSpec",
    "Sample",
    "SamplingParams",
    "SpecError",
    "load_engine",
    "parse_spec",
]

SPEC_HELP = "expected 'tiny', 'hf:<path or hub id>', 'vllm:<path or hub id>' or 'openai:<model>@<base_url>'"


@dataclass(frozen=True)
class ModelSpec:
    backend: str  # "hf" | "vllm" | "openai"
    model: str  # path, hub id, or served model name
    base_url: str | None = None  # openai only


def parse_spec(spec: str) -> ModelSpec:
    """Parse a model spec string; raise SpecError with one clear line if malformed."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty model spec: {SPEC_HELP}")
    spec = spec.strip()
    if spec == "tiny":
        from engines.tiny import tiny_model_path

        return ModelSpec("hf", str(tiny_model_path()))
    backend, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise SpecError(f"bad model spec {spec!r}: {SPEC_HELP}")
    if backend in ("hf", "vllm"):
        if rest == "tiny":
            from engines.tiny import tiny_model_path

            rest = str(tiny_model_path())
        return ModelSpec(backend, rest)
    if backend == "openai":
        model, at, url = rest.rpartition("@")
        if not at or not model or not url.startswith(("http://", "https://")):
            raise SpecError(f"bad model spec {spec!r}: expected 'openai:<model>@<http(s)://host:port/v1>'")
        return ModelSpec("openai", model, url)
    raise SpecError(f"unknown backend {backend!r} in model spec {spec!r}: {SPEC_HELP}")


def load_engine(spec: str, options: EngineOptions | None = None) -> Engine:
    """Build the engine a spec string names (imports the backend lazily)."""
    parsed = parse_spec(spec)
    options = options or EngineOptions()
    if parsed.backend == "hf":
        from engines.hf import HFEngine

        return HFEngine(parsed.model, options, spec=spec)
    if parsed.backend == "vllm":
        from engines.vllm_engine import VLLMEngine

        return VLLMEngine(parsed.model, options, spec=spec)
    from engines.openai_engine import OpenAIEngine

    return OpenAIEngine(parsed.model, parsed.base_url, options, spec=spec)
