"""The configs every trainer shares (model, optimisation), the one parser entry for
sweet's CLIs, and the resolved config written beside every output.

Model loading, the optimiser and seeding are sweet/core/models.py; the loop itself
(accelerate, micro-batches, checkpoints, resume, the final save) is sweet/core/trainer.py.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

from colbench.cli import FieldError
from colbench.cli import parse_configs as parse
from colbench.envs import PAIRING_RULES, defaults_help, training_defaults
from colbench.io import atomic_write


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
        check_range(self, "max_length", low=16)
        check_range(self, "keep_head", low=0)
        check_range(self, "lora_r", low=1)
        check_range(self, "lora_alpha", low=0, strict=True)
        check_range(self, "lora_dropout", low=0, high=1, strict_high=True)


@dataclass(frozen=True)
class LearningRates:
    """A trainer's default peak learning rate for full fine-tuning and for LoRA, and where
    each comes from. LoRA adapters need a larger rate than full fine-tuning: ~10x the full
    rate is the usual rule (Schulman et al. 2025, "LoRA Without Regret", Thinking Machines
    Lab: the best LoRA rate was ~10x the best full fine-tuning rate across their runs)."""

    full: float
    lora: float
    source: str

    def help(self) -> str:
        return (f"peak learning rate (AdamW); default {self.full:g} for full fine-tuning, {self.lora:g} with --lora "
                f"({self.source}); the resolved value is saved in config.json")


def lr_field(rates: LearningRates):
    """The `learning_rate` field of a TrainConfig whose defaults are `rates` (None until
    resolve_learning_rate picks the full or the LoRA one)."""
    return field(default=None, metadata={"help": rates.help()})


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping common to all trainers. `learning_rate` None = the
    class's LEARNING_RATES for the model's --lora (resolve_learning_rate)."""

    LEARNING_RATES: ClassVar[LearningRates] = LearningRates(
        1e-5, 1e-4, "no paper: a common fine-tuning rate, LoRA 10x by the usual rule")

    output_dir: str = field(default="runs/train", metadata={"help": "checkpoints, metrics and the resolved config go here"})
    learning_rate: float | None = lr_field(LEARNING_RATES)
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW β1 (torch's default)"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW β2 (torch's default)"})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW ε, added to √v (torch's default)"})
    num_epochs: int = field(default=1, metadata={"help": "passes over the training data"})
    batch_size: int = field(default=8, metadata={"help": "examples per optimiser step across all processes"})
    micro_batch_size: int = field(default=2, metadata={"help": "examples per forward pass per process"})
    warmup_ratio: float = field(default=0.0, metadata={"help": "linear warm-up share of the steps"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    logging_steps: int = field(default=1, metadata={"help": "log every N optimiser steps"})
    report_to: str = field(default="tensorboard", metadata={"help": "comma list of accelerate trackers: tensorboard "
                                                                    "(output_dir/tensorboard), wandb, trackio; or none"})
    resume: bool = field(default=True, metadata={"help": "resume from the last checkpoint in output_dir"})
    snapshot_steps: int = field(default=0, metadata={"help": "every N optimiser steps (LOOP: iterations) and at the end, "
                                                             "a model-only snapshot output_dir/path/step-<N>/ (HF "
                                                             "format, no optimiser), kept, never rotated (0: none)"})

    def __post_init__(self) -> None:
        check_range(self, "learning_rate", low=0, strict=True)
        check_range(self, "snapshot_steps", low=0)
        for name in ("num_epochs", "batch_size", "micro_batch_size", "logging_steps"):
            check_range(self, name, low=1)
        check_range(self, "weight_decay", low=0)
        check_range(self, "adam_beta1", low=0, high=1, strict_high=True)
        check_range(self, "adam_beta2", low=0, high=1, strict_high=True)
        check_range(self, "adam_epsilon", low=0, strict=True)
        check_range(self, "warmup_ratio", low=0, high=1, strict_high=True)
        check_range(self, "max_grad_norm", low=0, strict=True)


def check_range(cfg: Any, name: str, *, low: float | None = None, high: float | None = None, strict: bool = False,
                strict_high: bool = False) -> None:
    """Refuse `cfg.<name>` unless it is a finite number in [low, high] (`strict`: low
    excluded, `strict_high`: high excluded), naming the field and the value. A value of
    None (an optional field left unset) passes."""
    value = getattr(cfg, name)
    if value is None:
        return
    where = f"{type(cfg).__name__}.{name}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    if low is not None and (value <= low if strict else value < low):
        raise ValueError(f"{where} must be {'>' if strict else '>='} {low:g}, got {value!r}")
    if high is not None and (value >= high if strict_high else value > high):
        raise ValueError(f"{where} must be {'<' if strict_high else '<='} {high:g}, got {value!r}")


def check_action_room(cfg: Any, name: str, model: ModelConfig) -> None:
    """Refuse a trainer's own sampling length `cfg.<name>` (max_new_tokens) that could write an
    action with no room in `model.max_length` (sweet.core.tokens.fits: actions are never cut),
    naming both fields: the trainer would otherwise meet it at a step, not here."""
    from sweet.core.tokens import fits

    value = getattr(cfg, name)
    if not fits(value, model.max_length):  # an action is at most max_new_tokens ids (eos included)
        raise FieldError(f"{type(cfg).__name__}.{name} must be < {type(model).__name__}.max_length "
                         f"({model.max_length}: an action is never cut and needs a context token before it), "
                         f"got {value}")


def check_choice(cfg: Any, name: str, choices: Sequence[Any]) -> None:
    """Refuse `cfg.<name>` unless it is one of `choices`, naming the field, the choices and the value."""
    value = getattr(cfg, name)
    if value not in choices:
        raise ValueError(f"{type(cfg).__name__}.{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def parse_configs(types: Sequence[type], argv: list[str] | None = None, description: str | None = None):
    """Parse dataclass configs from the CLI in the project's one dialect (colbench.cli:
    `--config run.yaml` defaults that flags override, `--output_dir`/`--output-dir`).
    Returns one instance per type; a bad flag, config file or value raises a UserError
    naming it (sweet.core.runs.run_cli prints it as one line)."""

    configs = parse(types, argv, description=description)
    flush_denormals()  # every entry point parses first, before a torch op starts the CPU thread pool
    resolve_defaults(configs)
    return configs


def resolve_learning_rate(model: ModelConfig, train: TrainConfig) -> float:
    """Fill `train.learning_rate` left None with its class's full or LoRA default (by
    `model.lora`); returns it. Runs after parsing (parse_configs), and again in the
    Trainer and save_resolved_config for configs built in code: a no-op once set."""
    if train.learning_rate is None:
        rates = type(train).LEARNING_RATES
        train.learning_rate = rates.lora if model.lora else rates.full
    return train.learning_rate


def resolve_defaults(configs: Sequence[Any]) -> None:
    """The defaults that depend on more than one config (today: the learning rate, on
    ModelConfig.lora), resolved once all are parsed."""
    models = [c for c in configs if isinstance(c, ModelConfig)]
    for train in (c for c in configs if isinstance(c, TrainConfig)):
        if models:
            resolve_learning_rate(models[0], train)


def fill_env_defaults(cfg: Any, **fields: str) -> None:
    """Fill each of `cfg`'s `fields` left None with its environment's training default
    (`colbench.envs.training_defaults(cfg.env)`): `field="defaults_attribute"`. The one
    place every algorithm resolves them (frontend: CLIP rewards have no success)."""

    defaults = training_defaults(cfg.env)
    for name, attribute in fields.items():
        if getattr(cfg, name) is None:
            setattr(cfg, name, getattr(defaults, attribute))


def pairing_rule_field():
    """The `pairing_rule` field of a config that makes trajectory pairs (None: the --env's,
    colbench.envs.base.TrainingDefaults; filled by fill_env_defaults, checked by check_pairing_rule)."""
    return field(default=None, metadata={
        "help": "trajectory pairs of a task: best (the best episode against each worse one: the paper, the published "
                "backend script) or all (every two episodes at least --min_reward_gap apart, the higher chosen: the "
                f"published frontend script) (default: the --env's: {defaults_help('pairing_rule')})"})


def check_pairing_rule(cfg: Any) -> None:
    """Refuse a `pairing_rule` that is not one of PAIRING_RULES, naming the field."""
    if cfg.pairing_rule not in PAIRING_RULES:
        raise ValueError(f"{type(cfg).__name__}.pairing_rule must be one of {PAIRING_RULES}, got {cfg.pairing_rule!r}")


def flush_denormals() -> None:
    """Treat denormal floats as zero on CPU. A saturated loss drives gradients and Adam's
    moments into the denormal range, where x86 arithmetic is many times slower: the
    test bed's sum-critic (`--length_normalize false`, Bradley-Terry margins near 50) took
    3-5 s per step instead of 0.8 for a dozen steps, the same run 166 s instead of 120,
    with bitwise-identical final weights once flushed. x86 keeps the flag per thread and a
    new thread inherits its creator's, so a process sets it before its first torch op
    starts the CPU thread pool: `parse_configs` (every sweet entry point's first step)
    and testbed/learning.py do. No effect on GPUs."""
    import torch

    torch.set_flush_denormal(True)  # False (and no effect) where the CPU cannot


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


def resolved_config(**configs: Any) -> dict[str, Any]:
    """The configs, their cross-config defaults resolved, as plain data (what config.json
    and the trackers' hparams hold)."""
    resolve_defaults(list(configs.values()))
    return {name: to_jsonable(c) for name, c in configs.items()}


PATH_FIELDS = ("model", "episodes", "eval_episodes", "tasks", "critic", "reuse_candidates", "agent_prompt",
               "human_prompt", "critic_context_prompt")
# config fields that choose a prompt template file (colbench.prompts; None or "": our shipped file)
PROMPT_FIELDS = ("agent_prompt", "human_prompt", "critic_context_prompt")


def strict_tasks_field():
    """The `strict_tasks` field of a trainer config: unusable task rows (colbench.tasks) stop
    the run, or are skipped with one warning (the default)."""
    return field(default=False, metadata={
        "help": "stop on any unusable task row or trajectory (bad JSON, missing field, reference that fails "
                "validation), naming each; default: skip them with one warning naming how many and the list"})


def agent_prompt_field(collects: bool = False):
    """The `agent_prompt` field of a trainer config (docs/prompts.md). `collects`: the trainer
    builds agent prompts with it (LOOP, --rounds); otherwise it checks the recorded prompts
    of its episodes against it."""
    use = ("the new episodes' agent prompts are built with it" if collects else
           "the episodes' recorded prompts must have been built with it (each episode's meta.prompts.agent sha256; "
           "episodes without a record count as our default), else a one-line refusal")
    return field(default=None, metadata={"help": "the agent's prompt template file (default: ours, "
                                                 f"colbench/envs/prompts/<env>_agent.txt; none for testbed): {use}"})


def human_prompt_field():
    """The `human_prompt` field of a config that collects episodes with a model simulator."""
    return field(default=None, metadata={"help": "a model simulator's prompt template file (default: ours, "
                                                 "simulators/prompts/; placeholders in docs/prompts.md); scripted "
                                                 "simulators read none"})


def max_reply_chars_field():
    """The `max_reply_chars` field of a config that builds a simulated human (None: the env's)."""
    return field(default=None, metadata={
        "help": "the simulated human's reply cap in characters (default: the env's, as published: frontend 1000, "
                "backend 400; colbench.envs.reply_cap)"})


def prompt_kind(name: str, env: str | None, simulator: str | None = None) -> str | None:
    """The colbench.prompts kind a PROMPT_FIELDS field chooses for `env` (None: nothing reads it)."""
    from colbench.prompts import agent_kind, human_kind

    if name == "critic_context_prompt":
        return "critic_context"
    if name == "agent_prompt":
        return agent_kind(env or "")
    return human_kind(env or "", simulator)


def prompt_files(configs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`section.field` -> {"kind", "path", "sha256", "default"} of every prompt file the
    configs' PROMPT_FIELDS choose, our default included (the env comes from the config that
    names it, else from any other section: --rounds' simulator runs in stage 2's env).
    What config.json's "prompts" and the fingerprint record. A bad file raises PromptError."""
    from colbench.prompts import load_prompt

    envs = [getattr(c, "env") for c in configs.values() if isinstance(getattr(c, "env", None), str)]
    out: dict[str, dict[str, Any]] = {}
    for section, cfg in configs.items():
        for name in PROMPT_FIELDS:
            if not hasattr(cfg, name):
                continue
            env = getattr(cfg, "env", None) or (envs[0] if envs else None)
            kind = prompt_kind(name, env, getattr(cfg, "simulator", None))
            if kind is not None:
                tpl = load_prompt(kind, getattr(cfg, name) or None)
                out[f"{section}.{name}"] = {**tpl.record(), "default": tpl.is_default and not getattr(cfg, name)}
    return out


def resolve_local(value: str) -> str:
    """A spec or comma list with each local file/folder made absolute (`hf:<path>` too);
    hub ids, `tiny`, `builtin:`/`hf:<hub id>` and the like stay as they are."""
    def one(part: str) -> str:
        prefix, rest = ("hf:", part[3:]) if part.startswith("hf:") else ("", part)
        return prefix + os.path.abspath(rest) if rest and Path(rest).exists() else part

    return ",".join(one(p.strip()) for p in value.split(",")) if value else value


def resolved_paths(data: Any) -> Any:
    """`to_jsonable` output with every PATH_FIELDS value made absolute where local, so a
    saved config still names the same files when read from another folder."""
    if isinstance(data, dict):
        return {k: resolve_local(v) if k in PATH_FIELDS and isinstance(v, str) else resolved_paths(v)
                for k, v in data.items()}
    return data


def save_resolved_config(output_dir: str | Path, **configs: Any) -> dict[str, Any]:
    """Write every config beside the outputs (config.json, with the command line; local
    model/data paths absolute; "prompts": every prompt template file the run uses, path and
    sha256, `prompt_files`) and return the configs as plain data: the run config every
    trainer hands its trackers."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {name: resolved_paths(c) for name, c in resolved_config(**configs).items()}
    prompts = prompt_files(configs)  # the template files in use, path + sha256 (defaults too)
    atomic_write(out / "config.json", json.dumps({**data, "prompts": prompts, "argv": sys.argv}, indent=2))
    return data
