"""scripts/gpu_check.sh at tiny scale on CPU: the GPU check cannot rot between GPU loans."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_gpu_check_script_runs_every_stage_at_tiny_scale(tmp_path):
    out = tmp_path / "out"
    # a fake nvidia-smi with 2 GPUs and DIST_DRY_RUN: the distributed step only collects its
    # tests, so the command it builds (test ids, SWEET_DIST_CONFIGS) cannot rot either
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-0)'\necho 'GPU 1: Fake (UUID: GPU-1)'\n")
    fake.chmod(0o755)
    env = {**os.environ, "SCALE": "tiny", "PYTHON": sys.executable, "OUT": str(out), "OMP_NUM_THREADS": "1",
           "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "DIST": "1", "DIST_DRY_RUN": "1"}
    env.pop("PYTHONPATH", None)  # the script must set it itself (the GPU machine has no install)
    env.pop("SWEET_DIST_CONFIGS", None)
    res = subprocess.run(["bash", "scripts/gpu_check.sh", "--device", "cpu", "--work", str(tmp_path / "work")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads((out / "gpu_check.json").read_text())
    stages = report["stages"]
    failed = {k: v.get("error") for k, v in stages.items() if not v.get("ok")}
    assert res.returncode == 0 and not failed, (failed, res.stderr[-3000:])
    assert list(stages) == ["build", "generation", "critic_step", "vlm_critic_step", "dpo_step", "logprobs",
                            "loop_iteration", "trl_comparison"]
    gen = stages["generation"]
    assert gen["batched"]["tokens"] == 8 * 8 and gen["one_at_a_time"]["tokens"] == 2 * 8
    # the speedup is measured and reported, never asserted: a time depends on the machine's load
    assert math.isfinite(gen["speedup"]) and gen["speedup"] > 0
    # LoRA starts as the identity (B = 0), so the policy equals π_ref: every advantage is 0
    # and L_BT = log 2; stage 2's DPO term is log 2 as well.
    assert math.isclose(stages["critic_step"]["loss"], math.log(2), abs_tol=1e-4)
    assert stages["critic_step"]["tokens_per_sequence"] == 256 and stages["critic_step"]["trainable_params"] > 0
    # the vision-language critic: two screenshots per turn at the published size (at most 64
    # tokens each), both heads start at A = 0 (LoRA identity; zero value head) and one step moves them
    vlm = stages["vlm_critic_step"]
    assert 2 * 16 <= vlm["image_tokens_per_sequence"] <= 2 * 64
    for head in ("lm", "value"):
        assert math.isclose(vlm[head]["loss"], math.log(2), abs_tol=1e-4) and vlm[head]["trainable_params"] > 0
    assert vlm["lm"]["lora_b_norm_after"] > 0 and vlm["value"]["value_head_norm_after"] > 0
    assert math.isclose(stages["dpo_step"]["loss_dpo"], math.log(2), abs_tol=1e-4)
    assert stages["dpo_step"]["loss"] > stages["dpo_step"]["loss_dpo"]  # + the NLL term
    # one step through LoRA + gradient checkpointing reached the adapters (B was 0)
    assert stages["critic_step"]["lora_b_norm_after"] > 0 and stages["dpo_step"]["lora_b_norm_after"] > 0
    # both log-prob paths on the same model, one turn or every token scored, with and without
    # gradients: the same values (float32 on CPU), no memory figures without a GPU
    lp = stages["logprobs"]
    for key in ("turn_score", "turn_backward", "all_score", "all_backward"):
        assert lp[key]["max_logp_gap"] < 1e-4 and lp[key]["memory_ratio"] is None, (key, lp[key])
    assert lp["turn_score"]["scored_tokens"] == 16 and lp["all_score"]["scored_tokens"] == 255
    loop = stages["loop_iteration"]
    assert loop["iterations_logged"] == 1 and loop["metrics"]["loop/episodes_total"] == 4.0
    assert loop["metrics"]["loop/optimizer_steps"] >= 1  # --min_abs_advantage 0: the update runs without variance
    # the TRL comparison: four runs on the saved model, the same maths on both sides
    trl = stages["trl_comparison"]
    assert trl["headline"].startswith("ours / TRL tokens/s: DPO ") and ", SFT " in trl["headline"]
    assert set(trl["runs"]) == {"ours:dpo", "trl:dpo", "ours:sft", "trl:sft"}
    for algo in ("dpo", "sft"):
        ours, theirs = trl["runs"][f"ours:{algo}"], trl["runs"][f"trl:{algo}"]
        assert ours["tokens"] == theirs["tokens"] > 0
        assert ours["losses"] == [pytest.approx(x, rel=1e-5) for x in theirs["losses"]] and len(ours["losses"]) == 2
    summary = (out / "summary.txt").read_text()
    assert "all stages ok" in summary and all(name in summary for name in stages)
    # each GPU config would run the 4 two-process tests (critic lm + value, stage 2, LOOP), none on CPU;
    # the DeepSpeed ones only where deepspeed imports
    dist = {r["config"]: r for r in map(json.loads, (out / "distributed.json").read_text().splitlines())}
    has_deepspeed = importlib.util.find_spec("deepspeed") is not None
    assert list(dist) == ["multi_gpu.yaml", "fsdp.yaml", "deepspeed_zero2.yaml", "deepspeed_zero3.yaml"]
    for name, r in dist.items():
        if name.startswith("deepspeed") and not has_deepspeed:
            assert r["status"] == "skipped" and r["reason"] == "deepspeed not importable"
        else:
            assert r["status"] == "dry-run" and r["tests"] == {"collected": 4}, r
    assert "cpu_2proc.yaml]" not in summary and "SWEET_DIST_CONFIGS=multi_gpu.yaml,fsdp.yaml" in summary


def test_gpu_check_loop_async_stage_at_tiny_scale(tmp_path):
    """The opt-in async LOOP stage: both runs play and train 3 iterations, the async run's
    rollouts are the fill (iteration 0) and two in the background, played one version behind."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "bench/gpu_check.py", "--scale", "tiny", "--device", "cpu",
                          "--stages", "loop_async", "--out", str(out), "--work", str(work)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    stage = json.loads((out / "gpu_check.json").read_text())["stages"]["loop_async"]
    assert res.returncode == 0 and stage["ok"], (stage.get("error"), res.stderr[-3000:])
    for mode in ("sync", "async"):
        run = stage["runs"][mode]
        assert len(run["rollout_s"]) == 3 and len(run["iteration_s"]) == 3, (mode, run)
        assert run["peak_gib"] is None  # no memory figures without a GPU
    assert math.isfinite(stage["ratio"]) and stage["ratio"] > 0 and stage["iterations"] == 3
    versions = {mode: [json.loads(line)["meta"]["policy_version"]
                       for it in range(3) for line in (work / f"loop_{mode}" / "episodes" / f"iter-{it:04d}.jsonl").open()]
                for mode in ("sync", "async")}
    assert versions == {"sync": [0] * 4 + [1] * 4 + [2] * 4, "async": [0] * 8 + [1] * 4}
    assert "loop_async" in (out / "summary.txt").read_text()


def test_vlm_critic_stage_has_qwen2_vl_7b_shape():
    """The stage's paper-scale model, built shape-only on the meta device: Qwen2-VL-7B-Instruct's
    8,291,375,616 parameters (675,759,104 in the vision tower), its image tokens the processor's."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check
    from engines.tiny import tiny_vl_path
    from sweet.critic.vision import load_processor

    tokenizer = load_processor(str(tiny_vl_path())).tokenizer
    config = gpu_check.vlm_config("8b", tokenizer)
    with torch.device("meta"):
        model = Qwen2VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 8_291_375_616
    assert sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}") == 675_759_104
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
