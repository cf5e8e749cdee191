"""A trainer whose disk fills while it writes a checkpoint (a real full disk: a tmpfs with
room for about one and a half checkpoints) stops with one line, keeps the checkpoint
before, and resumes elsewhere to the same weights as a run that was never stopped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from policy_fixtures import FAST, cached_tiny_episodes

from sweet.core.trainer import checkpoint_problem

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> Path:
    return cached_tiny_episodes(tmp_path_factory.getbasetemp())[0]


def _args(episodes: Path, out: Path) -> list[str]:
    return ["--algorithm", "rft", "--episodes", str(episodes), "--output_dir", str(out), *FAST,
            "--learning_rate", "1e-3", "--batch_size", "1", "--micro_batch_size", "1", "--save_steps", "2"]


def _run(args: list[str], launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = (launcher or [sys.executable, "-m"]) + ["sweet.train_policy", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _final(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "final" / "model.safetensors")


def _disk_for_one_and_a_half(small_disk, reference: Path) -> Path:
    size = sum(f.stat().st_size for f in (reference / "checkpoint-2").rglob("*") if f.is_file())
    return small_disk(str(int(size * 1.5)))


@pytest.mark.heavy
def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_run_resumes_elsewhere(episodes, small_disk, tmp_path):
    reference = tmp_path / "reference"
    done = _run(_args(episodes, reference))
    assert done.returncode == 0, done.stderr[-2000:]
    disk = _disk_for_one_and_a_half(small_disk, reference)
    out = disk / "rft"
    stopped = _run(_args(episodes, out))
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    errors = [ln for ln in stopped.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1
    assert re.search(rf"python -m sweet\.train_policy: error: {re.escape(str(out))}/checkpoint-4: the disk is full "
                     rf"\(No space left on device; [0-9.]+ (B|KiB|MiB) free on {re.escape(str(disk))}\): what was "
                     "written before is kept", errors[0]), errors[0]
    # the checkpoint before is whole, the partial one is gone (its space given back), nothing is finished
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "config.json", "fingerprint.json",
                                                     "metrics.jsonl"]
    assert checkpoint_problem(out / "checkpoint-2") is None
    # on a disk with room, the same command resumes from checkpoint-2; a stale .tmp is removed first
    roomy = tmp_path / "roomy"
    shutil.copytree(out, roomy)
    (roomy / "checkpoint-4.tmp").mkdir()
    resumed = _run(_args(episodes, roomy))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"removed {roomy / 'checkpoint-4.tmp'}: an interrupted write" in resumed.stdout
    assert f"resuming from {roomy / 'checkpoint-2'} (step 2)" in resumed.stdout
    first, again = _final(reference), _final(roomy)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_full_disk_on_two_processes_stops_both_at_once(episodes, small_disk, tmp_path):
    """Under DDP only the main process writes the model: when its write fails, the other
    process hears of it at the checkpoint (Trainer.everyone_ok) and stops with the same line
    and exit status instead of waiting at the next barrier (or being killed by the launcher)."""
    from conftest import dist_config

    dist = dist_config("ddp_cpu_2proc.yaml")
    reference = tmp_path / "reference"
    done = _run(_args(episodes, reference))
    assert done.returncode == 0, done.stderr[-2000:]
    disk = _disk_for_one_and_a_half(small_disk, reference)
    out = disk / "rft"
    stopped = _run(_args(episodes, out), launcher=[*dist.launch(29571), "-m"])
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    errors = [ln for ln in stopped.stderr.splitlines() if "sweet.train_policy: error:" in ln]
    line = f"{out}/checkpoint-4: the disk is full (No space left on device; "
    assert len(errors) == 2 and all(line in e for e in errors), stopped.stderr[-3000:]
    # both ranks stopped by themselves (each printed the line; none waited at a barrier) and the
    # first to exit did so with the user-error status. The launcher SIGTERMs whatever is still
    # alive when it sees the first exit, so the other may be ended while it exits: -15 or 2.
    root = stopped.stderr.split("Root Cause", 1)[-1]
    assert re.search(r"exitcode\s*: 2 ", root), stopped.stderr[-3000:]
    codes = re.findall(r"exitcode\s*: (-?\d+) ", stopped.stderr)
    assert len(codes) == 2 and set(codes) <= {"2", "-15"}, stopped.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "config.json", "fingerprint.json",
                                                     "metrics.jsonl"]
