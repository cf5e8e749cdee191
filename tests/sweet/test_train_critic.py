"""`python -m sweet.train_critic` end to end on the tiny model: it learns, resumes
exactly, gives the same result on 2 processes, and the scorer reproduces training."""

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sweet.core.config import ModelConfig
from sweet.critic.train import CriticConfig, CriticTrainConfig, build_data, cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]


def _args(episodes, tasks, out, *extra):
    return ["--episodes", str(episodes), "--tasks", str(tasks), "--output_dir", str(out), "--num_epochs", "2",
            "--batch_size", "4", "--micro_batch_size", "2", "--learning_rate", "2e-3", "--eval_fraction", "0.2",
            "--max_pairs", "12", "--max_length", "512", "--report_to", "none", *extra]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(path: Path, file: str = "model.safetensors") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / file))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synthetic_files):
    """One in-process 2-epoch run: 12 training pairs, 8 held-out pairs (by task)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    out = tmp_path_factory.mktemp("critic") / "run"
    metrics = cli(_args(*synthetic_files, out))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return out, metrics


def test_critic_learns_and_writes_outputs(trained):
    out, final = trained
    rows = _metrics(out)
    bt = [r["loss/bt"] for r in rows if "loss/bt" in r]
    assert bt[0] == pytest.approx(0.6931, abs=1e-3)  # θ = π_ref at start: every A is 0, L = log 2
    assert bt[-1] < 0.4 * bt[0]
    evals = [r for r in rows if "critic/pair_accuracy" in r]
    assert [r["train/epoch"] for r in evals] == [1, 2]
    assert final["critic/pair_accuracy"] >= 0.75 and final["critic/margin"] > 0  # chance: 0.5 (0 at start)
    spec = json.loads((out / "critic_config.json").read_text())
    assert spec["beta"] == 1.0 and spec["length_normalize"] is True and spec["reference_model"] == "tiny"
    assert spec["header"] == "Training-time information" and spec["context_rule"] == "splice"
    from engines.tiny import tiny_model_path

    before, after = _weights(tiny_model_path()), _weights(out / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (out / "ref_logprobs.pt").exists() and (out / "config.json").exists()


def test_resume_matches_uninterrupted_run(trained, tmp_path, synthetic_files, fresh_accelerate):
    out, final = trained
    resumed = tmp_path / "run"
    shutil.copytree(out, resumed)
    # as if killed during epoch 2: the epoch-1 checkpoint (step 3) is the last one
    assert sorted(p.name for p in resumed.glob("checkpoint-*")) == ["checkpoint-3"]
    for name in ("final", "final_metrics.json", "critic_config.json", "finished.json"):
        path = resumed / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    rows = _metrics(resumed)
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))  # + a half-logged step 4
    got = cli(_args(*synthetic_files, resumed))
    assert got == pytest.approx(final, abs=1e-6)
    assert [r.keys() for r in _metrics(resumed)] == [r.keys() for r in _metrics(out)]
    for a, b in zip(_metrics(resumed), _metrics(out)):
        assert a == pytest.approx(b, abs=1e-6)
    w1, w2 = _weights(out / "final"), _weights(resumed / "final")
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1)


@pytest.mark.heavy
def test_two_cpu_processes_match_one(trained, tmp_path, synthetic_files):
    out, final = trained
    ddp = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "sweet/configs/ddp_cpu_2proc.yaml"),
           "--main_process_port", "29623", "-m", "sweet.train_critic", *_args(*synthetic_files, ddp)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es) (MULTI_CPU)" in proc.stdout  # really distributed, not two lone processes
    got = json.loads((ddp / "final_metrics.json").read_text())
    assert got == pytest.approx(final, abs=1e-4)
    w1, w2 = _weights(out / "final"), _weights(ddp / "final")
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)


def test_scorer_reproduces_training_conditioning(trained, synthetic_files, tiny_tokenizer):
    """TrainedCritic.load(out).advantages == A computed the training way (final θ and
    the cached π_ref sums of training) for held-out turns."""
    from sweet.core.models import load_model
    from sweet.critic.model import TrainedCritic, action_logprob_sums, critic_batch, per_turn_advantage

    out, _ = trained
    episodes, tasks = synthetic_files
    ccfg = CriticConfig(episodes=str(episodes), tasks=str(tasks), eval_fraction=0.2, max_pairs=12)
    data = build_data(ccfg, tiny_tokenizer, seed=0)
    ref_sums = torch.load(out / "ref_logprobs.pt", weights_only=False)["values"]
    chosen, rejected = data.eval_pairs[0]
    idx = data.episode_turns[chosen] + data.episode_turns[rejected]
    turns = [data.turns[i] for i in idx]
    theta = load_model(ModelConfig(model=str(out / "final"), dtype="float32"), trainable=False)
    with torch.no_grad():
        logp = action_logprob_sums(theta, critic_batch(tiny_tokenizer, turns, ccfg.header, 512, 512))
    n = torch.tensor([len(t.action_ids) for t in turns])
    want = per_turn_advantage(logp, ref_sums[idx], n, 1.0, True).tolist()

    scorer = TrainedCritic.load(out, device="cpu")
    # stage 2 passes the generated ids without eos; the scorer appends it as training did
    got = [scorer.advantages(t.state, [list(t.action_ids[:-1])])[0] for t in turns]
    assert got == pytest.approx(want, abs=1e-4)
    assert sum(got[:2]) > sum(got[2:])  # the trained critic prefers the held-out chosen trajectory


def test_lora_critic_trains_and_scores(tmp_path, synthetic_files, fresh_accelerate):
    out = tmp_path / "lora"
    cli(_args(*synthetic_files, out, "--lora", "true", "--lora_r", "4", "--num_epochs", "1", "--max_pairs", "4",
              "--learning_rate", "1e-2"))
    spec = json.loads((out / "critic_config.json").read_text())
    assert spec["lora"] is True and (out / spec["adapter_dir"]).exists()
    from sweet.core.records import episode_states, load_episodes
    from sweet.critic.model import TrainedCritic

    scorer = TrainedCritic.load(out, device="cpu")
    assert scorer.ref_model is None  # π_ref = the base with adapters disabled, one model in memory
    ep = load_episodes(synthetic_files[0])[0]
    state = episode_states(ep, "def f():\n    return 'apple'")[0]
    advs = scorer.advantages(state, [ep.agent_turns[0].token_ids])
    assert advs[0] != 0.0


# ---- bad input -----------------------------------------------------------------------------


def _write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def test_bad_inputs_give_clear_errors(tmp_path, tiny_tokenizer, make_synthetic):
    tasks, episodes = make_synthetic(tiny_tokenizer, 4)
    tasks_file = _write(tmp_path / "tasks.jsonl", tasks)

    for ep in episodes:  # nothing succeeds: no pairs
        ep.score.reward = 0.0
    failing = _write(tmp_path / "failing.jsonl", episodes)
    with pytest.raises(ValueError, match=r"no trajectory pairs from 8 episodes over 4 tasks \(0 tasks reach"):
        build_data(CriticConfig(episodes=str(failing), tasks=str(tasks_file)), tiny_tokenizer, 0)

    tasks, episodes = make_synthetic(tiny_tokenizer, 4)
    good = _write(tmp_path / "good.jsonl", episodes)
    partial = _write(tmp_path / "partial.jsonl", tasks[:3])
    with pytest.raises(ValueError, match="task 'syn-003'.*not in --tasks"):
        build_data(CriticConfig(episodes=str(good), tasks=str(partial), eval_fraction=0.0), tiny_tokenizer, 0)

    for ep in episodes:
        ep.turns[0].token_ids = None
    no_ids = _write(tmp_path / "no_ids.jsonl", episodes)
    with pytest.raises(ValueError, match="agent turn 0: .*no generated token_ids.*tokenize_missing_actions"):
        build_data(CriticConfig(episodes=str(no_ids), tasks=str(tasks_file)), tiny_tokenizer, 0)
    data = build_data(CriticConfig(episodes=str(no_ids), tasks=str(tasks_file), tokenize_missing_actions=True),
                      tiny_tokenizer, 0)
    assert data.turns

    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        build_data(CriticConfig(episodes=str(tmp_path / "missing.jsonl"), tasks=str(tasks_file)), tiny_tokenizer, 0)
    with pytest.raises(ValueError, match="--tasks is required"):
        build_data(CriticConfig(episodes=str(good)), tiny_tokenizer, 0)
    # published trajectories carry their task: no --tasks needed
    tasks_by_id = {t.task_id: t for t in tasks}
    for ep in episodes:
        ep.meta["task"] = tasks_by_id[ep.task_id].to_json()
    with_tasks = _write(tmp_path / "with_tasks.jsonl", episodes)
    data = build_data(CriticConfig(episodes=str(with_tasks), tokenize_missing_actions=True, eval_fraction=0.0),
                      tiny_tokenizer, 0)
    assert {t.state.training_info for t in data.turns} == {tasks[0].hidden}  # every secret is "apple"
    with pytest.raises(ValueError, match="model 'hf:/nonexistent/model': no such folder /nonexistent/model"):
        cli(["--episodes", str(good), "--tasks", str(tasks_file), "--model", "hf:/nonexistent/model",
             "--output_dir", str(tmp_path / "x"), "--report_to", "none"])
    with pytest.raises(ValueError, match="eval_fraction"):
        CriticConfig(eval_fraction=1.5)


def test_help_is_fast_and_yaml_config_works(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sweet.train_critic", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--length_normalize" in proc.stdout and "--nll_coef" in proc.stdout
    assert "--training_info" in proc.stdout and "--head" in proc.stdout and "sweet_value_head" in proc.stdout
    probe = "import sys, sweet.train_critic, sweet.critic; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True).stdout.strip() == "False"
    from sweet.core.config import parse_configs

    (tmp_path / "run.yaml").write_text("beta: 0.5\nnum_epochs: 3\nlora: true\n")
    ccfg, mcfg, tcfg = parse_configs([CriticConfig, ModelConfig, CriticTrainConfig],
                                     ["--config", str(tmp_path / "run.yaml"), "--num_epochs", "2"])
    assert (ccfg.beta, mcfg.lora, tcfg.num_epochs, tcfg.batch_size) == (0.5, True, 2, 8)
    assert CriticTrainConfig().num_epochs == 4  # the paper's critic epochs


VARIANTS = {  # name -> CriticConfig switches (the paper's ablations, as benchmarked in testbed/learning.py)
    "sweet": {},
    "sweet_sum": {"length_normalize": False},
    "sweet_no_info": {"training_info": False},
    "sweet_value_head": {"head": "value"},
}


def _perturbed(model, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pair_terms_by_hand(tmp_path, tiny_tokenizer, make_synthetic, fresh_accelerate, variant):
    """The training-time BT loss and NLL of a few pairs == the paper's formula from
    unpadded per-turn forward passes: score = Σ_t β·reduce_{y ∈ a_t}(log π_θ − log π_ref)
    (reduce = mean, or sum for sweet_sum; the context without c for sweet_no_info;
    v(x_≤i) = w·h_i + b from the last hidden state instead of log-probs for the value head)."""
    from accelerate import Accelerator

    from sweet.core.models import load_model
    from sweet.core.value_head import ValueHeadModel
    from sweet.critic.train import pair_terms, sharded_action_sums

    switches = VARIANTS[variant]
    tok = tiny_tokenizer
    tasks, episodes = make_synthetic(tok, 3, secrets=("apple", "river"))
    ccfg = CriticConfig(episodes=str(_write(tmp_path / "e.jsonl", episodes)), tasks=str(_write(tmp_path / "t.jsonl", tasks)),
                        eval_fraction=0.0, beta=0.5, **switches)
    data = build_data(ccfg, tok, 0)
    mcfg = ModelConfig(model="tiny", dtype="float32", max_length=512)
    ref = load_model(mcfg, trainable=False)
    theta = _perturbed(load_model(mcfg, trainable=False), 1)
    value = switches.get("head") == "value"
    if value:
        theta = ValueHeadModel(theta)
        with torch.no_grad():
            theta.v_head.weight.copy_(torch.randn(theta.v_head.weight.shape, generator=torch.Generator().manual_seed(2)))
    acc = Accelerator(cpu=True)
    ref_sums = torch.zeros(len(data.turns), dtype=torch.float64) if value else sharded_action_sums(
        acc, ref, tok, data.turns, list(range(len(data.turns))), mcfg, replace(ccfg, eval_batch_size=3))
    with torch.no_grad():
        bt, nll, margin = pair_terms(theta, tok, data, ref_sums, data.train_pairs, ccfg, mcfg, torch.device("cpu"))

    def context(t):  # built here from the chat template, not with the critic's helper
        state = data.turns[t].state
        messages = [dict(m) for m in state.prompt]
        if ccfg.training_info:
            secret = next(task.hidden for task in tasks if task.task_id == state.task_id)
            messages[0]["content"] += (f"\n\n[Training-time information, hidden from the agent]\n{secret}\n"
                                       "[end of training-time information]")
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    def turn_sum(model, t):  # Σ over a_t of log π (value head: of v), one unpadded sequence
        ex = data.turns[t]
        ids = torch.tensor([context(t) + list(ex.action_ids)])
        start = ids.shape[1] - len(ex.action_ids)
        with torch.no_grad():
            if isinstance(model, ValueHeadModel):
                h = model.lm(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].double()
                v = h @ model.v_head.weight[0].double()
                return v[start:].sum().item(), len(ex.action_ids)
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        return sum(logp[i - 1, ids[0, i]].item() for i in range(start, ids.shape[1])), len(ex.action_ids)

    def score(e):
        total = 0.0
        for t in data.episode_turns[e]:
            (lt, n), lr = turn_sum(theta, t), (0.0 if value else turn_sum(ref, t)[0])
            total += 0.5 * (lt - lr) / (n if ccfg.length_normalize else 1)
        return total

    assert len(data.train_pairs) == 3
    for k, (c, r) in enumerate(data.train_pairs):
        diff = score(c) - score(r)
        assert abs(diff) > 1e-3  # not a 0 == 0 test
        assert margin[k].item() == pytest.approx(diff, abs=1e-4)
        assert bt[k].item() == pytest.approx(math.log1p(math.exp(-diff)), abs=1e-4)  # −log σ(diff)
        if not value:
            logps = [turn_sum(theta, t) for t in data.episode_turns[c]]
            assert nll[k].item() == pytest.approx(-sum(l for l, _ in logps) / sum(n for _, n in logps), abs=1e-4)


@pytest.mark.parametrize("variant", ["sweet_sum", "sweet_no_info", "sweet_value_head", "sweet_value_head_lora"])
def test_ablation_critic_trains_and_scores_as_trained(tmp_path, synthetic_files, tiny_tokenizer, fresh_accelerate,
                                                      variant):
    """Each ablation end to end: `python -m sweet.train_critic <flag>` learns, records the
    switch in critic_config.json, and TrainedCritic.load scores the held-out pairs with
    the same head, reduction and context: its margins reproduce training's
    `critic/margin` metric. (LoRA value head: the adapter and the head in final/.)"""
    from sweet.critic.model import TrainedCritic

    lora = variant.endswith("_lora")
    variant = variant.removesuffix("_lora")
    flags = {"sweet_sum": ["--length_normalize", "false"], "sweet_no_info": ["--training_info", "false"],
             "sweet_value_head": ["--head", "value"]}[variant]
    if lora:
        flags += ["--lora", "true", "--lora_r", "4", "--num_epochs", "1", "--learning_rate", "1e-2"]
    episodes, tasks = synthetic_files
    out = tmp_path / variant
    args = _args(episodes, tasks, out, *flags)
    if variant == "sweet_no_info":  # c is not needed: no --tasks
        i = args.index("--tasks")
        del args[i : i + 2]
    final = cli(args)
    spec = json.loads((out / "critic_config.json").read_text())
    assert (spec["length_normalize"], spec["training_info"], spec["head"]) == {
        "sweet_sum": (False, True, "lm"), "sweet_no_info": (True, False, "lm"), "sweet_value_head": (True, True, "value")}[variant]
    bt = [r["loss/bt"] for r in _metrics(out) if "loss/bt" in r]
    assert bt[0] == pytest.approx(math.log(2), abs=1e-3)  # every A is 0 at the start (θ = π_ref, or v = 0)
    if lora:
        assert spec["lora"] and (out / spec["adapter_dir"] / "adapter_config.json").exists()
    else:
        assert bt[-1] < 0.9 * bt[0]
        assert final["critic/pair_accuracy"] >= 0.75 and final["critic/margin"] > 0  # chance: 0.5
    assert (out / "ref_logprobs.pt").exists() == (variant != "sweet_value_head")  # the value head has no π_ref

    ccfg = CriticConfig(episodes=str(episodes), tasks=str(tasks), eval_fraction=0.2, max_pairs=12,
                        **VARIANTS[variant])
    data = build_data(ccfg, tiny_tokenizer, seed=0)
    scorer = TrainedCritic.load(out, device="cpu")

    def score(e):  # stage 2's call: generated ids without eos, the state with c
        return sum(scorer.advantages(data.turns[t].state, [list(data.turns[t].action_ids[:-1])])[0]
                   for t in data.episode_turns[e])

    margins = [score(c) - score(r) for c, r in data.eval_pairs]
    assert sum(margins) / len(margins) == pytest.approx(final["critic/margin"], abs=1e-4)
    assert any(abs(m) > 1e-4 for m in margins)  # a trained critic, not an all-zero one
    if variant == "sweet_no_info":  # c is ignored by the scorer too
        turn = data.turns[data.episode_turns[data.eval_pairs[0][0]][0]]
        other = replace(turn.state, training_info="def f():\n    return 'river'")
        action = [list(turn.action_ids[:-1])]
        assert scorer.advantages(other, action) == pytest.approx(scorer.advantages(turn.state, action), abs=1e-6)


def test_micro_batch_size_does_not_change_the_update(tmp_path, synthetic_files, fresh_accelerate):
    """One optimiser step of 4 pairs as 4 micro-batches of 1 or 1 micro-batch of 4 gives
    the same weights (the loss is the mean over the step's pairs either way)."""
    from engines.tiny import tiny_model_path

    runs = {}
    for micro in (1, 4):
        out = tmp_path / f"micro{micro}"
        args = _args(*synthetic_files, out, "--num_epochs", "1", "--max_pairs", "8", "--eval_fraction", "0")
        args[args.index("--micro_batch_size") + 1] = str(micro)
        cli(args)
        runs[micro] = _weights(out / "final")
    before = _weights(tiny_model_path())
    delta1 = torch.cat([(runs[1][k] - before[k]).flatten() for k in before])
    delta4 = torch.cat([(runs[4][k] - before[k]).flatten() for k in before])
    assert delta1.norm() > 1e-3  # two optimiser steps really moved the weights
    # measured: max |Δ1 − Δ4| 3e-5 against max |Δ| 3e-3 (Adam magnifies float noise where g ≈ 0), cosine 0.999999
    assert torch.allclose(delta1, delta4, atol=1e-4)
    assert torch.nn.functional.cosine_similarity(delta1, delta4, dim=0).item() > 0.99999


def _launch(dist, args: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [*dist.launch(port), "-m", "sweet.train_critic", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("head,port", [("lm", 29631), ("value", 29641)])
def test_two_processes_killed_and_resumed_match_uninterrupted(tmp_path, synthetic_files, fresh_accelerate, checkpoint_layout,
                                                              kill_tree, head, port, dist):
    """2 processes (DDP or FSDP2 over gloo; the GPU configs with $SWEET_DIST_CONFIGS) give
    the weights of 1; a 2-process run SIGKILLed after its first checkpoint and relaunched
    gives the uninterrupted run's final weights and metrics. FSDP really shards (each process
    writes its own shard of the checkpoint), not accelerate's silent DDP fallback on CPU
    (sweet.core.trainer.make_accelerator)."""
    import time

    flags = ["--head", head, "--save_steps", "1"]
    final = cli(_args(*synthetic_files, tmp_path / "one", *flags))
    whole = tmp_path / "whole"
    out = _finish(_launch(dist, _args(*synthetic_files, whole, *flags), port))
    assert f"2 process(es) ({dist.kind})" in out
    files = ["model.safetensors"] + (["value_head.safetensors"] if head == "value" else [])
    w1 = {f"{f}:{k}": v for f in files for k, v in _weights(tmp_path / "one" / "final", f).items()}
    w2 = {f"{f}:{k}": v for f in files for k, v in _weights(whole / "final", f).items()}
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)
    assert json.loads((whole / "final_metrics.json").read_text()) == pytest.approx(final, abs=1e-4)

    killed = tmp_path / "killed"
    proc = _launch(dist, _args(*synthetic_files, killed, *flags), port + 1)
    deadline = time.time() + 600
    while not (killed / "checkpoint-1" / "state.json").exists():
        assert proc.poll() is None and time.time() < deadline, "no checkpoint before the run ended"
        time.sleep(0.2)
    kill_tree(proc)
    assert not (killed / "final").exists()
    assert checkpoint_layout(killed / "checkpoint-1") == (2, dist.sharded)
    out = _finish(_launch(dist, _args(*synthetic_files, killed, *flags), port + 2))
    assert "resuming from" in out
    w3 = {f"{f}:{k}": v for f in files for k, v in _weights(killed / "final", f).items()}
    assert all(torch.allclose(w2[k], w3[k], atol=1e-6) for k in w2)
    assert json.loads((killed / "final_metrics.json").read_text()) == pytest.approx(
        json.loads((whole / "final_metrics.json").read_text()), abs=1e-6)
    rows = lambda d: [r for r in _metrics(d) if "loss/bt" in r]  # noqa: E731
    assert [r["loss/bt"] for r in rows(killed)] == pytest.approx([r["loss/bt"] for r in rows(whole)], abs=1e-6)


def test_training_actions_follow_the_finish_reason(tmp_path, tiny_tokenizer, make_synthetic):
    """Training turns use the one turn->tokens rule: + eos after "stop" (and old records),
    nothing after a cut ("length")."""
    tok = tiny_tokenizer
    tasks, episodes = make_synthetic(tok, 2)
    ep = episodes[0]
    question, answer = ep.agent_turns
    question.finish_reason, answer.finish_reason = "length", "stop"
    data = build_data(CriticConfig(episodes=str(_write(tmp_path / "e.jsonl", episodes)),
                                   tasks=str(_write(tmp_path / "t.jsonl", tasks)), eval_fraction=0.0), tok, 0)
    mine = [t.action_ids for t in data.turns if t.state.episode_id == ep.episode_id]
    assert mine == [tuple(question.token_ids), tuple(answer.token_ids) + (tok.eos_token_id,)]
    others = [t.action_ids for t in data.turns if t.state.episode_id != ep.episode_id]
    assert others and all(a[-1] == tok.eos_token_id for a in others)  # finish_reason None: an old record


@pytest.mark.parametrize("variant", ["sweet", "sweet_value_head"])
def test_loss_hook_is_a_sum_over_pairs(tmp_path, tiny_tokenizer, make_synthetic, variant):
    """The skeleton divides the hook's loss by the step's pair count (sweet/core/trainer.py), so
    the hook must return a plain sum over its pairs: the gradient of one call on 3 pairs
    equals the sum of 3 one-pair calls (what makes any micro-batch split the same step;
    Adam would hide a wrong overall scale in the weight tests).

    An identity of exact arithmetic, so it is checked in float64: in float32 the roundoff of
    this network's gradients alone reaches 0.2-0.9 x 1e-5 x max|g| (each of the two sides
    is that far from the float64 gradient), so a float32 check at that bound failed for some
    value-head weights. The head's weights come from a seeded generator, not the global RNG
    (which earlier tests in the same process move): the same model in any test order."""
    from sweet.core.models import load_model
    from sweet.core.value_head import ValueHeadModel
    from sweet.critic.train import critic_loss_fn

    tok = tiny_tokenizer
    tasks, episodes = make_synthetic(tok, 3, secrets=("apple", "river"))
    ccfg = CriticConfig(episodes=str(_write(tmp_path / "e.jsonl", episodes)), tasks=str(_write(tmp_path / "t.jsonl", tasks)),
                        eval_fraction=0.0, nll_coef=0.0 if variant == "sweet_value_head" else 0.3, **VARIANTS[variant])
    data = build_data(ccfg, tok, 0)
    mcfg = ModelConfig(model="tiny", dtype="float32", max_length=512)
    model = _perturbed(load_model(mcfg, trainable=True), 4)
    ref_sums = torch.randn(len(data.turns), dtype=torch.float64, generator=torch.Generator().manual_seed(5)) - 30
    if variant == "sweet_value_head":
        model = ValueHeadModel(model)
        torch.nn.init.normal_(model.v_head.weight, std=0.1, generator=torch.Generator().manual_seed(6))
        ref_sums = torch.zeros(len(data.turns), dtype=torch.float64)
    model = model.double()
    loss_fn = critic_loss_fn(data, ref_sums, ccfg, mcfg, tok, torch.device("cpu"))

    def grads(idx):
        model.zero_grad()
        loss, metrics = loss_fn(model, idx)
        loss.backward()
        # (the value head never runs the LM head: no gradient there)
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                          for p in model.parameters()]), loss.item(), metrics

    together, loss, metrics = grads([0, 1, 2])
    singles = [grads([i]) for i in range(3)]
    apart = sum(g for g, _, _ in singles)
    assert together.dtype == torch.float64 and together.norm() > 0
    # Not all float64: HF's Llama RMSNorm computes in float32 whatever the model's dtype. Where
    # one call packs two pairs' identical turns into one row (make_batch(packed=True)), their
    # gradients are summed before they pass back through the norms, so they carry float32
    # roundoff there: unit 6e-8 times the growth shown above (150) is ~0.9e-5 of max|g|
    # (measured ~3e-7 here). A wrong scale or a pair counted twice is O(1); 1e-5 sits between.
    assert torch.allclose(together, apart, rtol=0, atol=1e-5 * together.abs().max().item())
    assert loss == pytest.approx(sum(l for _, l, _ in singles), rel=1e-9)
    for key in metrics:
        assert metrics[key] == pytest.approx(sum(m[key] for _, _, m in singles), rel=1e-9, abs=1e-12)


def test_no_grad_passes_keep_neighbours_in_one_call(tiny_tokenizer):
    """sharded_scores cuts `order` into calls of `micro` consecutive items (so the turns of a
    trajectory, put next to one another by sharded_action_sums, pack into one row), and
    returns each item's value at its index."""
    from accelerate import Accelerator

    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model
    from sweet.core.nograd_pass import sharded_scores

    calls = []

    def score(chunk):
        calls.append(list(chunk))
        return [10 * i for i in chunk]

    order = [4, 5, 6, 0, 1, 2, 3]
    model = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    values = sharded_scores(Accelerator(cpu=True), model, 7, score, micro=3, order=order)
    assert calls == [[4, 5, 6], [0, 1, 2], [3]] and values == [0, 10, 20, 30, 40, 50, 60]
