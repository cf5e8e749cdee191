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
- values are compared as plain data in this process, structurally (type tag, qualified
  class name, fields or items; see `values_equal`), so objects with a rigged __eq__ never
  pass, and datetimes, type objects, Decimals, enums, dataclasses, numpy arrays... compare
  without ever being live objects here;
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
from datetime import date as _date
from decimal import Decimal
from fractions import Fraction
from typing import Any, Iterator, Sequence

from colbench.scoring.sandbox import CallOutcome, SandboxPool
from colbench.types import Score, Task

# The rules that decide whether a test passes (value encoding, comparison, seeding). Bump it
# when any of them changes: episodes and leaderboards record it, and cached reference
# validations are keyed by it, so results scored under different rules never mix.
# 1: plain data only (builtin scalars and containers); anything else never equal.
# 2: structural equality (values_equal): values encoded by qualified type name + fields or
#    items, so datetime/date/time/timedelta, Decimal, Fraction, type objects, enums,
#    namedtuples, dataclasses, instances of the code's own classes, numpy scalars and
#    arrays, pandas Series/DataFrame compare (and references returning them are usable);
#    numpy/pandas number scalars equal the Python numbers they hold; plus the sandbox's
#    seeding.
SCORING_VERSION = 2

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



_CODE_START = re.compile(r"^(?:async\s+def|def|class|import|from|@)\b")
_TARGET = re.compile(r"def\s+([A-Za-z_]\w*)\s*\(")


def target_function(description: str) -> str | None:
    """The function a backend task asks for: the name in the description's last `def name(`
    (the published rows end with "The signature of the function is: def ..."), else None."""
    names = _TARGET.findall(description)
    return names[-1] if names else None


def defines(code: str, name: str | None) -> bool:
    """Whether `code` parses and defines `name` at module level (any function when None)."""
    import ast

    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    funcs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return bool(funcs) if name is None else name in funcs


def _bare_code(text: str) -> str | None:
    """Code written without fences inside prose: from the first line that starts a
    definition or an import to the last line of that run (indented, blank or another
    definition); None when no such line exists."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return None
    end = start
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not line.strip() or line[0] in " \t" or _CODE_START.match(line) or line.startswith("#"):
            end = i if line.strip() else end
            continue
        break
    return "\n".join(lines[start:end + 1])


def extract_function_code(text: str, name: str | None = None) -> str:
    """The code of a backend answer as a real model writes it (the published evaluator runs
    the text after its marker as is, see docs/reference-differences.md):

    1. a fenced block (```python, ```py, unlabeled or any label; an unclosed last fence
       counts) that defines `name`, else the first block `extract_code` picks, when some
       block defines a function;
    2. else the whole text, when it parses as Python;
    3. else code written without fences inside prose (`_bare_code`);
    4. else `extract_code(text)` (what the text holds, scored as written).
    """
    blocks = [body.strip("\n") for _, body in _FENCE.findall(text)]
    for body in blocks:
        if name is not None and defines(body, name):
            return body
    if blocks and any(defines(b, None) for b in blocks):
        return extract_code(text)
    if defines(text, None):
        return text.strip()
    bare = _bare_code(text)
    if bare is not None and defines(bare, None):
        return bare
    return extract_code(text)


# ---------------------------------------------------------------- value comparison

_NUMERIC = ("int", "float", "decimal", "fraction")
# Tags compared by value alone, whatever the value's class (a subclass of a builtin, a
# numpy scalar, a Decimal subclass): as Python's == does. Every other tag needs equal
# "class" (qualified type names) on both sides.
_CLASS_BLIND = frozenset(_NUMERIC + ("none", "bool", "complex", "str", "bytes", "list", "tuple", "set", "dict"))
_EXACT_DECIMAL_EXPONENT = 10_000  # Decimals beyond 10**±this compare as floats (inexact)


def _int(v: dict) -> int:
    if v.get("type") != "int":
        raise ValueError("not an int encoding")
    x = int(v["hex"], 16) if "hex" in v else v["value"]
    if type(x) is not int:
        raise ValueError("malformed int encoding")
    return x


def _number(v: dict) -> int | float | Fraction:
    """The real number an encoded int/float/decimal/fraction stands for: int or Fraction
    (exact), or float (binary floating point, nan and infinities included)."""
    t = v["type"]
    if t == "int":
        return _int(v)
    if t == "float":
        x = v["value"]
        return float(x) if isinstance(x, str) else x  # "nan", "inf", "-inf"
    if t == "fraction":
        return Fraction(_int(v["numerator"]), _int(v["denominator"]))
    if t == "decimal":
        try:
            d = Decimal(v["value"])
        except ArithmeticError as e:  # InvalidOperation: not a number string
            raise ValueError("malformed decimal encoding") from e
        if not d.is_finite():
            return float("nan") if d.is_nan() else float(d)
        exp = d.as_tuple().exponent
        return Fraction(d) if abs(exp) <= _EXACT_DECIMAL_EXPONENT else float(d)
    raise ValueError(f"not a number: {t}")


def _close(x: int | float | Fraction, y: int | float | Fraction, rel_tol: float, abs_tol: float) -> bool:
    if not isinstance(x, float) and not isinstance(y, float):
        return x == y  # int / Fraction: exactly
    try:
        x, y = float(x), float(y)
    except OverflowError:  # an exact number beyond the float range never equals a float
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return math.isclose(x, y, rel_tol=rel_tol, abs_tol=abs_tol)  # infinities: equal only to themselves


def _instant_us(v: dict) -> tuple[bool, int]:
    """(aware, microseconds) of an encoded datetime or time: aware values as UTC, so two
    aware values are equal when they name the same instant (as Python's == says)."""
    f = [int(x) for x in v["value"]]
    if v["type"] == "datetime":
        days = _date(f[0], f[1], f[2]).toordinal()
        f = [days, *f[3:]]
    else:
        f = [0, *f]
    us = (((f[0] * 24 + f[1]) * 60 + f[2]) * 60 + f[3]) * 1_000_000 + f[4]
    off = v.get("utcoffset")
    return off is not None, us - (int(off) if off is not None else 0)


def _timedelta_us(v: dict) -> int:
    days, secs, us = (int(x) for x in v["value"])
    return (days * 86_400 + secs) * 1_000_000 + us


_INTEGER_KINDS = {"i": "int", "u": "int"}  # numpy dtype kinds: signed and unsigned integers alike


def _dtype(kind: Any) -> Any:
    return _INTEGER_KINDS.get(kind, kind)


def canonical(v: dict) -> str:
    """A string key for exact matching of set elements and dict keys: values that
    `values_equal` calls equal with zero tolerance get the same key (integral numbers of any
    numeric type as ints, as Python hashes 1, 1.0, Decimal(1) and Fraction(1) alike; aware
    datetimes as their UTC instant; class-blind tags without their class; unordered parts
    sorted). Keys that differ may still hold tolerance-equal values (see `_match`)."""
    return json.dumps(_canon(v), sort_keys=True)


def _canon(v: Any) -> Any:
    if not isinstance(v, dict):
        return [_canon(x) for x in v] if isinstance(v, list) else v
    t = v.get("type")
    try:
        if t in _NUMERIC:
            x = _number(v)
            if isinstance(x, float) and math.isfinite(x) and x.is_integer():
                x = int(x)
            elif isinstance(x, Fraction):
                if x.denominator == 1:
                    x = int(x)
                else:
                    try:
                        x = float(x) if Fraction(float(x)) == x else str(x)
                    except OverflowError:
                        x = str(x)
            return {"type": "number", "value": x if not isinstance(x, float) or math.isfinite(x) else str(x)}
        if t in ("datetime", "time"):
            return {"type": t, "class": v.get("class"), "instant": _instant_us(v)}
        if t == "timedelta":
            return {"type": t, "class": v.get("class"), "us": _timedelta_us(v)}
    except (ValueError, TypeError, KeyError, ArithmeticError, AttributeError):
        pass  # malformed: keyed as it is (the comparison decides)
    out = {k: _canon(x) for k, x in v.items() if not (k == "class" and t in _CLASS_BLIND)}
    if t == "set":
        out["items"] = sorted(out["items"], key=lambda e: json.dumps(e, sort_keys=True))
    elif t in ("dict", "record"):
        key = "items" if t == "dict" else "fields"
        out[key] = sorted(out[key], key=lambda e: json.dumps(e, sort_keys=True))
    return out


def values_equal(a: dict, b: dict, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Equality of two values in the sandbox's plain-data encoding (format in
    colbench/scoring/_sandbox_child.py, above `encode`). Structural: type tags, qualified
    class names, fields and items; no object from the code under test ever exists here.

    Numbers (close to Python's ==, with a tolerance for binary floating point):
    - int, float, Decimal, Fraction and numpy integer/floating scalars are one family,
      compared by value whatever their class: exact numbers (int, Fraction, Decimal)
      with each other exactly; anything with a float within rel_tol/abs_tol (so, unlike
      ==, Decimal('0.1') equals 0.1); nan equals nan; inf only equals inf of the same sign.
      numpy.float64(2.0) == 2 and numpy.int64(3) == 3, as == says;
    - bool is its own type: True != 1 (Python says equal; an answer returning True for a
      count is wrong); numpy.bool_ is a bool; complex compares part-wise with the tolerance.
    Builtin containers and strings (as in version 1; their subclasses compare as the base):
    - list != tuple (as in Python); set == frozenset; dict order ignored; str and bytes
      exactly; OrderedDict/Counter/defaultdict compare as dicts, str subclasses as str.
    Everything else needs the same qualified class name (module.qualname) on both sides,
    stricter than == (no cross-type equality):
    - datetime, date, time, timedelta: date != datetime; naive datetimes/times by their
      fields, aware ones by UTC instant (as ==), naive != aware; timedeltas by duration;
    - type objects (e.g. [int, str]) by qualified name;
    - enums by class and member (an IntEnum member != its int), namedtuples, dataclasses
      (fields with compare=True), SimpleNamespace and instances of classes defined by the
      code under test whose bases are its own classes or object ("record": class + kind +
      field names + field values, fields in any order; a namedtuple != a plain tuple, a
      dataclass != a plain class of the same name). Reference and answer run in separate
      sandboxes, so their classes match by name, never by identity;
    - collections.deque, array.array, range: class + items in order;
    - numpy arrays: dtype kind (signed and unsigned ints alike; int != float arrays) +
      shape + items (ints exactly, floats with the tolerance); pandas Series: dtype kind,
      name, index and items; DataFrame: index and columns (name, dtype kind, items), in order;
    - {"type": "object"} (the one fallback: functions, generators, exceptions, instances of
      library classes, cycles, values whose reading raised) never equals anything, itself
      included.
    Set elements and dict keys are matched exactly (see `canonical`), then, for small
    containers, with the tolerance. Raises ValueError, TypeError, KeyError or
    ArithmeticError on a malformed encoding.
    """
    ta, tb = a.get("type"), b.get("type")
    if ta in _NUMERIC and tb in _NUMERIC:
        return _close(_number(a), _number(b), rel_tol, abs_tol)
    if ta != tb or ta == "object":
        return False
    if ta not in _CLASS_BLIND and a.get("class") != b.get("class"):
        return False
    eq = lambda x, y: values_equal(x, y, rel_tol, abs_tol)  # noqa: E731
    if ta == "none":
        return True
    if ta in ("bool", "str"):
        return a["value"] == b["value"]
    if ta == "bytes":
        return a["hex"] == b["hex"]
    if ta == "complex":
        return all(_close(float(a[k]), float(b[k]), rel_tol, abs_tol) for k in ("real", "imag"))
    if ta in ("list", "tuple", "sequence"):
        return _pairwise(a["items"], b["items"], eq)
    if ta == "set":
        return _match(a["items"], b["items"], eq, lambda x: x)
    if ta == "dict":
        return _match(a["items"], b["items"], lambda x, y: eq(x[0], y[0]) and eq(x[1], y[1]), lambda kv: kv[0])
    if ta in ("datetime", "time"):
        return _instant_us(a) == _instant_us(b)
    if ta == "date":
        return [int(x) for x in a["value"]] == [int(x) for x in b["value"]]
    if ta == "timedelta":
        return _timedelta_us(a) == _timedelta_us(b)
    if ta == "class":
        return a["name"] == b["name"]
    if ta == "enum":
        return a["name"] == b["name"] and eq(a["value"], b["value"])
    if ta == "record":
        fa, fb = dict(a["fields"]), dict(b["fields"])
        return a.get("kind") == b.get("kind") and fa.keys() == fb.keys() and all(eq(fa[k], fb[k]) for k in fa)
    if ta == "ndarray":
        return (_dtype(a["dtype"]) == _dtype(b["dtype"]) and list(a["shape"]) == list(b["shape"])
                and _pairwise(a["items"], b["items"], eq))
    if ta == "series":
        return (_dtype(a["dtype"]) == _dtype(b["dtype"]) and eq(a["name"], b["name"]) and eq(a["index"], b["index"])
                and _pairwise(a["items"], b["items"], eq))
    if ta == "dataframe":
        return eq(a["index"], b["index"]) and _pairwise(
            a["columns"], b["columns"],
            lambda x, y: eq(x[0], y[0]) and _dtype(x[1]) == _dtype(y[1]) and _pairwise(x[2], y[2], eq))
    return False


def _pairwise(xs: list, ys: list, eq) -> bool:
    return len(xs) == len(ys) and all(eq(x, y) for x, y in zip(xs, ys))


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
    try:
        s = _render(v) if isinstance(v, dict) and "type" in v else json.dumps(v, ensure_ascii=False)
    except Exception:  # noqa: BLE001 - a malformed encoding: show it raw
        s = json.dumps(v, ensure_ascii=False, default=str)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _render(v: dict) -> str:
    t = v["type"]
    cls = v.get("class")
    if t == "decimal":
        return f"Decimal('{v['value']}')"
    if t == "fraction":
        return f"Fraction({_render(v['numerator'])}, {_render(v['denominator'])})"
    if t in _NUMERIC:
        text = repr(_number(v))
        return f"{cls}({text})" if cls else text
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
    if t in ("datetime", "date", "time", "timedelta"):
        f = [int(x) for x in v["value"]]
        if t == "timedelta":
            text = ", ".join(f"{k}={x}" for k, x in zip(("days", "seconds", "microseconds"), f) if x)
        else:
            keep = 3 if t == "date" else len(f)
            while keep > (5 if t == "datetime" else 2) and f[keep - 1] == 0:  # as repr: drop zero seconds/us
                keep -= 1
            text = ", ".join(map(str, f[:keep]))
            if v.get("utcoffset") is not None:
                text += f", utcoffset={v['utcoffset'] / 1e6:g}s"
        return f"{cls}({text})"
    if t == "class":
        name = v["name"]
        return f"<class '{name.removeprefix('builtins.')}'>"
    if t == "enum":
        return f"<{cls}.{v['name']}: {_render(v['value'])}>"
    if t == "record":
        return f"{cls}(" + ", ".join(f"{k}={_render(x)}" for k, x in v["fields"]) + ")"
    if t == "sequence":
        return f"{cls}([" + ", ".join(_render(x) for x in v["items"]) + "])"
    if t == "ndarray":
        return f"{_short(cls)}({_nested([_render(x) for x in v['items']], list(v['shape']))}, kind={v['dtype']!r})"
    if t == "series":
        return (f"Series({_render({'type': 'list', 'items': v['items']})}, index={_render(v['index'])}, "
                f"name={_render(v['name'])})")
    if t == "dataframe":
        cols = ", ".join(f"{_render(n)}: {_render({'type': 'list', 'items': items})}" for n, _, items in v["columns"])
        return f"DataFrame({{{cols}}}, index={_render(v['index'])})"
    return f"<object {cls + ' ' if cls else ''}{v.get('repr', '')}>".replace("  ", " ")


def _short(cls: str | None) -> str:
    return (cls or "").rpartition(".")[2]


def _nested(items: list[str], shape: list[int]) -> str:
    """Flat rendered items as nested lists of `shape` (row-major)."""
    if len(shape) <= 1:
        return "[" + ", ".join(items) + "]" if shape else (items[0] if items else "[]")
    step = len(items) // shape[0] if shape[0] else 0
    return "[" + ", ".join(_nested(items[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])) + "]"


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

    References (cached) and answers run in parallel, each in its own sandbox; identical
    answers to the same task run once (`iter_score_backend`). Never raises for anything
    the answer does; Score.detail["tests"] lists per-test results.
    """
    scores = dict(iter_score_backend(tasks, answers, pool, cache))
    return [scores[i] for i in range(len(tasks))]


def iter_score_backend(
    tasks: Sequence[Task], answers: Sequence[str], pool: SandboxPool, cache: ReferenceCache | None = None
) -> Iterator[tuple[int, Score]]:
    """`score_backend` one answer at a time: yields (index, Score) as each answer's sandbox
    finishes (any order), so a caller can save each result at once. Closing the iterator
    early cancels the sandboxes not yet started.

    Within one call, an answer identical to an earlier one for the same task (same
    reference and tests) is not run again: its copies get the outcome of one run, each its
    own Score. The sandbox seeds `random`, numpy and the hash (colbench.scoring.sandbox), so
    separate runs would agree; a program that reads a clock, `os.urandom` or an unseeded
    generator gets one draw for all its copies."""
    if len(tasks) != len(answers):
        raise ValueError(f"score_backend: {len(tasks)} tasks but {len(answers)} answers")
    cache = DEFAULT_REFERENCE_CACHE if cache is None else cache
    refs: dict[tuple[str, str], list[CallOutcome] | None] = {}
    missing: dict[tuple[str, str], Task] = {}
    copies: dict[tuple[tuple[str, str], str], list[int]] = {}  # (reference key, answer) -> indices, in order
    for i, (t, answer) in enumerate(zip(tasks, answers)):
        k = ReferenceCache.key(t)
        if k not in refs:
            refs[k] = cache.get(t)
            if refs[k] is None and t.tests:
                missing[k] = t
        copies.setdefault((k, answer), []).append(i)
    # references first: the pool runs jobs in submission order
    ref_jobs = {k: pool.submit((t.hidden, list(t.tests))) for k, t in missing.items()}
    answer_jobs = {pool.submit((answer, list(tasks[indices[0]].tests))): (k, indices)
                   for (k, answer), indices in copies.items()}
    try:
        for job in as_completed(answer_jobs):
            k, indices = answer_jobs[job]
            if refs[k] is None and k in ref_jobs:
                refs[k] = ref_jobs[k].result()
                cache.put(tasks[indices[0]], refs[k])
            for i in indices:
                yield i, _score_one(tasks[i], refs[k] or [], job.result())
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
            except (RecursionError, ValueError, TypeError, KeyError, ArithmeticError, AttributeError) as e:  # malformed
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
