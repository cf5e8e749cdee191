"""Episode runner: batching, stop rules, failures, incremental JSONL and resume.

Runs on the real test-bed environment (real sandbox scoring) with a scripted agent
and the scripted simulated human, so every number below is exact.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

import pytest

from colbench.agents import AgentRequest
from testbed.env import TestbedEnv, answer_text, make_tasks
from colbench.episodes import EpisodeConfig, read_episodes, run_episodes
from colbench.envs.backend import BACKEND_SCORING_VERSION as SCORING_VERSION  # TestbedEnv scores as backend
from colbench.types import STOP_ANSWERED, STOP_ENGINE_ERROR, STOP_SIMULATOR_ERROR, STOP_SINGLE_TURN, STOP_TURN_LIMIT
from engines.base import EngineError, Sample
from simulators.scripted import FlakySimulator, ScriptedBackendSimulator


class ScriptedAgent:
    """Asks `questions(task)` questions, then answers with the task's true constants.
    Records the size of every batch it is given."""

    needs_simulator = True

    def __init__(self, questions: Callable[[object], int], name: str = "scripted",
                 fail_on_call: int | None = None, exc: type[BaseException] = EngineError):
        self.questions, self.name = questions, name
        self.batches: list[int] = []
        self.fail_on_call, self.exc = fail_on_call, exc

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        self.batches.append(len(requests))
        if self.fail_on_call == len(self.batches):
            raise self.exc("backend down")
        out = []
        for r in requests:
            asked = sum(1 for m in r.messages if m["role"] == "assistant")
            if asked < self.questions(r.task):
                text = f"Question {asked + 1} about seed {r.seed}?"
            else:
                text = answer_text(r.task.meta["a"], r.task.meta["b"])
            out.append(Sample(text=text, token_ids=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3), prompt_token_ids=(9, 9)))
        return out


class CountingSimulator(ScriptedBackendSimulator):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def reply(self, requests):
        self.batches.append(len(requests))
        return super().reply(requests)


@pytest.fixture(scope="module")
def env():
    e = TestbedEnv(max_turns=10)
    yield e
    e.close()


@pytest.fixture(scope="module")
def tasks():
    return make_tasks("test", n=6, bed="legacy")


def q_by_index(task) -> int:
    return int(task.task_id[-1]) % 3  # tasks 0..5 ask 0,1,2,0,1,2 questions


def test_one_batch_per_step_for_agent_and_simulator(env, tasks):
    agent, sim = ScriptedAgent(q_by_index), CountingSimulator()
    eps = run_episodes(env, tasks, agent, sim, progress=False)
    assert agent.batches == [6, 4, 2]  # everyone, then those who asked once, then twice
    assert sim.batches == [4, 2]
    assert [ep.task_id for ep in eps] == [t.task_id for t in tasks]
    for ep, t in zip(eps, tasks):
        q = q_by_index(t)
        assert ep.stop_reason == STOP_ANSWERED
        assert len(ep.agent_turns) == q + 1 and len(ep.turns) == 2 * q + 1
        assert [t.role for t in ep.turns][:2] == (["agent", "human"] if q else ["agent"])
        assert ep.reward == 1.0 and ep.success
        assert ep.episode_id == f"{t.task_id}/scripted/0"
        assert ep.meta["simulator"] == "scripted:backend"
    first = eps[1].turns[0]  # what the engine produced is kept on the turn
    assert first.token_ids == [1, 2, 3] and first.logprobs == [-0.1, -0.2, -0.3] and first.prompt_token_ids == [9, 9]
    assert first.prompt[-1]["role"] == "user" and tasks[1].description in first.prompt[-1]["content"]
    assert eps[1].turns[1].content.startswith("It should be called f and take x.")


def test_turn_limit_takes_last_message_as_answer(env, tasks):
    agent = ScriptedAgent(lambda t: 99)
    [ep] = run_episodes(env, tasks[:1], agent, CountingSimulator(), config=EpisodeConfig(max_turns=3),
                        progress=False)
    assert ep.stop_reason == STOP_TURN_LIMIT
    assert len(ep.agent_turns) == 3 and len(ep.turns) == 5  # the human does not answer the last turn
    assert ep.answer == env.extract_answer("Question 3 about seed 0?")
    assert ep.reward == 0.0 and ep.score is not None


def test_single_turn_first_message_is_answer_without_simulator(env, tasks):
    agent = ScriptedAgent(lambda t: 5)
    eps = run_episodes(env, tasks[:2], agent, None, config=EpisodeConfig(single_turn=True), seeds=(0, 1),
                       progress=False)
    assert agent.batches == [4]
    assert [ep.stop_reason for ep in eps] == [STOP_SINGLE_TURN] * 4
    assert [ep.seed for ep in eps] == [0, 1, 0, 1]
    assert all(len(ep.turns) == 1 and ep.reward == 0.0 for ep in eps)


def test_missing_simulator_is_an_error(env, tasks):
    with pytest.raises(ValueError, match="give a simulator"):
        run_episodes(env, tasks[:1], ScriptedAgent(lambda t: 1), None, progress=False)


def test_simulator_failure_is_recorded_and_ends_only_its_episode(env, tasks):
    sim = FlakySimulator(fail_every=2)  # the 2nd reply it gives fails
    eps = run_episodes(env, tasks[1:3], ScriptedAgent(lambda t: 1), sim, progress=False)
    ok, failed = eps
    assert ok.stop_reason == STOP_ANSWERED and ok.reward == 1.0 and ok.n_simulator_failures == 0
    assert failed.stop_reason == STOP_SIMULATOR_ERROR and failed.n_simulator_failures == 1
    human = failed.turns[-1]
    assert human.role == "human" and human.failed and human.content == ""
    assert "scripted failure" in human.error
    assert failed.answer == env.extract_answer(failed.turns[0].content)  # the last agent message, scored
    assert failed.score is not None and failed.reward == 0.0


def test_engine_error_ends_that_batch_with_zero_and_run_goes_on(env, tasks):
    agent = ScriptedAgent(q_by_index, fail_on_call=2)
    eps = run_episodes(env, tasks, agent, CountingSimulator(), progress=False)
    for ep, t in zip(eps, tasks):
        if q_by_index(t) == 0:
            assert ep.stop_reason == STOP_ANSWERED and ep.reward == 1.0
        else:
            assert ep.stop_reason == STOP_ENGINE_ERROR and ep.reward == 0.0
            assert "backend down" in ep.meta["error"] and ep.score.error
    assert agent.batches == [6, 4]


def test_jsonl_written_incrementally_and_resume_skips_done(env, tasks, tmp_path):
    out = tmp_path / "eps.jsonl"
    crashing = ScriptedAgent(q_by_index, fail_on_call=2, exc=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        run_episodes(env, tasks, crashing, CountingSimulator(), out_path=out, progress=False)
    saved = read_episodes(out)  # the step-1 answers were written before the crash
    assert sorted(ep.task_id for ep in saved) == sorted(t.task_id for t in tasks if q_by_index(t) == 0)

    with out.open("a") as f:  # a crash in the middle of a write leaves half a line
        f.write('{"task_id": "half')
    agent = ScriptedAgent(q_by_index)
    with pytest.warns(UserWarning, match="truncated last line"):
        eps = run_episodes(env, tasks, agent, CountingSimulator(), out_path=out, progress=False)
    assert agent.batches == [4, 4, 2]  # only the 4 unfinished episodes ran
    lines = out.read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(ln) for ln in lines)
    assert [ep.reward for ep in eps] == [1.0] * 6

    again = ScriptedAgent(q_by_index)
    eps2 = run_episodes(env, tasks, again, CountingSimulator(), out_path=out, progress=False)
    assert again.batches == [] and [e.to_json() for e in eps2] == [e.to_json() for e in eps]


def test_max_concurrent_bounds_batches(env, tasks):
    agent = ScriptedAgent(lambda t: 0)
    run_episodes(env, tasks, agent, CountingSimulator(),
                 config=EpisodeConfig(max_concurrent=4), progress=False)
    assert agent.batches == [4, 2]


def test_bad_inputs(env, tasks):
    with pytest.raises(ValueError, match="duplicate task id"):
        run_episodes(env, [tasks[0], tasks[0]], ScriptedAgent(lambda t: 0), CountingSimulator(), progress=False)
    with pytest.raises(ValueError, match="must not contain '/'"):
        run_episodes(env, tasks[:1], ScriptedAgent(lambda t: 0, name="a/b"), CountingSimulator(), progress=False)


def test_corrupt_line_in_the_middle_is_an_error_naming_file_and_line(env, tasks, tmp_path):
    out = tmp_path / "eps.jsonl"
    run_episodes(env, tasks[:2], ScriptedAgent(lambda t: 0), CountingSimulator(), out_path=out, progress=False)
    first, second = out.read_text().splitlines()
    out.write_text(first + "\n{broken\n" + second + "\n")
    with pytest.raises(ValueError, match=r"eps.jsonl:2: not a valid episode record"):
        run_episodes(env, tasks[:2], ScriptedAgent(lambda t: 0), CountingSimulator(), out_path=out, progress=False)


# ---- the one episode loader and the rollout helper ----------------------------------------


def test_load_episodes_reads_ours_and_the_published_rows(env, tasks, tmp_path):
    from pathlib import Path

    from colbench.episodes import load_episodes
    from colbench.tasks import load_trajectories

    ours = tmp_path / "ours.jsonl"
    eps = run_episodes(env, tasks[:2], ScriptedAgent(lambda t: 1), CountingSimulator(), out_path=ours, progress=False)
    assert [e.to_json() for e in load_episodes(ours)] == [e.to_json() for e in eps]
    assert len(load_episodes(ours, limit=1)) == 1
    published = Path(__file__).resolve().parent.parent / "fixtures" / "offline_trajectories.jsonl"
    loaded = load_episodes(published)
    assert [e.to_json() for e in loaded] == [e.to_json() for e in load_trajectories(str(published))]
    assert loaded[0].agent == "offline" and loaded[0].turns[0].prompt is not None
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: no episodes"):
        load_episodes(tmp_path / "empty.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_episodes(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(ours.read_text().splitlines()[0] + "\n{oops\n" + ours.read_text().splitlines()[1] + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:2: not a valid episode record"):
        load_episodes(bad)


def test_rollout_k_episodes_per_task_with_disjoint_round_seeds(env, tasks, tmp_path):
    from colbench.agents import ReferenceAgent
    from colbench.rollout import episode_seeds, rollout

    assert episode_seeds(0, 3) == [0, 1, 2] and episode_seeds(2, 2) == [2000, 2001]
    with pytest.raises(ValueError, match="1..1000"):
        episode_seeds(0, 0)
    sim = CountingSimulator()
    eps = rollout(env, tasks[:2], ScriptedAgent(lambda t: 1), sim, seeds=episode_seeds(1, 2), max_turns=3,
                  out_path=tmp_path / "r.jsonl")
    assert [(e.task_id, e.seed) for e in eps] == [(t.task_id, s) for t in tasks[:2] for s in (1000, 1001)]
    assert all(e.success and len(e.agent_turns) == 2 and e.meta["simulator"] == sim.name for e in eps)
    assert len(read_episodes(tmp_path / "r.jsonl")) == 4
    # an agent that answers at once is never given the simulator, so its episodes record none
    [ref] = rollout(env, tasks[:1], ReferenceAgent(env), sim)
    assert ref.success and "simulator" not in ref.meta and sim.batches == [4]
    assert ref.meta["scoring_version"] == SCORING_VERSION  # every scored episode records its rules
    # max_turns defaults to the environment's
    short = TestbedEnv(max_turns=2)
    [cut] = rollout(short, tasks[:1], ScriptedAgent(lambda t: 5), sim)
    short.close()
    assert (cut.stop_reason, len(cut.agent_turns)) == (STOP_TURN_LIMIT, 2)


class InterruptedScoring:
    """The real test-bed env whose streamed scoring delivers answers 2 then 0, then is
    interrupted (Ctrl-C) while the others are still being scored."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def score_iter(self, tasks, answers):
        scores = self.env.score(tasks, answers)
        yield 2, scores[2]
        yield 0, scores[0]
        raise KeyboardInterrupt


def test_ctrl_c_during_scoring_keeps_every_scored_episode_in_order(env, tasks, tmp_path):
    out = tmp_path / "eps.jsonl"
    agent = ScriptedAgent(lambda t: 0)  # every episode answers at once: one scoring batch of 6
    with pytest.raises(KeyboardInterrupt):
        run_episodes(InterruptedScoring(env), tasks, agent, None, out_path=out, progress=False,
                     config=EpisodeConfig(single_turn=True))
    kept = read_episodes(out)
    assert [e.task_id for e in kept] == [tasks[0].task_id, tasks[2].task_id]  # 0 at once, 2 saved on the interrupt
    assert all(e.score is not None and e.score.reward == 1.0 for e in kept)
    eps = run_episodes(env, tasks, agent, None, out_path=out, progress=False, config=EpisodeConfig(single_turn=True))
    assert [e.task_id for e in eps] == [t.task_id for t in tasks]
    assert len(read_episodes(out)) == 6  # resumed: the kept two were not rerun


def test_streamed_scoring_writes_in_the_batch_order(env, tasks, tmp_path):
    """The file's order does not depend on which sandbox finished first."""
    out = tmp_path / "eps.jsonl"
    run_episodes(env, tasks, ScriptedAgent(lambda t: 0), None, out_path=out, progress=False,
                 config=EpisodeConfig(single_turn=True))
    assert [e.task_id for e in read_episodes(out)] == [t.task_id for t in tasks]
