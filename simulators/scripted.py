"""Deterministic, rule-based simulated humans: real components for tests and demos.

They need no model and always give the same reply to the same dialogue, so episode
runner, report and training tests are exact. Register more with
`simulators.register_simulator("mine", "mypkg.sims:MySim")`; the bundled ones:

    scripted:backend    describes the hidden function's name, parameters and constants
                        in plain words (never code); says it does not know when the
                        hidden code cannot be parsed
    scripted:idk        always answers "I don't know."
    scripted:flaky      fails every `fail_every`-th reply (default 2) with failed=True:
                        exercises failure handling end to end
"""

from __future__ import annotations

import ast
from typing import Any, Sequence

from simulators.base import SimReply, SimRequest


def describe_function(source: str) -> str:
    """A plain-words summary of the first function in `source`: name, parameters, and
    up to five literal constants. Never contains code fences."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return "I don't know the details, sorry."
    fn = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if fn is None:
        return "I don't know the details, sorry."
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    consts: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Constant) and not isinstance(node.value, (bool, type(None))) \
                and not (isinstance(node.value, str) and node is _docstring(fn)):
            text = repr(node.value)
            if text not in consts and len(text) <= 30:
                consts.append(text)
    sentence = f"It should be called {fn.name} and take {_words(params) or 'no inputs'}."
    if consts:
        sentence += f" The values that matter are {_words(consts[:5])}."
    else:
        sentence += " There are no special values I know of."
    return sentence


def _docstring(fn: ast.AST) -> Any:
    body = getattr(fn, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[0].value
    return None


def _words(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


class ScriptedBackendSimulator:
    """Replies with a fixed sentence built from the hidden function (see module doc)."""

    name = "scripted:backend"

    def __init__(self, env: Any = None, max_reply_chars: int = 400):
        self.max_reply_chars = max_reply_chars

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        return [SimReply(describe_function(r.task.hidden)[: self.max_reply_chars]) for r in requests]

    def close(self) -> None:
        pass


class DontKnowSimulator:
    """Always says it does not know: the floor for how much dialogue can help."""

    name = "scripted:idk"

    def __init__(self, env: Any = None, max_reply_chars: int = 400):
        self.max_reply_chars = max_reply_chars

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        return [SimReply("I don't know."[: self.max_reply_chars]) for _ in requests]

    def close(self) -> None:
        pass


class FlakySimulator(ScriptedBackendSimulator):
    """Like scripted:backend, but the n-th reply it gives fails when n % fail_every == 0
    (counted over its lifetime, in request order): deterministic failure injection."""

    name = "scripted:flaky"

    def __init__(self, env: Any = None, max_reply_chars: int = 400, fail_every: int = 2):
        super().__init__(env, max_reply_chars)
        self.fail_every = fail_every
        self.count = 0

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        out = []
        for reply in super().reply(requests):
            self.count += 1
            if self.count % self.fail_every == 0:
                out.append(SimReply("", failed=True, error=f"scripted failure (reply #{self.count})"))
            else:
                out.append(reply)
        return out
