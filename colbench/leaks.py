"""The leak guard: a simulated human's reply never hands the hidden reference's code to the agent.

The paper's human describes the hidden function and never pastes it. A real model in the
human's seat does paste it, and not always inside a code fence (`simulators.llm.clean_reply`
drops fences only). The episode runner (colbench.episodes) applies this guard to every
simulator's replies, whatever it is (local model, `openai:` server, replicas, scripted):

1. a reply that reveals the reference (`leaked_lines`) is resampled up to `resamples` times
   at `temperature`, with seeds derived from the episode's seed (`resample_seed`);
2. if every resample still reveals it, the reply becomes `FIXED_REPLY`, which reveals nothing;
3. the episode records each leaking reply (`meta["leaks"]`: the human turn, the lines, the
   temperature and seeds tried, whether the fixed reply replaced it).

The rule ("reveals"), and why. Both texts are normalised: case-folded, every whitespace
character and backtick removed. So re-indented code, code joined onto one line inside prose,
`x*2` written `x * 2` and code in inline backticks all compare equal to the reference line.
A reference line of at least `MIN_LINE_CHARS` normalised characters leaks when:
- it is shorter than `WINDOW` normalised characters and the whole line occurs in the reply;
- or one of its `WINDOW`-character windows occurs in the reply, so a long line pasted in part
  (its first half, a condition, a formula) is caught too. In a line that holds code symbols
  (brackets, operators, quotes; not prose's '.', ',' and ':') only windows holding one count: a
  human who names two parameters "a and b." must not match the reference's `if a and b.get(x):`
  (seen with the scripted human on published rows 2 and 19); a line of words only
  (`return total_after_discount`) keeps all its windows.
Lines (a block's trailing ':' aside), and windows, that occur in the task description do not count: the description holds
the signature and the agent already has it. Shorter lines (`else:`, `return x`,
`return total`) say nothing a description in words would not, and matching them would flag
honest answers. So any reference line of 30 or more characters, the description's aside,
cannot pass through even in part. A quoted string from the reference (an error message)
counts as a leak when it is that long: the guard errs towards replying less.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Sequence

MIN_LINE_CHARS = 12  # normalised characters: shorter reference lines are never matched
WINDOW = 20  # normalised characters: a window of a longer line that appears is a leak
FIXED_REPLY = ("I can't show you the code. Ask me about what the function should do and I'll "
               "describe it in my own words.")
_DROP = re.compile(r"[\s`]+")
_SYMBOL = re.compile(r"[()\[\]{}=<>+\-*/%'\"]")  # code's symbols; prose's . , : do not count


def normalise(text: str) -> str:
    """Case-folded, without whitespace and backticks: what the overlap rule compares."""
    return _DROP.sub("", text).casefold()


@dataclass(frozen=True)
class LeakGuard:
    """The guard's settings (recorded on every episode it guarded)."""

    resamples: int = 3  # k: new replies asked for after a leaking one
    temperature: float = 0.7  # the simulator samples greedily; a resample needs a temperature

    def __post_init__(self) -> None:
        if self.resamples < 0:
            raise ValueError(f"LeakGuard.resamples must be >= 0, got {self.resamples}")
        if self.temperature <= 0:
            raise ValueError(f"LeakGuard.temperature must be > 0, got {self.temperature}")

    def record(self) -> dict:
        return {"resamples": self.resamples, "temperature": self.temperature,
                "min_line_chars": MIN_LINE_CHARS, "window": WINDOW}


class ReferenceLines:
    """The reference's lines as the rule matches them, for one task (built once per task)."""

    def __init__(self, hidden: str, description: str):
        desc = normalise(description)
        self.lines: list[tuple[str, list[str]]] = []  # (line as written, its keys)
        for line in hidden.splitlines():
            norm = normalise(line).rstrip(":")  # "def f(a, b):" is the description's "def f(a, b)"
            if len(norm) < MIN_LINE_CHARS or norm in desc:
                continue
            if len(norm) < WINDOW:
                keys = [norm]
            else:
                keys = [norm[i:i + WINDOW] for i in range(len(norm) - WINDOW + 1)]
                keys = [k for k in keys if k not in desc]
                if _SYMBOL.search(norm):  # words-only windows of a line with code symbols are prose's
                    keys = [k for k in keys if _SYMBOL.search(k)]
            if keys:
                self.lines.append((line.strip(), keys))

    def leaked(self, reply: str) -> list[str]:
        """The reference lines (as written) that `reply` reveals."""
        text = normalise(reply)
        return [line for line, keys in self.lines if any(k in text for k in keys)]


def leaked_lines(reply: str, hidden: str, description: str) -> list[str]:
    """The lines of the reference `hidden` that `reply` reveals (module docstring's rule)."""
    return ReferenceLines(hidden, description).leaked(reply)


def resample_seed(task_id: str, episode_seed: int, human_turn: int, attempt: int) -> int:
    """The seed of resample `attempt` (1..k) of the human's reply number `human_turn` (0-based)
    in the episode (task, seed): a pure function of those, so a rerun draws the same replies."""
    key = f"{task_id}/{episode_seed}/{human_turn}/{attempt}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


def count_leaks(meta: dict) -> tuple[int, int]:
    """(replies that leaked, of them replaced by the fixed reply) of one episode's meta."""
    leaks: Sequence[dict] = meta.get("leaks", ())
    return len(leaks), sum(1 for leak in leaks if leak.get("replaced"))
