"""Baseline samples for a centred critic: K actions of the initial policy π_0 at each
critic turn's state, and the centring of per-turn advantages with them.

An advantage has zero mean under its policy, E_{a~π}[A(o, a)] = 0. The LM-head critic of
SWEET-RL has no such constraint: fitted on trajectory sums with c in its context, it can
put the whole Bradley–Terry margin on a turn whose action the policy always takes (on the
test bed, the answer: its constants follow from what the human said, and c tells whether
they are right), leaving the questions unranked. With `--baseline_samples_per_state K` the critic is
trained on

    Â(o_t, a_t, c) = A(o_t, a_t, c) − (1/K) Σ_k A(o_t, a_k, c),   a_k ~ π_0(· | o_t)

so a turn whose K samples all equal the action taken carries exactly zero (and no
gradient), and the margin must sit on the turns where the policy had a choice. Stage 2
ranks candidates within one state, which the per-state baseline does not change.

The samples are drawn once (temperature 1: the policy itself), from the policy's prompt
(no c: the policy never sees it), and kept in `output_dir/baseline_samples.jsonl`, one
row per turn, flushed per batch: a rerun draws only the missing ones.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from colbench.io import atomic_write
from colbench.jsonl import Appender, read_rows
from engines import EngineOptions, load_engine
from engines.base import SamplingParams, generate_at
from sweet.core.tokens import action_ids

if TYPE_CHECKING:
    import torch

    from sweet.critic.model import CriticTurn

SAMPLES_FILE = "baseline_samples.jsonl"
SETTINGS_FILE = "baseline_samples.settings.json"


@dataclass(frozen=True)
class BaselineRow:
    """One turn's K sampled action ids (`action_ids`: + eos where the model ended)."""

    state: str  # state_key(turn): o_t and c
    actions: tuple[tuple[int, ...], ...]

    def to_json(self) -> dict:
        return {"state": self.state, "actions": [list(a) for a in self.actions]}

    @classmethod
    def from_json(cls, row: dict) -> "BaselineRow":
        return cls(str(row["state"]), tuple(tuple(int(i) for i in a) for a in row["actions"]))


def state_key(turn: "CriticTurn") -> str:
    """What a baseline is a function of: o_t (the policy's prompt) and c, not the action."""
    return state_key_of(turn.state.prompt, turn.state.training_info)


def state_key_of(prompt, training_info: str) -> str:
    blob = json.dumps([list(prompt), training_info], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_baselines(critic_dir: str | Path) -> dict[str, tuple] | None:
    """A centred critic's baseline samples (state_key -> K action-id tuples), None when the
    critic in `critic_dir` is not centred."""
    path = Path(critic_dir) / SAMPLES_FILE
    if not path.exists():
        return None
    return {r.state: r.actions for r in read_rows(path, BaselineRow.from_json, what="baseline-samples row")}


def as_generated(ids: Sequence[int], eos: int) -> tuple[list[int], str]:
    """A stored action (`action_ids`: + eos where the model ended) back as (generated ids,
    finish reason), the form scorers take."""
    ids = list(ids)
    return (ids[:-1], "stop") if ids and ids[-1] == eos else (ids, "length")


def sample_baselines(turns: Sequence["CriticTurn"], sampler: str, k: int, max_new_tokens: int, eos: int,
                     out: Path, seed: int, batch_size: int = 16, dtype: str = "auto") -> dict[str, tuple]:
    """K actions of `sampler` (an engine spec: π_0) at every turn's state, drawn where
    `out/baseline_samples.jsonl` lacks them; returns state_key -> K action-id tuples.
    Another run's file (other sampler, K, length or seed) is an error naming the change."""
    from tqdm.auto import tqdm

    settings = {"sampler": sampler, "k": k, "max_new_tokens": max_new_tokens, "seed": seed, "temperature": 1.0}
    side, path = out / SETTINGS_FILE, out / SAMPLES_FILE
    if side.exists() and (old := json.loads(side.read_text())) != settings:
        changed = {key: f"{old.get(key)!r} -> {v!r}" for key, v in settings.items() if old.get(key) != v}
        raise ValueError(f"{path} was sampled with other settings ({changed}); delete it and {SETTINGS_FILE} "
                         "or use a new --output_dir")
    out.mkdir(parents=True, exist_ok=True)
    if not side.exists():
        atomic_write(side, json.dumps(settings, indent=2))
    done = {r.state: r.actions for r in read_rows(path, BaselineRow.from_json, what="baseline-samples row", repair=True)}
    unique: dict[str, "CriticTurn"] = {}
    for t in turns:
        unique.setdefault(state_key(t), t)
    items = list(unique.items())
    # fixed chunks of the full list, each with its own seed: a resumed run draws what an
    # uninterrupted one would (a chunk with any turn missing is drawn again, whole)
    chunks = [(start, items[start:start + batch_size]) for start in range(0, len(items), batch_size)]
    todo = [(start, chunk) for start, chunk in chunks if any(key not in done for key, _ in chunk)]
    if todo:
        engine = load_engine(sampler, EngineOptions(dtype=dtype, batch_size=batch_size))
        try:
            with Appender(path) as f, tqdm(total=len(items), initial=len(items) - sum(len(c) for _, c in todo),
                                           desc="baseline samples") as bar:
                for start, chunk in todo:
                    params = SamplingParams(n=k, temperature=1.0, max_new_tokens=max_new_tokens,
                                            seed=seed * 1_000_003 + start)
                    results = generate_at(engine, [list(t.state.prompt) for _, t in chunk],
                                          [t.state.prompt_token_ids for _, t in chunk], params)
                    rows = [BaselineRow(key, tuple(action_ids(s.token_ids, eos, s.finish_reason) for s in samples))
                            for (key, _), samples in zip(chunk, results)]
                    f.write(r.to_json() for r in rows)
                    done.update((r.state, r.actions) for r in rows)
                    bar.update(len(chunk))
        finally:
            engine.close()
    return done


def baseline_index(turns: list["CriticTurn"], n_episode_turns: int, samples: dict[str, tuple]) -> list[list[int]]:
    """For each of the first `n_episode_turns` turns, K indices into `turns` of its baseline
    actions: one equal to the action taken points at the turn itself, one already in `turns`
    at that state (another episode's) at it, any other is appended as a CriticTurn. A turn
    whose samples all equal its own action gets [t] * K: its centred term is exactly 0."""
    from sweet.critic.model import CriticTurn

    where = {}
    for i, turn in enumerate(turns):
        where.setdefault(turn.fingerprint(), i)
    index: list[list[int]] = []
    for t in range(n_episode_turns):
        turn, row = turns[t], []
        for ids in samples[state_key(turn)]:
            if tuple(ids) == tuple(turn.action_ids):  # the turn itself: A − A is 0 with a zero gradient
                row.append(t)
                continue
            candidate = CriticTurn(turn.state, tuple(ids))
            key = candidate.fingerprint()
            if key not in where:
                where[key] = len(turns)
                turns.append(candidate)
            row.append(where[key])
        index.append(row)
    return index


def centred(advantages: "torch.Tensor", baseline: "torch.Tensor") -> "torch.Tensor":
    """Â = A(turn) − mean_k A(its k-th baseline action): `advantages` [M] over the needed
    turns, `baseline` [N, K] positions in it of each scored turn's samples; the first N
    entries of `advantages` are the scored turns themselves. Returns [N]."""
    n = baseline.shape[0]
    return advantages[:n] - advantages[baseline].mean(dim=1)
