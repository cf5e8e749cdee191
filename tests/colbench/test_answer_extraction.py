"""Reading the final answer out of what a real model writes (BackendEnv.is_final,
extract_answer, episode_answer): the strings below are SmolLM2-135M-Instruct's own shapes
(fences, prose around code, markers written its way), and each answer is scored for real."""

from __future__ import annotations

import pytest

from colbench.envs.backend import BackendEnv
from colbench.scoring.backend import defines, extract_function_code, target_function
from colbench.types import Task, Turn

DESCRIPTION = "I need the total of my list. The signature of the function is: def sum_list(numbers)"
CODE = "def sum_list(numbers):\n    return sum(numbers)"
TASK = Task(task_id="backend-x", env="backend", description=DESCRIPTION, hidden=CODE,
            tests=("sum_list([1, 2])", "sum_list([])", "sum_list([-1, 5, 2.5])"))

# SmolLM2's answer to "Write a Python function that returns the sum of a list of numbers"
SMOL = ("```python\ndef sum_list(numbers):\n    return sum(numbers)\n```\n\nThis function uses the built-in `sum` "
        "function to calculate the sum of the input list. If you want to implement it manually without using "
        "the built-in function, you can use a loop:\n\n```python\ndef total(numbers):\n    return sum(num for num "
        "in numbers if num > 0)\n```\n\nThis function uses a generator expression.")


@pytest.fixture(scope="module")
def env():
    e = BackendEnv(workers=1)
    yield e
    e.close()


@pytest.mark.parametrize("text", [
    "I WANT TO ANSWER:\n" + CODE,
    "i want to answer:\n" + CODE,
    "**I WANT TO ANSWER:**\n```python\n" + CODE + "\n```",
    "I want to answer\n```python\n" + CODE + "\n```",
    "Thanks! I  WANT TO  ANSWER :\n\n" + CODE,
    "# I want to answer:\n" + CODE,
])
def test_the_marker_as_models_write_it_ends_the_dialogue_and_leaves_the_code(env, text):
    assert env.is_final(text)
    assert env.extract_answer(text, "sum_list") == CODE


@pytest.mark.parametrize("text", ["I want to answer your question first: what is a list?",
                                  "Before I WANT TO ANSWER, can you tell me about empty lists?"])
def test_prose_that_only_mentions_answering_is_a_question(env, text):
    assert not env.is_final(text)


def test_the_block_defining_the_asked_function_wins_over_earlier_blocks():
    text = "Example:\n```python\nprint(total([1]))\n```\nThe function:\n```py\n" + CODE + "\n```"
    assert extract_function_code(text, "sum_list") == CODE
    assert extract_function_code(SMOL, "sum_list") == CODE
    assert extract_function_code(SMOL, "total").startswith("def total(")


def test_code_inside_prose_without_fences_and_an_unclosed_fence():
    prose = f"Sure, here is the function you asked for:\n{CODE}\nIt adds every number. Let me know!"
    assert extract_function_code(prose, "sum_list") == CODE
    inline = "Here it is: import math\n" + CODE  # a model that writes code straight after prose
    assert defines(extract_function_code("Sure.\n" + inline.split(": ", 1)[1], "sum_list"), "sum_list")
    assert extract_function_code("```python\n" + CODE + "\n", "sum_list") == CODE  # cut at max_new_tokens
    assert target_function(DESCRIPTION) == "sum_list"


def test_an_answer_in_the_first_turn_and_at_the_turn_limit(env):
    first = [Turn(role="agent", content="I WANT TO ANSWER:\n```python\n" + CODE + "\n```")]
    assert env.episode_answer(TASK, first) == CODE
    # no marker ever: the last message asks again, the code was written two turns earlier
    turns = [Turn(role="agent", content=SMOL), Turn(role="human", content="ok"),
             Turn(role="agent", content="Do you want me to handle empty lists?"), Turn(role="human", content="yes"),
             Turn(role="agent", content="Is there anything else you need?")]
    assert env.episode_answer(TASK, turns) == CODE
    turns[-1] = Turn(role="agent", content="Final version:\n```python\ndef sum_list(numbers):\n    return 0\n```")
    assert env.episode_answer(TASK, turns) == "def sum_list(numbers):\n    return 0"  # the latest definition
    assert env.episode_answer(TASK, turns[2:3]) == "Do you want me to handle empty lists?"  # no code at all


def test_extracted_answers_score_in_the_sandbox(env):
    answers = [env.episode_answer(TASK, [Turn(role="agent", content=t)])
               for t in (SMOL, "**I want to answer:**\n" + CODE, "What should an empty list give?")]
    scores = env.score([TASK] * 3, answers)
    assert [s.reward for s in scores] == [1.0, 1.0, 0.0]
