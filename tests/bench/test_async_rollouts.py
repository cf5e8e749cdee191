"""bench/async_rollouts.py: its throughput arithmetic (the steady state leaves out the
pipeline fill and the drain iterations, the whole-run ratio keeps them) and one tiny run
end to end, whose last line is the ratio in the documented form (no timing assertions)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from async_rollouts import summarize  # noqa: E402


def clock(plays, iteration_times, fill):
    return SimpleNamespace(plays=plays, iteration_times=iteration_times, fill=fill)


def test_steady_state_leaves_out_the_drain_and_the_whole_run_keeps_fill_and_drain():
    sync = clock(plays=[4.0, 4.0, 4.0, 4.0], iteration_times=[10.0] * 4, fill=0.0)  # R 4 + T 6
    # lag 1: the fill plays iteration 0 (4 s) before the loop; iterations 0-2 train while the
    # next one plays (7 s each), the last has nothing left to play (T alone, 6 s)
    lagged = clock(plays=[4.0, 7.0, 7.0, 7.0], iteration_times=[7.0, 7.0, 7.0, 6.0], fill=4.0)
    f = summarize(sync, lagged, staleness=1)
    assert (f["R"], f["T"], f["sync"]) == (4.0, 6.0, 10.0)
    assert f["bound"] == pytest.approx(10 / 6)
    assert f["steady"] == 7.0 and f["drain"] == 6.0 and f["background"] == 7.0
    assert f["ratio"] == pytest.approx(10 / 7)
    assert f["whole_ratio"] == pytest.approx(40 / (4 + 27))
    # lag 2: the last two iterations are the drain
    f2 = summarize(sync, clock([4.0, 4.0, 7.0, 7.0], [7.0, 7.0, 6.0, 6.0], 8.0), staleness=2)
    assert f2["steady"] == 7.0 and f2["drain"] == 6.0 and f2["whole_ratio"] == pytest.approx(40 / (8 + 26))
    with pytest.raises(ValueError, match="--iterations must exceed --staleness"):
        summarize(sync, clock([4.0, 4.0], [6.0, 6.0], 8.0), staleness=2)


def test_async_bench_runs_and_prints_the_ratio_last(tmp_path, run_bench):
    res = run_bench("async_rollouts.py", "--iterations", "2", "--latency", "0.05", "--tasks-per-iteration", "1",
                    "--k", "2", "--max-turns", "2", "--ppo-epochs", "1", "--threads", "1", "--output-dir", tmp_path,
                    timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert re.match(r"async / sync iteration throughput: \d+\.\dx \(\d+\.\d\d; steady state\)", lines[-1]), lines[-1]
    assert re.search(r"whole run, fill and drain included: async / sync \d+\.\d\dx over 2 iterations", res.stdout)
    # both runs played 2 episodes per iteration; at lag 1 iteration 1 was played by version 0
    for run, versions in (("sync", [0, 1]), ("async", [0, 0])):
        for it, version in enumerate(versions):
            rows = [json.loads(line) for line in (tmp_path / run / "episodes" / f"iter-{it:04d}.jsonl").open()]
            assert [r["meta"]["policy_version"] for r in rows] == [version, version], (run, it)


def test_async_bench_refuses_too_few_iterations_before_running(run_bench):
    res = run_bench("async_rollouts.py", "--iterations", "2", "--staleness", "2", timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines()[-1].endswith(
        "error: --iterations (2) must exceed --staleness (2) to time an overlapped iteration")
