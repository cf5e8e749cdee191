"""Metric logging: namespaced metrics to metrics.jsonl, TensorBoard and W&B."""

from __future__ import annotations

import json
import os
from pathlib import Path


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
