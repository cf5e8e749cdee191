"""A full disk (a real one: a small tmpfs) ends a run with one line naming the path, and
loses nothing already written (colbench.io, colbench.jsonl)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from colbench.io import DiskFull, atomic_folder, atomic_write, full_disk_guard, is_disk_full
from colbench.jsonl import Appender, read_rows

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tasks" / "backend" / "train.jsonl"


def _fill(folder: Path) -> None:
    """Take every byte left on the filesystem of `folder`."""
    with open(folder / "ballast", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def test_appender_keeps_whole_batches_and_cuts_the_one_that_did_not_fit(small_disk):
    disk = small_disk("64k")
    path = disk / "rows.jsonl"
    out = Appender(path)
    written = 0
    with pytest.raises(DiskFull) as err:
        for i in range(10_000):
            out.write([{"i": i, "pad": "x" * 300}] * 3)
            written += 3
    out.close()  # nothing left in a buffer to retry: closing after the error is clean
    assert str(err.value).startswith(f"{path}: the disk is full (No space left on device; ")
    assert f"free on {disk})" in str(err.value) and "rerun the same command to resume" in str(err.value)
    assert 0 < written < 30_000
    assert path.read_bytes().endswith(b"\n")  # the batch that did not fit was cut off again
    assert len(read_rows(path, lambda r: r)) == written


def test_atomic_write_on_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(small_disk):
    disk = small_disk("64k")
    path = atomic_write(disk / "leaderboard.json", "old\n")
    _fill(disk)
    with pytest.raises(DiskFull, match=r"leaderboard.json: the disk is full .* free on "):
        atomic_write(path, "new " * 100_000)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in disk.iterdir()) == ["ballast", "leaderboard.json"]


def test_atomic_write_through_a_library_writer_that_hides_the_errno(small_disk):
    """torch.save's zip writer says `basic_ios::clear: iostream error`, not ENOSPC: the free
    space left under the path tells."""
    import torch

    disk = small_disk("256k")
    path = disk / "ref_logprobs.pt"
    atomic_write(path, lambda tmp: torch.save({"v": torch.zeros(4)}, tmp))
    with pytest.raises(DiskFull, match="ref_logprobs.pt: the disk is full"):
        atomic_write(path, lambda tmp: torch.save({"v": torch.zeros(1_000_000)}, tmp))
    assert torch.equal(torch.load(path)["v"], torch.zeros(4))
    assert [p.name for p in disk.iterdir()] == ["ref_logprobs.pt"]


def test_atomic_folder_removes_its_partial_copy(small_disk):
    disk = small_disk("64k")
    final = disk / "final"
    with atomic_folder(final) as tmp:
        (tmp / "model.safetensors").write_bytes(b"1" * 1000)
    with pytest.raises(DiskFull, match=f"{final}: the disk is full"):
        with atomic_folder(final) as tmp:
            (tmp / "model.safetensors").write_bytes(b"2" * 200_000)
    assert (final / "model.safetensors").read_bytes() == b"1" * 1000
    assert sorted(p.name for p in disk.iterdir()) == ["final"]


def test_a_file_written_atomically_has_the_mode_a_plain_open_gives(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write(tmp_path / "config.json", "{}")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_other_errors_pass_through_the_guard(tmp_path):
    with pytest.raises(PermissionError):
        with full_disk_guard(tmp_path / "x"):
            raise PermissionError(13, "Permission denied")
    assert not is_disk_full(RuntimeError("boom"), tmp_path)  # plenty of room under tmp_path


def test_the_validation_cache_on_a_full_disk_costs_the_caching_not_the_load(small_disk, monkeypatch, caplog):
    from colbench.tasks import load_tasks

    disk = small_disk("16k")
    monkeypatch.setenv("SWEET_COLBENCH_CACHE", str(disk / "cache"))
    _fill(disk)
    tasks = load_tasks(str(TASKS), env="backend")
    assert len(tasks) == 44 and all(not t.meta.get("unusable") for t in tasks)
    said = [r.getMessage() for r in caplog.records if "validation cache" in r.getMessage()]
    assert len(said) == 1 and f"the disk is full under {disk / 'cache'}" in said[0]


def _evaluate(out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "colbench.evaluate", "--env", "backend", "--agent", "reference",
           "--tasks", str(TASKS), "--output", str(out), "--batch_size", "4"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def _episode_ids(path: Path) -> list[str]:
    return [f"{r['task_id']}/{r['agent']}/{r['seed']}" for r in read_rows(path, lambda r: r)]


def test_evaluate_on_a_full_disk_stops_with_one_line_and_resumes_elsewhere(small_disk, tmp_path):
    disk = small_disk("48k")
    proc = _evaluate(disk / "out")
    assert proc.returncode == 2, proc.stderr[-2000:]
    episodes = disk / "out" / "episodes" / "reference.jsonl"
    lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1
    assert re.search(rf"python -m colbench\.evaluate: error: {re.escape(str(episodes))}: the disk is full \(No space "
                     rf"left on device; [0-9.]+ (B|KiB) free on {re.escape(str(disk))}\): what was written before is "
                     r"kept; free some space and rerun the same command to resume$", lines[0]), lines[0]
    kept = _episode_ids(episodes)
    assert 0 < len(kept) < 44 and episodes.read_bytes().endswith(b"\n")
    # moved to a disk with room, the same command finishes the rest: each episode once
    roomy = tmp_path / "roomy"
    shutil.copytree(disk / "out", roomy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn line to cut
        again = _evaluate(roomy)
    assert again.returncode == 0, again.stderr[-2000:]
    ids = _episode_ids(roomy / "episodes" / "reference.jsonl")
    assert len(ids) == 44 == len(set(ids)) and ids[: len(kept)] == kept
    board = json.loads((roomy / "leaderboard.json").read_text())
    assert board[0]["n_episodes"] == 44


def test_an_entry_point_turns_a_library_s_full_disk_error_into_one_line(tmp_path, capsys):
    """What a library raises from a write the project does not wrap still ends in one line
    and exit status 2 (colbench.cli.run_main), naming the file when the error does."""
    import errno

    from colbench.cli import run_main

    def main(argv):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "events.out"))

    def hidden(argv):  # no errno, no path: safetensors' way
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    assert run_main(main, [], prog="prog") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prog: error: {tmp_path / 'events.out'}: the disk is full (No space left on device; ")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert run_main(hidden, [], prog="prog") == 2
    err = capsys.readouterr().err
    assert err.startswith("prog: error: the disk is full (No space left on device; under the working folder: ")
    with pytest.raises(RuntimeError, match="boom"):  # anything else is a bug: raised as it is
        run_main(lambda argv: (_ for _ in ()).throw(RuntimeError("boom")), [], prog="prog")
