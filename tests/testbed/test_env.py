"""The legacy bed (testbed/env.py's own tasks, `builtin:legacy/<split>`): its tasks, reward,
scripted human and explorer."""

import random

import pytest

from colbench.envs import make_env
from testbed.env import (
    A_VALUES,
    B_VALUES,
    QUESTION_NEG,
    QUESTION_POS,
    QUESTION_VAGUE,
    REFERENCE,
    answer_text,
    make_tasks,
    told_constants,
)
from colbench.tasks import load_tasks
from colbench.types import Turn
from simulators import load_simulator
from simulators.base import SimRequest
from testbed import bed as tb
from testbed.human import DONT_KNOW, scripted_dialogue

LEGACY = tb.design("legacy")


def legacy_reply(question: str, a: int, b: int) -> str:
    """The scripted human's reply on a legacy task with constants (a, b)."""
    return tb.human_reply(LEGACY, REFERENCE.format(a=a, b=b), question)


@pytest.fixture(scope="module")
def env():
    e = make_env("testbed", bed="legacy")
    yield e
    e.close()


def test_tasks_are_deterministic_and_need_asking():
    train, test = make_tasks("train", bed="legacy"), make_tasks("test", bed="legacy")
    assert len(train) == 56 and len(test) == 16
    assert make_tasks("train", bed="legacy") == train
    # every task reads the same, so its constants can only be learned by asking
    assert len({t.description for t in train + test}) == 1
    assert {(t.meta["a"], t.meta["b"]) for t in test} == {(a, b) for a in A_VALUES for b in B_VALUES}
    assert {t.task_id for t in train}.isdisjoint(t.task_id for t in test)
    assert all(len(t.tests) == 10 for t in train + test)
    assert load_tasks("builtin:legacy/test", env="testbed") == test
    assert len(load_tasks("builtin:legacy/train", env="testbed", limit=3)) == 3


@pytest.mark.parametrize(
    "a_guess,b_guess,expected",
    [(None, None, 1.0),  # the true constants: all ten tests
     ("wrong", None, 0.5),  # positive side wrong: the five negative tests pass
     (None, "wrong", 0.5),
     ("wrong", "wrong", 0.0)],
)
def test_reward_is_the_fraction_of_hidden_tests(env, a_guess, b_guess, expected):
    task = make_tasks("test", bed="legacy")[0]
    a, b = task.meta["a"], task.meta["b"]
    a = a + 1 if a_guess == "wrong" else a
    b = b + 1 if b_guess == "wrong" else b
    text = answer_text(a, b)
    assert env.is_final(text)
    [score] = env.score([task], [env.extract_answer(text)])
    assert score.reward == pytest.approx(expected)
    assert score.success == (expected == 1.0)


def test_scripted_human_answers_only_what_is_asked():
    """testbed.bed.human_reply on the legacy bed: every side the message names, in fact
    order, whatever the wording's case; nothing named: "I don't know." (no docstring)."""
    assert legacy_reply(QUESTION_POS, 3, 7) == "For positive numbers it is x * 3."
    assert legacy_reply(QUESTION_NEG, 3, 7) == "For negative numbers it is x + 7."
    assert legacy_reply(QUESTION_VAGUE, 3, 7) == DONT_KNOW
    both = "For positive numbers it is x * 3. For negative numbers it is x + 7."
    assert legacy_reply("positive and negative?", 3, 7) == legacy_reply("NEGATIVE and Positive?", 3, 7) == both
    with pytest.raises(ValueError, match="not a 'legacy' test-bed reference"):
        tb.human_reply(LEGACY, "def f(x):\n    return x\n", QUESTION_POS)


def test_told_constants_reads_only_the_tasks_stated_values():
    a, b = 3, 20
    assert told_constants([legacy_reply(QUESTION_POS, a, b)], a, b) == (True, False)
    assert told_constants([legacy_reply(QUESTION_VAGUE, a, b), legacy_reply(QUESTION_NEG, a, b)], a, b) == (False, True)
    assert told_constants(["For positive numbers it is x * 2."], a, b) == (False, False)  # another task's A
    assert told_constants(["x * 30 and x + 200"], a, b) == (False, False)  # not A or B, though they start alike


def test_simulator_through_the_registry(env):
    sim = load_simulator("scripted:testbed", env)
    task = make_tasks("train", bed="legacy")[0]
    [reply] = sim.reply([SimRequest(task, [Turn("agent", QUESTION_NEG)])])
    assert not reply.failed and reply.text == f"For negative numbers it is x + {task.meta['b']}."
    # a task without hidden constants is a recorded failure, not an invented reply
    [bad] = sim.reply([SimRequest(make_tasks("test")[0].__class__("x", "testbed", "d", "h"), [Turn("agent", "hi")])])
    assert bad.failed and "not a testbed task" in bad.error


def test_scripted_explorer_succeeds_exactly_when_it_asked_both_questions(env):
    rng = random.Random(0)
    tasks = make_tasks("train", bed="legacy")
    dialogues = [scripted_dialogue(tasks[i % len(tasks)], rng, p_ask=0.6) for i in range(300)]
    answers = [env.extract_answer(d[-1][1]) for d in dialogues]
    scores = env.score([tasks[i % len(tasks)] for i in range(300)], answers)
    for d, s in zip(dialogues, scores):
        asked = {text for role, text in d if role == "agent"}
        # the default guess for an untold constant is never right: success is earned by the questions
        assert s.success == (QUESTION_POS in asked and QUESTION_NEG in asked)
        assert s.reward == pytest.approx(0.5 * (QUESTION_POS in asked) + 0.5 * (QUESTION_NEG in asked))
    # every turn is a choice: answering at once, after one, two or three questions all occur
    assert {sum(role == "agent" for role, _ in d) for d in dialogues} == {1, 2, 3, 4}
    rate = sum(s.success for s in scores) / len(scores)
    assert 0.06 < rate < 0.25  # low by design (about 0.13): room for per-turn credit to help
