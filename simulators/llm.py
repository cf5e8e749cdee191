"""The LLM simulated human for backend programming (ColBench).

The simulator model plays a person who needs a function: it sees the task
description, the hidden reference code and the dialogue; answers only from the
hidden information (says it does not know otherwise), in about two sentences, and
never writes code. The instructions live in `simulators/prompts/backend_human.txt`
(placeholders `{problem_description}` and `{hidden_information}`; kind "backend_human"
of colbench.prompts, the one loader, which validates the file) so they can be read and
changed without touching code: `--human_prompt FILE` picks another file.

Conversation layout (ours, the default): the prompt is the system message; the agent's
messages are "user" turns and the simulator's own earlier replies are "assistant" turns,
so the model continues the dialogue in its own voice. A file with `{dialogue_history}`
(the published evaluator's layout) is sent instead as ONE user message, the dialogue
written into it as text (colbench.prompts.dialogue_text).

Guards on every reply (the paper relies on the prompt alone): fenced code blocks
and inline code spans are removed, whitespace is collapsed and the reply is cut to
`max_reply_chars` (paper: 400) at a word boundary. A reply that is empty after this
is a failure (failed=True), not replaced by made-up text.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from colbench.prompts import KINDS, dialogue_text, load_prompt
from colbench.types import Task, Turn
from engines.base import BatchError, Engine, EngineError, Message, SamplingParams
from simulators.base import SimReply, SimRequest, check_requests

PROMPTS_DIR = Path(__file__).parent / "prompts"
DEFAULT_PROMPT = KINDS["backend_human"].default_path()  # the registry's default (colbench.prompts)
DEFAULT_SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=200)

_FENCED = re.compile(r"```.*?(```|$)", re.DOTALL)
_INLINE = re.compile(r"`([^`\n]*)`")


def clean_reply(text: str, max_chars: int) -> str:
    """Remove code (fenced blocks dropped; inline spans keep their words), collapse
    whitespace and cut to `max_chars`, preferring the last word boundary."""
    text = _FENCED.sub(" ", text)
    text = _INLINE.sub(r"\1", text).replace("`", "")
    text = " ".join(text.split())
    if len(text) > max_chars:
        cut = text[:max_chars]
        space = cut.rfind(" ")
        text = cut[:space] if space > max_chars // 2 else cut
    return text.strip()


class LLMSimulator:
    """A simulated human backed by any `Engine` (one generate call per reply batch)."""

    def __init__(self, engine: Engine, *, prompt_file: str | Path | None = None, max_reply_chars: int = 400,
                 sampling: SamplingParams = DEFAULT_SAMPLING):
        self.engine = engine
        self.prompt = load_prompt("backend_human", prompt_file)  # PromptError: one line naming file + placeholder
        self.prompt_file = self.prompt.path
        self.template = self.prompt.text
        self.max_reply_chars = max_reply_chars
        self.sampling = replace(sampling, n=1)
        self.name = f"llm:{engine.spec}"

    def conversation(self, task: Task, turns: Sequence[Turn]) -> list[Message]:
        """The chat the simulator model sees for a reply to `turns[-1]` (module docstring:
        one user message when the template has `{dialogue_history}`, else system + chat)."""
        if self.prompt.has("dialogue_history"):
            text = self.prompt.fill(problem_description=task.description, hidden_information=task.hidden,
                                    dialogue_history=dialogue_text(turns))
            return [{"role": "user", "content": text}]
        system = self.prompt.fill(problem_description=task.description, hidden_information=task.hidden)
        messages: list[Message] = [{"role": "system", "content": system}]
        for t in turns:
            role = "user" if t.role == "agent" else "assistant"
            messages.append({"role": role, "content": t.content})
        return messages

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        if not requests:
            return []
        check_requests(requests)
        groups: dict[tuple, list[int]] = {}  # one generate call per sampling (leak-guard resamples)
        for i, r in enumerate(requests):
            groups.setdefault((r.temperature, r.seed), []).append(i)
        results: list = [None] * len(requests)
        for (temperature, seed), index in groups.items():
            sampling = self.sampling if temperature is None else replace(self.sampling, temperature=temperature, seed=seed)
            for i, out in zip(index, self._generate([self.conversation(requests[i].task, requests[i].turns)
                                                      for i in index], sampling)):
                results[i] = out
        replies = []
        for samples in results:
            if isinstance(samples, EngineError):
                replies.append(SimReply("", failed=True, error=f"{type(samples).__name__}: {samples}"))
                continue
            text = clean_reply(samples[0].text, self.max_reply_chars)
            if text:
                replies.append(SimReply(text))
            else:
                replies.append(SimReply("", failed=True, error="empty reply after removing code", resample=True))
        return replies

    def _generate(self, conversations: list[list[Message]], sampling: SamplingParams) -> list:
        """The engine's samples per conversation, or the EngineError that failed it."""
        try:
            return self.engine.generate(conversations, sampling)
        except BatchError as e:  # some replies failed on their own: only those
            return e.results
        except EngineError as e:  # the engine has already retried
            return [e] * len(conversations)

    def close(self) -> None:
        self.engine.close()
