"""SWEET-RL stage 1: train the per-turn advantage critic with training-time information.

    A(o_t, a_t, c) = β · mean_{y ∈ a_t} [log π_θ(y | o_t, c) − log π_ref(y | o_t, c)]
    L = −log σ(Σ_t A(chosen_t) − Σ_t A(rejected_t))  [+ nll_coef · NLL(chosen actions)]

(maths and conventions: sweet/critic/model.py). π_ref log-probs are computed once, before
training, by the initial model (LoRA: adapters disabled) and cached in
`output_dir/ref_logprobs.pt`; only θ is in memory while training.

Tiny CPU run (seconds; episodes from `python -m colbench.evaluate ...`):

    python -m sweet.train_critic --model tiny --episodes runs/rollouts/episodes.jsonl \\
        --tasks tasks/backend/train.jsonl --output_dir runs/critic-tiny \\
        --num_epochs 2 --learning_rate 1e-3 --max_length 1024

Same on 2 CPU processes (gloo):

    accelerate launch --config_file sweet/configs/ddp_cpu_2proc.yaml -m sweet.train_critic \\
        --model tiny --episodes runs/rollouts/episodes.jsonl --tasks tasks/backend/train.jsonl \\
        --output_dir runs/critic-tiny-ddp

Llama-3.1-8B-Instruct critic with LoRA on 8 GPUs (paper: 4 epochs, batch 8, all pairs; lr 2e-6 with
LoRA = 10x the paper's full fine-tuning 2e-7, the default either way):

    accelerate launch --config_file sweet/configs/deepspeed_zero2.yaml -m sweet.train_critic \\
        --model hf:meta-llama/Llama-3.1-8B-Instruct --lora true --gradient_checkpointing true \\
        --episodes data/backend_offline.jsonl --tokenize_missing_actions true --tasks builtin:train \\
        --env backend --output_dir runs/critic-8b --micro_batch_size 1 --max_length 8192

The paper's critic ablations (Sec. 6) are flags of the same trainer; the scorer of
stage 2 reads them back from `critic_config.json`, so ranking uses the same head,
reduction and context as training:

    --training_info false   # sweet_no_info: c is not in the critic's context (--tasks optional)
    --head value            # sweet_value_head: scalar regression head, mean over a_t of v, no π_ref
    --length_normalize false  # sweet_sum: sum over a_t's tokens instead of the mean

The frontend critic as the published fork trains it: a vision-language --model (Qwen2-VL;
`tiny-vl` on CPU) sees the target page's screenshot as c and the agent's latest draft's
screenshot at each turn, on either head (sweet/critic/vision.py; pages rendered once into
output_dir/renders):

    python -m sweet.train_critic --env frontend --model hf:Qwen/Qwen2-VL-7B-Instruct --head lm \
        --episodes runs/frontend/episodes.jsonl --tasks builtin:train --output_dir runs/critic-vl

Or everything from a YAML file (`--config run.yaml`; flags override it). Outputs:
`final/` (HF weights; LoRA: merged weights + `final-adapter/`), `critic_config.json`
(what `sweet.critic.model.TrainedCritic.load` needs), `metrics.jsonl` (`loss/bt`, `loss/nll`,
`critic/pair_accuracy`, `critic/margin`), `config.json`, `checkpoint-<step>/` each
epoch (and every `--save_steps`): accelerate's full training state, so rerunning the
command after a crash resumes from the last checkpoint with the same result as an
uninterrupted run, on any number of processes and backends (the training loop is the
shared skeleton, sweet/core/trainer.py). A value-head critic's `final/` also holds
`value_head.safetensors` (LoRA: `final/` is the adapter plus the head).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from colbench.envs import defaults_help
from colbench.io import atomic_write
from colbench.episodes import load_episodes
from colbench.prompts import PromptTemplate, check_prompt_flags, check_recorded_prompts, load_prompt
from colbench.types import Task
from sweet.core.config import (
    LearningRates,
    ModelConfig,
    TrainConfig,
    agent_prompt_field,
    check_action_room,
    check_pairing_rule,
    check_range,
    fill_env_defaults,
    lr_field,
    pairing_rule_field,
    parse_configs,
    resolve_local,
    resolved_config,
    save_resolved_config,
    strict_tasks_field,
)
from sweet.core.fingerprint import begin_run
from sweet.core.models import load_model, load_tokenizer, resolve_model_path, set_seed
from sweet.core.records import group_by_task, make_trajectory_pairs
from sweet.core.runs import trainer_run
from sweet.core.nograd_pass import REFERENCE_CACHE, ReferenceCache, sharded_scores
from sweet.core.tokens import agent_turn, one_pass_summary, skip_long_actions
from sweet.core.trainer import Trainer, mark_finished
from sweet.critic.baseline import baseline_index, centred, sample_baselines
from sweet.critic.vision import MAX_PIXELS, MIN_PIXELS, ScreenshotView
from sweet.critic.model import (
    DEFAULT_HEADER,
    HEADS,
    CriticRecord,
    CriticTurn,
    action_sums,
    bradley_terry_loss,
    critic_batch,
    critic_context_ids,
    episode_turn_examples,
    load_training_info,
    pair_accuracy_and_margin,
    per_turn_advantage,
    training_info_fn,
    trajectory_scores,
)


@dataclass
class CriticConfig:
    """The critic's data and objective."""

    episodes: str = field(default="", metadata={"help": "comma list of episode JSONL files (our runner's or published offline rows)"})
    tasks: str = field(default="", metadata={"help": "tasks the episodes ran on (path or builtin:<split>): source of the training-time information; may be empty when every episode carries meta['task'] (published trajectories)"})
    env: str = field(default="backend", metadata={"help": "environment name: its training_info(task) is c"})
    eval_episodes: str = field(default="", metadata={"help": "comma list of held-out episode files; empty: hold out eval_fraction of the tasks"})
    eval_fraction: float = field(default=0.0, metadata={"help": "share of tasks (not pairs) held out for pairwise accuracy "
                                                                "(default 0: the paper trains on all pairs; no held-out "
                                                                "metrics then, final_metrics.json is {})"})
    beta: float = field(default=1.0, metadata={"help": "β in A = β·mean(log π_θ − log π_ref); not stated in the paper"})
    length_normalize: bool = field(default=True, metadata={
        "help": "mean over the action's tokens (paper); false: sum (the paper's sweet_sum ablation)"})
    training_info: bool = field(default=True, metadata={
        "help": "add the hidden reference c to the critic's context (paper); false: without it, in training and in "
                "scoring (the paper's sweet_no_info ablation); --tasks is then not needed"})
    head: str = field(default="lm", metadata={
        "help": "lm: A = β·mean(log π_θ − log π_ref) read through the LM head (paper); value: a scalar regression "
                "head on the last hidden state, A = β·mean over the action's tokens of v, no π_ref (the paper's "
                "sweet_value_head ablation)"})
    nll_coef: float = field(default=0.0, metadata={"help": "weight of an NLL term on the chosen trajectories' actions"})
    pairing_rule: str | None = pairing_rule_field()
    success_threshold: float | None = field(default=None, metadata={"help": f"a task yields pairs when its best reward reaches this (default: the --env's: {defaults_help('success_threshold')}; backend 1.0 = all tests pass)"})
    min_reward_gap: float | None = field(default=None, metadata={
        "help": "best pairing: rejected episodes are worse than the best by more than this; all pairing: two rewards "
                f"at least this far apart pair (default: the --env's: {defaults_help('min_reward_gap')})"})
    max_pairs: int = field(default=0, metadata={"help": "cap on training pairs (0: all)"})
    header: str = field(default=DEFAULT_HEADER, metadata={"help": "header around c in the critic's prompt (the "
                                                                  "note of critics before --critic_context_prompt; "
                                                                  "a non-default header without that flag keeps it)"})
    critic_context_prompt: str | None = field(default=None, metadata={
        "help": "the critic's context template that holds c (default: ours, sweet/critic/prompts/critic_context.txt; "
                "placeholder {training_info}, added to the policy's first message; its text is recorded in "
                "critic_config.json, so stage 2 scores with it; docs/prompts.md)"})
    agent_prompt: str | None = agent_prompt_field()
    tokenize_missing_actions: bool = field(default=False, metadata={"help": "tokenise the text of agent turns that carry no token_ids (published data)"})
    eval_batch_size: int = field(default=8, metadata={"help": "turns per forward pass when computing π_ref and held-out scores"})
    baseline_samples_per_state: int = field(default=0, metadata={
        "help": "K: centre each turn's advantage by the mean of K actions of the initial policy at its state, "
                "A − (1/K)·Σ_k A(o_t, a_k, c) (sweet/critic/baseline.py: an advantage has zero mean under its "
                "policy, so a turn whose action the policy always takes carries no credit); 0: the paper's A",
        "aliases": ["--baseline_samples"]})
    baseline_sampler: str = field(default="", metadata={"help": "engine spec of the policy the baseline samples come "
                                                                "from (default: hf:<--model>, the critic's initial model)"})
    baseline_max_new_tokens: int = field(default=512, metadata={"help": "max tokens per baseline sample (< --max_length: "
                                                                        "an action is never cut)"})
    strict_tasks: bool = strict_tasks_field()
    max_pixels: int = field(default=MAX_PIXELS, metadata={
        "help": "vision-language critic (frontend): screenshots are resized to at most this many pixels (the "
                "published fork's 64*28*28 = 50176; Qwen2-VL: one token per 28x28 pixels)"})
    min_pixels: int = field(default=MIN_PIXELS, metadata={
        "help": "vision-language critic: screenshots are resized to at least this many pixels (the fork's 16*28*28)"})

    def __post_init__(self) -> None:
        fill_env_defaults(self, pairing_rule="pairing_rule", success_threshold="success_threshold",
                          min_reward_gap="min_reward_gap")
        check_pairing_rule(self)
        for name in ("success_threshold", "min_reward_gap", "beta", "nll_coef", "eval_fraction"):
            check_range(self, name)  # finite
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"CriticConfig.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.beta <= 0:
            raise ValueError(f"CriticConfig.beta must be > 0, got {self.beta}")
        if self.nll_coef < 0:
            raise ValueError(f"CriticConfig.nll_coef must be >= 0, got {self.nll_coef}")
        if self.max_pairs < 0 or self.eval_batch_size < 1:
            raise ValueError("CriticConfig.max_pairs must be >= 0 and eval_batch_size >= 1")
        if self.baseline_samples_per_state < 0 or self.baseline_max_new_tokens < 1:
            raise ValueError("CriticConfig.baseline_samples_per_state must be >= 0 and baseline_max_new_tokens >= 1")
        if self.head not in HEADS:
            raise ValueError(f"CriticConfig.head must be one of {HEADS}, got {self.head!r}")
        if self.head == "value" and self.nll_coef > 0:
            raise ValueError("CriticConfig.nll_coef needs head='lm' (a value head has no token log-probs)")
        if self.critic_context_prompt and self.header != DEFAULT_HEADER:
            raise ValueError("CriticConfig: give --critic_context_prompt or a non-default --header, not both "
                             "(the template file holds its own header)")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"CriticConfig: need 0 < min_pixels <= max_pixels, got {self.min_pixels}, {self.max_pixels}")
        check_prompt_flags(self.env, None, self.agent_prompt, None)  # a bad file: PromptError, one line
        self.context_prompt()

    def context_prompt(self) -> PromptTemplate | None:
        """The critic_context template in use (validated); None: a non-default --header
        without a template file (the old note, built from the header)."""
        if self.header != DEFAULT_HEADER and not self.critic_context_prompt:
            return None
        return load_prompt("critic_context", self.critic_context_prompt)

    def context_template(self) -> str | None:
        """The template's text, what the critic's context is built with (None: the header note)."""
        tpl = self.context_prompt()
        return tpl.text if tpl is not None else None


@dataclass
class CriticTrainConfig(TrainConfig):
    """TrainConfig with the paper's critic defaults (4 epochs, batch 8 pairs)."""

    LEARNING_RATES: ClassVar[LearningRates] = LearningRates(2e-7, 2e-6, "SWEET-RL paper's one published rate, "
                                                            "2e-7, full fine-tuning (no critic rate of its own); "
                                                            "LoRA: 10x, the usual LoRA rule")
    output_dir: str = field(default="runs/critic", metadata={"help": "checkpoints, metrics, final/ and critic_config.json"})
    learning_rate: float | None = lr_field(LEARNING_RATES)
    num_epochs: int = field(default=4, metadata={"help": "passes over the training pairs (paper: 4)"})
    batch_size: int = field(default=8, metadata={"help": "trajectory pairs per optimiser step across processes (paper: 8)"})
    micro_batch_size: int = field(default=1, metadata={"help": "pairs per forward pass per process (all their turns in one batch)"})
    save_steps: int = field(default=0, metadata={"help": "also checkpoint every N optimiser steps (0: at each epoch end only)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.save_steps < 0:
            raise ValueError(f"CriticTrainConfig.save_steps must be >= 0, got {self.save_steps}")


# ---- data --------------------------------------------------------------------------------


@dataclass
class CriticData:
    """Every turn once, indexed. Episodes are numbered 0..E-1.

    turns:         every agent turn of every paired episode, then (centred critic) the
                   baseline actions that are not among them.
    episode_turns: episode -> indices into `turns`, in turn order.
    train_pairs / eval_pairs: (chosen episode, rejected episode).
    baseline:      centred critic: episode turn -> K indices into `turns` of its baseline
                   actions (sweet/critic/baseline.py); None: the paper's uncentred A.
    """

    turns: list[CriticTurn]
    episode_turns: list[list[int]]
    train_pairs: list[tuple[int, int]]
    eval_pairs: list[tuple[int, int]]
    baseline: list[list[int]] | None = None


def _load_all(paths: str, env: str, strict: bool = False, agent_prompt: str | None = None) -> list:
    """The episodes of a comma list of files; unusable tasks' episodes and rows are skipped
    (one warning each file) unless `strict` (--strict_tasks). They must be of one agent
    prompt file, the critic's --agent_prompt (and one simulator prompt):
    colbench.prompts.check_recorded_prompts."""
    episodes = []
    for p in [p.strip() for p in paths.split(",") if p.strip()]:
        episodes.extend(load_episodes(p, env=env, on_error="raise" if strict else "skip", usable_only=True))
    check_recorded_prompts(episodes, env, agent_prompt, paths)
    return episodes


def _pairs(cfg: CriticConfig, episodes: list, source: str) -> list:
    pairs = make_trajectory_pairs(episodes, cfg.success_threshold, cfg.min_reward_gap, cfg.pairing_rule)
    if not pairs:
        groups = group_by_task(episodes)
        good = sum(max(e.reward for e in g) >= cfg.success_threshold for g in groups.values())
        raise ValueError(
            f"{source}: no trajectory pairs from {len(episodes)} episodes over {len(groups)} tasks "
            f"({good} tasks reach success_threshold={cfg.success_threshold}; {cfg.pairing_rule} pairing: a pair also "
            f"needs another episode of the same task with a reward {cfg.min_reward_gap:g} or more apart)"
        )
    return pairs


def build_data(cfg: CriticConfig, tokenizer, seed: int, view: ScreenshotView | None = None,
               max_length: int | None = None) -> CriticData:
    """Episodes -> pairs -> train/held-out split (by task) -> without the pairs that hold an
    action too long for `max_length` -> at most `max_pairs` -> indexed turn examples (a
    vision-language critic's `view` reads each action's text in its tokenizer).

    A pair is trained whole or not at all: an episode with an action that does not fit
    (actions are never cut: A is a mean over the whole action, and a trajectory's score
    the sum over all its turns) drops every pair it is in, train and held-out alike, with
    one warning line per file (`sweet.core.tokens.skip_long_actions`), before any step."""

    if not cfg.episodes:
        raise ValueError("--episodes is required (episode JSONL file(s))")
    pairs = _pairs(cfg, _load_all(cfg.episodes, cfg.env, cfg.strict_tasks, cfg.agent_prompt), cfg.episodes)
    if cfg.eval_episodes:
        eval_pairs = _pairs(cfg, _load_all(cfg.eval_episodes, cfg.env, cfg.strict_tasks, cfg.agent_prompt), cfg.eval_episodes)
    else:
        tasks = sorted({p.task_id for p in pairs})
        random.Random(seed).shuffle(tasks)
        n_eval = min(len(tasks) - 1, math.ceil(cfg.eval_fraction * len(tasks))) if cfg.eval_fraction > 0 else 0
        held = set(tasks[:n_eval])
        eval_pairs = [p for p in pairs if p.task_id in held]
        pairs = [p for p in pairs if p.task_id not in held]
    examples = _examples_of(cfg, tokenizer, view)

    def actions(pair):
        return [(agent_turn(ep.episode_id, ex.state.turn_index), len(ex.action_ids))
                for ep in (pair.chosen, pair.rejected) for ex in examples(ep)]

    pairs = skip_long_actions(pairs, actions, max_length, source=cfg.episodes, what="trajectory pairs")
    eval_pairs = skip_long_actions(eval_pairs, actions, max_length, source=cfg.eval_episodes or cfg.episodes,
                                   what="held-out trajectory pairs")
    if not pairs:
        raise ValueError(f"{cfg.episodes}: no trajectory pair left to train on: each holds an action too long for "
                         f"max_length={max_length} (see the warning above); raise --max_length")
    if cfg.max_pairs and len(pairs) > cfg.max_pairs:
        pairs = random.Random(seed).sample(pairs, cfg.max_pairs)
    index: dict[int, int] = {}  # id(episode) -> episode number
    turns: list[CriticTurn] = []
    episode_turns: list[list[int]] = []

    def number(ep) -> int:
        if id(ep) not in index:
            index[id(ep)] = len(episode_turns)
            episode_turns.append(list(range(len(turns), len(turns) + len(examples(ep)))))
            turns.extend(examples(ep))
        return index[id(ep)]

    train = [(number(p.chosen), number(p.rejected)) for p in pairs]
    held_out = [(number(p.chosen), number(p.rejected)) for p in eval_pairs]
    return CriticData(turns, episode_turns, train, held_out)


def one_pass_line(data: CriticData, ccfg: CriticConfig, mcfg: ModelConfig, tokenizer, view) -> str:
    """How critic_batch will run the data's trajectories (sweet.core.tokens.one_pass_summary);
    a vision-language critic's turns each see another screenshot: one row per turn."""
    if view is not None:
        return f"critic: {len(data.turns)} turns as rows of their own (a vision-language critic: a screenshot per turn)"
    context = partial(critic_context_ids, tokenizer, header=ccfg.header, training_info=ccfg.training_info,
                      template=ccfg.context_template())
    return one_pass_summary(([(context(data.turns[t].state), data.turns[t].action_ids) for t in turns]
                             for turns in data.episode_turns), mcfg.max_length, source="critic")


def _examples_of(cfg: CriticConfig, tokenizer, view: ScreenshotView | None):
    """episode -> its CriticTurns (`episode_turn_examples`, with its task's c), each episode
    built once; an episode without its task's c, or without agent turns, is an error naming it."""
    info = load_training_info(cfg.tasks, cfg.env, strict=cfg.strict_tasks) if cfg.tasks and cfg.training_info else {}
    info_of = training_info_fn(cfg.env) if cfg.training_info else None
    built: dict[int, list[CriticTurn]] = {}  # id(episode) -> its examples

    def examples(ep) -> list[CriticTurn]:
        if id(ep) not in built:
            if not cfg.training_info:  # the ablation: the critic never sees c
                info[ep.task_id] = ""
            if ep.task_id not in info and "task" in ep.meta:  # published trajectories carry their task
                info[ep.task_id] = info_of(Task.from_json(ep.meta["task"]))
            if ep.task_id not in info and not cfg.tasks:
                raise ValueError(f"--tasks is required: episode {ep.episode_id} does not carry its task "
                                 "(give the task file the episodes ran on: the source of training-time information)")
            if ep.task_id not in info:
                raise ValueError(f"task {ep.task_id!r} (episode {ep.episode_id}) is not in --tasks {cfg.tasks}")
            built[id(ep)] = episode_turn_examples(ep, info[ep.task_id], tokenizer, cfg.tokenize_missing_actions, view)
            if not built[id(ep)]:
                raise ValueError(f"episode {ep.episode_id} has no agent turns")
        return built[id(ep)]

    return examples


# ---- forward passes ------------------------------------------------------------------------


def sharded_action_sums(accelerator, model, tokenizer, turns: list[CriticTurn], indices: list[int],
                        mcfg: ModelConfig, ccfg: CriticConfig, desc: str = "", view: ScreenshotView | None = None) -> Any:
    """Σ_{y ∈ a_t} log π(y | o_t, c) (value head: Σ v) for turns[indices], no grad, split
    over processes (sweet.core.nograd_pass.sharded_scores, the turns of one trajectory next to
    one another, so that they pack into one row, and trajectories of similar length together:
    less padding); every process gets all values, float64 [len(indices)]."""
    import torch

    template = ccfg.context_template()

    def score(positions: list[int]) -> list[float]:
        batch = critic_batch(tokenizer, [turns[indices[p]] for p in positions], ccfg.header, mcfg.max_length,
                             mcfg.keep_head, ccfg.training_info, template, view).to(accelerator.device)
        return action_sums(model, batch, ccfg.head).double().tolist()

    longest: dict[str, int] = {}
    for i in indices:
        key = turns[i].state.episode_id
        longest[key] = max(longest.get(key, 0), _length_key(turns[i]))
    order = sorted(range(len(indices)), key=lambda p: (longest[turns[indices[p]].state.episode_id],
                                                       turns[indices[p]].state.episode_id,
                                                       turns[indices[p]].state.turn_index))
    values = sharded_scores(accelerator, model, len(indices), score, micro=ccfg.eval_batch_size, order=order,
                            desc=desc)
    return torch.tensor(values, dtype=torch.float64, device=accelerator.device)


def _length_key(ex: CriticTurn) -> int:
    return sum(len(str(m.get("content", ""))) for m in ex.state.prompt) + len(ex.action_ids)


def reference_logprobs(accelerator, model, tokenizer, data: CriticData, ccfg: CriticConfig, mcfg: ModelConfig,
                       output_dir: Path, view: ScreenshotView | None = None) -> Any:
    """π_ref sums per turn, from the run's reference cache when it holds these turns, else
    computed once with the initial model (LoRA: adapters disabled) and cached. The value
    head has no π_ref: zeros."""
    import contextlib
    import hashlib

    import torch

    if ccfg.head == "value":
        return torch.zeros(len(data.turns), dtype=torch.float64, device=accelerator.device)
    digest = hashlib.sha256("".join(t.fingerprint() for t in data.turns).encode()).hexdigest()
    settings = {
        "model": mcfg.model, "dtype": mcfg.dtype, "max_length": mcfg.max_length, "keep_head": mcfg.keep_head,
        "header": ccfg.header, "training_info": ccfg.training_info, "turns": digest,
        "truncation": "keeps the first message"}  # critic_batch: cached sums of the earlier head rule are stale
    if view is not None:  # the screenshots' size changes every log-prob
        settings["vision"] = {"max_pixels": view.max_pixels, "min_pixels": view.min_pixels}
    context = ccfg.context_prompt()
    if context is not None and not context.is_default:  # our file's text is the header note: old caches stay valid
        settings["context_prompt"] = context.sha256
    cache = ReferenceCache(output_dir / REFERENCE_CACHE, settings)
    cached = cache.load(len(data.turns), accelerator.print)
    if cached is not None:
        return cached.to(accelerator.device)
    unwrapped = accelerator.unwrap_model(model)
    ctx = unwrapped.disable_adapter() if hasattr(unwrapped, "disable_adapter") else contextlib.nullcontext()
    with ctx:
        sums = sharded_action_sums(accelerator, model, tokenizer, data.turns, list(range(len(data.turns))), mcfg,
                                   ccfg, desc="π_ref log-probs", view=view)
    if accelerator.is_main_process:
        cache.save(sums)
    accelerator.wait_for_everyone()
    return sums


def turn_advantages(logp, ref_sums, data: CriticData, turn_idx: list[int], needed: list[int], ccfg: CriticConfig):
    """A of `turn_idx` (centred by their baselines when the critic is) from `logp`, the Σ over
    a of log π_θ (value head: of v) of `needed` = turn_idx + their baseline turns, [len(needed)]."""
    import torch

    n_tokens = torch.tensor([len(data.turns[t].action_ids) for t in needed], device=logp.device, dtype=logp.dtype)
    adv = per_turn_advantage(logp, ref_sums[needed], n_tokens, ccfg.beta, ccfg.length_normalize)
    if data.baseline is None:
        return adv
    pos = {t: i for i, t in enumerate(needed)}
    base = torch.tensor([[pos[b] for b in data.baseline[t]] for t in turn_idx], device=logp.device)
    return centred(adv, base)


def needed_turns(data: CriticData, turn_idx: list[int]) -> list[int]:
    """`turn_idx` first, then the baseline turns they need that are not among them."""
    if data.baseline is None:
        return list(turn_idx)
    seen, extra = set(turn_idx), []
    for t in turn_idx:
        for b in data.baseline[t]:
            if b not in seen:
                seen.add(b)
                extra.append(b)
    return list(turn_idx) + extra


@dataclass(frozen=True)
class PairTurns:
    """The turns a set of trajectory pairs is scored on.

    episodes:   the pairs' episodes, sorted; scores are indexed by position in this list.
    turns:      their turns, episode by episode, in turn order.
    needed:     `turns`, then the baseline turns they need (centred critic): what a
                forward pass scores.
    episode_of: for each of `turns`, its episode's position in `episodes`.
    chosen / rejected: per pair, the positions of its two episodes.
    """

    episodes: list[int]
    turns: list[int]
    needed: list[int]
    episode_of: list[int]
    chosen: list[int]
    rejected: list[int]

    @classmethod
    def of(cls, data: CriticData, pairs: list[tuple[int, int]]) -> "PairTurns":
        episodes = sorted({e for pair in pairs for e in pair})
        slot = {e: k for k, e in enumerate(episodes)}
        turns = [t for e in episodes for t in data.episode_turns[e]]
        episode_of = [slot[e] for e in episodes for _ in data.episode_turns[e]]
        return cls(episodes, turns, needed_turns(data, turns), episode_of, [slot[c] for c, _ in pairs],
                   [slot[r] for _, r in pairs])

    def per_episode(self, values):
        """Σ over each episode's turns of per-turn `values` [len(turns)] -> [len(episodes)]."""
        import torch

        index = torch.tensor(self.episode_of, device=values.device)
        return trajectory_scores(values, index, len(self.episodes))

    def scores(self, logp, ref_sums, data: CriticData, ccfg: CriticConfig):
        """score(τ) = Σ_t A(o_t, a_t, c) per episode [len(episodes)], from `logp`, the Σ over
        a of log π_θ (value head: of v) of `needed` (A centred when the critic is)."""
        return self.per_episode(turn_advantages(logp, ref_sums, data, self.turns, self.needed, ccfg))


def pair_terms(model, tokenizer, data: CriticData, ref_sums, pairs: list[tuple[int, int]], ccfg: CriticConfig,
               mcfg: ModelConfig, device, view: ScreenshotView | None = None) -> tuple[Any, Any, Any]:
    """One forward over every turn of the pairs' episodes (and their baseline actions).
    Returns per pair [P]: L_BT, NLL of the chosen trajectory's actions (token mean; 0 for
    the value head), and the margin."""
    import torch

    pt = PairTurns.of(data, pairs)
    batch = critic_batch(tokenizer, [data.turns[t] for t in pt.needed], ccfg.header, mcfg.max_length,
                         mcfg.keep_head, ccfg.training_info, ccfg.context_template(), view)
    logp = action_sums(model, batch.to(device), ccfg.head)  # Σ over a_t of log π_θ (value head: of v)
    scores = pt.scores(logp, ref_sums, data, ccfg)
    chosen, rejected = scores[pt.chosen], scores[pt.rejected]
    bt, _ = bradley_terry_loss(chosen, rejected)
    if ccfg.head == "value":
        nll = torch.zeros(len(pairs), device=device)
    else:
        n_tokens = torch.tensor([len(data.turns[t].action_ids) for t in pt.turns], device=device, dtype=logp.dtype)
        nll = (-pt.per_episode(logp[:len(pt.turns)]) / pt.per_episode(n_tokens))[pt.chosen]
    return bt, nll, (chosen - rejected).detach()


def evaluate(accelerator, model, tokenizer, data: CriticData, ref_sums, ccfg: CriticConfig,
             mcfg: ModelConfig, view: ScreenshotView | None = None) -> dict[str, float]:
    """Held-out pairwise accuracy and mean margin."""
    if not data.eval_pairs:
        return {}
    pt = PairTurns.of(data, data.eval_pairs)
    logp = sharded_action_sums(accelerator, model, tokenizer, data.turns, pt.needed, mcfg, ccfg, view=view)
    scores = pt.scores(logp, ref_sums, data, ccfg)
    acc, margin = pair_accuracy_and_margin(scores[pt.chosen], scores[pt.rejected])
    return {"critic/pair_accuracy": acc, "critic/margin": margin}


# ---- the loop -------------------------------------------------------------------------------


def critic_loss_fn(data: CriticData, ref_sums, ccfg: CriticConfig, mcfg: ModelConfig, tokenizer, device,
                   view: ScreenshotView | None = None):
    """The trainer's loss hook: Σ over the micro-batch's pairs of L_BT + nll_coef·NLL,
    and metric sums (the skeleton divides both by the step's pair count)."""

    def loss_fn(model, idx):
        pairs = [data.train_pairs[i] for i in idx]
        bt, nll, margin = pair_terms(model, tokenizer, data, ref_sums, pairs, ccfg, mcfg, device, view)
        metrics = {"loss/bt": bt.detach().sum().item(), "loss/nll": nll.detach().sum().item(),
                   "critic/train_accuracy": (margin > 0).sum().item()}
        return (bt + ccfg.nll_coef * nll).sum(), metrics

    return loss_fn


def attach_baselines(data: CriticData, ccfg: CriticConfig, mcfg: ModelConfig, tokenizer, out: Path, seed: int) -> None:
    """The centred critic's baseline actions (sweet/critic/baseline.py): sampled once by the
    main process (kept in output_dir, resumable), read by every process, indexed into `data`."""
    from sweet.core.trainer import process_state

    proc = process_state()
    sampler = ccfg.baseline_sampler or "hf:" + resolve_model_path(mcfg.model)
    args = (data.turns, sampler, ccfg.baseline_samples_per_state, ccfg.baseline_max_new_tokens,
            int(tokenizer.eos_token_id), out, seed)
    if proc.is_main_process:
        sample_baselines(*args, dtype=mcfg.dtype)
    proc.wait_for_everyone()
    samples = sample_baselines(*args, dtype=mcfg.dtype)  # every state is there now: nothing is drawn
    n = len(data.turns)
    data.baseline = baseline_index(data.turns, n, samples)
    same = sum(all(data.turns[b].action_ids == data.turns[t].action_ids for b in row)
               for t, row in enumerate(data.baseline))
    proc.print(f"critic: centred by {ccfg.baseline_samples_per_state} samples of {sampler} per turn; {same} of {n} "
               f"turns' samples all equal the action taken (their centred advantage is 0); {len(data.turns) - n} "
               "other baseline actions scored")


def screenshot_view(mcfg: ModelConfig, ccfg: CriticConfig, out: Path) -> ScreenshotView | None:
    """A vision-language --model's view of the turns (sweet/critic/vision.py), pages rendered
    into output_dir/renders; None for a text model."""
    from colbench.scoring.render import RenderCache
    from sweet.core.models import is_vision_model
    from sweet.critic.vision import load_processor

    if not is_vision_model(mcfg.model):
        return None
    if ccfg.env != "frontend":
        raise ValueError(f"--model {mcfg.model}: a vision-language critic judges rendered pages: it needs --env "
                         f"frontend, got {ccfg.env!r}")
    if ccfg.baseline_samples_per_state:
        raise ValueError("--baseline_samples_per_state needs a text critic (its samples come from the critic's "
                         "own model, which here is a vision-language model, not the policy)")
    return ScreenshotView(load_processor(mcfg.model), RenderCache(out / "renders"), ccfg.max_pixels, ccfg.min_pixels)


def prefetch_screenshots(view: ScreenshotView, data: CriticData, ccfg: CriticConfig) -> None:
    """Render every page the turns show, in the main process first (each page once, into
    the shared cache folder); the other processes then read the PNGs."""
    from sweet.core.trainer import process_state

    proc = process_state()
    pages = sorted({h for t in data.turns for h in view.pages(t.state, t.action_ids, ccfg.training_info) if h is not None})
    if proc.is_main_process:
        failed = sum(not r.ok for r in view.renders.render(pages))
        proc.print(f"critic: {len(pages)} distinct pages ({view.renders.rendered} rendered now, {failed} failed)")
    proc.wait_for_everyone()
    view.renders.render(pages)


def _value_model(mcfg: ModelConfig):
    """θ for head='value': the initial LM (LoRA-wrapped when asked) + a zero value head."""
    from sweet.core.value_head import ValueHeadModel

    return ValueHeadModel(load_model(mcfg, trainable=True))


def main(mcfg: ModelConfig, tcfg: CriticTrainConfig, ccfg: CriticConfig) -> dict[str, float]:
    """Train the critic on the trainer skeleton (sweet/core/trainer.py); returns the last
    held-out metrics. Rerunning resumes from the last checkpoint (accelerate state)."""
    out = Path(tcfg.output_dir)
    if ccfg.baseline_samples_per_state:  # the baseline samples are this run's own: refused, not skipped
        check_action_room(ccfg, "baseline_max_new_tokens", mcfg)
    if begin_run(out, {"critic": ccfg, "model": mcfg, "train": tcfg}, resume=tcfg.resume) is not None:
        print(f"{out} holds a finished critic: not retraining (use a new output_dir or --resume false)")
        return json.loads((out / "final_metrics.json").read_text())
    view = screenshot_view(mcfg, ccfg, out)
    tokenizer = view.tokenizer if view is not None else load_tokenizer(mcfg.model)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"model {mcfg.model!r}: tokenizer has no eos token (needed to end every action)")
    data = build_data(ccfg, tokenizer, tcfg.seed, view, mcfg.max_length)
    if view is not None:
        prefetch_screenshots(view, data, ccfg)
    if ccfg.baseline_samples_per_state:
        attach_baselines(data, ccfg, mcfg, tokenizer, out, tcfg.seed)
    set_seed(tcfg.seed)  # the initial model (LoRA adapters) is rebuilt identically on a resume
    trainer = Trainer(mcfg, tcfg, tokenizer, model=_value_model(mcfg) if ccfg.head == "value" else None,
                      run_config=resolved_config(critic=ccfg, model=mcfg, train=tcfg), name="critic")
    trainer.prepare(trainer.steps_per_epoch(len(data.train_pairs)) * tcfg.num_epochs)
    acc = trainer.accelerator
    # π_ref from the initial model, before `fit` restores a checkpoint
    ref_sums = reference_logprobs(acc, trainer.model, tokenizer, data, ccfg, mcfg, out, view)
    if acc.is_main_process:
        save_resolved_config(out, critic=ccfg, model=mcfg, train=tcfg)
        print(f"critic: {len(data.train_pairs)} training pairs, {len(data.eval_pairs)} held-out pairs, "
              f"{len(data.turns)} turns; {trainer.steps_per_epoch(len(data.train_pairs))} steps/epoch x "
              f"{tcfg.num_epochs} epochs; {trainer.world} process(es) ({acc.distributed_type.value}) x {trainer.accum} "
              "accumulation step(s)\n" + one_pass_line(data, ccfg, mcfg, tokenizer, view))
    metrics: dict[str, float] = {}

    def on_epoch_end(epoch: int) -> dict[str, float]:
        metrics.clear()
        metrics.update(evaluate(acc, trainer.model, tokenizer, data, ref_sums, ccfg, mcfg, view))
        if metrics:
            acc.print(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        return dict(metrics)

    loss_fn = critic_loss_fn(data, ref_sums, ccfg, mcfg, tokenizer, acc.device, view)
    trainer.fit(list(range(len(data.train_pairs))), loss_fn, save_steps=tcfg.save_steps, save_every_epoch=True,
                on_epoch_end=on_epoch_end)
    if not metrics:
        metrics.update(evaluate(acc, trainer.model, tokenizer, data, ref_sums, ccfg, mcfg, view))
    if acc.is_main_process:
        value_lora = ccfg.head == "value" and mcfg.lora  # the adapter and the head both in final/
        CriticRecord(beta=ccfg.beta, length_normalize=ccfg.length_normalize, header=ccfg.header,
                     reference_model=resolve_local(mcfg.model), eos_token_id=tokenizer.eos_token_id, lora=mcfg.lora,
                     adapter_dir=("final" if value_lora else "final-adapter") if mcfg.lora else None, dtype=mcfg.dtype,
                     max_length=mcfg.max_length, keep_head=mcfg.keep_head, env=ccfg.env, head=ccfg.head,
                     training_info=ccfg.training_info, context_template=ccfg.context_template(), context_rule="splice",
                     context_prompt=context.record() if (context := ccfg.context_prompt()) else None,
                     vision=({"max_pixels": view.max_pixels, "min_pixels": view.min_pixels} if view else None)).save(out)
        if view is not None:  # the scorer loads the processor from final/
            view.processor.save_pretrained(out / "final")
        atomic_write(out / "final_metrics.json", json.dumps(metrics, indent=2))
        mark_finished(out, final="final", step=trainer.step)  # last: critic_config.json and metrics exist
    acc.wait_for_everyone()
    return dict(metrics)


@dataclass
class CriticModelConfig(ModelConfig):
    """ModelConfig whose `--model` is also `--critic_model` (the critic's own model: a text LM,
    or for the frontend a vision-language one)."""

    model: str = field(default="tiny", metadata={
        "help": "the critic's initial model (also π_ref): 'tiny', 'hf:<path or hub id>' or a path; a vision-language "
                "model (Qwen2-VL; 'tiny-vl') makes the frontend critic read screenshots (sweet/critic/vision.py)",
        "aliases": ["--critic_model"]})


CONFIGS = (CriticModelConfig, CriticTrainConfig, CriticConfig)


def cli(argv: list[str] | None = None) -> dict[str, float]:
    """`python -m sweet.train_critic`: parse the command line, then `main(*configs)`."""
    configs = parse_configs(CONFIGS, argv, description="SWEET-RL stage 1: per-turn advantage critic (Bradley-Terry)")
    with trainer_run(configs[1].output_dir, command="python -m sweet.train_critic"):
        return main(*configs)
