"""SWEET-RL critic maths: hand-derived values, and the scorer against plain forward passes."""

import math

import pytest
import torch

from sweet.core.records import State
from sweet.core.tokens import action_ids, with_training_info
from sweet.critic.model import (
    TrainedCritic,
    CriticRecord,
    bradley_terry_loss,
    pair_accuracy_and_margin,
    per_turn_advantage,
    trajectory_scores,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_per_turn_advantage_by_hand():
    policy = torch.tensor([-2.0, -6.0])  # Σ log π_θ over a_t
    ref = torch.tensor([-3.0, -3.0])  # Σ log π_ref over a_t
    n = torch.tensor([2, 3])
    # mean: β (Σθ − Σref)/n = 0.5·(1/2) = 0.25 ; 0.5·(−3/3) = −0.5
    assert per_turn_advantage(policy, ref, n, beta=0.5).tolist() == pytest.approx([0.25, -0.5])
    # ablation without length normalisation: 0.5·1 = 0.5 ; 0.5·(−3) = −1.5
    assert per_turn_advantage(policy, ref, n, beta=0.5, length_normalize=False).tolist() == pytest.approx([0.5, -1.5])


def test_trajectory_score_is_sum_of_per_turn_means_and_bt_loss():
    # turns 0,1 belong to trajectory 0, turn 2 to trajectory 1
    adv = torch.tensor([0.25, -0.5, 1.0])
    scores = trajectory_scores(adv, torch.tensor([0, 0, 1]), 2)
    assert scores.tolist() == pytest.approx([-0.25, 1.0])
    # chosen = trajectory 1, rejected = 0: −log σ(1.25) = log(1 + e^−1.25) ≈ 0.251929
    loss, metrics = bradley_terry_loss(scores[[1]], scores[[0]])
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.25)), rel=1e-6)
    assert metrics["accuracy"] == 1.0 and metrics["margin"] == pytest.approx(1.25)
    # a sum over turns (paper), not a mean: (0.25 − 0.5)/2 = −0.125 would be the mean
    assert scores[0].item() != pytest.approx(adv[:2].mean().item())


def test_pair_accuracy_counts_ties_as_wrong():
    acc, margin = pair_accuracy_and_margin(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 3.0]))
    assert acc == pytest.approx(1 / 3) and margin == pytest.approx(0.0)


# ---- against plain forward passes of two models ------------------------------------------


@pytest.fixture(scope="module")
def two_models(tiny_tokenizer):
    """π_ref = the tiny model; θ = the tiny model with seeded noise on every weight."""
    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model

    ref = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    theta = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in theta.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return theta, ref


def _state(info: str = "def f():\n    return 'apple'") -> State:
    prompt = ({"role": "system", "content": "Ask, then answer."}, {"role": "user", "content": "I need f."},
              {"role": "assistant", "content": "Is it a word?"}, {"role": "user", "content": "Yes."})
    return State("t0", "t0/a/0", 1, prompt, None, info)


def _manual_advantage(tok, theta, ref, state, action, beta, length_normalize, header="Training-time information",
                      training_info=True, eos_as_last=None):
    """A by hand: template the critic's messages, append a_t + eos (or + `eos_as_last`
    instead of eos), one unpadded forward each."""
    messages = with_training_info(state.prompt, state.training_info, header) if training_info else list(state.prompt)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    context = tok(text, add_special_tokens=False)["input_ids"]
    # c is in the critic's context, unless the ablation leaves it out
    assert (state.training_info.splitlines()[1] in tok.decode(context)) == training_info
    ids = torch.tensor([context + list(action) + [tok.eos_token_id if eos_as_last is None else eos_as_last]])
    n = len(action) + 1
    diffs = []
    for model in (theta, ref):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        # token at position i is predicted by the logits at i − 1
        diffs.append(sum(logp[i - 1, ids[0, i]].item() for i in range(len(context), ids.shape[1])))
    total = diffs[0] - diffs[1]
    return beta * (total / n if length_normalize else total)


@pytest.mark.parametrize("length_normalize,training_info", [(True, True), (False, True), (True, False)])
def test_scorer_matches_manual_forward(tiny_tokenizer, two_models, length_normalize, training_info):
    theta, ref = two_models
    tok = tiny_tokenizer
    record = CriticRecord(beta=0.7, length_normalize=length_normalize, header="Training-time information",
                          reference_model="tiny", eos_token_id=tok.eos_token_id, lora=False, dtype="float32",
                          max_length=1024, training_info=training_info)
    scorer = TrainedCritic(record, theta, ref, tok, torch.device("cpu"), batch_size=4)
    state = _state()
    actions = [tok("I WANT TO ANSWER: return 'apple'", add_special_tokens=False)["input_ids"],
               tok("Is it red?", add_special_tokens=False)["input_ids"],
               tok("ok", add_special_tokens=False)["input_ids"]]
    got = scorer.advantages(state, actions)  # one padded batch of 3 different lengths
    want = [_manual_advantage(tok, theta, ref, state, a, 0.7, length_normalize, training_info=training_info)
            for a in actions]
    assert got == pytest.approx(want, abs=1e-4)
    assert all(abs(w) > 1e-3 for w in want)  # the perturbation makes θ ≠ π_ref: not a 0 == 0 test
    # batched == one at a time, and score_states keeps the order across states; float32 sums over
    # ~100 positions in a padded batch and alone differ by ~1e-5 (summed, not averaged, when
    # length_normalize is off), hence the same 1e-4 as above
    assert [scorer.advantages(state, [a])[0] for a in actions] == pytest.approx(got, abs=1e-4)
    other = _state("def f():\n    return 'river'")
    both = scorer.score_states([(state, actions[:2]), (other, actions[2:])])
    assert both[0] == pytest.approx(got[:2], abs=1e-4)
    if training_info:  # c matters: the same action under other training-time information scores differently
        assert both[1][0] != pytest.approx(got[2], abs=1e-6)
    else:  # the ablation ignores c
        assert both[1][0] == pytest.approx(got[2], abs=1e-6)


@pytest.mark.parametrize("length_normalize", [True, False])
def test_value_head_scorer_by_hand(tiny_tokenizer, length_normalize):
    """head='value': A = β · mean (or Σ) over a_t's positions of w·h_i, h_i the decoder's
    last hidden state; no π_ref, no bias."""
    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model
    from sweet.core.value_head import ValueHeadModel

    tok = tiny_tokenizer
    model = ValueHeadModel(load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False))
    with torch.no_grad():
        model.v_head.weight.copy_(torch.randn(model.v_head.weight.shape, generator=torch.Generator().manual_seed(3)))
    assert model.v_head.bias is None
    record = CriticRecord(beta=0.7, length_normalize=length_normalize, header="Training-time information",
                          reference_model="tiny", eos_token_id=tok.eos_token_id, lora=False, dtype="float32",
                          max_length=1024, head="value")
    scorer = TrainedCritic(record, model, None, tok, torch.device("cpu"), batch_size=4)
    state = _state()
    actions = [tok("Is it red?", add_special_tokens=False)["input_ids"], tok("ok", add_special_tokens=False)["input_ids"]]
    text = tok.apply_chat_template(with_training_info(state.prompt, state.training_info, record.header),
                                   add_generation_prompt=True, tokenize=False)
    context = tok(text, add_special_tokens=False)["input_ids"]
    want = []
    for a in actions:
        ids = torch.tensor([context + list(a) + [tok.eos_token_id]])
        with torch.no_grad():
            h = model.lm(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].double()
        v = (h @ model.v_head.weight[0].double())[len(context):]
        want.append(0.7 * (v.mean() if length_normalize else v.sum()).item())
    assert scorer.advantages(state, actions) == pytest.approx(want, abs=1e-4)
    assert abs(want[0] - want[1]) > 1e-3


def test_a_value_head_saved_with_a_bias_loads_with_it(tmp_path):
    """A critic head written with a bias (LOOP's value head, or a critic saved with one) is
    read back with that bias, through save_pretrained/load_head and merge_and_unload's copy."""
    from safetensors.torch import save_file

    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model
    from sweet.core.value_head import VALUE_HEAD_FILE, ValueHeadModel

    lm = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    head = {"weight": torch.randn(1, lm.config.hidden_size, generator=torch.Generator().manual_seed(4)),
            "bias": torch.tensor([0.25])}
    save_file(head, str(tmp_path / VALUE_HEAD_FILE))
    model = ValueHeadModel(lm).load_head(tmp_path)
    assert model.v_head.bias.item() == 0.25 and torch.equal(model.v_head.weight, head["weight"])
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        h = lm.get_decoder()(input_ids=ids).last_hidden_state[0]
        assert torch.allclose(model(input_ids=ids)[0], h @ head["weight"][0] + 0.25, atol=1e-6)
    model.save_pretrained(tmp_path / "again")
    assert ValueHeadModel(lm).load_head(tmp_path / "again").v_head.bias.item() == 0.25


def test_scorer_load_needs_a_critic_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="critic_config.json"):
        TrainedCritic.load(tmp_path)
    (tmp_path / "critic_config.json").write_text('{"beta": 1.0}')
    with pytest.raises(ValueError, match="malformed critic config"):
        TrainedCritic.load(tmp_path)


def test_scorer_truncates_long_contexts_like_training(tiny_tokenizer, two_models):
    """A context too long for max_length is cut in the middle as make_batch does in
    training (the padded path), and the action is never cut."""
    from sweet.critic.model import CriticTurn, action_logprob_sums, critic_batch

    theta, ref = two_models
    tok = tiny_tokenizer
    record = CriticRecord(beta=1.0, length_normalize=True, header="Training-time information", reference_model="tiny",
                          eos_token_id=tok.eos_token_id, lora=False, dtype="float32", max_length=64, keep_head=16)
    scorer = TrainedCritic(record, theta, ref, tok, torch.device("cpu"))
    state = _state()
    actions = [tok("Is it red?", add_special_tokens=False)["input_ids"], tok("ok", add_special_tokens=False)["input_ids"]]
    examples = [CriticTurn(state, action_ids(a, tok.eos_token_id, None)) for a in actions]
    batch = critic_batch(tok, examples, record.header, 64, 16)
    assert batch.input_ids.shape[1] == 64  # truncated: the full context is longer
    with torch.no_grad():
        want = per_turn_advantage(action_logprob_sums(theta, batch), action_logprob_sums(ref, batch),
                                  torch.tensor([len(e.action_ids) for e in examples]), 1.0).tolist()
    assert scorer.advantages(state, actions) == pytest.approx(want, abs=1e-5)


def test_scorer_appends_end_of_turn_by_the_finish_reason(tiny_tokenizer, two_models):
    """The one turn->tokens rule (sweet.core.tokens.action_ids): eos after a turn the model
    ended ("stop", or an old record: None), not after a cut one ("length")."""
    theta, ref = two_models
    tok = tiny_tokenizer
    record = CriticRecord(beta=1.0, length_normalize=True, header="Training-time information", reference_model="tiny",
                          eos_token_id=tok.eos_token_id, lora=False, dtype="float32", max_length=1024)
    scorer = TrainedCritic(record, theta, ref, tok, torch.device("cpu"))
    state = _state()
    a = tok("Is it red?", add_special_tokens=False)["input_ids"]
    ended = _manual_advantage(tok, theta, ref, state, a, 1.0, True)  # a + eos
    cut = _manual_advantage(tok, theta, ref, state, a[:-1], 1.0, True, eos_as_last=a[-1])  # a, no eos
    got = scorer.advantages(state, [a, a, a], ["stop", None, "length"])
    assert got == pytest.approx([ended, ended, cut], abs=1e-4)
    assert abs(ended - cut) > 1e-3
    with pytest.raises(ValueError, match="2 actions but 1 finish reasons"):
        scorer.advantages(state, [a, a], ["stop"])


def test_truncation_keeps_the_whole_first_message_where_c_is(tiny_tokenizer):
    """A long context loses tokens from its middle, but never from the first message, which
    holds the task and c (a real reference is far longer than the default head): the batch
    starts with that whole message and ends with the latest turn and the action."""
    from sweet.critic.model import CriticTurn, critic_batch, critic_context_ids, first_message_length

    tok = tiny_tokenizer
    reference = "def f(x):\n" + "".join(f"    if x == {k}:\n        return 'word{k}'\n" for k in range(30))
    long_reply = "Yes. " * 200
    prompt = ({"role": "system", "content": "Ask, then answer."}, {"role": "user", "content": "I need f."},
              {"role": "assistant", "content": "Is it a word?"}, {"role": "user", "content": long_reply},
              {"role": "assistant", "content": "Which word?"}, {"role": "user", "content": "The last one."})
    state = State("t0", "t0/a/0", 2, prompt, None, reference)
    action = action_ids(tok("I WANT TO ANSWER: f", add_special_tokens=False)["input_ids"], tok.eos_token_id, "stop")
    context = critic_context_ids(tok, state)
    head = first_message_length(tok, state, context)
    max_length = head + 80
    assert head > 64 and len(context) + len(action) > max_length  # c alone is longer than keep_head; cut needed
    row = critic_batch(tok, [CriticTurn(state, action)], "Training-time information", max_length, 64).input_ids[0]
    assert len(row) == max_length
    assert row[:head].tolist() == context[:head]  # the whole first message, c's last line included
    assert row[-len(action):].tolist() == list(action)
    tail = max_length - head - len(action)
    assert row[head:head + tail].tolist() == context[-tail:]  # then the latest tokens
    # a head longer than keep_head is kept only when the context must be cut
    assert critic_batch(tok, [CriticTurn(state, action)], "Training-time information", None, 64).input_ids[0].tolist() \
        == context + list(action)


def test_critic_contexts_splice_c_into_the_policys_ids_and_a_trajectory_is_one_row(tiny_tokenizer, two_models):
    """Rule "splice": the first message with c, then the ids the policy saw, so the critic
    contexts of a trajectory sampled token in, token out continue one another: critic_batch
    runs it as one row, and the per-turn sums equal one row per turn. A critic saved before
    the rule (no context_rule in its config) keeps templating the chat whole."""
    from colbench.agents import ModelAgent
    from colbench.episodes import EpisodeConfig, prefix_consistent, run_episodes
    from engines.base import SamplingParams
    from engines.hf import HFEngine
    from sweet.core.records import episode_states
    from sweet.core.tokens import make_batch
    from sweet.critic.model import CriticRecord, CriticTurn, action_sums, critic_batch, critic_context_ids
    from sweet.critic.model import _first_message_ids, episode_turn_examples
    from testbed.env import TestbedEnv, make_tasks
    from testbed.human import TestbedSimulator

    tok = tiny_tokenizer
    theta, _ = two_models
    env = TestbedEnv(max_turns=3)
    agent = ModelAgent(HFEngine.from_model(theta, tok), SamplingParams(max_new_tokens=12), name="tiny",
                       continue_ids=True)
    try:
        [ep] = run_episodes(env, make_tasks("train", n=1, bed="legacy"), agent, TestbedSimulator(), seeds=(0,),
                            config=EpisodeConfig(max_turns=3), progress=False)
    finally:
        env.close()
    assert prefix_consistent(ep) and len(ep.agent_turns) == 3
    info = "the hidden reference"
    examples = episode_turn_examples(ep, info, tok)
    contexts = [critic_context_ids(tok, ex.state) for ex in examples]
    for ex, ctx, nxt in zip(examples, contexts, contexts[1:]):
        assert nxt[:len(ctx) + len(ex.action_ids)] == list(ctx) + list(ex.action_ids)
    assert info in tok.decode(contexts[0]) and list(ep.agent_turns[0].prompt_token_ids) != contexts[0]
    # c spliced in front of the policy's own ids: what follows the first message is theirs
    last = ep.agent_turns[-1]
    rest = len(last.prompt_token_ids) - len(_first_message_ids(tok, list(last.prompt)))
    assert rest > 0 and contexts[-1][-rest:] == list(last.prompt_token_ids[-rest:])
    batch = critic_batch(tok, examples, "Training-time information", None, 64)
    assert batch.input_ids.shape[0] == 1
    rows = make_batch([(c, ex.action_ids) for c, ex in zip(contexts, examples)], tok.pad_token_id, packed=False)
    with torch.no_grad():
        one, per_turn = action_sums(theta, batch, "lm"), action_sums(theta, rows, "lm")
    assert torch.allclose(one, per_turn, rtol=0, atol=1e-5), (one - per_turn).abs().max()
    # the trainer's log line says so; a max_length the whole trajectory passes is counted apart
    from sweet.core.config import ModelConfig
    from sweet.critic.train import CriticConfig, CriticData, one_pass_line

    data, ccfg = CriticData(examples, [[0, 1, 2]], [], []), CriticConfig()
    assert one_pass_line(data, ccfg, ModelConfig(model="tiny", max_length=None), tok, None) == (
        "critic: 1 of 1 trajectories run as one pass each")
    cut = len(contexts[-1]) + len(examples[-1].action_ids) - 1
    assert one_pass_line(data, ccfg, ModelConfig(model="tiny", max_length=cut), tok, None).endswith(
        f"0 of 1 trajectories run as one pass each; 1 longer than max_length={cut} (the turns past it run as rows "
        "of their own, cut)")
    # the scorer (the credit inspector's path) reads the trajectory the same way: one pass
    # gives each turn's advantage as scoring each state on its own does
    from sweet.critic.model import TrainedCritic

    record = CriticRecord(beta=0.5, length_normalize=True, header="Training-time information", reference_model="tiny",
                          eos_token_id=tok.eos_token_id, lora=False, dtype="float32", max_length=1024)
    scorer = TrainedCritic(record, theta, two_models[1], tok, torch.device("cpu"), batch_size=4)
    turns = [(ex.state, list(t.token_ids), t.finish_reason) for ex, t in zip(examples, ep.agent_turns)]
    alone = [scores[0] for scores in scorer.score_states([(s, [a], [r]) for s, a, r in turns])]
    [together] = scorer.score_trajectories([turns])
    assert together == pytest.approx(alone, abs=1e-5) and len(set(together)) == 3
    # an old critic's record: the chat templated whole (the tiny tokenizer then re-tokenises boundaries)
    old = CriticRecord(beta=1.0, length_normalize=True, header="h", reference_model="tiny", eos_token_id=1, lora=False)
    assert old.context_rule == "template"
    whole = [critic_context_ids(tok, s, rule=old.context_rule) for s in episode_states(ep, info)]
    assert whole[0] != contexts[0] or whole[1] != contexts[1]
    assert critic_batch(tok, [CriticTurn(s, ex.action_ids) for s, ex in zip(episode_states(ep, info), examples)],
                        "Training-time information", None, 64, rule="template").input_ids.shape[0] == 3
