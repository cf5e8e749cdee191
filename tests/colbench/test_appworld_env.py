"""The AppWorld environment (colbench/envs/appworld.py): its requests pinned to the installed
`appworld` package's server, and its logic against a stand-in server with the same routes.

The pin: tests/fixtures/appworld_interface.json is what tests/colbench/appworld_probe.py reads
from the installed package (routes, methods, body fields; AppWorld.__init__; the evaluation's
output keys; scenario ids). Without AppWorld's own venv (${SWEET_APPWORLD_PYTHON}, default
/work/appworld-venv/bin/python) the live comparison is skipped; the adapter's route table and
the stand-in are always checked against the snapshot, which ties the stand-in to the real server.
No AppWorld task data is needed or used.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Sequence

import pytest

from colbench.cli import UserError
from colbench.envs import make_env
from colbench.envs.appworld import COMPLETE_CALL, ROUTES, AppWorldEnv, AppWorldExecutor, builtin_tasks, scenario_id
from colbench.episodes import run_episodes
from colbench.protocols import AgentRequest, SimRequest
from colbench.stats import env_metrics
from colbench.types import Task, Turn
from engines.base import Sample
from tests.local_http import LocalServer, send_json

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "appworld_interface.json"
PROBE = ROOT / "tests" / "colbench" / "appworld_probe.py"
APPWORLD_PYTHON = os.environ.get("SWEET_APPWORLD_PYTHON", "/work/appworld-venv/bin/python")


# ---- the stand-in server -------------------------------------------------------------------

# The stand-in's routes: (method, path) -> the body fields it reads. test_stand_in_matches_the_real_routes
# ties it to the snapshot of the real server.
STAND_IN_ROUTES = {
    ("POST", "/initialize"): ("task_id", "experiment_name"),
    ("POST", "/execute"): ("task_id", "code"),
    ("POST", "/evaluate"): ("task_id", "suppress_errors", "report"),
    ("POST", "/close"): ("task_id",),
    ("GET", "/tasks/{task_id}"): ("task_id",),
}
SECRETS = {"aaa_1": 7, "aaa_2": 8, "bbb_1": 9}  # each task's hidden answer


class StandInAppWorld(LocalServer):
    """AppWorld's environment server in miniature: one world at a time, no code execution.
    A world interprets two statements: `print(secret)` prints the task's secret and
    `apis.supervisor.complete_task(answer=N)` completes the task; any other code prints
    "step <n>" (n: executions in this world, so a shared or mixed-up world shows). /evaluate
    passes when the task was completed with its secret. Every request is recorded."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict]] = []
        self.world: dict | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                m = re.fullmatch(r"/tasks/([^/]+)", self.path)
                outer.requests.append(("GET", "/tasks/{task_id}", {"task_id": m.group(1)} if m else {}))
                if not m or m.group(1) not in SECRETS:
                    return send_json(self, 500, {"detail": "no such task"})
                send_json(self, 200, {"output": outer.task_record(m.group(1))})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(("POST", self.path, body))
                status, payload = outer.handle(self.path, body)
                send_json(self, status, payload)

        super().__init__(Handler, path="")

    @staticmethod
    def task_record(task_id: str) -> dict:
        return {"task_id": task_id, "instruction": f"Find the secret of {task_id}.", "datetime": "2023-05-18T12:00:00",
                "supervisor": {"first_name": "Ada", "last_name": "Lovelace", "email": "ada@example.com",
                               "phone_number": "5550100"}}

    def handle(self, path: str, body: dict) -> tuple[int, dict]:
        task_id = body.get("task_id")
        if path == "/initialize":
            self.world = {"task_id": task_id, "steps": 0, "answer": None}
            return 200, {"output": self.task_record(task_id)}
        if self.world is None or self.world["task_id"] != task_id:
            return 500, {"detail": f"The active task world is not {task_id}"}  # as the real server refuses
        if path == "/execute":
            self.world["steps"] += 1
            code = body["code"]
            done = re.search(r"apis\.supervisor\.complete_task\(answer=(\d+)\)", code)
            if done:
                self.world["answer"] = int(done.group(1))
                return 200, {"output": "Marked the active task complete."}
            if code.strip() == "print(secret)":
                return 200, {"output": str(SECRETS[task_id])}
            return 200, {"output": f"step {self.world['steps']}"}
        if path == "/evaluate":
            ok = self.world["answer"] == SECRETS[task_id]
            req = {"requirement": "answer is the secret"}
            return 200, {"output": {"success": ok, "difficulty": 1, "num_tests": 1,
                                    "passes": [req] if ok else [], "failures": [] if ok else [req]}}
        if path == "/close":
            self.world = None
            return 200, {"output": None}
        return 404, {"detail": "Not Found"}


@pytest.fixture
def servers():
    started = [StandInAppWorld() for _ in range(4)]  # one per episode in flight below
    yield started
    for s in started:
        s.close()


def task(task_id: str) -> Task:
    return Task(task_id=task_id, env="appworld", description=f"Find the secret of {task_id}.", hidden="")


class CodeAgent:
    """Scripted: asks for the secret, then completes the task with it (+ `offset`, to fail on
    purpose); with `stall`, prints forever and never completes."""

    needs_simulator = True

    def __init__(self, name: str = "code", offset: int = 0, stall: bool = False):
        self.name, self.offset, self.stall = name, offset, stall

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        out = []
        for r in requests:
            last = r.messages[-1]["content"]
            found = re.search(r"```\n(\d+)\n```", last) if r.messages[-1]["role"] == "user" else None
            if self.stall:
                code = "print('thinking')"
            elif found is None:
                code = "print(secret)"
            else:
                code = f"{COMPLETE_CALL}answer={int(found.group(1)) + self.offset})"
            out.append(Sample(text=f"Next step.\n```python\n{code}\n```"))
        return out


# ---- (a) the pin to the installed package ---------------------------------------------------


def real_interface() -> dict:
    if not Path(APPWORLD_PYTHON).exists():
        pytest.skip(f"AppWorld's own venv not found at {APPWORLD_PYTHON} (set SWEET_APPWORLD_PYTHON; "
                    "python3 -m venv /work/appworld-venv && /work/appworld-venv/bin/pip install appworld)")
    res = subprocess.run([APPWORLD_PYTHON, str(PROBE)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_snapshot_is_the_installed_package():
    """The stored snapshot is what the installed package says (rerun the probe after an upgrade)."""
    live = real_interface()
    assert live == json.loads(SNAPSHOT.read_text())


def check_routes_against(interface: dict) -> None:
    routes = interface["routes"]
    for name, (method, path, fields) in ROUTES.items():
        assert path in routes, f"{name}: {path} is not a route of {interface['server_module']}"
        real = routes[path]
        assert method in real["methods"], (name, real["methods"])
        assert set(fields) <= set(real["fields"]), f"{name}: sends {set(fields) - set(real['fields'])} it does not read"
        required = {f for f, req in real["fields"].items() if req}
        assert required <= set(fields), f"{name}: lacks required {required - set(fields)}"
        assert real["body"] in (("none",) if method == "GET" else ("model", "object")), (name, real["body"])
    # the evaluation's output that _score_one reads; the init argument the adapter passes
    assert {"success", "num_tests", "passes", "failures"} <= set(interface["evaluate_output_keys"])
    assert "experiment_name" in interface["appworld_init"]
    assert interface["world_outputs_per_experiment_and_task"]  # why each server gets its own experiment name
    assert "environment" in interface["server_types"]  # `appworld serve environment`
    assert {t: scenario_id(t) for t in interface["scenario_ids"]} == interface["scenario_ids"]


def test_routes_match_the_installed_server():
    check_routes_against(real_interface())


def test_routes_match_the_snapshot():
    check_routes_against(json.loads(SNAPSHOT.read_text()))


def test_task_records_match_the_real_server():
    """The stand-in's task record has the real server's keys, and the adapter reads only those."""
    real = json.loads(SNAPSHOT.read_text())["task_record"]
    record = StandInAppWorld.task_record("aaa_1")
    for route in ("initialize", "show_task"):
        assert set(real[route]) == set(record) and real[route]["supervisor"] == sorted(record["supervisor"])
    from colbench.envs.appworld import task_description

    read = {"instruction": "do it", "supervisor": {k: f"<{k}>" for k in real["show_task"]["supervisor"]}}
    assert all(f"<{k}>" in task_description(read) for k in real["show_task"]["supervisor"])


def test_stand_in_matches_the_real_routes():
    """The stand-in serves exactly the adapter's routes, reading the real servers' field names."""
    routes = json.loads(SNAPSHOT.read_text())["routes"]
    assert set(STAND_IN_ROUTES) == {(m, p) for m, p, _ in ROUTES.values()}
    for (method, path), fields in STAND_IN_ROUTES.items():
        assert method in routes[path]["methods"] and set(fields) <= set(routes[path]["fields"]), path


# ---- (b) the adapter's logic against the stand-in -------------------------------------------


def test_episodes_run_code_in_their_own_worlds_and_are_scored_by_evaluate(servers, tmp_path):
    env = AppWorldEnv(urls=[s.url for s in servers], max_turns=5)
    tasks = [task("aaa_1"), task("aaa_2")]
    try:
        good = run_episodes(env, tasks, CodeAgent(), AppWorldExecutor(env), seeds=(0, 1), progress=False,
                            out_path=tmp_path / "good.jsonl")
        bad = run_episodes(env, tasks[:1], CodeAgent("off", offset=1), AppWorldExecutor(env), progress=False)
    finally:
        env.close()
    assert [e.stop_reason for e in good] == ["answered"] * 4 and all(e.success and e.reward == 1.0 for e in good)
    ep = good[0]
    assert ep.turns[1].content == "Output:\n```\n7\n```" and json.loads(ep.answer) == [
        "print(secret)", f"{COMPLETE_CALL}answer=7)"]
    assert ep.score.detail["scenario"] == "aaa" and ep.score.detail["passed"] == 1
    assert not bad[0].success and bad[0].reward == 0.0 and bad[0].score.detail["failed"] == ["answer is the secret"]
    sent = [(m, p, set(b)) for s in servers for m, p, b in s.requests]
    for method, path, fields in sent:  # every request is a ROUTES entry with its exact fields
        match = [f for m, p, f in ROUTES.values() if m == method and p == path]
        assert match and set(match[0]) == fields, (method, path, fields)
    assert sum(p == "/evaluate" for _, p, _ in sent) == 5 and env.pool.replayed == 0
    names = {s.url: {b["experiment_name"] for m, p, b in s.requests if p == "/initialize"} for s in servers}
    assert sorted(n for ns in names.values() for n in ns) == [f"colbench-{i}" for i in range(4)]  # one per server


def test_one_server_replays_and_gives_the_same_results(servers):
    """Four episodes in flight on one server: worlds are evicted and rebuilt by replay, and
    each episode still sees only its own world ("step n" counts its own executions)."""
    many = AppWorldEnv(urls=[s.url for s in servers])
    one = AppWorldEnv(urls=[servers[0].url])
    tasks = [task("aaa_1"), task("bbb_1")]
    try:
        stall_many = run_episodes(many, tasks, CodeAgent(stall=True), AppWorldExecutor(many), seeds=(0, 1),
                                  progress=False)
        stall_one = run_episodes(one, tasks, CodeAgent(stall=True), AppWorldExecutor(one), seeds=(0, 1), progress=False)
        solved_one = run_episodes(one, tasks, CodeAgent(), AppWorldExecutor(one), seeds=(0, 1), progress=False)
    finally:
        many.close()
        one.close()
    for ep in stall_one:  # run_episodes' default turn limit (10)
        outputs = [t.content for t in ep.turns if t.role == "human"]
        assert outputs == [f"Output:\n```\nstep {n}\n```" for n in range(1, len(outputs) + 1)]
        assert ep.stop_reason == "turn_limit" and not ep.success
    assert [[t.content for t in e.turns] for e in stall_one] == [[t.content for t in e.turns] for e in stall_many]
    assert one.pool.replayed > 0
    assert all(e.success for e in solved_one)


class GrowingContextAgent(CodeAgent):
    """Prints forever; its engine reports a prompt of 100 tokens per turn so far and 10 generated."""

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        return [Sample(text="```python\nprint(1)\n```", token_ids=[1] * 10, logprobs=[0.0] * 10,
                       prompt_token_ids=[2] * (100 * len(r.messages))) for r in requests]


def test_the_context_limit_ends_an_episode_and_it_is_scored(servers):
    """LOOP's 32K-token budget, in miniature: turn 1's prompt (2 messages) + generation = 210
    tokens, turn 2's = 410 >= 400 ends it (stop "token_limit"), its last cell runs, /evaluate scores."""
    env = AppWorldEnv(urls=[servers[0].url], max_context_tokens=400)
    try:
        (ep,) = run_episodes(env, [task("aaa_1")], GrowingContextAgent(), AppWorldExecutor(env), progress=False)
    finally:
        env.close()
    assert ep.stop_reason == "token_limit" and len(ep.agent_turns) == 2 and ep.score.error is None
    assert [p for _, p, _ in servers[0].requests].count("/execute") == 2  # turn 1 by the executor, turn 2 by score
    assert AppWorldEnv(urls="http://x").max_context_tokens == 32768  # LOOP's limit by default


def test_unreachable_server_fails_its_episode_with_a_one_line_error(tmp_path):
    env = AppWorldEnv(urls=["http://127.0.0.1:9"], timeout=5)
    code_turn = Turn("agent", "```python\nprint(1)\n```")
    reply = AppWorldExecutor(env).reply([SimRequest(task("aaa_1"), [code_turn])])[0]
    assert reply.failed and "\n" not in reply.error and "appworld serve environment" in reply.error
    score = env.score([task("aaa_1")], [json.dumps(["print(1)"])])[0]
    assert score.reward == 0.0 and "not reachable at http://127.0.0.1:9" in score.error
    env.close()


def test_is_final_and_the_prompt_file():
    env = make_env("appworld", urls="http://localhost:1")
    assert env.is_final(f"done\n```python\n{COMPLETE_CALL}answer=3)\n```")
    assert not env.is_final("I will call complete_task later.\n```python\nprint(1)\n```")
    system = env.agent_messages(task("aaa_1"), [])[0]["content"]
    assert COMPLETE_CALL in system and "at most 40 turns" in system and "apis.api_docs" in system
    assert env.agent_prompt.path.name == "appworld_agent.txt"
    with pytest.raises(ValueError, match="scripted:appworld.*--env appworld"):
        AppWorldExecutor(make_env("backend"))


def test_builtin_tasks_read_ids_from_the_data_and_descriptions_from_the_server(servers, tmp_path, monkeypatch):
    data = tmp_path / "data" / "datasets"
    data.mkdir(parents=True)
    (data / "train.txt").write_text("aaa_1\naaa_2:tag\n\nbbb_1\n")
    monkeypatch.setenv("APPWORLD_ROOT", str(tmp_path))
    monkeypatch.setenv("COLBENCH_APPWORLD_URLS", servers[0].url)
    from colbench.tasks import load_tasks

    tasks = load_tasks("builtin:train", env="appworld")
    assert [t.task_id for t in tasks] == ["aaa_1", "aaa_2", "bbb_1"]
    assert "Task: Find the secret of aaa_2." in tasks[1].description and "Ada Lovelace" in tasks[1].description
    assert tasks[2].meta["scenario"] == "bbb" and tasks[0].meta["split"] == "train"
    with pytest.raises(UserError, match=r"no AppWorld data at .*dev\.txt: run `appworld download data`"):
        builtin_tasks("builtin:dev")
    with pytest.raises(ValueError, match="split must be one of train, dev"):
        builtin_tasks("builtin:valid")


def test_leaderboard_reports_tgc_and_sgc():
    from colbench.types import Episode, Score

    def ep(task_id: str, seed: int, ok: bool) -> Episode:
        return Episode(task_id, "appworld", "a", seed, score=Score(float(ok), ok))

    # scenario aaa: seed 0 both pass, seed 1 one fails; scenario bbb: seed 0 passes, seed 1 fails
    eps = [ep("aaa_1", 0, True), ep("aaa_2", 0, True), ep("aaa_1", 1, True), ep("aaa_2", 1, False),
           ep("bbb_1", 0, True), ep("bbb_1", 1, False)]
    metrics = env_metrics("appworld", eps)
    assert metrics["tgc"].value == pytest.approx(4 / 6)
    assert metrics["sgc"].value == pytest.approx(2 / 4)
    assert "tests_passed" not in metrics


# ---- LOOP against the stand-in ---------------------------------------------------------------


def test_loop_smoke_run_against_the_stand_in(servers, tmp_path):
    """LOOP with the tiny random model on two stand-in tasks: episodes are played through the
    stand-in servers (code turns executed, /evaluate scoring), the iteration is logged. The
    random model never completes a task, so every reward is 0 and the run says so."""
    data = tmp_path / "data" / "datasets"
    data.mkdir(parents=True)
    (data / "train.txt").write_text("aaa_1\nbbb_1\n")
    out = tmp_path / "loop"
    env = {**os.environ, "APPWORLD_ROOT": str(tmp_path), "COLBENCH_APPWORLD_URLS": ",".join(s.url for s in servers),
           "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "appworld",
           "--simulator", "scripted:appworld", "--tasks", "builtin:train", "--model", "tiny", "--iterations", "1",
           "--tasks_per_iteration", "1", "--k", "2", "--max_new_tokens", "8", "--max_turns", "2",
           "--micro_batch_size", "4", "--report_to", "none", "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert "no reward variance" in res.stderr, res.stderr[-3000:]
    episodes = [json.loads(line) for line in (out / "episodes" / "iter-0000.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(e["env"] == "appworld" and e["score"]["reward"] == 0.0 for e in episodes)
    assert all(t["content"].startswith("Output:\n") for e in episodes for t in e["turns"] if t["role"] == "human")
    sent = [p for s in servers for _, p, _ in s.requests]
    assert sent.count("/evaluate") == 2 and sent.count("/execute") >= 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loop/episodes_total"] == 2.0


def test_the_documented_commands_parse_with_the_papers_settings(monkeypatch, tmp_path):
    """docs/appworld.md's LOOP and evaluation commands, parsed with the real parsers: K = 6, the
    public code's LoRA learning rate, 40 interactions, a 32K-token context, the AppWorld env."""
    import shlex

    from colbench.evaluate import parse_config
    from sweet.train_policy import parse, split_algorithm

    monkeypatch.chdir(tmp_path)
    text = re.sub(r"\\\n\s*", " ", (ROOT / "docs" / "appworld.md").read_text())
    commands = {m.group(1): shlex.split(m.group(2)) for m in re.finditer(r"python -m (\S+)(.*)", text)}
    assert set(commands) == {"colbench.evaluate", "sweet.train_policy"}
    name, _ = split_algorithm(commands["sweet.train_policy"])
    _, (model, train, algo) = parse(commands["sweet.train_policy"])
    assert name == "loop" and algo.env == "appworld" and algo.simulator == "scripted:appworld"
    assert algo.k == 6 and algo.max_turns == 40 and model.max_length == 32768 and algo.advantage == "loo"
    assert model.lora and train.learning_rate == pytest.approx(5e-5)
    config = parse_config(commands["colbench.evaluate"])
    assert config.env == "appworld" and config.simulator == "scripted:appworld" and config.max_turns == 40
