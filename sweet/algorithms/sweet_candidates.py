"""SWEET-RL stage 2's candidate cache: output_dir/candidates.jsonl and its settings.

Stage 2 (sweet/algorithms/sweet_rl.py) samples K candidate actions per state and scores
them with the critic; this module keeps them on disk so a rerun does not draw them again.

- `candidates.jsonl`: one `CandidatesRow` per state (sweet.core.records), appended and
  flushed per batch of states; a rerun skips the states already there, a torn last line
  is repaired.
- `candidates.settings.json`: what the file was sampled and scored with (sampler, K,
  temperature, top_p, max_new_tokens, critic, seed, and `reused_from`). A rerun appends
  only with the same settings; a fresh start keeps the file only when they match.
- `--reuse_candidates RUN/candidates.jsonl` (`StoredSamples`): another run's samples,
  drawn with the same sampler settings, served instead of a sampler's and scored with
  this run's critic.

Also here: `CandidateConfig` (K and the sampler, the `--candidates_per_state`... flags) and
`CandidateRanker`, what the critic offers. The algorithm calls the cache in a few lines:
`CandidateCache(out, settings)`, `.files_to_keep(resume)` before the run starts,
`.fill(...)` (sample + score what is missing), then `.rows(states)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from colbench.cli import canonical_keys
from colbench.io import atomic_write
from colbench.jsonl import Appender
from engines import EngineOptions, load_engine
from engines.base import Sample, SamplingParams, generate_at
from engines.memory import release_memory
from sweet.core.config import ModelConfig, check_range
from sweet.core.models import resolve_model_path
from sweet.core.records import CandidatesRow, SampledAction, State, read_candidates, state_key

CANDIDATES_FILE = "candidates.jsonl"
SAMPLING_FILE = "candidates.settings.json"  # what candidates.jsonl was sampled and scored with


@dataclass
class CandidateConfig:
    """How the K candidate actions per state are sampled."""

    engine_spec_fields = ("sampler",)  # a class attribute, not a flag: adds --request_timeout etc. (colbench.cli)

    sampler: str = field(default="", metadata={"help": "engine spec for candidates: tiny|hf:..|vllm:..|openai:..; default the policy's initial model"})
    reuse_candidates: str = field(default="", metadata={
        "help": "another stage-2 run's candidates.jsonl, sampled with these same settings: score its samples with "
                "this run's critic instead of sampling again (ablations then differ only in the ranking)"})
    candidates_per_state: int = field(default=16, metadata={
        "help": "K: candidate actions sampled per state (paper: 16)", "aliases": ["--num_candidates"]})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the candidates"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling of the candidates"})
    max_new_tokens: int = field(default=512, metadata={"help": "max tokens per candidate"})
    sample_batch_size: int = field(default=8, metadata={"help": "states per sampling + scoring call (one candidates.jsonl flush each)"})
    sampler_batch_size: int = field(default=16, metadata={"help": "hf sampler: rows per forward batch"})
    sampler_workers: int = field(default=1, metadata={"help": "hf sampler on the CPU: forked processes that decode its "
                                                            "batches (the same samples as one)"})
    sampler_tensor_parallel: int = field(default=1, metadata={"help": "vllm sampler: tensor parallel size"})
    sampler_gpu_memory_utilization: float = field(default=0.6, metadata={"help": "vllm sampler: GPU memory share (the critic shares the GPU)"})

    def __post_init__(self) -> None:
        check_range(self, "temperature")  # finite
        check_range(self, "top_p", low=0, high=1, strict=True)
        check_range(self, "sampler_gpu_memory_utilization", low=0, high=1, strict=True)
        check_range(self, "sampler_tensor_parallel", low=1)
        for name in ("candidates_per_state", "max_new_tokens", "sample_batch_size", "sampler_batch_size",
                     "sampler_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"CandidateConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.candidates_per_state < 2:
            raise ValueError("CandidateConfig.candidates_per_state must be >= 2 to form pairs, "
                             f"got {self.candidates_per_state}")
        if self.temperature < 0:
            raise ValueError(f"CandidateConfig.temperature must be >= 0, got {self.temperature}")


class CandidateRanker(Protocol):
    """What ranks candidates: sweet.critic.model.TrainedCritic, testbed.oracle.OracleCritic, or any object with this method."""

    def score_states(self, items: Sequence[tuple[State, Sequence[Sequence[int]], Sequence[str | None]]]
                     ) -> list[list[float]]:
        """Per (state, candidate action ids, their finish reasons): one advantage per candidate."""


def default_sampler(model_cfg: ModelConfig) -> str:
    """The candidates' sampler when `--sampler` is not given: the policy's initial model."""
    return "hf:" + resolve_model_path(model_cfg.model)


def sampling_settings(model_cfg: ModelConfig, cand: CandidateConfig, critic: str, seed: int) -> dict:
    """What candidates.jsonl is sampled and scored with (candidates.settings.json)."""
    settings = {"sampler": cand.sampler or default_sampler(model_cfg),
                "candidates_per_state": cand.candidates_per_state, "temperature": cand.temperature, "top_p": cand.top_p,
                "max_new_tokens": cand.max_new_tokens,
                "critic": critic, "seed": seed}
    if cand.reuse_candidates:
        settings["reused_from"] = cand.reuse_candidates
    return settings


def read_settings(side: Path) -> dict:
    """A candidates.settings.json, its keys under today's names (a file written when
    `candidates_per_state` was `num_candidates` reads the same)."""
    return canonical_keys([CandidateConfig], json.loads(side.read_text()), str(side))


class CandidateCache:
    """`out_dir/candidates.jsonl`, sampled and scored with `settings` (`sampling_settings`)."""

    def __init__(self, out_dir: Path, settings: dict):
        self.path, self.settings = Path(out_dir) / CANDIDATES_FILE, settings

    def changes(self) -> dict[str, str]:
        """`setting: old -> new` where the recorded settings differ from these ({} when none are recorded)."""
        side = self.path.with_name(SAMPLING_FILE)
        if not side.exists():
            return {}
        old = read_settings(side)
        return {k: f"{old.get(k)!r} -> {v!r}" for k, v in self.settings.items() if old.get(k) != v}

    def files_to_keep(self, resume: bool) -> tuple[str, ...]:
        """The files a fresh start of output_dir keeps (a cache of these same settings); a
        resume with other settings raises, naming the changes."""
        same = not self.changes()
        if resume and not same:
            self.check_settings()
        return (CANDIDATES_FILE, SAMPLING_FILE) if same else ()

    def check_settings(self) -> None:
        """Appending needs the settings the file was sampled with (stale candidates from
        another sampler, K or critic would be mixed in silently); records them beside it."""
        changed = self.changes()
        if changed:
            raise ValueError(f"{self.path} was sampled with other settings ({changed}); delete it and "
                             f"{SAMPLING_FILE} or use a new --output_dir")
        atomic_write(self.path.with_name(SAMPLING_FILE), json.dumps(self.settings, indent=2))

    def fill(self, states: Sequence[State], cand: CandidateConfig, model_cfg: ModelConfig, seed: int, proc,
             load_ranker: Callable[[], CandidateRanker]) -> None:
        """Sample and score every state not yet in the file, in the main process only (`proc`:
        accelerate's PartialState); several processes need a complete file."""
        done = read_candidates(self.path)
        if proc.num_processes > 1 and not all(state_key(s) in done for s in states):
            raise RuntimeError(f"{self.path} is incomplete: sample candidates in ONE process first (--stage sample), "
                               "then launch training with several processes (--stage train)")
        if proc.is_main_process:
            self.check_settings()
            collect_candidates(states, model_cfg, cand, self.path, seed, self.settings, load_ranker)

    def rows(self, states: Sequence[State]) -> dict[str, CandidatesRow]:
        """The file's rows by state key; every state must have one."""
        rows = read_candidates(self.path)
        missing = [state_key(s) for s in states if state_key(s) not in rows]
        if missing:
            raise ValueError(f"{self.path}: no candidates for {len(missing)} states (e.g. {missing[0]}); "
                             "run --stage sample first")
        return rows


def collect_candidates(states: Sequence[State], model_cfg: ModelConfig, cand: CandidateConfig, path: Path, seed: int,
                       settings: dict, load_ranker: Callable[[], CandidateRanker]) -> None:
    """Load the sampler and the critic (unless every state is done), sample + score, free them."""
    done = read_candidates(path)
    if all(state_key(s) in done for s in states):
        return
    engine = None  # stored samples are checked before the critic loads: a wrong source fails at once
    if cand.reuse_candidates:
        engine = StoredSamples(Path(cand.reuse_candidates), settings)
    ranker = load_ranker()
    if engine is None:
        options = EngineOptions(dtype=model_cfg.dtype, batch_size=cand.sampler_batch_size, workers=cand.sampler_workers,
                                tensor_parallel_size=cand.sampler_tensor_parallel,
                                gpu_memory_utilization=cand.sampler_gpu_memory_utilization)
        engine = load_engine(cand.sampler or default_sampler(model_cfg), options)
    try:
        sample_and_score(states, engine, ranker, cand, path, seed)
    finally:
        engine.close()
        del engine, ranker
        release_memory()


def sample_and_score(states: Sequence[State], engine, ranker: CandidateRanker, cand: CandidateConfig, path: Path,
                     seed: int) -> None:
    """Sample K candidates for every state not yet in `path`, score them, append rows."""
    from tqdm.auto import tqdm

    done = read_candidates(path, repair=True)
    todo = [(i, s) for i, s in enumerate(states) if state_key(s) not in done]
    with Appender(path) as out, tqdm(total=len(states), initial=len(states) - len(todo), desc="candidates") as bar:
        for start in range(0, len(todo), cand.sample_batch_size):
            chunk = todo[start : start + cand.sample_batch_size]
            params = SamplingParams(n=cand.candidates_per_state, temperature=cand.temperature, top_p=cand.top_p,
                                    max_new_tokens=cand.max_new_tokens, seed=seed * 1_000_003 + chunk[0][0])
            if isinstance(engine, StoredSamples):
                results = [engine.samples(s) for _, s in chunk]
            else:
                results = generate_at(engine, [list(s.prompt) for _, s in chunk],
                                      [s.prompt_token_ids for _, s in chunk], params)
            scores = ranker.score_states([(s, [smp.token_ids for smp in samples],
                                           [smp.finish_reason for smp in samples])
                                          for (_, s), samples in zip(chunk, results)])
            out.write(candidates_row(s, samples, advs).to_json() for (_, s), samples, advs in zip(chunk, results, scores))
            bar.update(len(chunk))


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


class StoredSamples:
    """Another run's candidate samples (`--reuse_candidates`), served instead of a
    sampler's: the same sampler, K, temperature, top_p, max_new_tokens and seed as this
    run's are required (its candidates.settings.json), and every state must be there."""

    def __init__(self, path: Path, settings: dict):
        side = path.with_name(SAMPLING_FILE)
        if not side.exists():
            raise ValueError(f"--reuse_candidates {path}: no {SAMPLING_FILE} beside it")
        theirs = read_settings(side)
        drawn = ("sampler", "candidates_per_state", "temperature", "top_p", "max_new_tokens", "seed")
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


