"""The trainers' command lines as a user who makes mistakes meets them: every user error is
one line naming the field or file, exit code 2, no traceback; a second writer into an
output folder stops at once naming the holder; Ctrl-C says what was kept, exit 130.
Real subprocesses of the real entry points."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from policy_fixtures import FAST, cached_tiny_episodes

from colbench.outdir import OutputLock

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    path, _, _ = cached_tiny_episodes(tmp_path_factory.getbasetemp())
    return path


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr[-2000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_bad_values_files_and_models_are_one_line_each(tmp_path, episodes):
    out = str(tmp_path / "o")  # one folder for every attempt: one that failed before any work blocks no retry
    _one_line_error(_run("sweet.train_critic", "--episodes", str(episodes), "--tasks", "builtin:train", "--batch_size", "0",
                         "--output_dir", out), "batch_size")
    _one_line_error(_run("sweet.train_policy", "--algorithm", "rft", "--episodes", str(tmp_path / "missing.jsonl"),
                         "--output_dir", out, *FAST), "missing.jsonl")
    _one_line_error(_run("sweet.train_policy", "--algorithm", "rft", "--episodes", str(episodes), "--output_dir", out,
                         "--model", "./no/such/model"), "no such folder")
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")  # what a kill during the final save leaves: no weights
    _one_line_error(_run("sweet.train_policy", "--algorithm", "rft", "--episodes", str(episodes), "--output_dir", out,
                         "--model", str(empty)), "not a model folder", "weights")
    yaml = tmp_path / "run.yaml"
    yaml.write_text("batch_size: 2.5\n")
    _one_line_error(_run("sweet.train_policy", "--algorithm", "rft", "--episodes", str(episodes), "--output_dir", out,
                         "--config", str(yaml)), "batch_size", "2.5")
    _one_line_error(_run("sweet.train_policy", "--algorithm", "ppo"), "unknown 'ppo'")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"hello"\n')
    _one_line_error(_run("sweet.train_policy", "--algorithm", "rft", "--episodes", str(bad), "--output_dir", out,
                         *FAST), "bad.jsonl:1")
    shown = _run("sweet.train_policy", "--algorithm", "ppo", "--debug")
    assert shown.returncode == 2 and "Traceback" in shown.stderr  # --debug shows where


def test_a_second_writer_stops_at_once_naming_the_holder(tmp_path, episodes):
    out = tmp_path / "run"
    with OutputLock(out, command="the first run"):
        start = time.perf_counter()
        proc = _run("sweet.train_policy", "--algorithm", "rft", "--episodes", str(episodes), "--output_dir", str(out),
                    *FAST)
        _one_line_error(proc, "in use by", f"pid {os.getpid()}", "the first run")
        assert time.perf_counter() - start < 60
    assert not (out / "config.json").exists()  # it stopped before writing anything


def test_ctrl_c_says_what_was_kept_and_how_to_resume(tmp_path, episodes):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "rft", "--episodes", str(episodes),
           "--output_dir", str(out), "--success_threshold", "0.0", "--num_epochs", "50", "--batch_size", "2",
           "--micro_batch_size", "2", "--save_steps", "1", *FAST]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 240
    def checkpointed():  # a whole checkpoint: renamed from checkpoint-N.tmp into place
        return any(p.name.split("-")[1].isdigit() for p in out.glob("checkpoint-*"))

    while not checkpointed() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    line = [ln for ln in err.splitlines() if "interrupted:" in ln]
    assert len(line) == 1 and "checkpoint-" in line[0] and "rerun the same command to resume" in line[0], err[-2000:]
    assert not (out / ".lock").exists()  # the lock was released
