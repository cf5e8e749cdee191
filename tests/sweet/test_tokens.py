"""One rule from a recorded turn to training ids (sweet/core/tokens.py), and the batching.

The episodes come from real runs: the tiny model as the agent (HF engine) against the
scripted test-bed human, through colbench.episodes.run_episodes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
import torch
from policy_fixtures import cached_tiny_episodes

from colbench.types import Episode
from sweet.algorithms.policy_trainer import sequence_logps
from sweet.core.config import ModelConfig
from sweet.core.models import load_model, load_tokenizer
from sweet.core.tokens import (
    Segment,
    action_ids,
    action_logprob_sum_and_mean,
    episode_segments,
    make_batch,
    token_logprobs,
    truncate_context,
    turn_segment,
)

MAX_NEW = 10


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    _, _, eps = cached_tiny_episodes(tmp_path_factory.getbasetemp())
    return eps


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)


@pytest.fixture(scope="module")
def ended_and_cut(tok):
    """Real episodes whose agent turns end both ways: the tiny model with its eos logit
    raised (so it sometimes ends a turn) and max_new_tokens=MAX_NEW (so it is sometimes cut)."""
    from colbench.agents import ModelAgent
    from colbench.envs.testbed import TestbedEnv, make_tasks
    from colbench.episodes import EpisodeConfig, run_episodes
    from engines.base import SamplingParams
    from engines.hf import HFEngine
    from simulators.testbed import TestbedSimulator

    lm = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    lm.lm_head.register_forward_hook(lambda m, i, logits: logits + 6.0 * (torch.arange(logits.shape[-1]) == tok.eos_token_id))
    env = TestbedEnv(max_turns=3)
    agent = ModelAgent(HFEngine.from_model(lm, tok), SamplingParams(max_new_tokens=MAX_NEW), name="tiny")
    try:
        return run_episodes(env, make_tasks("train", n=2), agent, TestbedSimulator(), seeds=(0, 1),
                            config=EpisodeConfig(max_turns=3), progress=False)
    finally:
        env.close()


# ---- the rule -----------------------------------------------------------------------------


def test_action_ids_append_eos_exactly_when_the_model_ended_the_turn():
    assert action_ids([5, 6], 9, "stop") == (5, 6, 9)
    assert action_ids([5, 6], 9, "length") == (5, 6)  # cut at max_new_tokens: eos never sampled
    assert action_ids([5, 6], 9, "stop_string") == (5, 6)  # cut before a stop string: neither
    assert action_ids([5, 6], 9, None) == (5, 6, 9)  # a record from before the field: as trainers did then
    assert action_ids([], 9, "stop") == (9,)
    with pytest.raises(ValueError, match="unknown finish_reason 'eos'"):
        action_ids([5], 9, "eos")


def test_recorded_turns_carry_the_engines_finish_reason(ended_and_cut, tok):
    turns = [t for ep in ended_and_cut for t in ep.agent_turns]
    reasons = {t.finish_reason for t in turns}
    assert reasons == {"stop", "length"}, reasons  # both kinds, from the real engine and runner
    eos = tok.eos_token_id
    for t in turns:
        seg = turn_segment(tok, t)
        if t.finish_reason == "length":  # a cut-off turn gets no eos
            assert len(t.token_ids) == MAX_NEW and list(seg.action) == t.token_ids
        else:  # a turn the model ended gets exactly one
            assert len(t.token_ids) < MAX_NEW and list(seg.action) == t.token_ids + [eos]
        assert eos not in t.token_ids


def test_finish_reason_round_trips_and_old_files_still_load(ended_and_cut, tok, tmp_path):
    from colbench.episodes import read_episodes

    ep = max(ended_and_cut, key=lambda e: len({t.finish_reason for t in e.agent_turns}))  # both kinds if any
    path = tmp_path / "episodes.jsonl"
    path.write_text(ep.dumps() + "\n")
    [back] = read_episodes(path)
    assert [t.finish_reason for t in back.agent_turns] == [t.finish_reason for t in ep.agent_turns]
    # a file written before the field existed: loads, finish_reason None, eos appended as before
    row = ep.to_json()
    for t in row["turns"]:
        t.pop("finish_reason", None)
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps(row) + "\n")
    [legacy] = read_episodes(old)
    assert all(t.finish_reason is None for t in legacy.turns)
    assert [list(s.action) for s in episode_segments(tok, legacy)] == [t.token_ids + [tok.eos_token_id]
                                                                       for t in ep.agent_turns]
    assert Episode.from_json(row).agent_turns[0].finish_reason is None


def test_stage2_scores_and_trains_a_cut_off_candidate_with_the_same_ids(tok, model):
    """The critic scores a candidate on exactly the ids stage 2 trains on: a cut-off
    candidate without eos in both, one the model ended with eos in both."""
    from sweet.algorithms.sweet_rl import token_pair
    from sweet.core.records import Candidate, Pair, State
    from sweet.critic.model import CriticScorer, CriticSpec, critic_context_ids

    ref = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    spec = CriticSpec(beta=1.0, length_normalize=True, header="Training-time information", reference_model="tiny",
                      eos_token_id=tok.eos_token_id, lora=False, dtype="float32", max_length=1024)
    scorer = CriticScorer(spec, model, ref, tok, torch.device("cpu"))
    prompt = ({"role": "user", "content": "Write f."},)
    state = State("t0", "t0/x/0", 0, prompt, None, "def f():\n    return 1")
    ids = tuple(tok("Is x an int?", add_special_tokens=False)["input_ids"])
    cut, ended = (Candidate(state, tok.decode(ids), ids, finish_reason=r) for r in ("length", "stop"))
    [scores] = scorer.score_states([(state, [cut.token_ids, ended.token_ids], [cut.finish_reason, ended.finish_reason])])
    item = token_pair(tok, Pair(cut, ended, "t0", state), None)
    trained = {"length": item.chosen[0].action, "stop": item.rejected[0].action}
    assert trained == {"length": ids, "stop": ids + (tok.eos_token_id,)}

    def by_hand(action):
        batch = make_batch([(critic_context_ids(tok, state), action)], tok.pad_token_id)
        with torch.no_grad():
            lp = token_logprobs(model, batch) - token_logprobs(ref, batch)
        return action_logprob_sum_and_mean(lp, batch.action_mask)[1].item()

    assert scores == pytest.approx([by_hand(trained["length"]), by_hand(trained["stop"])], abs=1e-5)
    assert abs(scores[0] - scores[1]) > 1e-4  # the eos changes the score: the test can fail


# ---- from recorded turns to segments ---------------------------------------------------------


def _generated(episodes):
    """Episodes whose every agent turn was generated by the tiny engine (seed 1: not rewritten)."""
    eps = [ep for ep in episodes if ep.seed == 1]
    assert eps and all(len(ep.agent_turns) >= 2 for ep in eps), "need multi-turn episodes"
    return eps


def test_trained_action_ids_equal_generated_ids(episodes, tok):
    for ep in _generated(episodes):
        segments = episode_segments(tok, ep)
        batch = make_batch([(s.context, s.action) for s in segments], pad_id=tok.pad_token_id)
        for row, turn in enumerate(ep.agent_turns):
            ids, mask = batch.input_ids[row], batch.action_mask[row].bool()
            eos = [tok.eos_token_id] if turn.finish_reason == "stop" else []
            assert turn.finish_reason in ("stop", "length")
            assert ids[mask].tolist() == list(turn.token_ids) + eos
            n_ctx = len(turn.prompt_token_ids)
            assert ids[:n_ctx].tolist() == list(turn.prompt_token_ids)
            assert not mask[:n_ctx].any()


def test_simulator_tokens_are_only_in_contexts(episodes, tok):
    ep = _generated(episodes)[0]
    human = next(t for t in ep.turns if t.role == "human")
    human_ids = tok(human.content, add_special_tokens=False)["input_ids"]
    second = turn_segment(tok, ep.agent_turns[1])
    # the human's reply is inside the second turn's context (masked), never in an action
    ctx = list(second.context)
    assert any(ctx[i : i + len(human_ids)] == human_ids for i in range(len(ctx)))
    assert all(list(s.action[: len(human_ids)]) != human_ids for s in episode_segments(tok, ep))


def test_trainer_logprobs_match_sampler_logprobs(episodes, tok, model):
    """The context + action the trainer scores is what the engine sampled from: the
    engine's recorded log-probs and the trainer's agree (same model, float32)."""
    for ep in _generated(episodes):
        for turn in ep.agent_turns:
            seg = turn_segment(tok, turn)
            batch = make_batch([(seg.context, seg.action[: len(turn.token_ids)])], pad_id=tok.pad_token_id)
            with torch.no_grad():
                lp = token_logprobs(model, batch)[0][batch.action_mask[0].bool()]
            assert torch.allclose(lp, torch.tensor(turn.logprobs), atol=1e-4)


def test_fallback_to_chat_template_equals_recorded_ids(episodes, tok, caplog):
    import sweet.core.tokens as tokens

    turn = _generated(episodes)[0].agent_turns[1]
    tokens._warned_fallback = False
    with caplog.at_level(logging.WARNING, logger="sweet.core.tokens"):
        seg = turn_segment(tok, replace(turn, prompt_token_ids=None))
        turn_segment(tok, replace(turn, prompt_token_ids=None))
    assert list(seg.context) == list(turn.prompt_token_ids)
    assert sum("recorded no prompt ids" in r.message for r in caplog.records) == 1  # logged once


def test_bad_turns_are_refused(episodes, tok):
    ep = episodes[0]
    human = next(t for t in ep.turns if t.role == "human")
    with pytest.raises(ValueError, match="only agent turns"):
        turn_segment(tok, human)
    textual = replace(ep.agent_turns[0], token_ids=None, finish_reason=None)
    with pytest.raises(ValueError, match="no generated token_ids"):
        turn_segment(tok, textual)
    # published data: the text is tokenised once, only when asked to
    seg = turn_segment(tok, textual, tokenize_missing=True)
    assert list(seg.action) == tok(textual.content, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def test_trajectory_logp_is_sum_of_turn_logps(episodes, tok, model):
    """Multi-turn DPO's log π(τ): Σ over turns, each in its own context, equals scoring
    each turn alone and adding up."""
    cfg = ModelConfig(model="tiny", dtype="float32")
    eps = _generated(episodes)[:2]
    groups = [episode_segments(tok, ep) for ep in eps]
    with torch.no_grad():
        traj, counts = sequence_logps(model, cfg, tok.pad_token_id, groups)
        for g, total, n in zip(groups, traj, counts):
            alone = [sequence_logps(model, cfg, tok.pad_token_id, [[s]])[0].item() for s in g]
            assert total.item() == pytest.approx(sum(alone), abs=1e-4)
            assert n.item() == sum(len(s.action) for s in g)


def test_segment_is_hashable_record():
    assert Segment((1,), (2,)) == Segment((1,), (2,))
    assert len({Segment((1,), (2,)), Segment((1,), (2,))}) == 1


# ---- batches ------------------------------------------------------------------------------------


def test_truncate_keeps_head_and_tail():
    ctx = list(range(10))
    assert truncate_context(ctx, 6, keep_head=2) == [0, 1, 6, 7, 8, 9]
    assert truncate_context(ctx, 20, keep_head=2) == ctx


def test_make_batch_never_cuts_the_action():
    b = make_batch([([1, 2, 3, 4, 5], [7, 8]), ([1], [9])], pad_id=0, max_length=5, keep_head=1)
    # first: context truncated to 3 tokens (head 1 + last 2), action kept whole
    assert b.input_ids[0].tolist() == [1, 4, 5, 7, 8]
    assert b.action_mask[0].tolist() == [0, 0, 0, 1, 1]
    assert b.input_ids[1].tolist() == [1, 9, 0, 0, 0]
    assert b.attention_mask[1].tolist() == [1, 1, 0, 0, 0]
    assert b.action_mask[1].tolist() == [0, 1, 0, 0, 0]


class _Bigram(torch.nn.Module):
    """Logits depend only on the current token: easy to compute by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.table[input_ids]})


def test_token_logprobs_by_hand():
    table = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    b = make_batch([([0], [1, 1])], pad_id=2)
    lp = token_logprobs(_Bigram(table), b)
    # P(1|0)=0.25, P(1|1)=0.8
    assert torch.allclose(lp[0], torch.tensor([0.0, torch.log(torch.tensor(0.25)), torch.log(torch.tensor(0.8))]))
    total, mean = action_logprob_sum_and_mean(lp, b.action_mask)
    assert torch.allclose(total, torch.log(torch.tensor([0.25 * 0.8])))
    assert torch.allclose(mean, total / 2)
