"""Policy training, one entry point: SWEET-RL stage 2, RFT, multi-turn DPO and LOOP.

    python -m sweet.train_policy --algorithm {sweet,rft,mtdpo,loop} [that algorithm's flags]
    python -m sweet.train_policy --help                        # the algorithms, one line each
    python -m sweet.train_policy --algorithm sweet --help      # the algorithm's flags
    python -m sweet.train_policy --algorithm rft --config run.yaml --learning_rate 1e-6

Each algorithm is one module with `CONFIGS` (its config dataclasses, in the order
`main` takes them) and `main(*configs)`; adding one = one module + one line in
ALGORITHMS. Every run writes output_dir/config.json, metrics.jsonl, TensorBoard logs
(`--report_to wandb` for W&B), checkpoints it resumes from, and output_dir/final (HF
format: `--agent hf:<output_dir>/final` in `python -m colbench.evaluate`).

    # CPU, tiny model: rejection fine-tuning on episodes from colbench.evaluate
    python -m sweet.train_policy --algorithm rft --episodes eps.jsonl --model tiny \\
        --success_threshold 0.5 --output_dir runs/rft-tiny

    # CPU, tiny model: SWEET-RL stage 2 with a stage-1 critic
    python -m sweet.train_policy --algorithm sweet --episodes eps.jsonl --tasks tasks.jsonl \\
        --critic runs/critic-tiny --model tiny --candidates_per_state 4 --max_new_tokens 32 --output_dir runs/sweet-tiny

    # 8B on 8 GPUs: vLLM sampling (one process), then LoRA DPO (see sweet/algorithms/sweet_rl.py;
    # the paper's settings are the defaults, LoRA's lr 2e-6 = 10x the paper's full 2e-7)
    python -m sweet.train_policy --algorithm sweet --stage sample --sampler vllm:meta-llama/Llama-3.1-8B-Instruct \\
        --sampler_tensor_parallel 8 --model hf:meta-llama/Llama-3.1-8B-Instruct --episodes eps.jsonl \\
        --tasks tasks.jsonl --critic runs/critic-8b --output_dir runs/sweet-8b
    accelerate launch --num_processes 8 -m sweet.train_policy --algorithm sweet --stage train --lora \\
        --model hf:meta-llama/Llama-3.1-8B-Instruct --episodes eps.jsonl --tasks tasks.jsonl \\
        --critic runs/critic-8b --micro_batch_size 1 --output_dir runs/sweet-8b
"""

from __future__ import annotations

import argparse
import importlib
import sys

from colbench.cli import UserError
from sweet.algorithms import ALGORITHMS, SUMMARIES, load_algorithm
from sweet.core.config import parse_configs
from sweet.core.runs import run_cli, trainer_run

# algorithms a workflow can repeat: its module adds a config (RoundsConfig: --rounds) and
# its main(*configs) runs the algorithm's main once per round
WORKFLOWS = {"sweet": "sweet.workflows.rounds"}


def overview() -> str:
    """The plain --help: every algorithm with one line, and where its flags are."""
    lines = [__doc__.split("\n\n")[0].strip(), "", "usage: python -m sweet.train_policy --algorithm ALGORITHM "
             "[--config run.yaml] [flags]", "", "algorithms:"]
    lines += [f"  {name:<7} {SUMMARIES[name]}" for name in ALGORITHMS]
    lines += ["", "python -m sweet.train_policy --algorithm ALGORITHM --help   lists that algorithm's flags"]
    return "\n".join(lines)


def split_algorithm(argv: list[str]) -> tuple[str, list[str]]:
    """Take `--algorithm X` (or `--algorithm=X`) out of argv; default "sweet"."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--algorithm", default="sweet")
    known, rest = pre.parse_known_args(argv)
    if known.algorithm not in ALGORITHMS:
        raise UserError(f"--algorithm: unknown {known.algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    return known.algorithm, rest


def parse(argv: list[str]):
    """The algorithm's (or its workflow's) `main` and its parsed, resolved configs: what
    `main` runs (tests/sweet/test_paper_commands.py reads the documented commands with it)."""
    name, rest = split_algorithm(argv)
    module = load_algorithm(name)
    types, run = module.CONFIGS, module.main
    if name in WORKFLOWS:
        workflow = importlib.import_module(WORKFLOWS[name])
        types, run = (*types, workflow.RoundsConfig), workflow.main
    configs = parse_configs(types, rest, description=f"--algorithm {name}: " + " ".join(module.__doc__.split("\n\n")[0].split()))
    return run, configs


def main(argv: list[str] | None = None):
    """Parse `--algorithm X [flags]` and run X's `main(*configs)` in its locked output_dir;
    returns what it returns (output_dir/final). Errors raise (run_cli prints them)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv) and not any(a.split("=")[0] == "--algorithm" for a in argv):
        print(overview())
        raise SystemExit(0)
    run, configs = parse(argv)
    train = configs[1]  # every algorithm's CONFIGS: (ModelConfig, its TrainConfig, ...)
    with trainer_run(train.output_dir, command="python -m sweet.train_policy " + " ".join(argv)[:200]):
        return run(*configs)


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m sweet.train_policy"))
