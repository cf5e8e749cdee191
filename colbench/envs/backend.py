"""ColBench backend programming: the agent writes a Python function with a simulated human.

    from colbench.envs import make_env
    env = make_env("backend", workers=4)           # BackendEnv
    msgs = env.agent_messages(task, turns)         # system + description + dialogue
    env.is_final(text); code = env.extract_answer(text)
    scores = env.score(tasks, answers)             # sandboxed; reward = fraction of tests passed

Instructions for the agent live in colbench/envs/prompts/backend_agent.txt (our own
wording of the paper's protocol: ask clarifying questions, then write the answer marker
and the code; at most `max_turns` turns). Scoring runs the reference and the answer in
separate sandboxes (colbench.scoring.sandbox, colbench.scoring.backend).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, Sequence

from colbench.envs.base import TrainingDefaults, agent_chat, fill_instructions
from colbench.prompts import KINDS, load_prompt
from colbench.protocols import ANSWER_MARKER
from colbench.scoring.backend import (SCORING_VERSION, ReferenceCache, defines, extract_function_code,
                                      iter_score_backend, score_backend, target_function)
from colbench.scoring.sandbox import SandboxLimits, SandboxPool
from colbench.types import Score, Task, Turn
from engines.base import Message

# The rules backend episodes are scored under (each environment has its own version):
# 2: colbench.scoring.backend SCORING_VERSION (structural equality, the sandbox's seeding);
# 3: and answers read as real models write them (extract_function_code: the marker in any
#    case or emphasis, the fenced block that defines the asked function, code inside prose,
#    at the turn limit the latest message that defines it).
BACKEND_SCORING_VERSION = SCORING_VERSION + 1
PROMPT_PATH = KINDS["backend_agent"].default_path()  # the registry's default (colbench.prompts)
SINGLE_TURN_NOTE = (
    "\n\nThis time you get a single turn: do not ask questions. Answer now: write \"{answer_marker}\" "
    "followed by the complete function in a ```python code block."
)


def marker_pattern(marker: str) -> "re.Pattern[str]":
    """The answer marker as models write it: words in any case, separated by any spaces,
    optionally wrapped in `*`, `_`, quotes or a heading's `#`; a trailing ':' may be missing
    when a line break or a code fence follows. "I want to answer your question" is not it."""
    words = marker.strip().rstrip(":").split()
    body = r"\s+".join(re.escape(w) for w in words)
    colon = r"[*_\"']*\s*:" if marker.strip().endswith(":") else ""
    tail = rf"(?:{colon}|[*_\"']*[ \t]*(?:\n|```|$))" if colon else ""
    return re.compile(rf"{body}{tail}", re.IGNORECASE)


class BackendEnv:
    """Environment contract (colbench.protocols.Environment) for ColBench backend programming.

    answer_marker: the agent ends the dialogue with it (paper: "I WANT TO ANSWER:").
    max_turns:     agent turns at most (paper: 10).
    workers:       sandboxes run in parallel when scoring (default: CPU count).
    limits:        per-answer sandbox limits (default SandboxLimits()).
    prompt_path:   the agent's instructions, a backend_agent template file (colbench.prompts;
                   None: ours); `agent_prompt` is the loaded template episodes record.
    """

    name = "backend"
    # the paper's pairing: the best episode passes every test, rejected = strictly worse
    training_defaults = TrainingDefaults(pairing_rule="best", success_threshold=1.0, min_reward_gap=0.0,
                                         rft_top_fraction=1.0)
    # the simulated human's replies are cut at this many characters unless --max_reply_chars says
    # otherwise (published human_interaction_env.py, line 10: 400)
    max_reply_chars = 400
    scoring_version = BACKEND_SCORING_VERSION  # the rules every episode records

    def __init__(self, answer_marker: str = ANSWER_MARKER, max_turns: int = 10,
                 workers: int | None = None, limits: SandboxLimits | None = None,
                 prompt_path: str | Path | None = None):
        if not answer_marker.strip():
            raise ValueError("BackendEnv.answer_marker must be non-empty")
        if max_turns < 1:
            raise ValueError(f"BackendEnv.max_turns must be >= 1, got {max_turns}")
        self.answer_marker = answer_marker
        self._marker = marker_pattern(answer_marker)
        self.max_turns = max_turns
        self.workers = workers
        self.limits = limits or SandboxLimits()
        # the agent's instructions: a validated template file (colbench.prompts), recorded on every episode
        self.agent_prompt = load_prompt("backend_agent", prompt_path)
        self._template = self.agent_prompt.text
        self._pool: SandboxPool | None = None
        self._cache = ReferenceCache()

    def system_prompt(self, single_turn: bool = False) -> str:
        return fill_instructions(self._template, SINGLE_TURN_NOTE, max_turns=self.max_turns,
                                 answer_marker=self.answer_marker, single_turn=single_turn)

    def agent_messages(self, task: Task, turns: Sequence[Turn], single_turn: bool = False) -> list[Message]:
        """System instructions, the task description as the human's first message, then the
        dialogue (agent turns as "assistant", human turns as "user")."""
        return agent_chat(self.system_prompt(single_turn), task.description, turns)

    def is_final(self, agent_text: str) -> bool:
        """Whether the message holds the answer marker, as a real model writes it
        (`marker_pattern`: any case and spacing, bold or quoted, colon optional)."""
        return self._marker.search(agent_text) is not None

    def extract_answer(self, agent_text: str, function: str | None = None) -> str:
        """The code after the marker, else in the whole message (`extract_function_code`:
        the fenced block defining `function`, code inside prose, ...)."""
        found = self._marker.search(agent_text)
        after = agent_text[found.end():] if found else ""
        return extract_function_code(after if after.strip() else agent_text, function)

    def episode_answer(self, task: Task, turns: Sequence[Turn]) -> str:
        """The answer of an episode that ended (the runner calls this instead of
        `extract_answer`). With the marker, the code of the message that holds it. Without
        it (turn limit, a simulator failure, single-turn): the last agent message's code if
        it defines the task's function, else the code of the latest earlier agent message
        that does, else the last message's extraction. The published evaluator scores the
        last message as written (docs/reference-differences.md)."""
        agent = [t.content for t in turns if t.role == "agent"]
        if not agent:
            return ""
        name = target_function(task.description)
        last = self.extract_answer(agent[-1], name)
        if self.is_final(agent[-1]) or defines(last, name):
            return last
        for text in reversed(agent[:-1]):
            code = self.extract_answer(text, name)
            if defines(code, name):
                return code
        return last

    def score(self, tasks: Sequence[Task], answers: Sequence[str]) -> list[Score]:
        """Sandboxed scoring; a crash, hang or timeout scores 0 (Score.error), never raises."""
        return score_backend(tasks, answers, self._sandboxes(), cache=self._cache)

    def score_iter(self, tasks: Sequence[Task], answers: Sequence[str]) -> Iterator[tuple[int, Score]]:
        """`score`, yielding (index, Score) as each answer is scored (the runner saves each at once)."""
        return iter_score_backend(tasks, answers, self._sandboxes(), cache=self._cache)

    def _sandboxes(self) -> SandboxPool:
        if self._pool is None:
            self._pool = SandboxPool(workers=self.workers, limits=self.limits)
        return self._pool

    def training_info(self, task: Task) -> str:
        """The reference solution: SWEET-RL's training-time information for the critic."""
        return task.hidden

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
