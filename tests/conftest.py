"""Fixtures shared across the test folders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pytest


@dataclass
class ScriptedTestbedEpisode:
    """One real test-bed episode against the scripted human: vague, vague, positive, then
    the right answer on the last (4th) turn. `path` is its episodes JSONL file."""

    task: object
    episode: object
    states: list
    path: Path


@pytest.fixture(scope="session")
def scripted_testbed_episode(tmp_path_factory) -> ScriptedTestbedEpisode:
    from colbench.envs.testbed import QUESTION_POS, QUESTION_VAGUE, TestbedEnv, answer_text, make_tasks
    from colbench.protocols import AgentRequest
    from colbench.rollout import rollout
    from engines.base import Sample
    from simulators.testbed import TestbedSimulator
    from sweet.core.records import episode_states

    script = (QUESTION_VAGUE, QUESTION_VAGUE, QUESTION_POS)

    class ScriptedAgent:
        name = "policy"

        def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
            out = []
            for r in requests:
                asked = sum(m["role"] == "assistant" for m in r.messages)
                a, b = r.task.meta["a"], r.task.meta["b"]
                out.append(Sample(script[asked] if asked < len(script) else answer_text(a, b)))
            return out

    task = make_tasks("train", n=1)[0]
    path = tmp_path_factory.mktemp("scripted_testbed") / "episodes.jsonl"
    env = TestbedEnv()
    try:
        [ep] = rollout(env, [task], ScriptedAgent(), TestbedSimulator(), max_turns=4, out_path=path)
        states = episode_states(ep, env.training_info(task))
    finally:
        env.close()
    return ScriptedTestbedEpisode(task, ep, states, path)
