"""Config values that make no sense are refused in __post_init__, before any work, each
error naming the config, the field and the value (sweet/core/config.py: check_range)."""

from __future__ import annotations

import pytest

from sweet.core.config import ModelConfig, TrainConfig


@pytest.mark.parametrize("field,value", [("logging_steps", 0), ("num_epochs", 0), ("learning_rate", float("nan")),
                                         ("learning_rate", -1.0), ("batch_size", 0), ("micro_batch_size", 0),
                                         ("warmup_ratio", 1.0), ("max_grad_norm", 0.0), ("weight_decay", -0.1)])
def test_senseless_train_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"TrainConfig.{field} must be .*got {value}"):
        TrainConfig(**{field: value})


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
