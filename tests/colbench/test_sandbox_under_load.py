"""The sandbox on a busy machine: a call's wall-clock limit is not charged for the time
its process waited for a CPU, so a correct answer is not scored 0 because other work had
the cores; time the code spends itself (computing or sleeping) still counts.

Contention is made on purpose: the sandboxes run in a cgroup whose CPU quota is 2% of one
core, so they are runnable but mostly denied a CPU, as beside a full machine's other work.
Real sandboxes, no mocks; skipped where this process cannot create a CPU cgroup (not root,
cgroups read-only).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

import pytest

from colbench.scoring.backend import score_backend
from colbench.scoring import sandbox
from colbench.scoring.sandbox import SandboxLimits, SandboxPool
from colbench.types import Task

V1, V2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
QUOTA_PERCENT = 2  # of one core: the module bodies below take ~10-15 ms of CPU, so ~0.5-1 s of wall time
# The wall limit is well above the code's own time (~15 ms) and well below its wall time
# under the quota, which is what the test is about; the CPU and total limits never bind.
LIMITS = SandboxLimits(cpu_seconds_per_call=1.0, wall_seconds_per_call=0.25, wall_seconds_total=60.0, memory_mb=256)

# A correct answer whose module body does real work (stdlib imports, a dataclass) in a few ms of CPU.
REFERENCE = (
    "from dataclasses import dataclass\nfrom fractions import Fraction\nimport decimal, statistics\n\n"
    "@dataclass(frozen=True)\nclass Share:\n    who: str\n    part: Fraction\n\n"
    "def split(total, names):\n    return [Share(n, Fraction(total, len(names))) for n in names]\n\n"
    "def mean(xs):\n    return statistics.fmean(xs)\n"
)
ANSWER = REFERENCE.replace("Fraction(total, len(names))", "Fraction(total) / len(names)")
TESTS = ("split(10, ['a', 'b', 'c'])", "mean([1, 2, 4])")


def _cgroup_dir() -> tuple[Path, str] | None:
    """A new CPU cgroup (its folder, "v1" or "v2"), or None where we may not make one."""
    name = f"sweet-test-load-{uuid.uuid4().hex[:8]}"
    for root, kind, probe in ((V1, "v1", "cpu.cfs_quota_us"), (V2, "v2", "cgroup.subtree_control")):
        if not (root / probe).exists():
            continue
        if kind == "v2" and "cpu" not in (root / "cgroup.subtree_control").read_text().split():
            continue  # the cpu controller is not delegated to child groups
        try:
            (root / name).mkdir()
        except OSError:
            continue
        return root / name, kind
    return None


@contextlib.contextmanager
def cpu_quota(pid: int, percent: int):
    """Run `pid` and every process it forks from now on in a cgroup capped at `percent` of one core."""
    made = _cgroup_dir() if os.geteuid() == 0 else None
    if made is None:
        pytest.skip("cannot create a CPU cgroup here (needs root and a writable cgroup cpu controller)")
    group, kind = made
    period = 100_000
    if kind == "v1":
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(period * percent // 100))
    else:
        (group / "cpu.max").write_text(f"{period * percent // 100} {period}")
    (group / "cgroup.procs").write_text(str(pid))
    try:
        yield
    finally:
        for left in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # back to the root group (processes that exited meanwhile: gone)
                (group.parent / "cgroup.procs").write_text(left)
        for _ in range(100):  # rmdir fails while a dying sandbox still counts as a member
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)


@contextlib.contextmanager
def starved_pool(workers: int):
    """A SandboxPool whose sandboxes (all forked by its zygote) get QUOTA_PERCENT of one core."""
    with SandboxPool(workers=workers, limits=LIMITS) as pool:
        assert pool.run_many([("", ["1"])])[0][0].ok  # starts the zygote, unthrottled
        with cpu_quota(pool._zygote._proc.pid, QUOTA_PERCENT):
            yield pool


def test_a_correct_answer_scores_full_marks_on_a_starved_machine():
    task = Task(task_id="load", env="backend", description="", hidden=REFERENCE, tests=TESTS)
    with starved_pool(workers=2) as pool:
        t0 = time.monotonic()
        score = score_backend([task], [ANSWER], pool)[0]
        took = time.monotonic() - t0
    assert score.reward == 1.0, score.detail
    # The sandboxes really were starved: without the contention this takes ~0.1 s, and
    # every phase (start, module body, each call) exceeded the 0.25 s wall limit.
    assert took > 3 * LIMITS.wall_seconds_per_call, took


def test_the_codes_own_time_still_counts_on_a_starved_machine():
    # Sleeping is not waiting for a CPU: a call that sleeps past the wall limit times out,
    # under contention as on an idle machine, and the calls around it pass.
    src = REFERENCE + "\nimport time\n\ndef nap(s):\n    time.sleep(s)\n    return s\n"
    with starved_pool(workers=1) as pool:
        t0 = time.monotonic()
        outs = pool.run_many([(src, ["nap(0.05)", "nap(5)", "mean([2])"])])[0]
        took = time.monotonic() - t0
    assert [o.ok for o in outs] == [True, False, True], outs
    assert outs[1].error == "TimeoutError"
    assert took < 5, took  # stopped by the limit, not by the end of the nap


def test_the_parents_deadline_moves_by_the_kernels_waits_when_the_child_cannot_report():
    # With its own timer ignored, the child never looks at (or tells anyone about) its waits;
    # the parent's deadline (wall limit + LINE_GRACE_S) still gives a starved call the time
    # the kernel says it waited for a CPU. The body needs ~60 ms of CPU: a few seconds of
    # wall time under the quota, well past the parent's 1.25 s, yet its own time is short.
    src = ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
           "total = sum(i * i for i in range(1_200_000))\n\ndef get():\n    return total\n")
    with starved_pool(workers=1) as pool:
        t0 = time.monotonic()
        outs = pool.run_many([(src, ["get()"])])[0]
        took = time.monotonic() - t0
    assert outs[0].ok and outs[0].value == {"type": "int", "value": sum(i * i for i in range(1_200_000))}, outs
    assert took > LIMITS.wall_seconds_per_call + sandbox.LINE_GRACE_S, took  # the parent's own limit was passed
