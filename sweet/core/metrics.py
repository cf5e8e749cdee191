"""Metric logging, one place: metrics.jsonl (ours: a resume trims it to its step) and
accelerate's trackers (`--report_to`: tensorboard, wandb, trackio; `none`), each given
the run's whole resolved config as hyper-parameters."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from colbench.io import full_disk_guard

TRACKERS = ("tensorboard", "wandb", "trackio")
PROJECT = "sweet-colbench"  # W&B / trackio project (WANDB_PROJECT overrides); TensorBoard: output_dir/tensorboard


def trackers(report_to: str) -> list[str]:
    """`--report_to` as accelerate's `log_with` list ([] for none); an unknown name is an error."""
    names = [t.strip() for t in report_to.split(",") if t.strip() and t.strip() != "none"]
    unknown = [t for t in names if t not in TRACKERS]
    if unknown:
        raise ValueError(f"TrainConfig.report_to: unknown tracker(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(TRACKERS)} or none")
    return names


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config as one level of `section/field` scalars (TensorBoard's hparams take
    only bool/int/float/str; None and lists become their text)."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, name + "/"))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


class MetricsLogger:
    """Namespaced metrics to metrics.jsonl and the accelerator's trackers; main process only.

    The trackers are accelerate's (`Accelerator(log_with=...)`, made by
    sweet.core.trainer.make_accelerator from `report_to`); this starts them with the run
    config and logs every row to them and to metrics.jsonl."""

    def __init__(self, output_dir: str | Path, accelerator, run_config: dict | None = None):
        self.accelerator = accelerator
        self.is_main = accelerator.is_main_process
        self.path = Path(output_dir) / "metrics.jsonl"
        self.tracking = bool(accelerator.log_with)
        if self.is_main:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.tracking:  # a collective-free call; accelerate starts the trackers on the main process only
            accelerator.init_trackers(os.environ.get("WANDB_PROJECT", PROJECT), config=flat_config(run_config or {}))

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.is_main:
            return
        values = {k: float(v) for k, v in metrics.items()}
        with full_disk_guard(self.path), self.path.open("a") as f:  # a torn row is cut on resume (trim_metrics)
            f.write(json.dumps({"step": step, **values}) + "\n")
        if self.tracking:
            self.accelerator.log(values, step=step)
            for tracker in self.accelerator.trackers:  # TensorBoard buffers: a killed run keeps its rows
                flush = getattr(tracker.tracker, "flush", None) if tracker.name == "tensorboard" else None
                if flush is not None:
                    flush()

    def close(self) -> None:
        if self.tracking:
            self.accelerator.end_training()
            self.tracking = False
