"""Rejection fine-tuning (RFT) baseline: supervised training on the agent turns of
successful episodes (reward >= `success_threshold`, and among the best `top_fraction`
of all episodes; both default to the environment's `colbench.envs.training_defaults`:
backend reward 1.0 = all tests pass, frontend the best quarter by CLIP similarity).

Each agent turn is one example: context = the turn's recorded prompt ids, loss on the
generated action ids + eos only (token-mean NLL); simulator turns only ever appear
inside later contexts, masked out. See sweet/core/tokens.py.

A turn whose action does not fit `--max_length` (actions are never cut) is skipped when
the episodes load, with one warning line (`sweet.core.tokens.skip_long_actions`). The
unit is the turn, not its episode: each turn is its own example in its own recorded
context, so the kept turns are exactly the examples of a file without that turn, and
the objective (the token mean over the kept turns) stays an NLL of whole actions; the
episode's reward filter has already been applied, and dropping its other turns would
make no kept example more correct. The warm start (testbed/warm_start.py) trains here.

    # CPU, tiny model (episodes from `python -m colbench.evaluate ... --out eps.jsonl`)
    python -m sweet.train_policy --algorithm rft --episodes eps.jsonl --model tiny \\
        --output_dir runs/rft-tiny --success_threshold 0.5 --micro_batch_size 4

    # Llama-3.1-8B on 8 GPUs, LoRA (lr 2e-6 = 10x the paper's full fine-tuning 2e-7, batch 8, 1 epoch)
    accelerate launch --num_processes 8 -m sweet.train_policy --algorithm rft \\
        --episodes train_eps.jsonl --model hf:meta-llama/Llama-3.1-8B-Instruct --lora \\
        --micro_batch_size 1 --output_dir runs/rft-8b
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from colbench.envs import defaults_help
from colbench.episodes import load_episodes
from sweet.algorithms.policy_trainer import PolicyTrainConfig, finished_run, train_sft
from colbench.prompts import check_prompt_flags, check_recorded_prompts
from sweet.core.config import (
    LearningRates,
    ModelConfig,
    agent_prompt_field,
    check_range,
    fill_env_defaults,
    lr_field,
    save_resolved_config,
    strict_tasks_field,
)
from sweet.core.models import load_tokenizer
from sweet.core.tokens import agent_turn, episode_segments, skip_long_actions


@dataclass
class RFTConfig:
    """Which episodes to imitate."""

    episodes: str = field(default="", metadata={"help": "episodes JSONL (our runner's, or published offline trajectories)"})
    env: str = field(default="backend", metadata={"help": "environment the episodes come from (reads published offline trajectories; sets the filter defaults)"})
    success_threshold: float | None = field(default=None, metadata={"help": f"keep episodes with reward >= this (default: the --env's: {defaults_help('success_threshold')}; backend 1.0 = all tests pass)"})
    top_fraction: float | None = field(default=None, metadata={"help": f"and only the best fraction of all episodes by reward (default: the --env's: {defaults_help('rft_top_fraction')})"})
    max_episodes: int | None = field(default=None, metadata={"help": "use only the first N episodes of the file"})
    tokenize_missing_actions: bool = field(default=False, metadata={"help": "tokenise the text of agent turns without token_ids (published data)"})
    strict_tasks: bool = strict_tasks_field()
    agent_prompt: str | None = agent_prompt_field()

    def __post_init__(self) -> None:
        check_prompt_flags(self.env, None, self.agent_prompt, None)  # a bad file: PromptError, one line
        fill_env_defaults(self, success_threshold="success_threshold", top_fraction="rft_top_fraction")
        check_range(self, "success_threshold")  # finite
        check_range(self, "top_fraction")
        if not self.episodes:
            raise ValueError("RFTConfig.episodes is required: give --episodes <file.jsonl>")
        if not 0.0 < self.top_fraction <= 1.0:
            raise ValueError(f"RFTConfig.top_fraction must be in (0, 1], got {self.top_fraction}")
        if self.max_episodes is not None and self.max_episodes < 1:
            raise ValueError(f"RFTConfig.max_episodes must be >= 1, got {self.max_episodes}")


@dataclass
class RFTTrainConfig(PolicyTrainConfig):
    output_dir: str = field(default="runs/rft", metadata={"help": "checkpoints, metrics and the resolved config go here"})
    LEARNING_RATES: ClassVar[LearningRates] = LearningRates(2e-7, 2e-6, "SWEET-RL paper's one published rate, "
                                                            "2e-7, full fine-tuning (it gives RFT none of its own); "
                                                            "LoRA: 10x, the usual LoRA rule")
    learning_rate: float | None = lr_field(LEARNING_RATES)


CONFIGS = (ModelConfig, RFTTrainConfig, RFTConfig)


def rft_segments(episodes, tokenizer, success_threshold: float, tokenize_missing: bool = False,
                 top_fraction: float = 1.0, max_length: int | None = None, source: str = "episodes"):
    """The training segments of every agent turn of the kept episodes: reward >=
    `success_threshold` and at least the reward of the ceil(top_fraction × N)-th best
    of all N episodes (ties at that reward are kept); a turn whose action does not fit
    `max_length` is skipped (module docstring), counted in one warning line naming `source`."""
    import math

    ranked = sorted((ep.reward for ep in episodes), reverse=True)
    cutoff = ranked[max(1, math.ceil(top_fraction * len(ranked))) - 1] if ranked else 0.0
    kept = [ep for ep in episodes if ep.reward >= success_threshold and ep.reward >= cutoff]
    turns = [(agent_turn(ep.episode_id, t), seg) for ep in kept
             for t, seg in enumerate(episode_segments(tokenizer, ep, tokenize_missing))]
    turns = skip_long_actions(turns, lambda turn: [(turn[0], len(turn[1].action))], max_length, source=source,
                              what="agent turns")
    return kept, [seg for _, seg in turns]


def main(model_cfg: ModelConfig, train: RFTTrainConfig, cfg: RFTConfig):
    """Fine-tune on successful episodes; returns output_dir/final."""

    if (done := finished_run(train, model=model_cfg, rft=cfg)) is not None:
        return done
    run_config = save_resolved_config(train.output_dir, algorithm="rft", model=model_cfg, train=train, rft=cfg)
    episodes = load_episodes(cfg.episodes, env=cfg.env, on_error="raise" if cfg.strict_tasks else "skip",
                             usable_only=True)[: cfg.max_episodes]
    check_recorded_prompts(episodes, cfg.env, cfg.agent_prompt, cfg.episodes)  # one agent prompt, --agent_prompt's
    tokenizer = load_tokenizer(model_cfg.model)
    kept, segments = rft_segments(episodes, tokenizer, cfg.success_threshold, cfg.tokenize_missing_actions,
                                  cfg.top_fraction, model_cfg.max_length, cfg.episodes)
    print(f"rft: {len(kept)}/{len(episodes)} episodes with reward >= {cfg.success_threshold} in the top "
          f"{cfg.top_fraction:g}, {len(segments)} agent turns")
    if not kept:
        raise ValueError(f"{cfg.episodes}: no episode reaches reward >= {cfg.success_threshold}; "
                         "lower --success_threshold or collect more episodes")
    stats = {"data/episodes": len(episodes), "data/kept_episodes": len(kept), "data/turns": len(segments)}
    return train_sft(segments, model_cfg, train, tokenizer, run_config=run_config, first_metrics=stats)
