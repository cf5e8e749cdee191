"""Serve a ColBench environment over OpenEnv: any env, task source and simulated human.

    python -m colbench.serve --env backend --tasks builtin:test --simulator scripted:backend --port 8000
    python -m colbench.serve --env testbed --tasks builtin:test --simulator scripted:testbed --port 8000
    python -m colbench.serve --env frontend --tasks builtin:test --simulator text+tiny --clip-model tiny
    curl localhost:8000/health

The server is OpenEnv's own (`openenv.core.env_server.create_app`: FastAPI + uvicorn;
WebSocket sessions on /ws, the stateless /reset and /step, /health, /schema, the Task
API); `ColBenchEnvironment` is its `Environment`. Use it with `colbench.client.
ColBenchClient`, with any OpenEnv client, or from TRL (examples/trl_grpo_colbench.py).

- `reset(task_id=None, seed=None, episode_id=None)` starts an episode (the next task in
  order when no id is given) and returns the agent's chat (`ColBenchObservation`).
- `step(ColBenchAction(message=...))` takes the agent's message: a question gets the
  simulated human's reply; the answer marker (or the last allowed turn, or a failed
  reply) ends the episode, and the answer is scored on the server, by the same env
  objects and the same episode rules as `colbench.evaluate` (`colbench.episodes.advance`):
  sandboxed code for backend/testbed, the render pool and CLIP for frontend.
- Nothing of the hidden information reaches the wire: observations carry the chat the
  agent sees, the human's replies, and at the end reward, success, the scorer's error
  and pass counts (never the tests, their expected values or the reference).

Episodes live in one store shared by every session, keyed by episode id, so the
stateless HTTP routes work too (pass `episode_id` in the action). Limits: at most
`--max-connections` WebSocket connections (OpenEnv's bound), `--max-episodes` episodes in
flight (a reset beyond it is refused), episodes idle longer than `--episode-timeout-s`
are dropped, and a step waits at most `--step-timeout-s` for its reply. Steps of all
sessions go through one worker that batches those waiting (`--batch-wait-s` lets
concurrent ones join): one simulator call and one scoring call per batch, as in the
runner's lock-step, and the shared env, sandbox pool and model simulator are only ever
used by that worker. A step after the
episode ended, or on an unknown or expired episode id, is an error naming the id
(HTTP 400/404; over WebSocket the client raises with the message).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import queue
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from colbench.client import ColBenchAction, ColBenchObservation, ColBenchState
from colbench.protocols import AgentRequest
from engines.base import Sample, SpecError

PROG = "python -m colbench.serve"
# Score.detail keys that describe the answer only (never the tests or the target).
PUBLIC_DETAIL = ("passed", "total", "answer_html_chars", "answer_page_height")


class UsageError(ValueError):
    """Bad command-line input: one line, exit code 2."""


class EpisodeError(ValueError):
    """A request about an episode that cannot be served (unknown, expired, ended)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class ServeConfig:
    """What a server serves and its limits."""

    env: str = field(default="backend", metadata={"help": "environment: backend, frontend, testbed, or registered"})
    tasks: str = field(default="builtin:test", metadata={
        "help": "task source: builtin:test, builtin:train, a JSONL/Parquet file, or hf:<dataset id>"})
    simulator: Optional[str] = field(default=None, metadata={
        "help": "simulated human (required): 'scripted:<name>', a model spec, or frontend 'text+<spec>'"})
    limit: Optional[int] = field(default=None, metadata={"help": "serve the first N tasks only"})
    host: str = field(default="127.0.0.1", metadata={"help": "interface to bind (0.0.0.0: every interface)"})
    port: int = field(default=8000, metadata={"help": "port to listen on"})
    max_connections: int = field(default=64, metadata={
        "help": "WebSocket connections open at once (OpenEnv max_concurrent_envs; TRL: >= its generation batch)"})
    max_episodes: int = field(default=1024, metadata={"help": "episodes in flight at once; a reset beyond is refused"})
    episode_timeout_s: float = field(default=900.0, metadata={"help": "drop an episode idle this long"})
    step_timeout_s: float = field(default=300.0, metadata={"help": "a step waits at most this long for the env"})
    batch_wait_s: float = field(default=0.005, metadata={
        "help": "a step waits this long for steps of other sessions to join its batch (one simulator call)"})
    max_turns: Optional[int] = field(default=None, metadata={"help": "agent turns at most (default: env's)"})
    max_reply_chars: Optional[int] = field(default=None, metadata={
        "help": "simulator reply length cap in characters (default: the env's, as published: frontend 1000, "
                "backend 400)"})
    simulator_max_new_tokens: int = field(default=200, metadata={"help": "model simulator tokens per reply"})
    clip_model: Optional[str] = field(default=None, metadata={"help": "frontend CLIP model ('tiny' for CPU tests)"})
    device: Optional[str] = field(default=None, metadata={"help": "model simulators: cpu, cuda, ..."})
    dtype: str = field(default="auto", metadata={"help": "model simulators: auto, bfloat16, float16, float32"})
    agent_prompt: Optional[str] = field(default=None, metadata={
        "help": "the agent's instructions (the observation's system message), a template file (default: ours; "
                "docs/prompts.md)"})
    human_prompt: Optional[str] = field(default=None, metadata={
        "help": "a model simulator's template file (default: ours; docs/prompts.md)"})

    def __post_init__(self) -> None:
        checks = [("port", 0 <= self.port <= 65535), ("max_connections", self.max_connections >= 1),
                  ("max_episodes", self.max_episodes >= 1), ("episode_timeout_s", self.episode_timeout_s > 0),
                  ("step_timeout_s", self.step_timeout_s > 0), ("batch_wait_s", self.batch_wait_s >= 0),
                  ("limit", self.limit is None or self.limit >= 1),
                  ("max_turns", self.max_turns is None or self.max_turns >= 1),
                  ("max_reply_chars", self.max_reply_chars is None or self.max_reply_chars >= 1)]
        for name, ok in checks:
            if not ok:
                raise UsageError(f"--{name.replace('_', '-')}: invalid value {getattr(self, name)!r}")
        if not self.simulator:
            raise UsageError("--simulator SPEC is required: the agent's questions need a simulated human")
        from colbench.envs import env_names, reply_cap

        if self.max_reply_chars is None and self.env in env_names():  # the env's (published: frontend 1000)
            self.max_reply_chars = reply_cap(self.env)


class _Given:
    """The clients' messages as an Agent (one per episode, in order), so
    `colbench.episodes.advance` runs the runner's rules on them."""

    name = "client"
    needs_simulator = True

    def __init__(self, texts: Sequence[str]):
        self.texts = list(texts)

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        return [Sample(text=t) for t in self.texts]


@dataclass(eq=False)
class _Slot:
    """One episode in the store."""

    live: Any  # colbench.episodes._Live
    seen: float  # last activity (time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


class EpisodeStore:
    """The server's state: tasks, the env, the simulator, and the episodes in flight."""

    def __init__(self, config: ServeConfig):
        from colbench.envs import env_names, make_env
        from colbench.episodes import EpisodeConfig
        from colbench.tasks import load_tasks
        from simulators import check_simulator_spec, load_simulator
        from engines.base import EngineOptions

        if config.env not in env_names():
            raise UsageError(f"--env: unknown environment {config.env!r}; known: {', '.join(env_names())}")
        check_simulator_spec(config.simulator, config.env)
        from colbench.prompts import check_prompt_flags

        prompts = check_prompt_flags(config.env, config.simulator, config.agent_prompt, config.human_prompt)
        try:
            # an unusable row cannot be played: served tasks are the usable ones (each skipped row logged)
            tasks = load_tasks(config.tasks, env=config.env, limit=config.limit, on_error="skip")
        except (OSError, ValueError, KeyError, LookupError) as e:
            raise UsageError(f"--tasks {config.tasks}: " + str(e).replace("\n", "; ")) from None
        if not tasks:
            raise UsageError(f"--tasks {config.tasks}: no tasks")
        self.config = config
        self.tasks = {t.task_id: t for t in tasks}
        self.order = [t.task_id for t in tasks]
        kwargs: dict[str, Any] = {"clip_model": config.clip_model} if config.clip_model else {}
        if config.max_turns:
            kwargs["max_turns"] = config.max_turns
        if "agent" in prompts and config.agent_prompt:
            kwargs["prompt_path"] = str(prompts["agent"].path)
        self.env = make_env(config.env, **kwargs)
        self.episode_config = EpisodeConfig(max_turns=config.max_turns or self.env.max_turns)
        try:
            self.simulator = load_simulator(config.simulator, self.env,
                                            engine_options=EngineOptions(device=config.device, dtype=config.dtype),
                                            max_reply_chars=config.max_reply_chars,
                                            max_new_tokens=config.simulator_max_new_tokens,
                                            prompt_file=config.human_prompt)
        except BaseException:
            self.env.close()
            raise
        self._episodes: dict[str, _Slot] = {}
        self._lock = threading.Lock()  # the episode table
        self._next = 0
        self.batch_sizes: collections.Counter = collections.Counter()  # batch size -> batches, for tests and tuning
        # Steps from every session go through one worker that batches what is waiting
        # (one simulator call and one scoring call per batch, as the runner's lock-step).
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._run_steps, name="colbench-steps", daemon=True)
        self._worker.start()

    # ---- episodes ----------------------------------------------------------------------

    def start(self, task_id: str | None = None, seed: int | None = None, episode_id: str | None = None):
        from colbench.episodes import start_episode

        with self._lock:
            self._expire()
            if task_id is None:
                task_id = self.order[self._next % len(self.order)]
                self._next += 1
            elif task_id not in self.tasks:
                raise EpisodeError(f"unknown task_id {task_id!r} ({len(self.tasks)} tasks served from "
                                   f"{self.config.tasks}; first: {self.order[0]!r})", status=404)
            episode_id = episode_id or uuid.uuid4().hex
            if episode_id in self._episodes:
                raise EpisodeError(f"episode id {episode_id!r} is already in use")
            running = sum(not s.live.episode.stop_reason for s in self._episodes.values())
            if running >= self.config.max_episodes:
                raise EpisodeError(f"server at capacity: {running} episodes in flight "
                                   f"(--max-episodes {self.config.max_episodes})", status=503)
            live = start_episode(self.env, self.tasks[task_id], _Given([]), seed or 0, self.simulator)
            live.episode.meta["episode_id"] = episode_id
            self._episodes[episode_id] = _Slot(live, time.monotonic())
        return self._observation(episode_id, live, reply=None)

    def step(self, episode_id: str | None, message: str) -> ColBenchObservation:
        slot = self._slot(episode_id)
        if not slot.lock.acquire(timeout=self.config.step_timeout_s):
            raise EpisodeError(f"episode {episode_id!r}: another step is still running", status=409)
        try:
            live = slot.live
            if live.episode.stop_reason:
                raise EpisodeError(f"episode {episode_id!r} is done (stop reason {live.episode.stop_reason!r}); "
                                   "reset() starts a new one")
            done = concurrent.futures.Future()
            self._queue.put((live, message, done))
            try:
                done.result(timeout=self.config.step_timeout_s)
            except concurrent.futures.TimeoutError:
                raise EpisodeError(f"episode {episode_id!r}: no reply within --step-timeout-s "
                                   f"{self.config.step_timeout_s:g} (the step may still complete)", status=503) from None
            slot.seen = time.monotonic()
            last = live.episode.turns[-1]
            reply = last.content if last.role == "human" and not last.failed else None
            return self._observation(episode_id, live, reply)
        finally:
            slot.lock.release()

    def _run_steps(self) -> None:
        """The step worker: take every step waiting (the first one blocks; a short linger
        lets concurrent sessions join), advance them as one batch, wake their callers."""
        from colbench.episodes import advance

        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.config.batch_wait_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(item)
            self.batch_sizes[len(batch)] += 1
            try:
                advance(self.env, _Given([m for _, m, _ in batch]), self.simulator, [lv for lv, _, _ in batch],
                        self.episode_config)
            except Exception as e:  # noqa: BLE001 - the contracts say env/simulator never raise; if they do, fail the steps
                for _, _, fut in batch:
                    fut.set_exception(e)
            else:
                for _, _, fut in batch:
                    fut.set_result(None)

    def state(self, episode_id: str | None) -> ColBenchState:
        if episode_id is None or episode_id not in self._episodes:
            return ColBenchState(episode_id=episode_id)
        ep = self._episodes[episode_id].live.episode
        return ColBenchState(episode_id=episode_id, step_count=len(ep.agent_turns), task_id=ep.task_id,
                             done=bool(ep.stop_reason), stop_reason=ep.stop_reason or None)

    def _slot(self, episode_id: str | None) -> _Slot:
        if episode_id is None:
            raise EpisodeError("no episode: call reset() first, or pass the action's episode_id", status=404)
        with self._lock:
            self._expire()
            slot = self._episodes.get(episode_id)
        if slot is None:
            raise EpisodeError(f"unknown episode id {episode_id!r} (never started, or dropped after "
                               f"{self.config.episode_timeout_s:g} s idle)", status=404)
        return slot

    def _expire(self) -> None:
        """Drop episodes idle past the timeout (called under self._lock)."""
        cutoff = time.monotonic() - self.config.episode_timeout_s
        for eid in [e for e, s in self._episodes.items() if s.seen < cutoff]:
            del self._episodes[eid]

    def _observation(self, episode_id: str, live: Any, reply: str | None) -> ColBenchObservation:
        ep, task = live.episode, live.task
        done = bool(ep.stop_reason)
        score = None
        if done and ep.score is not None:
            score = {"reward": ep.score.reward, "success": ep.score.success, "error": ep.score.error}
            score.update({k: ep.score.detail[k] for k in PUBLIC_DETAIL if k in ep.score.detail})
        # the chat for the agent's next turn; once done, the whole dialogue
        messages = self.env.agent_messages(task, ep.turns)
        return ColBenchObservation(
            episode_id=episode_id, task_id=task.task_id, env=self.env.name, messages=messages, reply=reply,
            turn=len(ep.agent_turns), max_turns=self.episode_config.max_turns,
            answer_marker=self.env.answer_marker, stop_reason=ep.stop_reason or None, score=score,
            done=done, reward=ep.score.reward if done and ep.score is not None else None)

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=self.config.step_timeout_s)
        try:
            if self.simulator is not None:
                self.simulator.close()
        finally:
            self.env.close()


def _environment_class():
    """ColBenchEnvironment, built on first use so importing this module needs no OpenEnv."""
    from openenv.core.env_server.interfaces import Environment

    class ColBenchEnvironment(Environment[ColBenchAction, ColBenchObservation, ColBenchState]):
        """OpenEnv's Environment over the shared EpisodeStore: one instance per session
        (OpenEnv creates one per WebSocket and per stateless HTTP request)."""

        SUPPORTS_CONCURRENT_SESSIONS = True  # episodes are isolated in the store, by id

        def __init__(self, store: EpisodeStore):
            super().__init__()
            self.store = store
            self.episode_id: str | None = None

        def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
                  **kwargs: Any) -> ColBenchObservation:
            if kwargs:
                raise EpisodeError(f"reset: unknown argument(s) {sorted(kwargs)}; expected task_id, seed, episode_id")
            obs = self.store.start(task_id=task_id, seed=seed, episode_id=episode_id)
            self.episode_id = obs.episode_id
            return obs

        def step(self, action: ColBenchAction, timeout_s: float | None = None, **kwargs: Any) -> ColBenchObservation:
            return self.store.step(action.episode_id or self.episode_id, action.message)

        @property
        def state(self) -> ColBenchState:
            return self.store.state(self.episode_id)

        # OpenEnv Task API (ids only: a task's content is hidden information)
        def list_splits(self) -> list[str]:
            return ["tasks"]

        def list_tasks(self, split: str) -> list[dict[str, Any]]:
            return [{"id": tid, "index": i} for i, tid in enumerate(self.store.order)]

        def num_tasks(self, split: str) -> int:
            return len(self.store.order)

        def get_task(self, split: str, index: int) -> dict[str, Any]:
            return {"id": self.store.order[index], "index": index}

        def close(self) -> None:
            pass  # episodes outlive sessions (the HTTP routes open one per request); the store owns them

    return ColBenchEnvironment


def build_app(store: EpisodeStore):
    """OpenEnv's FastAPI app over `store`, with EpisodeError as a clear HTTP error."""
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import create_app

    app = create_app(functools.partial(_environment_class(), store), ColBenchAction, ColBenchObservation,
                     env_name=f"colbench-{store.env.name}", max_concurrent_envs=store.config.max_connections)

    async def episode_error(request, exc: EpisodeError):
        return JSONResponse(status_code=exc.status, content={"detail": str(exc)})

    app.add_exception_handler(EpisodeError, episode_error)
    return app


def parse_config(argv: Sequence[str] | None = None) -> ServeConfig:
    from colbench.cli import parse_configs

    (config,) = parse_configs([ServeConfig], argv, prog=PROG, description=__doc__.split("\n\n")[0])
    return config


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(argv)
        store = EpisodeStore(config)
    except (UsageError, SpecError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        import uvicorn

        app = build_app(store)
        print(f"[colbench.serve] {config.env}: {len(store.order)} tasks from {config.tasks}, simulator "
              f"{config.simulator}, on http://{config.host}:{config.port}", file=sys.stderr, flush=True)
        uvicorn.run(app, host=config.host, port=config.port, log_level="warning")
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
