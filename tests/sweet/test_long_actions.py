"""An action too long for --max_length among ordinary ones (issue 67): every trainer skips
the units that hold one when its data loads, before any step, with ONE warning line naming
the count, the file and the first case, and trains on exactly the rest (its final weights
equal a run on the data without them); the trainers whose own sampler writes the actions
(LOOP, the centred critic's baseline samples) refuse a max_new_tokens that could write one.

The rule, one predicate: sweet.core.tokens.fits (an action is never cut and needs one
context token before it), which make_batch enforces and skip_long_actions filters by.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from colbench.types import Turn
from sweet.core.config import ModelConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
MAX_LENGTH = 128
MODEL = ModelConfig(model="tiny", dtype="float32", max_length=MAX_LENGTH, keep_head=32)
SKIPPING = "with an action too long for max_length="


def _long_turn(turn: Turn, n: int = MAX_LENGTH) -> Turn:
    """`turn` with an action of exactly `n` ids: cut at max_new_tokens (no eos appended),
    so n = max_length leaves no room for a context token: the boundary."""
    return replace(turn, token_ids=list(range(300, 300 + n)), finish_reason="length")


def _with_long_action(episode, agent_index: int):
    turns = list(episode.turns)
    target = [i for i, t in enumerate(turns) if t.role == "agent"][agent_index]
    turns[target] = _long_turn(turns[target])
    return replace(episode, turns=turns)


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(out) / "final" / "model.safetensors"))


def _assert_same_weights(a: Path, b: Path) -> None:
    """Both runs trained (the weights moved) and ended with the same weights, bit for bit."""
    from safetensors.torch import load_file

    from engines.tiny import tiny_model_path

    wa, wb = _final_weights(a), _final_weights(b)
    start = load_file(str(Path(tiny_model_path()) / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert any(not torch.equal(wa[k], start[k]) for k in wa), "nothing was trained"
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "the skipped unit changed the update"


@contextmanager
def skips_before_fit(monkeypatch):
    """Record the skip warnings, and how many had been issued when the trainer's first
    step began (`Trainer.fit`'s entry): (warnings, counts at each fit)."""
    from sweet.core.trainer import Trainer

    at_fit: list[int] = []
    original = Trainer.fit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def fit(self, *args, **kwargs):
            at_fit.append(len(_skips(caught)))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Trainer, "fit", fit)
        yield caught, at_fit
    monkeypatch.setattr(Trainer, "fit", original)


def _skips(caught) -> list[str]:
    return [str(w.message) for w in caught if SKIPPING in str(w.message)]


@pytest.fixture(autouse=True)
def _fresh_accelerate(fresh_accelerate):
    yield


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


@pytest.fixture
def synthetic(tmp_path, make_synthetic, tiny_tokenizer):
    """4 tasks, each with a success (reward 1) and a failure (reward 0), 2 agent turns each."""
    tasks, episodes = make_synthetic(tiny_tokenizer, 4)
    return tmp_path, write_jsonl(tmp_path / "tasks.jsonl", tasks), episodes


# ---- the rule --------------------------------------------------------------------------------


def test_fits_is_make_batchs_condition_and_skip_counts_once():
    from sweet.core.tokens import fits, make_batch, skip_long_actions

    assert fits(MAX_LENGTH - 1, MAX_LENGTH) and not fits(MAX_LENGTH, MAX_LENGTH) and fits(10**6, None)
    batch = make_batch([(list(range(1, 50)), list(range(100, 100 + MAX_LENGTH - 1)))], 0, MAX_LENGTH, 8)
    assert batch.input_ids.shape == (1, MAX_LENGTH) and int(batch.action_mask.sum()) == MAX_LENGTH - 1
    with pytest.raises(ValueError, match=f"does not fit max_length={MAX_LENGTH}"):
        make_batch([([1, 2], list(range(MAX_LENGTH)))], 0, MAX_LENGTH, 8)

    units = [("a", [5]), ("b", [5, MAX_LENGTH]), ("c", [MAX_LENGTH + 3]), ("d", [MAX_LENGTH - 1])]
    actions = lambda u: [(f"{u[0]}#{i}", n) for i, n in enumerate(u[1])]  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = skip_long_actions(units, actions, MAX_LENGTH, source="f.jsonl", what="pairs")
        assert skip_long_actions(units[:1], actions, MAX_LENGTH, source="f.jsonl", what="pairs") == units[:1]
        assert skip_long_actions(units, actions, None, source="f.jsonl", what="pairs") == units
    assert [u[0] for u in kept] == ["a", "d"]
    assert [str(w.message) for w in caught] == [
        f"f.jsonl: skipping 2 of 4 pairs with an action too long for max_length={MAX_LENGTH} "
        f"(first: b#1: {MAX_LENGTH} tokens; actions are never cut)"]


# ---- RFT (and the warm start, which trains through it): the turn -----------------------------


def test_rft_skips_the_turn_and_trains_on_exactly_the_rest(synthetic, tmp_path, monkeypatch):
    from sweet.algorithms import rft

    _, _, episodes = synthetic
    target = next(i for i, ep in enumerate(episodes) if ep.reward >= 1.0)
    eps = list(episodes)
    eps[target] = _with_long_action(eps[target], 1)
    with_long = write_jsonl(tmp_path / "with_long.jsonl", eps)
    without = list(eps)
    without[target] = replace(eps[target], turns=eps[target].turns[:-1])  # the long (last) agent turn left out
    without_long = write_jsonl(tmp_path / "without_long.jsonl", without)

    def run(path: Path, out: Path):
        train = rft.RFTTrainConfig(output_dir=str(out), report_to="none", learning_rate=1e-3, batch_size=4,
                                   micro_batch_size=2, save_steps=0)
        return rft.main(MODEL, train, rft.RFTConfig(episodes=str(path), env="backend"))

    with skips_before_fit(monkeypatch) as (caught, at_fit):
        run(with_long, tmp_path / "a")
    n_turns = sum(len(ep.agent_turns) for ep in eps if ep.reward >= 1.0)
    assert _skips(caught) == [
        f"{with_long}: skipping 1 of {n_turns} agent turns with an action too long for max_length={MAX_LENGTH} "
        f"(first: episode {eps[target].episode_id}, agent turn 1: {MAX_LENGTH} tokens; actions are never cut)"]
    assert at_fit == [1]  # known when the data loaded, before the first step
    with skips_before_fit(monkeypatch) as (caught, _):
        run(without_long, tmp_path / "b")
    assert _skips(caught) == []
    _assert_same_weights(tmp_path / "a", tmp_path / "b")


# ---- multi-turn DPO and the critic: the pair --------------------------------------------------


def _failed_with_long_action(episodes, tmp_path: Path) -> tuple[Path, Path, object]:
    """(file with a long action in the first failed episode, file without that episode, it)."""
    target = next(i for i, ep in enumerate(episodes) if ep.reward < 1.0)
    eps = list(episodes)
    eps[target] = _with_long_action(eps[target], 0)
    return (write_jsonl(tmp_path / "with_long.jsonl", eps),
            write_jsonl(tmp_path / "without_long.jsonl", eps[:target] + eps[target + 1:]), eps[target])


def test_mtdpo_drops_every_pair_of_an_episode_with_a_long_action(synthetic, tmp_path, monkeypatch):
    from sweet.algorithms import mtdpo
    from policy_fixtures import read_metrics

    _, _, episodes = synthetic
    with_long, without_long, long_ep = _failed_with_long_action(episodes, tmp_path)

    def run(path: Path, out: Path):
        train = mtdpo.MTDPOTrainConfig(output_dir=str(out), report_to="none", learning_rate=1e-3, batch_size=2,
                                       micro_batch_size=1, save_steps=0)
        return mtdpo.main(MODEL, train, mtdpo.MTDPOConfig(episodes=str(path), env="backend"))

    with skips_before_fit(monkeypatch) as (caught, at_fit):
        run(with_long, tmp_path / "a")
    assert _skips(caught) == [
        f"{with_long}: skipping 1 of 4 trajectory pairs with an action too long for max_length={MAX_LENGTH} "
        f"(first: episode {long_ep.episode_id}, agent turn 0: {MAX_LENGTH} tokens; actions are never cut)"]
    assert at_fit == [1]
    assert read_metrics(tmp_path / "a")[0]["data/pairs"] == 3
    with skips_before_fit(monkeypatch) as (caught, _):
        run(without_long, tmp_path / "b")
    assert _skips(caught) == []
    _assert_same_weights(tmp_path / "a", tmp_path / "b")


def test_critic_drops_every_pair_of_an_episode_with_a_long_action(synthetic, tmp_path, monkeypatch):
    from accelerate.state import AcceleratorState, GradientState

    from sweet.critic.train import CriticConfig, CriticTrainConfig, main

    _, tasks, episodes = synthetic
    with_long, without_long, long_ep = _failed_with_long_action(episodes, tmp_path)

    def run(path: Path, out: Path):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        train = CriticTrainConfig(output_dir=str(out), report_to="none", learning_rate=2e-3, num_epochs=1,
                                  batch_size=2, micro_batch_size=1)
        return main(MODEL, train, CriticConfig(episodes=str(path), tasks=str(tasks), env="backend"))

    with skips_before_fit(monkeypatch) as (caught, at_fit):
        run(with_long, tmp_path / "a")
    assert _skips(caught) == [
        f"{with_long}: skipping 1 of 4 trajectory pairs with an action too long for max_length={MAX_LENGTH} "
        f"(first: episode {long_ep.episode_id}, agent turn 0: {MAX_LENGTH} tokens; actions are never cut)"]
    assert at_fit == [1]
    with skips_before_fit(monkeypatch) as (caught, _):
        run(without_long, tmp_path / "b")
    assert _skips(caught) == []
    _assert_same_weights(tmp_path / "a", tmp_path / "b")


def test_critic_refuses_baseline_samples_that_could_not_fit(synthetic, tmp_path):
    from colbench.cli import FieldError
    from sweet.critic.train import CriticConfig, CriticTrainConfig, main

    _, tasks, _ = synthetic
    cfg = CriticConfig(episodes=str(tmp_path / "any.jsonl"), tasks=str(tasks), baseline_samples_per_state=2,
                       baseline_max_new_tokens=MAX_LENGTH)
    with pytest.raises(FieldError, match=rf"CriticConfig.baseline_max_new_tokens must be < ModelConfig.max_length "
                                         rf"\({MAX_LENGTH}: .*\), got {MAX_LENGTH}"):
        main(MODEL, CriticTrainConfig(output_dir=str(tmp_path / "out"), report_to="none"), cfg)
    assert not (tmp_path / "out").exists()  # refused before anything was written


# ---- SWEET-RL stage 2: the candidate pair -----------------------------------------------------


def _candidates_file(out: Path, states, long_last: bool) -> None:
    """Two candidates per state, the first ranked above the second; the last state's first
    candidate is MAX_LENGTH ids long (`long_last`), or its two candidates tie (no pair)."""
    from sweet.core.records import CandidatesRow, SampledAction, state_key

    rows = []
    for k, s in enumerate(states):
        last = k == len(states) - 1
        first = tuple(range(300, 300 + MAX_LENGTH)) if last and long_last else (200 + k, 201 + k, 202 + k)
        advantages = (0.0, 0.0) if last and not long_last else (1.0, 0.0)
        cands = (SampledAction("a", first, None, "length", advantages[0]),
                 SampledAction("b", (210 + k, 211 + k), None, "stop", advantages[1]))
        rows.append(CandidatesRow(state_key(s), s.task_id, s.episode_id, s.turn_index, None, cands))
    out.mkdir(parents=True)
    (out / "candidates.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))


def test_sweet_skips_the_candidate_pairs_with_a_long_candidate(synthetic, tmp_path, monkeypatch):
    from sweet.algorithms.sweet_rl import SweetConfig, SweetTrainConfig, load_states, main

    _, tasks, episodes = synthetic
    eps_file = write_jsonl(tmp_path / "episodes.jsonl", episodes)
    cfg = SweetConfig(episodes=str(eps_file), tasks=str(tasks), env="backend", max_episodes=3, stage="train",
                      pairs_per_state=2)
    states = load_states(cfg)

    def run(out: Path, long_last: bool):
        _candidates_file(out, states, long_last)
        train = SweetTrainConfig(output_dir=str(out), report_to="none", learning_rate=1e-3, batch_size=4,
                                 micro_batch_size=2, save_steps=0)
        return main(MODEL, train, cfg)

    with skips_before_fit(monkeypatch) as (caught, at_fit):
        run(tmp_path / "a", long_last=True)
    last = states[-1]
    assert _skips(caught) == [
        f"{tmp_path / 'a' / 'candidates.jsonl'}: skipping 2 of {2 * len(states)} candidate pairs with an action too "
        f"long for max_length={MAX_LENGTH} (first: episode {last.episode_id}, agent turn {last.turn_index}'s "
        f"candidate: {MAX_LENGTH} tokens; actions are never cut)"]
    assert at_fit == [1]
    with skips_before_fit(monkeypatch) as (caught, _):
        run(tmp_path / "b", long_last=False)  # the same pairs without the last state's
    assert _skips(caught) == []
    _assert_same_weights(tmp_path / "a", tmp_path / "b")


def test_sweet_anchors_skip_a_tied_state_whose_anchor_does_not_fit():
    import random

    from sweet.algorithms.sweet_rl import anchor_candidates, anchor_examples
    from sweet.core.models import load_tokenizer
    from sweet.core.records import Candidate, CandidatesRow, State, state_key

    tok = load_tokenizer("tiny")
    states = [State("t", f"t/a/{i}", 0, ({"role": "user", "content": "x"},), (1, 2, 3), "c") for i in range(3)]
    long = tuple(range(300, 300 + MAX_LENGTH))
    scored = [(s, [Candidate(s, "a", long if i == 1 else (7, 8), finish_reason="length", advantage=0.0)] * 2)
              for i, s in enumerate(states)]
    rows = {state_key(s): CandidatesRow(state_key(s), "t", s.episode_id, 0, None, ()) for s in states}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        anchors = anchor_examples(tok, scored, 4, rows, 0, {}, MAX_LENGTH, "c.jsonl")
    assert _skips(caught) == [
        f"c.jsonl: skipping 1 of 3 all-tied states' anchors with an action too long for max_length={MAX_LENGTH} "
        f"(first: episode t/a/1, agent turn 0's anchor: {MAX_LENGTH} tokens; actions are never cut)"]
    assert len(anchors) == 4 and all(len(a[0].action) == 2 for a in anchors)
    kept = [scored[0], scored[2]]  # the draw is the one over the fitting tied states
    want = anchor_candidates(kept, 4, random.Random(1))
    assert [a[0].context for a in anchors] == [tuple(s.prompt_token_ids) for s, _ in want]


# ---- LOOP: its own sampler's actions, refused up front -----------------------------------------


def test_loop_refuses_max_new_tokens_that_could_not_fit(tmp_path):
    from colbench.cli import FieldError
    from sweet.algorithms.loop import LoopConfig, LoopTrainConfig, main

    with pytest.raises(FieldError, match=rf"LoopConfig.max_new_tokens must be < ModelConfig.max_length "
                                         rf"\({MAX_LENGTH}: .*\), got {MAX_LENGTH}"):
        main(MODEL, LoopTrainConfig(output_dir=str(tmp_path / "out"), report_to="none"),
             LoopConfig(max_new_tokens=MAX_LENGTH))
    assert not (tmp_path / "out").exists()  # refused before anything was written
    proc = subprocess.run([sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--max_length", "64",
                           "--max_new_tokens", "96", "--output_dir", str(tmp_path / "cli")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert errors == ["python -m sweet.train_policy: error: LoopConfig.max_new_tokens must be < ModelConfig.max_length "
                      "(64: an action is never cut and needs a context token before it), got 96"], proc.stderr[-2000:]
