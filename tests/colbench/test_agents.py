"""Agents: the gold answer earns full marks, replayed answers get exactly their scores,
model agents batch one generate call per step, and specs fail fast and clearly."""

from __future__ import annotations

import json

import pytest

from colbench.agents import (
    AgentRequest,
    ModelAgent,
    ReferenceAgent,
    ReplayAgent,
    _split_name,
    agent_name,
    check_agent_spec,
    load_agent,
    turn_seed,
)
from colbench.envs import make_env
from colbench.episodes import run_episodes
from colbench.tasks import load_tasks
from engines.base import SamplingParams, SpecError

HALF_WATER_BILL = '''def water_bill(gallons):
    # right up to 5000 gallons, wrong above: 5 of the 10 tests
    if gallons > 5000:
        return 0.0
    if gallons <= 0:
        return 12.0
    return round(12.0 + gallons / 1000 * 3.0, 2)
'''


@pytest.fixture(scope="module")
def env():
    e = make_env("backend", workers=2)
    yield e
    e.close()


@pytest.fixture(scope="module")
def backend_test_split():
    return load_tasks("builtin:test", env="backend")


def test_reference_scores_full_marks_on_bundled_test_split(env, backend_test_split):
    assert len(backend_test_split) >= 10
    eps = run_episodes(env, backend_test_split, ReferenceAgent(env), None, progress=False)
    bad = [(ep.task_id, ep.score.error) for ep in eps if ep.reward != 1.0]
    assert not bad
    assert all(ep.success and ep.stop_reason == "answered" and len(ep.turns) == 1 for ep in eps)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_replay_gives_exactly_known_scores(env, backend_test_split, tmp_path):
    water = next(t for t in backend_test_split if "def water_bill" in t.description)
    good, wrong = [t for t in backend_test_split if t is not water][:2]
    path = write_jsonl(tmp_path / "answers.jsonl", [
        {"task_id": good.task_id, "answer": good.hidden},
        {"task_id": water.task_id, "answer": "Here it is:\n```python\n" + HALF_WATER_BILL + "```\n"},
        {"task_id": wrong.task_id, "answer": "def nothing():\n    return None\n"},
    ])
    agent = ReplayAgent(env, path)
    assert agent.name == "replay-answers"
    eps = run_episodes(env, [good, water, wrong], agent, None, progress=False)
    assert [ep.reward for ep in eps] == [1.0, 0.5, 0.0]
    assert [ep.success for ep in eps] == [True, False, False]
    assert eps[1].answer == HALF_WATER_BILL.strip("\n")  # fenced answers are taken as they are


@pytest.mark.parametrize("rows, message", [
    (['{"task_id": "a", "answer": "x"}', "{not json"], ":2: not valid JSON"),
    ([{"task_id": "a"}], ":1: field 'answer' missing"),
    ([{"task_id": 3, "answer": "x"}], ":1: field 'task_id' missing or not a string"),
    ([["a", "x"]], ":1: expected an object"),
    ([{"task_id": "a", "answer": "x"}, {"task_id": "a", "answer": "y"}], ":2: duplicate task_id 'a'"),
    ([{"task_id": "a", "answer": "x"}, {"task_id": "nope", "answer": "y"}], ":2: unknown task_id 'nope'"),
])
def test_replay_file_errors_name_file_and_line(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    with pytest.raises(SpecError) as e:
        check_agent_spec(f"replay:{path}", task_ids={"a", "b"})
    assert str(e.value).startswith(str(path)) and message in str(e.value)


@pytest.mark.parametrize("spec, message", [
    ("", "empty agent spec"),
    ("hf:", "bad model spec"),
    ("foo:bar", "unknown backend 'foo'"),
    ("hf:/no/such/model/dir", "does not exist"),
    ("vllm:runs/sweet/final", "path runs/sweet/final does not exist"),
    ("replay:/no/such/file.jsonl", "does not exist"),
    ("replay:", "expected 'replay:<file.jsonl>'"),
    ("openai:gpt-4o", "openai:<model>@"),
])
def test_bad_agent_specs(spec, message):
    with pytest.raises(SpecError, match=message):
        check_agent_spec(spec)


def test_good_specs_and_names(tmp_path):
    for spec in ("reference", "tiny", "hf:tiny", "mine=reference", f"hf:{tmp_path}", "openai:m@http://h:1/v1",
                 "hf:meta-llama/Llama-3.1-8B-Instruct"):  # hub ids cannot be checked offline
        check_agent_spec(spec)
    assert agent_name("mine=hf:/runs/a/final") == "mine"
    assert agent_name("hf:/runs/a/final") == "hf_runs_a_final"
    # a generated name survives being written as "<name>=<spec>" and parsed back
    for spec in ("hf:/runs/a/final", "openai:llama@http://localhost:8000/v1", "vllm:org/model"):
        assert _split_name(f"{agent_name(spec)}={spec}") == (agent_name(spec), spec)
    assert "/" not in agent_name("openai:llama@http://localhost:8000/v1")


class CountingEngine:
    """The real tiny engine, counting generate calls and the seeds they used."""

    def __init__(self, engine):
        self.engine, self.spec, self.calls = engine, engine.spec, []

    def generate(self, conversations, params):
        self.calls.append((len(conversations), params.seed))
        return self.engine.generate(conversations, params)

    def close(self):
        pass


@pytest.fixture(scope="module")
def tiny_engine():
    from engines import EngineOptions, load_engine

    engine = load_engine("tiny", EngineOptions(device="cpu"))
    yield engine
    engine.close()


def test_model_agent_batches_and_groups_by_seed(tiny_engine, env, backend_test_split):
    counting = CountingEngine(tiny_engine)
    requests = [AgentRequest(t, env.agent_messages(t, []), seed) for t in backend_test_split[:2] for seed in (0, 1)]
    greedy = ModelAgent(counting, SamplingParams(temperature=0, max_new_tokens=4))
    samples = greedy.act(requests)
    assert counting.calls == [(4, 0)]  # one call for the whole batch
    assert len(samples) == 4 and all(0 < len(s.token_ids) <= 4 and len(s.logprobs) == len(s.token_ids)
                                     for s in samples)
    assert samples[0].text == samples[1].text  # greedy: seeds agree
    counting.calls.clear()
    sampled = ModelAgent(counting, SamplingParams(temperature=1.0, max_new_tokens=4), name="hot")
    again = [sampled.act(requests), sampled.act(requests)]
    assert sorted(counting.calls[:2]) == [(2, 0), (2, 1)]  # one call per seed
    assert [s.token_ids for s in again[0]] == [s.token_ids for s in again[1]]  # seeded: reproducible
    assert greedy.name == "tiny" and sampled.name == "hot"


def test_each_turn_of_an_episode_draws_its_own_uniforms(tiny_engine, env, backend_test_split):
    """Turn 2 of a seeded episode is sampled with another seed than turn 1 (`turn_seed`). With
    one seed for both, the engine draws the same uniform for the first token of each turn and,
    where the two turns' distributions are close (the random tiny model's are), lands on the
    same or the next token: 16 of 16 episodes did before the turn entered the seed."""
    task = backend_test_split[0]
    agent = ModelAgent(tiny_engine, SamplingParams(temperature=1.0, max_new_tokens=1), continue_ids=False)
    seeds = range(16)
    first = [AgentRequest(task, env.agent_messages(task, []), s) for s in seeds]
    turn1 = agent.act(first)
    second = [AgentRequest(task, [*r.messages, {"role": "assistant", "content": s.text},
                                  {"role": "user", "content": "I don't know."}], r.seed) for r, s in zip(first, turn1)]
    turn2 = agent.act(second)
    near = sum(abs(a.token_ids[0] - b.token_ids[0]) <= 1 for a, b in zip(turn1, turn2))
    assert near <= 2, f"{near} of 16 second turns drew the first turn's token or its neighbour"
    assert turn_seed(7, 0) == 7 and len({turn_seed(7, t) for t in range(4)}) == 4 and turn_seed(7, 1) < 2**31
    counting = CountingEngine(tiny_engine)
    ModelAgent(counting, SamplingParams(temperature=1.0, max_new_tokens=1)).act(second[:1])
    assert counting.calls == [(1, turn_seed(0, 1))]  # the seed the engine saw: the turn's


def test_load_agent_model_path_keeps_its_name(env):
    from engines.tiny import tiny_model_path

    spec = f"hf:{tiny_model_path()}"
    agent = load_agent(spec, env, sampling=SamplingParams(max_new_tokens=2), engine_options=None)
    try:
        assert isinstance(agent, ModelAgent) and agent.name == agent_name(spec) and "/" not in agent.name
        assert agent.name.startswith("hf_") and agent.engine.spec == spec
    finally:
        agent.close()
    assert load_agent("reference", env, sampling=SamplingParams(), name="gold").name == "gold"


def test_load_agent(env, tmp_path, backend_test_split):
    ref = load_agent("gold=reference", env, sampling=SamplingParams())
    assert isinstance(ref, ReferenceAgent) and ref.name == "gold"
    path = write_jsonl(tmp_path / "a.jsonl", [{"task_id": backend_test_split[0].task_id, "answer": "x"}])
    rep = load_agent(f"replay:{path}", env, sampling=SamplingParams())
    [s] = rep.act([AgentRequest(backend_test_split[0], [], 0)])
    assert env.is_final(s.text) and env.extract_answer(s.text) == "x"
