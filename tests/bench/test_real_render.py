"""bench/real_render.py on a few pages of our own in the published frontend format (never the
published rows): both ways run, the speed-up comes last; a missing file is one clear line.
No timing assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from colbench.scoring.render import DEFAULT_CHROMIUM

TW = '<link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">'


@pytest.mark.skipif(not Path(DEFAULT_CHROMIUM).exists(), reason="chromium not installed (apt-get install chromium)")
def test_real_render_bench_runs_both_ways_and_prints_the_speed_up_last(tmp_path, run_bench):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({
        "problem_description": f"Site {i}",
        "ground_truth": f'<html><head>{TW}</head><body><h1 class="text-3xl p-4 bg-blue-600">Site {i}</h1>'
                        f'<img src="https://picsum.photos/id/48/300/200"></body></html>'}) + "\n" for i in range(3)))
    res = run_bench("real_render.py", "--tasks", rows, "--limit", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == f"2 rows of {rows}"
    assert lines[1] == "pages: 2  (pool failures: 0, fresh failures: 0)"
    assert re.fullmatch(r"speed-up: \d+\.\dx   identical screenshots both ways: 2/2", lines[-1]), lines[-1]


def test_real_render_bench_names_a_missing_file(run_bench):
    res = run_bench("real_render.py", "--tasks", "no/such/rows.jsonl", timeout=60)
    assert res.returncode == 1
    assert res.stdout == "" and res.stderr.strip().count("\n") == 0 and "no/such/rows.jsonl" in res.stderr
