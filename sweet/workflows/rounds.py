"""SWEET-RL over several rounds (`--rounds R`, R > 1; the paper trains one round): a
workflow above stage 2, dispatched by sweet/train_policy.py for `--algorithm sweet`.

After each round of stage 2 (sweet/algorithms/sweet_rl.py) the trained policy plays
`episodes_per_task` new episodes per task against `--simulator` (resumable JSONL in
output_dir/round-r/episodes.jsonl), the critic is retrained with the settings of
`--critic` (its config.json) on all episodes so far, and stage 2 runs again from the
previous round's policy, which is also the new DPO reference. Round r writes to
output_dir/round-r/. One process, `--stage all`.

    python -m sweet.train_policy --algorithm sweet --rounds 2 --simulator scripted:testbed \\
        --episodes eps.jsonl --tasks tasks.jsonl --env testbed --critic runs/critic-tiny --model tiny \\
        --candidates_per_state 4 --max_new_tokens 32 --output_dir runs/sweet-rounds
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from colbench.cli import canonical_keys
from colbench.episodes import load_episodes
from colbench.rollout import episode_seeds
from colbench.tasks import load_tasks, usable_tasks
from engines import EngineOptions, SamplingParams
from sweet.algorithms.sweet_rl import ORACLE_CRITIC, first_episodes
from sweet.algorithms.sweet_rl import main as run_round
from sweet.core.config import ModelConfig, check_range, human_prompt_field, max_reply_chars_field
from sweet.core.rollouts import policy_episodes
from sweet.core.trainer import process_state
from sweet.critic.train import CriticConfig, CriticTrainConfig
from sweet.critic.train import main as train_critic


@dataclass
class RoundsConfig:
    """Repeat stage 2 with new episodes and a retrained critic."""

    engine_spec_fields = ("simulator",)  # a class attribute, not a flag: adds --request_timeout etc. (colbench.cli)

    rounds: int = field(default=1, metadata={"help": "rounds: >1 collects new episodes with the trained policy, retrains the critic, repeats"})
    simulator: str = field(default="", metadata={"help": "rounds > 1: simulated human for the new episodes (e.g. scripted:backend, vllm:...)"})
    episodes_per_task: int = field(default=2, metadata={
        "help": "rounds > 1: new episodes per task each round (seeds r*1000 .. r*1000+N-1)",
        "aliases": ["--rollouts_per_task"]})
    max_turns: int | None = field(default=None, metadata={"help": "rounds > 1: agent turns per new episode (default: the env's)"})
    human_prompt: str | None = human_prompt_field()  # the new episodes' agent prompt: stage 2's --agent_prompt
    max_reply_chars: int | None = max_reply_chars_field()

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"RoundsConfig.rounds must be >= 1, got {self.rounds}")
        if self.rounds > 1 and not self.simulator:
            raise ValueError("RoundsConfig.simulator is required with rounds > 1 (new episodes need a simulated human)")
        if self.episodes_per_task < 1:
            raise ValueError(f"RoundsConfig.episodes_per_task must be >= 1, got {self.episodes_per_task}")
        check_range(self, "max_reply_chars", low=1)


def main(model_cfg, train, cfg, cand, rounds: RoundsConfig, ranker=None):
    """`--algorithm sweet`: one round of stage 2, or `rounds.rounds` rounds."""
    if rounds.rounds == 1:
        return run_round(model_cfg, train, cfg, cand, ranker)
    if cfg.critic == ORACLE_CRITIC:  # rounds retrain the critic from its dir's config.json
        raise ValueError(f"--critic {ORACLE_CRITIC} runs one round: there is no critic to retrain")
    return run_rounds(model_cfg, train, cfg, cand, rounds, ranker)


def run_rounds(model_cfg, train, cfg, cand, rounds: RoundsConfig, ranker=None):
    """`rounds.rounds` rounds of stage 2; returns the last round's final model."""

    if process_state().num_processes > 1 or cfg.stage != "all":
        raise ValueError("RoundsConfig.rounds > 1 runs in one process with --stage all (it collects episodes "
                         "and retrains the critic between rounds)")
    if not cfg.critic:
        raise ValueError("SweetConfig.critic is required with rounds > 1 (the critic's config is reused)")
    from colbench.prompts import check_prompt_flags

    check_prompt_flags(cfg.env, rounds.simulator, cfg.agent_prompt, rounds.human_prompt)  # before round 1 trains
    final = run_round(model_cfg, train, cfg, cand, ranker)
    episodes = [cfg.episodes]
    for r in range(1, rounds.rounds):
        out = Path(train.output_dir) / f"round-{r}"
        episodes.append(str(collect_episodes(final, cfg, cand, rounds, out / "episodes.jsonl", train.seed)))
        critic = retrain_critic(cfg.critic, ",".join(episodes), out / "critic")
        model_cfg = replace(model_cfg, model=str(final))
        cfg = replace(cfg, episodes=episodes[-1], critic=str(critic), max_episodes=None, episode_fraction=1.0)
        final = run_round(model_cfg, replace(train, output_dir=str(out)), cfg, replace(cand, sampler=""), None)
    return final


def collect_episodes(policy: Path, cfg, cand, rounds: RoundsConfig, path: Path, seed: int) -> Path:
    """Run the policy on the tasks of the round's episodes (resumable JSONL at `path`)."""
    on_error = "raise" if cfg.strict_tasks else "keep"
    task_ids = {ep.task_id for ep in first_episodes(load_episodes(cfg.episodes, env=cfg.env, usable_only=True), cfg)}
    loaded = load_tasks(cfg.tasks, env=cfg.env, on_error=on_error)
    tasks = [t for t in usable_tasks(loaded, source=cfg.tasks) if t.task_id in task_ids]
    sampling = SamplingParams(temperature=cand.temperature, top_p=cand.top_p, max_new_tokens=cand.max_new_tokens)
    policy_episodes(f"hf:{policy}", tasks, env=cfg.env, simulator=rounds.simulator, sampling=sampling,
                    seeds=episode_seeds(seed, rounds.episodes_per_task), max_turns=rounds.max_turns, out_path=path,
                    engine_options=EngineOptions(batch_size=cand.sampler_batch_size, workers=cand.sampler_workers),
                    agent_prompt=cfg.agent_prompt,
                    human_prompt=rounds.human_prompt, max_reply_chars=rounds.max_reply_chars)
    return path


def retrain_critic(critic_dir: str, episodes: str, out: Path) -> Path:
    """Retrain the critic with the settings of `critic_dir` (its config.json) on `episodes`."""

    saved = json.loads((Path(critic_dir) / "config.json").read_text())

    def build(cls, d):  # a config.json written before a field's rename names it by its alias
        d = canonical_keys([cls], d, f"{critic_dir}/config.json")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    ccfg = replace(build(CriticConfig, saved["critic"]), episodes=episodes, eval_episodes="")
    tcfg = replace(build(CriticTrainConfig, saved["train"]), output_dir=str(out))
    train_critic(build(ModelConfig, saved["model"]), tcfg, ccfg)
    return out
