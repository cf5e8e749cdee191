"""colbench.serve and colbench.client: a real OpenEnv server (a subprocess on 127.0.0.1,
a free port) driven by the real OpenEnv client, raw WebSocket frames and raw HTTP.

Equivalence with our runner: the same agents (reference, scripted, the tiny model)
through the server and through `colbench.rollout` give the same dialogues and scores.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the `serve` extra (pip install -e '.[serve]') is not installed")

import httpx  # noqa: E402

from colbench.agents import ModelAgent, ReferenceAgent  # noqa: E402
from colbench.client import ColBenchAction, ColBenchClient  # noqa: E402
from colbench.envs import make_env  # noqa: E402
from colbench.episodes import agent_turn  # noqa: E402
from colbench.protocols import AgentRequest  # noqa: E402
from colbench.rollout import rollout  # noqa: E402
from colbench.tasks import load_tasks  # noqa: E402
from engines.base import Sample  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
ERR = "python -m colbench.serve: error:"


@pytest.fixture(scope="module")
def backend_url(colbench_server):
    with colbench_server("--env", "backend", "--tasks", "builtin:test", "--limit", "6", "--simulator", "scripted:backend") as url:
        yield url


@pytest.fixture(scope="module")
def bed_url(colbench_server):
    with colbench_server("--env", "testbed", "--tasks", "builtin:legacy/test", "--max-turns", "4",
                         "--simulator", "scripted:testbed", "--max-connections", "16") as url:
        yield url


def drive(url: str, agent, task, seed: int = 0):
    """One episode of `agent` on `task` through the server, as the runner would run it
    (a model agent continues its own last turn's ids: ModelAgent)."""
    with ColBenchClient(url) as client:
        result = client.reset(task_id=task.task_id)
        results, previous = [result], None
        while not result.done:
            request = AgentRequest(task, result.observation.messages, seed, previous)
            [sample] = agent.act([request])
            previous = agent_turn(request, sample)
            result = client.step(sample.text)
            results.append(result)
    return results


class AskThenAnswer:
    """Asks one question, then answers: the reference on even tasks, a wrong function on odd ones."""

    name = "scripted"
    needs_simulator = True

    def __init__(self, env, tasks):
        self.env, self.index = env, {t.task_id: i for i, t in enumerate(tasks)}

    def act(self, requests):
        out = []
        for r in requests:
            if not any(m["role"] == "assistant" for m in r.messages):
                out.append(Sample("What should the function return, and what are its inputs?"))
            elif self.index[r.task.task_id] % 2 == 0:
                out.append(ReferenceAgent(self.env).act([r])[0])
            else:
                out.append(Sample("I WANT TO ANSWER:\n```python\ndef f(*args):\n    return None\n```"))
        return out


# ---- the server answers as our runner does -------------------------------------------------------


def test_health_schema_and_task_ids(backend_url):
    assert httpx.get(f"{backend_url}/health").json() == {"status": "healthy"}
    schema = httpx.get(f"{backend_url}/schema").json()
    assert set(schema["action"]["properties"]) == {"message", "episode_id", "metadata"}
    fields = set(schema["observation"]["properties"])
    assert {"messages", "reply", "score", "done", "reward"} <= fields
    assert not fields & {"hidden", "tests", "reference", "ground_truth"}
    tasks = load_tasks("builtin:test", env="backend", limit=6)
    assert ColBenchClient(backend_url).task_ids() == [t.task_id for t in tasks]


def test_reference_agent_scores_exactly_what_the_runner_scores(backend_url):
    tasks = load_tasks("builtin:test", env="backend", limit=6)
    env = make_env("backend", workers=2)
    try:
        agent = ReferenceAgent(env)
        runner = rollout(env, tasks, agent, None)
        for task, ep in zip(tasks, runner):
            *_, last = drive(backend_url, agent, task)
            assert last.done and last.observation.stop_reason == ep.stop_reason == "answered"
            assert last.reward == ep.reward == 1.0
            score = last.observation.score
            assert (score["reward"], score["success"], score["error"]) == (ep.score.reward, ep.score.success, ep.score.error)
            assert (score["passed"], score["total"]) == (ep.score.detail["passed"], ep.score.detail["total"])
    finally:
        env.close()


def test_a_dialogue_through_the_server_equals_the_runners(backend_url):
    tasks = load_tasks("builtin:test", env="backend", limit=6)
    env = make_env("backend", workers=2)
    from simulators import load_simulator

    try:
        agent = AskThenAnswer(env, tasks)
        runner = rollout(env, tasks, agent, load_simulator("scripted:backend", env))
        for task, ep in zip(tasks, runner):
            results = drive(backend_url, agent, task)
            first, reply, last = results
            assert first.observation.messages == env.agent_messages(task, [])
            assert reply.observation.reply == ep.turns[1].content and not reply.done and reply.reward is None
            assert last.observation.messages == env.agent_messages(task, ep.turns)
            assert (last.reward, last.observation.score["success"]) == (ep.reward, ep.success)
            assert last.observation.turn == 2 and last.observation.stop_reason == ep.stop_reason
        assert sorted({ep.reward for ep in runner}) == [0.0, 1.0]
    finally:
        env.close()


def test_tiny_model_episodes_through_the_server_equal_the_runners(bed_url):
    """The tiny model, greedy, on the test bed: every turn and every reward match."""
    from engines import load_engine
    from engines.base import SamplingParams
    from testbed.human import TestbedSimulator

    tasks = load_tasks("builtin:legacy/test", env="testbed", limit=3)
    env = make_env("testbed", bed="legacy")
    agent = ModelAgent(load_engine("tiny"), SamplingParams(temperature=0.0, max_new_tokens=24), name="tiny")
    try:
        runner = rollout(env, tasks, agent, TestbedSimulator())
        for task, ep in zip(tasks, runner):
            results = drive(bed_url, agent, task)
            last = results[-1]
            assert last.observation.messages == env.agent_messages(task, ep.turns)
            assert [r.observation.reply for r in results[1:-1]] == [t.content for t in ep.turns if t.role == "human"]
            assert last.observation.stop_reason == ep.stop_reason and last.reward == ep.reward
    finally:
        agent.close()
        env.close()


# ---- nothing of the hidden information on the wire ------------------------------------------------


def test_nothing_hidden_reaches_the_wire(backend_url):
    from websockets.sync.client import connect

    task = load_tasks("builtin:test", env="backend", limit=6)[3]
    frames = []
    with connect(backend_url.replace("http://", "ws://") + "/ws") as ws:
        for msg in ({"type": "reset", "data": {"task_id": task.task_id}},
                    {"type": "step", "data": {"message": "What are the inputs and the special values?"}},
                    {"type": "step", "data": {"message": "I WANT TO ANSWER:\n```python\ndef g(x):\n    return 1\n```"}},
                    {"type": "state"}):
            ws.send(json.dumps(msg))
            frames.append(ws.recv())
    reset = httpx.post(f"{backend_url}/reset", json={"task_id": task.task_id}).text
    eid = json.loads(reset)["observation"]["episode_id"]
    step = httpx.post(f"{backend_url}/step", json={"action": {"message": "I WANT TO ANSWER: def g(): pass",
                                                             "episode_id": eid}}).text
    raw = "\n".join(frames + [reset, step])
    assert json.loads(frames[1])["data"]["observation"]["reply"]  # the human did answer
    assert json.loads(frames[2])["data"]["done"] is True
    assert task.hidden not in raw
    hidden_lines = [ln.strip() for ln in task.hidden.splitlines() if len(ln.strip()) > 12]
    assert hidden_lines and not [ln for ln in hidden_lines if ln in raw]
    assert task.tests and not [t for t in task.tests if t in raw]  # no test call, so no expected value either
    for key in ("hidden", "tests", "expected", "ground_truth", "target_png", "reference_errors"):
        assert f'"{key}"' not in raw


# ---- concurrency, limits and errors ---------------------------------------------------------------


def test_concurrent_episodes_stay_apart(bed_url):
    tasks = load_tasks("builtin:legacy/test", env="testbed")[:8]
    results: dict[str, tuple] = {}
    errors: list[BaseException] = []

    def one(task):
        try:
            with ColBenchClient(bed_url) as c:
                first = c.reset(task_id=task.task_id)
                reply = c.step("What happens to positive numbers?")
                last = c.step(f"I WANT TO ANSWER:\n```python\n{task.hidden}```")
                results[task.task_id] = (first, reply, last)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    ids = {r[0].observation.episode_id for r in results.values()}
    assert len(ids) == len(tasks)
    for task in tasks:
        first, reply, last = results[task.task_id]
        assert first.observation.task_id == last.observation.task_id == task.task_id
        assert reply.observation.reply == f"For positive numbers it is x * {task.meta['a']}."
        assert last.done and last.reward == 1.0


def test_concurrent_steps_are_batched_into_one_simulator_call():
    """In process: steps of 8 sessions waiting together are advanced as one batch."""
    from colbench.serve import EpisodeStore, ServeConfig

    store = EpisodeStore(ServeConfig(env="testbed", tasks="builtin:legacy/test", max_turns=4,
                                     simulator="scripted:testbed", batch_wait_s=0.5))
    try:
        tasks = load_tasks("builtin:legacy/test", env="testbed")[:8]
        ids = [store.start(task_id=t.task_id).episode_id for t in tasks]
        replies = {}
        threads = [threading.Thread(target=lambda e=e: replies.__setitem__(e, store.step(e, "What happens to negative numbers?")))
                   for e in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert [replies[e].reply for e in ids] == [f"For negative numbers it is x + {t.meta['b']}." for t in tasks]
        assert sum(store.batch_sizes.values()) < len(ids) and max(store.batch_sizes) > 1, store.batch_sizes
    finally:
        store.close()


def test_errors_name_the_episode(bed_url):
    with ColBenchClient(bed_url) as c:
        with pytest.raises(RuntimeError, match=r"no episode: call reset\(\) first"):
            c.step("hello")
        with pytest.raises(RuntimeError, match="unknown task_id 'nope'"):
            c.reset(task_id="nope")
        c.reset()
        done = c.step("I WANT TO ANSWER:\n```python\ndef f(x):\n    return x\n```")
        assert done.done and done.observation.stop_reason == "answered"
        with pytest.raises(RuntimeError, match=rf"episode '{done.observation.episode_id}' is done"):
            c.step("again")
        with pytest.raises(RuntimeError, match="unknown episode id 'missing'"):
            c.step(ColBenchAction(message="hi", episode_id="missing"))
    resp = httpx.post(f"{bed_url}/step", json={"action": {"message": "hi", "episode_id": "missing"}})
    assert resp.status_code == 404 and "unknown episode id 'missing'" in resp.json()["detail"]


def test_session_and_episode_limits_and_idle_timeout(colbench_server):
    with colbench_server("--env", "testbed", "--tasks", "builtin:test", "--simulator", "scripted:testbed", "--max-connections",
                "2", "--max-episodes", "2", "--episode-timeout-s", "1.5") as url:
        a, b, c = ColBenchClient(url), ColBenchClient(url), ColBenchClient(url)
        try:
            ea = a.reset().observation.episode_id
            b.reset()
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                c.reset()  # a third WebSocket session
            resp = httpx.post(f"{url}/reset", json={})
            assert resp.status_code == 503 and "at capacity: 2 episodes in flight" in resp.json()["detail"]
            time.sleep(2.0)
            with pytest.raises(RuntimeError, match=f"unknown episode id '{ea}'.*1.5 s idle"):
                a.step("What happens to positive numbers?")
            assert httpx.post(f"{url}/reset", json={}).status_code == 200  # expired episodes free their slots
        finally:
            for client in (a, b, c):
                with contextlib.suppress(Exception):
                    client.close()


@pytest.mark.parametrize("args, message", [
    (["--env", "nope", "--simulator", "scripted:backend"], "--env: unknown environment 'nope'"),
    (["--env", "backend"], "--simulator SPEC is required"),
    (["--env", "backend", "--simulator", "scripted:nope"], "unknown simulator 'scripted:nope'"),
    (["--env", "backend", "--simulator", "scripted:backend", "--tasks", "missing.jsonl"], "--tasks missing.jsonl:"),
    (["--env", "backend", "--simulator", "scripted:backend", "--max-episodes", "0"], "--max-episodes: invalid value 0"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    from colbench.serve import main

    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERR) and message in lines[0], lines


def test_bad_input_from_the_command_line():
    res = subprocess.run([PY, "-m", "colbench.serve", "--env", "backend"], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip() == f"{ERR} --simulator SPEC is required: the agent's " \
                                                          "questions need a simulated human", res.stderr


def test_frontend_scores_through_the_server_as_through_the_runner(colbench_server):
    """Frontend: renders + tiny CLIP on the server give the runner's cosine, to the bit."""
    from colbench.scoring.render import DEFAULT_CHROMIUM

    if not Path(DEFAULT_CHROMIUM).exists():
        pytest.skip("chromium not installed")
    tasks = load_tasks("builtin:test", env="frontend", limit=1)
    env = make_env("frontend", clip_model="tiny")

    class Draft:  # one wrong draft, then the reference: a human turn and a non-trivial cosine
        name, needs_simulator = "draft", True

        def act(self, requests):
            return [Sample("```html\n<html><body><h1>Draft</h1></body></html>\n```")
                    if len(r.messages) == 2 else ReferenceAgent(env).act([r])[0] for r in requests]

    from simulators import load_simulator

    try:
        runner = rollout(env, tasks, Draft(), load_simulator("scripted:idk", env))
        with colbench_server("--env", "frontend", "--tasks", "builtin:test", "--limit", "1", "--simulator", "scripted:idk",
                    "--clip-model", "tiny") as url:
            for task, ep in zip(tasks, runner):
                first, reply, last = drive(url, Draft(), task)
                assert reply.observation.reply == "I don't know." == ep.turns[1].content
                assert last.reward == ep.reward and last.observation.score["success"] == ep.success
                assert "target_png" not in last.observation.score  # a path to the hidden target's render
                assert last.observation.score["answer_html_chars"] == ep.score.detail["answer_html_chars"]
    finally:
        env.close()
