"""Unusable task rows never stop the rest: every failure class in one file of our own rows
(bad JSON, a missing field, a reference that raises, returns None, or is nondeterministic),
run through the real loader, the real sandbox and the real evaluate CLI. Also the on-disk
validation cache (observed through the sandbox job count: a hit runs no sandbox), and the
scoring version of an old output folder (refused, or rescored with --rescore)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

import colbench.tasks as tasks_mod
from colbench.episodes import load_episodes, read_episodes
from colbench.evaluate import main
from colbench.envs.backend import BACKEND_SCORING_VERSION as SCORING_VERSION  # what backend episodes record
from colbench.tasks import TaskFormatError, is_usable, load_tasks, usable_tasks
from colbench.types import STOP_UNUSABLE

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED_TEST = ROOT.parent / "shared" / "data" / "colbench-test" / "backend_test.jsonl"


def _row(name: str, source: str, calls: list[str]) -> str:
    return json.dumps({"problem_description": f"{name}. The signature of the function is: def {name}(x)",
                       "ground_truth": source, "test_cases": {f"test{i}": c for i, c in enumerate(calls, 1)}})


GOOD_1 = _row("double", "def double(x):\n    return 2 * x\n", ["double(1)", "double(-3)", "double(10)"])
GOOD_2 = _row("shout", "def shout(x):\n    return x.upper() + '!'\n", ["shout('a')", "shout('hey')"])
RAISES = _row("invert", "def invert(x):\n    return 1 / x\n", ["invert(2)", "invert(0)"])
NONE = _row("maybe", "def maybe(x):\n    if x > 0:\n        return x\n", ["maybe(1)", "maybe(-1)"])
NONDETERMINISTIC = _row("noisy", "import random\nimport time\n\n\ndef noisy(x):\n    random.seed(time.time_ns())\n"
                                 "    return x + random.random()\n", ["noisy(1)", "noisy(2)"])
# line: content (1-based, as reported)
ROWS = {1: GOOD_1, 2: "{this is not json", 3: json.dumps({"problem_description": "no reference",
                                                          "test_cases": {"test1": "f(1)"}}),
        4: RAISES, 5: NONE, 6: NONDETERMINISTIC, 7: GOOD_2}
REASONS = {2: "invalid JSON", 3: "missing field 'ground_truth'", 4: "reference failed on test 2 `invert(0)`",
           5: "reference returned None on test 2 `maybe(-1)`", 6: "reference is nondeterministic on test 1 `noisy(1)`"}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh validation cache folder for this test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SWEET_COLBENCH_CACHE", str(folder))
    return folder


@pytest.fixture
def mixed(tmp_path) -> Path:
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(ROWS[n] + "\n" for n in sorted(ROWS)))
    return path


def _jobs() -> int:
    return tasks_mod.VALIDATION_STATS["sandbox_jobs"]


def test_lenient_load_keeps_every_row_in_order_and_flags_the_unusable(mixed, cache, caplog):
    with caplog.at_level(logging.WARNING, logger="colbench.tasks"):
        tasks = load_tasks(str(mixed))
    assert [t.meta["where"] for t in tasks] == [f"{mixed}:{n}" for n in sorted(ROWS)]
    assert [n for n, t in zip(sorted(ROWS), tasks) if is_usable(t)] == [1, 7]
    for n, t in zip(sorted(ROWS), tasks):
        if n in REASONS:
            assert t.meta["unusable"].startswith(REASONS[n]), (n, t.meta["unusable"])
    # a row that did not decode (or lacks the reference) gets a stable id from its location
    assert (tasks[1].task_id, tasks[2].task_id) == ("backend-row2", "backend-row3")
    assert tasks[1].tests == () and tasks[1].hidden == ""
    # one warning line, not one per row
    lines = [r.getMessage() for r in caplog.records if r.name == "colbench.tasks"]
    assert len(lines) == 1 and lines[0].startswith(f"5 of 7 rows from {mixed} are unusable")
    # "skip" keeps only the good ones
    assert [t.meta["where"] for t in load_tasks(str(mixed), on_error="skip")] == [f"{mixed}:1", f"{mixed}:7"]


def test_strict_raises_one_error_naming_each_row(mixed, cache):
    with pytest.raises(TaskFormatError) as exc:
        load_tasks(str(mixed), on_error="raise")
    assert [w for w, _ in exc.value.problems] == [f"{mixed}:{n}" for n in sorted(REASONS)]
    lines = str(exc.value).splitlines()
    assert len(lines) == 5
    for line, n in zip(lines, sorted(REASONS)):
        assert line.startswith(f"{mixed}:{n}: {REASONS[n]}"), line


def test_evaluate_runs_the_good_rows_counts_all_and_names_the_bad(mixed, cache, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--env", "backend", "--agent", "reference", "--tasks", str(mixed), "--output", str(out),
                 "--progress", "false"]) == 0
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert (row["n_tasks"], row["n_episodes"], row["n_unusable_tasks"]) == (7, 7, 5)
    assert row["metrics"]["success_rate"]["value"] == pytest.approx(2 / 7)  # usable / total, visibly
    assert row["scoring_version"] == SCORING_VERSION
    assert [u["where"] for u in row["unusable_tasks"]] == [f"{mixed}:{n}" for n in sorted(REASONS)]
    md, html = (out / "leaderboard.md").read_text(), (out / "report.html").read_text()
    assert "Unusable tasks: 5 of 7" in md and "best possible success is 28.6%" in md
    for n in REASONS:
        assert f"- {mixed}:{n} (" in md and f"{mixed}:{n}" in html
    assert f"Scoring version {SCORING_VERSION}." in md
    episodes = read_episodes(out / "episodes" / "reference.jsonl")
    placeholders = [ep for ep in episodes if ep.stop_reason == STOP_UNUSABLE]
    assert len(episodes) == 7 and len(placeholders) == 5
    assert all(ep.reward == 0 and ep.turns == [] and ep.meta["where"].startswith(str(mixed)) for ep in placeholders)
    assert all(ep.meta["scoring_version"] == SCORING_VERSION for ep in episodes)
    # behaviour is measured on the played episodes; the placeholders show in the stop reasons only
    assert row["behaviour"]["stop_reasons"] == {"answered": 2, STOP_UNUSABLE: 5}
    assert row["behaviour"]["mean_turns"] == 1.0 and row["behaviour"]["scoring_errors"] == 0
    # the strict flag stops before any episode, one line naming every row
    capsys.readouterr()
    assert main(["--env", "backend", "--agent", "reference", "--tasks", str(mixed), "--output",
                 str(tmp_path / "strict"), "--strict-tasks"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(f"{mixed}:{n}: " in err for n in REASONS)
    assert not (tmp_path / "strict" / "episodes").exists()


def test_a_row_that_becomes_usable_is_played_on_rerun(tmp_path, cache):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD_1 + "\n" + RAISES + "\n")
    out = tmp_path / "run"
    args = ["--env", "backend", "--agent", "reference", "--tasks", str(path), "--output", str(out), "--progress", "false"]
    assert main(args) == 0
    assert json.loads((out / "leaderboard.json").read_text())[0]["n_unusable_tasks"] == 1
    # the same task (same id) with a reference fixed in place, e.g. by new scoring rules
    fixed = json.loads(RAISES)
    fixed["task_id"] = load_tasks(str(path))[1].task_id
    fixed["ground_truth"] = "def invert(x):\n    return 1 / x if x else 0.0\n"
    path.write_text(GOOD_1 + "\n" + json.dumps(fixed) + "\n")
    assert main(args) == 0
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["n_unusable_tasks"] == 0 and row["metrics"]["success_rate"]["value"] == 1.0
    assert [ep.stop_reason for ep in read_episodes(out / "episodes" / "reference.jsonl")] == ["answered"] * 2


def test_second_load_hits_the_disk_cache_and_runs_no_sandbox(mixed, cache, caplog):
    before = _jobs()
    first = load_tasks(str(mixed))
    assert _jobs() - before == 5 * 2  # 5 rows with a reference, each run twice
    entries = sorted(cache.glob("validation/*/*.json"))
    assert len(entries) == 5
    before = _jobs()
    again = load_tasks(str(mixed))
    assert _jobs() == before  # no sandbox at all
    assert [t.meta.get("unusable") for t in again] == [t.meta.get("unusable") for t in first]
    # a corrupt entry is recomputed (one warning), and rewritten
    entries[0].write_text("{torn")
    tasks_mod._ValidationCache.warned.discard("corrupt")
    before = _jobs()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="colbench.tasks"):
        load_tasks(str(mixed))
    assert _jobs() - before == 2
    assert sum("validation cache: unreadable entry" in r.getMessage() for r in caplog.records) == 1
    assert set(json.loads(entries[0].read_text())) == {"reason", "task_id"}  # rewritten whole
    assert len(list(cache.glob("validation/*/.*.tmp"))) == 0  # atomic writes leave no temp file


def test_transient_outcomes_are_never_cached(tmp_path, cache):
    path = tmp_path / "slow.jsonl"
    path.write_text(_row("spin", "def spin(x):\n    while True:\n        pass\n", ["spin(1)"]) + "\n")
    [task] = load_tasks(str(path))
    assert "TimeoutError" in task.meta["unusable"]
    assert not list(cache.glob("validation/*/*.json"))
    before = _jobs()
    load_tasks(str(path))
    assert _jobs() - before == 2  # computed again


def test_cache_key_covers_the_scoring_version(mixed, cache, monkeypatch):
    load_tasks(str(mixed))
    import colbench.scoring.backend as backend

    monkeypatch.setattr(backend, "SCORING_VERSION", backend.SCORING_VERSION + 1)
    before = _jobs()
    load_tasks(str(mixed))
    assert _jobs() - before == 10  # other rules: every verdict recomputed


def test_training_skips_unusable_tasks_with_one_warning_and_a_list(mixed, cache, tmp_path, caplog):
    tasks = load_tasks(str(mixed))
    listed = tmp_path / "unusable.jsonl"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="colbench.tasks"):
        kept = usable_tasks(tasks, source=str(mixed), list_path=listed)
    assert [t.meta["where"] for t in kept] == [f"{mixed}:1", f"{mixed}:7"]
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"skipping 5 unusable of 7 tasks from {mixed}") and str(listed) in line
    assert [json.loads(x)["where"] for x in listed.read_text().splitlines()] == [f"{mixed}:{n}" for n in sorted(REASONS)]
    # stage 1/2's reader of training-time information: the same loader, the same cache
    from sweet.critic.model import load_training_info

    before, unusable = _jobs(), set()
    info = load_training_info(str(mixed), "backend", unusable=unusable)
    assert _jobs() == before and set(info) == {t.task_id for t in kept} and len(unusable) == 5
    # an evaluation's placeholder episodes are dropped by the trainers' episode reader
    out = tmp_path / "run"
    assert main(["--env", "backend", "--agent", "reference", "--tasks", str(mixed), "--output", str(out),
                 "--progress", "false"]) == 0
    with pytest.warns(UserWarning, match="skipping 5 of 7 episodes of unusable tasks"):
        eps = load_episodes(out / "episodes" / "reference.jsonl", usable_only=True)
    assert len(eps) == 2


def test_an_old_folder_is_refused_or_rescored(tmp_path, cache, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD_1 + "\n" + GOOD_2 + "\n")
    out = tmp_path / "run"
    args = ["--env", "backend", "--agent", "reference", "--tasks", str(path), "--output", str(out), "--progress", "false"]
    assert main(args) == 0
    # make it a folder of the previous rules: version N-1, with a score the new rules would not give
    file = out / "episodes" / "reference.jsonl"
    rows = [json.loads(x) for x in file.read_text().splitlines()]
    for r in rows:
        r["meta"]["scoring_version"] = SCORING_VERSION - 1
        r["score"]["reward"], r["score"]["success"] = 0.5, False
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(out) in err and f"version {SCORING_VERSION - 1}" in err and f"version {SCORING_VERSION}" in err
    assert "--rescore" in err
    assert [json.loads(x)["score"]["reward"] for x in file.read_text().splitlines()] == [0.5, 0.5]  # untouched
    # --rescore: the stored answers are scored again under the current rules, nothing is replayed
    assert main([*args, "--rescore"]) == 0
    episodes = read_episodes(file)
    assert [(ep.reward, ep.meta["scoring_version"]) for ep in episodes] == [(1.0, SCORING_VERSION)] * 2
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["scoring_version"] == SCORING_VERSION and row["metrics"]["success_rate"]["value"] == 1.0
    assert "rescored 2 stored answers" in capsys.readouterr().err


@pytest.mark.slow
def test_published_test_split_reference_scores_one(tmp_path):
    """The paper's 1,000 test rows: the run no longer stops, every row counts, and the
    reference solves every one. Needs the sandbox's libraries (numpy, bs4) and the scoring
    rules of SCORING_VERSION 2 (seeding, structural comparison of datetimes and types):
    before those, rows 119, 208, 212, 215, 265, 742 and 840 are unusable (success 0.993),
    and the assertion message names each."""
    if not PUBLISHED_TEST.exists():
        pytest.skip(f"{PUBLISHED_TEST} is absent")
    out = tmp_path / "real"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "colbench.evaluate", "--env", "backend", "--agent", "reference",
                           "--tasks", str(PUBLISHED_TEST), "--output", str(out), "--progress", "false"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["n_tasks"] == 1000, row["n_tasks"]
    assert row["metrics"]["success_rate"]["value"] == 1.0, (
        f"{row['n_unusable_tasks']} unusable: " + "; ".join(f"{u['where']}: {u['reason']}"
                                                            for u in row["unusable_tasks"])
        + f" ({time.time() - t0:.0f} s)")


def test_hf_source_is_read_line_by_line_like_a_file(mixed, cache, monkeypatch):
    """The published data: the hub download is replaced by our own file (no network here);
    the rest (reading, validation, the unusable rows' names) is the real loader."""
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo_id, filename, repo_type: asked.append((repo_id, filename, repo_type)) or str(mixed))
    tasks = load_tasks("hf:facebook/collaborative_agent_bench[test]")
    assert asked == [("facebook/collaborative_agent_bench", "backend_tasks/test.jsonl", "dataset")]
    name = "hf:facebook/collaborative_agent_bench/backend_tasks/test.jsonl"
    assert [t.meta["where"] for t in tasks] == [f"{name}:{n}" for n in sorted(ROWS)]
    assert [t.meta["split"] for t in tasks] == ["test"] * 7
    assert sum(not is_usable(t) for t in tasks) == 5
