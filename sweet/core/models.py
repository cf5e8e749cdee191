"""Model and tokenizer loading (full weights or LoRA), the optimiser and its schedule,
seeding, and CPU float settings: what a trainer needs before its loop starts."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

from colbench.cli import UserError
from engines import model_path
from sweet.core.config import ModelConfig, TrainConfig

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def resolve_model_path(spec: str) -> str:
    """'tiny' / 'hf:<x>' / bare path or hub id -> what from_pretrained takes (engines.model_path).
    A local folder must hold a model (config.json and weights, or a PEFT adapter): checked
    here, before any work, so a wrong --model fails at once with one line; a spec that is
    clearly a local path (./x, ../x, /x, ~/x, or more than one '/') must exist."""

    path = model_path(spec)
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise UserError(f"model {spec!r}: {local} is a file, not a model folder")
        has_config = (local / "config.json").is_file() or (local / "adapter_config.json").is_file()
        has_weights = any(next(local.glob(pattern), None) is not None for pattern in WEIGHT_FILES)
        if not has_config or not has_weights:
            missing = " and ".join(w for w, ok in (("config.json", has_config), ("weights (*.safetensors / *.bin)",
                                                                                  has_weights)) if not ok)
            raise UserError(f"model {spec!r}: {local} is not a model folder (no {missing}); a killed save leaves "
                            "no weights: point --model at a finished run's final/")
        return str(local)
    if path.startswith(("./", "../", "/", "~")) or path.count("/") > 1:
        raise UserError(f"model {spec!r}: no such folder {local}")
    return path  # a hub id (org/name): from_pretrained reports what it cannot find


def torch_dtype(name: str):
    """The torch dtype of `name`; "auto" by the engines' rule (engines.base.resolve_dtype)."""
    import torch

    from engines.base import resolve_dtype

    return getattr(torch, resolve_dtype(name))


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(spec)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise ValueError(f"cannot load tokenizer for model {spec!r} ({path}): {str(e).splitlines()[0]}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def is_vision_model(spec: str) -> bool:
    """Whether `spec` names a vision-language model (its config has a `vision_config`:
    Qwen2-VL, `tiny-vl`); False for text models and for hub ids not available here."""
    from transformers import AutoConfig

    path = resolve_model_path(spec)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return False
    return getattr(config, "vision_config", None) is not None


def load_model(cfg: ModelConfig, *, trainable: bool = True, adapter: str | None = None):
    """Causal LM for training (optionally wrapped with fresh LoRA adapters) or frozen; a
    vision-language model (`is_vision_model`) loads as an image-text-to-text LM, its LM head
    and decoder read the same way. A frozen one (a reference model, a LoRA merge) is loaded
    whole in this process even once a ZeRO-3 trainer exists: it never gets an engine to
    gather partitioned weights."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    path = resolve_model_path(cfg.model)
    auto = AutoModelForImageTextToText if is_vision_model(cfg.model) else AutoModelForCausalLM
    try:
        with contextlib.nullcontext() if trainable else _without_zero3_init():
            model = auto.from_pretrained(path, dtype=torch_dtype(cfg.dtype))
    except OSError as e:
        raise ValueError(f"cannot load model {cfg.model!r} ({path}): {str(e).splitlines()[0]}") from None
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
    elif trainable and cfg.lora:
        model = with_lora(model, cfg)
    if trainable and cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if not trainable:
        model.eval().requires_grad_(False)
    return model


def with_lora(model, cfg: ModelConfig):
    """`model` wrapped with fresh LoRA adapters of `cfg` (PEFT; the base frozen)."""
    from peft import LoraConfig, get_peft_model

    targets = cfg.lora_target_modules
    return get_peft_model(
        model,
        LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=targets if targets == "all-linear" else targets.split(","),
            task_type="CAUSAL_LM",
        ),
    )


@contextlib.contextmanager
def _without_zero3_init():
    """Switch off transformers' ZeRO-3 integration inside the block: once accelerate has set up
    ZeRO-3 (its DeepSpeed config registered with transformers), `from_pretrained` would
    partition every model it loads across the processes (deepspeed.zero.Init)."""
    from transformers.integrations import deepspeed as hf_deepspeed

    held = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = held


def set_seed(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model, train: TrainConfig, total_steps: int, optimizer=None):
    """AdamW over the trainable parameters (or the given `optimizer`) and a linear
    warm-up/decay schedule over `total_steps`."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    opt = optimizer
    if opt is None:
        params = [p for p in model.parameters() if p.requires_grad]
        # fused: one kernel over all tensors, as transformers' Trainer (so TRL) does by default;
        # on CPU the default per-tensor loop was a third of a small model's step
        # (bench/trainer_vs_trl.py). Same update up to rounding.
        fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)
        opt = torch.optim.AdamW(params, lr=train.learning_rate, betas=(train.adam_beta1, train.adam_beta2),
                                eps=train.adam_epsilon, weight_decay=train.weight_decay, fused=fused or None)
    warmup = int(train.warmup_ratio * total_steps)
    return opt, get_linear_schedule_with_warmup(opt, warmup, max(total_steps, 1))
