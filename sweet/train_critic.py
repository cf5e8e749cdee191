"""SWEET-RL stage 1, the per-turn advantage critic: the command line.

    python -m sweet.train_critic --help
    python -m sweet.train_critic --model tiny --episodes eps.jsonl --tasks tasks.jsonl --output_dir runs/critic

The critic's maths and scorer are sweet/critic/model.py, its data and training loop
sweet/critic/train.py (with the paper-scale commands).
"""

import sys

from sweet.core.runs import run_cli
from sweet.critic.train import cli

if __name__ == "__main__":
    sys.exit(run_cli(cli, prog="python -m sweet.train_critic"))
