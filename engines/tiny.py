"""Tiny offline models for tests and the CPU demo: nothing is downloaded.

    python -m engines.tiny --out DIR      # write tiny-llama/ and tiny-clip/ into DIR

- tiny-llama: a Llama-architecture causal LM (~2M parameters, random weights) with a
  byte-level BPE tokenizer trained here on local text and a Llama-3-style chat
  template. The model spec `tiny` resolves to it.
- tiny-clip: an open_clip CLIP (ViT + text transformer, random weights) with its
  config, loadable by `colbench` as `--clip-model tiny`.

`tiny_model_path()` / `tiny_clip_path()` build them once into the cache
($SWEET_CACHE, default ~/.cache/sweet-colbench) and reuse them; builds are atomic,
so parallel test workers never see a half-written model.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

VERSION = "v2"  # bump when the architecture or tokenizer recipe changes (v2: the corpus is frozen)
SEED = 1234

SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|pad|>",
]

# Llama-3 layout; the generation prompt opens an assistant header.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

LLAMA_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
VOCAB_SIZE = 4096

CLIP_CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


def cache_dir() -> Path:
    return Path(os.environ.get("SWEET_CACHE", Path.home() / ".cache" / "sweet-colbench"))


CORPUS = Path(__file__).parent / "tiny_corpus" / "cpython-3.11.7-stdlib.json.xz"
CORPUS_FILES = sorted(["textwrap.py", "string.py", "functools.py", "json/__init__.py", "collections/__init__.py",
                       "statistics.py", "fractions.py", "heapq.py", "bisect.py", "calendar.py", "difflib.py"])


def _corpus() -> list[str]:
    """Local training text for the tokenizer: eleven stdlib sources (code and English prose),
    frozen as CPython 3.11.7 ships them (PSF licence) in `CORPUS`, so the tokenizer, and with
    it the tiny model, is the same under every interpreter (patch releases change these files)."""
    import lzma

    files = json.loads(lzma.decompress(CORPUS.read_bytes()))
    texts = [files[name] for name in CORPUS_FILES]
    texts.append("I WANT TO ANSWER:\n```python\ndef f(x):\n    return x\n```\n" * 50)
    return texts


def build_tiny_llama(out: Path) -> Path:
    """Train the tokenizer, build the random-weight model, save both to `out`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|pad|>",
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.padding_side = "left"

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        **LLAMA_CONFIG,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    return out


def build_tiny_clip(out: Path) -> Path:
    """Write a random-weight open_clip model and its config to `out`."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "tiny-clip.json"
    cfg_path.write_text(json.dumps(CLIP_CONFIG, indent=2))
    open_clip.add_model_config(cfg_path)
    torch.manual_seed(SEED)
    import logging

    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # "no pretrained weights loaded": random weights are the point
    try:
        model = open_clip.create_model("tiny-clip", pretrained=None)
    finally:
        logging.getLogger().setLevel(quiet)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "open_clip_model.safetensors")
    return out


def build_once(dirname: str, builder) -> Path:
    """`cache_dir()/dirname`, made by `builder(tmp_folder)` once: the build goes to a temporary
    folder under a file lock and is renamed into place, so parallel processes build it once
    and never see a half-written folder."""
    final = cache_dir() / dirname
    name = dirname
    if (final / ".complete").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time across processes
        if (final / ".complete").exists():
            return final
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{name}-"))
        try:
            builder(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / ".complete").write_text("ok\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    return final


def _build_once(name: str, builder) -> Path:
    return build_once(f"{name}-{VERSION}", builder)


def tiny_model_path() -> Path:
    """Path of the tiny Llama (built on first use)."""
    return _build_once("tiny-llama", build_tiny_llama)


def tiny_clip_path() -> Path:
    """Path of the tiny CLIP folder (built on first use)."""
    return _build_once("tiny-clip", build_tiny_clip)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder to write into (default: the cache)")
    args = parser.parse_args(argv)
    if args.out is None:
        print(tiny_model_path())
        print(tiny_clip_path())
        return
    print(build_tiny_llama(args.out / "tiny-llama"))
    print(build_tiny_clip(args.out / "tiny-clip"))


if __name__ == "__main__":
    sys.exit(main())
