"""bench/logprob_memory.py at a tiny size: it runs both paths, they agree, and its last
line is the ratio in the documented form (memory, not time: no timing assertions)."""

from __future__ import annotations

import re


def test_logprob_memory_bench_prints_the_ratio_last(run_bench):
    res = run_bench("logprob_memory.py", "--tokens", "1024", "--action", "128", "--vocab", "32000", "--hidden", "32",
                    "--layers", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    m = re.fullmatch(r"peak memory, full logits / chunked: (\d+\.\d)x", lines[-1])
    assert m, lines[-1]
    # 1024 x 32000 float32 logits are 125 MiB and their log-softmax as much: the naive pass
    # holds both, the chunked one logits for the 128 scored rows only (16 MiB)
    assert float(m.group(1)) > 1.5, res.stdout
    gap = float(re.search(r"max \|log-prob difference\| over the 128 scored tokens: (\S+)", res.stdout).group(1))
    assert gap < 1e-4


def test_logprob_memory_bench_refuses_a_bad_action_length(run_bench):
    res = run_bench("logprob_memory.py", "--tokens", "64", "--action", "64", timeout=60)
    assert res.returncode != 0 and "--action must be in 1..63" in res.stderr
