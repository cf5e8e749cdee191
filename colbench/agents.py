"""Agents: what answers the tasks, one batch of turns at a time.

An agent maps a batch of `AgentRequest`s (a task, the chat the agent sees, the
episode's seed) to one `engines.base.Sample` per request. The episode runner sends
every waiting agent turn of a step in one `act` call, so a model agent makes one
`engine.generate` call per step (per seed when sampling at temperature > 0).

Agent spec strings (the `--agent` flag of `python -m colbench.evaluate`):

    tiny | hf:<path> | vllm:<path> | openai:<model>@<url>   a model (engines.load_engine)
    reference                 answers at once with the hidden reference (upper bound)
    explorer | optimal        testbed only: the scripted explorer (the warm start's teacher,
                              testbed.bed.explorer_probs) or the exact
                              solver's optimal policy (testbed.mdp), per
                              task's bed; no model (SCRIPTED_AGENTS: testbed/agents.py)
    replay:<file.jsonl>       answers at once with recorded answers, rows {"task_id", "answer"}
    <name>=<spec>             any of the above, shown under <name> in reports

`check_agent_spec` validates a spec (and a replay file, line by line) without
loading any model, so a typo fails in a second, not after a model has loaded.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from colbench.protocols import Agent, AgentRequest
from engines.base import BatchError, EngineError, Sample, SamplingParams, SpecError
from engines.templating import continued_prompt_ids, prompt_ids as templated_ids

if TYPE_CHECKING:
    from colbench.protocols import Environment
    from colbench.types import Turn
    from engines.base import Engine, EngineOptions

_NAME_RE = re.compile(r"^([A-Za-z0-9_.\-]+)=(.+)$")


def agent_name(spec: str) -> str:
    """A readable, unique name for a spec: path separators become "_" so the name can
    sit inside episode ids (f"{task_id}/{agent}/{seed}") and file names."""
    named = _NAME_RE.match(spec.strip())
    if named:
        return named.group(1)
    spec = spec.strip()
    if spec.startswith("replay:"):
        return "replay-" + Path(spec[len("replay:"):]).stem
    # only the characters a "<name>=<spec>" name may hold: names are re-parsed that way
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", spec).strip("_")


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of agent turn `turn` (0-based) of an episode seeded `seed`: `seed`
    itself for the first turn, a 31-bit hash of (seed, turn) after it. Engines seed a
    prompt's draws from the call's seed and its place in the call, not from the prompt, so
    one seed for every turn would give each turn the same uniforms."""
    if turn == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/turn/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 33


def file_slug(name: str) -> str:
    """A file-system-safe version of an agent name."""
    return re.sub(r"[^A-Za-z0-9._\-]+", "_", name).strip("_") or "agent"


def _split_name(spec: str) -> tuple[str, str]:
    spec = spec.strip()
    named = _NAME_RE.match(spec)
    return (named.group(1), named.group(2).strip()) if named else (agent_name(spec), spec)


def turn_prompt_ids(tokenizer, messages: list, previous: "Turn | None") -> list[int]:
    """The one rule for an agent turn's prompt ids, for sampled and scripted turns alike:
    `previous` (the episode's last agent turn) continued token for token when it recorded
    its ids and the template allows (`engines.templating.continued_prompt_ids`), else the
    chat templated whole (`engines.templating.prompt_ids`)."""
    if previous is not None and previous.prompt is not None and previous.prompt_token_ids is not None \
            and previous.token_ids is not None:
        ids = continued_prompt_ids(tokenizer, previous.prompt, previous.prompt_token_ids, previous.token_ids, messages)
        if ids is not None:
            return ids
    return templated_ids(tokenizer, messages)


class ModelAgent:
    """An agent backed by an inference engine.

    Seeds: at temperature 0 the whole batch goes out in one `generate` call (greedy
    decoding ignores the seed). At temperature > 0 requests are grouped by seed and
    each group is one call with `SamplingParams.seed = turn_seed(sampling.seed + seed,
    turn)` (the sampling seed offsets every episode seed, e.g. per training iteration;
    each agent turn of an episode draws other uniforms than the turn before). Seed s's
    episodes are then reproducible on the same backend and do not depend on which
    other seeds run alongside (adding seeds to a finished run keeps the old ones).

    Token in, token out (`continue_ids`, on by default): with an engine that takes prompts
    as ids (`generate_from_ids`: hf, vllm), a turn after the first is prompted with the
    previous turn's prompt ids, the ids the model generated and the template's ids for what
    followed (`turn_prompt_ids`), so an episode is one token sequence
    (`colbench.episodes.prefix_consistent`) that trainers score in one pass. Where the
    template does not allow it, with an engine that takes only text (openai), and with
    `continue_ids=False`, the chat is templated whole.
    """

    needs_simulator = True

    def __init__(self, engine: "Engine", sampling: SamplingParams, name: str | None = None,
                 continue_ids: bool = True):
        self.engine = engine
        self.sampling = replace(sampling, n=1)
        self.name = name or agent_name(engine.spec)
        self.continue_ids = continue_ids and hasattr(engine, "generate_from_ids")

    @property
    def precision(self) -> str | None:
        """The dtype the engine samples in (engines.base.resolve_dtype); None where it does
        not say (an OpenAI-compatible server)."""
        return getattr(self.engine, "precision", None)

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        if not requests:
            return []
        base = self.sampling.seed or 0
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(requests):  # greedy decoding ignores the seed: one group
            turn = sum(1 for m in r.messages if m["role"] == "assistant")
            groups.setdefault(base if self.sampling.temperature == 0 else turn_seed(base + r.seed, turn), []).append(i)
        out: list[Sample | EngineError | None] = [None] * len(requests)
        for seed, idx in groups.items():
            params = replace(self.sampling, seed=seed)
            try:
                if self.continue_ids:
                    results = self.engine.generate_from_ids([self.prompt_ids(requests[i]) for i in idx], params)
                else:
                    results = self.engine.generate([requests[i].messages for i in idx], params)
            except BatchError as e:  # some conversations failed on their own: keep the others
                results = e.results
            if len(results) != len(idx):
                raise RuntimeError(f"engine {self.engine.spec} returned {len(results)} results for {len(idx)} prompts")
            for i, samples in zip(idx, results):
                out[i] = samples if isinstance(samples, EngineError) else samples[0]
        if any(isinstance(s, EngineError) for s in out):
            raise BatchError(out)  # the runner fails only those episodes
        return out  # type: ignore[return-value]

    def prompt_ids(self, request: AgentRequest) -> list[int]:
        """The ids the engine is prompted with for `request` (`turn_prompt_ids`)."""
        return turn_prompt_ids(self.engine.tokenizer, request.messages, request.previous)

    def close(self) -> None:
        self.engine.close()


def _fenced(env: "Environment", code: str) -> str:
    """The final message for an answer: the marker, then the answer in a code fence
    (left as is when it already holds fenced blocks, which the env extracts)."""
    if "```" in code:
        return f"{env.answer_marker}\n{code}"
    lang = "html" if env.name == "frontend" else "python"
    return f"{env.answer_marker}\n```{lang}\n{code.strip()}\n```"


class ReferenceAgent:
    """Answers every task at once with its hidden reference: the score upper bound
    and a check that the environment scores the gold answer as full marks."""

    needs_simulator = False

    def __init__(self, env: "Environment", name: str = "reference"):
        self.env = env
        self.name = name

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        return [Sample(text=_fenced(self.env, r.task.hidden)) for r in requests]


# Scripted agents, no model: "module:Class" loaded on use (colbench.registry), called as
# Class(kind, env=env, name=name). explorer and optimal are the test bed's (testbed/agents.py).
SCRIPTED_AGENTS: dict[str, str] = {
    "explorer": "testbed.agents:ScriptedTestbedAgent",
    "optimal": "testbed.agents:ScriptedTestbedAgent",
}


def read_replay(path: str | Path, task_ids: set[str] | None = None) -> dict[str, str]:
    """Read a replay file: JSONL rows {"task_id": str, "answer": str}.

    Raises ValueError naming file:line for a missing file, bad JSON, a missing or
    non-string field, a duplicate task id, or (when `task_ids` is given) an unknown one.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"replay file {path} does not exist")
    answers: dict[str, str] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected an object {{\"task_id\", \"answer\"}}, got {type(row).__name__}")
            for key in ("task_id", "answer"):
                if not isinstance(row.get(key), str):
                    raise ValueError(f"{where}: field {key!r} missing or not a string")
            tid = row["task_id"]
            if tid in answers:
                raise ValueError(f"{where}: duplicate task_id {tid!r}")
            if task_ids is not None and tid not in task_ids:
                raise ValueError(f"{where}: unknown task_id {tid!r} (not in the task set)")
            answers[tid] = row["answer"]
    return answers


class ReplayAgent:
    """Answers at once with recorded answers (e.g. another framework's outputs), so
    they are scored by exactly the same environment as live agents."""

    needs_simulator = False

    def __init__(self, env: "Environment", path: str | Path, name: str | None = None,
                 task_ids: set[str] | None = None):
        self.env = env
        self.path = Path(path)
        self.answers = read_replay(self.path, task_ids)
        self.name = name or "replay-" + self.path.stem

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        out = []
        for r in requests:
            if r.task.task_id not in self.answers:
                raise ValueError(f"replay file {self.path} has no answer for task {r.task.task_id!r}")
            out.append(Sample(text=_fenced(self.env, self.answers[r.task.task_id])))
        return out


def check_agent_spec(spec: str, task_ids: set[str] | None = None) -> None:
    """Validate an agent spec without loading a model; raise SpecError (one line)."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty agent spec: expected a model spec, 'reference', 'explorer', 'optimal' or "
                        "'replay:<file.jsonl>'")
    _, body = _split_name(spec)
    if body == "reference" or body in SCRIPTED_AGENTS:
        return
    if body.startswith("replay:"):
        file = body[len("replay:"):]
        if not file:
            raise SpecError(f"agent spec {spec!r}: expected 'replay:<file.jsonl>'")
        try:
            read_replay(file, task_ids)
        except ValueError as e:
            raise SpecError(str(e)) from None
        return
    check_model_spec(body)


def check_model_spec(spec: str) -> None:
    """Validate a model spec string without building or loading the model (engines.check_spec)."""
    from engines import check_spec

    check_spec(spec)


def load_agent(spec: str, env: "Environment", *, sampling: SamplingParams,
               engine_options: "EngineOptions | None" = None, task_ids: set[str] | None = None,
               name: str | None = None) -> Agent:
    """Build the agent a spec names (loads the model for engine specs). `name`
    overrides the name derived from the spec."""
    check_agent_spec(spec, task_ids)
    derived, body = _split_name(spec)
    name = name or derived
    if body == "reference":
        return ReferenceAgent(env, name=name)
    if body in SCRIPTED_AGENTS:
        from colbench.registry import load_target

        return load_target(SCRIPTED_AGENTS[body])(body, env=env, name=name)
    if body.startswith("replay:"):
        return ReplayAgent(env, body[len("replay:"):], name=name, task_ids=task_ids)
    from engines import load_engine

    return ModelAgent(load_engine(body, engine_options), sampling, name=name)


def needs_simulator(spec: str) -> bool:
    """Whether an agent spec can ask questions (model agents) or answers at once."""
    _, body = _split_name(spec)
    return not (body == "reference" or body.startswith("replay:"))
