"""The environment-side records, one type per concept, shared by every module.

Task      what a benchmark row is: a vague description plus hidden information.
Turn      one message of a dialogue; agent turns carry what the model generated.
Score     the result of scoring one answer (the "episode result").
Episode   one trajectory: the dialogue, the final answer, its score, why it stopped.

These are wire records: plain dataclasses that round-trip through JSON (`to_json` /
`from_json`), with no behaviour. Training-side records (Candidate, Pair) live in
`sweet/core/records.py` and are built from these.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engines.base import Message

# Stop reasons recorded on every episode.
STOP_ANSWERED = "answered"  # the agent used the answer marker
STOP_TURN_LIMIT = "turn_limit"  # max agent turns reached; the last message is the answer
STOP_TOKEN_LIMIT = "token_limit"  # the agent's context reached the env's max_context_tokens, or a later
# turn's prompt no longer fits the model's context (engines.base.fit_prompt); as at the turn limit
STOP_SINGLE_TURN = "single_turn"  # single-turn mode: the first message is the answer
STOP_ENGINE_ERROR = "engine_error"  # the agent's engine failed for good
STOP_SIMULATOR_ERROR = "simulator_error"  # the simulated human failed for good
STOP_UNUSABLE = "unusable_task"  # the task's row is unusable (Task.meta["unusable"]): scored 0, never played


@dataclass(frozen=True)
class Task:
    """One benchmark task.

    task_id:     stable id (given by the data, else a hash of description + hidden).
    env:         "backend", "frontend", or a registered environment name.
    description: what the agent sees (vague on purpose).
    hidden:      training-time information the agent never sees: the reference
                 function source (backend) or the target HTML (frontend).
    tests:       backend: call expressions such as "f([1, 2], 3)"; empty elsewhere.
    meta:        anything else from the source row (split, source line, ...).
    """

    task_id: str
    env: str
    description: str
    hidden: str
    tests: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tests"] = list(self.tests)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Task":
        return cls(**{**d, "tests": tuple(d.get("tests", ()))})


@dataclass
class Turn:
    """One message of a dialogue.

    role:    "agent" or "human" (the simulated human).
    content: the message text as the other side sees it.

    Agent turns also carry what the engine produced (None for scripted agents):
    prompt:           the chat messages the agent was given for this turn.
    prompt_token_ids: [P] ids of the templated prompt, when the engine knows them.
    token_ids:        [T] generated ids; training uses these, never re-tokenised text.
    logprobs:         [T] sampler log-probs of token_ids (see engines.base).
    finish_reason:    why generation stopped (engines.base.Sample): "stop" = the model
                      emitted its end-of-turn token, "stop_string" / "length" = cut
                      (no end-of-turn token); None in files written before the field.
                      Trainers append end-of-turn exactly on "stop" (sweet/core/tokens.py).
    capped_max_new_tokens: the generation budget when the engine gave less than asked
                      because the prompt left less room in the model's context
                      (engines.base.fit_prompt); None when not capped.

    Human turns may carry:
    failed / error:   the simulator failed for good; `content` is then empty.
    render:           frontend: path to the screenshot the human looked at.
    """

    role: str
    content: str
    prompt: list[Message] | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    capped_max_new_tokens: int | None = None
    failed: bool = False
    error: str | None = None
    render: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The set fields (not None, not False), for serialisation: its lists are the turn's
        own, not copies."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None and v is not False}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Turn":
        return cls(**d)


@dataclass
class Score:
    """The result of scoring one answer.

    reward:  backend: fraction of tests passed; frontend: CLIP cosine similarity.
    success: backend: all tests pass; frontend: reward >= the env's threshold.
    detail:  per-test outcomes, errors, render paths: for reports and debugging.
    error:   why scoring failed (sandbox crash, render timeout); reward is then 0.
    """

    reward: float
    success: bool
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Score":
        return cls(**d)


@dataclass
class Episode:
    """One trajectory of an agent on a task, scored.

    episode_id:  f"{task_id}/{agent}/{seed}": the key used to resume.
    turns:       the dialogue in order, agent first.
    answer:      the final answer as given to the scorer (code or HTML).
    score:       None until scored.
    stop_reason: one of the STOP_* constants.
    """

    task_id: str
    env: str
    agent: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    answer: str = ""
    score: Score | None = None
    stop_reason: str = ""
    n_simulator_failures: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def episode_id(self) -> str:
        return f"{self.task_id}/{self.agent}/{self.seed}"

    @property
    def reward(self) -> float:
        return self.score.reward if self.score else 0.0

    @property
    def success(self) -> bool:
        return bool(self.score and self.score.success)

    @property
    def agent_turns(self) -> list[Turn]:
        return [t for t in self.turns if t.role == "agent"]

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["turns"] = [t.to_json() for t in self.turns]
        d["score"] = self.score.to_json() if self.score else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Episode":
        d = dict(d)
        d["turns"] = [Turn.from_json(t) for t in d.get("turns", [])]
        d["score"] = Score.from_json(d["score"]) if d.get("score") else None
        return cls(**d)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False)
