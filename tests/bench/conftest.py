"""The bench tests run each script as a user would: `python bench/<script> ...` from the
repository root, in a subprocess, with one torch thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_bench():
    """run_bench(script, *args, timeout=300, env=None) -> subprocess.CompletedProcess (text)."""

    def run(script: str, *args, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, f"bench/{script}", *map(str, args)], cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    return run
