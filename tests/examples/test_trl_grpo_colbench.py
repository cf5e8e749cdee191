"""examples/trl_grpo_colbench.py: TRL's GRPOTrainer (rollout_func mode, real TRL) training
the tiny model on the test bed through a real ColBench OpenEnv server, on CPU.

A random tiny model never writes an answer, so every reward would be 0 and GRPO's
group advantage would be 0 too: nothing to learn from. The policy is first taught the
answer format alone (a few supervised steps on the test bed's canonical answer with
random constants), so it answers at once and guesses: rewards 0, 0.5 or 1 within a
group, which is what GRPO needs to move the weights.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the `serve` extra (pip install -e '.[serve]') is not installed")

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("trl_grpo_colbench", ROOT / "examples" / "trl_grpo_colbench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def format_policy(tmp_path_factory) -> Path:
    """The tiny model after 80 supervised steps on its first turn: mostly "answer now,
    with guessed constants", sometimes a vague question (so some episodes have a human turn)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from testbed.env import A_VALUES, B_VALUES, QUESTION_VAGUE, answer_text, make_tasks
    from testbed.env import TestbedEnv
    from engines.templating import prompt_ids
    from engines.tiny import tiny_model_path

    torch.manual_seed(0)
    rng = random.Random(0)
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
    env = TestbedEnv()
    prompt = prompt_ids(tok, env.agent_messages(make_tasks("train", n=1)[0], []))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(80):
        rows = []
        for _ in range(8):  # most answer at once, some ask a vague question first
            text = answer_text(rng.choice(A_VALUES), rng.choice(B_VALUES)) if rng.random() < 0.7 else QUESTION_VAGUE
            rows.append(prompt + tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        width = max(map(len, rows))
        ids = torch.tensor([r + [tok.eos_token_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, : len(prompt)] = -100  # loss on the agent's turn only
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    env.close()
    out = tmp_path_factory.mktemp("format_policy")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.slow
def test_grpo_trains_the_tiny_model_through_the_server(colbench_server, format_policy, tmp_path):
    import torch

    script = load_script()
    with colbench_server("--env", "testbed", "--tasks", "builtin:train", "--simulator", "scripted:testbed",
                         "--max-connections", "16") as url:
        cfg = script.ScriptConfig(model=f"hf:{format_policy}", env_url=url, output_dir=str(tmp_path / "run"),
                                  max_steps=3, num_generations=4, per_device_train_batch_size=8,
                                  learning_rate=2e-4, max_new_tokens=64, max_completion_length=320)
        before = {n: p.detach().clone() for n, p in
                  __import__("transformers").AutoModelForCausalLM.from_pretrained(format_policy).named_parameters()}
        trainer = script.main(cfg)
        tok = trainer.processing_class
        task_ids = [t for t in trainer.train_dataset["prompt"][:4] for _ in range(2)]
        out = script.ColBenchRollout(cfg)(task_ids, trainer)  # one more batch, to look at the sequences
    for prompt, ids, env_mask, lps in zip(out["prompt_ids"], out["completion_ids"], out["env_mask"], out["logprobs"]):
        assert len(ids) == len(env_mask) == len(lps) and env_mask[0] == 1
        human = tok.decode([i for i, m in zip(ids, env_mask) if m == 0])
        spans = sum(1 for j, m in enumerate(env_mask) if m == 0 and (j == 0 or env_mask[j - 1] == 1))
        replies = _replies(human)
        assert len(replies) == spans and all(r == "I don't know." or r.startswith("For ") for r in replies), human
        print(f"sequence: {len(prompt)} prompt + {len(ids)} completion ids, {spans} human turn(s): {replies}")
    assert any(0 in m for m in out["env_mask"]), "no episode had a human turn"
    steps = [h for h in trainer.state.log_history if "rewards/env_reward/mean" in h]
    print("env_reward per step:", [h["rewards/env_reward/mean"] for h in steps], "final batch:", out["env_reward"])
    assert len(steps) == 3
    rewards = [h["rewards/env_reward/mean"] for h in steps]
    assert any(r > 0 for r in rewards), rewards  # the server's scores reached TRL
    assert any(h["rewards/env_reward/std"] > 0 for h in steps)  # ... and differ within a batch
    assert all(h["colbench/truncated"] == 0 for h in steps)
    after = dict(trainer.model.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n].detach().cpu())]
    assert len(changed) > len(before) // 2, f"only {len(changed)} of {len(before)} tensors changed"
    assert (tmp_path / "run" / "final" / "config.json").exists() and (tmp_path / "run" / "config.json").exists()


def _replies(human_tokens_text: str) -> list[str]:
    """The human's replies inside the masked (0) tokens: the text between the user header
    and its end-of-turn, as the tiny model's Llama-3-style template renders them."""
    parts = human_tokens_text.split("<|start_header_id|>user<|end_header_id|>\n\n")[1:]
    return [p.split("<|eot_id|>")[0] for p in parts]


def test_script_help_and_bad_flags_without_training():
    import os
    import subprocess

    py = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = lambda *a: subprocess.run([py, "examples/trl_grpo_colbench.py", *a], cwd=ROOT, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    res = run("--help")
    assert res.returncode == 0 and "--env-url" in res.stdout.replace("_", "-") and "--use-vllm" in res.stdout
    res = run("--num-generations", "1")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "examples/trl_grpo_colbench.py: error: --num-generations: invalid value 1"]
    res = run("--model", "vllm:x")  # not trainable weights: refused before anything loads
    assert res.returncode == 2 and "cannot train 'vllm:x'" in res.stderr
