"""Evaluate agents on ColBench and write a leaderboard with 95% confidence intervals.

    # the gold answers score 100% (a check of the environment and the sandbox)
    python -m colbench.evaluate --env backend --agent reference --output runs/ref

    # a model against the paper's setting: multi-turn, LLM simulated human, 10 turns
    python -m colbench.evaluate --env backend --agent vllm:meta-llama/Llama-3.1-8B-Instruct \\
        --simulator vllm:meta-llama/Llama-3.1-70B-Instruct --output runs/8b

    # several agents, 3 sampled seeds each, the same output dir (finished agents are reused);
    # on the CPU, two agents at a time in forked processes (the same episodes as one process)
    python -m colbench.evaluate --env backend --agent tiny --agent mine=hf:runs/sweet/final \\
        --simulator tiny --episodes_per_task 3 --temperature 0.7 --workers 2 --output runs/cmp

    # frontend: win rate against a baseline agent, VLM simulator, tiny CLIP for a CPU demo
    python -m colbench.evaluate --env frontend --agent tiny --baseline-agent reference \\
        --simulator tiny --clip-model tiny --limit 4 --output runs/fe

    # answers produced elsewhere (rows {"task_id", "answer"}) scored by the same sandbox
    python -m colbench.evaluate --env backend --agent replay:answers.jsonl --output runs/other

Agent specs: model specs (tiny, hf:, vllm:, openai:), `reference`, `replay:<file>`,
optionally named `<name>=<spec>`. Simulator specs: see `simulators/__init__.py`
(`scripted:<name>`, a model spec; frontend `text+<spec>` for a text-only model).
An agent whose spec equals --simulator shares the simulator's engine (one copy of
the model plays both sides).

Determinism: sampling defaults to temperature 0 (greedy) and seed 0, so a rerun gives
the same episodes. `--episodes_per_task S` runs seeds 0..S-1 with `--temperature` (set it > 0,
otherwise the seeds repeat one another); confidence intervals bootstrap over tasks
with a fixed seed, so they are deterministic too.

Prompts: `--agent_prompt FILE` and `--human_prompt FILE` replace our instructions for the
agent and the model simulator (docs/prompts.md: placeholders, and how to run the published
evaluator's own simulator prompt). config.json, every episode (meta["prompts"]) and each
leaderboard row record the files used, path and sha256.

Outputs in --output DIR: leaderboard.json, leaderboard.md, report.html, config.json
and episodes/<agent>.jsonl (each episode written once scored; rerun the same command to
resume after a crash, a kill or Ctrl-C, which says how many episodes were kept, exit
code 130). DIR is locked while a run writes it (colbench.outdir): a second run on it
stops at once naming the first (pid, host, start time); a killed run's lock is taken
over with a warning. Bad input (unknown spec, missing task file, malformed replay rows,
unknown task ids, a value of the wrong type in flags or --config YAML) ends with one
error line, exit code 2, before any model loads (`--debug` adds the traceback);
docs/bad-input.md lists every case.

Unusable task rows (bad JSON, a missing field, a reference that fails validation) never
stop the run: each scores 0 for every agent (never played), stays in the denominator, and
the leaderboard counts and names them (file:line and reason); `--strict-tasks` stops
instead, naming each. Episodes and leaderboards record the scoring version; a rerun into a
folder whose episodes were scored under another version stops naming both, unless
`--rescore` rescores their stored answers.

OpenAI-compatible agents and simulators are bounded by --request_timeout (one deadline
per request, body included), --max_retries and --max_reply_mb; a reply that cannot be
used fails its own episode, and the leaderboard counts engine errors with the first
reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from colbench.agents import ModelAgent, _split_name, check_agent_spec, file_slug, load_agent, needs_simulator
from colbench.cli import EXIT_USER_ERROR, Interrupted, UserError, one_line, run_main
from colbench.io import atomic_write

PROG = "python -m colbench.evaluate"

# Settings that change what an episode is; a rerun into the same DIR must keep them.
_EPISODE_FIELDS = ("env", "tasks", "simulator", "single_turn", "temperature", "max_new_tokens", "max_turns",
                   "max_reply_chars", "clip_model", "simulator_max_new_tokens", "leak_guard")


class UsageError(UserError):
    """Bad input: reported as one line, exit code 2."""


@dataclass
class EvalConfig:
    """Everything an evaluation run depends on (saved as DIR/config.json)."""

    # a class attribute, not a flag: fields taking model specs, so the CLI also gets
    # --request_timeout, --max_retries, --max_reply_mb (colbench.cli)
    engine_spec_fields = ("agent", "simulator", "baseline_agent")

    output: str = field(default="", metadata={"help": "output directory (required)"})
    env: str = field(default="backend", metadata={"help": "environment: backend, frontend or appworld (docs/appworld.md)"})
    agent: list[str] = field(default_factory=list, metadata={
        "help": "agent spec, repeatable: a model spec (tiny, hf:, vllm:, openai:), 'reference', "
                "'replay:<file.jsonl>', optionally '<name>=<spec>'"})
    simulator: str | None = field(default=None, metadata={
        "help": "simulated human: a model spec, 'scripted:<name>', or frontend 'text+<spec>'; "
                "needed unless every agent answers at once or --single-turn"})
    tasks: str = field(default="builtin:test", metadata={
        "help": "task source: builtin:test, builtin:train, a JSONL/Parquet file, or hf:<dataset id>, optionally "
                "with a row range last: file.jsonl[200:1000], hf:<id>[test][0:200]"})
    limit: int | None = field(default=None, metadata={"help": "evaluate the first N tasks only"})
    episodes_per_task: int = field(default=1, metadata={
        "help": "S: episodes per task and agent, seeds 0..S-1, S <= 1000 (use with --temperature > 0)",
        "aliases": ["--seeds"]})
    seed_round: int = field(default=0, metadata={
        "help": "sampling round R: run seeds R*1000 .. R*1000+S-1 instead, an evaluation independent of round 0's"})
    single_turn: bool = field(default=False, metadata={"help": "the agent's first message is its answer"})
    baseline_agent: str | None = field(default=None, metadata={
        "help": "agent spec whose per-task reward the win rate compares against (frontend: paper used GPT-4o)"})
    clip_model: str | None = field(default=None, metadata={
        "help": "frontend CLIP model ('tiny' for CPU tests); default: the environment's (paper's ViT-B/32)"})
    temperature: float = field(default=0.0, metadata={"help": "agent sampling temperature (0: greedy)"})
    max_new_tokens: int = field(default=1024, metadata={"help": "agent tokens per turn at most"})
    max_turns: int | None = field(default=None, metadata={"help": "agent turns at most (default: env's, 10)"})
    max_reply_chars: int | None = field(default=None, metadata={
        "help": "simulator reply length cap in characters (default: the env's, as published: frontend 1000, "
                "backend 400)"})
    simulator_max_new_tokens: int = field(default=200, metadata={
        "help": "model simulator tokens per reply at most (greedy)"})
    leak_guard: bool = field(default=True, metadata={
        "help": "backend: a simulated human's reply that reveals the hidden reference's code is resampled "
                "(3 times, temperature 0.7, seeds from the episode's), then replaced by a fixed reply; leaks are "
                "counted per episode and agent (colbench/leaks.py)"})
    max_concurrent: int | None = field(default=None, metadata={"help": "episodes in flight at once (default all)"})
    device: str | None = field(default=None, metadata={"help": "hf engines: cpu, cuda, ... (default: cuda if any)"})
    dtype: str = field(default="auto", metadata={"help": "hf/vllm dtype: auto, bfloat16, float16, float32"})
    batch_size: int = field(default=16, metadata={"help": "hf engines: sequences per forward batch"})
    workers: int = field(default=1, metadata={
        "help": "on the CPU: roll agents out in this many forked processes at once, torch's threads shared "
                "among them (a small model's generation keeps about one core busy); the same episodes and "
                "leaderboard as one process (on a GPU: one process)"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})
    strict_tasks: bool = field(default=False, metadata={
        "help": "stop (exit 2) on any unusable task row, naming each; default: an unusable row scores 0 for "
                "every agent, stays in the denominator and is named in the leaderboard"})
    rescore: bool = field(default=False, metadata={
        "help": "rescore, under this code's scoring rules, the stored answers of episodes in --output scored "
                "under another scoring version (default: refuse such a folder)"})
    agent_prompt: str | None = field(default=None, metadata={
        "help": "the agent's instructions, a template file (default: ours, colbench/envs/prompts/<env>_agent.txt; "
                "placeholders {max_turns} {answer_marker}; docs/prompts.md)"})
    human_prompt: str | None = field(default=None, metadata={
        "help": "a model simulator's template file (default: ours, simulators/prompts/; backend placeholders "
                "{problem_description} {hidden_information}, optional {dialogue_history}: then one user message "
                "with the dialogue as text, the published evaluator's layout; docs/prompts.md)"})

    def __post_init__(self) -> None:
        if not self.output:
            raise UsageError("--output DIR is required")
        if not self.agent:
            raise UsageError("give at least one --agent SPEC")
        checks = [("episodes_per_task", 1 <= self.episodes_per_task <= 1000, "an integer in 1..1000"),
                  ("seed_round", self.seed_round >= 0, "an integer >= 0"),
                  ("temperature", self.temperature >= 0 and math.isfinite(self.temperature), "a number >= 0"),
                  ("max_new_tokens", self.max_new_tokens >= 1, "an integer >= 1"),
                  ("simulator_max_new_tokens", self.simulator_max_new_tokens >= 1, "an integer >= 1"),
                  ("max_reply_chars", self.max_reply_chars is None or self.max_reply_chars >= 1, "an integer >= 1"),
                  ("limit", self.limit is None or self.limit >= 1, "an integer >= 1"),
                  ("max_turns", self.max_turns is None or self.max_turns >= 1, "an integer >= 1"),
                  ("max_concurrent", self.max_concurrent is None or self.max_concurrent >= 1, "an integer >= 1"),
                  ("batch_size", self.batch_size >= 1, "an integer >= 1"),
                  ("workers", self.workers >= 1, "an integer >= 1")]
        for name, ok, expected in checks:
            if not ok:
                raise UsageError(f"--{name.replace('_', '-')}: invalid value {getattr(self, name)!r} "
                                 f"(expected {expected})")
        from colbench.envs import env_names, reply_cap

        if self.max_reply_chars is None and self.env in env_names():  # the env's: config.json records it
            self.max_reply_chars = reply_cap(self.env)


def parse_config(argv: Sequence[str] | None = None) -> EvalConfig:
    """CLI flags over an optional --config YAML over the dataclass defaults (colbench.cli)."""
    from colbench.cli import parse_configs

    (config,) = parse_configs([EvalConfig], argv, prog=PROG, description=__doc__.split("\n\n")[0])
    return config


@dataclass
class Plan:
    """What `prepare` resolved, before any model loads."""

    tasks: list[Any]
    agents: list[tuple[str, str]]  # (name, spec), the baseline last if not among the agents
    baseline: str | None  # the baseline's name
    seeds: list[int]
    out_dir: Path
    prompts: dict[str, Any] = dataclasses.field(default_factory=dict)  # role -> PromptTemplate in use


def prepare(config: EvalConfig) -> Plan:
    """Validate every input (tasks, specs, replay files, the output dir) without loading
    a model. Raises UsageError/SpecError with one clear line."""
    from colbench.envs import env_names
    from simulators import check_simulator_spec

    if config.env not in env_names():
        raise UsageError(f"--env: unknown environment {config.env!r}; known: {', '.join(env_names())}")
    specs = list(config.agent) + ([config.baseline_agent] if config.baseline_agent else [])
    replays = [b[len("replay:"):] for b in (_split_name(s)[1] for s in specs) if b.startswith("replay:")]
    for spec in specs:  # specs first: a typo fails before tasks are loaded and validated
        check_agent_spec(spec)
    check_simulator_spec(config.simulator, config.env)
    from colbench.prompts import check_prompt_flags

    prompts = check_prompt_flags(config.env, None if config.single_turn else config.simulator, config.agent_prompt,
                                 config.human_prompt)
    agents = [_split_name(s) for s in config.agent]
    names = [n for n, _ in agents]
    if len(set(names)) != len(names):
        raise UsageError(f"two agents share the name {next(n for n in names if names.count(n) > 1)!r}; "
                         "name them with --agent NAME=SPEC")
    baseline = None
    if config.baseline_agent:
        baseline, bspec = _split_name(config.baseline_agent)
        if baseline not in names:
            agents.append((baseline, bspec))
        elif dict(agents)[baseline] != bspec:
            raise UsageError(f"--baseline-agent {config.baseline_agent!r}: the name {baseline!r} is another agent's")
    if config.simulator is None and not config.single_turn:
        asking = [s for _, s in agents if needs_simulator(s)]
        if asking:
            raise UsageError(f"agent {asking[0]!r} asks questions: give --simulator SPEC or use --single-turn")
    try:
        from colbench.tasks import load_tasks

        on_error = "raise" if config.strict_tasks else "keep"
        tasks = load_tasks(config.tasks, env=config.env, limit=config.limit, on_error=on_error)
        # Replay rows may cover more than the --limit'ed tasks: check their ids against all.
        known_ids = {t.task_id for t in (load_tasks(config.tasks, env=config.env, validate=False, on_error=on_error)
                                         if replays and config.limit else tasks)}
    except (OSError, ValueError, KeyError, LookupError) as e:
        raise UsageError(f"--tasks {config.tasks}: " + str(e).replace("\n", "; ")) from None
    if not tasks:
        raise UsageError(f"--tasks {config.tasks}: no tasks")
    from colbench.tasks import is_usable

    playable = [t for t in tasks if is_usable(t)]
    if playable:
        _check_turns(config, playable)
    for file in replays:
        check_agent_spec(f"replay:{file}", known_ids)
        _check_replay_covers(file, playable)
    out_dir = Path(config.output)
    _check_previous_config(out_dir, config, prompts)
    _check_episode_files(out_dir, [n for n, _ in agents])
    _check_scoring_versions(out_dir, config.env, [n for n, _ in agents], config.rescore)
    from colbench.rollout import episode_seeds

    return Plan(tasks=tasks, agents=agents, baseline=baseline,
                seeds=episode_seeds(config.seed_round, config.episodes_per_task),
                out_dir=out_dir, prompts=prompts)


def _task_turns(config: EvalConfig, tasks: Sequence[Any]) -> int | None:
    """The turn limit the tasks themselves set (the test bed's specs: `turns_for`), if any."""
    from colbench.envs import env_class

    turns_for = getattr(env_class(config.env), "turns_for", None)
    return turns_for(tasks) if turns_for is not None else None


def _check_turns(config: EvalConfig, tasks: Sequence[Any]) -> None:
    try:
        turns = _task_turns(config, tasks)
    except ValueError as e:
        raise UsageError(f"--tasks {config.tasks}: {e}") from None
    if turns is not None and config.max_turns is not None and config.max_turns != turns:
        raise UsageError(f"--max-turns {config.max_turns}: the tasks of {config.tasks} have {turns} agent turns")


def _check_replay_covers(file: str, tasks: Sequence[Any]) -> None:
    from colbench.agents import read_replay

    answers = read_replay(file)
    missing = [t.task_id for t in tasks if t.task_id not in answers]
    if missing:
        raise UsageError(f"replay file {file} has no answer for task {missing[0]!r} "
                         f"({len(missing)} of {len(tasks)} tasks missing)")


def _check_episode_files(out_dir: Path, names: Sequence[str]) -> None:
    """Episode files from an earlier run must parse (a truncated last line is fine)."""
    import warnings

    from colbench.episodes import read_episodes

    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # run_episodes warns when it repairs the file
            try:
                read_episodes(out_dir / "episodes" / f"{file_slug(name)}.jsonl")
            except ValueError as e:
                raise UsageError(f"{e}; fix or remove the file to rerun those episodes") from None


def _old_scoring_versions(out_dir: Path, env: str, names: Sequence[str]) -> dict[str, set[int]]:
    """{agent: the scoring versions of its stored episodes other than this code's for `env`}."""
    import warnings

    from colbench.episodes import current_scoring_version, episode_scoring_version, read_episodes

    now = current_scoring_version(env)
    out = {}
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            old = {episode_scoring_version(ep) for ep in read_episodes(out_dir / "episodes" / f"{file_slug(name)}.jsonl")}
        if old - {now}:
            out[name] = old - {now}
    return out


def _check_scoring_versions(out_dir: Path, env: str, names: Sequence[str], rescore: bool) -> None:
    """Episodes scored under other scoring rules never mix with new ones: refuse the folder
    (one line naming it and both versions) unless --rescore."""
    from colbench.episodes import current_scoring_version

    old = _old_scoring_versions(out_dir, env, names)
    if old and not rescore:
        versions = sorted(set().union(*old.values()))
        raise UsageError(f"--output {out_dir} holds episodes scored under scoring version "
                         f"{', '.join(map(str, versions))} (agent {next(iter(old))!r}); this code scores under version "
                         f"{current_scoring_version(env)}: rerun with --rescore to rescore their stored answers, "
                         "or use a new --output DIR")


def _check_previous_config(out_dir: Path, config: EvalConfig, prompts: dict[str, Any] | None = None) -> None:
    """Episodes in DIR are reused by id, so they must come from the same settings and the
    same prompt files (compared by sha256; a run recorded before prompts were recorded
    used our defaults)."""
    path = out_dir / "config.json"
    if not path.exists():
        return
    try:
        data = json.loads(path.read_text())
        old = data["config"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UsageError(f"{path}: unreadable; use a new --output DIR") from None
    for k in _EPISODE_FIELDS:
        if k == "leak_guard" and config.env != "backend":
            continue  # guards backend episodes only
        if old.get(k, False if k == "leak_guard" else None) != getattr(config, k):
            raise UsageError(f"--output {out_dir} holds a run with {k}={old.get(k)!r} (now {getattr(config, k)!r}); "
                             "use a new --output DIR")
    from colbench.prompts import KINDS, load_prompt

    for role, tpl in (prompts or {}).items():
        rec = (data.get("prompts") or {}).get(role) or load_prompt(tpl.kind).record()  # none recorded: our default
        if rec.get("sha256") != tpl.sha256:
            raise UsageError(f"--output {out_dir} holds episodes built with the {role} prompt {rec.get('path')} "
                             f"(sha256 {str(rec.get('sha256'))[:12]}), this run's {KINDS[tpl.kind].flag} is "
                             f"{tpl.path} (sha256 {tpl.sha256[:12]}); use a new --output DIR")


def run(config: EvalConfig, plan: Plan) -> list[Any]:
    """Run every agent (reusing finished episodes), then write the reports."""
    from colbench.envs import make_env
    from colbench.episodes import EpisodeConfig, matches_task, read_episodes
    from colbench.report import build_row, write_reports
    from colbench.rollout import rollout
    from engines.base import EngineOptions, SamplingParams
    from simulators import load_simulator

    plan.out_dir.mkdir(parents=True, exist_ok=True)
    env_kwargs: dict[str, Any] = {"clip_model": config.clip_model} if config.clip_model else {}
    if config.max_turns:  # the env tells the agent its turn budget
        env_kwargs["max_turns"] = config.max_turns
    elif _task_turns(config, plan.tasks) is not None:  # a test-bed spec sets its own
        env_kwargs["max_turns"] = _task_turns(config, plan.tasks)
    if config.env == "frontend":  # keep the screenshots beside the episodes (report thumbnails)
        env_kwargs["render_dir"] = str(plan.out_dir / "renders")
    if "agent" in plan.prompts:  # the --agent_prompt file (validated in prepare)
        env_kwargs["prompt_path"] = str(plan.prompts["agent"].path)
    env = make_env(config.env, **env_kwargs)
    episode_config = EpisodeConfig(max_turns=config.max_turns or env.max_turns, single_turn=config.single_turn,
                                   max_concurrent=config.max_concurrent, leak_guard=None if config.leak_guard else False)
    _write_config(plan, config, episode_config)
    options = EngineOptions(device=config.device, dtype=config.dtype, batch_size=config.batch_size)
    sampling = SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=0)
    _claim_episode_files(plan, config, episode_config)
    if config.rescore:
        _rescore(plan, env)

    def finished(name: str) -> list[Any] | None:
        path = plan.out_dir / "episodes" / f"{file_slug(name)}.jsonl"
        wanted = {f"{t.task_id}/{name}/{s}": t for t in plan.tasks for s in plan.seeds}
        have = {ep.episode_id: ep for ep in read_episodes(path)
                if ep.episode_id in wanted and matches_task(ep, wanted[ep.episode_id])}
        return [have[f"{t.task_id}/{name}/{s}"] for t in plan.tasks for s in plan.seeds] if len(have) == len(wanted) \
            else None

    def roll_out(agents: list[tuple[str, str]], env: Any) -> None:  # each agent's episodes into its file
        simulator = None
        try:
            for name, spec in agents:
                uses_sim = needs_simulator(spec) and not config.single_turn
                if uses_sim and simulator is None:
                    simulator = load_simulator(config.simulator, env, engine_options=options,
                                               max_reply_chars=config.max_reply_chars,
                                               max_new_tokens=config.simulator_max_new_tokens,
                                               prompt_file=config.human_prompt)
                shared = getattr(simulator, "engine", None) if uses_sim and spec == config.simulator else None
                if shared is not None:  # one copy of the model plays both sides (a second vLLM would not fit)
                    print(f"{name}: sharing the simulator's engine ({spec})", file=sys.stderr)
                    agent = ModelAgent(shared, sampling, name=name)
                else:
                    agent = load_agent(spec, env, sampling=sampling, engine_options=options, name=name)
                try:
                    rollout(env, plan.tasks, agent, simulator, seeds=plan.seeds, max_turns=episode_config.max_turns,
                            single_turn=config.single_turn, max_concurrent=config.max_concurrent,
                            out_path=plan.out_dir / "episodes" / f"{file_slug(name)}.jsonl",
                            leak_guard=episode_config.leak_guard, progress=config.progress)
                finally:
                    if shared is None:
                        getattr(agent, "close", lambda: None)()
        finally:
            if simulator is not None:
                simulator.close()

    def roll_out_alone(agents: list[tuple[str, str]]) -> None:  # in a forked process: its own env and sandboxes
        own = make_env(config.env, **env_kwargs)
        try:
            roll_out(agents, own)
        finally:
            own.close()

    try:
        pending = [(name, spec) for name, spec in plan.agents if finished(name) is None]
        for name, spec in plan.agents:
            if (name, spec) not in pending:  # finished earlier: no model to load
                path = plan.out_dir / "episodes" / f"{file_slug(name)}.jsonl"
                print(f"{name}: reusing {len(plan.tasks) * len(plan.seeds)} finished episodes from {path}",
                      file=sys.stderr)
        if config.workers > 1 and len(pending) > 1 and _on_cpu(config):
            _roll_out_in_processes(config, pending, roll_out_alone)
        else:
            roll_out(pending, env)
        episodes = {name: finished(name) for name, _ in plan.agents}
        base_eps = episodes.get(plan.baseline) if plan.baseline else None
        rows = [build_row(name, spec, env.name, episodes[name], base_eps, is_baseline=name == plan.baseline)
                for name, spec in plan.agents]
        thumbs = _thumbnails(plan.tasks, episodes) if env.name == "frontend" else None
        write_reports(plan.out_dir, rows, episodes, env=env.name, config=dataclasses.asdict(config), thumbs=thumbs)
        return rows
    finally:
        env.close()


def _on_cpu(config: EvalConfig) -> bool:
    """Whether the hf engines run on the CPU (--device cpu, or none given and no GPU): forked
    processes cannot use a CUDA context their parent made."""
    if config.device is not None:
        return config.device == "cpu"
    import torch

    return not torch.cuda.is_available()


def _roll_out_in_processes(config: EvalConfig, agents: list[tuple[str, str]], roll_out) -> None:
    """`roll_out(agents)` for a share of `agents` in each of `config.workers` forked
    processes (round robin), each with an equal share of torch's threads; returns when all
    have written their episodes. A process that fails is a one-line error naming its agents
    (what the others wrote is kept: a rerun reuses it)."""
    import multiprocessing

    import torch

    workers = min(config.workers, len(agents))
    threads = max(1, torch.get_num_threads() // workers)
    shares = [agents[k::workers] for k in range(workers)]

    def child(share: list[tuple[str, str]]) -> None:
        from engines.base import SpecError

        names = ", ".join(n for n, _ in share)
        torch.set_num_threads(threads)
        print(f"--workers {workers}: process {os.getpid()} rolls out {names} "
              f"({threads} torch thread{'s' if threads > 1 else ''})", file=sys.stderr, flush=True)
        try:
            roll_out(share)
        except (UserError, SpecError) as e:  # bad input: one line, as the CLI gives it in one process
            print(f"{PROG}: error: {names}: {one_line(e)}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)

    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=child, args=(share,), name=f"rollout-{k}") for k, share in enumerate(shares)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    failed = [(proc.exitcode, share) for proc, share in zip(procs, shares) if proc.exitcode != 0]
    if failed:
        names = ", ".join(name for _, share in failed for name, _ in share)
        message = (f"--workers {config.workers}: the process rolling out {names} failed (its error is above); "
                   f"the other agents' episodes are kept in {config.output}")
        raise (UserError if all(code == EXIT_USER_ERROR for code, _ in failed) else RuntimeError)(message)


def _rescore(plan: Plan, env: Any) -> None:
    """--rescore: rescore the stored answers of episodes scored under other rules."""
    from colbench.episodes import current_scoring_version, rescore_file

    old = _old_scoring_versions(plan.out_dir, env.name, [n for n, _ in plan.agents])
    for name in old:
        path = plan.out_dir / "episodes" / f"{file_slug(name)}.jsonl"
        n = rescore_file(env, path, plan.tasks)
        print(f"{name}: rescored {n} stored answers in {path} under scoring version {current_scoring_version(env)} "
              f"(were {', '.join(map(str, sorted(old[name])))})", file=sys.stderr)


def _claim_episode_files(plan: Plan, config: EvalConfig, episode_config: Any) -> None:
    """Record beside each agent's episodes file what produces its episodes (its spec and the
    sampling and episode settings: episodes/<agent>.agent.json), and refuse, before any model
    loads, an agent whose file holds another agent's or other settings' episodes: resuming
    would mix them under one name (a rerun with the same name for another model once reused
    the other model's episodes silently)."""
    records = {}
    for name, spec in plan.agents:
        record = {"agent": name, "spec": spec, "simulator": None if config.single_turn else config.simulator,
                  "temperature": config.temperature, "max_new_tokens": config.max_new_tokens,
                  "max_turns": episode_config.max_turns, "single_turn": config.single_turn}
        path = plan.out_dir / "episodes" / f"{file_slug(name)}.agent.json"
        if path.exists():
            old = json.loads(path.read_text())
            changed = {k: (old.get(k), v) for k, v in record.items() if old.get(k) != v}
            if changed:
                raise UserError(f"{path.with_suffix('').with_suffix('.jsonl')}: its episodes are of "
                                + ", ".join(f"{k}={a!r}" for k, (a, _) in changed.items()) + "; this run has "
                                + ", ".join(f"{k}={b!r}" for k, (_, b) in changed.items())
                                + ": give the agent another name or use another --output")
        records[path] = record
    for path, record in records.items():
        atomic_write(path, json.dumps(record, indent=2) + "\n")


def _write_config(plan: Plan, config: EvalConfig, episode_config: Any) -> None:
    from engines.base import server_defaults

    resolved = {
        "config": dataclasses.asdict(config),
        "agents": {name: spec for name, spec in plan.agents},
        "baseline": plan.baseline,
        "episode": dataclasses.asdict(episode_config),
        "seeds": plan.seeds,
        "n_tasks": len(plan.tasks),
        "n_unusable_tasks": sum(1 for t in plan.tasks if t.meta.get("unusable")),
        "scoring_version": _scoring_version(config.env),
        "prompts": {role: t.record() for role, t in plan.prompts.items()},  # the files, path + sha256
        "server": dataclasses.asdict(server_defaults()),  # openai: engines' timeout, retries, reply cap
        "python": sys.version.split()[0],
    }
    atomic_write(plan.out_dir / "config.json", json.dumps(resolved, indent=2) + "\n")


def _scoring_version(env: str) -> int:
    from colbench.episodes import current_scoring_version

    return current_scoring_version(env)


def _thumbnails(tasks: Sequence[Any], episodes: dict[str, list[Any]]) -> str | None:
    """Frontend thumbnails; a problem costs the picture, never the report."""
    from colbench.report import thumbnails

    try:
        return thumbnails(tasks, episodes)
    except Exception as e:  # noqa: BLE001 - report the reason, keep the report
        print(f"warning: thumbnails skipped ({type(e).__name__}: {e})", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: bad input is one line and exit code 2, Ctrl-C one line and 130 (colbench.cli.run_main)."""
    return run_main(_main, argv, prog=PROG)


def _main(argv: Sequence[str]) -> int:
    evaluate(parse_config(argv))
    return 0


def evaluate(config: EvalConfig) -> list[Any]:
    """One evaluation run (what the CLI runs; a rerun resumes what config.output holds):
    its leaderboard rows, also printed as a table. Bad input raises UserError."""
    from colbench.outdir import OutputLock

    plan = prepare(config)
    if config.episodes_per_task > 1 and config.temperature == 0:
        print(f"warning: --episodes_per_task {config.episodes_per_task} at temperature 0 repeats the same greedy "
              "episodes", file=sys.stderr)
    with OutputLock(plan.out_dir, command=f"{PROG} --output {config.output}"):
        try:
            rows = run(config, plan)
        except KeyboardInterrupt:
            raise Interrupted(f"{_kept(plan)} finished episodes are kept in {plan.out_dir / 'episodes'}; "
                              "rerun the same command to resume") from None
    from colbench.report import leaderboard_markdown

    print(leaderboard_markdown(rows))
    print(f"report: {plan.out_dir / 'report.html'}", file=sys.stderr)
    return rows


def _kept(plan: Plan) -> int:
    """Episodes on disk for this run's agents (what an interrupted run keeps)."""
    import warnings

    from colbench.episodes import read_episodes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sum(len(read_episodes(plan.out_dir / "episodes" / f"{file_slug(n)}.jsonl")) for n, _ in plan.agents)


if __name__ == "__main__":
    sys.exit(main())
