"""Task data and loaders: the bundled backend tasks validate in the real sandbox, the
official formats load (jsonl, json, parquet, trajectories), bad rows are reported with
file and line."""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import re
from pathlib import Path

import pytest

from colbench.scoring.backend import values_equal
from colbench.scoring.sandbox import SandboxPool
from colbench.tasks import (
    TASKS_DIR,
    TaskFormatError,
    load_tasks,
    load_trajectories,
    stable_task_id,
    tasks_by_id,
    validate_references,
    write_tasks_jsonl,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OFFICIAL = FIXTURES / "backend_official.jsonl"
MALFORMED = FIXTURES / "backend_malformed.jsonl"
BAD_REFS = FIXTURES / "backend_bad_reference.jsonl"
TRAJECTORIES = FIXTURES / "offline_trajectories.jsonl"
SIGNATURE = re.compile(r"The signature of the function is:\s*def (\w+)\(([^)]*)\)")


@pytest.fixture(scope="module")
def bundled():
    train = load_tasks("builtin:train", validate=False)
    test = load_tasks("builtin:test", validate=False)
    return train, test


# ------------------------------------------------------------------ the bundled tasks


def test_bundled_split_sizes_and_ids(bundled):
    train, test = bundled
    assert len(train) == 44 and len(test) == 20
    assert [t.task_id for t in train[:2]] == ["backend-train-0001", "backend-train-0002"]
    assert all(t.meta["split"] == "train" for t in train) and all(t.meta["split"] == "test" for t in test)
    tasks_by_id(train + test)  # raises on a repeated id across the splits
    # no task is in both splits, even under another id
    assert not {t.hidden for t in train} & {t.hidden for t in test}


def test_bundled_rows_are_in_the_official_format(bundled):
    for split in ("train", "test"):
        for line in (TASKS_DIR / "backend" / f"{split}.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert set(row) == {"task_id", "problem_description", "ground_truth", "test_cases"}
            assert list(row["test_cases"]) == [f"test{i}" for i in range(1, 11)]


def test_bundled_descriptions_state_the_reference_signature(bundled):
    for t in bundled[0] + bundled[1]:
        m = SIGNATURE.search(t.description)
        assert m, f"{t.task_id}: description states no signature"
        name, params = m.group(1), [p.strip() for p in m.group(2).split(",") if p.strip()]
        defs = {f.name: f for f in ast.parse(t.hidden).body if isinstance(f, ast.FunctionDef)}
        assert name in defs, f"{t.task_id}: {name} is not defined by the reference"
        assert [a.arg for a in defs[name].args.args] == params, t.task_id
        assert len(t.tests) == 10 and len(set(t.tests)) == 10, t.task_id
        assert all(name in call for call in t.tests), t.task_id
        assert len(t.hidden.splitlines()) <= 50, t.task_id


def test_bundled_tasks_need_imports_helpers_and_recursion(bundled):
    """The reference ColBench harness cannot run these (it execs in a function's locals)."""
    n_import = n_helper = n_recursive = 0
    for t in bundled[0] + bundled[1]:
        tree = ast.parse(t.hidden)
        n_import += any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body)
        n_helper += sum(isinstance(n, ast.FunctionDef) for n in tree.body) >= 2
        n_recursive += any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == f.name
            for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
            for c in ast.walk(f)
        )
    assert n_import >= 8 and n_helper >= 6 and n_recursive >= 5, (n_import, n_helper, n_recursive)


def test_every_bundled_reference_runs_twice_deterministically(bundled):
    """Each reference, in the real sandbox, twice: succeeds, never None, same values."""
    train, test = bundled
    assert validate_references(train + test) == {}


# Plausible answers a model might give without asking the human: each must lose tests.
NAIVE_ANSWERS = {
    "split_bill": "def split_bill(amounts, tip_rate, people):\n    return round(sum(amounts) * (1 + tip_rate) / people, 2)\n",
    "late_fee": "def late_fee(days_late, item_type):\n"
                "    rate = {'book': 0.25, 'dvd': 1.0}.get(item_type, 0.5)\n    return round(days_late * rate, 2)\n",
    "spiral_order": "def spiral_order(matrix):\n    out = []\n    m = [list(r) for r in matrix]\n"
                    "    while m and m[0]:\n        out += m.pop(0)\n        m = [list(r) for r in zip(*m)][::-1]\n    return out\n",
    "income_tax": "def income_tax(income):\n    if income <= 10000:\n        return 0\n    if income <= 40000:\n"
                  "        return (income - 10000) * 0.1\n    return 3000 + (income - 40000) * 0.2\n",
    "sort_versions": "def sort_versions(versions):\n    return sorted(versions)\n",
}


def test_tests_discriminate_naive_answers(bundled):
    by_name = {SIGNATURE.search(t.description).group(1): t for t in bundled[0] + bundled[1]}
    tasks = [by_name[name] for name in NAIVE_ANSWERS]
    jobs = [(t.hidden, list(t.tests)) for t in tasks] + [(NAIVE_ANSWERS[n], list(by_name[n].tests)) for n in NAIVE_ANSWERS]
    with SandboxPool(workers=2) as pool:
        results = pool.run_many(jobs)
    refs, naive = results[: len(tasks)], results[len(tasks):]
    for t, ref, got in zip(tasks, refs, naive):
        passed = sum(g.ok and values_equal(r.value, g.value) for r, g in zip(ref, got))
        assert 1 <= passed <= 7, f"{t.task_id}: a naive answer passes {passed}/10"


# ------------------------------------------------------------------ official formats


def test_official_rows_without_task_id_get_stable_hash_ids():
    tasks = load_tasks(str(OFFICIAL))
    assert len(tasks) == 3
    row = json.loads(OFFICIAL.read_text().splitlines()[0])
    want = "backend-" + hashlib.sha1((row["problem_description"] + row["ground_truth"]).encode()).hexdigest()[:12]
    assert tasks[0].task_id == want == stable_task_id("backend", row["problem_description"], row["ground_truth"])
    assert [t.task_id for t in load_tasks(str(OFFICIAL), validate=False)] == [t.task_id for t in tasks]
    assert tasks[0].tests == tuple(row["test_cases"].values())
    assert tasks[0].description == row["problem_description"] and tasks[0].hidden == row["ground_truth"]
    assert tasks[0].meta["where"] == f"{OFFICIAL}:1"


def test_limit_reads_the_first_rows():
    assert [t.meta["index"] for t in load_tasks(str(OFFICIAL), limit=2, validate=False)] == [0, 1]


def test_parquet_and_json_round_trip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in OFFICIAL.read_text().splitlines()]
    # a row with fewer tests: parquet unifies struct fields, absent tests come back as None
    rows.append({"problem_description": "short. The signature of the function is: def two(x)",
                 "ground_truth": "def two(x):\n    return 2 * x\n", "test_cases": {"test1": "two(1)", "test2": "two(5)"}})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    from_parquet = load_tasks(str(tmp_path / "rows.parquet"))
    from_json = load_tasks(str(tmp_path / "rows.json"), validate=False)
    expected = load_tasks(str(OFFICIAL), validate=False)
    for loaded in (from_parquet, from_json):
        assert [(t.task_id, t.description, t.hidden, t.tests) for t in loaded[:3]] == [
            (t.task_id, t.description, t.hidden, t.tests) for t in expected
        ]
        assert loaded[3].tests == ("two(1)", "two(5)")


def test_write_tasks_jsonl_round_trip(tmp_path, bundled):
    out = tmp_path / "sub" / "tasks.jsonl"
    write_tasks_jsonl(bundled[1], out)
    again = load_tasks(str(out), validate=False)
    assert [(t.task_id, t.description, t.hidden, t.tests) for t in again] == [
        (t.task_id, t.description, t.hidden, t.tests) for t in bundled[1]
    ]


def test_frontend_rows_keep_html_and_have_no_tests(tmp_path):
    path = tmp_path / "front.jsonl"
    path.write_text(json.dumps({"problem_description": "A bakery landing page", "ground_truth": "<html><body>Hi</body></html>"}) + "\n")
    (task,) = load_tasks(str(path), env="frontend")
    assert task.env == "frontend" and task.tests == () and task.hidden.startswith("<html>")
    assert task.task_id.startswith("frontend-")


def test_bundled_frontend_sets_load():
    if not (TASKS_DIR / "frontend" / "train.jsonl").exists():
        pytest.skip("frontend task files not written yet")
    pages = load_tasks("builtin:train", env="frontend")
    assert pages and all(t.env == "frontend" and t.tests == () and "<" in t.hidden for t in pages)


# ------------------------------------------------------------------ bad input


def test_malformed_rows_raise_naming_file_line_and_field():
    with pytest.raises(TaskFormatError) as exc:
        load_tasks(str(MALFORMED), on_error="raise")
    msg = str(exc.value)
    assert f"{MALFORMED}:2: invalid JSON" in msg
    assert f"{MALFORMED}:3: missing field 'ground_truth'" in msg
    assert f"{MALFORMED}:4: field 'test_cases': expected a dict of call strings, got list" in msg
    assert f"{MALFORMED}:5: field 'test_cases.test2'" in msg
    assert [where for where, _ in exc.value.problems] == [f"{MALFORMED}:{n}" for n in (2, 3, 4, 5)]


def test_malformed_rows_skip_reports_each_and_a_summary(caplog):
    with caplog.at_level(logging.WARNING, logger="colbench.tasks"):
        tasks = load_tasks(str(MALFORMED), on_error="skip")
    assert [t.meta["where"] for t in tasks] == [f"{MALFORMED}:1", f"{MALFORMED}:6"]
    warnings = [r.getMessage() for r in caplog.records]
    for n in (2, 3, 4, 5):
        assert any(w.startswith(f"{MALFORMED}:{n}: ") for w in warnings), n
    assert any("skipped 4 of 6 rows" in w for w in warnings)


def test_bad_references_are_caught_with_reasons(caplog):
    with caplog.at_level(logging.WARNING, logger="colbench.tasks"):
        tasks = load_tasks(str(BAD_REFS), on_error="skip")
    assert [t.hidden.split("(")[0] for t in tasks] == ["def ok"]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{BAD_REFS}:2: reference failed on test 2 `boom(0)`: ZeroDivisionError" in text
    assert f"{BAD_REFS}:3: reference returned None on test 2 `quiet(1)`" in text
    assert f"{BAD_REFS}:4: reference is nondeterministic on test 1 `dice(3)`" in text
    assert f"{BAD_REFS}:5: ground_truth does not parse" in text
    with pytest.raises(TaskFormatError) as exc:
        load_tasks(str(BAD_REFS), on_error="raise")
    assert [w for w, _ in exc.value.problems] == [f"{BAD_REFS}:{n}" for n in (2, 3, 4, 5)]


def test_duplicate_task_ids_are_errors(tmp_path):
    line = OFFICIAL.read_text().splitlines()[0]
    path = tmp_path / "dup.jsonl"
    path.write_text(line + "\n" + line + "\n")
    with pytest.raises(TaskFormatError, match=r"dup.jsonl:2: duplicate task_id .* \(first at .*dup.jsonl:1\)"):
        load_tasks(str(path), validate=False, on_error="raise")
    assert len(load_tasks(str(path), validate=False, on_error="skip")) == 1
    with pytest.raises(ValueError, match="duplicate task_id"):
        tasks_by_id(load_tasks(str(OFFICIAL), validate=False) * 2)


def test_bad_sources_and_arguments(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tasks(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="unsupported file type"):
        (tmp_path / "x.csv").write_text("a,b\n")
        load_tasks(str(tmp_path / "x.csv"))
    with pytest.raises(ValueError, match="conflicts"):
        load_tasks("builtin:train", split="test")
    with pytest.raises(ValueError, match="on_error"):
        load_tasks(str(OFFICIAL), on_error="ignore")


# ------------------------------------------------------------------ offline trajectories


def test_trajectories_load_into_episodes():
    episodes = load_trajectories(str(TRAJECTORIES))
    rows = [json.loads(line) for line in TRAJECTORIES.read_text().splitlines()]
    official = load_tasks(str(OFFICIAL), validate=False)
    first, second = episodes
    assert first.task_id == official[0].task_id and second.task_id == official[1].task_id
    assert (first.agent, first.seed, second.seed) == ("offline", 0, 1)
    assert first.episode_id == f"{official[0].task_id}/offline/0"
    # the opening task description is not a human turn
    assert [t.role for t in first.turns] == ["agent", "human", "agent"]
    history = rows[0]["dialogue_history"]
    assert first.turns[0].content == history[1]["output"]  # the raw generation, THOUGHT included
    assert first.turns[0].prompt == [{"role": "user", "content": history[1]["input"]}]
    assert first.turns[1].content == history[2]["content"] and first.turns[1].prompt is None
    assert first.answer == rows[0]["answer"]
    assert (first.reward, first.success, first.stop_reason) == (1.0, True, "answered")
    assert (second.reward, second.success) == (0.7, False)
    assert first.meta["task"]["hidden"] == official[0].hidden
    assert json.loads(first.dumps())["turns"][0]["content"] == history[1]["output"]


def test_bad_trajectory_rows_name_line_and_field(tmp_path):
    rows = TRAJECTORIES.read_text().splitlines()
    broken = json.loads(rows[0])
    broken["dialogue_history"][1]["role"] = "robot"
    path = tmp_path / "traj.jsonl"
    path.write_text("\n".join([rows[0], json.dumps({"task": broken["task"]}), json.dumps(broken)]) + "\n")
    with pytest.raises(TaskFormatError) as exc:
        load_trajectories(str(path), on_error="raise")
    assert f"{path}:2: field 'dialogue_history': expected a list of turns" in str(exc.value)
    assert f"{path}:3: field 'dialogue_history[1].role'" in str(exc.value)
    assert len(load_trajectories(str(path), on_error="skip")) == 1


def test_our_task_records_load_with_their_meta(tmp_path):
    from testbed.env import make_tasks

    tasks = make_tasks("train", n=3, bed="legacy")
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    loaded = load_tasks(str(path), env="testbed")
    assert [(t.task_id, t.hidden, t.tests, t.meta["a"], t.meta["b"]) for t in loaded] == [
        (t.task_id, t.hidden, t.tests, t.meta["a"], t.meta["b"]) for t in tasks]
    assert loaded[1].meta["where"] == f"{path}:2"
    with pytest.raises(TaskFormatError, match=r"tasks.jsonl:1: field 'env': the task is for 'testbed', not 'backend'"):
        load_tasks(str(path), env="backend", validate=False, on_error="raise")
    path.write_text(json.dumps({**tasks[0].to_json(), "tests": "f(1)"}) + "\n")
    with pytest.raises(TaskFormatError, match="tasks.jsonl:1: field 'tests': expected a list"):
        load_tasks(str(path), env="testbed", on_error="raise")
