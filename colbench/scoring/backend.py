"""Backend-programming scoring: run the reference and the answer in separate sandboxes on
the task's call expressions and compare the outputs.

    from colbench.scoring.sandbox import SandboxPool
    from colbench.scoring.backend import score_backend
    with SandboxPool() as pool:
        scores = score_backend(tasks, answers, pool)   # Score.reward = fraction of tests passed

Departures from the reference implementation (deliberate):
- answers and references run as modules in a sandbox (colbench.scoring.sandbox), not exec'd in a
  function's locals in our process: imports, helpers and recursion work; print/open are
  allowed (the sandbox contains them) instead of zeroing the answer;
- floats compare with a tolerance (rel 1e-6, abs 1e-9) instead of exactly;
- values are compared as plain data in this process, so objects with a rigged __eq__
  never pass;
- a test whose reference call fails is a task bug: it counts as failed for everyone and
  the reason is recorded in Score.detail.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from concurrent.futures import as_completed
from typing import Any, Iterator, Sequence

from colbench.scoring.sandbox import CallOutcome, SandboxPool
from colbench.types import Score, Task

# The rules that decide whether a test passes (value encoding, comparison, seeding). Bump it
# when any of them changes: episodes and leaderboards record it, and cached reference
# validations are keyed by it, so results scored under different rules never mix.
SCORING_VERSION = 1

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """The code in an agent's answer: the first ```python (or ```py) block, else the first
    unlabeled ``` block, else the whole text. An unclosed final fence counts as a block."""
    blocks = _FENCE.findall(text)
    for lang, body in blocks:
        if lang.lower() in ("python", "py", "python3"):
            return body.strip("\n")
    for lang, body in blocks:
        if not lang:
            return body.strip("\n")
    return text.strip()


# ---------------------------------------------------------------- value comparison

_NUMERIC = ("int", "float")


def _number(v: dict) -> int | float:
    if v["type"] == "int":
        return int(v["hex"], 16) if "hex" in v else v["value"]
    x = v["value"]
    return float(x) if isinstance(x, str) else x  # "nan", "inf", "-inf"


def _close(x: int | float, y: int | float, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    x, y = float(x), float(y)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return math.isclose(x, y, rel_tol=rel_tol, abs_tol=abs_tol)  # infinities: equal only to themselves


def canonical(v: dict) -> str:
    """A string key for exact matching of set elements and dict keys; integral floats
    normalise to ints, as Python hashes 1 and 1.0 alike."""

    def norm(x: Any) -> Any:
        if isinstance(x, dict):
            if x.get("type") == "float" and isinstance(x.get("value"), float) and x["value"].is_integer():
                return {"type": "int", "value": int(x["value"])}
            return {k: norm(val) for k, val in x.items()}
        if isinstance(x, list):
            return [norm(e) for e in x]
        return x

    return json.dumps(norm(v), sort_keys=True)


def values_equal(a: dict, b: dict, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Equality of two values in the sandbox's plain-data encoding.

    Rules (close to Python's ==, stricter where == hides bugs):
    - int and float compare numerically; ints with each other exactly, anything with a
      float within rel_tol/abs_tol; nan equals nan; inf only equals inf of the same sign;
    - bool is its own type: True != 1 (Python says equal; an answer returning True for a
      count is wrong);
    - list != tuple (as in Python); set == frozenset (as in Python); dict order ignored;
    - complex compares part-wise with the tolerance; str and bytes exactly;
    - {"type": "object"} (anything else: class instances, functions, ...) never equals
      anything, itself included.
    Set elements and dict keys are matched exactly (see `canonical`), then, for small
    containers, with the tolerance.
    """
    ta, tb = a.get("type"), b.get("type")
    if ta in _NUMERIC and tb in _NUMERIC:
        return _close(_number(a), _number(b), rel_tol, abs_tol)
    if ta != tb or ta == "object":
        return False
    if ta == "none":
        return True
    if ta in ("bool", "str"):
        return a["value"] == b["value"]
    if ta == "bytes":
        return a["hex"] == b["hex"]
    if ta == "complex":
        return all(_close(float(a[k]), float(b[k]), rel_tol, abs_tol) for k in ("real", "imag"))
    if ta in ("list", "tuple"):
        return len(a["items"]) == len(b["items"]) and all(
            values_equal(x, y, rel_tol, abs_tol) for x, y in zip(a["items"], b["items"])
        )
    if ta == "set":
        return _match(a["items"], b["items"], lambda x, y: values_equal(x, y, rel_tol, abs_tol), lambda x: x)
    if ta == "dict":
        return _match(
            a["items"], b["items"],
            lambda x, y: values_equal(x[0], y[0], rel_tol, abs_tol) and values_equal(x[1], y[1], rel_tol, abs_tol),
            lambda kv: kv[0],
        )
    return False


def _match(xs: list, ys: list, eq, key, greedy_max: int = 200) -> bool:
    """Whether two unordered collections match one-to-one: exact keys first, then the
    leftovers greedily with `eq` (tolerance), when few enough."""
    if len(xs) != len(ys):
        return False
    by_key: dict[str, list] = {}
    for y in ys:
        by_key.setdefault(canonical(key(y)), []).append(y)
    left_x = []
    for x in xs:
        bucket = by_key.get(canonical(key(x)))
        y = next((c for c in bucket or () if eq(x, c)), None)
        if y is None:
            left_x.append(x)
        else:
            bucket.remove(y)
    left_y = [y for bucket in by_key.values() for y in bucket]
    if not left_x:
        return True
    if len(left_x) > greedy_max:
        return False
    for x in left_x:
        y = next((c for c in left_y if eq(x, c)), None)
        if y is None:
            return False
        left_y.remove(y)
    return True


def render(v: Any, limit: int = 200) -> str:
    """A short human-readable form of an encoded value, for reports."""
    s = json.dumps(v, ensure_ascii=False) if not (isinstance(v, dict) and "type" in v) else _render(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _render(v: dict) -> str:
    t = v["type"]
    if t in ("int", "float"):
        return repr(_number(v))
    if t == "none":
        return "None"
    if t in ("bool", "str"):
        return repr(v["value"])
    if t == "bytes":
        return repr(bytes.fromhex(v["hex"]))
    if t == "complex":
        return f"complex({v['real']}, {v['imag']})"
    if t in ("list", "tuple", "set"):
        inner = ", ".join(_render(x) for x in v["items"])
        return {"list": f"[{inner}]", "tuple": f"({inner}{',' if len(v['items']) == 1 else ''})", "set": f"{{{inner}}}"}[t]
    if t == "dict":
        return "{" + ", ".join(f"{_render(k)}: {_render(x)}" for k, x in v["items"]) + "}"
    return f"<object {v.get('repr', '')}>"


# ---------------------------------------------------------------- scoring


class ReferenceCache:
    """Reference outputs per (task_id, hash of reference source + tests), in memory.

    Only clean runs are cached: an outcome that timed out or crashed may be the machine's
    load, so it is recomputed next time."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, str], list[CallOutcome]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(task: Task) -> tuple[str, str]:
        h = hashlib.sha256(json.dumps([task.hidden, list(task.tests)]).encode()).hexdigest()
        return task.task_id, h

    def get(self, task: Task) -> list[CallOutcome] | None:
        with self._lock:
            return self._data.get(self.key(task))

    def put(self, task: Task, outcomes: list[CallOutcome]) -> None:
        transient = any(o.error and (o.error.startswith(("TimeoutError", "sandbox crashed"))) for o in outcomes)
        if not transient:
            with self._lock:
                self._data[self.key(task)] = outcomes

    def __len__(self) -> int:
        return len(self._data)


DEFAULT_REFERENCE_CACHE = ReferenceCache()


def score_backend(
    tasks: Sequence[Task], answers: Sequence[str], pool: SandboxPool, cache: ReferenceCache | None = None
) -> list[Score]:
    """Score each answer (code) against its task: reward = fraction of the task's tests
    whose answer output equals the reference output; success = all pass.

    References (cached) and answers run in parallel, each in its own sandbox. Never
    raises for anything the answer does; Score.detail["tests"] lists per-test results.
    """
    scores = dict(iter_score_backend(tasks, answers, pool, cache))
    return [scores[i] for i in range(len(tasks))]


def iter_score_backend(
    tasks: Sequence[Task], answers: Sequence[str], pool: SandboxPool, cache: ReferenceCache | None = None
) -> Iterator[tuple[int, Score]]:
    """`score_backend` one answer at a time: yields (index, Score) as each answer's sandbox
    finishes (any order), so a caller can save each result at once. Closing the iterator
    early cancels the sandboxes not yet started."""
    if len(tasks) != len(answers):
        raise ValueError(f"score_backend: {len(tasks)} tasks but {len(answers)} answers")
    cache = DEFAULT_REFERENCE_CACHE if cache is None else cache
    refs: dict[tuple[str, str], list[CallOutcome] | None] = {}
    missing: dict[tuple[str, str], Task] = {}
    for t in tasks:
        k = ReferenceCache.key(t)
        refs[k] = cache.get(t)
        if refs[k] is None and t.tests:
            missing[k] = t
    # references first: the pool runs jobs in submission order
    ref_jobs = {k: pool.submit((t.hidden, list(t.tests))) for k, t in missing.items()}
    answer_jobs = {pool.submit((answer, list(t.tests))): i for i, (t, answer) in enumerate(zip(tasks, answers))}
    try:
        for job in as_completed(answer_jobs):
            i = answer_jobs[job]
            task = tasks[i]
            k = ReferenceCache.key(task)
            if refs[k] is None and k in ref_jobs:
                refs[k] = ref_jobs[k].result()
                cache.put(task, refs[k])
            yield i, _score_one(task, refs[k] or [], job.result())
    finally:
        for job in (*ref_jobs.values(), *answer_jobs):
            job.cancel()


def _score_one(task: Task, ref: list[CallOutcome], got: list[CallOutcome]) -> Score:
    if not task.tests:
        return Score(reward=0.0, success=False, error=f"task {task.task_id!r} has no tests")
    rows, n_pass, ref_errors = [], 0, 0
    for call, r, a in zip(task.tests, ref, got):
        row: dict[str, Any] = {"call": call, "passed": False}
        if not r.ok:
            ref_errors += 1
            row["error"] = f"reference failed: {r.error}"
        elif not a.ok:
            row["error"] = a.error
        else:
            try:
                row["passed"] = values_equal(r.value, a.value)
                if not row["passed"]:
                    row["expected"], row["got"] = render(r.value), render(a.value)
            except (RecursionError, ValueError, TypeError, KeyError) as e:  # malformed value: a failed test
                row["error"] = f"cannot compare values: {type(e).__name__}"
        n_pass += row["passed"]
        rows.append(row)
    reward = n_pass / len(task.tests)
    errors = {o.error for o in got}
    error = None
    if n_pass == 0 and len(errors) == 1 and None not in errors:  # the answer failed as a whole
        error = next(iter(errors))
    detail = {"tests": rows, "passed": n_pass, "total": len(task.tests), "reference_errors": ref_errors}
    return Score(reward=reward, success=n_pass == len(task.tests), detail=detail, error=error)
