"""The README's main job: SWEET-RL end to end on the CPU test bed, offline.

    python -m sweet.demo                       # ~7 minutes on 2 CPU cores
    python -m sweet.demo --output_dir runs/demo2 --episodes_per_task 8
    python -m sweet.demo --help

The steps are sweet/workflows/demo.py.
"""

import sys

from sweet.core.config import parse_configs
from sweet.core.runs import run_cli, trainer_run
from sweet.workflows.demo import DemoConfig, main


def cli(argv: list[str] | None = None):
    (cfg,) = parse_configs([DemoConfig], argv, description=__doc__.split("\n\n")[0])
    with trainer_run(cfg.output_dir, command="python -m sweet.demo"):
        return main(cfg)


if __name__ == "__main__":
    sys.exit(run_cli(cli, prog="python -m sweet.demo"))
