"""Scoring the published backend test split's references against themselves: the sandbox
pool vs unsafe in-process execution of the same rows, same run.

    python bench/real_scoring.py                  # the 1,000 rows (~1-2 min on 2 cores)
    python bench/real_scoring.py --limit 100 --workers 4
    python bench/real_scoring.py --tasks my_rows.jsonl

Rows come from ../shared/data/colbench-test/backend_test.jsonl (the public copy of the
published split, kept outside the repo) or --tasks, in the published format. Each row's
reference is the answer too, so every test should pass; each way lists the rows (1-based
lines) that did not.

Sandboxed: `score_backend` with an empty reference cache, so each row runs two sandboxes
(reference, answer), with the allowed libraries and the same seeds in both. Unsafe: what the
published evaluator does, in this process: exec the reference and the answer as modules,
evaluate each call in both with a per-call alarm, compare with ==. It is fast and unsafe (a
row can kill, hang or read this process; it runs in a scratch folder, as rows write files),
has only the venv's libraries and no seeds, so rows that draw random numbers or import a
library the venv lacks fail there. The ratio is the price of isolation on real rows. Needs
the sandbox's libraries (scripts/setup.sh) for the rows that import numpy or bs4.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from colbench.scoring.backend import ReferenceCache, score_backend  # noqa: E402
from colbench.scoring.sandbox import SandboxLimits, SandboxPool, isolation_report, sandbox_libraries  # noqa: E402
from colbench.tasks import load_tasks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT.parent / "shared" / "data" / "colbench-test" / "backend_test.jsonl"


class _Alarm(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Alarm()


def _guarded(fn, seconds: float):
    """fn() under a wall-clock alarm: (ok, value)."""
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return True, fn()
    except (Exception, SystemExit, _Alarm):  # noqa: BLE001 - the row's own failures
        return False, None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def unsafe_inprocess(tasks, seconds: float) -> tuple[float, list[float]]:
    """The published evaluator's way, modules instead of a function's locals: exec the
    reference and the answer in this process, compare each call with ==.
    Returns (seconds, reward of each row)."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    rewards = []
    start = time.perf_counter()
    try:  # in a scratch folder: references write files (sqlite databases) where they run
        with tempfile.TemporaryDirectory(prefix="real-scoring-") as scratch, contextlib.chdir(scratch), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            for t in tasks:
                ref, ans = types.ModuleType("reference"), types.ModuleType("answer")
                ok_ref, _ = _guarded(lambda: exec(compile(t.hidden, "<reference>", "exec"), ref.__dict__), seconds)
                ok_ans, _ = _guarded(lambda: exec(compile(t.hidden, "<answer>", "exec"), ans.__dict__), seconds)
                passed = 0
                for call in t.tests:
                    good_r, want = _guarded(lambda: eval(call, ref.__dict__), seconds) if ok_ref else (False, None)
                    good_a, got = _guarded(lambda: eval(call, ans.__dict__), seconds) if ok_ans else (False, None)
                    if good_r and good_a:
                        passed += _guarded(lambda: bool(got == want), seconds) == (True, True)
                rewards.append(passed / len(t.tests) if t.tests else 0.0)
    finally:
        signal.signal(signal.SIGALRM, old)
    return time.perf_counter() - start, rewards


def sandboxed(tasks, workers: int) -> tuple[float, list[float]]:
    """score_backend, references not cached: two sandboxes per row. (seconds, reward of each row)."""
    with SandboxPool(workers=workers) as pool:
        pool.run_many([("x = 1", ["x"])])  # start the zygote outside the timed part
        start = time.perf_counter()
        scores = score_backend(tasks, [t.hidden for t in tasks], pool, cache=ReferenceCache())
        seconds = time.perf_counter() - start
    return seconds, [s.reward for s in scores]


def _row(task) -> str:
    return str(task.meta["index"] + 1) if "index" in task.meta else task.task_id


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=str(PUBLISHED), help="backend rows in the published format (JSONL)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N rows")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel sandboxes")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if not Path(args.tasks).is_file():
        raise SystemExit(f"bench/real_scoring.py: no such file {args.tasks} (the published backend test split, "
                         "../shared/data/colbench-test/backend_test.jsonl beside the repo, or --tasks)")
    tasks = load_tasks(args.tasks, limit=args.limit, validate=False)
    active = [k for k, v in isolation_report().items() if v]
    print(f"{len(tasks)} rows of {args.tasks}; isolation active: {', '.join(active)}")
    libs = sandbox_libraries()
    print(f"sandbox libraries: {', '.join(f'{k} {v}' for k, v in libs.items()) or 'none (run scripts/setup.sh)'}")
    t_unsafe, r_unsafe = unsafe_inprocess(tasks, SandboxLimits().wall_seconds_per_call)
    t_box, r_box = sandboxed(tasks, args.workers)
    n = len(tasks)
    for name, t, r in (("unsafe in-process exec", t_unsafe, r_unsafe),
                       (f"sandbox pool + zygote ({args.workers} workers)", t_box, r_box)):
        failing = [_row(task) for task, reward in zip(tasks, r) if reward < 1.0]
        print(f"{name:36s}: {t:7.2f} s, {n / t:8.1f} rows/s ({t * 1e3 / n:7.2f} ms/row), mean reward "
              f"{sum(r) / n:.3f}, success {sum(x == 1.0 for x in r) / n:.3f}; rows not passing: "
              f"{', '.join(failing) or 'none'}")
    print(f"ratio sandbox pool / unsafe in-process time: {t_box / t_unsafe:.1f}x")


if __name__ == "__main__":
    main()
