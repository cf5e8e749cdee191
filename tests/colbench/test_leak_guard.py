"""The leak guard (colbench.leaks) in the episode runner: a simulated human that pastes the
hidden reference never gets a reference line to the agent, and every leak is counted.

Real backend tasks (tasks/backend/test.jsonl, references validated in the sandbox), the real
runner and scoring; the humans below are the misbehaving ones the guard exists for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from colbench.envs import make_env
from colbench.episodes import read_episodes
from colbench.leaks import FIXED_REPLY, LeakGuard, leaked_lines, normalise, resample_seed
from colbench.protocols import AgentRequest, SimReply, SimRequest
from colbench.rollout import rollout
from colbench.stats import behaviour_stats
from colbench.tasks import load_tasks
from engines.base import Sample

ROOT = Path(__file__).resolve().parents[2]


class AskingAgent:
    """Asks `questions` questions, then answers with the reference (so episodes score 1)."""

    needs_simulator = True
    name = "asker"

    def __init__(self, questions: int = 3):
        self.questions = questions

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        out = []
        for r in requests:
            asked = sum(1 for m in r.messages if m["role"] == "assistant")
            text = (f"What should happen in case {asked + 1}?" if asked < self.questions
                    else f"I WANT TO ANSWER:\n```python\n{r.task.hidden}\n```")
            out.append(Sample(text=text))
        return out


class PastingHuman:
    """Pastes the whole reference as plain text inside prose in every reply, whatever the
    sampling (a model that always leaks); records every request it got."""

    name = "paster"

    def __init__(self, leak_when_sampled: bool = True):
        self.leak_when_sampled = leak_when_sampled
        self.requests: list[SimRequest] = []

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        self.requests += requests
        out = []
        for r in requests:
            if r.temperature is not None and not self.leak_when_sampled:
                out.append(SimReply("It should handle the small cases first, then the big ones."))
            else:
                flat = " ".join(r.task.hidden.split())  # one line of prose, as a chat model writes
                out.append(SimReply(f"Sure! Here is exactly what I have: {flat} Hope that helps."))
        return out


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(str(ROOT / "tasks/backend/test.jsonl[0:4]"), env="backend")


@pytest.fixture(scope="module")
def env():
    e = make_env("backend", workers=2)
    yield e
    e.close()


def long_reference_lines(task) -> list[str]:
    """The reference's lines of 30+ characters that the description does not hold."""
    return [line.strip() for line in task.hidden.splitlines()
            if len(line.strip()) >= 30 and normalise(line) not in normalise(task.description)]


def test_a_pasting_human_gets_no_reference_line_to_the_agent_and_the_leaks_are_counted(env, tasks):
    assert all(long_reference_lines(t) for t in tasks)  # the tasks have lines to leak
    human = PastingHuman()
    eps = rollout(env, tasks, AskingAgent(3), human, seeds=(0,), max_turns=4)
    for task, ep in zip(tasks, eps):
        replies = [t.content for t in ep.turns if t.role == "human"]
        assert replies == [FIXED_REPLY] * 3
        agent_saw = " ".join(m["content"] for m in ep.turns[-1].prompt)  # the last prompt holds every reply
        for line in long_reference_lines(task):
            assert line not in agent_saw.replace(task.description, "")
            assert normalise(line) not in normalise(" ".join(replies))
        assert [leak["replaced"] for leak in ep.meta["leaks"]] == [True] * 3
        assert [len(leak["seeds"]) for leak in ep.meta["leaks"]] == [3] * 3  # k = 3 resamples each
        assert ep.meta["leak_guard"]["resamples"] == 3 and ep.score.success
    stats = behaviour_stats(eps)
    assert stats["leaks"] == 12 and stats["leaks_replaced"] == 12 and stats["leaks_per_episode"] == 3.0
    # each leaking reply was asked again 3 times, sampled, with seeds from the episode's
    sampled = [r for r in human.requests if r.temperature is not None]
    assert len(sampled) == 36 and {r.temperature for r in sampled} == {0.7}
    ep = eps[0]
    assert ep.meta["leaks"][1]["seeds"] == [resample_seed(ep.task_id, 0, 1, a) for a in (1, 2, 3)]


def test_a_resample_that_does_not_leak_replaces_the_leaking_reply(env, tasks):
    eps = rollout(env, tasks[:2], AskingAgent(2), PastingHuman(leak_when_sampled=False), seeds=(5,), max_turns=3)
    for ep in eps:
        replies = [t.content for t in ep.turns if t.role == "human"]
        assert replies == ["It should handle the small cases first, then the big ones."] * 2
        assert [(len(x["seeds"]), x["replaced"]) for x in ep.meta["leaks"]] == [(1, False)] * 2
    assert behaviour_stats(eps)["leaks_replaced"] == 0 and behaviour_stats(eps)["leaks"] == 4


def test_with_the_guard_off_the_reference_reaches_the_agent(env, tasks):
    eps = rollout(env, tasks[:1], AskingAgent(1), PastingHuman(), max_turns=2, leak_guard=False)
    reply = eps[0].turns[1].content
    assert all(normalise(line) in normalise(reply) for line in long_reference_lines(tasks[0]))
    assert "leaks" not in eps[0].meta and "leak_guard" not in eps[0].meta


def test_the_rule_ignores_the_signature_and_short_lines_and_catches_partial_lines():
    hidden = ("def price(total, member):\n    if member:\n        return round(total * 0.85 - 2.5, 2)\n"
              "    return total\n")
    description = "Compute a price. The signature of the function is: def price(total, member)"
    assert leaked_lines("The signature is def price(total, member): and members get money off.",
                        hidden, description) == []
    assert leaked_lines("if member: then return total", hidden, description) == []  # short lines
    assert leaked_lines("members pay ROUND( total*0.85 - 2.5 , 2) in the end", hidden, description) == \
        ["return round(total * 0.85 - 2.5, 2)"]
    assert leaked_lines("it does `return round(total * 0.85` then subtracts", hidden, description)  # half a line
    with pytest.raises(ValueError):
        LeakGuard(resamples=-1)


def test_evaluate_records_the_flag_and_refuses_to_mix_guarded_and_unguarded_runs(tmp_path):
    tasks = str(ROOT / "tasks/backend/test.jsonl[0:2]")
    cmd = [sys.executable, "-m", "colbench.evaluate", "--env", "backend", "--agent", "reference",
           "--simulator", "scripted:backend", "--tasks", tasks, "--output", str(tmp_path / "run"), "--progress", "false"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run/config.json").read_text())["config"]["leak_guard"] is True
    refused = subprocess.run(cmd + ["--leak_guard", "false"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "leak_guard=True" in refused.stderr.strip().splitlines()[-1]
    board = json.loads((tmp_path / "run/leaderboard.json").read_text())
    rows = board["rows"] if isinstance(board, dict) else board
    assert rows[0]["behaviour"]["leaks"] == 0 and rows[0]["behaviour"]["answer_parses"] == 1.0
    assert len(read_episodes(tmp_path / "run/episodes/reference.jsonl")) == 2


class CodeOnlyHuman:
    """Replies with nothing but code when greedy (a chat model echoing code: empty once the code
    is removed), in words when sampled, or never in words (`always_code`)."""

    name = "code-only"

    def __init__(self, always_code: bool = False):
        self.always_code = always_code

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        return [SimReply("It returns the total, rounded.") if r.temperature is not None and not self.always_code
                else SimReply("", failed=True, error="empty reply after removing code", resample=True)
                for r in requests]


def test_an_all_code_reply_is_asked_again_and_the_failure_stands_if_it_stays_empty(env, tasks):
    [ep] = rollout(env, tasks[:1], AskingAgent(1), CodeOnlyHuman(), max_turns=2)
    assert ep.turns[1].content == "It returns the total, rounded." and ep.stop_reason == "answered"
    assert [(len(r["seeds"]), r["fixed"]) for r in ep.meta["resampled_empty"]] == [(1, True)]
    assert "leaks" not in ep.meta
    [ep] = rollout(env, tasks[:1], AskingAgent(1), CodeOnlyHuman(always_code=True), max_turns=2)
    assert ep.turns[1].failed and ep.stop_reason == "simulator_error" and ep.n_simulator_failures == 1
    assert [(len(r["seeds"]), r["fixed"]) for r in ep.meta["resampled_empty"]] == [(3, False)]


def test_parameters_named_in_words_are_not_the_line_that_tests_them():
    hidden = ("def testimony(entity, has_criminal_charges, deadline_met=False):\n"
              "    if entity == 'USADA' and has_criminal_charges and deadline_met:\n        return True\n"
              "    return False\n    return total_amount_after_discount\n")
    description = "The signature of the function is: def testimony(entity, has_criminal_charges, deadline_met=False)"
    words = "It takes entity, has_criminal_charges and deadline_met. The values that matter are 'USADA'."
    assert leaked_lines(words, hidden, description) == []  # the scripted human's sentence
    assert leaked_lines("so if entity == 'USADA' and has_criminal charges", hidden, description)
    assert leaked_lines("it does return total_amount_after_discount at the end", hidden, description)
