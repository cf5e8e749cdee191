"""bench/trainer_vs_trl.py at a tiny size: every run works, both sides train on the same
tokens with the same maths, and the last line is the headline (no timing assertions)."""

from __future__ import annotations

import json
import math
import re

import pytest


@pytest.mark.heavy
def test_bench_runs_both_trainers_and_prints_the_ratio_last(tmp_path, run_bench):
    pytest.importorskip("trl")
    out = tmp_path / "runs.json"
    res = run_bench("trainer_vs_trl.py", "--context", "24", "--action", "8", "--batch_size", "4",
                    "--micro_batch_size", "2", "--warmup_steps", "1", "--steps", "1", "--check_steps", "2",
                    "--json", out, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"ours / TRL tokens/s: DPO (\d+\.\d)x, SFT (\d+\.\d)x", last)
    assert m, last
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"ours:dpo", "trl:dpo", "ours:sft", "trl:sft"}
    for algo in ("dpo", "sft"):
        ours, trl = results[f"ours:{algo}"], results[f"trl:{algo}"]
        # the same items in the same steps: the same token count (TRL's batches were checked against it)
        assert ours["tokens"] == trl["tokens"] > 0 and ours["steps"] == trl["steps"] == 1
        # the headline is the ratio of the two runs' figures, rounded
        assert float(m.group(1 if algo == "dpo" else 2)) == round(ours["tokens_per_s"] / trl["tokens_per_s"], 1)
        # the same maths: the first step (before any update) and the second (after one) agree
        assert len(ours["losses"]) == len(trl["losses"]) == 2
        for a, b in zip(ours["losses"], trl["losses"]):
            assert a == pytest.approx(b, rel=1e-5)
        assert ours["peak"] is not None and trl["peak"] is not None
    # step 1: the policy is its own reference, so the DPO term is log 2 and the rest is α·NLL (α = 0.01)
    nll = results["ours:dpo"]["losses"][0] - math.log(2)
    assert 0 < nll < 0.01 * 20
    assert results["ours:dpo"]["ref_s"] > 0 and results["trl:dpo"]["ref_s"] > 0  # both precompute π_ref
    assert "| ours:dpo |" in res.stdout and "DPO loss, ours vs TRL, relative difference: step 1" in res.stdout
