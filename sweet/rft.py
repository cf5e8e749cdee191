"""Rejection fine-tuning (RFT) baseline: supervised training on the agent turns of
successful episodes (reward >= `success_threshold`).

Each agent turn is one example: context = the turn's recorded prompt ids, loss on the
generated action ids + eos only (token-mean NLL); simulator turns only ever appear
inside later contexts, masked out. See sweet/tokens.py.

    # CPU, tiny model (episodes from `python -m colbench.evaluate ... --out eps.jsonl`)
    python -m sweet.train_policy --algorithm rft --episodes eps.jsonl --model tiny \\
        --output_dir runs/rft-tiny --success_threshold 0.5 --micro_batch_size 4

    # Llama-3.1-8B on 8 GPUs, LoRA
    accelerate launch --num_processes 8 -m sweet.train_policy --algorithm rft \\
        --episodes train_eps.jsonl --model hf:meta-llama/Llama-3.1-8B-Instruct --lora \\
        --learning_rate 1e-5 --batch_size 64 --micro_batch_size 2 --output_dir runs/rft-8b
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sweet.policy_trainer import PolicyTrainConfig
from sweet.training import ModelConfig


@dataclass
class RFTConfig:
    """Which episodes to imitate."""

    episodes: str = field(default="", metadata={"help": "episodes JSONL (our runner's, or published offline trajectories)"})
    env: str = field(default="backend", metadata={"help": "environment of published offline trajectories"})
    success_threshold: float = field(default=1.0, metadata={"help": "keep episodes with reward >= this (1.0: all tests pass)"})
    max_episodes: int | None = field(default=None, metadata={"help": "use only the first N episodes of the file"})
    tokenize_missing_actions: bool = field(default=False, metadata={"help": "tokenise the text of agent turns without token_ids (published data)"})

    def __post_init__(self) -> None:
        if not self.episodes:
            raise ValueError("RFTConfig.episodes is required: give --episodes <file.jsonl>")
        if self.max_episodes is not None and self.max_episodes < 1:
            raise ValueError(f"RFTConfig.max_episodes must be >= 1, got {self.max_episodes}")


@dataclass
class RFTTrainConfig(PolicyTrainConfig):
    output_dir: str = field(default="runs/rft", metadata={"help": "checkpoints, metrics and the resolved config go here"})
    learning_rate: float = field(default=2e-6, metadata={"help": "peak learning rate (AdamW)"})


CONFIGS = (ModelConfig, RFTTrainConfig, RFTConfig)


def rft_segments(episodes, tokenizer, success_threshold: float, tokenize_missing: bool = False):
    """The training segments of every agent turn of the successful episodes."""
    from sweet.tokens import episode_segments

    kept = [ep for ep in episodes if ep.reward >= success_threshold]
    return kept, [seg for ep in kept for seg in episode_segments(tokenizer, ep, tokenize_missing)]


def main(model_cfg: ModelConfig, train: RFTTrainConfig, cfg: RFTConfig):
    """Fine-tune on successful episodes; returns output_dir/final."""
    from sweet.data import load_episodes
    from sweet.policy_trainer import train_sft
    from sweet.training import load_tokenizer, save_resolved_config

    save_resolved_config(train.output_dir, model=model_cfg, train=train, rft=cfg)
    episodes = load_episodes(cfg.episodes, env=cfg.env)[: cfg.max_episodes]
    tokenizer = load_tokenizer(model_cfg.model)
    kept, segments = rft_segments(episodes, tokenizer, cfg.success_threshold, cfg.tokenize_missing_actions)
    print(f"rft: {len(kept)}/{len(episodes)} episodes with reward >= {cfg.success_threshold}, {len(segments)} agent turns")
    if not segments:
        raise ValueError(f"{cfg.episodes}: no episode reaches reward >= {cfg.success_threshold}; "
                         "lower --success_threshold or collect more episodes")
    stats = {"data/episodes": len(episodes), "data/kept_episodes": len(kept), "data/turns": len(segments)}
    return train_sft(segments, model_cfg, train, tokenizer, run_config={"algorithm": "rft"}, first_metrics=stats)
