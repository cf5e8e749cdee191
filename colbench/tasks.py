"""Load ColBench tasks and the published offline trajectories.

Sources (the `source` argument):

    path/to/rows.jsonl | .json | .parquet   a local file in the official row format
    builtin:train | builtin:test            the sets bundled in tasks/<env>/ (see tasks/README.md)
    builtin:<bed>/train | .../test          env testbed only: a preset of testbed/bed.py
                                            (default, long, legacy); builtin:train is the
                                            preset `default` (testbed.bed.DEFAULT_BED)
    hf:facebook/collaborative_agent_bench   the published data (downloads; online users only);
                                            append [train] or [test] to pick the split
    hf:HuggingFaceM4/WebSight[train|test]   frontend tasks as the paper builds them (streams;
                                            online users only), see "Frontend source" below

Any source takes a row range last, Python's slice of its rows: `rows.jsonl[200:1000]`,
`hf:facebook/collaborative_agent_bench[test][0:200]`, `builtin:train[:8]`. Rows keep their
place in the source (file:line, row numbers); a range replaces the default first-1,000-rows
limit of the published test split, and `limit` then counts from the range's start.

Official backend row (one JSON object per line):

    {"problem_description": "... The signature of the function is: def f(a, b)",
     "ground_truth": "def f(a, b):\\n    ...",              # hidden reference source
     "test_cases": {"test1": "f(1, 2)", ..., "test10": "f(0, 0)"},
     "task_id": "backend-train-0001"}                       # optional, ours

Our own Task records (`Task.to_json()` rows: task_id, env, description, hidden, tests,
meta), which trainers and tests write, load too, keeping their meta.

Frontend source: the published ColBench data holds no frontend tasks; the paper builds them
from WebSight v0.2 (`HuggingFaceM4/WebSight`, config "v0.2"): its first 20,000 rows, rows
0-9,999 the train split and 10,000-19,999 the test split; `llm_generated_idea` is the
description and `text`, with its image URLs mapped (`websight_target_html`), the target
HTML. The paper evaluates the first 500 test tasks (the default for [test]; 100 for quick
runs: limit=100). Only the rows read are streamed, never the whole set.

Frontend rows carry the target HTML as `ground_truth` and no tests. Rows without a
`task_id` get `"<env>-" + sha1(problem_description + ground_truth)[:12]`, stable across
files and machines.

Validation (backend, `validate=True`) runs every reference on all its tests twice in
the sandbox (never in this process). A reference must succeed, return a non-None
value on every test and return the same values both times; otherwise its expected
outputs are meaningless and the task is reported. Every problem names the file, the
line (row number for .json/.parquet/hf sources) and the field or the reason.

Target check (frontend, `validate=True`, `check_targets`): each target page is rendered once,
as scoring renders it, with a generous timeout (TARGET_TIMEOUT_S, so load never fails a good
page) and a second try after a failure; a page that is empty, does not render, or renders
blank (one colour) is unusable, as the published `filter_websites.py` drops pages that do
not render. Verdicts share the validation cache below (keyed by the page and the check's
fingerprint: its version, the chromium build, the render settings).

Unusable rows (`on_error`, the same for every source):

    "keep"  (default) an unusable row never stops the others: it becomes a task flagged
            `meta["unusable"] = reason` (with `meta["where"] = "file:line"`), kept in
            place so the denominator stays the source's row count (1,000 for the paper's
            test set). The runner (colbench.episodes) scores it 0 for every agent without
            running the agent or the simulator, with stop reason "unusable_task"; the
            leaderboard counts and names these rows. A row that did not even decode, or
            lacks a field, becomes a placeholder (no reference, no tests) whose id is its
            own `task_id` when it has a usable one, else "<env>-row<N>" (its row number:
            stable from its location); a reference that fails validation keeps its task
            (and id) with the flag. One warning line says how many and the first reason.
    "skip"  drop unusable rows (each logged, then a summary): what trainers want, see
            `usable_tasks`, which also writes the list of skipped rows.
    "raise" one TaskFormatError, one line per unusable row ("file:line: reason").

Validation cache: a reference's verdict is stored on disk, keyed by the reference source
and its tests, the scoring rules (`SCORING_VERSION`, which covers the sandbox's seeding),
the sandbox's libraries (`sandbox_libraries()`), its limits, the number of runs and the
Python version, so a second load of the same rows (by any entry point) runs no sandbox.
Location: $SWEET_COLBENCH_CACHE, else $XDG_CACHE_HOME/sweet-colbench, else
~/.cache/sweet-colbench (`SWEET_COLBENCH_CACHE=off` disables it); entries under
validation/<2 hex>/<sha256>.json, each written atomically (concurrent loaders are safe).
A corrupt entry is recomputed with one warning; transient outcomes (a timeout, a crashed
sandbox) are never cached. Loading shows progress bars (reading rows, validating) when
it takes more than a couple of seconds.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import os
import platform
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from colbench.io import DiskFull, atomic_write, free_space
from colbench.protocols import ANSWER_MARKER
from colbench.types import STOP_ANSWERED, STOP_TURN_LIMIT, Episode, Score, Task, Turn

log = logging.getLogger(__name__)

TASKS_DIR = Path(__file__).resolve().parent.parent / "tasks"
HF_DATASET_ID = "facebook/collaborative_agent_bench"
# Files of the published dataset (https://huggingface.co/datasets/facebook/collaborative_agent_bench).
HF_TASK_FILES = {"train": "backend_tasks/train.jsonl", "test": "backend_tasks/test.jsonl"}
HF_TRAJECTORY_FILE = "colbench_code_offline_15k_llama8b.jsonl"
PAPER_TEST_SIZE = 1000  # the paper evaluates on the first 1,000 rows of the test file
# Frontend tasks (module docstring, "Frontend source"): WebSight v0.2's first 20,000 rows.
WEBSIGHT_ID = "HuggingFaceM4/WebSight"
WEBSIGHT_CONFIG = "v0.2"
WEBSIGHT_SPLITS = {"train": (0, 10_000), "test": (10_000, 20_000)}  # [start, stop) row numbers
PAPER_FRONTEND_TEST_SIZE = 500  # the paper's frontend test set: the first 500 test tasks
VALIDATION_CHUNK = 256  # tasks per sandbox batch (progress bar granularity)
MAX_LISTED_PROBLEMS = 10
UNUSABLE = "unusable"  # Task.meta key: why the row cannot be used (absent: usable)
ON_ERROR = ("keep", "skip", "raise")
VALIDATION_RUNS = 2  # each reference runs twice; the two runs must agree
CACHE_ENV = "SWEET_COLBENCH_CACHE"
PROGRESS_DELAY_S = 2.0  # a progress bar appears only when loading takes longer than this
# Sandbox errors that may be the machine's load, not the reference: never cached.
TRANSIENT_ERRORS = ("TimeoutError", "sandbox crashed")


class TaskFormatError(ValueError):
    """Rows that cannot be used. `problems` holds (where, reason) pairs, where = "file:line"."""

    def __init__(self, problems: Sequence[tuple[str, str]]):
        self.problems = list(problems)
        lines = [f"{where}: {reason}" for where, reason in self.problems[:MAX_LISTED_PROBLEMS]]
        if len(self.problems) > MAX_LISTED_PROBLEMS:
            lines.append(f"... and {len(self.problems) - MAX_LISTED_PROBLEMS} more")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class _Row:
    where: str  # "file:line" for messages
    index: int  # 0-based position in the source
    data: Any  # the decoded row, or None when it did not decode
    error: str | None = None  # why it did not decode
    columnar: bool = False  # parquet/HF rows: absent struct fields read back as None


# Generated task sources: `builtin:...` of these environments is made, not read from
# tasks/<env>/. "module:function" loaded on use (colbench.registry), called as
# function(source, split, limit) -> list[Task]; the test bed's is testbed/env.py's.
GENERATED_SOURCES: dict[str, str] = {"testbed": "testbed.env:builtin_tasks",
                                     "appworld": "colbench.envs.appworld:builtin_tasks"}


# ------------------------------------------------------------------------------ public API


def load_tasks(
    source: str,
    env: str = "backend",
    *,
    split: str | None = None,
    limit: int | None = None,
    on_error: str = "keep",
    validate: bool = True,
    progress: bool | None = None,
) -> list[Task]:
    """Load tasks from a local file, a bundled set or the published dataset.

    split:    for "builtin"/"hf:" sources, which split ("train" or "test"); recorded in
              `Task.meta["split"]` for local files.
    limit:    read only the first `limit` rows of the source (the paper's test set is
              the first 1,000 rows, applied by default for the published test split).
    on_error: what an unusable row (bad JSON, a missing or wrong field, a duplicate id,
              a reference that fails validation) does, see the module docstring:
              "keep"  -> (default) one task per row, the unusable ones flagged
                         `meta["unusable"]` (reason) and `meta["where"]` (file:line), in
                         source order; one warning line;
              "skip"  -> log each unusable row as a warning, then a summary, and drop it;
              "raise" -> one TaskFormatError listing every unusable row (file:line: reason).
    validate: backend: run each reference twice on its tests in the sandbox; frontend:
              render each target page (`check_targets`). Verdicts are cached on disk, see
              `validation_cache_dir`.
    progress: show progress bars (None: when loading takes over PROGRESS_DELAY_S seconds).
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, got {on_error!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    named, (source, (start, stop)) = source, split_row_range(source)
    if env in GENERATED_SOURCES and source.startswith("builtin:"):
        # the CPU test bed's tasks are generated, not stored (testbed/env.py)
        from colbench.registry import load_target

        read = None if stop is None and limit is None else (stop if limit is None else start + limit)
        return load_target(GENERATED_SOURCES[env])(source, split, read)[start:stop]
    read = stop if limit is None else (start + limit if stop is None else min(stop, start + limit))
    ranged = start > 0 or stop is not None
    rows, split = _task_rows(source, env, split, read, ranged=ranged)
    if ranged:
        rows = _rows_from(rows, start, named)
    tasks: list[Task] = []
    for row in _progress(rows, progress, "reading tasks", "row"):
        try:
            tasks.append(_row_to_task(row, env, split))
        except _RowProblem as p:
            tasks.append(_placeholder(row, env, split, str(p)))
    tasks = _flag_duplicates(tasks)
    if validate and env in HIDDEN_CHECKS:
        usable = [t for t in tasks if is_usable(t)]
        bad = check_hidden(usable, env, progress=progress) if usable else {}
        tasks = [mark_unusable(t, bad[t.task_id]) if is_usable(t) and t.task_id in bad else t for t in tasks]
    problems = [(t.meta["where"], t.meta[UNUSABLE]) for t in tasks if not is_usable(t)]
    _handle_problems(problems, on_error, source, len(tasks))
    return [t for t in tasks if is_usable(t)] if on_error == "skip" else tasks


_RANGE = re.compile(r"\[([^\[\]:]*):([^\[\]:]*)\]$")


def split_row_range(source: str) -> tuple[str, tuple[int, int | None]]:
    """`source` without its trailing row range `[start:stop]`, and the range ((0, None): all
    rows). Bounds are non-negative integers, either may be left out, start <= stop; anything
    else is a ValueError naming the source. A path that exists as written is never split."""
    match = _RANGE.search(source)
    if match is None or (Path(source).exists() and not source.startswith(("hf:", "builtin"))):
        return source, (0, None)
    bounds = []
    for text in match.groups():
        text = text.strip()
        if text and not text.isdigit():
            raise ValueError(f"task source {source!r}: bad row range {match.group(0)!r}: expected [start:stop] "
                             "with non-negative integers (either may be left out), e.g. [200:1000]")
        bounds.append(int(text) if text else None)
    start, stop = bounds[0] or 0, bounds[1]
    if stop is not None and stop <= start:
        raise ValueError(f"task source {source!r}: row range {match.group(0)!r} selects no rows (stop must exceed start)")
    return source[:match.start()], (start, stop)


def _rows_from(rows: Iterator[_Row], start: int, source: str) -> Iterator[_Row]:
    """The rows from `start` on; a range that starts past the source's end is an error."""
    seen = 0
    for row in rows:
        seen += 1
        if row.index >= start:
            yield row
    if seen <= start:
        raise ValueError(f"task source {source!r}: row range starts at row {start}, but the source has {seen} rows")


def is_usable(task: Task) -> bool:
    """Whether a task can be played and scored (False: `meta["unusable"]` says why)."""
    return not task.meta.get(UNUSABLE)


def mark_unusable(task: Task, reason: str) -> Task:
    """A copy of `task` flagged unusable with `reason` (kept in the denominator, scored 0)."""
    return dataclasses.replace(task, meta={**task.meta, UNUSABLE: reason})


def unusable_rows(tasks: Iterable[Task]) -> list[dict[str, str]]:
    """[{"task_id", "where", "reason"}] of the unusable tasks, in order: what reports list."""
    return [{"task_id": t.task_id, "where": str(t.meta.get("where", "")), "reason": t.meta[UNUSABLE]}
            for t in tasks if not is_usable(t)]


def usable_tasks(tasks: Sequence[Task], *, source: str, list_path: str | Path | None = None) -> list[Task]:
    """The usable tasks (what trainers learn from: an unusable task has no reference to
    learn from). When some are not, their list (JSONL rows task_id, where, reason) is
    written to `list_path` (default: the cache folder's unusable/ list for `source`) and
    ONE warning line names how many and where the list is."""
    bad = unusable_rows(tasks)
    if not bad:
        return list(tasks)
    path = Path(list_path) if list_path is not None else _default_list_path(source)
    try:
        atomic_write(path, "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in bad))
        where = f"listed in {path}"
    except (OSError, DiskFull) as e:
        where = f"list not written ({path}: {_why_not_written(e)}); first: {bad[0]['where']}: {bad[0]['reason']}"
    log.warning("skipping %d unusable of %d tasks from %s (no usable reference to learn from); %s",
                len(bad), len(tasks), source, where)
    return [t for t in tasks if is_usable(t)]


def _why_not_written(e: OSError | DiskFull) -> str:
    """A cache list that could not be written, in a few words (the load goes on)."""
    if isinstance(e, DiskFull):
        return f"the disk is full, {free_space(e.path)}"
    return str(e.strerror or e)


def _default_list_path(source: str) -> Path:
    root = validation_cache_dir() or Path(tempfile.gettempdir()) / "sweet-colbench"
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(source.rstrip("]")).name)[:60]
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    return root / "unusable" / f"{name}-{digest}.jsonl"


def load_trajectories(
    source: str,
    env: str = "backend",
    *,
    limit: int | None = None,
    on_error: str = "skip",
    validate: bool = True,
    list_path: str | Path | None = None,
) -> list[Episode]:
    """Load published offline trajectories as scored Episodes.

    Published row: {"task": {problem_description, ground_truth, test_cases},
    "dialogue_history": [...], "answer": str, "reward": float}. In dialogue_history the
    first "user" message is the task description (the agent speaks first in ColBench,
    so it is not a human turn); "assistant" turns carry `input` (the full prompt the
    agent was given) and `output` (its raw generation); later "user" turns are the
    simulated human. The episode's agent is "offline", its seed the row index, and the
    task itself is kept in `meta["task"]` (the SWEET critic needs the hidden reference).

    The embedded tasks are read and validated as `load_tasks` does (same checks, same
    on-disk cache, backend only when `validate`). on_error: "skip" (default; "keep" is
    the same here: a trajectory of an unusable task has no reference to learn from) drops
    bad rows and the trajectories of unusable tasks with ONE warning line naming how
    many and the file listing them (`list_path`, default in the cache folder, see
    `usable_tasks`); "raise" -> one TaskFormatError naming every such row.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, got {on_error!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if source.startswith("hf:"):
        dataset_id = source[3:]
        rows = _hf_rows(dataset_id, HF_TRAJECTORY_FILE if dataset_id == HF_DATASET_ID else None, limit)
    else:
        rows = _file_rows(Path(source), limit)
    episodes: list[Episode] = []
    problems: list[tuple[str, str]] = []
    n_rows = 0
    for row in _progress(rows, None, "reading trajectories", "row"):
        n_rows += 1
        try:
            episodes.append(_row_to_episode(row, env))
        except _RowProblem as p:
            problems.append((row.where, str(p)))
    if validate and env in HIDDEN_CHECKS and episodes:
        first: dict[str, Task] = {}
        for ep in episodes:
            first.setdefault(ep.task_id, Task.from_json(ep.meta["task"]))
        bad = check_hidden(list(first.values()), env)
        problems += [(ep.meta["where"], f"task {ep.task_id}: {bad[ep.task_id]}") for ep in episodes
                     if ep.task_id in bad]
        episodes = [ep for ep in episodes if ep.task_id not in bad]
    if problems and on_error != "raise":
        problems.sort(key=lambda p: _where_key(p[0]))
        rows_out = [{"task_id": "", "where": w, "reason": r} for w, r in problems]
        path = Path(list_path) if list_path is not None else _default_list_path(source + "#trajectories")
        try:
            atomic_write(path, "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in rows_out))
            where = f"listed in {path}"
        except (OSError, DiskFull) as e:
            where = f"list not written ({path}: {_why_not_written(e)}); first: {problems[0][0]}: {problems[0][1]}"
        log.warning("skipping %d unusable of %d trajectories from %s; %s", len(problems), n_rows, source, where)
        return episodes
    _handle_problems(problems, on_error, source, n_rows)
    return episodes


def tasks_by_id(tasks: Iterable[Task]) -> dict[str, Task]:
    """Index tasks by id; a repeated id is an error (it would silently drop a task)."""
    out: dict[str, Task] = {}
    for t in tasks:
        if t.task_id in out:
            raise ValueError(f"duplicate task_id {t.task_id!r}")
        out[t.task_id] = t
    return out


def write_tasks_jsonl(tasks: Iterable[Task], path: str | Path) -> None:
    """Write tasks in the official row format (plus task_id); load_tasks reads them back."""
    atomic_write(path, "".join(json.dumps(task_to_row(t), ensure_ascii=False) + "\n" for t in tasks))


def task_to_row(task: Task) -> dict[str, Any]:
    """The official row for a task (test keys renumbered test1..testN)."""
    return {
        "task_id": task.task_id,
        "problem_description": task.description,
        "ground_truth": task.hidden,
        "test_cases": {f"test{i}": call for i, call in enumerate(task.tests, 1)},
    }


def stable_task_id(env: str, description: str, hidden: str) -> str:
    """The id of a row that has none: env + first 12 hex digits of sha1(description + hidden)."""
    digest = hashlib.sha1((description + hidden).encode("utf-8")).hexdigest()
    return f"{env}-{digest[:12]}"


def check_hidden(tasks: Sequence[Task], env: str, *, progress: bool | None = None) -> dict[str, str]:
    """{task_id: reason} of the tasks whose hidden information cannot be used: backend
    references that fail validation (`validate_references`), frontend targets that do not
    render (`check_targets`); {} for other environments."""
    if env == "backend":
        return validate_references(tasks, progress=progress)
    if env == "frontend":
        return check_targets(tasks, progress=progress)
    return {}


HIDDEN_CHECKS = ("backend", "frontend")  # environments whose loader checks the hidden information
TARGET_CHECK_VERSION = 1  # the target check's rules (part of its cache fingerprint)
TARGET_TIMEOUT_S = 60.0  # a target page's render budget (colbench.envs.frontend renders targets with it too)
TARGET_TRIES = 2  # a target that fails is rendered once more, in a fresh context, before it is unusable


def target_check_fingerprint() -> dict[str, Any]:
    """What, besides a target page, decides the target check's verdict: the check's rules, the
    chromium build, the render settings (colbench.envs.frontend's defaults)."""
    from colbench.scoring.render import chromium_path

    return {"check": "frontend-target", "version": TARGET_CHECK_VERSION, "chromium": _chromium_build(chromium_path()),
            "timeout_s": TARGET_TIMEOUT_S, "tries": TARGET_TRIES, "viewport": [1280, 800], "max_height": 8000}


def _chromium_build(path: str) -> str:
    """`chromium --version` (a cheap identity of the browser build; the path on failure)."""
    import subprocess

    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or path
    except (OSError, subprocess.SubprocessError):
        return path


def check_targets(tasks: Sequence[Task], *, progress: bool | None = None, cache: bool = True) -> dict[str, str]:
    """Render each frontend target page (as scoring does: colbench.scoring.render, offline)
    unless the on-disk cache holds its verdict. Returns {task_id: reason} for the pages that
    are empty, do not render within TARGET_TIMEOUT_S in TARGET_TRIES tries, or render blank
    (one colour). Verdicts are cached except a timeout or a crash (maybe the machine's
    load). Without a chromium the check is skipped with one warning (a trainer that never
    renders still loads its tasks; scoring would stop on the missing browser)."""
    from colbench.scoring.render import ChromiumNotFound

    try:
        fingerprint = target_check_fingerprint()
    except ChromiumNotFound as e:
        log.warning("frontend targets not checked: %s", e)
        return {}
    store = _ValidationCache.open(fingerprint) if cache else None
    bad: dict[str, str] = {}
    groups: dict[str, list[Task]] = {}  # one render per distinct page; copies share its verdict
    for t in tasks:
        groups.setdefault(t.hidden, []).append(t)
    pages = []
    for html, group in groups.items():
        hit = store.get(group[0]) if store is not None else None
        if hit is not None:
            reason = hit[0]
        elif not html.strip():
            reason = "the target page is empty"
            if store is not None:
                store.put(group[0], reason)
        else:
            pages.append(group)
            continue
        if reason:
            bad.update({t.task_id: reason for t in group})
    if pages:
        _render_targets(pages, bad, store, progress)
    return bad


def _render_targets(pages: Sequence[list[Task]], bad: dict[str, str], store: "_ValidationCache | None",
                    progress: bool | None) -> None:
    """Render each page (a group of tasks sharing one target) up to TARGET_TRIES times; record
    the verdicts in `bad` and the cache."""
    from colbench.scoring.render import RenderPool

    bar = _bar(len(pages), progress, "checking frontend targets", "page")
    pool = RenderPool(workers=2, timeout_s=TARGET_TIMEOUT_S)
    try:
        for i in range(0, len(pages), VALIDATION_CHUNK):
            chunk = pages[i : i + VALIDATION_CHUNK]
            reasons: list[str | None] = [None] * len(chunk)
            left = list(range(len(chunk)))
            for _ in range(TARGET_TRIES):
                TARGET_STATS["renders"] += len(left)
                results = pool.render([chunk[k][0].hidden for k in left])
                reasons_now = {k: _target_problem(r) for k, r in zip(left, results)}
                for k, reason in reasons_now.items():
                    reasons[k] = reason
                left = [k for k in left if reasons_now[k] is not None]
                if not left:
                    break
            for group, reason in zip(chunk, reasons):
                if reason:
                    for t in group:
                        bad[t.task_id] = reason
                if store is not None and not _transient_render(reason):
                    store.put(group[0], reason)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
        pool.close()


TARGET_STATS = {"renders": 0}  # target pages check_targets rendered (this process)


def _transient_render(reason: str | None) -> bool:
    """Whether a target's failure may be the machine's load, not the page (a timeout, a crashed
    or closed renderer): such verdicts are never cached."""
    text = (reason or "").lower()
    return "timed out" in text or "crash" in text or "closed" in text


def _target_problem(result: Any) -> str | None:
    """Why a target's RenderResult makes its task unusable, or None."""
    if not result.ok:
        return f"the target page does not render: {result.error}"
    lo, hi = zip(*result.image.getextrema())
    if lo == hi:
        return "the target page renders blank (one colour)"
    return None


def validate_references(tasks: Sequence[Task], workers: int | None = None, *,
                        progress: bool | None = None, cache: bool = True) -> dict[str, str]:
    """Run each backend reference twice on its tests in the sandbox (`workers` sandboxes
    at a time; default: one per CPU), unless the on-disk cache holds its verdict.

    Returns {task_id: reason} for the tasks whose reference does not parse, fails or
    returns None on some test, returns something that is not plain data, or returns
    different values on the two runs. Verdicts are cached (see the module docstring)
    except transient ones (a timeout or a crashed sandbox: maybe the machine's load).
    `VALIDATION_STATS["sandbox_jobs"]` counts the jobs sent to the sandbox pool.
    """
    bad: dict[str, str] = {}
    runnable = []
    same: dict[tuple[str, tuple[str, ...]], list[Task]] = {}  # one run per distinct (reference, tests)
    store = _ValidationCache.open() if cache else None
    for t in tasks:
        content = (t.hidden, tuple(t.tests))
        if content in same:
            same[content].append(t)
            continue
        same[content] = [t]
        hit = store.get(t) if store is not None else None
        if hit is not None:  # the cache holds static verdicts too: a hit parses nothing
            if hit[0] is not None:
                bad[t.task_id] = hit[0]
            continue
        reason = _static_reference_problem(t)
        if reason:
            bad[t.task_id] = reason
            if store is not None:
                store.put(t, reason)
        else:
            runnable.append(t)
    try:
        _run_validation(runnable, bad, store, workers, progress)
    finally:  # copies share their first's verdict (also when interrupted: what is known)
        for group in same.values():
            if group[0].task_id in bad:
                for t in group[1:]:
                    bad[t.task_id] = bad[group[0].task_id]
    return bad


def _run_validation(runnable: Sequence[Task], bad: dict[str, str], store: "_ValidationCache | None",
                    workers: int | None, progress: bool | None) -> None:
    if not runnable:
        return
    from colbench.scoring.sandbox import SandboxPool  # the sandbox starts processes: import late

    pool = SandboxPool(workers=workers)
    bar = _bar(len(runnable), progress, "validating references", "task")
    try:
        for i in range(0, len(runnable), VALIDATION_CHUNK):
            chunk = runnable[i : i + VALIDATION_CHUNK]
            jobs = [(t.hidden, list(t.tests)) for t in chunk]
            VALIDATION_STATS["sandbox_jobs"] += len(jobs) * VALIDATION_RUNS
            results = pool.run_many(jobs * VALIDATION_RUNS)  # both runs in one batch: runs overlap
            for k, t in enumerate(chunk):
                runs = [results[k + r * len(chunk)] for r in range(VALIDATION_RUNS)]
                reason = _compare_runs(t, runs[0], runs[1])
                if reason:
                    bad[t.task_id] = reason
                if store is not None and not _transient(runs):
                    store.put(t, reason)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
        pool.close()


VALIDATION_STATS = {"sandbox_jobs": 0}  # jobs validate_references sent to a sandbox pool (this process)


def _transient(runs: Sequence[Sequence[Any]]) -> bool:
    return any(o.error and o.error.startswith(TRANSIENT_ERRORS) for run in runs for o in run)


def validation_cache_dir() -> Path | None:
    """The cache folder: $SWEET_COLBENCH_CACHE, else $XDG_CACHE_HOME/sweet-colbench, else
    ~/.cache/sweet-colbench; None when $SWEET_COLBENCH_CACHE is "off" (or "0")."""
    value = os.environ.get(CACHE_ENV)
    if value is not None and value.strip().lower() in ("off", "0", "false", "no"):
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sweet-colbench"


def validation_fingerprint() -> dict[str, Any]:
    """What, besides a reference and its tests, decides its validation verdict: the scoring
    rules (SCORING_VERSION), the sandbox's libraries and limits, the runs, the Python version."""
    from colbench.scoring.backend import SCORING_VERSION
    from colbench.scoring.sandbox import SandboxLimits, sandbox_libraries

    return {"scoring_version": SCORING_VERSION, "libraries": sandbox_libraries(),
            "limits": dataclasses.asdict(SandboxLimits()), "runs": VALIDATION_RUNS,
            "python": platform.python_version(), "implementation": sys.implementation.name}


class _ValidationCache:
    """Verdicts on disk: validation/<2 hex>/<sha256 of (fingerprint, reference, tests)>.json
    holding {"reason": null | str}. Writes are atomic (a temp file renamed into place);
    an unreadable entry is recomputed (one warning per process); a folder that cannot be
    written costs the caching only (one warning)."""

    warned: set[str] = set()

    def __init__(self, root: Path, fingerprint: dict[str, Any] | None = None):
        self.root = root / "validation"
        self.salt = json.dumps(fingerprint if fingerprint is not None else validation_fingerprint(), sort_keys=True)

    @classmethod
    def open(cls, fingerprint: dict[str, Any] | None = None) -> "_ValidationCache | None":
        """The cache of the backend reference check (fingerprint None: `validation_fingerprint`)
        or of another check of hidden information, told apart by its `fingerprint`."""
        root = validation_cache_dir()
        return cls(root, fingerprint) if root is not None else None

    def path(self, task: Task) -> Path:
        key = hashlib.sha256(json.dumps([self.salt, task.hidden, list(task.tests)]).encode()).hexdigest()
        return self.root / key[:2] / f"{key}.json"

    def get(self, task: Task) -> tuple[str | None] | None:
        """(reason,) when cached (reason None: a valid reference), else None."""
        path = self.path(task)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            reason = d["reason"]
            if reason is not None and not isinstance(reason, str):
                raise TypeError("reason")
            return (reason,)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._warn_once("corrupt", f"validation cache: unreadable entry {path} ({type(e).__name__}); "
                                       "recomputing it (and any other unreadable entries, silently)")
            return None

    def put(self, task: Task, reason: str | None) -> None:
        # a cache: a folder it cannot write in (or a full disk) costs the caching, never the load
        try:
            atomic_write(self.path(task), json.dumps({"reason": reason, "task_id": task.task_id}) + "\n", fsync=False)
        except DiskFull:
            self._warn_once("write", f"validation cache: the disk is full under {self.root} ({free_space(self.root)}); "
                                     f"verdicts are not cached (set {CACHE_ENV} to another folder)")
        except OSError as e:
            self._warn_once("write", f"validation cache: cannot write in {self.root} ({e.strerror or e}); "
                                     f"verdicts are not cached (set {CACHE_ENV} to another folder)")

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self.warned:
            self.warned.add(kind)
            log.warning("%s", message)


# ------------------------------------------------------------------------------ sources


def _task_rows(source: str, env: str, split: str | None, limit: int | None,
               ranged: bool = False) -> tuple[Iterator[_Row], str | None]:
    if source == "builtin" or source.startswith("builtin:"):
        name = source.partition(":")[2] or split
        if name not in ("train", "test"):
            raise ValueError(f"builtin source needs a split: 'builtin:train' or 'builtin:test', got {source!r}")
        if split is not None and split != name:
            raise ValueError(f"source {source!r} conflicts with split={split!r}")
        path = TASKS_DIR / env / f"{name}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"no bundled {env} tasks for split {name!r}: {path} does not exist")
        return _file_rows(path, limit), name
    if source.startswith("hf:"):
        dataset_id = source[3:]
        if dataset_id.endswith("]") and "[" in dataset_id:  # hf:<id>[test] names the split
            dataset_id, _, named = dataset_id[:-1].partition("[")
            if split is not None and split != named:
                raise ValueError(f"source {source!r} conflicts with split={split!r}")
            split = named
        split = split or "train"
        if dataset_id == HF_DATASET_ID:
            if env != "backend":
                raise ValueError(f"{HF_DATASET_ID} holds backend tasks only (frontend tasks: hf:{WEBSIGHT_ID}[test])")
            if split not in HF_TASK_FILES:
                raise ValueError(f"split must be one of {sorted(HF_TASK_FILES)}, got {split!r}")
            if split == "test" and limit is None and not ranged:
                log.info("using the first %d rows of the published test file, as the paper does", PAPER_TEST_SIZE)
                limit = PAPER_TEST_SIZE
            return _hf_rows(dataset_id, HF_TASK_FILES[split], limit), split
        if dataset_id == WEBSIGHT_ID:
            if env != "frontend":
                raise ValueError(f"{WEBSIGHT_ID} holds frontend tasks only (use env='frontend')")
            if split not in WEBSIGHT_SPLITS:
                raise ValueError(f"split must be one of {sorted(WEBSIGHT_SPLITS)}, got {split!r}")
            if split == "test" and limit is None and not ranged:
                log.info("using the first %d frontend test tasks, as the paper does", PAPER_FRONTEND_TEST_SIZE)
                limit = PAPER_FRONTEND_TEST_SIZE
            return _websight_rows(split, limit), split
        return _hf_rows(dataset_id, None, limit, split=split), split
    return _file_rows(Path(source), limit), split


def _file_rows(path: Path, limit: int | None) -> Iterator[_Row]:
    if not path.exists():
        raise FileNotFoundError(f"task file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_rows(path, limit)
    if suffix == ".json":
        return _json_rows(path, limit)
    if suffix == ".parquet":
        return _parquet_rows(path, limit)
    raise ValueError(f"{path}: unsupported file type {suffix!r} (expected .jsonl, .json or .parquet)")


def _jsonl_rows(path: Path, limit: int | None, name: str | None = None) -> Iterator[_Row]:
    """One _Row per non-blank line; a line that does not decode is a row with its error
    (never the end of the file). `name` replaces the path in "file:line" locations."""
    count = 0
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            where = f"{name or path}:{lineno}"
            try:
                yield _Row(where, count, json.loads(line))
            except json.JSONDecodeError as e:
                yield _Row(where, count, None, f"invalid JSON ({e.msg} at column {e.colno})")
            count += 1


def _json_rows(path: Path, limit: int | None) -> Iterator[_Row]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TaskFormatError([(f"{path}:{e.lineno}", f"invalid JSON ({e.msg})")]) from None
    if not isinstance(data, list):
        raise TaskFormatError([(str(path), f"expected a JSON list of rows, got {type(data).__name__}")])
    for i, row in enumerate(data[:limit] if limit is not None else data):
        yield _Row(f"{path}:{i + 1}", i, row)


def _parquet_rows(path: Path, limit: int | None) -> Iterator[_Row]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if limit is not None:
        table = table.slice(0, limit)
    for i, row in enumerate(table.to_pylist()):
        yield _Row(f"{path}:{i + 1}", i, row, columnar=True)


def _hf_rows(dataset_id: str, data_file: str | None, limit: int | None, split: str = "train") -> Iterator[_Row]:
    """Rows of a Hugging Face dataset (downloads on first use; never used in tests). A JSONL
    data file (the published ColBench files) is downloaded as is and read line by line like a
    local file, so one bad line is one unusable row, never the end of the load."""
    if data_file is not None and data_file.endswith(".jsonl"):
        try:
            from huggingface_hub import hf_hub_download
        except ImportError:
            pass
        else:
            local = hf_hub_download(repo_id=dataset_id, filename=data_file, repo_type="dataset")
            return _jsonl_rows(Path(local), limit, name=f"hf:{dataset_id}/{data_file}")
    return _hf_dataset_rows(dataset_id, data_file, limit, split)


def _hf_dataset_rows(dataset_id: str, data_file: str | None, limit: int | None, split: str) -> Iterator[_Row]:
    from datasets import load_dataset

    if data_file is not None:
        ds = load_dataset(dataset_id, data_files=data_file, split="train")
        name = f"hf:{dataset_id}/{data_file}"
    else:
        ds = load_dataset(dataset_id, split=split)
        name = f"hf:{dataset_id}[{split}]"
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    for i, row in enumerate(ds):
        yield _Row(f"{name}:{i + 1}", i, row, columnar=True)


def _websight_rows(split: str, limit: int | None) -> Iterator[_Row]:
    """The frontend tasks of a split, built from WebSight v0.2 as the paper does (module
    docstring): streams rows [start, stop) of the one "train" split the set has, reading no
    row past the last one needed (downloads; never used in tests without a stand-in)."""
    from itertools import islice

    from datasets import load_dataset

    start, stop = WEBSIGHT_SPLITS[split]
    if limit is not None:
        stop = min(stop, start + limit)
    stream = load_dataset(WEBSIGHT_ID, WEBSIGHT_CONFIG, split="train", streaming=True)
    name = f"hf:{WEBSIGHT_ID}[{split}]"
    for i, raw in enumerate(islice(stream, start, stop)):
        yield _Row(f"{name}:{i + 1}", i, websight_task_row(raw), columnar=True)


def websight_task_row(raw: Any) -> Any:
    """A WebSight v0.2 row as an official frontend row: `llm_generated_idea` -> the
    description, `text` with its image URLs mapped -> the target HTML. Anything else (a
    row that is not an object, a missing or non-string field) passes through unmapped, so
    the loader reports it like a bad row of a file."""
    if not isinstance(raw, dict):
        return raw
    text = raw.get("text")
    return {"problem_description": raw.get("llm_generated_idea"),
            "ground_truth": websight_target_html(text) if isinstance(text, str) else text}


# WebSight v0.2 pages ask Unsplash Source for random photos: .../random/<W>x<H>/?<keyword>.
# The keyword match is a run of word characters and "=", so a hyphenated keyword leaves its
# tail behind ("?real-estate" -> ".../1600/900-estate"), as in the published frontend rows.
_UNSPLASH_RANDOM = r"https://source\.unsplash\.com/random/(\d+)x(\d+)/\?[\w=]+"
_PICSUM_SIZE = r"https://picsum\.photos/(\d+)/(\d+)"
WEBSIGHT_PHOTO = "https://picsum.photos/id/48/{w}/{h}"  # one fixed photo, at the page's size


def websight_target_html(text: str) -> str:
    """A WebSight page's HTML with its image URLs mapped as the paper's frontend targets
    have them: every Unsplash Source random photo (`https://source.unsplash.com/random/
    WxH/?keyword`, the keyword up to its first character other than a letter, digit, "_" or
    "=") and every sized Lorem Picsum photo (`https://picsum.photos/W/H`) becomes Lorem
    Picsum's photo 48 at the same size (`https://picsum.photos/id/48/W/H`). Nothing else
    changes (the Tailwind 2.2.19 link stays; the renderer serves it and the images offline)."""
    import re

    photo = lambda m: WEBSIGHT_PHOTO.format(w=m[1], h=m[2])  # noqa: E731
    return re.sub(_PICSUM_SIZE, photo, re.sub(_UNSPLASH_RANDOM, photo, text))


# ------------------------------------------------------------------------------ rows -> records


class _RowProblem(Exception):
    """Why one row cannot be used (caught per row, reported with its location)."""


def _row_to_task(row: _Row, env: str, split: str | None) -> Task:
    if row.error:
        raise _RowProblem(row.error)
    if isinstance(row.data, dict) and "problem_description" not in row.data and "hidden" in row.data:
        return _task_from_record(row.data, env, row, split)
    return _task_from_dict(row.data, env, row, split, field_prefix="")


def _task_from_record(d: dict, env: str, row: _Row, split: str | None) -> Task:
    """Our own Task record (`Task.to_json`: task_id, env, description, hidden, tests, meta),
    as trainers and tests write them; its meta (e.g. the test bed's constants) is kept."""
    unknown = sorted(set(d) - {"task_id", "env", "description", "hidden", "tests", "meta"})
    if unknown:
        raise _RowProblem(f"unknown field '{unknown[0]}' in a task record")
    task_id = _required_str(d, "task_id", "")
    description = _required_str(d, "description", "")
    hidden = _required_str(d, "hidden", "")
    if d.get("env", env) != env:
        raise _RowProblem(f"field 'env': the task is for {d['env']!r}, not {env!r}")
    tests = d.get("tests") or []
    if not isinstance(tests, list) or not all(isinstance(c, str) and c.strip() for c in tests):
        raise _RowProblem(f"field 'tests': expected a list of call strings, got {tests!r}")
    meta = d.get("meta") or {}
    if not isinstance(meta, dict):
        raise _RowProblem(f"field 'meta': expected an object, got {type(meta).__name__}")
    meta = {**meta, "where": row.where, "index": row.index}
    if split is not None:
        meta["split"] = split
    return Task(task_id=task_id, env=env, description=description, hidden=hidden, tests=tuple(tests), meta=meta)


def _task_from_dict(d: Any, env: str, row: _Row, split: str | None, field_prefix: str) -> Task:
    if not isinstance(d, dict):
        raise _RowProblem(f"{field_prefix or 'row'}: expected a JSON object, got {type(d).__name__}")
    description = _required_str(d, "problem_description", field_prefix)
    hidden = _required_str(d, "ground_truth", field_prefix)
    tests = _tests(d.get("test_cases"), env, row.columnar, field_prefix)
    task_id = d.get("task_id")
    if task_id is None:
        task_id = stable_task_id(env, description, hidden)
    elif not isinstance(task_id, str) or not task_id.strip():
        raise _RowProblem(f"field '{field_prefix}task_id': expected a non-empty string, got {task_id!r}")
    meta: dict[str, Any] = {"where": row.where, "index": row.index}
    if split is not None:
        meta["split"] = split
    return Task(task_id=task_id, env=env, description=description, hidden=hidden, tests=tests, meta=meta)


def _required_str(d: dict, key: str, prefix: str) -> str:
    if key not in d or d[key] is None:
        raise _RowProblem(f"missing field '{prefix}{key}'")
    value = d[key]
    if not isinstance(value, str):
        raise _RowProblem(f"field '{prefix}{key}': expected a string, got {type(value).__name__}")
    if not value.strip():
        raise _RowProblem(f"field '{prefix}{key}' is empty")
    return value


def _tests(value: Any, env: str, columnar: bool, prefix: str) -> tuple[str, ...]:
    name = f"{prefix}test_cases"
    if env != "backend":
        return ()  # frontend and other envs score without call tests
    if value is None:
        raise _RowProblem(f"missing field '{name}'")
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:  # some exports store the dict as a JSON string
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if columnar and isinstance(value, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        value = dict(value)  # parquet map columns read back as (key, value) pairs
    if not isinstance(value, dict):
        raise _RowProblem(f"field '{name}': expected a dict of call strings, got {type(value).__name__}")
    if columnar:
        # Columnar formats unify struct fields across rows: absent tests read back as None.
        value = {k: v for k, v in value.items() if v is not None}
    if not value:
        raise _RowProblem(f"field '{name}' is empty")
    for key, call in value.items():
        if not isinstance(call, str) or not call.strip():
            raise _RowProblem(f"field '{name}.{key}': expected a non-empty call string, got {call!r}")
    return tuple(value.values())


def _row_to_episode(row: _Row, env: str) -> Episode:
    if row.error:
        raise _RowProblem(row.error)
    d = row.data
    if not isinstance(d, dict):
        raise _RowProblem(f"row: expected a JSON object, got {type(d).__name__}")
    if "task" not in d:
        raise _RowProblem("missing field 'task'")
    task = _task_from_dict(d["task"], env, row, None, field_prefix="task.")
    history = d.get("dialogue_history")
    if not isinstance(history, list):
        raise _RowProblem(f"field 'dialogue_history': expected a list of turns, got {type(history).__name__}")
    turns = _turns(history)
    answer = d.get("answer")
    if answer is None:
        answer = ""
    if not isinstance(answer, str):
        raise _RowProblem(f"field 'answer': expected a string, got {type(answer).__name__}")
    score = None
    if d.get("reward") is not None:
        reward = d["reward"]
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise _RowProblem(f"field 'reward': expected a number, got {reward!r}")
        score = Score(reward=float(reward), success=env == "backend" and float(reward) == 1.0)
    agent_turns = [t for t in turns if t.role == "agent"]
    answered = bool(agent_turns) and ANSWER_MARKER in agent_turns[-1].content
    return Episode(
        task_id=task.task_id,
        env=env,
        agent="offline",
        seed=row.index,
        turns=turns,
        answer=answer,
        score=score,
        stop_reason=STOP_ANSWERED if answered or not agent_turns else STOP_TURN_LIMIT,
        meta={"where": row.where, "task": task.to_json()},
    )


def _turns(history: list) -> list[Turn]:
    turns: list[Turn] = []
    for i, h in enumerate(history):
        name = f"dialogue_history[{i}]"
        if not isinstance(h, dict):
            raise _RowProblem(f"field '{name}': expected an object, got {type(h).__name__}")
        role = h.get("role")
        content = h.get("content")
        if role in ("assistant", "agent"):
            output = h.get("output")
            text = output if output is not None else content
            if not isinstance(text, str):
                raise _RowProblem(f"field '{name}.output': expected a string, got {type(text).__name__}")
            prompt = h.get("input")
            if prompt is not None and not isinstance(prompt, str):
                raise _RowProblem(f"field '{name}.input': expected a string, got {type(prompt).__name__}")
            turns.append(Turn(role="agent", content=text, prompt=[{"role": "user", "content": prompt}] if prompt else None))
        elif role in ("user", "human"):
            if not isinstance(content, str):
                raise _RowProblem(f"field '{name}.content': expected a string, got {type(content).__name__}")
            if not turns:
                continue  # the task description opens the published history; it is not a human turn
            turns.append(Turn(role="human", content=content))
        else:
            raise _RowProblem(f"field '{name}.role': expected 'assistant' or 'user', got {role!r}")
    return turns


# ------------------------------------------------------------------------------ checks


def _flag_duplicates(tasks: list[Task]) -> list[Task]:
    """A task id seen before: that row becomes an unusable placeholder (id from its row)."""
    first: dict[str, str] = {}
    out = []
    for t in tasks:
        if t.task_id in first:
            reason = f"duplicate task_id {t.task_id!r} (first at {first[t.task_id]})"
            t = Task(task_id=_row_id(t.env, t.meta["index"]), env=t.env, description=t.description, hidden="",
                     meta={**t.meta, UNUSABLE: t.meta.get(UNUSABLE) or reason})
            while t.task_id in first:  # a row id someone gave a real row
                t = dataclasses.replace(t, task_id=t.task_id + "-dup")
        first[t.task_id] = t.meta["where"]
        out.append(t)
    return out


def _row_id(env: str, index: int) -> str:
    return f"{env}-row{index + 1}"


def _placeholder(row: _Row, env: str, split: str | None, reason: str) -> Task:
    """The task of a row that cannot be used: scored 0, counted, named by its location."""
    d = row.data if isinstance(row.data, dict) else {}
    given = d.get("task_id")
    task_id = given if isinstance(given, str) and given.strip() else _row_id(env, row.index)
    description = d.get("problem_description", d.get("description"))
    meta: dict[str, Any] = {"where": row.where, "index": row.index, UNUSABLE: reason}
    if split is not None:
        meta["split"] = split
    return Task(task_id=task_id, env=env, description=description if isinstance(description, str) else "",
                hidden="", tests=(), meta=meta)


def _static_reference_problem(task: Task) -> str | None:
    try:
        ast.parse(task.hidden)
    except SyntaxError as e:
        return f"ground_truth does not parse: {e.msg} (line {e.lineno})"
    for i, call in enumerate(task.tests, 1):
        try:
            ast.parse(call, mode="eval")
        except SyntaxError as e:
            return f"test {i} is not an expression: {call!r} ({e.msg})"
    return None


def _compare_runs(task: Task, first: Sequence[Any], second: Sequence[Any]) -> str | None:
    """Why a reference's two runs do not give usable expected values, or None.

    Values arrive in the sandbox's type-tagged encoding ({"type": ..., ...}; compared
    structurally, see colbench.scoring.backend.values_equal); the two runs must agree
    exactly (zero tolerance; sets and dicts compare without order). Any value the encoding
    represents (builtins, datetimes, type objects, Decimal, enums, dataclasses, numpy,
    pandas, ...) is usable; only the never-equal fallback is not (`_has_object`)."""
    from colbench.scoring.backend import render, values_equal

    if len(first) != len(task.tests) or len(second) != len(task.tests):
        return f"sandbox returned {len(first)}/{len(second)} results for {len(task.tests)} tests"
    for i, (a, b) in enumerate(zip(first, second), 1):
        call = task.tests[i - 1]
        if not a.ok:
            return f"reference failed on test {i} `{call}`: {a.error}"
        if _is_none(a.value):
            return f"reference returned None on test {i} `{call}`"
        if _has_object(a.value):
            return (f"reference returned a value that is not plain data (it never compares equal) on test {i} "
                    f"`{call}`: {render(a.value)}")
        if not b.ok:
            return f"reference failed on the second run of test {i} `{call}`: {b.error}"
        if not values_equal(a.value, b.value, rel_tol=0.0, abs_tol=0.0):
            return (f"reference is nondeterministic on test {i} `{call}`: "
                    f"{render(a.value)} then {render(b.value)}")
    return None


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type") == "none")


def _has_object(value: Any) -> bool:
    """Whether an encoded value holds the encoding's never-equal fallback, {"type": "object"}
    (a function, generator, exception, library object, cycle, a value whose reading
    raised), anywhere inside it: no answer could ever match such a reference."""
    if isinstance(value, dict):
        if value.get("type") == "object":
            return True
        return any(_has_object(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_object(v) for v in value)
    return False


def _handle_problems(problems: list[tuple[str, str]], on_error: str, source: str, n_rows: int) -> None:
    if not problems:
        return
    problems.sort(key=lambda p: _where_key(p[0]))
    if on_error == "raise":
        raise TaskFormatError(problems)
    if on_error == "keep":
        where, reason = problems[0]
        log.warning("%d of %d rows from %s are unusable (kept, scored 0 for every agent); first: %s: %s",
                    len(problems), n_rows, source, where, reason)
        return
    for where, reason in problems:
        log.warning("%s: %s", where, reason)
    log.warning("skipped %d of %d rows from %s", len(problems), n_rows, source)


def _where_key(where: str) -> tuple[str, int]:
    head, _, tail = where.rpartition(":")
    return (head, int(tail)) if tail.isdigit() else (where, 0)


def _bar(total: int, show: bool | None, desc: str, unit: str):
    """A tqdm bar on stderr (None when `show` is False); `show` None: only if the work
    lasts over PROGRESS_DELAY_S seconds."""
    if show is False:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, delay=0 if show else PROGRESS_DELAY_S,
                dynamic_ncols=True, leave=bool(show))


def _progress(items: Iterable, show: bool | None, desc: str, unit: str) -> Iterable:
    if show is False:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, delay=0 if show else PROGRESS_DELAY_S,
                dynamic_ncols=True, leave=bool(show), mininterval=0.5)
