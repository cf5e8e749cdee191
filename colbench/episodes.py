"""The multi-turn episode runner: many ColBench dialogues at once, in lock-step.

Each step, every episode waiting for its agent goes to `agent.act` in ONE batch, then
every episode waiting for the simulated human goes to `simulator.reply` in ONE batch;
finished episodes of the step are scored in one batch and each is appended to the
output JSONL (flushed; fsynced once per step) as soon as it is scored (with
`env.score_iter` when the environment has it, else after `env.score`), so a crash or
Ctrl-C loses nothing scored and a rerun with the same `out_path` skips the episode ids
already there.
`load_episodes` is the one reader of episode files (ours and the published offline
trajectories); an episode id found twice (two runs wrote into one file) is read once,
the first record kept, with a warning.

Each episode records the prompt files it was built with, path and sha256, in
`meta["prompts"]` (episode_prompt_records; colbench.prompts).

Episode rules (ColBench): the agent sees `env.agent_messages(task, turns)`; a turn
holding the env's answer marker ends the dialogue (stop "answered"); otherwise the
simulated human replies. After `max_turns` agent turns, the last agent message is
the answer (stop "turn_limit"); so it is when an environment with `max_context_tokens` sees
an agent turn's prompt and generation reach it (stop "token_limit"; engines that report
token ids only), and when a later agent turn's prompt no longer fits the model's context
(the engine's `ContextOverflow`; the reason in `meta["token_limit"]`). In single-turn mode
the first message is the answer.

Unusable tasks (`Task.meta["unusable"]`, see colbench.tasks): the agent and the simulator
never see them; each gets an episode scored 0 with stop reason "unusable_task", the reason
and the row's file:line in `meta` and `Score.error`, written like any other, so the task
stays in the denominator. A stored episode that no longer matches its task (a placeholder
for a task that is usable now, a played episode of a task now unusable, another reason)
is dropped from the file and redone.

Every scored episode records `meta["scoring_version"]` (its environment's `scoring_version`,
`current_scoring_version`: backend colbench.scoring.backend SCORING_VERSION, frontend its
own): the rules it was scored under, and `meta["answer_turn"]`: which agent turn's answer
was scored (`final_answer`; frontend: the last turn holding a draft, None: none). An
episode sampled by a local engine records `meta["precision"]`, the dtype it sampled in
(`engines.base.resolve_dtype`: the trainers' rule).
`rescore_file` re-extracts the answers from the stored turns and rescores them under the
current rules.

Failures end only their own episode, recorded on it, never replaced silently:
- simulator failure: the human turn is recorded with failed=True and its error,
  `n_simulator_failures` counts it, and the episode stops ("simulator_error"). Its
  answer is the last agent message, as at the turn limit, so the score reflects the
  agent's work so far; reports count these episodes separately.
- engine failure for an agent batch: the episodes of that batch stop
  ("engine_error") with score 0 and the error in `Score.error` and `meta["error"]`;
  when the agent raises `BatchError` (one unusable reply), only the episodes whose
  request failed stop so, the others go on. A first agent prompt longer than the model's
  context is such a failure (engines.base.fit_prompt says why it is not an unusable task).
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from colbench.io import atomic_write
from colbench.jsonl import Appender, read_rows
from colbench.leaks import FIXED_REPLY, LeakGuard, ReferenceLines, resample_seed
from colbench.protocols import Agent, AgentRequest, Environment, SimReply, SimRequest, Simulator
from colbench.types import (
    STOP_ANSWERED,
    STOP_ENGINE_ERROR,
    STOP_SIMULATOR_ERROR,
    STOP_SINGLE_TURN,
    STOP_TOKEN_LIMIT,
    STOP_TURN_LIMIT,
    STOP_UNUSABLE,
    Episode,
    Score,
    Task,
    Turn,
)
from engines.base import BatchError, ContextOverflow, EngineError, Sample

UNUSABLE = "unusable"  # Task.meta / Episode.meta key (colbench.tasks.UNUSABLE)
SCORING_VERSION_KEY = "scoring_version"
ANSWER_TURN_KEY = "answer_turn"
# the version every environment recorded before each had its own: an environment class
# without a `scoring_version` attribute still scores under it
SHARED_SCORING_VERSION = 2


def current_scoring_version(env: "str | Environment") -> int:
    """The version of the scoring rules this code scores `env`'s episodes under (an
    environment or its registered name): its class's `scoring_version` (backend:
    colbench.scoring.backend SCORING_VERSION; frontend: its own), else SHARED_SCORING_VERSION.
    Each environment has its own, so a change of one's rules leaves the others' folders valid."""
    if isinstance(env, str):
        from colbench.envs import env_class, env_names

        env = env_class(env) if env in env_names() else None
    return int(getattr(env, "scoring_version", SHARED_SCORING_VERSION))


def episode_scoring_version(ep: Episode) -> int:
    """The rules an episode was scored under; 1 for episodes written before the field existed."""
    return int(ep.meta.get(SCORING_VERSION_KEY, 1))


def final_answer(env: Environment, task: Task, turns: Sequence[Turn]) -> tuple[str, int | None]:
    """(answer, agent turn index) of a played dialogue: `env.episode_answer(task, turns)` when
    the environment defines it (an answer built from the whole episode: frontend's last draft
    of any turn, AppWorld's code turns) with `env.answer_turn(task, turns)` when it has one
    (else None), otherwise `env.extract_answer` of the last agent message and that turn. The
    one rule of what is scored, for the runner and `rescore_file`."""
    agent = [t for t in turns if t.role == "agent"]
    whole = getattr(env, "episode_answer", None)
    if whole is not None:
        which = getattr(env, "answer_turn", None)
        return whole(task, turns), which(task, turns) if which is not None else None
    return (env.extract_answer(agent[-1].content), len(agent) - 1) if agent else ("", None)


def unusable_episode(task: Task, agent: str, seed: int) -> Episode:
    """The episode of an unusable task: reward 0, the reason and file:line recorded, nothing played."""
    reason, where = task.meta[UNUSABLE], str(task.meta.get("where", ""))
    return Episode(task_id=task.task_id, env=task.env, agent=agent, seed=seed, stop_reason=STOP_UNUSABLE,
                   score=Score(0.0, False, detail={UNUSABLE: reason, "where": where},
                               error=f"unusable task ({where}): {reason}"),
                   meta={UNUSABLE: reason, "where": where, SCORING_VERSION_KEY: current_scoring_version(task.env)})


def matches_task(ep: Episode, task: Task) -> bool:
    """Whether a stored episode still stands for `task` as loaded now (a placeholder exactly
    when the task is unusable, for the same reason)."""
    reason = task.meta.get(UNUSABLE)
    if ep.stop_reason == STOP_UNUSABLE:
        return bool(reason) and ep.meta.get(UNUSABLE) == reason
    return not reason and ep.score is not None


def write_episodes(path: Path, episodes: Sequence[Episode]) -> None:
    """Replace an episodes file atomically (a reader sees the old file or the new one)."""
    atomic_write(path, "".join(ep.dumps() + "\n" for ep in episodes))


def rescore_file(env: Environment, path: Path, tasks: Sequence[Task]) -> int:
    """Rescore, under the current rules, the episodes in `path` scored under other rules:
    each answer is extracted again from the stored turns (`final_answer`: a rule of what is
    scored may have changed too), then scored. Episodes of tasks not in `tasks`, or unusable
    now, are dropped: a rerun redoes them. Rewrites the file atomically; returns how many
    were rescored."""
    version = current_scoring_version(env)
    by_id = {t.task_id: t for t in tasks}
    kept, todo = [], []
    for ep in read_episodes(path, repair=True):
        if episode_scoring_version(ep) == version:
            kept.append(ep)
        elif ep.stop_reason != STOP_UNUSABLE and ep.task_id in by_id and not by_id[ep.task_id].meta.get(UNUSABLE):
            todo.append(ep)
    played = [ep for ep in todo if ep.stop_reason != STOP_ENGINE_ERROR]
    for ep in played:
        ep.answer, ep.meta[ANSWER_TURN_KEY] = final_answer(env, by_id[ep.task_id], ep.turns)
    if played:
        scores = env.score([by_id[ep.task_id] for ep in played], [ep.answer for ep in played])
        for ep, sc in zip(played, scores):
            ep.score = sc
    for ep in todo:
        ep.meta[SCORING_VERSION_KEY] = version
    write_episodes(path, kept + todo)
    return len(todo)


@dataclass
class EpisodeConfig:
    """How episodes run."""

    max_turns: int = field(default=10, metadata={"help": "agent turns at most (paper: 10)"})
    single_turn: bool = field(default=False, metadata={"help": "the first agent message is the answer"})
    max_concurrent: int | None = field(
        default=None, metadata={"help": "episodes in flight at once (None: all); bounds memory on huge runs"})
    # colbench.leaks: None guards backend episodes with LeakGuard(); False: off; a LeakGuard: on
    leak_guard: LeakGuard | bool | None = None

    def guard(self, env: Environment) -> LeakGuard | None:
        """The leak guard these episodes run under (None: unguarded)."""
        if self.leak_guard is None:
            return LeakGuard() if env.name == "backend" else None
        if self.leak_guard is True:
            return LeakGuard()
        return self.leak_guard or None

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"EpisodeConfig.max_turns must be >= 1, got {self.max_turns}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"EpisodeConfig.max_concurrent must be >= 1 or None, got {self.max_concurrent}")


def read_episodes(path: Path, *, repair: bool = False) -> list[Episode]:
    """Read an episodes JSONL file (colbench.jsonl: a truncated last line from a crash
    mid-write is skipped with a warning, and cut from the file when `repair`; a bad line
    elsewhere raises ValueError naming file:line). A duplicated episode id (two runs that
    wrote one file) keeps its first record, with one warning."""
    rows = read_rows(path, Episode.from_json, what="valid episode record", repair=repair, numbered=True)
    episodes: list[Episode] = []
    seen: dict[str, int] = {}  # episode id -> line of its first record
    duplicates: list[tuple[str, int]] = []
    for lineno, episode in rows:
        if episode.episode_id in seen:
            duplicates.append((episode.episode_id, lineno))
        else:
            seen[episode.episode_id] = lineno
            episodes.append(episode)
    if duplicates:
        eid, lineno = duplicates[0]
        warnings.warn(f"{path}: {len(duplicates)} duplicated episode ids (first {eid!r} at line {lineno}, "
                      f"also at line {seen[eid]}); keeping the first record of each (did two runs write here?)",
                      stacklevel=2)
    return episodes


def load_episodes(source: str | Path, env: str = "backend", *, limit: int | None = None,
                  on_error: str = "skip", usable_only: bool = False) -> list[Episode]:
    """The one episode loader: our runner's JSONL (Episode records), or the published
    offline trajectories (rows with `task`, `dialogue_history`, `answer`, `reward`; a
    file or `hf:<dataset id>`, read by `colbench.tasks.load_trajectories`), told apart
    by the first row. `limit` keeps the first episodes. A bad line of our own files
    raises ValueError naming file:line (a truncated last line is skipped with a warning).

    Published rows are read and their tasks validated as evaluation reads tasks
    (`load_trajectories`): with on_error "skip" (default) bad rows and trajectories of
    unusable tasks are dropped with one warning line naming how many and the list's
    file; "raise" stops naming each. usable_only (what trainers want): also drop our
    runner's episodes of unusable tasks (stop reason "unusable_task", scored 0 without
    being played), with one warning line."""
    from colbench.tasks import load_trajectories

    if str(source).startswith("hf:"):
        return load_trajectories(str(source), env=env, limit=limit, on_error=on_error)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"episode file not found: {path}")
    with path.open("rb") as f:
        first = next((line for line in f if line.strip()), None)
    if first is None:
        raise ValueError(f"{path}: no episodes (empty file)")
    try:
        published = "dialogue_history" in json.loads(first)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
        published = False  # read_episodes names the bad line
    if published:
        return load_trajectories(str(path), env=env, limit=limit, on_error=on_error)
    episodes = read_episodes(path)
    episodes = episodes[:limit] if limit is not None else episodes
    if usable_only:
        placeholders = [ep for ep in episodes if ep.stop_reason == STOP_UNUSABLE]
        if placeholders:
            if on_error == "raise":
                raise ValueError(f"{path}: {len(placeholders)} episodes of unusable tasks (first {placeholders[0].task_id!r}, "
                                 f"{placeholders[0].meta.get('where', '')}: {placeholders[0].meta.get(UNUSABLE, '')})")
            warnings.warn(f"{path}: skipping {len(placeholders)} of {len(episodes)} episodes of unusable tasks "
                          f"(scored 0, never played; their rows and reasons are in each episode's meta, first "
                          f"{placeholders[0].meta.get('where', '')}: {placeholders[0].meta.get(UNUSABLE, '')})",
                          stacklevel=2)
            episodes = [ep for ep in episodes if ep.stop_reason != STOP_UNUSABLE]
    return episodes


@dataclass(eq=False)
class _Live:
    """An episode in flight."""

    task: Task
    episode: Episode


class _Writer:
    """Appends finished episodes to a JSONL file (colbench.jsonl.Appender): each write is
    flushed to the OS (a killed process loses nothing written), `sync` (once per step)
    also fsyncs it to disk."""

    def __init__(self, path: Path | None):
        self.out = Appender(path, fsync=False) if path is not None else None

    def write(self, episodes: Sequence[Episode]) -> None:
        if self.out is not None and episodes:
            self.out.write(ep.dumps() for ep in episodes)

    def sync(self) -> None:
        if self.out is not None:
            self.out.sync()

    def close(self) -> None:
        if self.out is not None:
            self.out.close()


def run_episodes(
    env: Environment,
    tasks: Sequence[Task],
    agent: Agent,
    simulator: Simulator | None,
    *,
    seeds: Sequence[int] = (0,),
    config: EpisodeConfig | None = None,
    out_path: Path | None = None,
    progress: bool = True,
) -> list[Episode]:
    """Run (and score) one episode per task × seed; return them in task-then-seed order.

    Episodes already in `out_path` (same episode id) are loaded, not rerun.
    `simulator` may be None only for agents that answer at once
    (`agent.needs_simulator` False) or in single-turn mode.
    """
    config = config or EpisodeConfig()
    _check_inputs(env, tasks, agent, simulator, seeds, config)
    out_path = Path(out_path) if out_path is not None else None
    done = {ep.episode_id: ep for ep in read_episodes(out_path, repair=True)} if out_path else {}
    order = [(t, s) for t in tasks for s in seeds]
    stale = {f"{t.task_id}/{agent.name}/{s}" for t, s in order
             if f"{t.task_id}/{agent.name}/{s}" in done and not matches_task(done[f"{t.task_id}/{agent.name}/{s}"], t)}
    if stale:  # the task changed status since (now usable, or unusable): redo its episodes
        write_episodes(out_path, [ep for eid, ep in done.items() if eid not in stale])
        for eid in stale:
            del done[eid]
    placeholders = [unusable_episode(t, agent.name, s) for t, s in order
                    if t.meta.get(UNUSABLE) and f"{t.task_id}/{agent.name}/{s}" not in done]
    todo = [_new(env, t, agent, s, simulator) for t, s in order
            if f"{t.task_id}/{agent.name}/{s}" not in done and not t.meta.get(UNUSABLE)]
    bar = _progress_bar(len(order), len(order) - len(todo) - len(placeholders), agent.name, progress)
    writer = _Writer(out_path)

    def save(scored: Sequence[_Live]) -> None:  # each episode as soon as it is scored
        writer.write([lv.episode for lv in scored])
        for lv in scored:
            done[lv.episode.episode_id] = lv.episode
        if bar is not None:
            bar.update(len(scored))

    try:
        if placeholders:
            writer.write(placeholders)
            for ep in placeholders:
                done[ep.episode_id] = ep
            if bar is not None:
                bar.update(len(placeholders))
        limit = config.max_concurrent or len(todo) or 1
        active: list[_Live] = []
        while todo or active:
            active, todo = active + todo[: limit - len(active)], todo[limit - len(active):]
            finished = advance(env, agent, simulator, active, config, save)
            writer.sync()
            active = [lv for lv in active if lv not in finished]
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    return [done[f"{t.task_id}/{agent.name}/{s}"] for t, s in order]


def start_episode(env: Environment, task: Task, agent: Agent, seed: int, simulator: Simulator | None) -> _Live:
    """A new episode in flight, to drive one step at a time with `advance` (colbench.serve)."""
    return _new(env, task, agent, seed, simulator)


def advance(env: Environment, agent: Agent, simulator: Simulator | None, active: list[_Live],
            config: EpisodeConfig, save=None) -> list[_Live]:
    """One step of episodes in flight: one agent batch, one simulator batch, then the
    episodes that ended are scored (`save` gets each as soon as it is scored). Returns
    those. `run_episodes` is a loop of it; colbench.serve drives episodes with it directly."""
    finished = _step(env, agent, simulator, active, config)
    _score(env, finished, save or (lambda scored: None))
    return finished


def _check_inputs(env, tasks, agent, simulator, seeds, config) -> None:
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"duplicate task id {dup!r} in the task list")
    wrong = [t.task_id for t in tasks if t.env != env.name]
    if wrong:
        raise ValueError(f"task {wrong[0]!r} is for env {tasks[ids.index(wrong[0])].env!r}, not {env.name!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"duplicate seeds in {list(seeds)}")
    if "/" in agent.name:
        raise ValueError(f"agent name {agent.name!r} must not contain '/' (it is part of episode ids)")
    if simulator is None and not config.single_turn and getattr(agent, "needs_simulator", True):
        raise ValueError(f"agent {agent.name!r} may ask questions: give a simulator or use single-turn mode")


def _new(env: Environment, task: Task, agent: Agent, seed: int, simulator: Simulator | None) -> _Live:
    meta = {"simulator": simulator.name} if simulator is not None else {}
    if getattr(agent, "precision", None) is not None:  # the dtype that sampled the episode
        meta["precision"] = agent.precision
    prompts = episode_prompt_records(env, simulator)
    if prompts:
        meta["prompts"] = prompts
    return _Live(task, Episode(task_id=task.task_id, env=env.name, agent=agent.name, seed=seed, meta=meta))


def episode_prompt_records(env: Environment, simulator: Simulator | None) -> dict:
    """What an episode records of the prompt files it is built with (colbench.prompts):
    {"agent": the env's `agent_prompt` record, "human": the simulator's `prompt` record},
    each only when that side has a template file. Trainers check them (check_episode_prompts)."""
    out = {}
    for role, owner in (("agent", env), ("human", simulator)):
        template = getattr(owner, "agent_prompt" if role == "agent" else "prompt", None) if owner is not None else None
        if template is not None and hasattr(template, "record"):
            out[role] = template.record()
    return out


def _step(env: Environment, agent: Agent, simulator: Simulator | None, active: list[_Live],
          config: EpisodeConfig) -> list[_Live]:
    """One agent batch, then one simulator batch. Returns the episodes that ended."""
    requests = [AgentRequest(lv.task, env.agent_messages(lv.task, lv.episode.turns, config.single_turn),
                             lv.episode.seed, next(reversed(lv.episode.agent_turns), None)) for lv in active]
    try:
        samples = agent.act(requests)
    except BatchError as e:  # some requests failed on their own: only their episodes end
        samples = e.results
    except EngineError as e:
        for lv in active:
            _engine_failed(lv, e)
        return list(active)
    if len(samples) != len(requests):
        raise RuntimeError(f"agent {agent.name} returned {len(samples)} samples for {len(requests)} requests")
    finished: list[_Live] = []
    asking: list[_Live] = []
    for lv, req, s in zip(active, requests, samples):
        if isinstance(s, ContextOverflow) and lv.episode.agent_turns:
            # a later turn that no longer fits the model: the dialogue so far stands, as at the
            # token limit (a first turn that does not fit is an engine error: engines.base.fit_prompt)
            lv.episode.meta["token_limit"] = f"{type(s).__name__}: {s}"
            _end(lv, STOP_TOKEN_LIMIT, env)
            finished.append(lv)
            continue
        if isinstance(s, EngineError):
            _engine_failed(lv, s)
            finished.append(lv)
            continue
        lv.episode.turns.append(agent_turn(req, s))
        n_agent = len(lv.episode.agent_turns)
        if config.single_turn:
            _end(lv, STOP_SINGLE_TURN, env)
        elif env.is_final(s.text):
            _end(lv, STOP_ANSWERED, env)
        elif n_agent >= config.max_turns:
            _end(lv, STOP_TURN_LIMIT, env)
        elif _context_full(env, lv.episode.turns[-1]):
            _end(lv, STOP_TOKEN_LIMIT, env)
        else:
            asking.append(lv)
            continue
        finished.append(lv)
    if asking:
        finished += _human_turns(env, simulator, asking, config.guard(env))
    return finished


def agent_turn(request: AgentRequest, s: Sample) -> Turn:
    """The episode's record of the agent's answer `s` to `request` (the next request's
    `previous`)."""
    from_engine = bool(s.token_ids) or s.logprobs is not None or s.prompt_token_ids is not None
    return Turn(
        role="agent", content=s.text, prompt=request.messages,
        prompt_token_ids=list(s.prompt_token_ids) if s.prompt_token_ids is not None else None,
        token_ids=list(s.token_ids) if from_engine else None,  # [] = the engine generated nothing
        logprobs=list(s.logprobs) if s.logprobs is not None else None,
        finish_reason=s.finish_reason if from_engine else None,  # trainers append eos only on "stop"
        capped_max_new_tokens=s.capped_max_new_tokens,
    )


def _ask(simulator: Simulator, requests: list[SimRequest]) -> list[SimReply]:
    """`simulator.reply`, whose failures (even a raise, against its contract) fail their episodes, not the run."""
    try:
        replies = simulator.reply(requests)
        if len(replies) != len(requests):
            raise RuntimeError(f"simulator {simulator.name} returned {len(replies)} replies for {len(requests)}")
    except Exception as e:
        replies = [SimReply("", failed=True, error=f"{type(e).__name__}: {e}")] * len(requests)
    return list(replies)


def guard_replies(simulator: Simulator, asking: Sequence[_Live], replies: list[SimReply],
                  guard: LeakGuard) -> list[SimReply]:
    """The leak guard (colbench.leaks): each reply that reveals its task's reference is asked
    again up to `guard.resamples` times (sampled, seeds from the episode's), then replaced by
    `FIXED_REPLY`; every leaking reply is recorded in its episode's `meta["leaks"]`. A failed reply
    marked `resample` (a model's reply that was all code) is asked again the same way; if every
    sample fails too the failure stands (`meta["resampled_empty"]` records the tries)."""
    lines = {id(lv): ReferenceLines(lv.task.hidden, lv.task.description) for lv in asking}
    leaking = [i for i, r in enumerate(replies) if not r.failed and lines[id(asking[i])].leaked(r.text)]
    records = {i: {"turn": len(asking[i].episode.turns), "lines": len(lines[id(asking[i])].leaked(replies[i].text)),
                   "temperature": guard.temperature, "seeds": [], "replaced": False} for i in leaking}
    empty = [i for i, r in enumerate(replies) if r.failed and r.resample]  # all code: asked again, not a leak
    tried = {i: {"turn": len(asking[i].episode.turns), "temperature": guard.temperature, "seeds": []} for i in empty}
    leaking = sorted(leaking + empty)
    for attempt in range(1, guard.resamples + 1):
        if not leaking:
            break
        requests = []
        for i in leaking:
            ep = asking[i].episode
            seed = resample_seed(ep.task_id, ep.seed, sum(1 for t in ep.turns if t.role == "human"), attempt)
            (records.get(i) or tried[i])["seeds"].append(seed)
            requests.append(SimRequest(asking[i].task, list(ep.turns), temperature=guard.temperature, seed=seed))
        again = _ask(simulator, requests)
        still = []
        for i, r in zip(leaking, again):
            if r.failed or lines[id(asking[i])].leaked(r.text):
                still.append(i)
            else:
                replies[i] = r
        leaking = still
    for i in leaking:
        if i in records:  # still leaking: the fixed reply; still all code: the failure stands
            replies[i] = SimReply(FIXED_REPLY)
            records[i]["replaced"] = True
    for i, record in records.items():
        asking[i].episode.meta.setdefault("leaks", []).append(record)
    for i, record in tried.items():
        record["fixed"] = i not in leaking
        asking[i].episode.meta.setdefault("resampled_empty", []).append(record)
    return replies


def _human_turns(env: Environment, simulator: Simulator | None, asking: list[_Live],
                 guard: LeakGuard | None = None) -> list[_Live]:
    """The simulator's batch of replies, through the leak guard when one is given; returns
    the episodes ended by a failure."""
    if simulator is None:
        raise RuntimeError("an agent asked a question but no simulator was given")
    replies = _ask(simulator, [SimRequest(lv.task, list(lv.episode.turns)) for lv in asking])
    if guard is not None:
        for lv in asking:
            lv.episode.meta["leak_guard"] = guard.record()
        replies = guard_replies(simulator, asking, replies, guard)
    ended = []
    for lv, r in zip(asking, replies):
        lv.episode.turns.append(Turn(role="human", content="" if r.failed else r.text,
                                     failed=r.failed, error=r.error, render=r.render))
        if r.failed:
            lv.episode.n_simulator_failures += 1
            # The question is the last agent message: score it as at the turn limit.
            _end(lv, STOP_SIMULATOR_ERROR, env)
            ended.append(lv)
    return ended


def _engine_failed(lv: _Live, error: EngineError) -> None:
    """The agent's engine failed for good on this episode: it ends, scored 0, with the reason."""
    _end(lv, STOP_ENGINE_ERROR)
    lv.episode.meta["error"] = f"{type(error).__name__}: {error}"
    lv.episode.score = Score(0.0, False, error=lv.episode.meta["error"])


def prefix_boundaries(episode: Episode) -> list[bool]:
    """For each pair of consecutive agent turns that both recorded their ids, whether the
    later turn's prompt ids start with the earlier turn's prompt ids and generated ids: the
    episode is then one token sequence (colbench.agents.ModelAgent's token-in/token-out
    rule), which trainers can score in one pass."""
    agent = [t for t in episode.turns if t.role == "agent"]
    out = []
    for a, b in zip(agent, agent[1:]):
        if a.prompt_token_ids is None or a.token_ids is None or b.prompt_token_ids is None:
            continue
        head = list(a.prompt_token_ids) + list(a.token_ids)
        out.append(list(b.prompt_token_ids[:len(head)]) == head)
    return out


def prefix_consistent(episode: Episode) -> bool:
    """Whether every agent turn recorded its ids and each continues the one before
    (`prefix_boundaries`): one token sequence."""
    agent = [t for t in episode.turns if t.role == "agent"]
    recorded = all(t.prompt_token_ids is not None and t.token_ids is not None for t in agent)
    return bool(agent) and recorded and all(prefix_boundaries(episode))


def _context_full(env: Environment, turn: Turn) -> bool:
    """Whether an agent turn's prompt plus generation reach the environment's optional
    `max_context_tokens` (None or absent: no limit; a turn without token ids: unknown, no)."""
    limit = getattr(env, "max_context_tokens", None)
    if not limit or turn.prompt_token_ids is None:
        return False
    return len(turn.prompt_token_ids) + len(turn.token_ids or ()) >= limit


def _end(lv: _Live, reason: str, env: Environment | None = None) -> None:
    """End a live episode; with `env`, its answer and answer turn (`final_answer`)."""
    lv.episode.stop_reason = reason
    if env is not None:
        lv.episode.answer, lv.episode.meta[ANSWER_TURN_KEY] = final_answer(env, lv.task, lv.episode.turns)


def _score(env: Environment, finished: Sequence[_Live], save) -> None:
    """Score the step's finished episodes in one batch and `save` each once it is scored
    (engine errors are already scored 0: saved first).

    With `env.score_iter`, episodes are saved in the step's order as soon as they and
    those before them are scored (the file's order stays the same from run to run); an
    interruption (Ctrl-C) saves every episode already scored before it propagates."""
    version = current_scoring_version(env)
    for lv in finished:
        lv.episode.meta[SCORING_VERSION_KEY] = version
    save([lv for lv in finished if lv.episode.score is not None])
    todo = [lv for lv in finished if lv.episode.score is None]
    if not todo:
        return
    tasks, answers = [lv.task for lv in todo], [lv.episode.answer for lv in todo]
    score_iter = getattr(env, "score_iter", None)
    if score_iter is None:
        scores = env.score(tasks, answers)
        if len(scores) != len(todo):
            raise RuntimeError(f"env {env.name} returned {len(scores)} scores for {len(todo)} answers")
        for lv, sc in zip(todo, scores):
            lv.episode.score = sc
        save(todo)
        return
    waiting: dict[int, _Live] = {}  # scored, behind one still being scored
    next_i = 0
    try:
        for i, sc in score_iter(tasks, answers):
            todo[i].episode.score = sc
            waiting[i] = todo[i]
            while next_i in waiting:
                save([waiting.pop(next_i)])
                next_i += 1
    finally:
        if waiting:  # interrupted: keep every scored episode
            save([waiting[i] for i in sorted(waiting)])
    unscored = [lv.episode.episode_id for lv in todo if lv.episode.score is None]
    if unscored:
        raise RuntimeError(f"env {env.name} did not score {len(unscored)} answers (first {unscored[0]!r})")


def _progress_bar(total: int, initial: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=f"episodes {name}", unit="ep", file=sys.stderr,
                dynamic_ncols=True, leave=True)
