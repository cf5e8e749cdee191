"""The LLM simulated human: its prompt, its guards, batching, failures (tiny model)."""

from __future__ import annotations

import pytest

from colbench.tasks import load_tasks
from colbench.types import Turn
from engines.base import EngineError, SamplingParams
from simulators import load_simulator
from simulators.base import SimReply, SimRequest
from simulators.llm import DEFAULT_PROMPT, LLMSimulator, clean_reply


@pytest.mark.parametrize("raw, limit, expected", [
    ("It adds tax.  \n It rounds.", 400, "It adds tax. It rounds."),
    ("Sure:\n```python\ndef f(x):\n    return x\n```\nThat is all.", 400, "Sure: That is all."),
    ("Use the `total` field.", 400, "Use the total field."),
    ("```\nonly code, never closed", 400, ""),
    ("word " * 30, 22, "word word word word"),  # cut at a word boundary
    ("x" * 50, 10, "x" * 10),  # no boundary: hard cut
])
def test_clean_reply(raw, limit, expected):
    assert clean_reply(raw, limit) == expected


class CountingEngine:
    """The real tiny engine, counting generate calls."""

    def __init__(self, engine):
        self.engine, self.spec, self.calls = engine, engine.spec, []

    def generate(self, conversations, params):
        self.calls.append((len(conversations), params))
        return self.engine.generate(conversations, params)

    def close(self):
        pass


class DownEngine:
    spec = "down"

    def generate(self, conversations, params):
        raise EngineError("server unreachable after 5 retries")

    def close(self):
        pass


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("builtin:test", env="backend", limit=2, validate=False)


@pytest.fixture(scope="module")
def tiny():
    from engines import EngineOptions, load_engine

    engine = load_engine("tiny", EngineOptions(device="cpu"))
    yield engine
    engine.close()


def test_prompt_shows_description_hidden_code_and_dialogue(tasks):
    sim = LLMSimulator(DownEngine())
    task = tasks[0]
    turns = [Turn("agent", "What is the base fee?"), Turn("human", "It is 12 dollars."), Turn("agent", "And tiers?")]
    msgs = sim.conversation(task, turns)
    assert msgs[0]["role"] == "system"
    assert task.description in msgs[0]["content"] and task.hidden in msgs[0]["content"]
    assert "never write code" in msgs[0]["content"].lower() and "don't know" in msgs[0]["content"]
    assert [(m["role"], m["content"]) for m in msgs[1:]] == [
        ("user", "What is the base fee?"), ("assistant", "It is 12 dollars."), ("user", "And tiers?")]
    assert "{problem_description}" in DEFAULT_PROMPT.read_text() and "{hidden_information}" in DEFAULT_PROMPT.read_text()


def test_prompt_file_needs_placeholders(tmp_path):
    bad = tmp_path / "p.txt"
    bad.write_text("You are a human. {description}")
    with pytest.raises(ValueError, match=r"p\.txt: the backend_human prompt lacks the required placeholder \{hidden_information\}"):
        LLMSimulator(DownEngine(), prompt_file=bad)


def test_engine_error_fails_every_reply_of_the_batch(tasks):
    replies = LLMSimulator(DownEngine()).reply([SimRequest(t, [Turn("agent", "?")]) for t in tasks])
    assert [r.failed for r in replies] == [True, True]
    assert all(r.text == "" and "server unreachable" in r.error for r in replies)


def test_last_turn_must_be_the_agents(tasks):
    with pytest.raises(ValueError, match="must be the agent's"):
        LLMSimulator(DownEngine()).reply([SimRequest(tasks[0], [Turn("agent", "?"), Turn("human", "no")])])


def test_tiny_model_replies_in_one_batch_clean_and_capped(tiny, tasks):
    engine = CountingEngine(tiny)
    sim = LLMSimulator(engine, max_reply_chars=40, sampling=SamplingParams(temperature=0, max_new_tokens=12))
    requests = [SimRequest(t, [Turn("agent", "What should happen for zero?")]) for t in tasks[:1]] * 2
    replies = sim.reply(requests)
    assert len(engine.calls) == 1 and engine.calls[0][0] == 2 and engine.calls[0][1].temperature == 0
    assert len(replies) == 2 and sim.name == f"llm:{tiny.spec}"
    for r in replies:
        assert r.failed or (0 < len(r.text) <= 40 and "```" not in r.text and "\n" not in r.text)
        assert not r.failed or r.error == "empty reply after removing code"
    assert replies[0] == replies[1]  # greedy: same dialogue, same reply


def test_load_simulator_builds_llm_simulator_for_backend(tiny):
    from colbench.envs import make_env

    env = make_env("backend")
    sim = load_simulator("tiny", env, max_reply_chars=100, max_new_tokens=16)
    try:
        assert isinstance(sim, LLMSimulator) and sim.max_reply_chars == 100 and sim.sampling.max_new_tokens == 16
    finally:
        sim.close()
        env.close()


def test_a_reply_that_fails_on_its_own_fails_only_that_reply(tasks):
    """A real OpenAI-compatible server (loopback) answering one dialogue with a reply of the
    wrong shape: that human turn fails with the reason, the other is a normal reply."""
    import json
    from http.server import BaseHTTPRequestHandler

    from engines import EngineOptions, load_engine
    from local_http import LocalServer, send_json

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bad = tasks[0].description in body["messages"][0]["content"]
            send_json(self, 200, {"choices": [{"message": "oops"}]} if bad else {
                "choices": [{"index": 0, "message": {"content": "It is 12 dollars."}, "finish_reason": "stop"}]})

        def log_message(self, *args):
            pass

    server = LocalServer(Handler)
    engine = load_engine(f"openai:m@{server.url}", EngineOptions(max_retries=0))
    try:
        bad, good = LLMSimulator(engine).reply([SimRequest(t, [Turn("agent", "What is the fee?")]) for t in tasks])
    finally:
        engine.close()
        server.close()
    assert good == SimReply("It is 12 dollars.")
    assert bad.failed and bad.error.startswith("ReplyError: ") and "'message' is a str (oops)" in bad.error
