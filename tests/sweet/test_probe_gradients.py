"""scripts/probe_gradients.py: one process's whole gradients, dumped before each optimiser step,
are the gradients the step applies (docs/distributed.md compares them with ZeRO-3's)."""

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_one_process_dump_holds_every_parameter_before_each_step(tmp_path, synthetic_files):
    episodes, tasks = synthetic_files
    args = ["--episodes", str(episodes), "--tasks", str(tasks), "--batch_size", "4", "--micro_batch_size", "2",
            "--eval_fraction", "0", "--max_pairs", "8", "--max_length", "512", "--head", "value",
            "--learning_rate", "2e-3", "--num_epochs", "1", "--report_to", "none", "--output_dir", str(tmp_path / "out")]
    env = {**os.environ, "GRAD_DUMP": str(tmp_path / "one"), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "scripts/probe_gradients.py", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    steps = sorted(p.name for p in tmp_path.glob("one-step*.pt"))
    assert steps == ["one-step1.pt", "one-step2.pt"]  # 8 pairs, 4 a step
    first, second = (torch.load(tmp_path / s) for s in steps)
    assert "v_head.weight" in first and any(k.startswith("lm.model.layers.") for k in first)
    # the value head starts at 0, so the body's first gradient is exactly 0 and its second is not
    body = [k for k in first if k.startswith("lm.model.layers.")]
    assert all(torch.count_nonzero(first[k]) == 0 for k in body)
    assert any(torch.count_nonzero(second[k]) > 0 for k in body)
    assert first["v_head.weight"].abs().sum() > 0
