"""AppWorld (Trivedi et al., 2024) as a colbench environment: an HTTP client of AppWorld's own
environment server. The agent's code never runs in our process.

AppWorld's package ships the server (`appworld serve environment --port 8000`, the FastAPI
app `appworld.serve.environment`); it runs in AppWorld's own virtual environment, so its
pinned dependencies never meet ours. One server holds ONE task world at a time.

    # in AppWorld's venv: pip install appworld && appworld install && appworld download data
    #                     appworld serve environment --port 8000      (one per episode in flight)
    export COLBENCH_APPWORLD_URLS=http://localhost:8000,http://localhost:8001
    export APPWORLD_ROOT=/path/with/data      # where `appworld download data` put data/
    from colbench.envs import make_env
    env = make_env("appworld")                # AppWorldEnv; the executor is scripted:appworld
    tasks = load_tasks("builtin:train", env="appworld")   # ids of data/datasets/train.txt

An episode (docs/appworld.md):
- the agent sees our instructions (colbench/envs/prompts/appworld_agent.txt) and the task
  as the server gives it (instruction, supervisor);
- each agent turn is Python code (its first ```python block), executed in the task's world
  by the executor (`AppWorldExecutor`, simulator spec `scripted:appworld`): the output
  is the next "user" turn;
- a turn whose code calls `apis.supervisor.complete_task(` ends the episode (the
  answer marker); so do the turn limit (LOOP: 40 interactions) and the context limit
  (`max_context_tokens`, LOOP: 32K tokens);
- the final code is executed, then AppWorld's own evaluation (`/evaluate`) scores the
  world: reward 1.0 when every test passes (task goal completion, TGC), else 0.0.
  Leaderboards add scenario goal completion (SGC: a scenario counts when all of its
  tasks pass; `scenario_id`), colbench.stats.

Worlds: the servers form a pool. A world is known by (task id, codes executed so far);
an episode's next code runs in a world with exactly its history, so the K episodes of a
task never share state. With fewer servers than episodes in flight, the least recently
used world is closed and later rebuilt by replaying its codes in a fresh world: correct
(AppWorld freezes time and seeds each world) but slower; `WorldPool.replayed` counts
replayed executions.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from colbench.cli import UserError
from colbench.envs.base import TrainingDefaults, agent_chat, fill_instructions
from colbench.prompts import KINDS, load_prompt
from colbench.protocols import SimReply, SimRequest
from colbench.scoring.backend import extract_code
from colbench.types import Score, Task, Turn
from engines.base import Message

PROMPT_PATH = KINDS["appworld_agent"].default_path()
COMPLETE_CALL = "apis.supervisor.complete_task("  # the call that ends an AppWorld task: our answer marker
URLS_VAR = "COLBENCH_APPWORLD_URLS"  # comma-separated environment-server URLs
DEFAULT_URL = "http://localhost:8000"  # `appworld serve environment`'s default port
SPLITS = ("train", "dev", "test_normal", "test_challenge")  # AppWorld's data/datasets/<split>.txt
SETUP_HINT = "see docs/appworld.md"

# Every request the adapter makes: name -> (HTTP method, path, request body fields).
# Each server answers {"output": ...}. tests/colbench/test_appworld_env.py pins this table to
# the installed package's server (appworld/serve/environment.py) and the stand-in server.
ROUTES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "initialize": ("POST", "/initialize", ("task_id", "experiment_name")),
    "execute": ("POST", "/execute", ("task_id", "code")),
    "evaluate": ("POST", "/evaluate", ("task_id", "suppress_errors", "report")),
    "close": ("POST", "/close", ("task_id",)),
    "task": ("GET", "/tasks/{task_id}", ("task_id",)),  # GET: the fields fill the path
}


class AppWorldError(UserError):
    """An AppWorld server that cannot be reached or refused a request (one line)."""


def scenario_id(task_id: str) -> str:
    """The scenario a task belongs to: AppWorld ids are "<scenario>_<n>" (tags after ":" dropped),
    as appworld.task.task_id_to_generator_id."""
    return task_id.split(":")[0].rsplit("_", 1)[0]


def task_description(info: dict[str, Any]) -> str:
    """The agent's first message from a server's task record (/initialize or /tasks/{id} output)."""
    sup = info["supervisor"]
    return (f"I am {sup['first_name']} {sup['last_name']} (email {sup['email']}, phone {sup['phone_number']}); "
            f"use my accounts through `apis`.\nTask: {info['instruction']}")


class AppWorldServer:
    """One AppWorld environment server (`appworld serve environment`), over ROUTES."""

    def __init__(self, url: str, timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def call(self, route: str, **fields: Any) -> Any:
        """The route's "output"; AppWorldError (one line) when unreachable or not HTTP 200."""
        method, path, names = ROUTES[route]
        if set(fields) != set(names):
            raise ValueError(f"AppWorld route {route!r} takes {names}, got {sorted(fields)}")  # a bug of ours
        body = json.dumps(fields).encode() if method == "POST" else None
        request = urllib.request.Request(self.url + path.format(**fields), data=body, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())["output"]
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace").replace("\n", " ")[:300]
            raise AppWorldError(f"AppWorld server {self.url}{path}: HTTP {e.code}: {text}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise AppWorldError(f"AppWorld environment server not reachable at {self.url} ({reason}): in AppWorld's "
                                f"own venv (pip install appworld; appworld install; appworld download data) start "
                                f"`appworld serve environment --port <port>` and list it in ${URLS_VAR}; "
                                f"{SETUP_HINT}") from None


@dataclass
class _World:
    server: AppWorldServer
    task_id: str | None = None  # None: the server holds no world of ours
    history: tuple[str, ...] = ()  # codes executed in it, in order
    last_used: int = 0


class WorldPool:
    """Task worlds on a fixed set of servers, each known by (task id, codes executed)."""

    def __init__(self, servers: Sequence[AppWorldServer], experiment_name: str):
        if not servers:
            raise ValueError("WorldPool needs at least one AppWorld server")
        self.worlds = [_World(s) for s in servers]
        # A world's state lives on the server's disk under experiments/outputs/<experiment>/tasks/<task id>/,
        # wiped when a world of that task starts: servers sharing a root need one experiment name each.
        self.experiment_names = [f"{experiment_name}-{i}" for i in range(len(servers))]
        self.replayed = 0  # executions repeated to rebuild an evicted world
        self._clock = 0

    def world(self, task_id: str, history: Sequence[str]) -> _World:
        """A world of `task_id` in which exactly `history` has run: a held one, else a free
        server (or the least recently used world, closed) initialised and replayed."""
        history = tuple(history)
        for w in self.worlds:
            if w.task_id == task_id and w.history == history:
                return w
        i = min(range(len(self.worlds)), key=lambda i: (self.worlds[i].task_id is not None, self.worlds[i].last_used))
        w = self.worlds[i]
        self.release(w)
        w.server.call("initialize", task_id=task_id, experiment_name=self.experiment_names[i])
        w.task_id = task_id
        for code in history:
            self.execute(w, code)
            self.replayed += 1
        return w

    def execute(self, w: _World, code: str) -> str:
        output = w.server.call("execute", task_id=w.task_id, code=code)
        w.history += (code,)
        self._clock += 1
        w.last_used = self._clock
        return str(output)

    def release(self, w: _World) -> None:
        """Close `w`'s world (if any); its server is free. A failed close only frees the slot."""
        if w.task_id is not None:
            try:
                w.server.call("close", task_id=w.task_id)
            except AppWorldError:
                pass  # the next /initialize replaces the server's world anyway
        w.task_id, w.history = None, ()

    def close(self) -> None:
        for w in self.worlds:
            self.release(w)


def server_urls(urls: str | Sequence[str] | None = None) -> list[str]:
    """The environment-server URLs: `urls`, else ${COLBENCH_APPWORLD_URLS}, else localhost:8000."""
    if urls is None:
        urls = os.environ.get(URLS_VAR) or DEFAULT_URL
    if isinstance(urls, str):
        urls = urls.split(",")
    out = [u.strip() for u in urls if u.strip()]
    if not out:
        raise ValueError(f"AppWorldEnv.urls: no server URL given (${URLS_VAR})")
    return out


def agent_codes(turns: Iterable[Turn]) -> list[str]:
    """The code of each agent turn, in order (its first ```python block, else its text)."""
    return [extract_code(t.content) for t in turns if t.role == "agent"]


class AppWorldEnv:
    """Environment contract (colbench.protocols.Environment) over AppWorld's environment server.

    urls:             environment-server URLs, one world each (None: ${COLBENCH_APPWORLD_URLS},
                      else http://localhost:8000); as many as episodes in flight avoids replays.
    max_turns:        agent turns (code executions) at most (LOOP: 40 interactions).
    max_context_tokens: an agent turn whose prompt + generation reach this many tokens ends the
                      episode (LOOP: 32K per task; None: no limit; needs an engine reporting token ids).
    max_output_chars: an execution's output shown to the agent is cut to this many characters.
    experiment_name:  AppWorld's experiment name for the worlds' outputs, server i's being
                      "<experiment_name>-<i>" (on the servers' side, under their root).
    timeout:          seconds per HTTP request.
    prompt_path:      the agent's instructions, an appworld_agent template file (None: ours).
    """

    name = "appworld"
    answer_marker = COMPLETE_CALL
    # reward is binary (TGC): LOOP's leave-one-out needs no pairing rule; success = reward 1
    training_defaults = TrainingDefaults(success_threshold=1.0, min_reward_gap=0.0, rft_top_fraction=1.0)

    def __init__(self, urls: str | Sequence[str] | None = None, max_turns: int = 40,
                 max_context_tokens: int | None = 32768, max_output_chars: int = 4000,
                 experiment_name: str = "colbench", timeout: float = 120.0, prompt_path: str | Path | None = None):
        if max_turns < 1:
            raise ValueError(f"AppWorldEnv.max_turns must be >= 1, got {max_turns}")
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"AppWorldEnv.max_context_tokens must be >= 1 or None, got {max_context_tokens}")
        if max_output_chars < 1:
            raise ValueError(f"AppWorldEnv.max_output_chars must be >= 1, got {max_output_chars}")
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.max_output_chars = max_output_chars
        self.agent_prompt = load_prompt("appworld_agent", prompt_path)
        self.pool = WorldPool([AppWorldServer(u, timeout) for u in server_urls(urls)], experiment_name)

    def system_prompt(self, single_turn: bool = False) -> str:
        return fill_instructions(self.agent_prompt.text, "", max_turns=self.max_turns,
                                 answer_marker=self.answer_marker)

    def agent_messages(self, task: Task, turns: Sequence[Turn], single_turn: bool = False) -> list[Message]:
        """Our instructions, the task as the server gives it, then code turns ("assistant")
        and their outputs ("user")."""
        return agent_chat(self.system_prompt(), task.description, turns)

    def is_final(self, agent_text: str) -> bool:
        """Whether the turn's code calls apis.supervisor.complete_task."""
        return COMPLETE_CALL in extract_code(agent_text)

    def extract_answer(self, agent_text: str) -> str:
        """A one-turn program (JSON list of codes); the runner uses `episode_answer` instead."""
        return json.dumps([extract_code(agent_text)])

    def episode_answer(self, task: Task, turns: Sequence[Turn]) -> str:
        """The answer of an ended episode: every agent turn's code, in order (a JSON list;
        the last one has not run yet). `score` runs it in the world the others built."""
        return json.dumps(agent_codes(turns))

    def execute_turn(self, task: Task, turns: Sequence[Turn]) -> SimReply:
        """Run the latest agent turn's code in the world its earlier codes built; the output,
        cut to max_output_chars, is the reply. A server failure fails only this episode."""
        codes = agent_codes(turns)
        try:
            world = self.pool.world(task.task_id, codes[:-1])
            output = self.pool.execute(world, codes[-1])
        except AppWorldError as e:
            return SimReply("", failed=True, error=str(e))
        if len(output) > self.max_output_chars:
            output = output[: self.max_output_chars] + f"\n[... output cut at {self.max_output_chars} characters]"
        return SimReply(f"Output:\n```\n{output}\n```")

    def score(self, tasks: Sequence[Task], answers: Sequence[str]) -> list[Score]:
        """Run each answer's last code in its world, then AppWorld's evaluation: reward 1.0 when
        every test passes (TGC), else 0.0. A server failure scores 0 (Score.error), never raises."""
        return [self._score_one(t, a) for t, a in zip(tasks, answers)]

    def _score_one(self, task: Task, answer: str) -> Score:
        try:
            codes = json.loads(answer) if answer else []
        except json.JSONDecodeError:
            codes = [answer]  # an answer written by hand: one program
        if not codes:
            return Score(0.0, False, error="no code to run")
        try:
            world = self.pool.world(task.task_id, codes[:-1])
            self.pool.execute(world, codes[-1])
            result = world.server.call("evaluate", task_id=task.task_id, suppress_errors=True, report=False)
            self.pool.release(world)
        except AppWorldError as e:
            return Score(0.0, False, error=str(e))
        passes, failures = result.get("passes", []), result.get("failures", [])
        success = bool(result["success"])
        return Score(float(success), success, detail={
            "scenario": scenario_id(task.task_id), "num_tests": result.get("num_tests"),
            "passed": len(passes), "failed": [f.get("requirement", "") for f in failures],
            "difficulty": result.get("difficulty")})

    def training_info(self, task: Task) -> str:
        """AppWorld gives no training-time information beyond the task (LOOP uses none)."""
        return task.hidden

    def close(self) -> None:
        self.pool.close()


class AppWorldExecutor:
    """The "other side" of an AppWorld episode (simulator spec `scripted:appworld`): runs each
    agent turn's code in its task world, on the environment's servers. `max_reply_chars` is
    the simulators' common argument; the environment's max_output_chars applies instead."""

    name = "appworld"

    def __init__(self, env: AppWorldEnv, max_reply_chars: int | None = None):
        if not isinstance(env, AppWorldEnv):
            raise ValueError(f"scripted:appworld runs code in AppWorld's worlds: use it with --env appworld, "
                             f"not {getattr(env, 'name', env)!r}")
        self.env = env

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        return [self.env.execute_turn(r.task, r.turns) for r in requests]

    def close(self) -> None:
        pass  # the worlds belong to the environment


def builtin_tasks(source: str, split: str | None = None, limit: int | None = None,
                  urls: str | Sequence[str] | None = None) -> list[Task]:
    """builtin:<split>: the task ids of AppWorld's data/datasets/<split>.txt under $APPWORLD_ROOT
    (default: the current directory), each described by the first server's /tasks/{id}."""
    named = source.partition(":")[2] or split or ""
    if named not in SPLITS:
        raise ValueError(f"appworld source {source!r}: split must be one of {', '.join(SPLITS)}")
    root = Path(os.environ.get("APPWORLD_ROOT") or ".").expanduser()
    ids_file = root / "data" / "datasets" / f"{named}.txt"
    if not ids_file.is_file():
        raise UserError(f"env appworld: no AppWorld data at {ids_file}: run `appworld download data` in AppWorld's "
                        f"venv and set APPWORLD_ROOT to the folder holding data/; {SETUP_HINT}")
    ids = [line.strip().split(":")[0] for line in ids_file.read_text().splitlines() if line.strip()]
    server = AppWorldServer(server_urls(urls)[0])
    tasks = []
    for task_id in ids[:limit] if limit is not None else ids:
        info = server.call("task", task_id=task_id)
        tasks.append(Task(task_id=task_id, env="appworld", description=task_description(info), hidden="",
                          meta={"split": named, "scenario": scenario_id(task_id), "datetime": info.get("datetime")}))
    return tasks
