"""engines.memory: freed tensors' pages go back to the system, and the trainer trims only
when its steps freed much (a tiny model's steps never pay for it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engines.memory import HeapTrimmer, _libc, resident_bytes

ROOT = Path(__file__).resolve().parents[2]

glibc = pytest.mark.skipif(_libc() is None or resident_bytes() is None, reason="malloc_trim is glibc's, statm Linux's")

# In a fresh process: one freed 16 MiB tensor raises glibc's mmap threshold, so the next 4 MiB
# tensors come from the heap; a live 256 KiB block after each keeps free() from shrinking
# the heap's top, as a real step's mixed sizes do. Prints MiB above the start: with the
# 512 MiB held, after freeing it, after the trim.
HEAP = textwrap.dedent("""
    import torch
    from engines.memory import resident_bytes, trim_heap
    mib = lambda: resident_bytes() / 2**20
    big = torch.ones(4 << 20); del big
    start = mib()
    held, pins = [], []
    for _ in range(128):
        held.append(torch.ones(1 << 20)); pins.append(torch.ones(1 << 16))
    holding = mib() - start
    del held
    freed = mib() - start
    assert trim_heap()
    print(holding, freed, mib() - start)
""")


@glibc
def test_trim_heap_gives_back_freed_tensors():
    out = subprocess.run([sys.executable, "-c", HEAP], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    holding, freed, trimmed = map(float, out.split())
    assert holding > 500  # 512 MiB of tensors + 32 MiB of pins, resident
    assert freed > 450, "glibc gave the freed blocks back by itself: this test no longer shows the retention"
    assert trimmed < 100, f"after malloc_trim still {trimmed:.0f} MiB above the start (the pins are 32)"


@glibc
def test_heap_trimmer_trims_past_its_slack_then_measures_the_working_level_again():
    never = HeapTrimmer(slack=1 << 40)
    assert [never() for _ in range(3)] == [False] * 3 and never.trims == 0
    always = HeapTrimmer(slack=-(1 << 40))
    assert [always() for _ in range(4)] == [True, False, True, False] and always.trims == 2
    assert always.level == pytest.approx(resident_bytes(), rel=0.05)  # the level measured after a trim


@glibc
def test_trainer_trims_after_a_step_past_the_slack_and_not_before(tiny_tokenizer, tmp_path):
    import random

    from accelerate.state import AcceleratorState, GradientState

    from sweet.algorithms.policy_trainer import sft_loss_fn
    from sweet.core.config import ModelConfig, TrainConfig
    from sweet.core.tokens import Segment
    from sweet.core.trainer import Trainer

    rng = random.Random(0)
    segs = [Segment(tuple(rng.randrange(5, 250) for _ in range(6)), tuple(rng.randrange(5, 250) for _ in range(3)))
            for _ in range(8)]
    model = ModelConfig(model="tiny", dtype="float32", max_length=128, keep_head=16)

    def steps(tmp: Path, slack: int | None) -> int:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        trainer = Trainer(model, TrainConfig(output_dir=str(tmp), batch_size=2, micro_batch_size=1, report_to="none"),
                          tiny_tokenizer)
        if slack is not None:
            trainer.trim_heap = HeapTrimmer(slack)
        trainer.prepare(trainer.steps_per_epoch(len(segs)))
        trainer.fit(list(range(len(segs))), sft_loss_fn(segs, model, int(tiny_tokenizer.pad_token_id)))
        return trainer.trim_heap.trims

    assert steps(tmp_path / "a", None) == 0  # the default slack: the tiny model's steps never trim
    # always past the slack: after each of the 8 micro-batches (2 a step, 4 steps) a trim, or the level measured again
    assert steps(tmp_path / "b", -(1 << 40)) == 4
