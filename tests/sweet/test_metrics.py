"""Logging through accelerate's trackers (sweet/core/metrics.py): a tiny run with
`report_to tensorboard` writes event files with our metric names and the resolved
config as hparams (read back with TensorBoard's own event reader); `none` imports no
TensorBoard; metrics.jsonl is kept either way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from sweet.core.config import ModelConfig, TrainConfig
from sweet.core.metrics import flat_config, trackers
from sweet.core.trainer import Trainer

MODEL = ModelConfig(model="tiny", dtype="float32", max_length=64, keep_head=8)


@pytest.fixture(autouse=True)
def _fresh(one_torch_thread):
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _loss(model, items):
    ids = torch.tensor([[5, 6, 7, 8]] * len(items))
    return model(input_ids=ids).logits.float().pow(2).mean() * len(items), {"loss/test": 0.5 * len(items)}


def test_tensorboard_tracker_writes_our_metrics_and_the_config(tmp_path, tiny_tokenizer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    train = TrainConfig(output_dir=str(tmp_path), batch_size=2, micro_batch_size=1, report_to="tensorboard",
                        learning_rate=1e-4)
    run_config = {"model": {"model": "tiny", "lora": False}, "train": {"learning_rate": 1e-4, "report_to": "tensorboard"},
                  "loop": {"max_turns": None}}
    trainer = Trainer(MODEL, train, tiny_tokenizer, run_config=run_config)
    trainer.prepare(2)
    for _ in range(2):
        trainer.log(trainer.optimizer_step([0, 1], _loss))
    trainer.logger.close()

    events = sorted((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    scalars, hparams = {}, {}
    for path in events:
        acc = EventAccumulator(str(path))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars[tag] = [e.step for e in acc.Scalars(tag)]
        try:
            contents = acc.PluginTagToContent("hparams").values()
        except KeyError:  # a file without hparams
            contents = []
        for content in contents:
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("session_start_info"):
                for k, v in data.session_start_info.hparams.items():
                    hparams[k] = v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
    assert scalars["loss/test"] == [1, 2] and scalars["train/lr"] == [1, 2] and "train/grad_norm" in scalars
    assert hparams["train/learning_rate"] == pytest.approx(1e-4)
    assert hparams["model/model"] == "tiny" and hparams["model/lora"] == 0 and hparams["loop/max_turns"] == "null"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["loss/test"] == 0.5


def test_report_to_none_imports_no_tensorboard(tmp_path):
    code = ("import sys\nfrom sweet.core.config import ModelConfig, TrainConfig\nfrom sweet.core.trainer import Trainer\n"
            "from sweet.core.models import load_tokenizer\n"
            f"t = Trainer(ModelConfig(model='tiny', dtype='float32'), TrainConfig(output_dir={str(tmp_path)!r}, "
            "report_to='none'), load_tokenizer('tiny'))\nt.log({'a': 1.0}, step=1)\n"
            "bad = [m for m in sys.modules if m.startswith(('tensorboard', 'torch.utils.tensorboard', 'wandb'))]\n"
            "assert not bad, bad\n")
    env_run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False)
    assert env_run.returncode == 0, env_run.stderr[-2000:]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "a": 1.0}
    assert not (tmp_path / "tensorboard").exists()


def test_report_to_names_are_checked():
    assert trackers("none") == [] and trackers("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert trackers("trackio") == ["trackio"]
    with pytest.raises(ValueError, match="report_to: unknown tracker.*tensorbord"):
        trackers("tensorbord")


def test_flat_config_keeps_scalars_and_spells_the_rest():
    assert flat_config({"a": {"b": 1, "c": None, "d": [1, 2]}, "e": "x"}) == {"a/b": 1, "a/c": "null", "a/d": "[1, 2]",
                                                                            "e": "x"}
