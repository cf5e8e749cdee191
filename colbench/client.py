"""A typed OpenEnv client for a ColBench server (`python -m colbench.serve`), and the
wire types both sides share.

    from colbench.client import ColBenchClient
    with ColBenchClient("http://127.0.0.1:8000") as env:
        result = env.reset()                          # or env.reset(task_id="testbed-test-0003")
        while not result.done:
            chat = result.observation.messages        # the chat the agent sees (system, task, dialogue)
            result = env.step(my_agent(chat))         # a question, or the answer marker + the answer
        print(result.reward, result.observation.score)

`reset` and `step` return OpenEnv's `StepResult` (observation, reward, done). The
client is OpenEnv's `EnvClient` (one WebSocket session = one episode at a time on the
server; open several clients for concurrent episodes); inside a running event loop,
`await` its calls instead. `task_ids()` lists the server's tasks (ids only) through
OpenEnv's Task API.

What reaches the client is what the agent may see: the agent's chat, the simulated
human's reply, and at the end the reward, success and a few counts. The hidden
reference, the tests, their expected values and the simulator stay on the server.
"""

from __future__ import annotations

from typing import Any, Optional

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class ColBenchAction(Action):
    """The agent's message: a question for the human, or the answer marker and the answer.

    episode_id: which episode it belongs to (default: the one this session last reset).
    """

    message: str = Field(description="the agent's message for this turn")
    episode_id: Optional[str] = Field(default=None, description="episode to step (default: this session's)")


class ColBenchObservation(Observation):
    """What the agent sees after reset or a step (plus OpenEnv's done and reward).

    messages:    the chat for the agent's next turn (system, task description, dialogue
                 with agent turns as "assistant" and human turns as "user"); after the
                 last turn, the whole dialogue.
    reply:       the simulated human's reply to this step's message (None at reset and
                 on the final turn).
    score:       on the final turn: {"reward", "success", "error", "passed", "total"}
                 (counts where the env has them); None before.
    stop_reason: why the episode ended (colbench.types STOP_*), None while it runs.
    """

    episode_id: str = ""
    task_id: str = ""
    env: str = ""
    messages: list[dict[str, str]] = Field(default_factory=list)
    reply: Optional[str] = None
    turn: int = Field(default=0, description="agent turns so far")
    max_turns: int = 0
    answer_marker: str = ""
    stop_reason: Optional[str] = None
    score: Optional[dict[str, Any]] = None


class ColBenchState(State):
    """The session's current episode (OpenEnv's state: episode_id, step_count)."""

    task_id: Optional[str] = None
    done: bool = False
    stop_reason: Optional[str] = None


class ColBenchClient(EnvClient[ColBenchAction, ColBenchObservation, ColBenchState]):
    """OpenEnv client for `python -m colbench.serve` (see the module docstring)."""

    def reset(self, task_id: str | None = None, **kwargs: Any) -> Any:
        """Start an episode on `task_id` (default: the server's next task)."""
        if task_id is not None:
            kwargs["task_id"] = task_id
        return super().reset(**kwargs)

    def step(self, message: str | ColBenchAction, **kwargs: Any) -> Any:
        """Send the agent's message (a string or a ColBenchAction)."""
        action = message if isinstance(message, ColBenchAction) else ColBenchAction(message=message)
        return super().step(action, **kwargs)

    def task_ids(self, timeout_s: float = 30.0) -> list[str]:
        """The ids of the server's tasks, in its order (OpenEnv Task API, over HTTP)."""
        import httpx

        base = self.base_url.replace("ws://", "http://").replace("wss://", "https://")
        name = httpx.get(f"{base}/list_environments", timeout=timeout_s).json()[0]
        resp = httpx.post(f"{base}/{name}/tasks", json={"split": "tasks"}, timeout=timeout_s)
        resp.raise_for_status()
        return [t["id"] for t in resp.json()["tasks"]]

    def _step_payload(self, action: ColBenchAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ColBenchObservation]:
        obs = ColBenchObservation(**payload.get("observation", {}), done=payload.get("done", False),
                                  reward=payload.get("reward"))
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)),
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> ColBenchState:
        return ColBenchState(**payload)
