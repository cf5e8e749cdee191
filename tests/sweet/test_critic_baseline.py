"""The centred critic (`--baseline_samples_per_state K`, sweet/critic/baseline.py): its loss by hand,
a turn the policy always takes carries nothing, and the samples are drawn once, resumably."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sweet.core.config import ModelConfig
from sweet.critic.baseline import SAMPLES_FILE, baseline_index, sample_baselines, state_key
from sweet.critic.train import CriticConfig, build_data, cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = ModelConfig(model="tiny", dtype="float32", max_length=512)


def _write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def _data(tmp_path, tok, make_synthetic, samples_of):
    """Three synthetic tasks' pairs, every turn with the baseline actions samples_of(turn)."""
    tasks, episodes = make_synthetic(tok, 3, secrets=("apple", "river"))
    ccfg = CriticConfig(episodes=str(_write(tmp_path / "e.jsonl", episodes)),
                        tasks=str(_write(tmp_path / "t.jsonl", tasks)), eval_fraction=0.0, beta=0.5,
                        baseline_samples_per_state=2)
    data = build_data(ccfg, tok, 0)
    n = len(data.turns)
    samples = {state_key(t): samples_of(t) for t in data.turns}
    data.baseline = baseline_index(data.turns, n, samples)
    return ccfg, data, n


def _terms(data, ccfg, tok, theta, ref):
    from accelerate import Accelerator

    from sweet.critic.train import pair_terms, sharded_action_sums

    ref_sums = sharded_action_sums(Accelerator(cpu=True), ref, tok, data.turns, list(range(len(data.turns))), MODEL,
                                   replace(ccfg, eval_batch_size=3))
    return pair_terms(theta, tok, data, ref_sums, data.train_pairs, ccfg, MODEL, torch.device("cpu")), ref_sums


def _perturbed(seed: int):
    from sweet.core.models import load_model

    model = load_model(MODEL, trainable=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def test_centred_pair_terms_by_hand(tmp_path, tiny_tokenizer, make_synthetic, fresh_accelerate):
    """score(τ) = Σ_t [A(a_t) − ½(A(a_t) + A(b_t))] with one sample equal to the action taken
    and one other action b_t: the BT loss and margin of pair_terms are that, by hand."""
    from sweet.core.models import load_model

    tok = tiny_tokenizer
    other = tuple(tok("maybe later", add_special_tokens=False)["input_ids"]) + (tok.eos_token_id,)
    ccfg, data, n = _data(tmp_path, tok, make_synthetic, lambda t: (t.action_ids, other))
    assert len(data.turns) > n  # the other action was appended once per state
    ref, theta = load_model(MODEL, trainable=False), _perturbed(1)
    with torch.no_grad():
        (bt, _, margin), ref_sums = _terms(data, ccfg, tok, theta, ref)
        from sweet.critic.train import sharded_action_sums
        from accelerate import Accelerator

        theta_sums = sharded_action_sums(Accelerator(cpu=True), theta, tok, data.turns, list(range(len(data.turns))),
                                         MODEL, replace(ccfg, eval_batch_size=3))

    def adv(t):
        return 0.5 * (theta_sums[t] - ref_sums[t]).item() / len(data.turns[t].action_ids)

    def score(e):
        return sum(adv(t) - 0.5 * sum(adv(b) for b in data.baseline[t]) for t in data.episode_turns[e])

    for k, (c, r) in enumerate(data.train_pairs):
        diff = score(c) - score(r)
        assert abs(diff) > 1e-4
        assert margin[k].item() == pytest.approx(diff, abs=1e-4)
        assert bt[k].item() == pytest.approx(math.log1p(math.exp(-diff)), abs=1e-4)


def test_a_turn_the_policy_always_takes_carries_no_credit(tmp_path, tiny_tokenizer, make_synthetic,
                                                           fresh_accelerate):
    """Samples are a function of the state: here both are the first action recorded there.
    A turn that took it has a centred advantage of exactly 0 and passes no gradient to the
    critic; a turn that took another action does not."""
    from accelerate import Accelerator

    from sweet.core.models import load_model
    from sweet.critic.train import critic_batch, action_sums, needed_turns, sharded_action_sums, turn_advantages

    tok = tiny_tokenizer
    first: dict[str, tuple] = {}
    ccfg, data, n = _data(tmp_path, tok, make_synthetic, lambda t: (first.setdefault(state_key(t), t.action_ids),) * 2)
    assert len(data.turns) == n  # every sample is an action already taken
    same = [t for t in range(n) if all(data.turns[b].action_ids == data.turns[t].action_ids for b in data.baseline[t])]
    assert 0 < len(same) < n
    ref = load_model(MODEL, trainable=False)
    ref_sums = sharded_action_sums(Accelerator(cpu=True), ref, tok, data.turns, list(range(n)), MODEL, ccfg)
    theta = _perturbed(2)
    for p in theta.parameters():
        p.requires_grad_(True)
    turn_idx = list(range(n))
    needed = needed_turns(data, turn_idx)
    batch = critic_batch(tok, [data.turns[t] for t in needed], ccfg.header, MODEL.max_length, MODEL.keep_head)
    adv = turn_advantages(action_sums(theta, batch), ref_sums, data, turn_idx, needed, ccfg)
    assert all(adv[t].item() == 0.0 for t in same)
    assert all(abs(adv[t].item()) > 1e-6 for t in set(turn_idx) - set(same))
    adv[same].sum().backward()
    assert all(p.grad is None or p.grad.abs().max().item() < 1e-12 for p in theta.parameters())


def test_baseline_samples_are_drawn_once_per_state_and_resume_exactly(tmp_path, tiny_tokenizer, make_synthetic):
    from engines.tiny import tiny_model_path

    tok = tiny_tokenizer
    tasks, episodes = make_synthetic(tok, 5)
    ccfg = CriticConfig(episodes=str(_write(tmp_path / "e.jsonl", episodes)),
                        tasks=str(_write(tmp_path / "t.jsonl", tasks)), eval_fraction=0.0)
    turns = build_data(ccfg, tok, 0).turns
    states = {state_key(t) for t in turns}
    assert len(states) < len(turns)  # a task's two episodes start from one state
    sampler = f"hf:{tiny_model_path()}"
    full = sample_baselines(turns, sampler, 3, 6, tok.eos_token_id, tmp_path / "a", seed=7, batch_size=2)
    assert set(full) == states and all(len(v) == 3 for v in full.values())
    rows = (tmp_path / "a" / SAMPLES_FILE).read_text().splitlines()
    assert len(rows) == len(states)
    # interrupted after the first chunk, with a torn line: the rerun draws the rest as the full run did
    part = tmp_path / "b"
    part.mkdir()
    (part / SAMPLES_FILE).write_text("\n".join(rows[:2]) + "\n" + rows[2][:10])
    (part / "baseline_samples.settings.json").write_text((tmp_path / "a" / "baseline_samples.settings.json").read_text())
    assert sample_baselines(turns, sampler, 3, 6, tok.eos_token_id, part, seed=7, batch_size=2) == full
    with pytest.raises(ValueError, match="other settings.*'k': '3 -> 4'"):
        sample_baselines(turns, sampler, 4, 6, tok.eos_token_id, part, seed=7, batch_size=2)


def test_centred_critic_trains_end_to_end(tmp_path, synthetic_files, fresh_accelerate):
    out = tmp_path / "critic"
    metrics = cli(["--episodes", str(synthetic_files[0]), "--tasks", str(synthetic_files[1]), "--output_dir", str(out),
                   "--num_epochs", "1", "--batch_size", "4", "--micro_batch_size", "2", "--learning_rate", "2e-3",
                   "--eval_fraction", "0.2", "--max_pairs", "8", "--max_length", "512", "--report_to", "none",
                   "--baseline_samples_per_state", "2", "--baseline_max_new_tokens", "6"])
    assert 0.0 <= metrics["critic/pair_accuracy"] <= 1.0
    rows = [json.loads(x) for x in (out / SAMPLES_FILE).read_text().splitlines()]
    assert rows and all(len(r["actions"]) == 2 for r in rows)
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(math.isfinite(r["loss/bt"]) for r in logged if "loss/bt" in r)
    assert json.loads((out / "config.json").read_text())["critic"]["baseline_samples_per_state"] == 2
    # the inspector centres as training did: with every state's samples = the first action
    # recorded there, a turn that took it scores 0 and another turn A(its action) − A(that one)
    from colbench.episodes import load_episodes
    from sweet.core.records import episode_states
    from sweet.critic.baseline import state_key_of
    from sweet.critic.inspect import advantages_of
    from sweet.critic.model import TrainedCritic, load_training_info

    scorer = TrainedCritic.load(str(out))
    episodes = load_episodes(synthetic_files[0], env="backend")[:10]
    info = load_training_info(str(synthetic_files[1]), env="backend")
    first, taken = {}, {}
    for ep in episodes:
        for state, turn in zip(episode_states(ep, info[ep.task_id]), ep.agent_turns):
            eos = (scorer.record.eos_token_id,) if turn.finish_reason in ("stop", None) else ()
            ids = tuple(turn.token_ids) + eos
            first.setdefault(state_key_of(state.prompt, state.training_info), ids)
            taken[(ep.episode_id, state.turn_index)] = ids
    baselines = {k: (v, v) for k, v in first.items()}
    raw, centred = advantages_of(scorer, episodes, info), advantages_of(scorer, episodes, info, baselines)
    by_action = {}
    for ep in episodes:
        for t, state in enumerate(episode_states(ep, info[ep.task_id])):
            by_action[(state_key_of(state.prompt, state.training_info), taken[(ep.episode_id, t)])] = raw[ep.episode_id][t]
    n_zero = 0
    for ep in episodes:
        for t, state in enumerate(episode_states(ep, info[ep.task_id])):
            key = state_key_of(state.prompt, state.training_info)
            want = raw[ep.episode_id][t] - by_action[(key, first[key])]
            assert centred[ep.episode_id][t] == pytest.approx(want, abs=1e-4)
            n_zero += taken[(ep.episode_id, t)] == first[key]
    assert 0 < n_zero < sum(len(ep.agent_turns) for ep in episodes)


@pytest.mark.heavy
def test_centred_critic_on_two_cpu_processes_matches_one(tmp_path, synthetic_files, fresh_accelerate):
    """The main process's samples are read by both processes (here: the one-process run's,
    so that only the training differs), and 2 processes (gloo) end on the weights of 1."""
    import os
    import shutil
    import subprocess
    import sys

    from safetensors.torch import load_file

    root = Path(__file__).resolve().parents[2]
    args = lambda out: ["--episodes", str(synthetic_files[0]), "--tasks", str(synthetic_files[1]),  # noqa: E731
                        "--output_dir", str(out), "--num_epochs", "1", "--batch_size", "4", "--micro_batch_size", "2",
                        "--learning_rate", "2e-3", "--eval_fraction", "0.2", "--max_pairs", "8", "--max_length", "512",
                        "--report_to", "none", "--baseline_samples_per_state", "2", "--baseline_max_new_tokens", "6"]
    one = tmp_path / "one"
    final = cli(args(one))
    ddp = tmp_path / "ddp"
    ddp.mkdir()
    for name in (SAMPLES_FILE, "baseline_samples.settings.json"):
        shutil.copy(one / name, ddp / name)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(root / "sweet/configs/ddp_cpu_2proc.yaml"), "--main_process_port", "29653", "-m", "sweet.train_critic",
           *args(ddp)]
    proc = subprocess.run(cmd, cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es) (MULTI_CPU)" in proc.stdout and "baseline samples" not in proc.stderr  # nothing drawn
    assert json.loads((ddp / "final_metrics.json").read_text()) == pytest.approx(final, abs=1e-4)
    w1, w2 = load_file(str(one / "final" / "model.safetensors")), load_file(str(ddp / "final" / "model.safetensors"))
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)
