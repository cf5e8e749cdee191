"""bench/real_pipeline.py as a user runs it: its task slices, its refusals, and the collect
step with a real engine (the tiny model, which earns no reward: the run stops at the pairs
with one line that says what to change)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ROOT / "tasks" / "backend" / "train.jsonl"


def test_bad_row_range_is_one_line(run_bench, tmp_path):
    proc = run_bench("real_pipeline.py", "--output_dir", tmp_path / "run", "--train_rows", "9:3", timeout=120)
    assert proc.returncode != 0
    assert "RealConfig.train_rows must be 'A:B' with 0 <= A < B, got '9:3'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.heavy
def test_slices_rows_collects_and_stops_without_pairs(run_bench, tmp_path):
    out = tmp_path / "run"
    args = ["--model", "tiny", "--dtype", "float32", "--data", OURS, "--train_rows", "4:10", "--val_rows", "4:6",
            "--heldout_rows", "0:4", "--train_limit", "2", "--episodes_per_task", "2", "--max_turns", "1",
            "--max_new_tokens", "8", "--output_dir", out]
    proc = run_bench("real_pipeline.py", *args, timeout=600)
    assert proc.returncode != 0
    assert "no trajectory pairs at --reward tests (threshold 0.1)" in proc.stderr + proc.stdout
    rows = OURS.read_text().splitlines()
    for name, (a, b) in {"train": (4, 10), "val": (4, 6), "heldout": (0, 4)}.items():
        assert (out / "tasks" / f"{name}.jsonl").read_text().splitlines() == rows[a:b]
    episodes = (out / "episodes" / "train.jsonl").read_text().splitlines()
    assert len(episodes) == 4  # 2 tasks x 2 episodes, sorted by (task, seed)
    keys = [(json.loads(e)["task_id"], json.loads(e)["seed"]) for e in episodes]
    assert keys == sorted(keys) and {json.loads(e)["agent"] for e in episodes} == {"policy"}
    again = run_bench("real_pipeline.py", *args, timeout=600)  # resumes: nothing collected twice
    assert (out / "episodes" / "train.jsonl").read_text().splitlines() == episodes
    assert "no trajectory pairs" in again.stderr + again.stdout


def test_paired_difference_is_taken_per_task():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from real_pipeline import paired

    a = {"t1": [1.0], "t2": [0.5], "t3": [0.0]}
    b = {"t1": [0.0], "t2": [0.5], "t3": [0.0], "t4": [1.0]}  # t4: not played by a, not compared
    diff = paired(a, b)
    assert diff.value == 1.0 / 3
    assert diff.low >= 0.0 and diff.high <= 1.0 and diff.low <= diff.value <= diff.high


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_smoke_trains_every_method_on_smollm2_and_prints_held_out_figures(run_bench, tmp_path):
    """`--smoke` as the README's user runs it: SmolLM2 with LoRA through every step, pairs and
    states above 0 for each method, a held-out line for zero-shot and each trained policy."""
    out = tmp_path / "smoke"
    proc = run_bench("real_pipeline.py", "--smoke", "--output_dir", out, timeout=2400, env={"OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["model"] == "smollm2" and summary["config"]["dtype"] == "bfloat16"
    data = summary["training_data"]
    assert summary["collected"]["pairs"] > 0 and data["mtdpo"]["pairs"] > 0
    assert data["sweet_rl"]["states"] > 0 and data["sweet_rl"]["pairs"] > 0 and data["rft"]["episodes"] > 0
    assert set(summary["heldout"]) == {"zero_shot", "sweet_rl", "rft", "mtdpo"}
    for method in ("sweet_rl", "rft", "mtdpo"):
        assert f"{method}: tests " in proc.stdout and "minus_zero_shot" in summary["heldout"][method]
        trained = out / method.replace("_rl", "")
        assert json.loads((trained / "config.json").read_text())["model"]["lora"] is True
        assert (trained / "final-adapter" / "adapter_config.json").exists()  # the LoRA adapter beside the merged model
    assert "critic agreement on held-out pairs: " in proc.stdout
    assert (out / "inspect" / "index.html").exists()
    # each step gives back what it freed: before engines/memory.py, glibc kept 7.6 GB after the critic
    memory = summary["memory_gb"]
    assert set(memory) == {"collect", "critic", "sweet", "rft", "mtdpo", "evaluate", "inspect"}
    assert max(memory.values()) < 4.0, memory
