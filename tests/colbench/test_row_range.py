"""Row ranges on task sources (`file.jsonl[200:1000]`, `hf:...[test][0:200]`, `builtin:train[:8]`):
one loader (colbench.tasks.load_tasks), so every CLI that reads tasks takes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from colbench.tasks import load_tasks, split_row_range, write_tasks_jsonl

ROOT = Path(__file__).resolve().parents[2]
TEST = ROOT / "tasks/backend/test.jsonl"
PUBLISHED = ROOT.parent / "shared/data/colbench-test/backend_test.jsonl"  # ../shared beside the checkout


def test_a_range_selects_rows_which_keep_their_place_in_the_file():
    every = load_tasks(str(TEST), validate=False)
    some = load_tasks(f"{TEST}[3:7]", validate=False)
    assert [t.task_id for t in some] == [t.task_id for t in every[3:7]]
    assert some[0].meta["where"].endswith(f"{TEST.name}:4")  # file:line as in the whole file
    assert [t.task_id for t in load_tasks(f"{TEST}[5:]", validate=False)] == [t.task_id for t in every[5:]]
    assert [t.task_id for t in load_tasks(f"{TEST}[:2]", validate=False)] == [t.task_id for t in every[:2]]
    assert [t.task_id for t in load_tasks(f"{TEST}[2:9]", limit=3, validate=False)] == \
        [t.task_id for t in every[2:5]]  # --limit counts from the range's start
    assert len(load_tasks("builtin:test[1:3]", validate=False)) == 2
    assert len(load_tasks("builtin:train[2:5]", env="testbed")) == 3  # generated sources too


def test_hf_sources_take_the_range_after_the_split():
    assert split_row_range("hf:facebook/collaborative_agent_bench[test][0:200]") == \
        ("hf:facebook/collaborative_agent_bench[test]", (0, 200))
    assert split_row_range("hf:facebook/collaborative_agent_bench[train][200:1000]") == \
        ("hf:facebook/collaborative_agent_bench[train]", (200, 1000))
    assert split_row_range("hf:facebook/collaborative_agent_bench[test]") == \
        ("hf:facebook/collaborative_agent_bench[test]", (0, None))


@pytest.mark.parametrize("bad, message", [
    ("[5:2]", "selects no rows"), ("[a:3]", "bad row range '[a:3]'"), ("[-1:3]", "bad row range"),
    ("[1:2:3]", "task file not found"), ("[900:950]", "starts at row 900, but the source has"),
])
def test_bad_ranges_are_one_line_errors_naming_the_source(bad, message):
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        load_tasks(f"{TEST}{bad}", validate=False)
    assert message in str(info.value) and "\n" not in str(info.value) and TEST.name in str(info.value)


def test_a_file_whose_name_ends_in_brackets_is_read_as_named(tmp_path):
    path = tmp_path / "rows[0:1].jsonl"
    write_tasks_jsonl(load_tasks(str(TEST), validate=False)[:3], path)
    assert len(load_tasks(str(path), validate=False)) == 3


def test_the_evaluate_cli_takes_a_range_and_refuses_a_bad_one_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "colbench.evaluate", "--env", "backend", "--agent", "reference",
           "--progress", "false", "--output", str(tmp_path / "run")]
    done = subprocess.run(cmd + ["--tasks", f"{TEST}[10:13]"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run/episodes/reference.jsonl").read_text().splitlines()]
    every = load_tasks(str(TEST), validate=False)
    assert [r["task_id"] for r in rows] == [t.task_id for t in every[10:13]]
    bad = subprocess.run(cmd + ["--tasks", f"{TEST}[13:10]"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "selects no rows" in bad.stderr


@pytest.mark.skipif(not PUBLISHED.exists(), reason="the published test split is not in ../shared/data")
def test_the_published_split_by_range():
    tasks = load_tasks(f"{PUBLISHED}[200:205]", validate=False)
    assert [t.meta["where"].rsplit(":", 1)[1] for t in tasks] == ["201", "202", "203", "204", "205"]
