"""What every trainer here shares besides the loop: configs, model loading (full or
LoRA), the optimiser and its schedule, and metric logging.

The loop itself (accelerate, micro-batches, checkpoints, resume, the final save) is
sweet/trainer.py; each algorithm module (critic, sweet_dpo, rft, mtdpo, loop) is a loss
hook and its data on top of it.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Sequence


@dataclass
class ModelConfig:
    """Which model to train and how."""

    model: str = field(default="tiny", metadata={"help": "model spec: 'tiny', 'hf:<path or hub id>' or a plain path/hub id"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters (PEFT) instead of all weights"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "comma list of module names, or 'all-linear'"})
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPUs that support it, else fp32), float32, bfloat16"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "trade compute for memory"})
    max_length: int = field(default=4096, metadata={"help": "max tokens of context + action; contexts are cut in the middle"})
    keep_head: int = field(default=512, metadata={"help": "tokens at the start of a context that truncation keeps"})

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"ModelConfig.dtype must be auto/float32/bfloat16/float16, got {self.dtype!r}")
        if self.max_length < 16:
            raise ValueError(f"ModelConfig.max_length must be >= 16, got {self.max_length}")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping common to all trainers."""

    output_dir: str = field(default="runs/train", metadata={"help": "checkpoints, metrics and the resolved config go here"})
    learning_rate: float = field(default=1e-5, metadata={"help": "peak learning rate (AdamW)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    num_epochs: int = field(default=1, metadata={"help": "passes over the training data"})
    batch_size: int = field(default=8, metadata={"help": "examples per optimiser step across all processes"})
    micro_batch_size: int = field(default=2, metadata={"help": "examples per forward pass per process"})
    warmup_ratio: float = field(default=0.0, metadata={"help": "linear warm-up share of the steps"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    logging_steps: int = field(default=1, metadata={"help": "log every N optimiser steps"})
    report_to: str = field(default="tensorboard", metadata={"help": "comma list: tensorboard, wandb, none"})
    resume: bool = field(default=True, metadata={"help": "resume from the last checkpoint in output_dir"})

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ValueError(f"TrainConfig.learning_rate must be > 0, got {self.learning_rate}")
        if self.batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("TrainConfig.batch_size and micro_batch_size must be >= 1")


def parse_configs(types: Sequence[type], argv: list[str] | None = None, description: str | None = None):
    """Parse dataclass configs from the CLI in the project's one dialect (colbench.cli:
    `--config run.yaml` defaults that flags override, `--output_dir`/`--output-dir`).
    Returns one instance per type; a bad config file exits with its error."""
    from colbench.cli import ConfigError
    from colbench.cli import parse_configs as parse

    try:
        configs = parse(types, argv, description=description)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    flush_denormals()  # every entry point parses first, before a torch op starts the CPU thread pool
    return configs


def resolve_model_path(spec: str) -> str:
    """'tiny' / 'hf:<x>' / bare path or hub id -> what from_pretrained takes (engines.model_path)."""
    from engines import model_path

    return model_path(spec)


def torch_dtype(name: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, name)


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


def load_model(cfg: ModelConfig, *, trainable: bool = True, adapter: str | None = None):
    """Causal LM for training (optionally wrapped with fresh LoRA adapters) or frozen."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(cfg.model)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(cfg.dtype))
    except OSError as e:
        raise ValueError(f"cannot load model {cfg.model!r} ({path}): {str(e).splitlines()[0]}") from None
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
    elif trainable and cfg.lora:
        from peft import LoraConfig, get_peft_model

        targets = cfg.lora_target_modules
        model = get_peft_model(
            model,
            LoraConfig(
                r=cfg.lora_r,
                lora_alpha=cfg.lora_alpha,
                lora_dropout=cfg.lora_dropout,
                target_modules=targets if targets == "all-linear" else targets.split(","),
                task_type="CAUSAL_LM",
            ),
        )
    if trainable and cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if not trainable:
        model.eval().requires_grad_(False)
    return model


def flush_denormals() -> None:
    """Treat denormal floats as zero on CPU. A saturated loss drives gradients and Adam's
    moments into the denormal range, where x86 arithmetic is many times slower: the
    test bed's sum-critic (`--length_normalize false`, Bradley-Terry margins near 50) took
    3-5 s per step instead of 0.8 for a dozen steps, the same run 166 s instead of 120,
    with bitwise-identical final weights once flushed. x86 keeps the flag per thread and a
    new thread inherits its creator's, so a process sets it before its first torch op
    starts the CPU thread pool: `parse_configs` (every sweet entry point's first step)
    and bench/learning.py do. No effect on GPUs."""
    import torch

    torch.set_flush_denormal(True)  # False (and no effect) where the CPU cannot


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
        opt = torch.optim.AdamW(params, lr=train.learning_rate, weight_decay=train.weight_decay, fused=fused or None)
    warmup = int(train.warmup_ratio * total_steps)
    return opt, get_linear_schedule_with_warmup(opt, warmup, max(total_steps, 1))


def to_jsonable(obj: Any) -> Any:
    if is_dataclass(obj):
        return {k: to_jsonable(v) for k, v in asdict(obj).items()}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


def save_resolved_config(output_dir: str | Path, **configs: Any) -> None:
    """Write every config beside the outputs, with the command line."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {name: to_jsonable(c) for name, c in configs.items()}
    data["argv"] = sys.argv
    (out / "config.json").write_text(json.dumps(data, indent=2))


class MetricsLogger:
    """Namespaced metrics to metrics.jsonl, TensorBoard and (optionally) W&B; main process only."""

    def __init__(self, output_dir: str | Path, report_to: str = "tensorboard", is_main: bool = True, run_config: dict | None = None):
        self.is_main = is_main
        self.path = Path(output_dir) / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if not is_main:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        targets = {t.strip() for t in report_to.split(",") if t.strip()}
        if "tensorboard" in targets:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
        if "wandb" in targets:
            import wandb

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "sweet-colbench"), config=run_config or {})

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.is_main:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
