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
from colbench.types import Episode, Task
from engines import EngineOptions, SamplingParams, load_engine
from simulators import load_simulator


@contextmanager
def rollout_session(env: str, simulator: str | None, *, max_turns: int | None = None
                    ) -> Iterator[tuple[Environment, Simulator | None]]:
    """The environment `env` and the simulated human `simulator` (a spec; None: none),
    both closed when the block ends."""
    with ExitStack() as stack:
        environment = make_env(env)
        stack.callback(environment.close)
        if max_turns is not None:
            environment.max_turns = max_turns
        human = None
        if simulator:
            human = load_simulator(simulator, environment)
            stack.callback(human.close)
        yield environment, human


def policy_episodes(model: str, tasks: Sequence[Task], *, env: str, simulator: str | None, sampling: SamplingParams,
                    seeds: Sequence[int], out_path: str | Path, max_turns: int | None = None,
                    engine_options: EngineOptions | None = None, progress: bool = True) -> list[Episode]:
    """Episodes of the model spec `model` on `tasks` × `seeds` (resumable JSONL at
    `out_path`); the environment, simulator and engine are opened here and closed."""
    with rollout_session(env, simulator, max_turns=max_turns) as (environment, human), \
            closing(load_engine(model, engine_options)) as engine:
        agent = ModelAgent(engine, sampling, name="policy")
        return rollout(environment, tasks, agent, human, seeds=seeds, max_turns=max_turns, out_path=out_path,
                       progress=progress)
