"""The OpenAI-compatible backend against real HTTP servers on loopback.

- `transformers serve` with the tiny model (a real OpenAI-compatible server; it ignores
  `n` and `logprobs`, which exercises the one-request-per-sample fallback);
- a scripted `http.server` that fails on purpose (503/429/500/400, slow replies) and
  answers like vLLM (token ids as "token_id:N" with log-probs).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from local_http import LocalServer, send_json, stop_process

from engines import EngineError, EngineOptions, SamplingParams
from engines.base import BatchError
from engines.openai_engine import OpenAIEngine, ReplyError, ServerError, ServerUnavailable

CONVS = [
    [{"role": "user", "content": "Write a function that adds two numbers."}],
    [{"role": "system", "content": "Ask questions first."}, {"role": "user", "content": "hi"}],
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- transformers serve


@pytest.fixture(scope="module")
def served_tiny(tiny_path, tmp_path_factory):
    """`transformers serve` on a copy of the tiny model whose generation config samples.

    (The server only samples when the checkpoint's generation config says do_sample.)
    Yields (model name, base_url); the server is terminated at teardown.
    """
    model_dir = tmp_path_factory.mktemp("served") / "tiny-llama"
    shutil.copytree(tiny_path, model_dir)
    config_path = model_dir / "generation_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "do_sample": True}))
    port = free_port()
    cli = Path(sys.executable).parent / "transformers"
    log = open(model_dir.parent / "serve.log", "w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.Popen(
        [str(cli), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited ({proc.returncode}): {(model_dir.parent / 'serve.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("transformers serve was not ready after 120 s")
            time.sleep(0.5)
        yield str(model_dir), f"http://127.0.0.1:{port}/v1"
    finally:
        stop_process(proc, timeout=15)
        log.close()


def test_transformers_serve_n_samples(served_tiny):
    model, url = served_tiny
    engine = OpenAIEngine(model, url, EngineOptions(max_retries=1, max_concurrency=4))
    try:
        out = engine.generate(CONVS, SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=11))
    finally:
        engine.close()
    assert [len(samples) for samples in out] == [3, 3]
    for samples in out:
        assert len({s.text for s in samples}) > 1  # fallback requests use seed, seed+1, ...: distinct samples
        for s in samples:
            assert s.text and s.finish_reason in ("stop", "length")
            assert s.token_ids == () and s.logprobs is None  # this server returns no log-probs


def test_transformers_serve_greedy_matches_hf_engine(served_tiny, hf_engine):
    """Same chat template, same greedy tokens: the server and the local engine agree."""
    model, url = served_tiny
    engine = OpenAIEngine(model, url, EngineOptions(max_retries=1))
    try:
        remote = engine.generate(CONVS, SamplingParams(n=2, temperature=0.0, max_new_tokens=10))
    finally:
        engine.close()
    local = hf_engine.generate(CONVS, SamplingParams(temperature=0.0, max_new_tokens=10))
    for r, l in zip(remote, local):
        assert r[0].text == r[1].text == l[0].text


# --------------------------------------------------------------------------- scripted server


class ScriptedServer(LocalServer):
    """A real HTTP server whose replies come from `respond(body, i) -> (status, payload, headers, delay)`."""

    def __init__(self, respond):
        self.respond, self.requests = respond, []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                    index = len(outer.requests) - 1
                status, payload, headers, delay = outer.respond(body, index)
                time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def vllm_like_reply(body, seed_offset=0):
    """A vLLM-shaped completion: n choices, token ids as 'token_id:N', log-probs, prompt ids."""
    choices = []
    for i in range(body.get("n", 1)):
        ids = [100 + i, 200 + i, 300 + (body.get("seed") or 0) + seed_offset]
        content = [{"token": f"token_id:{t}", "logprob": -0.5 * (k + 1), "bytes": [], "top_logprobs": []} for k, t in enumerate(ids)]
        choices.append({
            "index": i,
            "message": {"role": "assistant", "content": f"answer {i}"},
            "logprobs": {"content": content} if body.get("logprobs") else None,
            "finish_reason": "length" if i == 0 else "stop",
        })
    return {"id": "x", "object": "chat.completion", "choices": choices, "prompt_token_ids": [1, 2, 3]}


@pytest.fixture
def scripted():
    servers = []

    def make(respond):
        servers.append(ScriptedServer(respond))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def engine_for(server, **options):
    return OpenAIEngine("m", server.url, EngineOptions(**options), retry_backoff=0.01)


def test_retries_on_503_and_429_then_succeeds(scripted):
    failures = [(503, {"error": {"message": "overloaded"}}), (429, {"error": {"message": "slow down"}}), (503, {})]

    def respond(body, i):
        if i < len(failures):
            status, payload = failures[i]
            return status, payload, {"Retry-After": "0"}, 0
        return 200, vllm_like_reply(body), {}, 0

    server = scripted(respond)
    engine = engine_for(server, max_retries=5, api_key="sk-test")
    [samples] = engine.generate(CONVS[:1], SamplingParams(n=2, max_new_tokens=3, seed=5))
    engine.close()
    assert len(server.requests) == 4
    assert server.requests[0]["auth"] == "Bearer sk-test" and server.requests[0]["path"] == "/v1/chat/completions"
    assert [s.text for s in samples] == ["answer 0", "answer 1"]
    assert samples[0].token_ids == (100, 200, 305) and samples[1].token_ids == (101, 201, 305)
    assert samples[0].logprobs == (-0.5, -1.0, -1.5)
    assert [s.finish_reason for s in samples] == ["length", "stop"]
    assert samples[0].prompt_token_ids == (1, 2, 3)


def test_persistent_500_raises_with_the_server_message(scripted):
    server = scripted(lambda body, i: (500, {"error": {"message": "CUDA out of memory on worker 3"}}, {}, 0))
    engine = engine_for(server, max_retries=2)
    with pytest.raises(ServerError) as info:
        engine.generate(CONVS[:1], SamplingParams())
    engine.close()
    assert isinstance(info.value, EngineError)
    assert info.value.status == 500 and "CUDA out of memory on worker 3" in str(info.value)
    assert "after 3 attempts" in str(info.value) and len(server.requests) == 3


def test_400_is_not_retried(scripted):
    server = scripted(lambda body, i: (400, {"error": {"message": "maximum context length is 8192 tokens"}}, {}, 0))
    engine = engine_for(server, max_retries=5)
    with pytest.raises(BatchError) as info:  # this conversation's own failure: the batch's others would go on
        engine.generate(CONVS[:1], SamplingParams())
    engine.close()
    [error] = info.value.results
    assert isinstance(error, ReplyError) and error.status == 400 and len(server.requests) == 1
    assert "HTTP 400 (not retried): maximum context length is 8192 tokens" in str(error)


def test_refused_optional_fields_are_dropped_once(scripted):
    """A server that rejects vLLM's extra fields gets the request again without them."""

    def respond(body, i):
        if "return_tokens_as_token_ids" in body:
            return 400, {"error": {"message": "Unrecognized request argument supplied: return_tokens_as_token_ids"}}, {}, 0
        return 200, vllm_like_reply(body), {}, 0

    server = scripted(respond)
    engine = engine_for(server, max_retries=0, max_concurrency=1)
    out = engine.generate(CONVS, SamplingParams(n=1))
    out += engine.generate(CONVS, SamplingParams(n=1))
    engine.close()
    assert all(s[0].text == "answer 0" and s[0].logprobs for s in out)
    # refused once, resent without the fields; every later request goes without them
    assert ["return_tokens_as_token_ids" in r["body"] for r in server.requests] == [True, False, False, False, False]


def test_server_ignoring_n_gets_one_request_per_sample_with_distinct_seeds(scripted):
    def respond(body, i):
        reply = vllm_like_reply({**body, "n": 1})
        return 200, reply, {}, 0

    server = scripted(respond)
    engine = engine_for(server, max_concurrency=1)
    [samples] = engine.generate(CONVS[:1], SamplingParams(n=3, seed=40))
    engine.close()
    assert len(samples) == 3
    assert [r["body"]["n"] for r in server.requests] == [3, 1, 1]
    assert [r["body"]["seed"] for r in server.requests] == [40, 41, 42]
    assert [s.token_ids[-1] for s in samples] == [340, 341, 342]


def test_images_and_params_pass_through_untouched(scripted):
    server = scripted(lambda body, i: (200, vllm_like_reply(body), {}, 0))
    image = "data:image/png;base64," + "iVBORw0KGgo" * 50
    conv = [{"role": "user", "content": [
        {"type": "text", "text": "What differs?"},
        {"type": "image_url", "image_url": {"url": image}},
    ]}]
    engine = engine_for(server)
    engine.generate([conv], SamplingParams(n=2, temperature=0.3, top_p=0.9, max_new_tokens=7, stop=("\n\n",), seed=9))
    engine.close()
    body = server.requests[0]["body"]
    assert body["messages"] == conv
    assert (body["model"], body["n"], body["temperature"], body["top_p"], body["max_tokens"], body["stop"], body["seed"]) == (
        "m", 2, 0.3, 0.9, 7, ["\n\n"], 9,
    )
    assert body["logprobs"] is True and body["return_tokens_as_token_ids"] is True


def test_timeouts_are_retried_then_raised(scripted):
    server = scripted(lambda body, i: (200, vllm_like_reply(body), {}, 1.0))
    engine = engine_for(server, max_retries=1, request_timeout=0.2)
    with pytest.raises(ServerError, match="after 2 attempts \\(no response\\): no complete reply within 0.2s"):
        engine.generate(CONVS[:1], SamplingParams())
    engine.close()
    assert len(server.requests) == 2


def test_connection_refused_raises_engine_error():
    engine = OpenAIEngine("m", f"http://127.0.0.1:{free_port()}/v1", EngineOptions(max_retries=1), retry_backoff=0.01)
    with pytest.raises(EngineError, match="connection error"):
        engine.generate(CONVS[:1], SamplingParams())
    engine.close()


def test_max_completion_tokens_fallback(scripted):
    def respond(body, i):
        if "max_tokens" in body:
            return 400, {"error": {"message": "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens'."}}, {}, 0
        return 200, vllm_like_reply(body), {}, 0

    server = scripted(respond)
    engine = engine_for(server, max_retries=0)
    [[sample]] = engine.generate(CONVS[:1], SamplingParams(max_new_tokens=5))
    engine.close()
    assert sample.text == "answer 0" and server.requests[-1]["body"]["max_completion_tokens"] == 5


def test_tokenizer_cuts_server_ids_like_local_backends(scripted, tiny_path):
    """vLLM returns eos / stop-string tokens among the ids; with the tokenizer they are cut."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    before = tok("def f(x):\n    return x", add_special_tokens=False)["input_ids"]
    after = tok("\n\nmore text", add_special_tokens=False)["input_ids"]

    def respond(body, i):
        ids = before + after if body.get("stop") else before + [tok.eos_token_id]
        content = [{"token": f"token_id:{t}", "logprob": -1.0 - k} for k, t in enumerate(ids)]
        text = tok.decode(before)
        choice = {"index": 0, "message": {"content": text}, "logprobs": {"content": content}, "finish_reason": "stop"}
        return 200, {"choices": [choice]}, {}, 0

    server = scripted(respond)
    engine = OpenAIEngine("m", server.url, EngineOptions(extra={"tokenizer": str(tiny_path)}), retry_backoff=0.01)
    [[stopped]] = engine.generate(CONVS[:1], SamplingParams(stop=("\n\n",)))
    [[ended]] = engine.generate(CONVS[:1], SamplingParams())
    engine.close()
    for s in (stopped, ended):
        assert tok.decode(list(s.token_ids)) == s.text and "\n\n" not in s.text
        assert tok.eos_token_id not in s.token_ids and len(s.logprobs) == len(s.token_ids)
        assert s.text.startswith("def f(x):")
    assert (stopped.finish_reason, ended.finish_reason) == ("stop_string", "stop")
    assert ended.token_ids == tuple(before)


# --------------------------------------------------------------------------- several replicas


def ok(body, i):
    return 200, vllm_like_reply(body), {}, 0.05  # a little latency, so requests overlap


def test_requests_spread_over_replicas(scripted):
    from engines import load_engine

    a, b = scripted(ok), scripted(ok)
    engine = load_engine(f"openai:m@{a.url},{b.url}", EngineOptions(max_concurrency=4))
    assert engine.base_urls == [a.url, b.url]
    out = engine.generate(CONVS * 6, SamplingParams(n=2, seed=1))
    engine.close()
    assert [len(s) for s in out] == [2] * 12 and all(s[1].text == "answer 1" for s in out)
    assert len(a.requests) + len(b.requests) == 12 and min(len(a.requests), len(b.requests)) >= 4


def test_a_failing_replica_is_retried_on_another_and_then_avoided(scripted):
    """Replica A answers 503 (as a crashed vLLM behind its proxy would): every request still
    succeeds, even with no retry rounds, and A is skipped while it cools down."""
    down = scripted(lambda body, i: (503, {"error": {"message": "engine dead"}}, {}, 0))
    up = scripted(ok)
    engine = OpenAIEngine("m", [down.url, up.url], EngineOptions(max_retries=0, max_concurrency=1),
                          retry_backoff=0.01, replica_cooldown=60)
    out = engine.generate(CONVS * 3, SamplingParams())
    engine.close()
    assert all(s[0].text == "answer 0" for s in out)
    assert len(down.requests) == 1 and len(up.requests) == 6


def test_a_replica_that_refuses_connections_fails_over(scripted):
    up = scripted(ok)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    engine = OpenAIEngine("m", [dead, up.url], EngineOptions(max_retries=0, max_concurrency=2), retry_backoff=0.01)
    out = engine.generate(CONVS * 2, SamplingParams(n=3, temperature=0.0))  # greedy: one request, n copies
    engine.close()
    assert all(len({s.text for s in samples}) == 1 and len(samples) == 3 for samples in out)
    assert [r["body"]["n"] for r in up.requests] == [1] * 4


def test_all_replicas_failing_raises_after_rounds(scripted):
    a = scripted(lambda body, i: (500, {"error": {"message": "a broke"}}, {}, 0))
    b = scripted(lambda body, i: (502, {"error": {"message": "b broke"}}, {}, 0))
    engine = OpenAIEngine("m", [a.url, b.url], EngineOptions(max_retries=1), retry_backoff=0.01)
    with pytest.raises(ServerError, match=r"all 2 servers, last http://127\.0\.0\.1:\d+/v1/chat/completions "
                                          r"failed after 4 attempts \(HTTP 50[02]\): [ab] broke"):
        engine.generate(CONVS[:1], SamplingParams())
    engine.close()
    assert len(a.requests) == len(b.requests) == 2


def test_finish_reason_tells_end_of_turn_from_stop_string_and_length():
    """vLLM's server names the stop string that ended a choice in `stop_reason` (None:
    end of turn); trainers append end-of-turn only on "stop"."""
    from engines.openai_engine import _parse_choice

    choice = lambda reason, stop_reason=None: {"message": {"content": "x"}, "finish_reason": reason,  # noqa: E731
                                               "stop_reason": stop_reason}
    assert _parse_choice(choice("stop")).finish_reason == "stop"
    assert _parse_choice(choice("stop", "\n\n")).finish_reason == "stop_string"
    assert _parse_choice(choice("stop", 128009)).finish_reason == "stop"  # a stop token id ends the turn
    assert _parse_choice(choice("length")).finish_reason == "length"


# --------------------------------------------------------------------------- badly behaved servers


class RawServer(LocalServer):
    """A real HTTP server whose handler writes the raw reply: `respond(handler, body, i)`."""

    def __init__(self, respond):
        self.respond, self.requests, self.sent = respond, [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"auth": self.headers.get("Authorization"), "body": body})
                try:
                    outer.respond(self, body, len(outer.requests) - 1)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading: what a bounded client does
                self.close_connection = True

            def log_message(self, *args):
                pass

        super().__init__(Handler)


@pytest.fixture
def raw():
    servers = []

    def make(respond):
        servers.append(RawServer(respond))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.mark.parametrize("interval, deadline", [
    (0.3, 1.0),
    pytest.param(5.0, 6.0, marks=pytest.mark.slow),  # the server: one byte every 5 s
])
def test_a_trickled_body_times_out_at_the_total_deadline(raw, interval, deadline):
    """One byte every `interval` s: a per-read timeout of `deadline` s would restart
    forever; the total deadline (connect + whole body) ends the attempt after `deadline` s."""
    body = json.dumps(vllm_like_reply({"n": 1})).encode()

    def respond(h, req, i):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        for k in range(len(body)):
            h.wfile.write(body[k:k + 1])
            h.wfile.flush()
            time.sleep(interval)

    server = raw(respond)
    engine = engine_for(server, max_retries=0, request_timeout=deadline)
    start = time.monotonic()
    with pytest.raises(ServerUnavailable, match=rf"after 1 attempt \(no response\): no complete reply within "
                                                rf"{deadline:g}s \(--request_timeout\)"):
        engine.generate(CONVS[:1], SamplingParams())
    elapsed = time.monotonic() - start
    engine.close()
    assert deadline - 0.1 < elapsed < deadline + 1.5, elapsed


@pytest.mark.parametrize("with_length", [False, True])
def test_a_300_mb_reply_stops_at_the_cap_in_bounded_memory(raw, with_length):
    """The default cap (32 MB): the reply is streamed and dropped at the cap (chunked), or
    refused unread (Content-Length over the cap); memory stays far below 300 MB."""
    import tracemalloc

    chunk = b"x" * (1 << 20)
    total = 300 << 20

    def respond(h, req, i):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if with_length:
            h.send_header("Content-Length", str(total))
        else:
            h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        sent = 0
        try:
            while sent < total:
                h.wfile.write(chunk if with_length else b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        finally:
            server.sent.append(sent)

    server = raw(respond)
    engine = engine_for(server, max_retries=3)
    tracemalloc.start()
    try:
        with pytest.raises(BatchError) as info:
            engine.generate(CONVS[:1], SamplingParams())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        engine.close()
    [error] = info.value.results
    assert isinstance(error, ReplyError) and "over the 32 MB cap (--max_reply_mb)" in str(error)
    assert len(server.requests) == 1  # not resent
    assert peak < 100 << 20, f"peak {peak / 2**20:.0f} MB"
    deadline = time.monotonic() + 10
    while not server.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.sent and server.sent[0] < total  # the client hung up long before the end


def test_a_reply_of_the_wrong_shape_fails_only_its_conversation(raw):
    def respond(h, req, i):
        if req["messages"][-1]["content"] == "hi":
            send_json(h, 200, {"choices": [{"message": "oops"}]})
        else:
            send_json(h, 200, vllm_like_reply(req))

    server = raw(respond)
    engine = engine_for(server, max_retries=2)
    with pytest.raises(BatchError) as info:
        engine.generate(CONVS, SamplingParams())
    engine.close()
    good, bad = info.value.results
    assert good[0].text == "answer 0"
    assert isinstance(bad, ReplyError)
    assert "unusable reply: choice 0: 'message' is a str (oops), expected an object with 'content'" in str(bad)
    assert len(server.requests) == 2  # an unusable reply is not retried


@pytest.mark.parametrize("case", ["400", "500", "200-malformed", "200-not-json"])
def test_an_api_key_echoed_by_the_server_never_reaches_an_error(raw, case):
    key = "sk-test-0123456789abcdef"

    def respond(h, req, i):
        auth = h.headers.get("Authorization")
        if case == "400":
            send_json(h, 400, {"error": {"message": f"bad request with header {auth}"}})
        elif case == "500":
            send_json(h, 500, {"error": {"message": f"crashed handling {auth}"}})
        elif case == "200-malformed":
            send_json(h, 200, {"echo": auth})
        else:
            data = f"<html>{auth}</html>".encode()
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)

    server = raw(respond)
    engine = engine_for(server, max_retries=1, api_key=key)
    with pytest.raises(EngineError) as info:
        engine.generate(CONVS[:1], SamplingParams())
    engine.close()
    assert server.requests[0]["auth"] == f"Bearer {key}"  # the server did see it
    errors = [info.value] + [r for r in getattr(info.value, "results", []) if isinstance(r, EngineError)]
    for e in errors:
        text = str(e) + getattr(e, "server_message", "")
        assert key not in text and key[:8] not in text, text
    assert "[api key redacted]" in str(info.value)


def test_redact_cuts_keys_also_when_the_text_was_cut_short():
    from engines.openai_engine import redact

    assert redact("key sk-abcdef123456 and again sk-abcdef123456", ["sk-abcdef123456"]) == (
        "key [api key redacted] and again [api key redacted]")
    assert redact("...Bearer sk-abcde", ["sk-abcdef123456"]) == "...Bearer [api key redacted]"
    assert redact("nothing here", ["sk-abcdef123456"]) == "nothing here"


def test_server_flags_become_the_engine_defaults():
    from engines.base import ServerOptions, server_defaults, set_server_defaults

    before = server_defaults()
    try:
        set_server_defaults(ServerOptions(request_timeout=7.5, max_retries=1, max_reply_mb=2))
        opts = EngineOptions()
        assert (opts.request_timeout, opts.max_retries, opts.max_reply_bytes) == (7.5, 1, 2 << 20)
        assert EngineOptions(max_retries=4).max_retries == 4  # an explicit value wins
    finally:
        set_server_defaults(before)
    with pytest.raises(ValueError, match="--request_timeout: must be a finite number > 0, got nan"):
        ServerOptions(request_timeout=float("nan"))
    with pytest.raises(ValueError, match="--max_retries: must be an integer >= 0, got -1"):
        ServerOptions(max_retries=-1)
