"""The trainers on a model shaped like SmolLM2-135M-Instruct: a Llama with a ChatML template
whose end-of-turn token `<|im_end|>` is also its eos and its pad token, tied embeddings,
trained with LoRA in bfloat16 with gradient checkpointing on CPU (bench/real_pipeline.py's
settings). The model is a tiny random one built here from the tiny model's tokenizer, so
the test is fast and needs no download; what it checks is the architecture's and the
template's, not the weights'.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.sweet.conftest import make_synthetic, write_jsonl

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def chatml_model(tmp_path_factory) -> Path:
    """A 2-layer random Llama with a ChatML template; eos = pad = <|im_end|>; tied embeddings."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sweet.core.models import load_tokenizer

    out = tmp_path_factory.mktemp("chatml")
    tok = load_tokenizer("tiny")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = tok.pad_token = "<|im_end|>"
    tok.chat_template = CHATML
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.slow
def test_critic_and_policies_train_lora_on_a_chatml_llama_in_bf16(chatml_model, tmp_path, one_torch_thread):
    from colbench.cli import make_configs
    from sweet.algorithms import load_algorithm
    from sweet.core.models import load_tokenizer
    from sweet.core.records import read_candidates
    from sweet.critic import train as critic_train

    tok = load_tokenizer(str(chatml_model))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == tok.pad_token_id == im_end
    tasks, episodes = make_synthetic(tok, 4)
    eps, task_file = write_jsonl(tmp_path / "eps.jsonl", episodes), write_jsonl(tmp_path / "tasks.jsonl", tasks)
    common = {"model": str(chatml_model), "lora": True, "dtype": "bfloat16", "gradient_checkpointing": True,
              "report_to": "none", "max_length": 512, "keep_head": 64, "learning_rate": 1e-3}

    critic_train.main(*make_configs(critic_train.CONFIGS, {
        **common, "episodes": str(eps), "tasks": str(task_file), "output_dir": str(tmp_path / "critic"),
        "num_epochs": 1, "batch_size": 2, "micro_batch_size": 1, "eval_fraction": 0.25}))
    record = json.loads((tmp_path / "critic" / "critic_config.json").read_text())
    assert record["eos_token_id"] == im_end and record["dtype"] == "bfloat16" and record["lora"]
    first = json.loads((tmp_path / "critic" / "metrics.jsonl").read_text().splitlines()[0])
    # θ = π_ref at the start (LoRA's B = 0), in bf16 too: every A is 0, the BT loss ln 2
    assert first["loss/bt"] == pytest.approx(math.log(2), abs=1e-6)

    runs = {"sweet": {"critic": str(tmp_path / "critic"), "tasks": str(task_file), "candidates_per_state": 16,
                      "max_new_tokens": 6, "episode_fraction": 1.0, "batch_size": 4, "micro_batch_size": 2},
            "rft": {"batch_size": 2, "micro_batch_size": 1},
            "mtdpo": {"batch_size": 2, "micro_batch_size": 1}}
    for name, extra in runs.items():
        module = load_algorithm(name)
        module.main(*make_configs(module.CONFIGS, {**common, **extra, "episodes": str(eps),
                                                   "output_dir": str(tmp_path / name)}))
    for name in ("critic", *runs):
        weights = adapter(tmp_path / name / "final-adapter")
        # LoRA on every linear layer of every block (all-linear), none on the tied head
        for layer in range(2):
            for module in LINEAR:
                assert any(f"layers.{layer}." in k and f"{module}.lora_B" in k for k in weights), (name, layer, module)
        assert not any("lm_head" in k or "embed_tokens" in k for k in weights), name
        # gradients reached the adapters through the checkpointed blocks
        assert max(float(v.abs().max()) for k, v in weights.items() if "lora_B" in k) > 0, name

    rows = read_candidates(tmp_path / "sweet" / "candidates.jsonl")
    assert rows and all(len(row.candidates) == 16 for row in rows.values())
    for row in rows.values():
        for cand in row.candidates:  # the engine cut the end-of-turn token off; training appends it on "stop"
            assert im_end not in cand.token_ids and cand.finish_reason in ("stop", "length")
