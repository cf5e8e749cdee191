"""Multi-turn DPO baseline: DPO on whole trajectories of the same task.

    log π(τ) = Σ over the agent turns t of Σ over the action tokens of turn t of log π(token | o_t)

each turn scored in its own recorded context o_t (its prompt ids), so simulator tokens
are never in the loss and generated ids are never re-tokenised. The DPO loss
(sweet/algorithms/losses.py) is applied to the trajectory-level log-ratio; the NLL term is the
chosen trajectory's per-token NLL over its action tokens.

Pairs (`--pairing`): `paper` (sweet.core.records.make_trajectory_pairs with the
`--pairing_rule`: backend the best episode against each worse one, frontend every two
episodes at least `min_reward_gap` apart, as the published scripts do) or `best_vs_worst`
(one pair per task: best vs worst, when their rewards differ by more than `min_reward_gap`).
The rule, threshold and gap default to the environment's (`colbench.envs.training_defaults`:
backend best, 1.0 and 0.0; frontend all, no success, 0.1).

A pair is trained whole or not at all: an episode with an action that does not fit
`--max_length` (actions are never cut: a prefix's log-ratio is another quantity) drops
every pair it is in, when the episodes load, with one warning line
(`sweet.core.tokens.skip_long_actions`); a pair never loses a turn, since log π(τ) of a
trajectory without one of its turns is not the trajectory's.

    # CPU, tiny model
    python -m sweet.train_policy --algorithm mtdpo --episodes eps.jsonl --model tiny \\
        --output_dir runs/mtdpo-tiny --pairing best_vs_worst --micro_batch_size 2

    # Llama-3.1-8B on 8 GPUs, LoRA (paper: beta 0.1, NLL 0.01, batch 8, 1 epoch; lr 2e-7 is the paper's
    # full fine-tuning rate, LoRA resolves to 2e-6 = 10x; without --lora: 2e-7)
    accelerate launch --num_processes 8 -m sweet.train_policy --algorithm mtdpo \\
        --episodes train_eps.jsonl --model hf:meta-llama/Llama-3.1-8B-Instruct --lora \\
        --micro_batch_size 1 --gradient_checkpointing --output_dir runs/mtdpo-8b
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from colbench.envs import defaults_help
from colbench.episodes import load_episodes
from sweet.algorithms.losses import LOSS_TYPES, loss_type_field
from sweet.algorithms.policy_trainer import PolicyTrainConfig, finished_run, train_dpo
from colbench.prompts import check_prompt_flags, check_recorded_prompts
from sweet.core.config import (
    LearningRates,
    ModelConfig,
    agent_prompt_field,
    check_choice,
    check_pairing_rule,
    check_range,
    fill_env_defaults,
    lr_field,
    pairing_rule_field,
    save_resolved_config,
    strict_tasks_field,
)
from sweet.core.models import load_tokenizer
from sweet.core.records import Pair, group_by_task, make_trajectory_pairs
from sweet.core.tokens import agent_turn, episode_segments, one_pass_summary, skip_long_actions

PAIRINGS = ("paper", "best_vs_worst")


@dataclass
class MTDPOConfig:
    """Trajectory pairs and the DPO loss."""

    episodes: str = field(default="", metadata={"help": "episodes JSONL (several per task: rollouts to compare)"})
    env: str = field(default="backend", metadata={"help": "environment the episodes come from (reads published offline trajectories; sets the pairing defaults)"})
    pairing: str = field(default="paper", metadata={"help": "paper | best_vs_worst (module docstring)"})
    pairing_rule: str | None = pairing_rule_field()
    success_threshold: float | None = field(default=None, metadata={"help": f"paper pairing: the best episode must reach this reward (default: the --env's: {defaults_help('success_threshold')})"})
    min_reward_gap: float | None = field(default=None, metadata={"help": f"rejected reward must be lower than chosen by more than this (default: the --env's: {defaults_help('min_reward_gap')})"})
    beta: float = field(default=0.1, metadata={"help": "DPO β"})
    loss_type: str = loss_type_field()
    nll_coef: float = field(default=0.01, metadata={"help": "α: weight of the chosen trajectory's per-token NLL"})
    max_episodes: int | None = field(default=None, metadata={"help": "use only the first N episodes of the file"})
    tokenize_missing_actions: bool = field(default=False, metadata={"help": "tokenise the text of agent turns without token_ids (published data)"})
    strict_tasks: bool = strict_tasks_field()
    agent_prompt: str | None = agent_prompt_field()

    def __post_init__(self) -> None:
        check_prompt_flags(self.env, None, self.agent_prompt, None)  # a bad file: PromptError, one line
        fill_env_defaults(self, pairing_rule="pairing_rule", success_threshold="success_threshold",
                          min_reward_gap="min_reward_gap")
        check_pairing_rule(self)
        for name in ("success_threshold", "min_reward_gap", "beta", "nll_coef"):
            check_range(self, name)  # finite
        check_choice(self, "loss_type", LOSS_TYPES)
        if not self.episodes:
            raise ValueError("MTDPOConfig.episodes is required: give --episodes <file.jsonl>")
        if self.pairing not in PAIRINGS:
            raise ValueError(f"MTDPOConfig.pairing must be one of {PAIRINGS}, got {self.pairing!r}")
        if self.beta <= 0:
            raise ValueError(f"MTDPOConfig.beta must be > 0, got {self.beta}")
        if self.nll_coef < 0 or self.min_reward_gap < 0:
            raise ValueError("MTDPOConfig.nll_coef and min_reward_gap must be >= 0")


@dataclass
class MTDPOTrainConfig(PolicyTrainConfig):
    output_dir: str = field(default="runs/mtdpo", metadata={"help": "checkpoints, metrics and the resolved config go here"})
    LEARNING_RATES: ClassVar[LearningRates] = LearningRates(2e-7, 2e-6, "SWEET-RL paper's one published rate, "
                                                            "2e-7, full fine-tuning; no LoRA rate given: 10x, the "
                                                            "usual LoRA rule")
    learning_rate: float | None = lr_field(LEARNING_RATES)


CONFIGS = (ModelConfig, MTDPOTrainConfig, MTDPOConfig)


def trajectory_pairs(episodes, cfg: MTDPOConfig):
    """Pairs of episodes by reward (see --pairing)."""

    usable = [ep for ep in episodes if ep.agent_turns]
    if cfg.pairing == "paper":
        return make_trajectory_pairs(usable, cfg.success_threshold, cfg.min_reward_gap, cfg.pairing_rule)
    pairs = []
    for task_id, group in sorted(group_by_task(usable).items()):
        best, worst = max(group, key=lambda e: e.reward), min(group, key=lambda e: e.reward)
        if best.reward - worst.reward > cfg.min_reward_gap and best is not worst:
            pairs.append(Pair(best, worst, task_id))
    return pairs


def pair_segments(pairs, tokenizer, tokenize_missing: bool, max_length: int | None, source: str) -> list[Pair]:
    """Each episode pair as a pair of segment tuples (one segment per agent turn), without
    the pairs that hold an action too long for `max_length` (module docstring; one warning
    line naming `source`)."""
    segments: dict[int, tuple] = {}  # id(episode) -> its segments: an episode in several pairs is read once

    def of(ep) -> tuple:
        if id(ep) not in segments:
            segments[id(ep)] = tuple(episode_segments(tokenizer, ep, tokenize_missing))
        return segments[id(ep)]

    def actions(pair):
        return [(agent_turn(ep.episode_id, t), len(seg.action))
                for ep in (pair.chosen, pair.rejected) for t, seg in enumerate(of(ep))]

    kept = skip_long_actions(pairs, actions, max_length, source=source, what="trajectory pairs")
    return [Pair(of(p.chosen), of(p.rejected), p.task_id) for p in kept]


def main(model_cfg: ModelConfig, train: MTDPOTrainConfig, cfg: MTDPOConfig):
    """Train with trajectory-level DPO; returns output_dir/final."""

    if (done := finished_run(train, model=model_cfg, mtdpo=cfg)) is not None:
        return done
    run_config = save_resolved_config(train.output_dir, algorithm="mtdpo", model=model_cfg, train=train, mtdpo=cfg)
    episodes = load_episodes(cfg.episodes, env=cfg.env, on_error="raise" if cfg.strict_tasks else "skip",
                             usable_only=True)[: cfg.max_episodes]
    check_recorded_prompts(episodes, cfg.env, cfg.agent_prompt, cfg.episodes)  # one agent prompt, --agent_prompt's
    tokenizer = load_tokenizer(model_cfg.model)
    pairs = trajectory_pairs(episodes, cfg)
    print(f"mtdpo: {len(pairs)} trajectory pairs from {len(episodes)} episodes ({cfg.pairing} pairing"
          f"{', rule ' + cfg.pairing_rule if cfg.pairing == 'paper' else ''})")
    if not pairs:
        raise ValueError(f"{cfg.episodes}: no trajectory pairs (need tasks with several episodes of different rewards"
                         f"{'; the best reaching --success_threshold' if cfg.pairing == 'paper' else ''})")
    token_pairs = pair_segments(pairs, tokenizer, cfg.tokenize_missing_actions, model_cfg.max_length, cfg.episodes)
    trajectories = {id(s): s for p in token_pairs for s in (p.chosen, p.rejected)}.values()
    print(one_pass_summary(([(g.context, g.action) for g in t] for t in trajectories), model_cfg.max_length,
                           source="mtdpo"))
    stats = {"data/episodes": len(episodes), "data/pairs": len(token_pairs)}
    return train_dpo(token_pairs, model_cfg, train, tokenizer, beta=cfg.beta, nll_coef=cfg.nll_coef,
                     loss_type=cfg.loss_type, run_config=run_config, first_metrics=stats)
