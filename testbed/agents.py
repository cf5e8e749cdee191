"""The test bed's scripted agents (`--agent explorer`, `--agent optimal`): no model.

colbench.agents names them in its registry (SCRIPTED_AGENTS, "testbed.agents:ScriptedTestbedAgent"),
loaded on use: colbench imports nothing from the lab.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Sequence

from colbench.protocols import AgentRequest
from engines.base import Sample, SpecError
from testbed import mdp
from testbed import bed as testbed_bed

if TYPE_CHECKING:
    from colbench.protocols import Environment

SCRIPTED_TESTBED = ("explorer", "optimal")


class ScriptedTestbedAgent:
    """The test bed's scripted agents, with no model: `explorer` samples the scripted
    explorer's next message (testbed.bed.sample_explorer) with a random stream per
    (task, episode seed, turn), so episodes are reproducible; `optimal` plays the exact
    solver's optimal policy (mdp.optimal_message). Each task's design is read
    from the task (testbed.bed.task_design). `env`, when given, must be the test bed."""

    needs_simulator = True

    def __init__(self, kind: str, name: str | None = None, env: "Environment | None" = None):
        if kind not in SCRIPTED_TESTBED:
            raise ValueError(f"scripted test-bed agent must be one of {SCRIPTED_TESTBED}, got {kind!r}")
        if env is not None and env.name != "testbed":
            raise SpecError(f"agent {name or kind!r} plays the test bed only (--env testbed), not {env.name!r}")
        self.kind = kind
        self.name = name or kind

    def act(self, requests: Sequence[AgentRequest]) -> list[Sample]:
        out = []
        for r in requests:
            if r.task.env != "testbed":
                raise ValueError(f"agent {self.kind!r} plays the test bed only; task {r.task.task_id} is {r.task.env!r}")
            design = testbed_bed.task_design(r.task)
            history = [m["content"] for m in r.messages[2:]]  # after the system prompt and the description
            if self.kind == "optimal":
                out.append(Sample(text=mdp.optimal_message(design, history)))
                continue
            rng = random.Random(f"{r.task.task_id}/{r.seed}/{len(history)}")
            out.append(Sample(text=testbed_bed.sample_explorer(design, history, rng)))
        return out
