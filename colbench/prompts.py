"""Prompt templates: the one loader and registry of every prompt file, chosen by flags.

    from colbench.prompts import load_prompt
    tpl = load_prompt("backend_human", "my_prompt.txt")     # validated on load
    tpl.path, tpl.sha256, tpl.placeholders                  # what records and checks use
    text = tpl.fill(problem_description=..., hidden_information=..., dialogue_history=...)

Kinds (KINDS below is the one table; docs/prompts.md explains each and how ours differ
from the published evaluator's):

    kind            flag                      placeholders (default file: KINDS[kind].default_path())
    backend_agent   --agent_prompt            {max_turns} {answer_marker}, optional
    frontend_agent  --agent_prompt            {max_turns} {answer_marker}, optional
    appworld_agent  --agent_prompt            {max_turns} {answer_marker}, optional
    backend_human   --human_prompt            {problem_description} {hidden_information}; {dialogue_history} optional
    frontend_vlm    --human_prompt            {problem_description} {dialogue_history}, optional
    frontend_text   --human_prompt            {problem_description} {dialogue_history}, optional
    critic_context  --critic_context_prompt   {training_info}

Contract of a template file: UTF-8 text; a placeholder is `{name}` with `name` an
identifier; any other brace text (JSON, code) is literal. On load, a `{name}` the kind
does not know, or a required one the file lacks, is a PromptError (a UserError: one
line naming the file and the placeholder). Older names are accepted as aliases
(`{description}` = `{problem_description}`, `{hidden}` = `{hidden_information}`).
A simulated human's template with `{dialogue_history}` is sent as ONE user message with
the dialogue written out as text (the published evaluator's layout); without it, it is
the system message and the dialogue follows as chat turns (ours).

Records: `tpl.record()` = {"kind", "path", "sha256"}. Every episode carries the records of
the prompts it was built with in `meta["prompts"]` ({"agent": ..., "human": ...}, written
by the episode runner); trainers that read recorded prompts call
`check_episode_prompts` and refuse a mix. An episode without a record (older files, the
published offline trajectories) is taken to be built with our shipped default for its
role (DEFAULT_ASSUMED).

Dependencies: this module imports nothing of `simulators` or `sweet`; their default files
are located by package directory (importlib.util.find_spec, which runs no code).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from colbench.cli import UserError

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_ASSUMED = "an episode without a prompt record was built with our shipped default file for its role"


class PromptError(UserError):
    """A prompt file that cannot be used (missing, unknown or missing placeholder, wrong kind)."""


@dataclass(frozen=True)
class PromptKind:
    """One kind of template: its role in an episode, its flag, its default file and placeholders."""

    name: str
    role: str  # "agent", "human" or "critic_context": the key in episode records and configs
    flag: str
    package: str  # the default file lives in this package's directory ...
    default_file: str  # ... at this relative path
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)  # old name -> placeholder

    @property
    def placeholders(self) -> tuple[str, ...]:
        return self.required + self.optional

    def default_path(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise PromptError(f"{self.name}: package {self.package!r} not found for the default prompt file")
        return Path(list(spec.submodule_search_locations)[0]) / self.default_file


_AGENT = ("max_turns", "answer_marker")
_HUMAN_ALIASES = {"description": "problem_description", "hidden": "hidden_information"}
KINDS: dict[str, PromptKind] = {k.name: k for k in [
    PromptKind("backend_agent", "agent", "--agent_prompt", "colbench", "envs/prompts/backend_agent.txt",
               optional=_AGENT),
    PromptKind("frontend_agent", "agent", "--agent_prompt", "colbench", "envs/prompts/frontend_agent.txt",
               optional=_AGENT),
    PromptKind("appworld_agent", "agent", "--agent_prompt", "colbench", "envs/prompts/appworld_agent.txt",
               optional=_AGENT),
    PromptKind("backend_human", "human", "--human_prompt", "simulators", "prompts/backend_human.txt",
               required=("problem_description", "hidden_information"), optional=("dialogue_history",),
               aliases=_HUMAN_ALIASES),
    PromptKind("frontend_vlm", "human", "--human_prompt", "simulators", "prompts/frontend_vlm.txt",
               optional=("problem_description", "dialogue_history"), aliases=_HUMAN_ALIASES),
    PromptKind("frontend_text", "human", "--human_prompt", "simulators", "prompts/frontend_text.txt",
               optional=("problem_description", "dialogue_history"), aliases=_HUMAN_ALIASES),
    PromptKind("critic_context", "critic_context", "--critic_context_prompt", "sweet",
               "critic/prompts/critic_context.txt", required=("training_info",)),
]}


@dataclass(frozen=True)
class PromptTemplate:
    """A validated prompt file.

    kind:         a KINDS name.
    path:         the file (absolute).
    text:         its content.
    sha256:       of its bytes: what episodes, configs and leaderboards record.
    placeholders: the canonical placeholder names it uses (aliases resolved).
    """

    kind: str
    path: Path
    text: str
    sha256: str
    placeholders: frozenset[str]

    @property
    def is_default(self) -> bool:
        return self.sha256 == load_prompt(self.kind).sha256

    def has(self, name: str) -> bool:
        return name in self.placeholders

    def fill(self, **values: Any) -> str:
        """The text with each `{name}` (or its alias) replaced by `values[name]`; a placeholder
        the file uses but `values` lacks is a bug of the caller (KeyError)."""
        return fill_text(self.text, self.kind, **values)

    def record(self) -> dict[str, str]:
        """{"kind", "path", "sha256"}: what an episode, a config or a leaderboard keeps."""
        return {"kind": self.kind, "path": str(self.path), "sha256": self.sha256}


def fill_text(text: str, kind: str, **values: Any) -> str:
    """A `kind` template's text (already validated, e.g. as recorded in a critic's config)
    with each `{name}` or its alias replaced by `values[name]` (one pass: filled values are
    never read as placeholders)."""
    aliases = KINDS[kind].aliases

    def sub(m: re.Match) -> str:
        return str(values[aliases.get(m.group(1), m.group(1))])

    return PLACEHOLDER.sub(sub, text)


_CACHE: dict[tuple[str, str, float, int], PromptTemplate] = {}


def load_prompt(kind: str, path: str | Path | None = None) -> PromptTemplate:
    """The `kind` template from `path` (None or "": our shipped default), validated.
    PromptError (one line, naming the file and the placeholder) for a missing or
    unreadable file, a placeholder the kind does not know, or a required one it lacks."""
    if kind not in KINDS:
        raise PromptError(f"unknown prompt kind {kind!r}; known: {', '.join(KINDS)}")
    spec = KINDS[kind]
    file = Path(path).expanduser() if path else spec.default_path()
    try:
        stat = file.stat()
        key = (kind, str(file.resolve()), stat.st_mtime, stat.st_size)
        if key in _CACHE:
            return _CACHE[key]
        data = file.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PromptError(f"{spec.flag} {file}: cannot read the {kind} prompt file ({type(e).__name__}: "
                          f"{getattr(e, 'strerror', None) or e})") from None
    used = set()
    for m in PLACEHOLDER.finditer(text):
        name = spec.aliases.get(m.group(1), m.group(1))
        if name not in spec.placeholders:
            known = ", ".join("{" + p + "}" for p in spec.placeholders) or "none"
            raise PromptError(f"{spec.flag} {file}: unknown placeholder {{{m.group(1)}}} in a {kind} prompt "
                              f"(known: {known}; write other braces as text without an identifier inside)")
        used.add(name)
    for name in spec.required:
        if name not in used:
            raise PromptError(f"{spec.flag} {file}: the {kind} prompt lacks the required placeholder {{{name}}}")
    tpl = PromptTemplate(kind, file.resolve(), text, hashlib.sha256(data).hexdigest(), frozenset(used))
    _CACHE[key] = tpl
    return tpl


def agent_kind(env: str) -> str | None:
    """The agent template kind of a bundled environment (None: it has no prompt file)."""
    return {"backend": "backend_agent", "frontend": "frontend_agent", "appworld": "appworld_agent"}.get(env)


def human_kind(env: str, simulator: str | None) -> str | None:
    """The simulated human's template kind for a simulator spec (None: scripted or none)."""
    if not simulator or simulator.startswith("scripted:"):
        return None
    if env == "backend":
        return "backend_human"
    if env == "frontend":
        return "frontend_text" if simulator.startswith("text+") else "frontend_vlm"
    return None


def check_prompt_flags(env: str, simulator: str | None, agent_prompt: str | None, human_prompt: str | None
                       ) -> dict[str, PromptTemplate]:
    """Validate an entry point's --agent_prompt / --human_prompt for `env` and `simulator`
    before any model loads; returns the templates in use by role ("agent", "human"; a role
    without a template file is absent). A flag given where nothing would read it is an error."""
    out: dict[str, PromptTemplate] = {}
    akind = agent_kind(env)
    if akind:
        out["agent"] = load_prompt(akind, agent_prompt)
    elif agent_prompt:
        raise PromptError(f"--agent_prompt {agent_prompt}: env {env!r} builds its agent prompt without a file")
    hkind = human_kind(env, simulator)
    if hkind:
        out["human"] = load_prompt(hkind, human_prompt)
    elif human_prompt:
        raise PromptError(f"--human_prompt {human_prompt}: simulator {simulator!r} of env {env!r} reads no prompt "
                          "file (only model simulators do)")
    return out


def _show(rec: Mapping[str, Any] | None) -> str:
    if rec is None:
        return "none"
    return f"{rec.get('path')} (sha256 {str(rec.get('sha256'))[:12]})"


def episode_prompt(episode: Any, role: str, kind: str) -> dict[str, str]:
    """The record of the `role` prompt an episode was built with; no record: our default
    (DEFAULT_ASSUMED)."""
    rec = (getattr(episode, "meta", None) or {}).get("prompts", {}).get(role)
    if rec:
        return rec
    return {**load_prompt(kind).record(), "assumed": "default (episode carries no prompt record)"}


_SIMULATOR_KINDS = {"llm:": "backend_human", "vlm:": "frontend_vlm", "text-frontend:": "frontend_text"}


def _human_kind_of(episode: Any) -> str | None:
    """The template kind of the model simulator an episode ran with (its meta["simulator"]
    name), None for scripted simulators or none."""
    name = str((getattr(episode, "meta", None) or {}).get("simulator") or "")
    return next((kind for prefix, kind in _SIMULATOR_KINDS.items() if name.startswith(prefix)), None)


def check_episode_prompts(episodes: Sequence[Any], expected: Mapping[str, PromptTemplate], source: str) -> None:
    """Refuse episodes built with different prompt files, or with another prompt than the
    trainer's (`expected`: role -> the template it is configured with), in one line naming
    the files and hashes. The simulated human's prompt is checked for a mix even when not
    expected (episodes of two simulator prompts are two data sets). Episodes without a
    record count as our default (DEFAULT_ASSUMED)."""
    roles = dict(expected)
    for role in ("agent", "human"):
        seen: dict[str, tuple[dict, str]] = {}
        for ep in episodes:
            meta = getattr(ep, "meta", None) or {}
            if role == "human" and not meta.get("simulator"):
                continue  # no simulated human took part (single turn, an agent that answers at once)
            kind = _human_kind_of(ep) if role == "human" else roles[role].kind if role in roles else None
            rec = meta.get("prompts", {}).get(role)
            if rec is None and kind is None:
                continue  # no template file on that side (a scripted simulator, the test bed's agent)
            rec = rec or episode_prompt(ep, role, kind)
            seen.setdefault(rec["sha256"], (rec, ep.episode_id))
        if len(seen) > 1:
            (a, ea), (b, eb) = list(seen.values())[:2]
            raise PromptError(f"{source}: episodes built with different {role} prompts: {ea} with {_show(a)}, "
                              f"{eb} with {_show(b)}; train on episodes of one prompt file")
        if role in roles:
            tpl = roles[role]
            for sha, (rec, ep_id) in seen.items():
                if sha != tpl.sha256:
                    how = " (no record: assumed our default)" if rec.get("assumed") else ""
                    raise PromptError(f"{source}: episode {ep_id} was built with the {role} prompt {_show(rec)}{how}, "
                                      f"but this run's {KINDS[tpl.kind].flag} is {_show(tpl.record())}")


def check_recorded_prompts(episodes: Sequence[Any], env: str, agent_prompt: str | None, source: str) -> None:
    """What a trainer that reads recorded prompts (offline episodes) calls: the episodes must
    all be built with one agent prompt, the file of its `--agent_prompt` (None: ours), and
    one simulator prompt (check_episode_prompts)."""
    kind = agent_kind(env)
    if agent_prompt and kind is None:
        raise PromptError(f"--agent_prompt {agent_prompt}: env {env!r} builds its agent prompt without a file")
    check_episode_prompts(episodes, {"agent": load_prompt(kind, agent_prompt)} if kind else {}, source)


def dialogue_text(turns: Iterable[Any], agent: str = "Assistant", human: str = "You") -> str:
    """The dialogue as text for a `{dialogue_history}` placeholder: one paragraph per turn,
    `Assistant: ...` / `You: ...` (the simulated human's own replies); failed human turns
    (no text) are left out."""
    lines = []
    for t in turns:
        if t.role == "agent":
            lines.append(f"{agent}: {t.content}")
        elif t.content:
            lines.append(f"{human}: {t.content}")
    return "\n\n".join(lines)
