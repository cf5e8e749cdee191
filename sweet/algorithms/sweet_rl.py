"""SWEET-RL stage 2: per-turn DPO on candidate actions ranked by the stage-1 critic.

For every agent turn of the input episodes (a State: the recorded prompt o_t):
1. sample K candidate actions (default 16) from the state's prompt with any engine
   (`--sampler`, default the policy's initial model) at temperature 1;
2. score each with the critic, A(o_t, a, c) (sweet.critic.model.TrainedCritic, conditioned
   exactly as in critic training); `--critic oracle` (test bed only) is a diagnostic:
   the test bed's exact advantage (testbed/oracle.py), to tell a wrong critic from
   a stage 2 that cannot use a right one;
3. pair a random candidate of the top half with a random one of the bottom half,
   `pairs_per_state` times (states whose candidates all tie are skipped and counted;
   a drawn pair with equal scores is dropped);
4. train with DPO (sweet/algorithms/losses.py) on the action tokens only, NLL on the chosen action
   (per token), reference log-probs precomputed with the initial policy; a pair with a
   candidate that does not fit `--max_length` (actions are never cut; the candidates file
   may come from a run with another --max_length, or a --max_new_tokens as long) is
   skipped before any step, with one warning line (`sweet.core.tokens.skip_long_actions`),
   the state's other pairs kept; a state's context alone always fits (cut in the middle);
5. optionally (`--anchor_coef`, not in the paper) each pair also carries one anchor: a
   candidate of a state whose candidates all tie (round-robin over those states), trained
   with NLL, an estimate of KL(π_0‖π_θ) there. Those states give DPO no pair, so nothing
   else holds the policy at them; on the test bed they are the last turns, whose answers
   share tokens with the early answers the pairs push down (docs/testbed.md). A tied
   state whose anchor does not fit `--max_length` is no anchor (skipped the same way).
Paper defaults: lr 2e-7 (full fine-tuning; with --lora 2e-6: the papers give no LoRA rate,
10x is the usual rule), β 0.1, NLL coefficient 0.01, batch 8, 1 epoch, K = 16 candidates,
4 pairs per state, the first 10% of the episodes file (`--episode_fraction 0.1`; the
test bed, testbed/pipeline.py, gives its own `--max_episodes`).

Candidates and scores go to output_dir/candidates.jsonl one state per line, flushed
per batch of states: a rerun skips states already there (the candidate cache,
sweet/algorithms/sweet_candidates.py). Candidates are trained on
as sampled: context = the sampler's prompt ids (else the state's recorded ids, else the
chat template), action = the generated ids + eos (no eos when cut at max_new_tokens).
The sampler must share the policy's tokenizer (its ids are trained on).
`--reuse_candidates RUN/candidates.jsonl` (not in the paper) scores the samples another run drew with the
same sampler, K, temperature, top_p, max_new_tokens and seed (checked against its
candidates.settings.json) instead of drawing them again: the critic ablations of
testbed/learning.py then rank the very same candidates, and each still counts them.

`--rounds R` (R > 1) repeats stage 2 with new episodes and a retrained critic:
sweet/workflows/rounds.py. The paper trains one round.

    # CPU, tiny model (critic from `python -m sweet.train_critic ... --output_dir runs/critic-tiny`)
    python -m sweet.train_policy --algorithm sweet --episodes eps.jsonl --tasks tasks.jsonl \\
        --critic runs/critic-tiny --model tiny --candidates_per_state 4 --max_new_tokens 32 \\
        --output_dir runs/sweet-tiny --micro_batch_size 4

    # Llama-3.1-8B on 8 GPUs: sample with vLLM in one process, then train LoRA with accelerate
    # (the paper's settings by default; LoRA's lr 2e-6 = 10x the paper's full fine-tuning 2e-7)
    python -m sweet.train_policy --algorithm sweet --stage sample --episodes eps.jsonl --tasks tasks.jsonl \\
        --critic runs/critic-8b --model hf:meta-llama/Llama-3.1-8B-Instruct \\
        --sampler vllm:meta-llama/Llama-3.1-8B-Instruct --sampler_tensor_parallel 8 --output_dir runs/sweet-8b
    accelerate launch --num_processes 8 -m sweet.train_policy --algorithm sweet --stage train \\
        --episodes eps.jsonl --tasks tasks.jsonl --critic runs/critic-8b --lora \\
        --model hf:meta-llama/Llama-3.1-8B-Instruct --micro_batch_size 1 --output_dir runs/sweet-8b
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

from colbench.episodes import load_episodes
from colbench.prompts import check_prompt_flags, check_recorded_prompts
from colbench.tasks import load_tasks
from sweet.algorithms.policy_trainer import PolicyTrainConfig, finished_run, train_dpo
# CANDIDATES_FILE, SAMPLING_FILE (the run's files) and read_candidates are re-exported for callers;
# CandidateConfig (K, the sampler) and CandidateRanker (what the critic offers) live with the candidate cache
from sweet.algorithms.sweet_candidates import (CANDIDATES_FILE, SAMPLING_FILE, CandidateCache,  # noqa: F401
                                              CandidateConfig, CandidateRanker, sampling_settings)
from sweet.algorithms.losses import LOSS_TYPES, loss_type_field
from sweet.core.config import (LearningRates, ModelConfig, agent_prompt_field, check_choice, check_range, lr_field,
                               save_resolved_config, strict_tasks_field)
from sweet.core.models import load_tokenizer
from sweet.core.records import Candidate, CandidatesRow, Pair, State, episode_states, state_key
# stage 2's ranking and pairing (top half vs bottom half) live with the records, re-exported here
from sweet.core.records import make_action_pairs, rank_halves, read_candidates  # noqa: F401
from sweet.core.tokens import Segment, action_ids, agent_turn, context_ids, eos_id, skip_long_actions
from sweet.core.trainer import process_state
from sweet.critic.model import CriticRecord, TrainedCritic, load_training_info

STAGES = ("all", "sample", "train")
CRITIC_RENDERS = "critic_renders"  # a vision-language critic's screenshots of the candidates, by content
ORACLE_CRITIC = "oracle"  # --critic oracle: testbed/oracle.py instead of a critic dir
# the lab's oracle and its tasks' bed, "module:Name" loaded on use (colbench.registry): sweet imports no test bed
ORACLE_RANKER = "testbed.oracle:OracleCritic"
ORACLE_TASK_DESIGN = "testbed.bed:task_design"


@dataclass
class SweetConfig:
    """The states, the critic that ranks their candidates, the pairs and the per-turn DPO loss."""

    episodes: str = field(default="", metadata={"help": "episodes JSONL whose agent turns become states"})
    tasks: str = field(default="", metadata={"help": "tasks file (or builtin:<split>) holding the training-time information c"})
    env: str = field(default="backend", metadata={"help": "environment name (training_info, offline trajectory format)"})
    episode_fraction: float = field(default=0.1, metadata={"help": "use the first share of the episodes file (paper: "
                                                                   "0.1, the first 10 percent of its 15k offline "
                                                                   "trajectories; 1: all)"})
    max_episodes: int | None = field(default=None, metadata={"help": "use the first N episodes instead of "
                                                                     "episode_fraction"})
    critic: str = field(default="", metadata={"help": "stage-1 critic dir (output_dir of python -m sweet.train_critic); "
                                                      "'oracle' (--env testbed): a diagnostic, the test bed's exact advantage, "
                                                      "to tell a wrong critic from a stage 2 that cannot use a right one"})
    stage: str = field(default="all", metadata={"help": "all | sample (candidates + scores only) | train (candidates must exist)"})
    pairs_per_state: int = field(default=4, metadata={"help": "top-half vs bottom-half pairs drawn per state (paper: 4)"})
    beta: float = field(default=0.1, metadata={"help": "DPO β (paper: 0.1)"})
    loss_type: str = loss_type_field()
    nll_coef: float = field(default=0.01, metadata={"help": "α: weight of the chosen action's per-token NLL (paper: 0.01)"})
    anchor_coef: float = field(default=0.0, metadata={
        "help": "α_anchor: weight of the per-token NLL of one anchor action per pair, drawn round-robin from the "
                "states whose candidates all tie (an estimate of KL(π_0||π) where the critic ranks nothing; "
                "not in the paper: 0)"})
    strict_tasks: bool = strict_tasks_field()
    agent_prompt: str | None = agent_prompt_field()

    def __post_init__(self) -> None:
        for name in ("beta", "nll_coef", "anchor_coef"):
            check_range(self, name)  # finite
        check_choice(self, "loss_type", LOSS_TYPES)
        check_range(self, "max_episodes", low=1)
        for name in ("episodes", "tasks"):
            if not getattr(self, name):
                raise ValueError(f"SweetConfig.{name} is required: give --{name}")
        if self.stage not in STAGES:
            raise ValueError(f"SweetConfig.stage must be one of {STAGES}, got {self.stage!r}")
        if not 0 < self.episode_fraction <= 1:
            raise ValueError(f"SweetConfig.episode_fraction must be in (0, 1], got {self.episode_fraction}")
        if self.pairs_per_state < 1:
            raise ValueError(f"SweetConfig.pairs_per_state must be >= 1, got {self.pairs_per_state}")
        if self.beta <= 0 or self.nll_coef < 0 or self.anchor_coef < 0:
            raise ValueError("SweetConfig: beta must be > 0, nll_coef and anchor_coef >= 0")
        check_prompt_flags(self.env, None, self.agent_prompt, None)  # a bad file: PromptError, one line


@dataclass
class SweetTrainConfig(PolicyTrainConfig):
    output_dir: str = field(default="runs/sweet", metadata={"help": "checkpoints, candidates, metrics and the resolved config"})
    LEARNING_RATES: ClassVar[LearningRates] = LearningRates(2e-7, 2e-6, "SWEET-RL paper: 2e-7, full fine-tuning of Llama-3.1-8B; the papers give no LoRA rate: 10x, the usual LoRA rule")
    learning_rate: float | None = lr_field(LEARNING_RATES)


CONFIGS = (ModelConfig, SweetTrainConfig, SweetConfig, CandidateConfig)


# ---- states: the dialogue prefixes, with the training-time information c ----------------------


def first_episodes(episodes: Sequence, cfg: SweetConfig) -> list:
    """Stage 2's share of the episodes file, from its start: the first `max_episodes`,
    else the first ceil(episode_fraction x all) (paper: the first 10%)."""
    n = cfg.max_episodes if cfg.max_episodes is not None else math.ceil(cfg.episode_fraction * len(episodes))
    return list(episodes[:n])


def load_states(cfg: SweetConfig) -> list[State]:
    """One State per agent turn of the episodes, with the task's training-time information."""

    on_error = "raise" if cfg.strict_tasks else "skip"
    episodes = first_episodes(load_episodes(cfg.episodes, env=cfg.env, on_error=on_error, usable_only=True), cfg)
    # candidates are sampled at the recorded prompts: they must be of one agent prompt, --agent_prompt's
    check_recorded_prompts(episodes, cfg.env, cfg.agent_prompt, cfg.episodes)
    unusable: set[str] = set()
    info = load_training_info(cfg.tasks, env=cfg.env, strict=cfg.strict_tasks, unusable=unusable)
    episodes = [ep for ep in episodes if ep.task_id not in unusable]  # no reference to learn from (warned)
    missing = sorted({ep.task_id for ep in episodes} - set(info))
    if missing:
        raise ValueError(f"{cfg.episodes}: tasks {missing[:5]} are not in --tasks {cfg.tasks}")
    return [s for ep in episodes for s in episode_states(ep, info[ep.task_id])]


# ---- the critic that scores the candidates ----------------------------------------------------


def load_ranker(model_cfg: ModelConfig, cfg: SweetConfig, render_dir: Path | None = None) -> CandidateRanker:
    """The critic `--critic` names: a stage-1 critic dir, or `oracle` (`load_oracle_ranker`).
    A vision-language critic reads each candidate as the policy's text (decoded with the
    policy's tokenizer) and renders its page once per content into `render_dir`."""
    if not cfg.critic:
        raise ValueError("SweetConfig.critic is required to score candidates: give --critic <critic dir>")
    if cfg.critic == ORACLE_CRITIC:
        return load_oracle_ranker(model_cfg, cfg)
    if CriticRecord.load(cfg.critic).vision is None:
        return TrainedCritic.load(cfg.critic)
    return TrainedCritic.load(cfg.critic, action_tokenizer=load_tokenizer(model_cfg.model), render_dir=render_dir)


def token_pair(tokenizer, pair: Pair[Candidate], prompt_token_ids: Sequence[int] | None) -> Pair:
    """The DPO example of an action pair: both actions in the context they were sampled from."""

    ctx = context_ids(tokenizer, prompt_token_ids if prompt_token_ids is not None else pair.state.prompt_token_ids,
                      pair.state.prompt)
    eos = eos_id(tokenizer)
    seg = lambda c: Segment(ctx, action_ids(c.token_ids, eos, c.finish_reason))  # noqa: E731
    return Pair((seg(pair.chosen),), (seg(pair.rejected),), pair.task_id, pair.state)


def candidate_length(tokenizer, cand: Candidate) -> int:
    """The tokens of a candidate's action as trained (`action_ids`: + eos where the model ended)."""
    return len(action_ids(cand.token_ids, eos_id(tokenizer), cand.finish_reason))


def pair_actions(tokenizer, pair: Pair[Candidate]) -> list[tuple[str, int]]:
    """A candidate pair's two actions as `skip_long_actions` reads them: (name, tokens)."""
    name = agent_turn(pair.state.episode_id, pair.state.turn_index) + "'s candidate"
    return [(name, candidate_length(tokenizer, c)) for c in (pair.chosen, pair.rejected)]


# ---- not in the paper, off by default: --anchor_coef, --critic oracle ------------------------------


def tied_states(scored: Sequence[tuple[State, Sequence[Candidate]]]) -> list[tuple[State, Sequence[Candidate]]]:
    """The states whose candidates all tie (those DPO gets no pair from), in order."""
    return [(state, cands) for state, cands in scored
            if cands and max(c.advantage for c in cands) == min(c.advantage for c in cands)]


def anchor_candidates(scored: Sequence[tuple[State, Sequence[Candidate]]], n_pairs: int,
                      rng: random.Random) -> list[tuple[State, Candidate]]:
    """One anchor per pair: the first candidate of each state whose candidates all tie,
    in a seeded order, repeated round-robin to `n_pairs` ([] when no state ties)."""
    tied = [(state, cands[0]) for state, cands in tied_states(scored)]
    if not tied:
        return []
    rng.shuffle(tied)
    return [tied[i % len(tied)] for i in range(n_pairs)]


def token_action(tokenizer, state: State, cand: Candidate, prompt_token_ids: Sequence[int] | None) -> tuple[Segment]:
    """An anchor's NLL example: the candidate in the context it was sampled from."""
    ctx = context_ids(tokenizer, prompt_token_ids if prompt_token_ids is not None else state.prompt_token_ids,
                      state.prompt)
    return (Segment(ctx, action_ids(cand.token_ids, eos_id(tokenizer), cand.finish_reason)),)


def anchor_examples(tokenizer, scored: Sequence[tuple[State, Sequence[Candidate]]], n_pairs: int,
                    rows: dict[str, CandidatesRow], seed: int, metrics: dict, max_length: int | None = None,
                    source: str = "candidates") -> list[tuple[Segment]] | None:
    """`--anchor_coef`'s NLL examples, one per pair (`anchor_candidates`, seeded with seed + 1),
    tokenized as sampled; None when no state's candidates all tie. A tied state whose anchor
    does not fit `max_length` is skipped (one warning line naming `source`). Counts their states in `metrics`."""
    tied = skip_long_actions(tied_states(scored), lambda sc: [(agent_turn(sc[0].episode_id, sc[0].turn_index)
                                                               + "'s anchor", candidate_length(tokenizer, sc[1][0]))],
                             max_length, source=source, what="all-tied states' anchors")
    drawn = anchor_candidates(tied, n_pairs, random.Random(seed + 1))
    if not drawn:
        print("sweet: --anchor_coef > 0 but no state has all-tied candidates (that fit --max_length): no anchors")
        return None
    metrics["sweet/anchor_states"] = len({state_key(s) for s, _ in drawn})
    return [token_action(tokenizer, s, c, rows[state_key(s)].prompt_token_ids) for s, c in drawn]


def load_oracle_ranker(model_cfg: ModelConfig, cfg: SweetConfig) -> CandidateRanker:
    """`--critic oracle`, a diagnostic (test bed only): the test bed's exact advantage through
    the registry (ORACLE_RANKER), decoded with the policy's tokenizer (the sampler shares it)."""
    if cfg.env != "testbed":
        raise ValueError(f"--critic {ORACLE_CRITIC} is the test bed's exact advantage: it needs --env testbed, "
                         f"got --env {cfg.env}")
    from colbench.registry import load_target

    OracleCritic, task_design = load_target(ORACLE_RANKER), load_target(ORACLE_TASK_DESIGN)
    beds = {task_design(t).name for t in load_tasks(cfg.tasks, env=cfg.env, validate=False)}
    if len(beds) != 1:
        raise ValueError(f"--critic {ORACLE_CRITIC}: --tasks {cfg.tasks} mixes test beds {sorted(beds)}")
    return OracleCritic(load_tokenizer(model_cfg.model), cfg.env, bed=beds.pop())


# ---- the run: states -> K candidates (sweet_candidates.py) -> pairs -> per-turn DPO ----------------


def main(model_cfg: ModelConfig, train: SweetTrainConfig, cfg: SweetConfig, cand: CandidateConfig | None = None,
         ranker: CandidateRanker | None = None):
    """Stage 2: candidates + critic scores per state, top-vs-bottom pairs, DPO. Returns
    output_dir/final (None for --stage sample). `ranker` replaces the critic loaded from
    `cfg.critic` (API use and tests). Several rounds: sweet/workflows/rounds.py."""

    cand = cand or CandidateConfig()
    out = Path(train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = CandidateCache(out, sampling_settings(model_cfg, cand, cfg.critic, train.seed))
    keep = cache.files_to_keep(train.resume)  # a fresh start keeps candidates of these same settings
    if (done := finished_run(train, keep=keep, model=model_cfg, sweet=cfg, candidates=cand)) is not None:
        return done
    run_config = save_resolved_config(out, algorithm="sweet", model=model_cfg, train=train, sweet=cfg, candidates=cand)
    states = load_states(cfg)
    proc = process_state()  # on CPU, PartialState() alone would leave each process on its own
    if cfg.stage != "train":
        cache.fill(states, cand, model_cfg, train.seed, proc,
                   load_ranker=lambda: ranker if ranker is not None
                   else load_ranker(model_cfg, cfg, out / CRITIC_RENDERS))
        if cfg.stage == "sample":
            return None
    rows = cache.rows(states)
    scored = [(s, rows[state_key(s)].for_state(s)) for s in states]
    pairs, metrics = make_action_pairs(scored, cfg.pairs_per_state, random.Random(train.seed))
    print(f"sweet: {metrics['sweet/states']} states, {metrics['sweet/tied_states']} all-tied, {len(pairs)} pairs")
    if not pairs:
        raise ValueError(f"no preference pairs: the critic scored every state's candidates equal ({cache.path})")
    tokenizer = load_tokenizer(model_cfg.model)
    pairs = skip_long_actions(pairs, lambda p: pair_actions(tokenizer, p), model_cfg.max_length,
                              source=str(cache.path), what="candidate pairs")
    token_pairs = [token_pair(tokenizer, p, rows[state_key(p.state)].prompt_token_ids) for p in pairs]
    anchors = (anchor_examples(tokenizer, scored, len(pairs), rows, train.seed, metrics, model_cfg.max_length,
                               str(cache.path)) if cfg.anchor_coef > 0 else None)
    return train_dpo(token_pairs, model_cfg, train, tokenizer, beta=cfg.beta, nll_coef=cfg.nll_coef,
                     loss_type=cfg.loss_type, run_config=run_config, first_metrics=metrics, anchors=anchors,
                     anchor_coef=cfg.anchor_coef)
