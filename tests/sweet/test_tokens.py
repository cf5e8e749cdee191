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
import torch.nn.functional as F
from policy_fixtures import cached_tiny_episodes

from colbench.types import Episode
from sweet.algorithms.policy_trainer import sequence_logps
from sweet.core.config import ModelConfig
from sweet.core.logprobs import action_logprob_sum_and_mean, token_logprobs
from sweet.core.models import load_model, load_tokenizer
from sweet.core.tokens import Segment, action_ids, episode_segments, make_batch, truncate_context, turn_segment

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
    from testbed.env import TestbedEnv, make_tasks
    from colbench.episodes import EpisodeConfig, run_episodes
    from engines.base import SamplingParams
    from engines.hf import HFEngine
    from testbed.human import TestbedSimulator

    lm = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    lm.lm_head.register_forward_hook(lambda m, i, logits: logits + 6.0 * (torch.arange(logits.shape[-1]) == tok.eos_token_id))
    env = TestbedEnv(max_turns=3)
    agent = ModelAgent(HFEngine.from_model(lm, tok), SamplingParams(max_new_tokens=MAX_NEW), name="tiny",
                       continue_ids=True)
    try:
        return run_episodes(env, make_tasks("train", n=2, bed="legacy"), agent, TestbedSimulator(), seeds=(0, 1),
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


def test_sampled_episodes_are_one_token_sequence_with_each_action_in_place(ended_and_cut, tok):
    # Token in, token out (colbench.agents.turn_prompt_ids): every agent turn's prompt ids
    # start with the previous turn's context and action, where the action is what
    # turn_segment trains on (eos included exactly when the model ended its turn).
    from colbench.episodes import prefix_boundaries, prefix_consistent
    from engines.templating import render_prompt

    assert all(prefix_consistent(ep) for ep in ended_and_cut)
    assert sum(len(prefix_boundaries(ep)) for ep in ended_and_cut) >= 4
    placed = set()
    for ep in ended_and_cut:
        for a, b in zip(ep.agent_turns, ep.agent_turns[1:]):
            seg = turn_segment(tok, a)
            head = seg.context + seg.action
            assert tuple(b.prompt_token_ids[:len(head)]) == head
            placed.add(a.finish_reason)
        for t in ep.agent_turns:
            assert tok.decode(t.prompt_token_ids, skip_special_tokens=False) == render_prompt(tok, t.prompt)
    assert placed == {"stop", "length"}, placed


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
    from sweet.critic.model import TrainedCritic, CriticRecord, critic_context_ids

    ref = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    record = CriticRecord(beta=1.0, length_normalize=True, header="Training-time information", reference_model="tiny",
                          eos_token_id=tok.eos_token_id, lora=False, dtype="float32", max_length=1024)
    scorer = TrainedCritic(record, model, ref, tok, torch.device("cpu"))
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
    """The hidden state is the current token, one-hot, and the LM head the table of
    log-probs: logits depend only on the current token, easy to compute by hand."""

    def __init__(self, table):
        super().__init__()
        self.config = type("Config", (), {"vocab_size": table.shape[1]})()
        self.head = torch.nn.Linear(table.shape[0], table.shape[1], bias=False)
        self.head.weight.data = table.T.clone()  # one_hot(x) @ W^T = table[x]

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.head(F.one_hot(input_ids, self.head.in_features).float())})


def test_token_logprobs_by_hand():
    table = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    b = make_batch([([0], [1, 1])], pad_id=2)
    lp = token_logprobs(_Bigram(table), b)
    # P(1|0)=0.25, P(1|1)=0.8
    assert torch.allclose(lp[0], torch.tensor([0.0, torch.log(torch.tensor(0.25)), torch.log(torch.tensor(0.8))]))
    total, mean = action_logprob_sum_and_mean(lp, b.action_mask)
    assert torch.allclose(total, torch.log(torch.tensor([0.25 * 0.8])))
    assert torch.allclose(mean, total / 2)


# ---- chunked log-probs against the full-vocabulary logits they replace ----------------------


def _full_logits_logprobs(model, batch):
    """The path sweet.core.logprobs replaced: float32 logits over the whole vocabulary at every
    position, log-softmaxed, gathered: [B, L] with zero at position 0."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # a float64 model stays float64
    logp = torch.gather(F.log_softmax(logits[:, :-1], dim=-1), 2, batch.input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(logp, (1, 0))


def _tiny(kind: str):
    """The tiny Llama as each trainer holds it: full weights, LoRA (PEFT), tied embeddings,
    or inside LOOP's policy-with-value wrapper."""
    from transformers import AutoModelForCausalLM

    from engines.tiny import tiny_model_path

    if kind == "tied":
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
        config = base.config
        config.tie_word_embeddings = True
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        return model
    model = load_model(ModelConfig(model="tiny", dtype="float32", lora=kind == "lora", lora_r=4), trainable=True)
    if kind == "lora":  # B = 0 at initialisation: move it, so the adapter changes the log-probs
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
    if kind == "value":
        from sweet.core.value_head import ValueHeadModel

        model = ValueHeadModel(model, policy=True)
    return model


def _head_calls(model):
    """Record every run of the LM head's forward (rows, output dtype): wraps `forward` on the
    instance, which both the module's call and sweet.core.logprobs' chunks go through."""
    from sweet.core.logprobs import output_head

    head, calls = output_head(model), []
    inner = head.forward

    def forward(x):
        out = inner(x)
        calls.append((out.reshape(-1, out.shape[-1]).shape[0], out.dtype))
        return out

    head.forward = forward
    return calls, lambda: delattr(head, "forward")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["full", "lora", "tied", "value"])
def test_chunked_logprobs_equal_full_logits_values_and_gradients(kind, dtype, tok, monkeypatch):
    """Identical to the full-vocabulary path, forward and gradients (float32: within 1e-5
    of the largest value; float64: 1e-10, so the float32 gap is rounding, not maths), with
    the LM head run only on the scored positions, at most 3 of them at a time."""
    import sweet.core.logprobs as logprobs

    torch.manual_seed(0)
    model = _tiny(kind)
    (model.lm if kind == "value" else model).to(dtype)  # the value head reads float32 by design
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    examples = [(list(range(10, 40)), [41, 42, 43, 44, 45, 46, 47]), (list(range(100, 110)), [7, 8]),
                (list(range(200, 250)), list(range(300, 311)))]
    batch = make_batch(examples, pad_id=tok.pad_token_id)
    weights = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(1))
    # (the value head's own parameters get no gradient from log-probs in either path)
    params = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("v_head")]
    names = [n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("v_head")]

    def run(fn):
        model.zero_grad(set_to_none=True)
        logp = fn(model, batch)
        (logp * batch.action_mask * weights).sum().backward()
        return logp.detach(), [p.grad.clone() for p in params]

    old_logp, old_grads = run(lambda m, b: _full_logits_logprobs(m.lm if kind == "value" else m, b))
    vocab = logprobs._unwrap(model).config.vocab_size
    monkeypatch.setattr(logprobs, "LOGITS_CHUNK_ELEMENTS", 3 * vocab)  # chunks of 3 positions
    calls, restore = _head_calls(model)
    new_logp, new_grads = run(token_logprobs)
    restore()
    rows = [r for r, _ in calls]
    scored = batch.action_mask.bool()
    assert (new_logp[scored] - old_logp[scored]).abs().max() <= tol * max(1.0, old_logp.abs().max())
    assert (new_logp[~scored] == 0).all()
    scale = max(1.0, max(g.abs().max().item() for g in old_grads))
    for name, old, new in zip(names, old_grads, new_grads):
        assert (new - old).abs().max() <= tol * scale, (name, (new - old).abs().max().item(), scale)
    assert any(g.abs().sum() > 0 for g in new_grads)
    # forward: the 20 scored positions in chunks of <= 3, then the model's own call on 0
    # rows; backward recomputes the chunks
    n_scored = int(batch.action_mask.sum())
    assert max(rows) == 3 and sum(rows) == 2 * n_scored and rows.count(0) == 1


def test_chunked_logprobs_run_the_head_under_the_forwards_autocast(tok):
    """Mixed precision (accelerate wraps forward in autocast): the head's chunks run in the
    same autocast dtype as the body did, and give the full-logits values within bf16 noise."""
    model = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    batch = make_batch([(list(range(10, 60)), list(range(70, 90)))], pad_id=tok.pad_token_id)
    calls, restore = _head_calls(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        new = token_logprobs(model, batch)
    restore()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        old = _full_logits_logprobs(model, batch)
    assert [c for c in calls if c[0]] == [(20, torch.bfloat16)]
    scored = batch.action_mask.bool()
    assert torch.allclose(new[scored], old[scored], atol=0.05)


def test_scorer_shared_prefix_equals_padded_batches(tok):
    """The critic's KV-cache path (one context, many actions) and the padded batch path
    score the same, both through the chunked head."""
    from sweet.critic.model import shared_prefix_logprob_sums

    model = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    context = list(range(20, 60))
    actions = [[5, 6, 7], list(range(80, 95)), [9]]
    with torch.no_grad():
        shared = shared_prefix_logprob_sums(model, context, actions, tok.pad_token_id, torch.device("cpu"))
        batch = make_batch([(context, a) for a in actions], pad_id=tok.pad_token_id)
        padded = (_full_logits_logprobs(model, batch) * batch.action_mask).sum(-1)
    assert torch.allclose(shared, padded, atol=1e-4)


# ---- one forward pass per trajectory --------------------------------------------------------


def _per_turn_rows(model, segments):
    """The per-turn reference: one row per segment (its context, then its action)."""
    batch = make_batch([(s.context, s.action) for s in segments], pad_id=0, packed=False)
    return batch.example_sums(token_logprobs(model, batch)), batch


def test_a_trajectory_is_one_row_and_gives_the_per_turn_log_probs_losses_and_gradients(ended_and_cut, tok):
    # Sampled episodes are one token sequence (token in, token out), so make_batch(packed=True)
    # puts each trajectory's turns in one row. The forward values at a position depend only on
    # the ids before it, so the log-probs equal the per-turn rows' (bit for bit on this CPU;
    # 1e-6 allows another kernel's reduction order). A weight's gradient sums over every
    # position of every row, and rows of other lengths sum in another order: float32 noise of
    # ~1e-6 of the gradient's scale, bounded here at 1e-5.
    from sweet.algorithms.losses import dpo_loss
    from sweet.algorithms.policy_trainer import sequence_logps

    lm = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=True)
    groups = [episode_segments(tok, ep) for ep in ended_and_cut]
    flat = [s for g in groups for s in g]
    packed = make_batch([(s.context, s.action) for s in flat], pad_id=0, packed=True)
    assert packed.input_ids.shape[0] == len(groups) < len(flat)  # one row per trajectory
    assert int(packed.attention_mask.sum()) < int(make_batch([(s.context, s.action) for s in flat], 0).attention_mask.sum())

    def loss_and_grads(per_turn: bool):
        lm.zero_grad()
        if per_turn:
            sums, batch = _per_turn_rows(lm, flat)
            owner = torch.tensor([i for i, g in enumerate(groups) for _ in g])
            logps = torch.zeros(len(groups)).index_add(0, owner, sums)
            counts = torch.zeros(len(groups), dtype=torch.long).index_add(0, owner, batch.example_counts())
        else:
            logps, counts = sequence_logps(lm, ModelConfig(model="tiny", max_length=None), 0, groups)
        half = len(groups) // 2  # multi-turn DPO: trajectory i preferred to trajectory half + i
        loss, _ = dpo_loss(logps[:half], logps[half:2 * half], logps[:half].detach() - 0.3,
                           logps[half:2 * half].detach() + 0.2, counts[:half], beta=0.1, nll_coef=0.01)
        loss.backward()
        return logps.detach(), loss.detach(), {n: p.grad.clone() for n, p in lm.named_parameters()}

    one_logps, one_loss, one_grads = loss_and_grads(per_turn=False)
    rows_logps, rows_loss, rows_grads = loss_and_grads(per_turn=True)
    assert torch.allclose(one_logps, rows_logps, rtol=0, atol=1e-6), (one_logps - rows_logps).abs().max()
    assert torch.allclose(one_loss, rows_loss, rtol=0, atol=1e-6)
    for name, g in rows_grads.items():
        assert (one_grads[name] - g).abs().max() <= 1e-5 * g.abs().max() + 1e-12, name


def test_turns_that_do_not_continue_one_another_or_do_not_fit_keep_rows_of_their_own(ended_and_cut, tok):
    from sweet.core.tokens import prompt_ids

    ep = max(ended_and_cut, key=lambda e: len(e.agent_turns))
    segs = episode_segments(tok, ep)
    assert len(segs) >= 2 and make_batch([(s.context, s.action) for s in segs], 0, packed=True).input_ids.shape[0] == 1
    # the chat templated whole (what a text-only server's episodes give): re-tokenised boundaries
    whole = [Segment(tuple(prompt_ids(tok, t.prompt)), s.action) for t, s in zip(ep.agent_turns, segs)]
    assert make_batch([(s.context, s.action) for s in whole], 0, packed=True).input_ids.shape[0] == len(whole)
    # a trajectory longer than max_length: the turns whose context is cut are scored turn by turn
    limit = len(segs[-1].context) + len(segs[-1].action) - 1
    cut = make_batch([(s.context, s.action) for s in segs], 0, max_length=limit, packed=True)
    assert cut.input_ids.shape[0] == 2 and cut.input_ids.shape[1] <= limit
    model = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    with torch.no_grad():
        packed_sums = cut.example_sums(token_logprobs(model, cut))
        rows = make_batch([(s.context, s.action) for s in segs], 0, max_length=limit, packed=False)
        assert torch.allclose(packed_sums, rows.example_sums(token_logprobs(model, rows)), rtol=0, atol=1e-6)


def test_one_pass_summary_counts_how_trajectories_run():
    """One line: trajectories whose turns continue one another and fit run as one pass; the
    others (not one token sequence, or longer than max_length) are counted apart, as
    make_batch(packed=True) runs them."""
    from sweet.core.tokens import make_batch, one_pass_summary

    one = [((1, 2), (3,)), ((1, 2, 3, 4), (5, 6))]          # turn 2's context continues turn 1
    retemplated = [((1, 2), (3,)), ((1, 9, 3, 4), (5,))]     # turn 2 re-rendered: not a prefix
    long = [((1, 2), (3,)), ((1, 2, 3, 4, 5, 6, 7), (8,))]   # 8 tokens: past max_length=6
    line = one_pass_summary([one, retemplated, long, [((7,), (8,))]], 6, source="mtdpo")
    assert line == ("mtdpo: 2 of 4 trajectories run as one pass each; 1 as per-turn rows (their turns are not one "
                    "token sequence: templated whole, text only, or published); 1 longer than max_length=6 (the "
                    "turns past it run as rows of their own, cut)")
    assert one_pass_summary([one], None, source="critic") == "critic: 1 of 1 trajectories run as one pass each"
    # what the line says is what make_batch does
    assert make_batch(one, 0, max_length=6, packed=True).input_ids.shape[0] == 1
    assert make_batch(retemplated, 0, max_length=6, packed=True).input_ids.shape[0] == 2
    assert make_batch(long, 0, max_length=6, packed=True).input_ids.shape[0] == 2
