"""One writer per output folder (colbench.outdir), with real processes; the episode
reader's dedup of episode ids two writers left."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colbench.outdir import LOCK_NAME, FolderLocked, OutputLock, StaleLockWarning

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
HOLD = ("import sys, time; from colbench.outdir import OutputLock; "
        "OutputLock(sys.argv[1], command='holder job').acquire(); print('locked', flush=True); time.sleep(120)")


def holder(folder: Path) -> subprocess.Popen:
    """A real process holding the folder's lock (until killed)."""
    proc = subprocess.Popen([PY, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_second_writer_stops_at_once_naming_the_holder(tmp_path):
    proc = holder(tmp_path / "out")
    try:
        start = time.monotonic()
        with pytest.raises(FolderLocked) as info:
            OutputLock(tmp_path / "out").acquire()
        assert time.monotonic() - start < 1.0
        msg = str(info.value)
        assert f"output folder {tmp_path / 'out'} is in use by pid {proc.pid} on {socket.gethostname()}, started " in msg
        assert "UTC (holder job)" in msg and "\n" not in msg
        # the CLI: one line, exit code 2, nothing written
        r = subprocess.run([PY, "-m", "colbench.evaluate", "--agent", "reference", "--limit", "1", "--no-progress",
                            "--output", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines() == [f"python -m colbench.evaluate: error: {msg}"]
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_NAME]
    finally:
        kill(proc)


def test_a_dead_holders_lock_is_taken_over_with_a_warning(tmp_path):
    proc = holder(tmp_path / "out")
    kill(proc)  # SIGKILL: no cleanup ran, the lock file still names it
    assert json.loads((tmp_path / "out" / LOCK_NAME).read_text())["pid"] == proc.pid
    with pytest.warns(StaleLockWarning, match=rf"took over the stale lock of pid {proc.pid} on .*: that process is gone"):
        lock = OutputLock(tmp_path / "out", command="me").acquire()
    assert json.loads((tmp_path / "out" / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "out" / LOCK_NAME).exists()
    with OutputLock(tmp_path / "out"):  # free again, no warning
        pass


def test_without_flock_the_recorded_pid_decides(tmp_path, monkeypatch):
    """Filesystems without flock: a live recorded pid on this host holds the folder, a dead one does not."""
    monkeypatch.setattr(OutputLock, "_flock", lambda self, fd: False)
    folder = tmp_path / "out"
    folder.mkdir()
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    try:
        record = {"pid": proc.pid, "host": socket.gethostname(), "started": "2026-01-01 00:00:00 UTC", "command": "x"}
        (folder / LOCK_NAME).write_text(json.dumps(record))
        with pytest.raises(FolderLocked, match=f"in use by pid {proc.pid}"):
            OutputLock(folder).acquire()
    finally:
        kill(proc)
    with pytest.warns(StaleLockWarning, match=f"pid {proc.pid}"):
        OutputLock(folder).acquire().release()


def test_duplicated_episode_ids_are_read_once_with_a_warning(tmp_path):
    from colbench.episodes import load_episodes
    from colbench.types import Episode, Score

    eps = [Episode(f"t{i}", "backend", "a", 0, answer=f"x{i}", score=Score(1.0, True), stop_reason="answered")
           for i in range(3)]
    path = tmp_path / "eps.jsonl"
    twice = [*eps, *eps[:2]]  # what two writers on one folder left (64 rows for 32 episodes)
    path.write_text("".join(e.dumps() + "\n" for e in twice))
    with pytest.warns(UserWarning, match=r"eps.jsonl: 2 duplicated episode ids \(first 't0/a/0' at line 4, also at "
                                         r"line 1\); keeping the first record of each"):
        loaded = load_episodes(path)
    assert [e.episode_id for e in loaded] == ["t0/a/0", "t1/a/0", "t2/a/0"]


def test_an_output_that_is_a_file_is_a_user_error(tmp_path):
    from colbench.cli import UserError

    (tmp_path / "out").write_text("not a folder")
    with pytest.raises(UserError, match=r"output folder .*out: cannot create it \(File exists\)"):
        OutputLock(tmp_path / "out").acquire()
