"""The oracle's exact per-turn advantage (testbed.mdp.exact_advantage) on the legacy bed:
hand-computed cases in success probability, and agreement with the scripted human's rule
(testbed.bed.human_reply) and the sandboxed scorer it stands in for. The default bed's
cases are tests/testbed/test_exact.py's."""

import pytest

from colbench.envs import make_env
from colbench.protocols import ANSWER_MARKER
from testbed import mdp
from testbed import bed as tb
from testbed.env import (
    DEFAULT_A,
    DEFAULT_B,
    QUESTION_NEG,
    QUESTION_POS,
    QUESTION_VAGUE,
    REFERENCE,
    answer_text,
    make_tasks,
)

LEGACY = tb.design("legacy")
A, B = 3, 20
HIDDEN = REFERENCE.format(a=A, b=B)
TOLD_A = [tb.human_reply(LEGACY, HIDDEN, QUESTION_POS)]
TOLD_BOTH = TOLD_A + [tb.human_reply(LEGACY, HIDDEN, QUESTION_NEG)]
BOTH = "What happens to positive and negative numbers?"
GUESS = answer_text(DEFAULT_A, DEFAULT_B)  # the explorer's default: never right
BROKEN = f"{ANSWER_MARKER}\n```python\ndef f(x):\n    if x >= 0\n        return x * {A}\n    return x + {B}\n```"


def adv(history, action, turns_left):
    return mdp.exact_advantage(LEGACY, HIDDEN, history, action, turns_left)


def test_first_turn_asking_beats_answering():
    # V*(nothing known, 4 turns) = 1: ask both constants, then answer
    assert adv([], QUESTION_POS, 4) == 0.0  # 3 turns left: ask about negatives, then answer
    assert adv([], GUESS, 4) == -1.0
    assert adv([], answer_text(A, B), 4) == 0.0  # a lucky guess of both: the oracle sees c


def test_a_wasted_question_costs_success_only_when_turns_are_tight():
    assert adv(TOLD_A, QUESTION_NEG, 2) == 0.0  # learns B, answers right next turn
    assert adv(TOLD_A, QUESTION_POS, 2) == -1.0  # learns nothing new: B stays unknown
    assert adv(TOLD_A, QUESTION_VAGUE, 2) == -1.0
    assert adv(TOLD_A, answer_text(A, DEFAULT_B), 2) == -1.0  # answers now with what it knows
    assert adv(TOLD_A, QUESTION_POS, 3) == 0.0  # a turn to spare
    assert [adv([], q, 3) for q in (BOTH, QUESTION_NEG, QUESTION_POS, QUESTION_VAGUE)] == [0.0, 0.0, 0.0, -1.0]
    # V* is over the bed's actions (one side, the vague question, the answer): with two turns
    # left nothing succeeds, except a message naming both sides, which the legacy human answers
    assert [adv([], q, 2) for q in (BOTH, QUESTION_NEG, QUESTION_POS, QUESTION_VAGUE)] == [1.0, 0.0, 0.0, 0.0]


def test_last_turn_scores_the_answer():
    assert adv(TOLD_BOTH, answer_text(A, B), 1) == 0.0
    assert adv(TOLD_BOTH, QUESTION_NEG, 1) == -1.0  # no answer: no success
    assert adv(TOLD_BOTH, answer_text(A + 1, B), 1) == -1.0
    assert adv(TOLD_BOTH, answer_text(A, B + 1), 1) == -1.0
    assert adv(TOLD_BOTH, GUESS, 1) == -1.0
    # told A only: nothing it knows succeeds, a lucky right B does
    assert adv(TOLD_A, QUESTION_NEG, 1) == 0.0
    assert adv(TOLD_A, answer_text(A, DEFAULT_B), 1) == 0.0
    assert adv(TOLD_A, answer_text(A, B), 1) == 1.0
    # a reply stating another task's constant tells nothing
    assert adv(["For positive numbers it is x * 2."], answer_text(A, B), 1) == 1.0


def test_unparseable_answer_scores_zero():
    assert adv(TOLD_BOTH, BROKEN, 1) == -1.0  # missing colon: every test would fail
    assert adv(TOLD_BOTH, BROKEN, 3) == -1.0  # the marker ends the dialogue on any turn
    assert adv(TOLD_BOTH, f"{ANSWER_MARKER} I am not sure.", 2) == -1.0
    with pytest.raises(ValueError, match="turns_left"):
        adv([], QUESTION_POS, 0)


@pytest.mark.parametrize("question", [QUESTION_POS, QUESTION_NEG, QUESTION_VAGUE, BOTH, "POSITIVE ones?"])
def test_a_question_reveals_what_the_scripted_human_states(question):
    """The oracle's question rule is the scripted human's: after asking, the agent knows
    exactly the constants the reply states, and answers with them on its last turn."""
    reply = tb.human_reply(LEGACY, HIDDEN, question)
    knows_both = f"x * {A}" in reply and f"x + {B}" in reply
    assert adv([], question, 2) == float(knows_both)
    assert adv([reply], answer_text(A, B), 1) == 1.0 - knows_both


def test_answer_scores_agree_with_the_sandboxed_scorer():
    """The oracle parses answers; the environment runs them: success iff every test passes
    (last turn, both constants known, so success = advantage + 1)."""
    task = next(t for t in make_tasks("test", bed="legacy") if (t.meta["a"], t.meta["b"]) == (A, B))
    texts = [answer_text(A, B), answer_text(A + 1, B), answer_text(A, B - 10), GUESS, BROKEN,
             f"{ANSWER_MARKER}\ndef f(x):\n    return x * {A}",  # no fence, no branch: positives pass
             f"def f(x):\n    return x + {B}",  # no marker on the last turn: the runner scores it too
             QUESTION_POS]
    env = make_env("testbed", bed="legacy")
    try:
        scores = env.score([task] * len(texts), [env.extract_answer(t) for t in texts])
    finally:
        env.close()
    assert [s.reward for s in scores] == [1.0, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 0.0]
    assert [adv(TOLD_BOTH, t, 1) + 1.0 for t in texts] == [float(s.success) for s in scores]
