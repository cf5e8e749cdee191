"""SWEET-RL stage 2: per-turn DPO on candidate actions ranked by the stage-1 critic.

For every agent turn of the input episodes (a State: the recorded prompt o_t):
1. sample K candidate actions (default 16) from the state's prompt with any engine
   (`--sampler`, default the policy's initial model) at temperature 1;
2. score each with the critic, A(o_t, a, c) (sweet.critic.CriticScorer, conditioned
   exactly as in critic training); `--critic oracle` (test bed only) is a diagnostic:
   the test bed's exact advantage (testbed/oracle.py), to tell a wrong critic from
   a stage 2 that cannot use a right one;
3. pair a random candidate of the top half with a random one of the bottom half,
   `pairs_per_state` times (states whose candidates all tie are skipped and counted;
   a drawn pair with equal scores is dropped);
4. train with DPO (sweet/algorithms/losses.py) on the action tokens only, NLL on the chosen action
   (per token), reference log-probs precomputed with the initial policy;
5. optionally (`--anchor_coef`, not in the paper) each pair also carries one anchor: a
   candidate of a state whose candidates all tie (round-robin over those states), trained
   with NLL, an estimate of KL(π_0‖π_θ) there. Those states give DPO no pair, so nothing
   else holds the policy at them; on the test bed they are the last turns, whose answers
   share tokens with the early answers the pairs push down (docs/testbed.md).
Paper defaults: lr 2e-7 (full fine-tuning; with --lora 2e-6: the papers give no LoRA rate,
10x is the usual rule), β 0.1, NLL coefficient 0.01, batch 8, 1 epoch, K = 16 candidates,
4 pairs per state, the first 10% of the episodes file (`--episode_fraction 0.1`; the
test bed, testbed/pipeline.py, gives its own `--max_episodes`).

Candidates and scores go to output_dir/candidates.jsonl one state per line, flushed
per batch of states: a rerun skips states already there. Candidates are trained on
as sampled: context = the sampler's prompt ids (else the state's recorded ids, else the
chat template), action = the generated ids + eos (no eos when cut at max_new_tokens).
The sampler must share the policy's tokenizer (its ids are trained on).
`--reuse_candidates RUN/candidates.jsonl` scores the samples another run drew with the
same sampler, K, temperature, top_p, max_new_tokens and seed (checked against its
candidates.settings.json) instead of drawing them again: the critic ablations of
testbed/learning.py then rank the very same candidates, and each still counts them.

`--rounds R` (R > 1) repeats stage 2 with new episodes and a retrained critic:
sweet/workflows/rounds.py. The paper trains one round.

    # CPU, tiny model (critic from `python -m sweet.train_critic ... --output_dir runs/critic-tiny`)
    python -m sweet.train_policy --algorithm sweet --episodes eps.jsonl --tasks tasks.jsonl \\
        --critic runs/critic-tiny --model tiny --num_candidates 4 --max_new_tokens 32 \\
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

import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, Sequence

from colbench.episodes import load_episodes
from colbench.jsonl import Appender
from colbench.prompts import check_prompt_flags, check_recorded_prompts
from colbench.tasks import load_tasks
from engines import EngineOptions, load_engine
from engines.base import Sample, SamplingParams
from sweet.algorithms.policy_trainer import PolicyTrainConfig, finished_run, train_dpo
from sweet.core.config import (LearningRates, ModelConfig, agent_prompt_field, check_range, lr_field,
                               save_resolved_config, strict_tasks_field)
from sweet.core.models import load_tokenizer, resolve_model_path
from sweet.core.records import (
    Candidate,
    CandidatesRow,
    Pair,
    SampledAction,
    State,
    episode_states,
    read_candidates,
    state_key,
)
from sweet.core.tokens import Segment, action_ids, context_ids, eos_id
from sweet.core.trainer import process_state
from sweet.critic.model import CriticScorer, load_training_info

STAGES = ("all", "sample", "train")
ORACLE_CRITIC = "oracle"  # --critic oracle: testbed/oracle.py instead of a critic dir
# the lab's oracle and its tasks' spec, "module:Name" loaded on use (colbench.registry): sweet imports no test bed
ORACLE_SCORER = "testbed.oracle:OracleScorer"
ORACLE_TASK_SPEC = "testbed.spec:task_spec"
CANDIDATES_FILE = "candidates.jsonl"
SAMPLING_FILE = "candidates.settings.json"  # what candidates.jsonl was sampled and scored with


@dataclass
class SweetConfig:
    """The states, the critic that ranks their candidates, the pairs and the per-turn DPO loss."""

    episodes: str = field(default="", metadata={"help": "episodes JSONL whose agent turns become states"})
    tasks: str = field(default="", metadata={"help": "tasks file (or builtin:<split>) holding the training-time information c"})
    env: str = field(default="backend", metadata={"help": "environment name (training_info, offline trajectory format)"})
    episode_fraction: float = field(default=0.1, metadata={"help": "use the first share of the episodes file (paper: "
                                                                   "the first 10 percent of its 15k offline "
                                                                   "trajectories, as more epochs overfitted; 1: all)"})
    max_episodes: int | None = field(default=None, metadata={"help": "use the first N episodes instead of "
                                                                     "episode_fraction"})
    critic: str = field(default="", metadata={"help": "stage-1 critic dir (output_dir of python -m sweet.train_critic); "
                                                      "'oracle' (--env testbed): a diagnostic, the test bed's exact advantage, "
                                                      "to tell a wrong critic from a stage 2 that cannot use a right one"})
    stage: str = field(default="all", metadata={"help": "all | sample (candidates + scores only) | train (candidates must exist)"})
    pairs_per_state: int = field(default=4, metadata={"help": "top-half vs bottom-half pairs drawn per state (paper: 4)"})
    beta: float = field(default=0.1, metadata={"help": "DPO β (paper: 0.1)"})
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
class CandidateConfig:
    """How the K candidate actions per state are sampled."""

    engine_spec_fields = ("sampler",)  # a class attribute, not a flag: adds --request_timeout etc. (colbench.cli)

    sampler: str = field(default="", metadata={"help": "engine spec for candidates: tiny|hf:..|vllm:..|openai:..; default the policy's initial model"})
    reuse_candidates: str = field(default="", metadata={
        "help": "another stage-2 run's candidates.jsonl, sampled with these same settings: score its samples with "
                "this run's critic instead of sampling again (ablations then differ only in the ranking)"})
    num_candidates: int = field(default=16, metadata={"help": "K candidate actions per state (paper: 16)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the candidates"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling of the candidates"})
    max_new_tokens: int = field(default=512, metadata={"help": "max tokens per candidate"})
    sample_batch_size: int = field(default=8, metadata={"help": "states per sampling + scoring call (one candidates.jsonl flush each)"})
    sampler_batch_size: int = field(default=16, metadata={"help": "hf sampler: rows per forward batch"})
    sampler_tensor_parallel: int = field(default=1, metadata={"help": "vllm sampler: tensor parallel size"})
    sampler_gpu_memory_utilization: float = field(default=0.6, metadata={"help": "vllm sampler: GPU memory share (the critic shares the GPU)"})

    def __post_init__(self) -> None:
        check_range(self, "temperature")  # finite
        check_range(self, "top_p", low=0, high=1, strict=True)
        check_range(self, "sampler_gpu_memory_utilization", low=0, high=1, strict=True)
        check_range(self, "sampler_tensor_parallel", low=1)
        for name in ("num_candidates", "max_new_tokens", "sample_batch_size", "sampler_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"CandidateConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_candidates < 2:
            raise ValueError(f"CandidateConfig.num_candidates must be >= 2 to form pairs, got {self.num_candidates}")
        if self.temperature < 0:
            raise ValueError(f"CandidateConfig.temperature must be >= 0, got {self.temperature}")


@dataclass
class SweetTrainConfig(PolicyTrainConfig):
    output_dir: str = field(default="runs/sweet", metadata={"help": "checkpoints, candidates, metrics and the resolved config"})
    LEARNING_RATES: ClassVar[LearningRates] = LearningRates(2e-7, 2e-6, "SWEET-RL paper: 2e-7, full fine-tuning of Llama-3.1-8B; the papers give no LoRA rate: 10x, the usual LoRA rule")
    learning_rate: float | None = lr_field(LEARNING_RATES)


CONFIGS = (ModelConfig, SweetTrainConfig, SweetConfig, CandidateConfig)


class Scorer(Protocol):
    """What ranks candidates: sweet.critic.CriticScorer, or any object with this method."""

    def score_states(self, items: Sequence[tuple[State, Sequence[Sequence[int]], Sequence[str | None]]]
                     ) -> list[list[float]]:
        """Per (state, candidate action ids, their finish reasons): one advantage per candidate."""


# ---- candidates ------------------------------------------------------------------------


def sample_and_score(states: Sequence[State], engine, scorer: Scorer, cand: CandidateConfig, path: Path, seed: int) -> None:
    """Sample K candidates for every state not yet in `path`, score them, append rows."""
    from tqdm.auto import tqdm


    done = read_candidates(path, repair=True)
    todo = [(i, s) for i, s in enumerate(states) if state_key(s) not in done]
    with Appender(path) as out, tqdm(total=len(states), initial=len(states) - len(todo), desc="candidates") as bar:
        for start in range(0, len(todo), cand.sample_batch_size):
            chunk = todo[start : start + cand.sample_batch_size]
            params = SamplingParams(n=cand.num_candidates, temperature=cand.temperature, top_p=cand.top_p,
                                    max_new_tokens=cand.max_new_tokens, seed=seed * 1_000_003 + chunk[0][0])
            if isinstance(engine, StoredSamples):
                results = [engine.samples(s) for _, s in chunk]
            else:
                results = engine.generate([list(s.prompt) for _, s in chunk], params)
            scores = scorer.score_states([(s, [smp.token_ids for smp in samples], [smp.finish_reason for smp in samples])
                                          for (_, s), samples in zip(chunk, results)])
            out.write(candidates_row(s, samples, advs).to_json() for (_, s), samples, advs in zip(chunk, results, scores))
            bar.update(len(chunk))


def sampling_settings(model_cfg: ModelConfig, cfg: SweetConfig, cand: CandidateConfig, seed: int) -> dict:
    """What candidates.jsonl is sampled and scored with (candidates.settings.json)."""
    settings = {"sampler": cand.sampler or default_sampler(model_cfg), "num_candidates": cand.num_candidates,
                "temperature": cand.temperature, "top_p": cand.top_p, "max_new_tokens": cand.max_new_tokens,
                "critic": cfg.critic, "seed": seed}
    if cand.reuse_candidates:
        settings["reused_from"] = cand.reuse_candidates
    return settings


def sampling_changes(path: Path, model_cfg: ModelConfig, cfg: SweetConfig, cand: CandidateConfig,
                     seed: int) -> dict[str, str]:
    """`setting: old -> new` where candidates.jsonl's recorded settings differ from these."""
    settings = sampling_settings(model_cfg, cfg, cand, seed)
    side = path.with_name(SAMPLING_FILE)
    if not side.exists():
        return {}
    old = json.loads(side.read_text())
    return {k: f"{old.get(k)!r} -> {v!r}" for k, v in settings.items() if old.get(k) != v}


def check_sampling_settings(path: Path, model_cfg: ModelConfig, cfg: SweetConfig, cand: CandidateConfig,
                            seed: int) -> None:
    """A rerun appends to candidates.jsonl only with the settings it was sampled with
    (stale candidates from another sampler, K or critic would be mixed in silently);
    they are kept in candidates.settings.json beside it."""
    changed = sampling_changes(path, model_cfg, cfg, cand, seed)
    if changed:
        raise ValueError(f"{path} was sampled with other settings ({changed}); delete it and {SAMPLING_FILE} "
                         "or use a new --output_dir")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(SAMPLING_FILE).write_text(json.dumps(sampling_settings(model_cfg, cfg, cand, seed), indent=2))


class StoredSamples:
    """Another run's candidate samples (`--reuse_candidates`), served instead of a
    sampler's: the same sampler, K, temperature, top_p, max_new_tokens and seed as this
    run's are required (its candidates.settings.json), and every state must be there."""

    def __init__(self, path: Path, settings: dict):
        side = path.with_name(SAMPLING_FILE)
        if not side.exists():
            raise ValueError(f"--reuse_candidates {path}: no {SAMPLING_FILE} beside it")
        theirs = json.loads(side.read_text())
        drawn = ("sampler", "num_candidates", "temperature", "top_p", "max_new_tokens", "seed")
        changed = {k: f"{theirs.get(k)!r} there, {settings[k]!r} here" for k in drawn if theirs.get(k) != settings[k]}
        if changed:
            raise ValueError(f"--reuse_candidates {path} was sampled with other settings: {changed}")
        self.path, self.rows = path, read_candidates(path)

    def samples(self, state: State) -> list:
        row = self.rows.get(state_key(state))
        if row is None:
            raise ValueError(f"--reuse_candidates {self.path}: no candidates for state {state_key(state)}")
        return [Sample(c.text, c.token_ids, c.logprobs, c.finish_reason or "stop", row.prompt_token_ids)
                for c in row.candidates]

    def close(self) -> None:  # the engine interface's; nothing to free
        pass


def candidates_row(state: State, samples, advantages: Sequence[float]) -> CandidatesRow:
    """The candidates.jsonl record of `state`'s sampled actions and their critic scores."""
    if len(samples) != len(advantages):
        raise RuntimeError(f"critic returned {len(advantages)} scores for {len(samples)} candidates")
    prompt_ids = next((smp.prompt_token_ids for smp in samples if smp.prompt_token_ids is not None), None)
    return CandidatesRow(
        state_key(state), state.task_id, state.episode_id, state.turn_index,
        tuple(prompt_ids) if prompt_ids is not None else None,
        tuple(SampledAction(smp.text, tuple(smp.token_ids), tuple(smp.logprobs) if smp.logprobs is not None else None,
                            smp.finish_reason, float(a)) for smp, a in zip(samples, advantages)))


# ---- ranking and pairing ---------------------------------------------------------------


def rank_halves(scores: Sequence[float]) -> tuple[list[int], list[int]]:
    """Stage 2's ranking of one state's candidates, pure: the indices of the top and the
    bottom half by score, highest first (a stable sort: tied candidates keep their order;
    an odd count leaves the median out of both halves; fewer than two: no halves). A pair
    is a top one against a bottom one with a lower score. The test bed's exact solver pairs
    with it too (testbed/predict.py)."""
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    half = len(order) // 2
    return (order[:half], order[-half:]) if half else ([], [])


def make_action_pairs(scored: Sequence[tuple[State, Sequence[Candidate]]], pairs_per_state: int,
                      rng: random.Random) -> tuple[list[Pair[Candidate]], dict[str, float]]:
    """Per state: rank candidates by advantage, draw `pairs_per_state` (top-half, bottom-half)
    pairs at random (with replacement). States whose candidates all tie are skipped; drawn
    pairs with equal scores are dropped. Returns the pairs and counts/spread metrics."""
    pairs: list[Pair[Candidate]] = []
    tied = dropped = 0
    stds, ranges = [], []
    for state, cands in scored:
        advs = [c.advantage for c in cands]
        if len(cands) < 2:
            tied += 1
            continue
        stds.append(statistics.pstdev(advs))
        ranges.append(max(advs) - min(advs))
        if max(advs) == min(advs):
            tied += 1
            continue
        top, bottom = ([cands[i] for i in idx] for idx in rank_halves(advs))
        for _ in range(pairs_per_state):
            chosen, rejected = rng.choice(top), rng.choice(bottom)
            if chosen.advantage > rejected.advantage:
                pairs.append(Pair(chosen, rejected, state.task_id, state))
            else:
                dropped += 1
    metrics = {
        "sweet/states": len(scored), "sweet/tied_states": tied, "sweet/dropped_equal_pairs": dropped,
        "sweet/pairs": len(pairs),
        "sweet/critic_score_std": statistics.fmean(stds) if stds else 0.0,
        "sweet/critic_score_range": statistics.fmean(ranges) if ranges else 0.0,
    }
    return pairs, metrics


def anchor_candidates(scored: Sequence[tuple[State, Sequence[Candidate]]], n_pairs: int,
                      rng: random.Random) -> list[tuple[State, Candidate]]:
    """One anchor per pair: the first candidate of each state whose candidates all tie,
    in a seeded order, repeated round-robin to `n_pairs` ([] when no state ties)."""
    tied = [(state, cands[0]) for state, cands in scored
            if cands and max(c.advantage for c in cands) == min(c.advantage for c in cands)]
    if not tied:
        return []
    rng.shuffle(tied)
    return [tied[i % len(tied)] for i in range(n_pairs)]


def token_pair(tokenizer, pair: Pair[Candidate], prompt_token_ids: Sequence[int] | None) -> Pair:
    """The DPO example of an action pair: both actions in the context they were sampled from."""

    ctx = context_ids(tokenizer, prompt_token_ids if prompt_token_ids is not None else pair.state.prompt_token_ids,
                      pair.state.prompt)
    eos = eos_id(tokenizer)
    seg = lambda c: Segment(ctx, action_ids(c.token_ids, eos, c.finish_reason))  # noqa: E731
    return Pair((seg(pair.chosen),), (seg(pair.rejected),), pair.task_id, pair.state)


def token_action(tokenizer, state: State, cand: Candidate, prompt_token_ids: Sequence[int] | None) -> tuple[Segment]:
    """An anchor's NLL example: the candidate in the context it was sampled from."""
    ctx = context_ids(tokenizer, prompt_token_ids if prompt_token_ids is not None else state.prompt_token_ids,
                      state.prompt)
    return (Segment(ctx, action_ids(cand.token_ids, eos_id(tokenizer), cand.finish_reason)),)


# ---- the run ------------------------------------------------------------------------------


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


def default_sampler(model_cfg: ModelConfig) -> str:
    return "hf:" + resolve_model_path(model_cfg.model)


def load_scorer(model_cfg: ModelConfig, cfg: SweetConfig) -> Scorer:
    """The critic `--critic` names: a stage-1 critic dir, or `oracle` (the test bed's exact
    advantage, decoded with the policy's tokenizer: the sampler shares it)."""
    if not cfg.critic:
        raise ValueError("SweetConfig.critic is required to score candidates: give --critic <critic dir>")
    if cfg.critic == ORACLE_CRITIC:
        if cfg.env != "testbed":
            raise ValueError(f"--critic {ORACLE_CRITIC} is the test bed's exact advantage: it needs --env testbed, "
                             f"got --env {cfg.env}")
        from colbench.registry import load_target

        OracleScorer, task_spec = load_target(ORACLE_SCORER), load_target(ORACLE_TASK_SPEC)
        specs = {task_spec(t).name for t in load_tasks(cfg.tasks, env=cfg.env, validate=False)}
        if len(specs) != 1:
            raise ValueError(f"--critic {ORACLE_CRITIC}: --tasks {cfg.tasks} mixes test-bed specs {sorted(specs)}")
        return OracleScorer(load_tokenizer(model_cfg.model), cfg.env, spec=specs.pop())

    return CriticScorer.load(cfg.critic)


def collect_candidates(states: Sequence[State], model_cfg: ModelConfig, cfg: SweetConfig, cand: CandidateConfig,
                       path: Path, seed: int, scorer: Scorer | None) -> None:
    """Load the sampler and the critic (unless every state is done), sample + score, free them."""
    import gc


    done = read_candidates(path)
    if all(state_key(s) in done for s in states):
        return
    engine = None  # stored samples are checked before the critic loads: a wrong source fails at once
    if cand.reuse_candidates:
        engine = StoredSamples(Path(cand.reuse_candidates), sampling_settings(model_cfg, cfg, cand, seed))
    if scorer is None:
        scorer = load_scorer(model_cfg, cfg)
    if engine is None:
        options = EngineOptions(dtype=model_cfg.dtype, batch_size=cand.sampler_batch_size,
                                tensor_parallel_size=cand.sampler_tensor_parallel,
                                gpu_memory_utilization=cand.sampler_gpu_memory_utilization)
        engine = load_engine(cand.sampler or default_sampler(model_cfg), options)
    try:
        sample_and_score(states, engine, scorer, cand, path, seed)
    finally:
        engine.close()
        del engine, scorer
        gc.collect()
        _empty_cuda_cache()


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(model_cfg: ModelConfig, train: SweetTrainConfig, cfg: SweetConfig, cand: CandidateConfig | None = None,
         scorer: Scorer | None = None):
    """Stage 2: candidates + critic scores per state, top-vs-bottom pairs, DPO. Returns
    output_dir/final (None for --stage sample). `scorer` replaces the critic loaded from
    `cfg.critic` (API use and tests). Several rounds: sweet/workflows/rounds.py."""

    cand = cand or CandidateConfig()
    out = Path(train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CANDIDATES_FILE
    # candidates of other sampling settings: a resume names them; a fresh start moves them aside with
    # the rest of the earlier run, and keeps them (a cache of these same settings) otherwise
    same_samples = not sampling_changes(path, model_cfg, cfg, cand, train.seed)
    if train.resume and not same_samples:
        check_sampling_settings(path, model_cfg, cfg, cand, train.seed)  # raises, naming the changes
    keep = (CANDIDATES_FILE, SAMPLING_FILE) if same_samples else ()
    if (done := finished_run(train, keep=keep, model=model_cfg, sweet=cfg, candidates=cand)) is not None:
        return done
    run_config = save_resolved_config(out, algorithm="sweet", model=model_cfg, train=train, sweet=cfg, candidates=cand)
    states = load_states(cfg)
    proc = process_state()  # on CPU, PartialState() alone would leave each process on its own
    if cfg.stage != "train":
        done = read_candidates(path)
        if proc.num_processes > 1 and not all(state_key(s) in done for s in states):
            raise RuntimeError(f"{path} is incomplete: sample candidates in ONE process first (--stage sample), "
                               "then launch training with several processes (--stage train)")
        if proc.is_main_process:
            check_sampling_settings(path, model_cfg, cfg, cand, train.seed)
            collect_candidates(states, model_cfg, cfg, cand, path, train.seed, scorer)
        if cfg.stage == "sample":
            return None
    rows = read_candidates(path)
    missing = [state_key(s) for s in states if state_key(s) not in rows]
    if missing:
        raise ValueError(f"{path}: no candidates for {len(missing)} states (e.g. {missing[0]}); run --stage sample first")
    scored = [(s, rows[state_key(s)].for_state(s)) for s in states]
    pairs, metrics = make_action_pairs(scored, cfg.pairs_per_state, random.Random(train.seed))
    print(f"sweet: {metrics['sweet/states']} states, {metrics['sweet/tied_states']} all-tied, {len(pairs)} pairs")
    if not pairs:
        raise ValueError(f"no preference pairs: the critic scored every state's candidates equal ({path})")
    tokenizer = load_tokenizer(model_cfg.model)
    token_pairs = [token_pair(tokenizer, p, rows[state_key(p.state)].prompt_token_ids) for p in pairs]
    anchors = None
    if cfg.anchor_coef > 0:
        drawn = anchor_candidates(scored, len(pairs), random.Random(train.seed + 1))
        if drawn:
            anchors = [token_action(tokenizer, s, c, rows[state_key(s)].prompt_token_ids) for s, c in drawn]
            metrics["sweet/anchor_states"] = len({state_key(s) for s, _ in drawn})
        else:
            print("sweet: --anchor_coef > 0 but no state has all-tied candidates: no anchors")
    return train_dpo(token_pairs, model_cfg, train, tokenizer, beta=cfg.beta, nll_coef=cfg.nll_coef,
                     run_config=run_config, first_metrics=metrics, anchors=anchors, anchor_coef=cfg.anchor_coef)
