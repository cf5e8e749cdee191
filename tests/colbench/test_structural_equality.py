"""Structural equality (SCORING_VERSION 2): values that are not builtin plain data
(datetimes, type objects, Decimal, Fraction, enums, namedtuples, dataclasses, the code's own
classes, numpy, pandas) are encoded in the sandbox by qualified type name + fields or items
and compared in our process on that structure. The tasks here are our own."""

from __future__ import annotations

import pytest

from colbench.scoring.backend import canonical, render, score_backend, values_equal
from colbench.scoring.sandbox import SandboxLimits, SandboxPool, run_calls
from colbench.tasks import validate_references
from colbench.types import Task

LIMITS = SandboxLimits(cpu_seconds_per_call=0.5, wall_seconds_per_call=1.0, wall_seconds_total=4.0, memory_mb=256)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=LIMITS) as p:
        yield p


def task(hidden: str, *tests: str, task_id: str = "t") -> Task:
    return Task(task_id=task_id, env="backend", description="", hidden=hidden, tests=tests)


def passed(pool, t: Task, *answers: str) -> list[list[bool]]:
    """Per answer, which of the task's tests pass."""
    scores = score_backend([t] * len(answers), list(answers), pool)
    return [[row["passed"] for row in s.detail["tests"]] for s in scores]


def I(v):  # noqa: E743
    return {"type": "int", "value": v}


def F(v, cls=None):
    return {"type": "float", "value": v, **({"class": cls} if cls else {})}


# ---------------------------------------------------------------- end to end, real sandboxes


DEADLINE = (
    "from datetime import datetime, timedelta\n\n"
    "def deadline(start, days):\n"
    "    y, m, d = start\n"
    "    return datetime(y, m, d, 9, 30) + timedelta(days=days)\n"
)


def test_datetime_reference_passes_the_same_datetime_and_fails_another(pool):
    t = task(DEADLINE, "deadline((2024, 2, 27), 3)", "deadline((2023, 12, 31), 0)")
    same = ("import datetime as dt\n\ndef deadline(start, days):\n"
            "    d = dt.date(*start).toordinal() + days\n"
            "    return dt.datetime.combine(dt.date.fromordinal(d), dt.time(9, 30))\n")
    other_minute = DEADLINE.replace("9, 30", "9, 31")
    as_date = ("import datetime\n\ndef deadline(start, days):\n"
               "    return datetime.date(*start) + datetime.timedelta(days)\n")
    aware = DEADLINE.replace("9, 30)", "9, 30, tzinfo=timezone.utc)").replace("timedelta\n", "timedelta, timezone\n")
    as_text = "def deadline(start, days):\n    return '2024-03-01 09:30:00'\n"
    assert passed(pool, t, same, other_minute, as_date, aware, as_text) == [
        [True, True], [False, False], [False, False], [False, False], [False, False]]
    score = score_backend([t], [other_minute], pool)[0]
    assert score.detail["tests"][0]["expected"] == "datetime.datetime(2024, 3, 1, 9, 30)"
    assert score.detail["tests"][0]["got"] == "datetime.datetime(2024, 3, 1, 9, 31)"


def test_aware_datetimes_compare_by_instant(pool):
    ref = ("from datetime import datetime, timezone, timedelta\n\n"
           "def at(h):\n    return datetime(2024, 1, 1, h, tzinfo=timezone(timedelta(hours=2)))\n")
    utc = ("from datetime import datetime, timezone\n\n"
           "def at(h):\n    return datetime(2024, 1, 1, h - 2, tzinfo=timezone.utc)\n")
    naive = "from datetime import datetime\n\ndef at(h):\n    return datetime(2024, 1, 1, h)\n"
    assert passed(pool, task(ref, "at(12)"), utc, naive) == [[True], [False]]


def test_list_of_type_objects(pool):
    ref = "def kinds(xs):\n    return [type(x) for x in xs]\n"
    t = task(ref, "kinds([1, 'a', 2.5])", "kinds([[], {}, None, True])")
    table = ("TYPES = {'int': int, 'str': str, 'float': float, 'list': list, 'dict': dict, 'NoneType': type(None),\n"
             "         'bool': bool}\n\ndef kinds(xs):\n    return [TYPES[x.__class__.__name__] for x in xs]\n")
    names = "def kinds(xs):\n    return [type(x).__name__ for x in xs]\n"
    wrong = "def kinds(xs):\n    return [int if isinstance(x, int) else type(x) for x in xs]\n"  # bool -> int
    assert passed(pool, t, table, names, wrong) == [[True, True], [False, False], [True, False]]


RECORDS = (
    "import enum\nfrom collections import namedtuple\nfrom dataclasses import dataclass, field\n"
    "from decimal import Decimal\nfrom fractions import Fraction\nfrom datetime import timedelta\n\n"
    "class Level(enum.Enum):\n    LOW = 1\n    HIGH = 2\n\n"
    "Point = namedtuple('Point', 'x y')\n\n"
    "@dataclass(frozen=True)\nclass Item:\n    name: str\n    price: Decimal\n"
    "    tags: tuple = ()\n    note: str = field(default='', compare=False)\n\n"
    "def price(cents):\n    return Decimal(cents) / 100\n\n"
    "def share(a, b):\n    return Fraction(a, b)\n\n"
    "def span(minutes):\n    return timedelta(minutes=minutes)\n\n"
    "def level(x):\n    return Level.HIGH if x > 10 else Level.LOW\n\n"
    "def point(x, y):\n    return Point(x, y)\n\n"
    "def item(name, cents):\n    return Item(name, price(cents), ('a',))\n\n"
    "def nested(n):\n    return {level(n): [point(n, -n), {span(n)}], 'share': (share(n, 4), item('x', n))}\n"
)
RECORD_TESTS = ("price(1999)", "share(6, 4)", "span(90)", "level(11)", "point(1, 2)", "item('pen', 250)", "nested(12)")


def test_decimal_fraction_timedelta_enum_namedtuple_dataclass_nested(pool):
    t = task(RECORDS, *RECORD_TESTS)
    # Another implementation: same class names and fields, different code and field defaults.
    rewrite = (
        "from enum import Enum\nimport collections, dataclasses, decimal, fractions, datetime\n\n"
        "class Level(Enum):\n    LOW, HIGH = 1, 2\n\n"
        "class Point(collections.namedtuple('Point', ['x', 'y'])):\n    __slots__ = ()\n"
        "Point.__qualname__ = 'Point'\n\n"
        "@dataclasses.dataclass(frozen=True)\nclass Item:\n    name: str\n    price: decimal.Decimal\n"
        "    tags: tuple = ('a',)\n    note: str = dataclasses.field(default='other', compare=False)\n\n"
        "def price(cents):\n    return decimal.Decimal(cents).scaleb(-2)\n\n"
        "def share(a, b):\n    return fractions.Fraction(a * 10, b * 10)\n\n"
        "def span(minutes):\n    return datetime.timedelta(seconds=60 * minutes)\n\n"
        "def level(x):\n    return Level(2 if x > 10 else 1)\n\n"
        "def point(x, y):\n    return Point(x=x, y=y)\n\n"
        "def item(name, cents):\n    return Item(name, price(cents))\n\n"
        "def nested(n):\n    return {'share': (share(n, 4), item('x', n)), level(n): [point(n, -n), {span(n)}]}\n"
    )
    # Numbers compare by value whatever their type (19.99 == Decimal('19.99') within the
    # tolerance, 1.5 == Fraction(3, 2)); elsewhere the types must match, where == would
    # pass (1, 2) == Point(1, 2).
    plain = (
        "def price(cents):\n    return cents / 100\n\n"
        "def share(a, b):\n    return a / b\n\n"
        "def span(minutes):\n    return minutes * 60\n\n"
        "def level(x):\n    return 2 if x > 10 else 1\n\n"
        "def point(x, y):\n    return (x, y)\n\n"
        "def item(name, cents):\n    return (name, cents / 100, ('a',))\n\n"
        "def nested(n):\n    return None\n"
    )
    off_by_one = RECORDS.replace("Fraction(a, b)", "Fraction(a + 1, b)").replace("x > 10", "x > 11").replace(
        "Point(x, y)", "Point(y, x)").replace("('a',)", "('b',)")
    assert passed(pool, t, RECORDS, rewrite, plain, off_by_one) == [
        [True] * 7, [True] * 7,
        [True, True, False, False, False, False, False],
        [True, False, True, False, False, False, False],
    ]


def test_the_codes_own_classes_compare_by_qualified_name_and_fields(pool):
    ref = ("class Account:\n    def __init__(self, owner, balance):\n"
           "        self.owner, self.balance = owner, balance\n\n"
           "def open_account(owner):\n    return Account(owner, 0.0)\n")
    slots = ("class Account:\n    __slots__ = ('owner', 'balance')\n\n"
             "def open_account(owner):\n    a = Account()\n    a.balance, a.owner = 0, owner\n    return a\n")
    renamed = ref.replace("Account", "Acct")
    extra = ref.replace("self.balance = owner, balance", "self.balance, self.log = owner, balance, []")
    wrong = ref.replace("0.0)", "1.0)")
    assert passed(pool, task(ref, "open_account('ann')"), slots, renamed, extra, wrong) == [
        [True], [False], [False], [False]]


def test_rigged_eq_and_borrowed_type_names_never_pass(pool):
    t = task(DEADLINE, "deadline((2024, 2, 27), 3)")
    anything = ("class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n\n"
                "def deadline(start, days):\n    return Anything()\n")
    borrowed = ("class datetime:\n    __module__ = 'datetime'\n    __qualname__ = 'datetime'\n"
                "    def __eq__(self, other):\n        return True\n\n"
                "def deadline(start, days):\n    return datetime()\n")
    fields = ("import datetime as real\n\nclass datetime:\n    __module__ = 'datetime'\n"
              "    year, month, day, hour, minute, second, microsecond = 2024, 3, 1, 9, 30, 0, 0\n"
              "    tzinfo = None\n    __class__ = property(lambda self: real.datetime)\n"
              "    def __eq__(self, other):\n        return True\n\n"
              "def deadline(start, days):\n    return datetime()\n")
    subclass = ("from datetime import datetime\n\nclass Sneaky(datetime):\n"
                "    def __eq__(self, other):\n        return True\n\n"
                "def deadline(start, days):\n    return Sneaky(1999, 1, 1)\n")
    assert passed(pool, t, anything, borrowed, fields, subclass) == [[False]] * 4


HOSTILE = (
    "class BadRepr(Exception):\n    def __repr__(self):\n        raise RuntimeError('no')\n\n"
    "class BadAttr:\n    def __getattr__(self, name):\n        raise RuntimeError(name)\n"
    "    __getattribute__ = __getattr__\n\n"
    "class Loop(Exception):\n    def __repr__(self):\n        while True:\n            pass\n\n"
    "from dataclasses import dataclass\n\n"
    "@dataclass\nclass Prop:\n    x: int = 0\n\nPROP = Prop()\nProp.x = property(lambda self: 1 / 0)\n\n"
    "class Self:\n    def __init__(self):\n        self.me = self\n\n"
    "class Deep:\n    def __init__(self, n):\n        self.next = Deep(n - 1) if n else None\n\n"
    "class Meta(type):\n    def __getattribute__(cls, name):\n        raise RuntimeError(name)\n\n"
    "class Weird(metaclass=Meta):\n    pass\n\n"
    "def f(k):\n"
    "    return [BadRepr(), BadAttr(), Loop(), PROP, Self(), Deep(150), 10 ** 100000, [BadRepr()] * 3,\n"
    "            (x for x in ()), Weird()][k]\n"
)


def test_hostile_values_never_crash_the_scoring(pool):
    calls = [f"f({k})" for k in range(10)]
    outs = run_calls(HOSTILE, calls, LIMITS)
    kinds = [o.value["type"] if o.ok else o.error.split(":")[0] for o in outs]
    assert kinds[0] == "object" and outs[0].value["repr"] == "<unrepresentable RuntimeError>"
    assert outs[1].value == {"type": "record", "class": "solution.BadAttr", "kind": "instance", "fields": []}
    assert kinds[2] == "TimeoutError"  # the fallback's repr loops: our timer interrupts it
    assert kinds[3] == "object"  # reading a field raised
    assert outs[4].value["fields"][0][1] == {"type": "object", "class": "solution.Self", "repr": "<cycle>"}
    assert outs[5].ok is False and "nested too deeply" in outs[5].error
    assert kinds[6:] == ["int", "list", "object", "object"]
    # Scoring the same answer against itself: nothing raises, only comparable values pass.
    t = task(HOSTILE, *calls)
    rows = score_backend([t], [HOSTILE], pool)[0].detail["tests"]
    assert [r["passed"] for r in rows] == [False, True, False, False, False, False, True, False, False, False]


# ---------------------------------------------------------------- numpy and pandas


def _sandbox_imports(module: str, limits: SandboxLimits = LIMITS) -> bool:
    return run_calls(f"import {module}", ["1"], limits)[0].ok


@pytest.fixture(scope="module")
def sandbox_numpy():
    if not _sandbox_imports("numpy"):
        pytest.skip("numpy is not importable in the sandbox")


NUMPY_REF = (
    "import numpy as np\n\n"
    "def stats(xs):\n    a = np.array(xs)\n    return a.sum(), a.mean(), a.reshape(2, -1), a * 0.1\n\n"
    "def total(xs):\n    return np.int64(sum(xs))\n"
)


def test_numpy_values_in_the_sandbox(pool, sandbox_numpy):
    t = task(NUMPY_REF, "stats([1, 2, 3, 4])", "total([1, 2])")
    python = ("def stats(xs):\n    import numpy as np\n    a = np.array(xs, dtype=np.int32)\n"
              "    return int(a.sum()), sum(xs) / len(xs), a.reshape(2, 2), np.array([x / 10 for x in xs])\n\n"
              "def total(xs):\n    return sum(xs)\n")  # numpy scalars equal Python numbers; int32 arrays int64 ones
    floats = NUMPY_REF.replace("np.array(xs)", "np.array(xs, dtype=float)")  # a float array where ints are expected
    flat = NUMPY_REF.replace("a.reshape(2, -1)", "a")
    assert passed(pool, t, python, floats, flat) == [[True, True], [False, True], [False, True]]


PANDAS_LIMITS = SandboxLimits(cpu_seconds_per_call=5.0, wall_seconds_per_call=10.0, wall_seconds_total=30.0,
                              memory_mb=1024)  # importing pandas takes ~0.5 s and more than 256 MB


@pytest.fixture(scope="module")
def pandas_pool():
    if not _sandbox_imports("pandas", PANDAS_LIMITS):
        pytest.skip("pandas is not importable in the sandbox")
    with SandboxPool(workers=2, limits=PANDAS_LIMITS) as p:
        yield p


def test_pandas_values_in_the_sandbox(pandas_pool):
    pool = pandas_pool
    ref = ("import pandas as pd\n\ndef table(n):\n"
           "    return pd.DataFrame({'x': list(range(n)), 'y': [i / 3 for i in range(n)]})\n\n"
           "def col(n):\n    return table(n)['y']\n")
    other = ref.replace("i / 3", "i * (1 / 3)")
    renamed = ref.replace("'y'", "'z'")
    assert passed(pool, task(ref, "table(3)", "col(3)"), other, renamed) == [[True, True], [False, False]]


# ---------------------------------------------------------------- the encoder itself, on live numpy/pandas values


def test_encoder_on_numpy_and_pandas_values():
    np = pytest.importorskip("numpy")
    from colbench.scoring._sandbox_child import encode

    assert encode(np.float64(2.5)) == F(2.5, "numpy.float64")
    assert encode(np.int64(3)) == {"type": "int", "value": 3, "class": "numpy.int64"}
    assert encode(np.bool_(True))["type"] == "bool"
    arr = encode(np.array([[1, 2], [3, 4]], dtype=np.uint8))
    assert (arr["type"], arr["dtype"], arr["shape"]) == ("ndarray", "u", [2, 2])
    assert values_equal(arr, encode(np.array([[1, 2], [3, 4]])))  # unsigned vs signed ints: same kind
    assert not values_equal(arr, encode(np.array([[1.0, 2.0], [3.0, 4.0]])))
    assert not values_equal(arr, encode([[1, 2], [3, 4]]))
    assert values_equal(encode(np.array([0.1 + 0.2, np.nan])), encode(np.array([0.3, np.nan])))
    assert values_equal(encode(np.float64(2.0)), I(2)) and values_equal(encode(np.int64(7)), F(7.0))
    assert values_equal(encode(np.bool_(False)), {"type": "bool", "value": False})
    assert not values_equal(encode(np.bool_(True)), I(1))
    assert render(arr) == "ndarray([[1, 2], [3, 4]], kind='u')"
    with pytest.raises(ValueError, match="too large"):
        encode(np.zeros(10 ** 6))
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2], "b": [0.5, 1.0]}, index=["r", "s"])
    assert values_equal(encode(df), encode(df.copy() * 1))
    assert not values_equal(encode(df), encode(df[["b", "a"]]))  # column order counts
    assert values_equal(encode(df["b"]), encode(pd.Series([0.5, 1.0], index=["r", "s"], name="b")))
    assert not values_equal(encode(df["b"]), encode(pd.Series([0.5, 1.0], index=["r", "s"], name="c")))


# ---------------------------------------------------------------- values_equal / canonical / render tables


def enc(type_: str, cls: str | None = None, **fields):
    return {"type": type_, **({"class": cls} if cls else {}), **fields}


DT = "datetime.datetime"
ONE_DATE = enc("date", "datetime.date", value=[2024, 1, 1])


@pytest.mark.parametrize("a, b, equal", [
    (enc("decimal", "decimal.Decimal", value="0.10"), enc("fraction", "fractions.Fraction",
                                                          numerator=I(1), denominator=I(10)), True),
    (enc("decimal", "decimal.Decimal", value="0.1"), F(0.1), True),  # tolerance, unlike ==
    (enc("decimal", "decimal.Decimal", value="1E+5000"), {"type": "int", "hex": hex(10 ** 5000)}, True),
    (enc("fraction", "fractions.Fraction", numerator=I(1), denominator=I(3)), F(0.3333), False),
    (enc("decimal", "decimal.Decimal", value="NaN"), F("nan"), True),
    (F(2.0, "numpy.float64"), I(2), True),
    ({"type": "int", "value": 2, "class": "numpy.int64"}, {"type": "int", "value": 3}, False),
    ({"type": "str", "value": "a", "class": "solution.S"}, {"type": "str", "value": "a"}, True),  # as ==
    (enc("datetime", DT, value=[2024, 1, 1, 0, 0, 0, 0], utcoffset=None), ONE_DATE, False),
    (enc("datetime", DT, value=[2024, 1, 1, 1, 0, 0, 0], utcoffset=3_600_000_000),
     enc("datetime", DT, value=[2024, 1, 1, 0, 0, 0, 0], utcoffset=0), True),
    (enc("datetime", DT, value=[2024, 1, 1, 0, 0, 0, 0], utcoffset=None),
     enc("datetime", DT, value=[2024, 1, 1, 0, 0, 0, 0], utcoffset=0), False),  # naive != aware
    (enc("datetime", DT, value=[2024, 1, 1, 0, 0, 0, 0], utcoffset=None),
     enc("datetime", "pandas.Timestamp", value=[2024, 1, 1, 0, 0, 0, 0], utcoffset=None), False),
    (enc("timedelta", "datetime.timedelta", value=[1, 0, 0]), enc("timedelta", "datetime.timedelta",
                                                                 value=[0, 86_400, 0]), True),
    (enc("class", name="builtins.int"), enc("class", name="builtins.int"), True),
    (enc("class", name="builtins.int"), enc("class", name="solution.int"), False),
    (enc("enum", "solution.E", name="A", value=I(1)), I(1), False),
    (enc("record", "solution.P", kind="namedtuple", fields=[["x", I(1)]]), {"type": "tuple", "items": [I(1)]}, False),
    (enc("record", "solution.P", kind="instance", fields=[["x", I(1)], ["y", F(0.5)]]),
     enc("record", "solution.P", kind="instance", fields=[["y", F(0.5000000001)], ["x", I(1)]]), True),
    (enc("record", "solution.P", kind="instance", fields=[["x", I(1)]]),
     enc("record", "solution.Q", kind="instance", fields=[["x", I(1)]]), False),
    (enc("ndarray", "numpy.ndarray", dtype="i", shape=[2], items=[I(1), I(2)]),
     enc("ndarray", "numpy.ndarray", dtype="i", shape=[1, 2], items=[I(1), I(2)]), False),
    (enc("sequence", "collections.deque", items=[I(1)]), {"type": "list", "items": [I(1)]}, False),
])
def test_values_equal_structural(a, b, equal):
    assert values_equal(a, b) is equal
    assert values_equal(b, a) is equal


def test_sets_and_dict_keys_of_the_new_types(pool):
    ref = ("from datetime import date, timedelta\n\n"
           "def days(n):\n    return {date(2024, 1, 1) + timedelta(i) for i in range(n)}\n\n"
           "def by_day(n):\n    return {d: d.weekday() for d in days(n)}\n\n"
           "def kinds():\n    return {int, str, float}\n")
    other = ("import datetime\n\ndef days(n):\n    start = datetime.date.fromisoformat('2024-01-01')\n"
             "    return frozenset(start + datetime.timedelta(days=n - 1 - i) for i in range(n))\n\n"
             "def by_day(n):\n    return dict(sorted((d, d.isoweekday() - 1) for d in days(n)))\n\n"
             "def kinds():\n    return {float, str, int}\n")
    assert passed(pool, task(ref, "days(300)", "by_day(300)", "kinds()"), other) == [[True, True, True]]
    one_date = canonical(ONE_DATE)
    assert one_date == canonical({**ONE_DATE, "value": [2024, 1, 1]})
    assert canonical(F(1.0, "numpy.float64")) == canonical(I(1)) == canonical(
        enc("decimal", "decimal.Decimal", value="1.00"))


def test_render_new_types():
    assert render(enc("datetime", DT, value=[2024, 3, 1, 9, 30, 0, 0], utcoffset=None)) == \
        "datetime.datetime(2024, 3, 1, 9, 30)"
    assert render(enc("timedelta", "datetime.timedelta", value=[1, 5, 0])) == "datetime.timedelta(days=1, seconds=5)"
    assert render({"type": "list", "items": [enc("class", name="builtins.int"), enc("class", name="solution.A")]}) \
        == "[<class 'int'>, <class 'solution.A'>]"
    assert render(enc("decimal", "decimal.Decimal", value="1.50")) == "Decimal('1.50')"
    assert render(enc("fraction", "fractions.Fraction", numerator=I(1), denominator=I(3))) == "Fraction(1, 3)"
    assert render(F(2.5, "numpy.float64")) == "numpy.float64(2.5)"
    assert render(enc("record", "solution.P", kind="namedtuple", fields=[["x", I(1)]])) == "solution.P(x=1)"
    assert render(enc("enum", "solution.E", name="A", value=I(1))) == "<solution.E.A: 1>"
    assert render({"type": "date", "value": "garbage"}).startswith("{")  # malformed: shown raw, never raises


# ---------------------------------------------------------------- the loader


def test_loader_accepts_references_returning_the_new_types():
    good = [
        task(DEADLINE, "deadline((2024, 2, 27), 3)", task_id="datetime"),
        task("def kinds(xs):\n    return [type(x) for x in xs]\n", "kinds([1, 'a'])", task_id="types"),
        task(RECORDS, *RECORD_TESTS, task_id="records"),
    ]
    bad = [
        task("def f():\n    return len\n", "f()", task_id="function"),
        task("def f():\n    return (i for i in range(3))\n", "f()", task_id="generator"),
        # seeds make id() and the RNGs repeat; the OS's entropy does not
        task("import os\n\nclass Box:\n    pass\n\ndef f():\n    b = Box()\n    b.id = os.urandom(8).hex()\n    return b\n",
             "f()", task_id="id"),
    ]
    reasons = validate_references(good + bad, workers=2)
    assert set(reasons) == {"function", "generator", "id"}
    assert "not plain data" in reasons["function"] and "builtin_function_or_method" in reasons["function"]
    assert "not plain data" in reasons["generator"]
    assert "nondeterministic" in reasons["id"]
