"""Tiny offline models for tests and the CPU demo: nothing is downloaded.

    python -m engines.tiny --out DIR      # write tiny-llama/, tiny-vl/ and tiny-clip/ into DIR

- tiny-llama: a Llama-architecture causal LM (~2M parameters, random weights) with a
  byte-level BPE tokenizer trained here on local text and a Llama-3-style chat
  template. The model spec `tiny` resolves to it.
- tiny-vl: a Qwen2-VL-architecture vision-language model (random weights, a small vision
  tower) with a Qwen2-VL processor: tiny-llama's tokenizer plus Qwen2-VL's vision special
  tokens, a chat template that places images, and Qwen2-VL's image processor at the
  published critic's screenshot size (at most 64x28x28 pixels). The spec `tiny-vl`
  resolves to it: the frontend's vision-language critic in tests.
- tiny-clip: an open_clip CLIP (ViT + text transformer, random weights) with its
  config, loadable by `colbench` as `--clip-model tiny`.

`tiny_model_path()` / `tiny_vl_path()` / `tiny_clip_path()` build them once into the cache
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

# Qwen2-VL's special tokens for images (the ones its processor and chat template use)
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# the published critic's processor: min_pixels 16x28x28, max_pixels 64x28x28
VL_MIN_PIXELS, VL_MAX_PIXELS = 16 * 28 * 28, 64 * 28 * 28
# tiny-llama's layout; a message's content may be a list of {"type": "text"|"image"} parts (Qwen2-VL's)
VL_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
VL_TEXT_CONFIG = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
VL_VISION_CONFIG = dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                        temporal_patch_size=2)

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


def build_tiny_vl(out: Path) -> Path:
    """A random-weight Qwen2-VL and its processor (tiny-llama's tokenizer + the vision
    tokens, Qwen2-VL's image processor) saved to `out`; loads with AutoProcessor and
    AutoModelForImageTextToText."""
    import torch
    from transformers import (AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tok.chat_template = VL_CHAT_TEMPLATE
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    image_processor = Qwen2VLImageProcessor(size={"shortest_edge": VL_MIN_PIXELS, "longest_edge": VL_MAX_PIXELS})
    processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok,
                                 video_processor=Qwen2VLVideoProcessor(), chat_template=VL_CHAT_TEMPLATE)
    torch.manual_seed(SEED)
    text = dict(VL_TEXT_CONFIG, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    config = Qwen2VLConfig(text_config=text, vision_config=dict(VL_VISION_CONFIG, hidden_size=text["hidden_size"]),
                           image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
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


def tiny_vl_path() -> Path:
    """Path of the tiny Qwen2-VL and its processor (built on first use)."""
    return _build_once("tiny-vl", build_tiny_vl)


def tiny_clip_path() -> Path:
    """Path of the tiny CLIP folder (built on first use)."""
    return _build_once("tiny-clip", build_tiny_clip)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder to write into (default: the cache)")
    args = parser.parse_args(argv)
    if args.out is None:
        print(tiny_model_path())
        print(tiny_vl_path())
        print(tiny_clip_path())
        return
    print(build_tiny_llama(args.out / "tiny-llama"))
    print(build_tiny_vl(args.out / "tiny-vl"))
    print(build_tiny_clip(args.out / "tiny-clip"))


if __name__ == "__main__":
    sys.exit(main())
