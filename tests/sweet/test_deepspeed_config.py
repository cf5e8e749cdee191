"""DeepSpeed's batch arithmetic and clipping come from the trainer's config
(sweet.core.trainer.configure_deepspeed), checked on the plugin configs accelerate
builds (DeepSpeedPlugin needs no DeepSpeed install): both ways a launch config gives
them (its own deepspeed_config fields, or a DeepSpeed JSON file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweet.core.config import TrainConfig
from sweet.core.trainer import accumulation_steps, configure_deepspeed, declared_deepspeed_config

TRAIN = TrainConfig(batch_size=32, micro_batch_size=2, max_grad_norm=0.5)
WORLD = 8
ACCUM = accumulation_steps(32, 2, WORLD)  # 2


def test_the_shipped_launch_configs_leave_the_values_to_the_trainer():
    from accelerate.utils import DeepSpeedPlugin

    for name, stage in [("deepspeed_zero2.yaml", 2), ("deepspeed_zero3.yaml", 3),
                        ("deepspeed_zero2_cpu_2proc.yaml", 2), ("deepspeed_zero3_cpu_2proc.yaml", 3)]:
        fields = yaml.safe_load(Path(f"sweet/configs/{name}").read_text())["deepspeed_config"]
        assert fields["zero_stage"] == stage
        assert not {"gradient_accumulation_steps", "gradient_clipping"} & set(fields)
        # what accelerate builds from such a launch config (no ACCELERATE_GRADIENT_* variables)
        plugin = DeepSpeedPlugin(zero_stage=fields["zero_stage"])
        ds = configure_deepspeed(plugin.deepspeed_config, TRAIN, ACCUM, WORLD)
        assert ds is plugin.deepspeed_config
        assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["gradient_clipping"],
                ds["train_batch_size"]) == (2, ACCUM, 0.5, 32)
        assert ds["zero_optimization"]["stage"] == stage


def test_a_matching_value_passes_and_a_mismatch_is_refused_in_one_line():
    from accelerate.utils import DeepSpeedPlugin

    ok = DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.5, gradient_accumulation_steps=ACCUM)
    assert configure_deepspeed(ok.deepspeed_config, TRAIN, ACCUM, WORLD)["gradient_clipping"] == 0.5
    bad = DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0)
    with pytest.raises(ValueError) as e:
        configure_deepspeed(bad.deepspeed_config, TRAIN, ACCUM, WORLD)
    assert "\n" not in str(e.value)
    assert "gradient_clipping=1.0 differs from the trainer's 0.5 (--max_grad_norm)" in str(e.value)


def test_a_deepspeed_json_file_is_judged_as_written(tmp_path, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    # accelerate fills a missing gradient_accumulation_steps of a file with 1: not a mismatch
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 1
    ds = configure_deepspeed(plugin.deepspeed_config, TRAIN, ACCUM, WORLD, declared=declared_deepspeed_config())
    assert (ds["gradient_accumulation_steps"], ds["train_micro_batch_size_per_gpu"]) == (ACCUM, 2)
    # one the author set to another value is refused
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu=4 differs from the trainer's 2 "
                                         r"\(--micro_batch_size\)"):
        configure_deepspeed(plugin.deepspeed_config, TRAIN, ACCUM, WORLD, declared=declared_deepspeed_config())


def test_no_file_declares_nothing(monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", raising=False)
    assert declared_deepspeed_config() is None


def test_a_launch_config_accumulation_that_differs_is_refused(tmp_path, monkeypatch, one_torch_thread):
    """accelerate lets ACCELERATE_GRADIENT_ACCUMULATION_STEPS (a launch config's
    gradient_accumulation_steps) win over the trainer's value: refused, in one line."""
    from accelerate.state import AcceleratorState, GradientState

    from sweet.core.trainer import make_accelerator

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "3")
    try:
        with pytest.raises(ValueError, match=r"^the accelerate launch config sets gradient_accumulation_steps=3, the "
                                             r"trainer needs 4 [^\n]*$"):
            make_accelerator(TrainConfig(output_dir=str(tmp_path), batch_size=8, micro_batch_size=2, report_to="none"))
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
