"""The training algorithms, one module each: `CONFIGS` (its config dataclasses, in the
order `main` takes them) and `main(*configs)`. Adding one = one module here + one line in
ALGORITHMS (and SUMMARIES). `python -m sweet.train_policy --algorithm NAME` dispatches.
Kept free of torch so that `--help` answers at once."""

from __future__ import annotations

import importlib

from colbench.cli import UserError

# --algorithm -> module with CONFIGS and main(*configs)
ALGORITHMS = {
    "sweet": "sweet.algorithms.sweet_rl",
    "rft": "sweet.algorithms.rft",
    "mtdpo": "sweet.algorithms.mtdpo",
    "loop": "sweet.algorithms.loop",
}
# one line each for the plain --help (kept here: --help must not import torch)
SUMMARIES = {
    "sweet": "SWEET-RL stage 2: per-turn DPO on candidate actions ranked by the stage-1 critic (default)",
    "rft": "rejection fine-tuning: supervised training on the agent turns of successful episodes",
    "mtdpo": "multi-turn DPO: DPO on whole trajectories of the same task (sum of per-turn log-probs)",
    "loop": "LOOP: online leave-one-out PPO with rollouts against the simulated human",
}


def load_algorithm(name: str):
    """The algorithm's module (CONFIGS, main)."""
    try:
        return importlib.import_module(ALGORITHMS[name])
    except ModuleNotFoundError as e:
        if e.name == ALGORITHMS[name]:
            raise UserError(f"--algorithm {name}: module {ALGORITHMS[name]} is not available in this install") from None
        raise
