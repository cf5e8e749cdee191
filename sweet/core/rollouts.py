"""A policy's episodes against the simulated human, for the trainers and workflows.

The one wiring of environment + simulated human + engine + agent around
`colbench.rollout.rollout`, which closes everything it opened on the way out (an error
or Ctrl-C too). `colbench.evaluate` is the evaluation CLI's own wiring (many agents, a
baseline, reports); LOOP keeps one session open over its iterations.

    with rollout_session("testbed", "scripted:testbed") as (env, simulator):
        ...                                               # env and simulator closed after
    episodes = policy_episodes("hf:runs/sweet/final", tasks, env="testbed", simulator="scripted:testbed",
                               sampling=SamplingParams(temperature=1.0, max_new_tokens=64),
                               seeds=episode_seeds(0, 8), out_path=out / "episodes.jsonl")
"""

from __future__ import annotations

from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from colbench.agents import ModelAgent
from colbench.envs import make_env
from colbench.protocols import Environment, Simulator
from colbench.rollout import rollout
from colbench.tasks import load_tasks, usable_tasks
from colbench.types import Episode, Task
from engines import EngineOptions, SamplingParams, load_engine
from simulators import load_simulator


def prompted_env(env: str, agent_prompt: str | None = None) -> Environment:
    """The environment `env` whose agent prompt is the template file `agent_prompt`
    (None: ours; colbench.prompts validates it; an env without a prompt file refuses one)."""
    from colbench.prompts import check_prompt_flags

    templates = check_prompt_flags(env, None, agent_prompt, None)
    return make_env(env, prompt_path=str(templates["agent"].path)) if agent_prompt else make_env(env)


@contextmanager
def rollout_session(env: str, simulator: str | None, *, max_turns: int | None = None, agent_prompt: str | None = None,
                    human_prompt: str | None = None, max_reply_chars: int | None = None
                    ) -> Iterator[tuple[Environment, Simulator | None]]:
    """The environment `env` and the simulated human `simulator` (a spec; None: none),
    both closed when the block ends. `agent_prompt` / `human_prompt`: template files
    (None: ours; docs/prompts.md); the episodes record them (meta["prompts"]).
    `max_reply_chars`: the human's reply cap (None: the environment's, colbench.envs.reply_cap)."""
    with ExitStack() as stack:
        environment = prompted_env(env, agent_prompt)
        stack.callback(environment.close)
        if max_turns is not None:
            environment.max_turns = max_turns
        human = None
        if simulator:
            human = load_simulator(simulator, environment, prompt_file=human_prompt, max_reply_chars=max_reply_chars)
            stack.callback(human.close)
        elif human_prompt:
            load_simulator(None, environment, prompt_file=human_prompt)  # refuses: nothing reads it
        yield environment, human


def policy_episodes(model: str, tasks: Sequence[Task], *, env: str, simulator: str | None, sampling: SamplingParams,
                    seeds: Sequence[int], out_path: str | Path, max_turns: int | None = None,
                    engine_options: EngineOptions | None = None, progress: bool = True,
                    agent_prompt: str | None = None, human_prompt: str | None = None,
                    max_reply_chars: int | None = None) -> list[Episode]:
    """Episodes of the model spec `model` on `tasks` × `seeds` (resumable JSONL at
    `out_path`); the environment, simulator and engine are opened here and closed."""
    with rollout_session(env, simulator, max_turns=max_turns, agent_prompt=agent_prompt,
                         human_prompt=human_prompt, max_reply_chars=max_reply_chars) as (environment, human), \
            closing(load_engine(model, engine_options)) as engine:
        agent = ModelAgent(engine, sampling, name="policy")
        return rollout(environment, tasks, agent, human, seeds=seeds, max_turns=max_turns, out_path=out_path,
                       progress=progress)


def task_pool(source: str, env: str, *, strict: bool = False) -> list[Task]:
    """The tasks an online trainer samples from (`--tasks` for `--env`): those with a
    reference to score against (one warning for the others); none is an error."""
    loaded = load_tasks(source, env=env, on_error="raise" if strict else "keep")
    tasks = usable_tasks(loaded, source=source)
    if not tasks:
        raise ValueError(f"--tasks {source}: no tasks for env {env!r}")
    return tasks
