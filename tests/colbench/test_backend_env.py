"""BackendEnv: the Environment contract for ColBench backend programming."""

from __future__ import annotations

import pytest

from colbench.envs import make_env
from colbench.envs.backend import BackendEnv
from colbench.protocols import Environment
from colbench.scoring.sandbox import SandboxLimits
from colbench.types import Task, Turn

REFERENCE = "def area(w, h):\n    return w * h if w > 0 and h > 0 else 0\n"
TASK = Task(task_id="area", env="backend", description="Compute an area. def area(w, h)", hidden=REFERENCE,
            tests=("area(2, 3)", "area(0, 3)", "area(-1, 2)", "area(2.5, 2)"))
LIMITS = SandboxLimits(cpu_seconds_per_call=0.5, wall_seconds_per_call=1.0, wall_seconds_total=3.0, memory_mb=256)


@pytest.fixture()
def env():
    e = make_env("backend", workers=2, limits=LIMITS)
    yield e
    e.close()


def test_registry_builds_a_backend_env(env):
    assert isinstance(env, BackendEnv) and isinstance(env, Environment)
    assert (env.name, env.answer_marker, env.max_turns) == ("backend", "I WANT TO ANSWER:", 10)
    assert env.training_info(TASK) == REFERENCE


def test_agent_messages_roles_and_prompt(env):
    turns = [Turn("agent", "What if w is negative?"), Turn("human", "Then the area is 0.")]
    msgs = env.agent_messages(TASK, turns)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"] == TASK.description
    assert msgs[2]["content"] == "What if w is negative?" and msgs[3]["content"] == "Then the area is 0."
    system = msgs[0]["content"]
    assert "I WANT TO ANSWER:" in system and "at most 10 turns" in system and "{" not in system.replace("{}", "")
    single = env.agent_messages(TASK, [], single_turn=True)
    assert [m["role"] for m in single] == ["system", "user"]
    assert "do not ask questions" in single[0]["content"] and "at most 1 turns" in single[0]["content"]


def test_custom_marker_and_turns():
    env = BackendEnv(answer_marker="FINAL:", max_turns=3)
    system = env.agent_messages(TASK, [])[0]["content"]
    assert "FINAL:" in system and "at most 3 turns" in system and "I WANT TO ANSWER" not in system
    assert env.is_final("FINAL: ```python\nx=1\n```") and not env.is_final("I WANT TO ANSWER: x")
    with pytest.raises(ValueError, match="max_turns"):
        BackendEnv(max_turns=0)


@pytest.mark.parametrize("text, final, answer", [
    ("Can you tell me what happens with zero?", False, "Can you tell me what happens with zero?"),
    ("I WANT TO ANSWER:\n```python\ndef area(w, h):\n    return w * h\n```", True, "def area(w, h):\n    return w * h"),
    ("Sure. I WANT TO ANSWER: def area(w, h): return 0", True, "def area(w, h): return 0"),
    ("```python\ndef early(): pass\n```\nI WANT TO ANSWER:\n```python\ndef area(w, h): return 1\n```", True,
     "def area(w, h): return 1"),  # the code after the marker, not before it
    ("```python\ndef area(w, h): return 2\n```", False, "def area(w, h): return 2"),  # turn limit: whole message
])
def test_is_final_and_extract_answer(env, text, final, answer):
    assert env.is_final(text) is final
    assert env.extract_answer(text) == answer


def test_score_end_to_end(env):
    good = env.extract_answer("I WANT TO ANSWER:\n```python\ndef area(w, h):\n    if w <= 0 or h <= 0:\n"
                              "        return 0\n    return w * h\n```")
    half = "def area(w, h):\n    return w * h\n"  # only area(-1, 2) differs (-2 vs 0): 3 of 4 pass
    bad = "import os\nos.kill(os.getppid(), 9)\n"
    scores = env.score([TASK, TASK, TASK], [good, half, bad])
    assert (scores[0].reward, scores[0].success) == (1.0, True)
    assert (scores[1].reward, scores[1].success) == (0.75, False)
    assert scores[2].reward == 0.0 and scores[2].error
    env.close()
    env.close()  # idempotent
    assert env.score([TASK], [good])[0].success  # a closed env reopens its pool on demand
