"""Inference engines shared by agents, simulated humans and trainers.

Model spec strings (used by every CLI; parsed in `engines.specs`):

    tiny                                the project's tiny offline Llama (built once, cached)
    hf:<path or hub id>                 transformers, CPU or GPU, batched with left padding
    vllm:<path or hub id>               vLLM offline engine (GPU: `pip install .[vllm]`; CPU: .venv-vllm)
    openai:<model>@<url>[,<url2>...]    OpenAI-compatible server(s) (vLLM serve, OpenAI, ...);
                                        several URLs spread requests over replicas
    <path or hub id>                    bare: the same as hf:<path or hub id>
"""

from __future__ import annotations

from engines.base import (
    BatchError,
    Conversation,
    Engine,
    EngineError,
    EngineOptions,
    Message,
    Sample,
    SamplingParams,
    ServerOptions,
    SpecError,
)
from engines.specs import SPEC_HELP, ModelSpec, check_spec, model_path, parse_spec

__all__ = [
    "BatchError",
    "Conversation",
    "Engine",
    "EngineError",
    "EngineOptions",
    "Message",
    "ModelSpec",
    "SPEC_HELP",
    "Sample",
    "SamplingParams",
    "ServerOptions",
    "SpecError",
    "check_spec",
    "load_engine",
    "model_path",
    "parse_spec",
]


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

    return OpenAIEngine(parsed.model, list(parsed.base_urls), options, spec=spec)
