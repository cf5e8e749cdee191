"""bench/real_scoring.py on a few rows of our own in the published format (never the
published rows): both ways run, every reference passes against itself, the ratio comes
last; a missing file is one clear line. No timing assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    ("def add(a, b):\n    return a + b\n", ["add(1, 2)", "add('a', 'b')", "add([1], [2])"]),
    ("import math\n\ndef helper(x):\n    return math.sqrt(x)\n\ndef roots(xs):\n    return [helper(x) for x in xs]\n",
     ["roots([4, 9])", "roots([])", "roots([2.25])"]),
    ("import random\n\ndef dice(n):\n    return [random.randint(1, 6) for _ in range(n)]\n", ["dice(3)", "dice(10)"]),
    ("def touch():\n    with open('sweet_real_scoring_probe.txt', 'w') as fh:\n        fh.write('x')\n    return 1\n",
     ["touch()"]),
]


def _write_rows(path: Path) -> None:
    with path.open("w") as fh:
        for i, (source, calls) in enumerate(ROWS):
            fh.write(json.dumps({"problem_description": f"Task {i}. The signature of the function is: def f()",
                                 "ground_truth": source, "hidden_information": source,
                                 "test_cases": {f"test{k + 1}": c for k, c in enumerate(calls)}}) + "\n")


def test_real_scoring_bench_runs_both_ways_and_prints_the_ratio_last(tmp_path, run_bench):
    rows = tmp_path / "rows.jsonl"
    _write_rows(rows)
    res = run_bench("real_scoring.py", "--tasks", rows, "--limit", "4", "--workers", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith(f"4 rows of {rows}")
    assert not (ROOT / "sweet_real_scoring_probe.txt").exists()  # the unsafe way ran in a scratch folder
    assert re.fullmatch(r"ratio sandbox pool / unsafe in-process time: \d+\.\dx", lines[-1]), lines[-1]
    box = next(line for line in lines if line.startswith("sandbox pool"))
    assert "mean reward 1.000, success 1.000; rows not passing: none" in box  # the seeded dice agree
    unsafe = next(line for line in lines if line.startswith("unsafe in-process"))
    assert re.search(r"mean reward (0\.\d{3}|1\.000)", unsafe)


def test_real_scoring_bench_names_a_missing_file(run_bench):
    res = run_bench("real_scoring.py", "--tasks", "no/such/rows.jsonl", timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "bench/real_scoring.py: no such file no/such/rows.jsonl (the published backend test split, "
        "../shared/data/colbench-test/backend_test.jsonl beside the repo, or --tasks)"]
