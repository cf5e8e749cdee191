"""colbench.evaluate as a user who points it at a badly behaved server, presses Ctrl-C,
starts it twice and kills it: real subprocesses, a real local HTTP server, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from local_http import LocalServer

from colbench.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
PROG = "python -m colbench.evaluate"
KEY = "sk-live-4242424242abcdefXYZ"


class Server(LocalServer):
    """A chat-completions server whose reply depends on the task description it sees."""

    def __init__(self, respond):
        outer = self
        self.auth: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.auth.append(self.headers.get("Authorization", ""))
                status, payload, delay = respond(body, self.headers.get("Authorization", ""))
                time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def evaluate(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "colbench.evaluate", "--no-progress", *args], cwd=ROOT, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


def answer(code: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"I WANT TO ANSWER:\n```python\n"
                                                 f"{code}\n```"}, "finish_reason": "stop"}]}


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("builtin:test", env="backend", limit=4)


def test_a_badly_behaved_server_fails_only_its_episodes_counted_and_keys_never_written(tmp_path, tasks):
    """Task 0 gets a reply of the wrong shape, task 1 a 400 echoing the Authorization
    header, tasks 2-3 the reference: the run finishes (exit 0), the leaderboard counts
    2 engine errors and quotes the first, and the key is nowhere on disk or in the output."""
    by_description = {t.description: t for t in tasks}

    def respond(body, auth):
        task = by_description[body["messages"][1]["content"]]
        if task is tasks[0]:
            return 200, {"choices": [{"message": "oops"}]}, 0
        if task is tasks[1]:
            return 400, {"error": {"message": f"invalid request from {auth}"}}, 0
        return 200, answer(task.hidden), 0

    server = Server(respond)
    try:
        out = tmp_path / "out"
        r = evaluate("--agent", f"m=openai:m@{server.url}", "--single-turn", "--limit", "4", "--output", str(out),
                     env={**ENV, "OPENAI_API_KEY": KEY})
    finally:
        server.close()
    assert r.returncode == 0, r.stderr[-3000:]
    assert server.auth and all(a == f"Bearer {KEY}" for a in server.auth)
    row = next(line for line in r.stdout.splitlines() if line.startswith("| m |"))
    header = next(line for line in r.stdout.splitlines() if line.startswith("| agent |"))
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["engine errors"] == "2" and cells["success"].startswith("50.0")
    [note] = [line for line in r.stdout.splitlines() if line.startswith("Engine errors:")]
    assert note.startswith("Engine errors: m: 2 of 4 episodes failed (scored 0); first: ReplyError: ")
    assert "'message' is a str (oops), expected an object with 'content'" in note
    episodes = [json.loads(line) for line in (out / "episodes" / "m.jsonl").read_text().splitlines()]
    by_task = {e["task_id"]: e for e in episodes}
    assert by_task[tasks[1].task_id]["stop_reason"] == "engine_error"
    assert "HTTP 400 (not retried): invalid request from Bearer [api key redacted]" in by_task[tasks[1].task_id]["meta"]["error"]
    assert [by_task[t.task_id]["score"]["reward"] for t in tasks[2:]] == [1.0, 1.0]
    written = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()] + [r.stdout, r.stderr]
    assert all(KEY not in text and KEY[:10] not in text for text in written)


def test_request_timeout_and_max_retries_reach_the_engine(tmp_path, tasks):
    """A silent server: with --request_timeout 0.5 --max_retries 1 the turn gives up after
    about 2 x 0.5 s (+ backoff), not ~12 minutes; every episode records why."""
    server = Server(lambda body, auth: (200, answer("pass"), 20))
    try:
        start = time.monotonic()
        r = evaluate("--agent", f"m=openai:m@{server.url}", "--single-turn", "--limit", "2", "--output",
                     str(tmp_path / "out"), "--request_timeout", "0.5", "--max_retries", "1")
        elapsed = time.monotonic() - start
    finally:
        server.close()
    assert r.returncode == 0, r.stderr[-3000:]
    assert elapsed < 60, elapsed  # interpreter start and the sandbox pool included
    note = next(line for line in r.stdout.splitlines() if line.startswith("Engine errors:"))
    assert note.startswith("Engine errors: m: 2 of 2 episodes failed (scored 0); first: ServerUnavailable: ")
    assert "failed after 2 attempts (no response): no complete reply within 0.5s (--request_timeout)" in note
    saved = json.loads((tmp_path / "out" / "config.json").read_text())["server"]
    assert saved == {"request_timeout": 0.5, "max_retries": 1, "max_reply_mb": 32.0}


def test_help_states_the_server_flags_defaults():
    r = subprocess.run([PY, "-m", "colbench.evaluate", "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=120)
    flat = " ".join(r.stdout.split())
    assert r.returncode == 0
    for flag, default in (("--request_timeout", "120.0"), ("--max_retries", "5"), ("--max_reply_mb", "32.0")):
        # the option's own help entry: "--flag VALUE, --flag-spelling VALUE <help> (default: X)"
        assert re.search(rf"{flag} [A-Z_]+, --[a-z-]+ [A-Z_]+ (?:(?!--).)*\(default: {re.escape(default)}\)", flat), flag


# ---- Ctrl-C, a second writer, SIGKILL --------------------------------------------------------


@pytest.fixture
def slow_replay(tmp_path, tasks):
    """Correct answers whose module body sleeps 0.5, 2.5, 3, 3.5 s (the sandbox allows 4 s
    per module body): one scoring batch that takes seconds, finishing one answer at a time."""
    rows = [{"task_id": t.task_id, "answer": f"import time\ntime.sleep({pause})\n{t.hidden}"}
            for pause, t in zip((0.5, 2.5, 3.0, 3.5), tasks)]
    path = tmp_path / "slow.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "colbench.evaluate", "--no-progress", *args], cwd=ROOT, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def episode_id(row: dict) -> str:
    return f"{row['task_id']}/{row['agent']}/{row['seed']}"


def lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_ctrl_c_during_scoring_keeps_the_scored_episodes_and_a_second_writer_is_refused(tmp_path, slow_replay):
    out = tmp_path / "out"
    args = ["--agent", f"slow=replay:{slow_replay}", "--limit", "4", "--output", str(out)]
    first = start(args)
    try:
        wait_for(lambda: (out / ".lock").exists(), what="the lock")
        second = evaluate("--agent", "reference", "--limit", "4", "--output", str(out))
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert second.stderr.strip().splitlines() == [
            f"{PROG}: error: output folder {out} is in use by pid {first.pid} on {os.uname().nodename}, started "
            + second.stderr.split(", started ", 1)[1].strip()]
        assert f"({PROG} --output {out})" in second.stderr
        episodes = out / "episodes" / "slow.jsonl"
        wait_for(lambda: len(lines(episodes)) >= 1, what="the first scored episode")
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    kept = lines(episodes)
    assert first.returncode == 130 and "Traceback" not in err, err
    assert 1 <= len(kept) < 4, len(kept)  # scored ones kept, the batch was not finished
    assert err.strip().splitlines()[-1] == (f"{PROG}: interrupted: {len(kept)} finished episodes are kept in "
                                            f"{out / 'episodes'}; rerun the same command to resume")
    assert not (out / ".lock").exists()  # released on the way out
    again = evaluate(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    ids = [episode_id(json.loads(line)) for line in lines(episodes)]
    assert len(ids) == len(set(ids)) == 4 and all(json.loads(line)["score"]["reward"] == 1.0 for line in lines(episodes))
    assert [json.loads(line) for line in lines(episodes)][: len(kept)] == [json.loads(line) for line in kept]


def test_after_sigkill_the_next_run_takes_the_lock_over_and_removes_dead_scratch(tmp_path, slow_replay):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    env = {**ENV, "SWEET_SANDBOX_SCRATCH": str(scratch)}
    args = ["--agent", f"slow=replay:{slow_replay}", "--limit", "4", "--output", str(out)]
    first = start(args, env)
    try:
        wait_for(lambda: lines(out / "episodes" / "slow.jsonl") and (out / ".lock").exists()
                 and any(p.name.startswith(f"sweet-sandbox-{first.pid}-") for p in scratch.iterdir()),
                 what="a scored episode while sandboxes still run")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    left = [p for p in scratch.iterdir() if p.name.startswith(f"sweet-sandbox-{first.pid}-")]
    assert left  # SIGKILL ran no cleanup
    live = scratch / f"sweet-sandbox-{os.getpid()}-keep"  # a live owner's dir must stay
    live.mkdir()
    again = evaluate(*args, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"warning: {out}: took over the stale lock of pid {first.pid} on " in again.stderr
    assert "that process is gone" in again.stderr
    assert not [p for p in scratch.iterdir() if p.name.startswith(f"sweet-sandbox-{first.pid}-")]
    assert live.is_dir()
    ids = [episode_id(json.loads(line)) for line in lines(out / "episodes" / "slow.jsonl")]
    assert len(ids) == len(set(ids)) == 4


@pytest.mark.parametrize("yaml_text, args, message", [
    ("batch_size: 2.5\n", ["--agent", "reference"], "{cfg}: batch_size: expected an integer, got 2.5 (float)"),
    ("agent: [reference, [x]]\n", [], "{cfg}: agent[1]: expected a string, got ['x'] (list)"),
    (None, ["--agent", "reference", "--batch_size", "2.5"],
     "argument --batch_size/--batch-size: invalid int value: '2.5' (see --help)"),
    (None, ["--agent", "reference", "--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1 (see --help)"),
    (None, ["--agent", "reference", "--temperature", "nan"], "--temperature: invalid value nan (expected a number >= 0)"),
    (None, ["--agent", "reference", "--request_timeout", "0"], "--request_timeout: must be a finite number > 0, got 0.0"),
    (None, ["--agent", "reference", "--max_retries", "-1"], "--max_retries: must be an integer >= 0, got -1"),
])
def test_bad_input_is_one_line_exit_2_no_traceback(tmp_path, yaml_text, args, message):
    cfg = tmp_path / "run.yaml"
    if yaml_text is not None:
        cfg.write_text(yaml_text)
        args = ["--config", str(cfg), *args]
    r = evaluate(*args, "--output", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [f"{PROG}: error: {message.format(cfg=cfg)}"]
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path):
    r = evaluate("--agent", "reference", "--seeds", "0", "--output", str(tmp_path / "out"), "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr
    assert r.stderr.splitlines()[-1] == (f"{PROG}: error: --episodes-per-task: invalid value 0 "
                                         "(expected an integer in 1..1000)")


def test_ctrl_c_while_waiting_for_a_server_stops_at_once(tmp_path):
    """The requests in flight are cancelled: no waiting for the server's 30 s reply."""
    server = Server(lambda body, auth: (200, answer("pass"), 30))
    try:
        run = start(["--agent", f"m=openai:m@{server.url}", "--single-turn", "--limit", "2", "--output",
                     str(tmp_path / "out")])
        wait_for(lambda: len(server.auth) >= 2, what="the requests")
        sent = time.monotonic()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
        waited = time.monotonic() - sent
    finally:
        server.close()
    assert run.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"{PROG}: interrupted: 0 finished episodes are kept in "
                                            f"{tmp_path / 'out' / 'episodes'}; rerun the same command to resume")
    assert waited < 10, waited


def test_an_agent_name_reused_for_another_model_is_refused_not_resumed(tmp_path, capsys):
    """Episodes are resumed by agent name; a rerun that gives the name to another agent (or
    other sampling) must not reuse, or append to, the first one's episodes."""
    from colbench.evaluate import main

    out = tmp_path / "eval"
    base = ["--env", "testbed", "--tasks", "builtin:default/test", "--limit", "3", "--simulator", "scripted:testbed",
            "--no-progress", "--output", str(out)]
    assert main(base + ["--agent", "p=explorer"]) == 0
    episodes = out / "episodes" / "p.jsonl"
    first = episodes.read_text()
    assert json.loads((out / "episodes" / "p.agent.json").read_text())["spec"] == "explorer"
    capsys.readouterr()
    assert main(base + ["--agent", "p=optimal"]) == 2
    err = capsys.readouterr().err
    assert "p.jsonl" in err and "spec='explorer'" in err and "spec='optimal'" in err
    assert main(base + ["--agent", "p=explorer", "--temperature", "0.5"]) == 2  # other sampling: refused too
    assert episodes.read_text() == first  # nothing appended, nothing lost
    assert main(base + ["--agent", "p=explorer"]) == 0  # the same agent resumes as before
    assert episodes.read_text() == first
