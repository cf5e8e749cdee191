"""One prepared GPU check: an 8B-shaped model through every heavy path, timed and measured.

    scripts/gpu_check.sh                                   # on a lent GPU machine (< 8 minutes)
    PYTHONPATH=. python bench/gpu_check.py --scale tiny    # the same stages on CPU (seconds; a test runs it)

Builds a Llama-3.1-8B-shaped model with random bf16 weights from a config (nothing is
downloaded; the tokenizer is the project's tiny one, whose ids are a subset of the
vocabulary), saves it once, and runs each stage with the project's own entry points,
freeing the GPU in between:

  generation      engines.hf.HFEngine: tokens/s batched vs one conversation at a time
  critic_step     LoRA + gradient checkpointing, two 8k-token turns, one optimiser step on
                  sweet.critic's per-turn advantage and Bradley-Terry loss
  vlm_critic_step the frontend's vision-language critic (sweet/critic/vision.py) at Qwen2-VL-7B's
                  shape, random bf16 weights built in memory: LoRA + gradient checkpointing, a
                  chosen and a rejected turn, each with the target's and the draft's screenshots
                  at the published size (64x28x28 pixels) through the project's processor path,
                  one optimiser step on the LM head (π_ref: adapters off) and one on the value
                  head; seconds and peak memory per head
  dpo_step        SWEET stage 2: per-turn chosen/rejected segments (sweet.core.logprobs.segment_logps)
                  and sweet.algorithms.losses.dpo_loss, one optimiser step
  logprobs        action log-probs of one 8k-token sequence, full-vocabulary float32 logits
                  (bench/logprob_memory.py's naive way) vs sweet.core.logprobs' chunked head: seconds
                  and the pass's own peak memory, one turn scored or every token, scoring
                  and forward + backward
  loop_iteration  `sweet.train_policy --algorithm loop` on the test bed, one iteration
  loop_async      (opt-in: --stages loop_async) LOOP 3 iterations sync, then async at lag 1:
                  seconds per iteration, the steady-state ratio, peak memory with the
                  sampler's model copy
  trl_comparison  bench/trainer_vs_trl.py on the same model (LoRA + gradient checkpointing):
                  our DPO and SFT steps vs TRL's DPOTrainer / SFTTrainer, tokens/s and peak
                  memory per run (four processes, each loading the model: about 2 minutes at 8B)

Each stage records its seconds and peak GPU memory (torch.cuda.max_memory_allocated, GiB)
or its error; a failing stage does not stop the others. Writes OUT/gpu_check.json and
OUT/summary.txt.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 2**30


@dataclass(frozen=True)
class Scale:
    """Model shape and workload sizes of one run."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int | None  # None: the tokenizer's size
    conversations: int  # generation: batched conversations
    one_at_a_time: int  # generation: conversations timed one by one
    gen_tokens: int  # generation: new tokens per conversation
    critic_len: int  # critic: tokens per turn sequence (context + action)
    dpo_context: int  # stage 2: context tokens of a turn
    dpo_pairs: int  # stage 2: pairs in the step
    action_len: int  # critic / stage 2: action tokens
    loop_new_tokens: int  # LOOP: tokens per agent turn
    lora_r: int = 16


# Qwen2-VL-7B-Instruct's shape (its config.json): 8.29e9 parameters; the tiny one for CPU runs
VLM_SHAPES = {
    "8b": {"text": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
           "vision": dict(depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4, hidden_size=3584, patch_size=14,
                          spatial_merge_size=2, temporal_patch_size=2),
           "text_tokens": 4096},
    "tiny": {"text": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=None, max_position_embeddings=4096, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}),
             "vision": dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=64, patch_size=14,
                            spatial_merge_size=2, temporal_patch_size=2),
             "text_tokens": 192},
}


SCALES = {
    # Llama-3.1-8B: 8.03e9 parameters
    "8b": Scale(4096, 14336, 32, 32, 8, 128256, conversations=32, one_at_a_time=4, gen_tokens=128,
                critic_len=8192, dpo_context=2048, dpo_pairs=4, action_len=256, loop_new_tokens=48),
    "tiny": Scale(64, 128, 2, 4, 2, None, conversations=8, one_at_a_time=2, gen_tokens=8,
                  critic_len=256, dpo_context=64, dpo_pairs=2, action_len=16, loop_new_tokens=8),
}


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default=os.environ.get("SWEET_GPU_CHECK_SCALE", "8b"))
    p.add_argument("--out", default="runs/gpu_check", help="folder for gpu_check.json and summary.txt")
    p.add_argument("--work", default="", help="folder for the saved model and LOOP run (default: /dev/shm if it "
                                              "has room, else a temporary folder; removed at the end)")
    p.add_argument("--device", default="", help="default: cuda if available, else cpu")
    p.add_argument("--stages", default="generation,critic_step,vlm_critic_step,dpo_step,logprobs,loop_iteration,"
                                       "trl_comparison")
    p.add_argument("--budget_s", type=float, default=420.0, help="skip stages not started after this many seconds")
    return p


# ---------------------------------------------------------------- helpers


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / GIB, 2) if device.startswith("cuda") else None


def _random_ids(n: int, low: int, high: int, seed: int) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n,), generator=g).tolist()


def _load(path: Path, device: str, **model_cfg):
    """The project's loader (sweet.core.config.load_model), then onto the device."""
    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return load_model(ModelConfig(model=str(path), dtype=dtype, **model_cfg), trainable=bool(model_cfg)).to(device)


def _lora_b_norm(model) -> float:
    """|B| over all LoRA B matrices: 0 at initialisation, > 0 once a step reached them."""
    return sum(p.detach().float().norm().item() for n, p in model.named_parameters() if "lora_B" in n)


def _lora_optimizer(model):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=1e-5), sum(p.numel() for p in params)


# ---------------------------------------------------------------- stages


def build(scale: Scale, path: Path, device: str) -> dict:
    """A random-weight Llama of the given shape, saved with the tiny tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from engines.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = LlamaConfig(
        vocab_size=scale.vocab_size or len(tokenizer), hidden_size=scale.hidden_size,
        intermediate_size=scale.intermediate_size, num_hidden_layers=scale.num_hidden_layers,
        num_attention_heads=scale.num_attention_heads, num_key_value_heads=scale.num_key_value_heads,
        max_position_embeddings=max(16384, scale.critic_len * 2), rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    seconds = time.perf_counter() - start
    del model
    return {"params": n_params, "dtype": str(dtype).removeprefix("torch."), "seconds": round(seconds, 1),
            "saved_to": str(path)}


def generation(scale: Scale, path: Path, device: str) -> dict:
    """HFEngine tokens/s: all conversations in one call vs one call per conversation."""
    from transformers import AutoTokenizer

    from engines import EngineOptions, SamplingParams
    from engines.hf import HFEngine

    model = _load(path, device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = HFEngine.from_model(model, tokenizer, spec="hf:gpu-check",
                                 options=EngineOptions(batch_size=scale.conversations))
    convs = [[{"role": "user", "content": f"Task {i}: write a Python function that returns {i} plus the "
                                          f"number of vowels in its argument. Ask me if anything is unclear."}]
             for i in range(scale.conversations)]
    params = SamplingParams(temperature=1.0, max_new_tokens=scale.gen_tokens, seed=0)

    def timed(batch):
        _sync(device)
        start = time.perf_counter()
        out = engine.generate(batch, params)
        _sync(device)
        seconds = time.perf_counter() - start
        return sum(len(s[0].token_ids) for s in out), seconds

    engine.generate(convs[:1], SamplingParams(max_new_tokens=2, seed=0))  # warm-up (kernels, allocator)
    tokens, seconds = timed(convs)
    single_tokens, single_seconds = 0, 0.0
    for conv in convs[: scale.one_at_a_time]:
        t, s = timed([conv])
        single_tokens, single_seconds = single_tokens + t, single_seconds + s
    batched_tps, single_tps = tokens / seconds, single_tokens / max(single_seconds, 1e-9)
    del engine, model
    return {
        "batched": {"conversations": len(convs), "tokens": tokens, "seconds": round(seconds, 2),
                    "tokens_per_s": round(batched_tps, 1)},
        "one_at_a_time": {"conversations": scale.one_at_a_time, "tokens": single_tokens,
                          "seconds": round(single_seconds, 2), "tokens_per_s": round(single_tps, 1)},
        "speedup": round(batched_tps / max(single_tps, 1e-9), 1),
    }


def _finish_lora_step(loss, model, optimizer, device: str, start: float) -> tuple[float, float]:
    """Backward + optimiser step; the step's wall time since `start` (device synced) and
    the LoRA B norm after it (non-zero: the adapters moved)."""
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return time.perf_counter() - start, _lora_b_norm(model)


def critic_step(scale: Scale, path: Path, device: str) -> dict:
    """One stage-1 step: chosen and rejected trajectories of one turn of `critic_len` tokens."""
    import torch

    from sweet.core.tokens import make_batch
    from sweet.critic.model import action_logprob_sums, bradley_terry_loss, per_turn_advantage, trajectory_scores

    model = _load(path, device, lora=True, lora_r=scale.lora_r, gradient_checkpointing=True,
                  max_length=scale.critic_len)
    model.train()
    optimizer, trainable = _lora_optimizer(model)
    vocab = 4000  # ids inside the tiny tokenizer
    turns = [(_random_ids(scale.critic_len - scale.action_len, 6, vocab, seed), _random_ids(scale.action_len, 6, vocab, seed + 9))
             for seed in (1, 2)]
    batch = make_batch(turns, pad_id=0, max_length=scale.critic_len).to(device)
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad(), model.disable_adapter():
        ref = action_logprob_sums(model, batch)  # π_ref: the base model under the adapter
    policy = action_logprob_sums(model, batch)
    advantages = per_turn_advantage(policy, ref, batch.action_mask.sum(-1), beta=1.0)
    scores = trajectory_scores(advantages, torch.tensor([0, 1]), 2)
    loss, _ = bradley_terry_loss(scores[:1], scores[1:])
    seconds, moved = _finish_lora_step(loss.mean(), model, optimizer, device, start)
    del model, optimizer
    return {"sequences": 2, "tokens_per_sequence": scale.critic_len, "lora_r": scale.lora_r,
            "trainable_params": trainable, "lora_b_norm_after": round(moved, 6), "loss": round(loss.mean().item(), 4), "seconds": round(seconds, 2)}


def vlm_config(scale_name: str, tokenizer):
    """The Qwen2VLConfig of VLM_SHAPES[scale_name], its image tokens the tiny-vl processor's."""
    from transformers import Qwen2VLConfig

    shape = VLM_SHAPES[scale_name]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                            "<|vision_end|>")}
    text = dict(shape["text"], vocab_size=shape["text"]["vocab_size"] or len(tokenizer),
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    return Qwen2VLConfig(text_config=text, vision_config=shape["vision"], image_token_id=ids["<|image_pad|>"],
                         video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                         vision_end_token_id=ids["<|vision_end|>"])


def vlm_turns(view, text_tokens: int, action_len: int, vocab: int) -> list:
    """A chosen and a rejected turn: random text with the target's and a draft's screenshot
    (synthetic pages at 1280x800, resized by the processor to the published size), expanded
    and batched as sweet.critic.vision builds a critic's turns. Returns (VisionBatch, images per turn)."""
    import torch
    from PIL import Image

    from sweet.core.tokens import make_batch
    from sweet.critic.vision import IMAGE_SLOT, VisionBatch

    slot = view.tokenizer(IMAGE_SLOT, add_special_tokens=False)["input_ids"]
    target = view.pixels("target", Image.new("RGB", (1280, 800), (198, 40, 40)))
    pairs, images = [], []
    for seed, colour in ((1, (198, 40, 40)), (2, (21, 101, 192))):
        draft = view.pixels(f"draft-{seed}", Image.new("RGB", (1280, 800), colour))
        half = text_tokens // 2
        ids = _random_ids(half, 6, vocab, seed) + slot + _random_ids(half, 6, vocab, seed + 3) + slot
        pairs.append((view.expand(ids, [target, draft]), _random_ids(action_len, 6, vocab, seed + 9)))
        images += [target, draft]
    batch = make_batch(pairs, pad_id=view.tokenizer.pad_token_id)
    return VisionBatch(batch.input_ids, batch.attention_mask, batch.action_mask, batch.spans,
                       pixel_values=torch.cat([p for p, _ in images]), image_grid_thw=torch.cat([g for _, g in images]),
                       image_token_id=view.image_token_id)


def vlm_critic_step(scale: Scale, path: Path, device: str, scale_name: str = "8b") -> dict:
    """One stage-1 step of the vision-language critic on each head (module docstring)."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from engines.tiny import tiny_vl_path
    from sweet.core.config import ModelConfig
    from sweet.core.models import with_lora
    from sweet.core.value_head import ValueHeadModel
    from sweet.critic.model import action_sums, bradley_terry_loss, per_turn_advantage
    from sweet.critic.vision import ScreenshotView, load_processor

    view = ScreenshotView(load_processor(str(tiny_vl_path())), renders=None)
    config = vlm_config(scale_name, view.tokenizer)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.device(device):
        base = Qwen2VLForConditionalGeneration._from_config(config, dtype=dtype)
    built = time.perf_counter() - start
    n_params = sum(p.numel() for p in base.parameters())
    batch = vlm_turns(view, VLM_SHAPES[scale_name]["text_tokens"], scale.action_len, 4000).to(device)
    model = with_lora(base, ModelConfig(lora=True, lora_r=scale.lora_r))
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    out = {"params": n_params, "build_seconds": round(built, 1), "tokens_per_sequence": int(batch.input_ids.shape[1]),
           "image_tokens_per_sequence": int((batch.input_ids[0] == view.image_token_id).sum()),
           "pixel_patches": int(batch.pixel_values.shape[0])}
    for head in ("lm", "value"):
        critic = ValueHeadModel(model).to(device) if head == "value" else model
        optimizer, trainable = _lora_optimizer(critic)
        _reset_peak(device)
        _sync(device)
        start = time.perf_counter()
        if head == "lm":
            with torch.no_grad(), model.disable_adapter():
                ref = action_sums(model, batch, "lm")  # π_ref: the base under the adapter
        else:
            ref = None
        sums = action_sums(critic, batch, head)
        adv = per_turn_advantage(sums, ref if ref is not None else torch.zeros_like(sums), batch.action_mask.sum(-1), 1.0)
        loss, _ = bradley_terry_loss(adv[:1], adv[1:])
        seconds, moved = _finish_lora_step(loss.mean(), model, optimizer, device, start)
        out[head] = {"seconds": round(seconds, 2), "loss": round(loss.mean().item(), 4), "trainable_params": trainable,
                     "lora_b_norm_after": round(moved, 6), "peak_gib": _peak_gib(device)}
        if head == "value":  # zero at start: the step reached it
            out[head]["value_head_norm_after"] = round(critic.v_head.weight.detach().float().norm().item(), 6)
        del optimizer, critic
    del model, base
    return out


def dpo_step(scale: Scale, path: Path, device: str) -> dict:
    """One stage-2 step: `dpo_pairs` per-turn pairs (shared context, chosen vs rejected action)."""
    import torch

    from sweet.algorithms.losses import dpo_loss
    from sweet.core.logprobs import segment_logps
    from sweet.core.tokens import Segment

    max_length = scale.dpo_context + scale.action_len + 8
    model = _load(path, device, lora=True, lora_r=scale.lora_r, gradient_checkpointing=True, max_length=max_length)
    model.train()
    optimizer, trainable = _lora_optimizer(model)
    vocab = 4000
    contexts = [tuple(_random_ids(scale.dpo_context, 6, vocab, 100 + i)) for i in range(scale.dpo_pairs)]
    chosen = [Segment(c, tuple(_random_ids(scale.action_len, 6, vocab, 200 + i))) for i, c in enumerate(contexts)]
    rejected = [Segment(c, tuple(_random_ids(scale.action_len, 6, vocab, 300 + i))) for i, c in enumerate(contexts)]
    kwargs = dict(pad_id=0, max_length=max_length, keep_head=min(512, scale.dpo_context))
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad(), model.disable_adapter():
        ref, _ = segment_logps(model, chosen + rejected, **kwargs)
    logps, counts = segment_logps(model, chosen + rejected, **kwargs)
    n = scale.dpo_pairs
    loss, metrics = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], counts[:n], beta=0.1, nll_coef=0.01)
    seconds, moved = _finish_lora_step(loss, model, optimizer, device, start)
    del model, optimizer
    return {"pairs": n, "lora_b_norm_after": round(moved, 6), "context_tokens": scale.dpo_context, "action_tokens": scale.action_len,
            "trainable_params": trainable, "loss": round(loss.item(), 4), "loss_dpo": round(metrics["loss/dpo"], 4),
            "seconds": round(seconds, 2)}


def logprobs(scale: Scale, path: Path, device: str) -> dict:
    """Full-vocabulary logits vs the chunked head on critic_step's model (LoRA + gradient
    checkpointing), one `critic_len`-token sequence. Workloads: `turn` (its last
    `action_len` tokens scored) and `all` (every token after the first); each without
    gradients (`score`: critic scoring, π_ref) and with a backward of the sum (`backward`).
    Per path: seconds and peak memory over the loaded model (GiB, GPU only); per case the
    largest log-prob gap between the paths and the ratios full / chunked."""
    import torch

    from bench.logprob_memory import full_logits_logprobs
    from sweet.core.logprobs import token_logprobs
    from sweet.core.tokens import make_batch

    cuda = device.startswith("cuda")
    model = _load(path, device, lora=True, lora_r=scale.lora_r, gradient_checkpointing=True, max_length=scale.critic_len)
    model.train()
    ids = _random_ids(scale.critic_len, 6, 4000, 7)  # ids inside the tiny tokenizer
    paths = {"full": full_logits_logprobs, "chunked": token_logprobs}

    def one(fn, batch, backward: bool):
        model.zero_grad(set_to_none=True)
        _reset_peak(device)
        base = torch.cuda.memory_allocated() if cuda else 0
        _sync(device)
        start = time.perf_counter()
        with torch.set_grad_enabled(backward):
            logp = fn(model, batch)
            total = (logp * batch.action_mask).sum()
            if backward:
                total.backward()
        _sync(device)
        seconds = time.perf_counter() - start
        peak = round((torch.cuda.max_memory_allocated() - base) / GIB, 2) if cuda else None
        return logp[batch.action_mask.bool()].detach().float(), {"seconds": round(seconds, 3), "peak_gib": peak}

    warm = make_batch([(ids[:32], ids[32:48])], pad_id=0).to(device)
    for fn in paths.values():  # kernels, allocator
        one(fn, warm, True)
    out: dict = {"tokens": scale.critic_len}
    for workload, n_action in (("turn", scale.action_len), ("all", scale.critic_len - 1)):
        batch = make_batch([(ids[: scale.critic_len - n_action], ids[scale.critic_len - n_action :])], pad_id=0).to(device)
        for mode in ("score", "backward"):
            case: dict = {"scored_tokens": n_action}
            lps = {}
            for name, fn in paths.items():
                lps[name], case[name] = one(fn, batch, mode == "backward")
            case["max_logp_gap"] = float((lps["full"] - lps["chunked"]).abs().max())
            case["speedup"] = round(case["full"]["seconds"] / max(case["chunked"]["seconds"], 1e-9), 2)
            case["memory_ratio"] = (round(case["full"]["peak_gib"] / max(case["chunked"]["peak_gib"], 0.01), 1)
                                    if cuda else None)
            out[f"{workload}_{mode}"] = case
    model.zero_grad(set_to_none=True)
    del model
    return out


def _loop_argv(scale: Scale, path: Path, device: str, out: Path, iterations: int) -> list[str]:
    argv = ["--algorithm", "loop", "--env", "testbed", "--model", str(path), "--lora", "true",
            "--lora_r", str(scale.lora_r), "--gradient_checkpointing", "true", "--iterations", str(iterations),
            "--tasks_per_iteration", "2", "--episodes_per_task", "2", "--max_new_tokens", str(scale.loop_new_tokens),
            "--micro_batch_size", "2", "--min_abs_advantage", "0", "--report_to", "none", "--output_dir", str(out)]
    return argv + (["--dtype", "float32"] if not device.startswith("cuda") else [])


def _run_train_policy(argv: list[str]) -> int:
    """`python -m sweet.train_policy` in this process; its exit code (a run without reward
    variance says so and exits non-zero)."""
    from sweet.train_policy import main

    try:
        main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


def loop_iteration(scale: Scale, path: Path, device: str, work: Path) -> dict:
    """`python -m sweet.train_policy --algorithm loop` on the test bed, one iteration, in this process."""
    out = work / "loop"
    start = time.perf_counter()
    exit_code = _run_train_policy(_loop_argv(scale, path, device, out, iterations=1))
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] if (out / "metrics.jsonl").exists() else []
    last = rows[-1] if rows else {}
    return {"exit_code": exit_code, "seconds": round(seconds, 1), "iterations_logged": len(rows),
            "metrics": {k: v for k, v in last.items() if k.startswith("loop/") or k in ("step", "loss")}}


def loop_async(scale: Scale, path: Path, device: str, work: Path) -> dict:
    """LOOP on the test bed as `loop_iteration`, 3 iterations synchronous, then 3 with
    `--async_rollouts` at lag 1 and the decoupled loss (the sampler's own model copy on the
    same device, playing the next iteration while the trainer trains): per-run seconds,
    rollout and iteration times (bench/async_rollouts.py's clock and arithmetic) and each
    run's peak memory, whose difference is about the sampler's copy. Run alone, the sync
    run's first iteration also pays the GPU's warm-up, which favours async: read the
    per-iteration times it records."""
    from async_rollouts import Clock, summarize

    runs, clocks = {}, {}
    lagged = ["--async_rollouts", "true", "--staleness", "1", "--decoupled_loss", "true"]
    for mode, flags in (("sync", []), ("async", lagged)):
        _reset_peak(device)
        start = time.perf_counter()
        with Clock() as clock:
            exit_code = _run_train_policy(_loop_argv(scale, path, device, work / f"loop_{mode}", iterations=3) + flags)
        runs[mode] = {"exit_code": exit_code, "seconds": round(time.perf_counter() - start, 1),
                      "rollout_s": [round(x, 2) for x in clock.plays], "fill_s": round(clock.fill, 2),
                      "iteration_s": [round(x, 2) for x in clock.iteration_times], "peak_gib": _peak_gib(device)}
        clocks[mode] = clock
    f = summarize(clocks["sync"], clocks["async"], staleness=1)
    return {"runs": runs, **{k: round(v, 2) for k, v in f.items()}}


def trl_comparison(scale: Scale, path: Path, device: str, work: Path, seconds_left: float) -> dict:
    """bench/trainer_vs_trl.py on the saved model, stage 2's shapes: `dpo_pairs` pairs per step
    (micro-batches of 2), contexts up to `dpo_context`, actions of `action_len` tokens."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("trl") is None:
        raise RuntimeError("trl is not installed on this machine: pip install 'trl>=1.0' (on a machine without "
                           "network, carry its wheels and those of datasets, dill and multiprocess)")
    out = work / "trainer_vs_trl.json"
    argv = [sys.executable, str(Path(__file__).resolve().parent / "trainer_vs_trl.py"), "--model", str(path),
            "--device", device, "--lora", "--gradient_checkpointing", "--context", str(scale.dpo_context),
            "--action", str(scale.action_len), "--batch_size", str(scale.dpo_pairs), "--micro_batch_size", "2",
            "--warmup_steps", "1", "--steps", "2", "--check_steps", "2", "--json", str(out)]
    if not device.startswith("cuda"):
        argv += ["--dtype", "float32"]
    start = time.perf_counter()
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=max(10.0, seconds_left))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"trainer_vs_trl did not finish in the {seconds_left:.0f} s left") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [""])[-1]  # the exception, ahead of the truncated log
        raise RuntimeError(f"trainer_vs_trl exit {res.returncode}: {last} | {res.stderr[-1500:]}")
    results = json.loads(out.read_text())["results"]
    keep = ("tokens", "seconds", "tokens_per_s", "peak", "unit", "ref_s", "losses", "clock")
    return {"headline": res.stdout.strip().splitlines()[-1], "seconds": round(time.perf_counter() - start, 1),
            "runs": {run: {k: r[k] for k in keep} for run, r in results.items()}}


STAGES = {"generation": generation, "critic_step": critic_step, "vlm_critic_step": vlm_critic_step,
          "dpo_step": dpo_step, "logprobs": logprobs,
          "loop_iteration": loop_iteration, "trl_comparison": trl_comparison, "loop_async": loop_async}
# scripts/gpu_check.sh stops everything at budget_s + 60 s; a stage that may run long gets what is left of it
HARD_LIMIT_S = 60


# ---------------------------------------------------------------- driver


def _work_dir(requested: str, out: Path, need_bytes: int) -> Path:
    if requested:
        return Path(requested)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1.5 * need_bytes:
        return shm / f"sweet-gpu-check-{os.getpid()}"
    return Path(tempfile.mkdtemp(prefix="sweet-gpu-check-"))  # not under OUT: its files are collected


def run(args) -> dict:
    import torch
    import transformers

    scale = SCALES[args.scale]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    approx_bytes = 2 * 8.1e9 if args.scale == "8b" else 1e8
    work = _work_dir(args.work, out, int(approx_bytes))
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "scale": args.scale, "shape": asdict(scale), "device": device,
        "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu",
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / GIB, 1) if device.startswith("cuda") else None,
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "stages": {},
    }
    t0 = time.perf_counter()
    model_path = work / "model"
    try:
        try:
            _reset_peak(device)
            report["stages"]["build"] = {"ok": True, **build(scale, model_path, device), "peak_gib": _peak_gib(device)}
        except Exception as e:  # noqa: BLE001 - reported, nothing else can run
            report["stages"]["build"] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                         "traceback": traceback.format_exc()[-3000:]}
            return report
        for name in [s for s in args.stages.split(",") if s]:
            if time.perf_counter() - t0 > args.budget_s:
                report["stages"][name] = {"ok": False, "error": f"skipped: the {args.budget_s:g} s budget was spent"}
                continue
            _reset_peak(device)
            try:
                extra = (work,) if name in ("loop_iteration", "loop_async") else ()
                if name == "vlm_critic_step":
                    extra = (args.scale,)
                if name == "trl_comparison":
                    extra = (work, args.budget_s + HARD_LIMIT_S - 10 - (time.perf_counter() - t0))
                result = STAGES[name](scale, model_path, device, *extra)
                report["stages"][name] = {"ok": True, **result, "peak_gib": _peak_gib(device)}
            except Exception as e:  # noqa: BLE001 - one stage's failure is a finding, not the end
                report["stages"][name] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}",
                                          "traceback": traceback.format_exc()[-3000:], "peak_gib": _peak_gib(device)}
            print(f"[gpu_check] {name}: {json.dumps(report['stages'][name])[:300]}", file=sys.stderr, flush=True)
    finally:
        report["total_seconds"] = round(time.perf_counter() - t0, 1)
        report["ok"] = all(s.get("ok") for s in report["stages"].values())
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return report


def summary(report: dict) -> str:
    """The report as a few readable lines."""
    memory = f" ({report['gpu_memory_gib']} GiB)" if report.get("gpu_memory_gib") else ""
    lines = [f"GPU check ({report['scale']}): {report['gpu']}{memory}, "
             f"torch {report['torch']}, transformers {report['transformers']}: "
             f"{'all stages ok' if report.get('ok') else 'SOME STAGES FAILED'} in {report.get('total_seconds')} s"]
    for name, s in report["stages"].items():
        peak = f", peak {s['peak_gib']} GiB" if s.get("peak_gib") is not None else ""
        if not s.get("ok"):
            lines.append(f"  {name:15s} FAILED{peak}: {s.get('error')}")
        elif name == "generation":
            b, o = s["batched"], s["one_at_a_time"]
            lines.append(f"  {name:15s} batched {b['tokens_per_s']} tok/s ({b['conversations']} convs) vs one at a time "
                         f"{o['tokens_per_s']} tok/s: x{s['speedup']}{peak}")
        elif name == "logprobs":
            for key in ("turn_score", "turn_backward", "all_score", "all_backward"):
                c = s[key]
                mem = (f", peak {c['full']['peak_gib']} vs {c['chunked']['peak_gib']} GiB: x{c['memory_ratio']}"
                       if c.get("memory_ratio") is not None else "")
                lines.append(f"  {name:15s} {key:14s} {c['scored_tokens']} of {s['tokens']} tokens scored, full logits "
                             f"{c['full']['seconds']} s vs chunked {c['chunked']['seconds']} s: x{c['speedup']}{mem}, "
                             f"max gap {c['max_logp_gap']:.1e}")
        elif name == "build":
            lines.append(f"  {name:15s} {s['params'] / 1e6:,.1f}M params ({s['dtype']}) in {s['seconds']} s{peak}")
        elif name == "vlm_critic_step":
            lines.append(f"  {name:15s} Qwen2-VL {s['params'] / 1e6:,.1f}M params, {s['tokens_per_sequence']} tokens "
                         f"({s['image_tokens_per_sequence']} of 2 screenshots) per turn: "
                         + "; ".join(f"{h} head {s[h]['seconds']} s, loss {s[h]['loss']}"
                                     + (f", peak {s[h]['peak_gib']} GiB" if s[h]["peak_gib"] is not None else "")
                                     for h in ("lm", "value")))
        elif name == "trl_comparison":
            lines.append(f"  {name:15s} {s['headline']} ({s['seconds']} s)")
        elif name == "loop_async":
            r = s["runs"]
            lines.append(f"  {name:15s} sync R {s['R']} s + T {s['T']} s per iteration (bound {s['bound']}x); async "
                         f"{s['steady']} s per overlapped iteration: x{s['ratio']} (whole run x{s['whole_ratio']})"
                         + (f"; peak {r['sync']['peak_gib']} vs {r['async']['peak_gib']} GiB"
                            if r["sync"]["peak_gib"] is not None else ""))
        elif name == "loop_iteration":
            m = s.get("metrics", {})
            lines.append(f"  {name:15s} {s['seconds']} s, exit {s['exit_code']}, episodes {m.get('loop/episodes_total')}, "
                         f"optimiser steps {m.get('loop/optimizer_steps')}{peak}")
        else:
            lines.append(f"  {name:15s} {s['seconds']} s, loss {s['loss']}, trainable {s['trainable_params']:,}{peak}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    report = run(args)
    out = Path(args.out)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    text = summary(report)
    (out / "summary.txt").write_text(text)
    print(text, end="")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
