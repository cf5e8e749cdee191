"""Fixtures shared across the test folders."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pytest
from local_http import stop_process

if os.environ.get("PYTEST_XDIST_WORKER"):
    # under pytest-xdist (scripts/test.sh: 2 workers on 2 cores) each worker, and every process
    # it starts, runs one torch/OpenMP thread: two workers of 2 threads each would contend for
    # the same cores (OpenMP threads spin while they wait). Tests that set a count keep theirs.
    os.environ["OMP_NUM_THREADS"] = "1"

# the loader's on-disk validation cache (colbench.tasks): one folder per test session, never the
# user's ~/.cache (a test that studies the cache points it at its own folder)
os.environ.setdefault("SWEET_COLBENCH_CACHE", tempfile.mkdtemp(prefix="sweet-colbench-cache-"))

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # a suite started in the background of a non-interactive shell (`cmd &`) inherits SIGINT
    # ignored, and so would every process a test starts: the Ctrl-C tests would then see a run
    # that cannot be interrupted. A Python handler is reset to the default across exec, so the
    # children start with SIGINT as a terminal gives it to them.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class ScriptedTestbedEpisode:
    """One real episode of the legacy test bed against the scripted human: vague, vague,
    positive, then the right answer on the last (4th) turn. `path` is its episodes JSONL file."""

    task: object
    episode: object
    states: list
    path: Path


@pytest.fixture(scope="session")
def scripted_testbed_episode(tmp_path_factory) -> ScriptedTestbedEpisode:
    from testbed.env import QUESTION_POS, QUESTION_VAGUE, TestbedEnv, answer_text, make_tasks
    from colbench.protocols import AgentRequest
    from colbench.rollout import rollout
    from engines.base import Sample
    from testbed.human import TestbedSimulator
    from sweet.core.records import episode_states

    script = (QUESTION_VAGUE, QUESTION_VAGUE, QUESTION_POS)

    class ScriptedAgent:
        name = "policy"

        def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
            out = []
            for r in requests:
                asked = sum(m["role"] == "assistant" for m in r.messages)
                a, b = r.task.meta["a"], r.task.meta["b"]
                out.append(Sample(script[asked] if asked < len(script) else answer_text(a, b)))
            return out

    task = make_tasks("train", n=1, bed="legacy")[0]
    path = tmp_path_factory.mktemp("scripted_testbed") / "episodes.jsonl"
    env = TestbedEnv(bed="legacy")
    try:
        [ep] = rollout(env, [task], ScriptedAgent(), TestbedSimulator(), max_turns=4, out_path=path)
        states = episode_states(ep, env.training_info(task))
    finally:
        env.close()
    return ScriptedTestbedEpisode(task, ep, states, path)


# ---- a real ColBench OpenEnv server (colbench.serve) as a subprocess --------------------------

ROOT = Path(__file__).resolve().parents[1]
SERVE_PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
SERVE_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _colbench_server(*args: str):
    """`python -m colbench.serve ARGS` on a free port; yields its base URL; stopped after."""
    import tempfile

    import httpx

    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")  # not a pipe: a full pipe would block the server
    proc = subprocess.Popen([SERVE_PY, "-m", "colbench.serve", *args, "--port", str(port)], cwd=ROOT, env=SERVE_ENV,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"server exited with {proc.returncode}: {log.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).json()["status"] == "healthy":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("server did not answer /health within 120 s")
            time.sleep(0.3)
        yield url
    finally:
        stop_process(proc, timeout=20)
        log.close()


@pytest.fixture(scope="session")
def colbench_server():
    """`with colbench_server(*ARGS) as url:` runs `python -m colbench.serve ARGS` on a free
    127.0.0.1 port until /health answers, yields its base URL, and stops it after."""
    pytest.importorskip("openenv", reason="the `serve` extra (pip install -e '.[serve]') is not installed")
    return _colbench_server


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk("64k") -> Path`: a fresh folder on a real filesystem of that size (a tmpfs
    mounted under tmp_path, unmounted after the test), to fill up for real. Skipped, with the
    reason, where this process cannot mount one (not root, or no mount permission)."""
    mounts: list[Path] = []

    def make(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("a real full disk is a tmpfs mount, which needs root")
        path = tmp_path / f"disk{len(mounts)}"
        path.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounts.append(path)
        return path

    yield make
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# the tiny model's fixtures, shared by tests/sweet and tests/testbed
@pytest.fixture(scope="session")
def tiny_tokenizer():
    from sweet.core.models import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def one_torch_thread():
    """The test machine's cores are shared: one thread per process is much faster here."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
