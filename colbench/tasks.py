"""Load ColBench tasks and the published offline trajectories.

Sources (the `source` argument):

    path/to/rows.jsonl | .json | .parquet   a local file in the official row format
    builtin:train | builtin:test            the sets bundled in tasks/<env>/ (see tasks/README.md)
    builtin:<spec>/train | .../test         env testbed only: a preset of testbed/spec.py
                                            (legacy, default, long); builtin:train is the shipped
                                            spec (testbed_spec.SHIPPED_SPEC, legacy for now)
    hf:facebook/collaborative_agent_bench   the published data (downloads; online users only);
                                            append [train] or [test] to pick the split

Official backend row (one JSON object per line):

    {"problem_description": "... The signature of the function is: def f(a, b)",
     "ground_truth": "def f(a, b):\\n    ...",              # hidden reference source
     "test_cases": {"test1": "f(1, 2)", ..., "test10": "f(0, 0)"},
     "task_id": "backend-train-0001"}                       # optional, ours

Our own Task records (`Task.to_json()` rows: task_id, env, description, hidden, tests,
meta), which trainers and tests write, load too, keeping their meta.

Frontend rows carry the target HTML as `ground_truth` and no tests. Rows without a
`task_id` get `"<env>-" + sha1(problem_description + ground_truth)[:12]`, stable across
files and machines.

Validation (backend, `validate=True`) runs every reference on all its tests twice in
the sandbox (never in this process). A reference must succeed, return a non-None
value on every test and return the same values both times; otherwise its expected
outputs are meaningless and the task is reported. Every problem names the file, the
line (row number for .json/.parquet/hf sources) and the field or the reason.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from colbench.protocols import ANSWER_MARKER
from colbench.types import STOP_ANSWERED, STOP_TURN_LIMIT, Episode, Score, Task, Turn

log = logging.getLogger(__name__)

TASKS_DIR = Path(__file__).resolve().parent.parent / "tasks"
HF_DATASET_ID = "facebook/collaborative_agent_bench"
# Files of the published dataset (https://huggingface.co/datasets/facebook/collaborative_agent_bench).
HF_TASK_FILES = {"train": "backend_tasks/train.jsonl", "test": "backend_tasks/test.jsonl"}
HF_TRAJECTORY_FILE = "colbench_code_offline_15k_llama8b.jsonl"
PAPER_TEST_SIZE = 1000  # the paper evaluates on the first 1,000 rows of the test file
VALIDATION_CHUNK = 256  # tasks per sandbox batch (progress bar granularity)
MAX_LISTED_PROBLEMS = 10


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
GENERATED_SOURCES: dict[str, str] = {"testbed": "testbed.env:builtin_tasks"}


# ------------------------------------------------------------------------------ public API


def load_tasks(
    source: str,
    env: str = "backend",
    *,
    split: str | None = None,
    limit: int | None = None,
    on_error: str = "raise",
    validate: bool = True,
) -> list[Task]:
    """Load tasks from a local file, a bundled set or the published dataset.

    split:    for "builtin"/"hf:" sources, which split ("train" or "test"); recorded in
              `Task.meta["split"]` for local files.
    limit:    read only the first `limit` rows of the source (the paper's test set is
              the first 1,000 rows, applied by default for the published test split).
    on_error: "raise" -> one TaskFormatError listing every bad row (file:line: reason);
              "skip"  -> log each bad row as a warning, then a summary, and drop it.
    validate: backend only: run each reference twice on its tests in the sandbox.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if env in GENERATED_SOURCES and source.startswith("builtin:"):
        # the CPU test bed's tasks are generated, not stored (testbed/env.py)
        from colbench.registry import load_target

        return load_target(GENERATED_SOURCES[env])(source, split, limit)
    rows, split = _task_rows(source, env, split, limit)
    tasks: list[Task] = []
    problems: list[tuple[str, str]] = []
    n_rows = 0
    for row in rows:
        n_rows += 1
        try:
            tasks.append(_row_to_task(row, env, split))
        except _RowProblem as p:
            problems.append((row.where, str(p)))
    tasks = _drop_duplicates(tasks, problems)
    if validate and env == "backend" and tasks:
        bad = validate_references(tasks)
        problems.extend((t.meta["where"], bad[t.task_id]) for t in tasks if t.task_id in bad)
        tasks = [t for t in tasks if t.task_id not in bad]
    _handle_problems(problems, on_error, source, n_rows)
    return tasks


def load_trajectories(
    source: str,
    env: str = "backend",
    *,
    limit: int | None = None,
    on_error: str = "raise",
) -> list[Episode]:
    """Load published offline trajectories as scored Episodes.

    Published row: {"task": {problem_description, ground_truth, test_cases},
    "dialogue_history": [...], "answer": str, "reward": float}. In dialogue_history the
    first "user" message is the task description (the agent speaks first in ColBench,
    so it is not a human turn); "assistant" turns carry `input` (the full prompt the
    agent was given) and `output` (its raw generation); later "user" turns are the
    simulated human. The episode's agent is "offline", its seed the row index, and the
    task itself is kept in `meta["task"]` (the SWEET critic needs the hidden reference).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
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
    for row in rows:
        n_rows += 1
        try:
            episodes.append(_row_to_episode(row, env))
        except _RowProblem as p:
            problems.append((row.where, str(p)))
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(task_to_row(t), ensure_ascii=False) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file


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


def validate_references(tasks: Sequence[Task], workers: int | None = None) -> dict[str, str]:
    """Run each backend reference twice on its tests in the sandbox (`workers` sandboxes
    at a time; default: one per CPU).

    Returns {task_id: reason} for the tasks whose reference does not parse, fails or
    returns None on some test, or returns different values on the two runs.
    """
    bad: dict[str, str] = {}
    runnable = []
    for t in tasks:
        reason = _static_reference_problem(t)
        if reason:
            bad[t.task_id] = reason
        else:
            runnable.append(t)
    if not runnable:
        return bad
    from colbench.scoring.sandbox import SandboxPool  # the sandbox starts processes: import late

    pool = SandboxPool(workers=workers)
    try:
        chunks = [runnable[i : i + VALIDATION_CHUNK] for i in range(0, len(runnable), VALIDATION_CHUNK)]
        for chunk in _progress(chunks, len(runnable) > VALIDATION_CHUNK):
            jobs = [(t.hidden, list(t.tests)) for t in chunk]
            results = pool.run_many(jobs + jobs)  # both runs in one batch: runs overlap
            for k, t in enumerate(chunk):
                reason = _compare_runs(t, results[k], results[k + len(chunk)])
                if reason:
                    bad[t.task_id] = reason
    finally:
        pool.close()
    return bad


# ------------------------------------------------------------------------------ sources


def _task_rows(source: str, env: str, split: str | None, limit: int | None) -> tuple[Iterator[_Row], str | None]:
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
                raise ValueError(f"{HF_DATASET_ID} holds backend tasks only (frontend tasks come from WebSight)")
            if split not in HF_TASK_FILES:
                raise ValueError(f"split must be one of {sorted(HF_TASK_FILES)}, got {split!r}")
            if split == "test" and limit is None:
                log.info("using the first %d rows of the published test file, as the paper does", PAPER_TEST_SIZE)
                limit = PAPER_TEST_SIZE
            return _hf_rows(dataset_id, HF_TASK_FILES[split], limit), split
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


def _jsonl_rows(path: Path, limit: int | None) -> Iterator[_Row]:
    count = 0
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
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
    """Rows of a Hugging Face dataset (downloads on first use; never used in tests)."""
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


def _drop_duplicates(tasks: list[Task], problems: list[tuple[str, str]]) -> list[Task]:
    first: dict[str, str] = {}
    kept = []
    for t in tasks:
        if t.task_id in first:
            problems.append((t.meta["where"], f"duplicate task_id {t.task_id!r} (first at {first[t.task_id]})"))
        else:
            first[t.task_id] = t.meta["where"]
            kept.append(t)
    return kept


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

    Values arrive in the sandbox's plain-data encoding ({"type": ..., ...}); the two runs
    must agree exactly (zero tolerance; sets and dicts compare without order)."""
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
            return f"reference returned a value that is not plain data on test {i} `{call}`: {render(a.value)}"
        if not b.ok:
            return f"reference failed on the second run of test {i} `{call}`: {b.error}"
        if not values_equal(a.value, b.value, rel_tol=0.0, abs_tol=0.0):
            return (f"reference is nondeterministic on test {i} `{call}`: "
                    f"{render(a.value)} then {render(b.value)}")
    return None


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type") == "none")


def _has_object(value: Any) -> bool:
    """Whether an encoded value holds something that is not plain data (never compares equal)."""
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
    for where, reason in problems:
        log.warning("%s: %s", where, reason)
    log.warning("skipped %d of %d rows from %s", len(problems), n_rows, source)


def _where_key(where: str) -> tuple[str, int]:
    head, _, tail = where.rpartition(":")
    return (head, int(tail)) if tail.isdigit() else (where, 0)


def _progress(items: list, show: bool) -> Iterable:
    if not show:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="validating references", unit="chunk")
