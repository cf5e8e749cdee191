"""Backend scoring: code extraction, value comparison, and score_backend end to end with
real sandboxes."""

from __future__ import annotations

import pytest

from colbench.scoring.backend import ReferenceCache, extract_code, render, score_backend, values_equal
from colbench.scoring.sandbox import SandboxLimits, SandboxPool
from colbench.types import Task

LIMITS = SandboxLimits(cpu_seconds_per_call=0.5, wall_seconds_per_call=1.0, wall_seconds_total=3.0, memory_mb=256)

REFERENCE = (
    "import math\n\n"
    "def _tax(x):\n    return x * 0.2\n\n"
    "def net_pay(hours, rate):\n"
    "    gross = hours * rate if hours <= 40 else 40 * rate + (hours - 40) * rate * 1.5\n"
    "    return round(gross - _tax(gross), 2)\n"
)
TESTS = ("net_pay(0, 10)", "net_pay(10, 10)", "net_pay(40, 10)", "net_pay(41, 10)", "net_pay(50, 20)",
         "net_pay(1, 1)", "net_pay(45, 12.5)", "net_pay(100, 1)", "net_pay(39, 3)", "net_pay(60, 7)")
TASK = Task(task_id="pay", env="backend", description="net pay; def net_pay(hours, rate)", hidden=REFERENCE, tests=TESTS)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=LIMITS) as p:
        yield p


def I(v):  # noqa: E743 - short encoders keep the tables readable
    return {"type": "int", "value": v}


def F(v):
    return {"type": "float", "value": v}


def L(*items, t="list"):
    return {"type": t, "items": list(items)}


# ---------------------------------------------------------------- extract_code


@pytest.mark.parametrize("text, code", [
    ("Here:\n```python\ndef f():\n    return 1\n```\nthanks", "def f():\n    return 1"),
    ("```\ndef g(): pass\n```", "def g(): pass"),
    ("```text\nnot code\n```\n```py\nx = 1\n```", "x = 1"),
    ("```python\ndef f(): pass\n```\n```python\ndef second(): pass\n```", "def f(): pass"),
    ("  def f(x):\n    return x  ", "def f(x):\n    return x"),
    ("```python\ndef f():\n    return 2\n", "def f():\n    return 2"),  # unclosed fence (truncated output)
])
def test_extract_code(text, code):
    assert extract_code(text) == code


# ---------------------------------------------------------------- values_equal


@pytest.mark.parametrize("a, b, equal", [
    (I(2), I(2), True),
    (I(2), F(2.0), True),  # numeric: int vs float by value
    (F(0.1 + 0.2), F(0.3), True),  # float tolerance
    (F(1.0), F(1.001), False),
    (F(1e-12), F(0.0), True),  # abs_tol
    (F("nan"), F("nan"), True),
    (F("inf"), F("inf"), True),
    (F("inf"), F("-inf"), False),
    (F("inf"), F(1e308), False),
    (I(10 ** 20), I(10 ** 20 + 1), False),  # ints exactly
    ({"type": "bool", "value": True}, I(1), False),  # bool is its own type
    (L(I(1), I(2)), L(I(1), I(2), t="tuple"), False),  # list != tuple
    (L(I(1), I(2)), L(I(1), I(2)), True),
    (L(I(1)), L(I(1), I(2)), False),
    (L(I(1), I(2), t="set"), L(I(2), F(1.0), t="set"), True),
    ({"type": "dict", "items": [[I(1), F(0.5)], [I(2), I(3)]]},
     {"type": "dict", "items": [[I(2), I(3)], [F(1.0), F(0.5000000001)]]}, True),  # order and 1 == 1.0 keys
    ({"type": "dict", "items": [[I(1), I(2)]]}, {"type": "dict", "items": [[I(1), I(3)]]}, False),
    ({"type": "str", "value": "a"}, {"type": "str", "value": "a"}, True),
    ({"type": "str", "value": "1"}, I(1), False),
    ({"type": "none"}, {"type": "none"}, True),
    ({"type": "object", "repr": "x"}, {"type": "object", "repr": "x"}, False),  # never equal
    ({"type": "int", "hex": hex(2 ** 40000)}, {"type": "int", "hex": hex(2 ** 40000)}, True),
])
def test_values_equal(a, b, equal):
    assert values_equal(a, b) is equal
    assert values_equal(b, a) is equal


def test_render_is_short_and_readable():
    assert render(L(I(1), F(2.5), {"type": "str", "value": "x"}, t="tuple")) == "(1, 2.5, 'x')"
    assert len(render(L(*[I(i) for i in range(1000)]), limit=50)) == 50


# ---------------------------------------------------------------- score_backend


def test_reference_scores_one_and_wrong_scores_zero(pool):
    scores = score_backend([TASK, TASK], [REFERENCE, "def net_pay(hours, rate):\n    return -1\n"], pool)
    assert (scores[0].reward, scores[0].success) == (1.0, True)
    assert (scores[1].reward, scores[1].success) == (0.0, False)
    assert scores[1].detail["tests"][0]["expected"] == "0.0" and scores[1].detail["tests"][0]["got"] == "-1"


def test_half_correct_scores_half(pool):
    # Correct for hours <= 40 (tests 1, 2, 3, 6, 9 = 5 of 10), no overtime bonus otherwise.
    answer = "def net_pay(hours, rate):\n    return round(hours * rate * 0.8, 2)\n"
    score = score_backend([TASK], [answer], pool)[0]
    assert score.reward == 0.5 and not score.success
    assert [t["passed"] for t in score.detail["tests"]] == [True, True, True, False, False,
                                                            True, False, False, True, False]


def test_float_tolerance_and_different_code_shape(pool):
    # Same maths, different rounding path and a module-level import: passes with tolerance.
    answer = ("from math import fsum\n\ndef net_pay(hours, rate):\n"
              "    extra = max(0, hours - 40)\n    return fsum([0.8 * rate * (hours - extra), 0.8 * 1.5 * rate * extra])\n")
    score = score_backend([TASK], [answer], pool)[0]
    assert score.success, score.detail


def test_rigged_eq_scores_zero(pool):
    answer = ("class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n\n"
              "class Sneaky(float):\n    def __eq__(self, other):\n        return True\n\n"
              "def net_pay(hours, rate):\n    return Anything() if hours % 2 else Sneaky(-1.0)\n")
    score = score_backend([TASK], [answer], pool)[0]
    assert score.reward == 0.0 and not score.success


def test_hostile_and_broken_answers_score_zero_without_raising(pool):
    answers = ["def net_pay(:\n", "import os\nos._exit(1)\n", "def net_pay(h, r):\n    while True:\n        pass\n",
               "I cannot write code.", ""]
    scores = score_backend([TASK] * len(answers), answers, pool)
    assert [s.reward for s in scores] == [0.0] * len(answers)
    assert scores[0].error.startswith("SyntaxError")
    assert scores[1].error.startswith("sandbox crashed")
    assert all(t["error"] for t in scores[2].detail["tests"])


def test_failing_reference_fails_the_test_and_says_why(pool):
    task = Task(task_id="bad-ref", env="backend", description="", hidden="def f(x):\n    return 10 // x\n",
                tests=("f(2)", "f(0)"))
    score = score_backend([task], ["def f(x):\n    return 10 // x\n"], pool)[0]
    assert score.reward == 0.5 and not score.success
    assert score.detail["reference_errors"] == 1
    assert score.detail["tests"][1]["error"].startswith("reference failed: ZeroDivisionError")


def test_reference_outputs_are_cached(pool):
    cache = ReferenceCache()
    score_backend([TASK, TASK], [REFERENCE, REFERENCE], pool, cache=cache)
    assert len(cache) == 1
    changed = Task(**{**TASK.to_json(), "hidden": REFERENCE.replace("0.2", "0.25"), "tests": TESTS})
    scores = score_backend([changed], [REFERENCE], pool, cache=cache)  # same id, new source: recomputed
    assert len(cache) == 2 and scores[0].reward < 1.0


class CountingPool(SandboxPool):
    """The real pool, counting the sandboxes submitted."""

    def __init__(self):
        super().__init__(workers=2)
        self.sources: list[str] = []

    def submit(self, job):
        self.sources.append(job[0])
        return super().submit(job)


def test_identical_answers_to_one_task_run_once_and_each_gets_its_score():
    # os.urandom is never seeded: separate runs of this answer would differ almost surely
    draw = "import os\n\ndef net_pay(hours, rate):\n    return int.from_bytes(os.urandom(8), 'big')\n"
    other = Task(**{**TASK.to_json(), "task_id": "other", "tests": TESTS[:2]})
    tasks = [TASK, TASK, other, TASK, TASK]
    answers = [draw, REFERENCE, draw, draw, REFERENCE]
    with CountingPool() as counting:
        scores = score_backend(tasks, answers, counting, cache=ReferenceCache())
    # two references (TASK, other) and three distinct (task, answer) pairs
    assert sorted(counting.sources).count(draw) == 2 and counting.sources.count(REFERENCE) == 3
    got = [[row["got"] for row in scores[i].detail["tests"]] for i in (0, 2, 3)]
    assert got[0] == got[2] and len(set(got[0])) == len(TESTS)  # copies share one run's draws
    assert len(got[1]) == 2 and got[1][0] != got[0][0]  # another task's tests: its own run
    assert [s.success for s in scores] == [False, True, False, False, True]
    assert scores[0] is not scores[3] and scores[1] is not scores[4]


def test_task_without_tests_and_length_mismatch(pool):
    empty = Task(task_id="e", env="backend", description="", hidden="def f(): pass")
    assert score_backend([empty], ["def f(): pass"], pool)[0].error == "task 'e' has no tests"
    with pytest.raises(ValueError, match="1 tasks but 2 answers"):
        score_backend([empty], ["a", "b"], pool)
