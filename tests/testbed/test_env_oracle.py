"""The test bed's exact per-turn advantage (testbed.env.optimal_advantage), the
oracle critic's ranking: hand-computed cases, and agreement with the scripted human's
rule and the sandboxed scorer it stands in for."""

import pytest

from colbench.envs import make_env
from testbed.env import (
    DEFAULT_A,
    DEFAULT_B,
    QUESTION_NEG,
    QUESTION_POS,
    QUESTION_VAGUE,
    REFERENCE,
    answer_text,
    constants_from_reference,
    make_tasks,
    optimal_advantage,
)
from colbench.protocols import ANSWER_MARKER
from testbed.human import reply_for

A, B = 3, 20
TOLD_A = [reply_for(QUESTION_POS, A, B)]
TOLD_BOTH = [reply_for(QUESTION_POS, A, B), reply_for(QUESTION_NEG, A, B)]
BOTH = "What happens to positive and negative numbers?"
GUESS = answer_text(DEFAULT_A, DEFAULT_B)  # the explorer's default: never right
BROKEN = f"{ANSWER_MARKER}\n```python\ndef f(x):\n    if x >= 0\n        return x * {A}\n    return x + {B}\n```"


def adv(history, action, turns_left):
    return optimal_advantage(history, action, A, B, turns_left)


def test_first_turn_asking_beats_answering():
    # V*(nothing known, 4 turns) = 1: ask both constants, then answer
    assert adv([], QUESTION_POS, 4) == 0.0  # 3 turns left: ask about negatives, then answer
    assert adv([], GUESS, 4) == -1.0
    assert adv([], QUESTION_POS, 4) > adv([], GUESS, 4)
    assert adv([], answer_text(A, B), 4) == 0.0  # a lucky guess of both: the oracle sees c


def test_told_a_asking_about_negatives_beats_positives_when_turns_are_tight():
    assert adv(TOLD_A, QUESTION_NEG, 2) == 0.0  # learns B, answers 1.0 next turn
    assert adv(TOLD_A, QUESTION_POS, 2) == -0.5  # learns nothing new: 0.5 at best
    assert adv(TOLD_A, QUESTION_VAGUE, 2) == -0.5
    assert adv(TOLD_A, answer_text(A, DEFAULT_B), 2) == -0.5  # answers now with what it knows
    # with a turn to spare, a wasted question costs nothing
    assert adv(TOLD_A, QUESTION_POS, 3) == 0.0
    # nothing known, two turns: only the question naming both sides keeps full reward
    assert [adv([], q, 2) for q in (BOTH, QUESTION_NEG, QUESTION_POS, QUESTION_VAGUE)] == [0.0, -0.5, -0.5, -1.0]


def test_last_turn_scores_the_answer():
    assert adv(TOLD_BOTH, answer_text(A, B), 1) == 0.0
    assert adv(TOLD_BOTH, QUESTION_NEG, 1) == -1.0  # no answer: reward 0
    assert adv(TOLD_BOTH, QUESTION_NEG, 1) < adv(TOLD_BOTH, answer_text(A, B), 1)
    assert adv(TOLD_A, QUESTION_NEG, 1) == -0.5
    # wrong constants score less than right ones
    assert adv(TOLD_BOTH, answer_text(A + 1, B), 1) == -0.5
    assert adv(TOLD_BOTH, answer_text(A, B + 1), 1) == -0.5
    assert adv(TOLD_BOTH, GUESS, 1) == -1.0
    # told A only: its best answer is 0.5, and a lucky right B is above that
    assert adv(TOLD_A, answer_text(A, DEFAULT_B), 1) == 0.0
    assert adv(TOLD_A, answer_text(A, B), 1) == 0.5


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
    reply = reply_for(question, A, B)
    best_after = 0.5 * (f"x * {A}" in reply) + 0.5 * (f"x + {B}" in reply)
    assert adv([], question, 2) == best_after - 1.0
    assert adv([reply], answer_text(A, B), 1) == 1.0 - best_after


def test_constants_from_reference():
    for task in make_tasks("train") + make_tasks("test"):
        assert constants_from_reference(task.hidden) == (task.meta["a"], task.meta["b"])
    assert constants_from_reference(REFERENCE.format(a=-4, b=7)) == (-4, 7)
    with pytest.raises(ValueError, match="not a test-bed reference"):
        constants_from_reference("def f(x):\n    return x\n")


def test_answer_reward_agrees_with_the_sandboxed_scorer():
    """The oracle parses answers; the environment runs them: same reward (last turn, both
    constants known, so reward = advantage + 1)."""
    task = next(t for t in make_tasks("test") if (t.meta["a"], t.meta["b"]) == (A, B))
    texts = [answer_text(A, B), answer_text(A + 1, B), answer_text(A, B - 10), GUESS, BROKEN,
             f"{ANSWER_MARKER}\ndef f(x):\n    return x * {A}",  # no fence, no branch: positives pass
             f"def f(x):\n    return x + {B}",  # no marker on the last turn: the runner scores it too
             QUESTION_POS]
    env = make_env("testbed")
    try:
        scores = env.score([task] * len(texts), [env.extract_answer(t) for t in texts])
    finally:
        env.close()
    rewards = [s.reward for s in scores]
    assert rewards == [1.0, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 0.0]
    assert [adv(TOLD_BOTH, t, 1) + 1.0 for t in texts] == pytest.approx(rewards)
