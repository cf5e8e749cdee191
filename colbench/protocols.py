"""What the episode runner talks to: the Agent, Environment and Simulator contracts.

The runner (`colbench.episodes.run_episodes`) owns these contracts; everything that
plugs into it implements them without the runner importing the implementer:

    Agent        colbench.agents (model, reference, replay agents), your own
    Environment  colbench.envs (backend, frontend, testbed), your own via register_env
    Simulator    the `simulators` package (LLM, VLM, text, scripted humans), your own

One step of an episode: the agent gets an `AgentRequest` per waiting episode and
returns one `engines.base.Sample` each; an agent message holding the environment's
answer marker ends the dialogue; otherwise the simulator gets a `SimRequest` per
asking episode and returns one `SimReply` each; finished answers go to
`Environment.score` in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from colbench.types import Score, Task, Turn
from engines.base import Message, Sample

ANSWER_MARKER = "I WANT TO ANSWER:"
"""The paper's answer marker: an agent message holding it ends the dialogue, and
what follows it is the answer. Every environment's default; the published
trajectories use it."""


# ---- agents -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentRequest:
    """One agent turn to produce: the chat the agent sees, and the episode's seed.

    previous: the episode's last agent turn (None before the first), whose recorded ids a
    model agent continues token for token (engines.templating.continued_prompt_ids)."""

    task: Task
    messages: list[Message]
    seed: int
    previous: Turn | None = None


@runtime_checkable
class Agent(Protocol):
    """Answers a batch of turns at once (one engine call per step for model agents).

    An agent with `needs_simulator = False` answers at once and never asks a question
    (the runner then accepts no simulator)."""

    name: str  # used in episode ids and report rows; never contains "/"

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        """One sample per request, in order. May raise engines.EngineError for the whole
        batch, or engines.base.BatchError whose `results[i]` is request i's Sample or the
        EngineError that failed it (only those episodes end)."""
        ...


# ---- environments -----------------------------------------------------------------------


@runtime_checkable
class Environment(Protocol):
    """A benchmark: how to show a task to the agent, when the agent has answered, what
    the answer is, and how to score answers (in batches, in parallel, never in our
    process when the answer is untrusted code or HTML)."""

    name: str  # "backend", "frontend", ...
    answer_marker: str  # the agent ends the dialogue with this marker (default ANSWER_MARKER)
    max_turns: int  # agent turns at most (paper: 10)
    # optional: max_context_tokens (int | None): an agent turn whose prompt + generation reach it
    # ends the episode (stop "token_limit"), as the turn limit does; AppWorld: 32K (LOOP)

    def agent_messages(self, task: Task, turns: Sequence[Turn], single_turn: bool = False) -> list[Message]:
        """The chat the agent sees before its next turn: system/instructions with the
        task description, then the dialogue (agent turns as "assistant", human turns
        as "user")."""
        ...

    def is_final(self, agent_text: str) -> bool:
        """Whether this agent message ends the dialogue (it holds the answer marker)."""
        ...

    def extract_answer(self, agent_text: str) -> str:
        """The answer to score from a final agent message (code or HTML). An environment
        whose answer is the whole episode (AppWorld: every code turn) also offers
        `episode_answer(task, turns) -> str`, which the runner then uses instead."""
        ...

    def score(self, tasks: Sequence[Task], answers: Sequence[str]) -> list[Score]:
        """Score answers against their tasks' hidden information. A crash, hang or
        timeout scores 0 for that answer (recorded in Score.error), never raises.

        An environment may also offer `score_iter(tasks, answers)`, yielding
        `(index, Score)` as each answer is scored (any order); the runner then writes
        each episode as soon as it is scored, so Ctrl-C during a long batch keeps them."""
        ...

    def training_info(self, task: Task) -> str:
        """Training-time information for the SWEET critic (never shown to the policy)."""
        ...

    def close(self) -> None: ...


# ---- simulated humans -------------------------------------------------------------------


@dataclass(frozen=True)
class SimRequest:
    """One reply to produce: the task (with its hidden information) and the dialogue."""

    task: Task
    turns: Sequence[Turn]  # dialogue so far; turns[-1] is the agent's latest message
    # A resample the runner's leak guard asks for (colbench.leaks): sample at this temperature
    # with this seed instead of the simulator's own sampling. None: the simulator's own.
    # Simulators that do not sample (scripted) ignore them.
    temperature: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class SimReply:
    """A simulated human's reply. A reply that failed for good has `failed=True` and
    the error; the runner records it on the episode, never replaces it with made-up text."""

    text: str
    failed: bool = False
    error: str | None = None
    render: str | None = None  # frontend: screenshot of the agent's page that was compared
    # a failed reply that a new sample may fix (a model's reply that was all code, empty once the
    # code is removed): the runner's leak guard asks again, as for a leaking reply
    resample: bool = False


@runtime_checkable
class Simulator(Protocol):
    """A simulated human answering a batch of dialogues at once."""

    name: str

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        """One reply per request, in order. Never raises for one request's failure."""
        ...

    def close(self) -> None: ...
