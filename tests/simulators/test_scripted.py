"""The scripted simulated humans: deterministic, never code, failures injected on cue."""

from __future__ import annotations

import pytest

from testbed.env import make_tasks
from colbench.stats import DONT_KNOW
from colbench.types import Task, Turn
from engines.base import SpecError
from simulators import load_simulator, register_simulator, simulator_names
from simulators.base import SimRequest
from simulators.scripted import DontKnowSimulator, FlakySimulator, ScriptedBackendSimulator, describe_function

SOURCE = '''import math

def tip(bill, percent=15, *, round_up=False):
    """Tip for a bill."""
    value = bill * percent / 100
    return math.ceil(value) if round_up else round(value, 2)
'''


def request(hidden: str, question: str = "What should it do?") -> SimRequest:
    task = Task("t", "backend", "I need tip(bill, percent).", hidden, ("tip(10)",))
    return SimRequest(task, [Turn("agent", question)])


def test_describe_function_names_parameters_and_constants_in_words():
    text = describe_function(SOURCE)
    assert text == ("It should be called tip and take bill, percent and round_up. "
                    "The values that matter are 15, 100 and 2.")
    assert "```" not in text and "def " not in text and "Tip for a bill" not in text  # docstrings are not constants


@pytest.mark.parametrize("source", ["def broken(:", "x = 1", ""])
def test_describe_function_says_it_does_not_know(source):
    assert DONT_KNOW.search(describe_function(source))


def test_scripted_backend_is_deterministic_and_capped():
    sim = ScriptedBackendSimulator(max_reply_chars=30)
    a = sim.reply([request(SOURCE), request(SOURCE, "Anything else?")])
    b = ScriptedBackendSimulator(max_reply_chars=30).reply([request(SOURCE)])
    assert a[0] == a[1] == b[0] and len(a[0].text) == 30 and not a[0].failed


def test_dont_know_and_flaky():
    assert [r.text for r in DontKnowSimulator().reply([request(SOURCE)] * 2)] == ["I don't know."] * 2
    flaky = FlakySimulator(fail_every=3)
    replies = flaky.reply([request(SOURCE)] * 4) + flaky.reply([request(SOURCE)] * 2)
    assert [r.failed for r in replies] == [False, False, True, False, False, True]
    assert replies[2].text == "" and replies[2].error == "scripted failure (reply #3)"


def test_registry_loads_scripted_and_user_simulators():
    from testbed.env import TestbedEnv

    env = TestbedEnv()
    assert load_simulator(None, env) is None
    assert isinstance(load_simulator("scripted:backend", env, max_reply_chars=50), ScriptedBackendSimulator)
    with pytest.raises(SpecError, match="unknown simulator 'scripted:nope'; known: scripted:appworld, scripted:backend"):
        load_simulator("scripted:nope", env)
    register_simulator("echo-idk", "simulators.scripted:DontKnowSimulator")
    assert "echo-idk" in simulator_names()
    assert isinstance(load_simulator("scripted:echo-idk", env), DontKnowSimulator)
    with pytest.raises(ValueError, match="module:Class"):
        register_simulator("bad", "simulators.scripted.DontKnowSimulator")
    with pytest.raises(SpecError, match="no model simulator for env 'testbed'"):
        load_simulator("tiny", env)


def test_scripted_backend_on_testbed_task_mentions_its_constants():
    task = make_tasks("test", n=1, bed="legacy")[0]
    [r] = ScriptedBackendSimulator().reply([SimRequest(task, [Turn("agent", "?")])])
    assert str(task.meta["a"]) in r.text and str(task.meta["b"]) in r.text


def test_model_simulator_specs_are_checked_without_loading():
    from simulators import check_simulator_spec

    check_simulator_spec("tiny", "backend")
    check_simulator_spec("text+tiny", "frontend")
    with pytest.raises(SpecError, match="frontend env only"):
        check_simulator_spec("text+tiny", "backend")
    with pytest.raises(SpecError, match="does not exist"):
        check_simulator_spec("hf:/no/such/dir", "frontend")
    with pytest.raises(SpecError, match="bad model spec"):
        check_simulator_spec("hf:", "backend")
