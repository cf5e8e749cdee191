"""Config values that make no sense are refused in __post_init__, before any work, each
error naming the config, the field and the value (sweet/core/config.py: check_range)."""

from __future__ import annotations

import pytest

from colbench.cli import parse_configs
from sweet.core.config import ModelConfig, TrainConfig


@pytest.mark.parametrize("field,value", [("logging_steps", 0), ("num_epochs", 0), ("learning_rate", float("nan")),
                                         ("learning_rate", -1.0), ("batch_size", 0), ("micro_batch_size", 0),
                                         ("warmup_ratio", 1.0), ("max_grad_norm", 0.0), ("weight_decay", -0.1),
                                         ("adam_beta1", 1.0), ("adam_beta2", -0.5), ("adam_epsilon", 0.0)])
def test_senseless_train_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"TrainConfig.{field} must be .*got {value}"):
        TrainConfig(**{field: value})


def test_the_adam_settings_reach_the_optimiser():
    """--adam_beta1/--adam_beta2/--adam_epsilon are the AdamW that every trainer steps with."""
    import torch

    from sweet.core.models import make_optimizer

    model = torch.nn.Linear(3, 2)
    train = TrainConfig(learning_rate=1e-3, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-5, weight_decay=0.1)
    opt, _ = make_optimizer(model, train, total_steps=4)
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.AdamW)
    assert (group["betas"], group["eps"], group["weight_decay"], group["lr"]) == ((0.8, 0.95), 1e-5, 0.1, 1e-3)
    (cfg,) = parse_configs([TrainConfig], ["--adam_beta2", "0.95", "--adam_epsilon", "1e-6"])
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon) == (0.9, 0.95, 1e-6)


@pytest.mark.parametrize("field,value", [("lora_r", 0), ("lora_dropout", 1.0), ("keep_head", -1), ("max_length", 8)])
def test_senseless_model_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"ModelConfig.{field} must be .*got {value}"):
        ModelConfig(**{field: value})


def _algorithm_cases():
    from sweet.algorithms.loop import LoopConfig
    from sweet.algorithms.mtdpo import MTDPOConfig
    from sweet.algorithms.rft import RFTConfig
    from sweet.algorithms.sweet_rl import CandidateConfig, SweetConfig
    from sweet.critic.train import CriticConfig

    nan, inf = float("nan"), float("inf")
    return [(RFTConfig, {"episodes": "e.jsonl", "success_threshold": nan}, "success_threshold", "nan"),
            (MTDPOConfig, {"episodes": "e.jsonl", "beta": nan}, "beta", "nan"),
            (CriticConfig, {"beta": inf}, "beta", "inf"),
            (SweetConfig, {"episodes": "e", "tasks": "t", "nll_coef": nan}, "nll_coef", "nan"),
            (SweetConfig, {"episodes": "e", "tasks": "t", "max_episodes": 0}, "max_episodes", "0"),
            (CandidateConfig, {"top_p": 0.0}, "top_p", "0.0"),
            (LoopConfig, {"iterations": 0}, "iterations", "0"),
            (LoopConfig, {"ppo_epochs": 0}, "ppo_epochs", "0"),
            (LoopConfig, {"max_logprob_gap": 0.0}, "max_logprob_gap", "0.0")]


@pytest.mark.parametrize("case", range(9))
def test_senseless_algorithm_values_are_refused_naming_the_field(case):
    cls, kwargs, name, shown = _algorithm_cases()[case]
    with pytest.raises(ValueError, match=rf"{cls.__name__}.{name} must be .*got {shown}"):
        cls(**kwargs)


# ---- one name per sample count, the earlier names kept as aliases (docs/README.md) ------------


@pytest.mark.parametrize("module, config, field_name, canonical, alias", [
    ("colbench.evaluate", "EvalConfig", "episodes_per_task", "--episodes_per_task", "--seeds"),
    ("sweet.algorithms.loop", "LoopConfig", "episodes_per_task", "--episodes_per_task", "--k"),
    ("sweet.workflows.rounds", "RoundsConfig", "episodes_per_task", "--episodes_per_task", "--rollouts_per_task"),
    ("sweet.algorithms.sweet_candidates", "CandidateConfig", "candidates_per_state", "--candidates_per_state",
     "--num_candidates"),
    ("sweet.critic.train", "CriticConfig", "baseline_samples_per_state", "--baseline_samples_per_state",
     "--baseline_samples"),
    ("testbed.demo", "DemoConfig", "baseline_samples_per_state", "--baseline_samples_per_state",
     "--critic_baseline_samples"),
])
def test_the_sample_counts_have_one_name_each_and_keep_their_earlier_one(module, config, field_name, canonical,
                                                                        alias):
    """docs/README.md's table: episodes per task, candidates per state, baseline samples per state."""
    import importlib

    tp = getattr(importlib.import_module(module), config)
    required = ["--output", "o", "--agent", "reference"] if config == "EvalConfig" else []
    types = [tp]
    (a,) = [c for c in parse_configs(types, [*required, canonical, "3"]) if isinstance(c, tp)]
    (b,) = [c for c in parse_configs(types, [*required, alias, "3"]) if isinstance(c, tp)]
    assert getattr(a, field_name) == getattr(b, field_name) == 3 and a == b
