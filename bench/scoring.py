"""Backend scoring throughput: sandboxed (SandboxPool) vs unsafe in-process exec, same run.

    python bench/scoring.py                      # ~200 answers, workers = CPU count
    python bench/scoring.py --answers 1000 --workers 8

Answers are the bundled test tasks' reference solutions plus a wrong variant of each
(so both passing and failing paths run), 10 calls each. Reference outputs are computed
first and cached, as in training, so the timed part is the answers only.

The naive way is what the reference ColBench code does: exec each answer in this
process and compare with ==. It is fast and unsafe (an answer can kill, hang or read
this process); the ratio is the price of real isolation. A sandbox costs one
interpreter start plus namespace setup per answer (tens of ms), so against microsecond
in-process calls the ratio is large; what matters is the absolute answers/s against the
rate a policy generates answers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from colbench.backend_scoring import ReferenceCache, score_backend  # noqa: E402
from colbench.sandbox import SandboxPool, isolation_report  # noqa: E402
from colbench.tasks import load_tasks  # noqa: E402

TASKS_FILE = Path(__file__).resolve().parents[1] / "tasks" / "backend" / "test.jsonl"


def make_workload(n: int):
    tasks = load_tasks(str(TASKS_FILE), validate=False)
    pairs = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        answer = t.hidden if i % 2 == 0 else t.hidden.replace("return ", "return 1 + ", 1)  # wrong variant
        pairs.append((t, answer))
    return pairs


def unsafe_inprocess(pairs) -> tuple[float, float]:
    """The reference's way: exec in our process, compare with ==. Returns (seconds, mean reward)."""
    start, total = time.perf_counter(), 0.0
    for task, answer in pairs:
        ref_mod, ans_mod = types.ModuleType("ref"), types.ModuleType("ans")
        exec(task.hidden, ref_mod.__dict__)
        try:
            exec(answer, ans_mod.__dict__)
        except Exception:  # noqa: BLE001
            continue
        passed = 0
        for call in task.tests:
            try:
                passed += eval(call, ans_mod.__dict__) == eval(call, ref_mod.__dict__)
            except Exception:  # noqa: BLE001
                pass
        total += passed / len(task.tests)
    return time.perf_counter() - start, total / len(pairs)


def sandboxed(pairs, workers: int) -> tuple[float, float]:
    tasks, answers = [t for t, _ in pairs], [a for _, a in pairs]
    cache = ReferenceCache()
    with SandboxPool(workers=workers) as pool:
        score_backend(tasks, [t.hidden for t in tasks], pool, cache=cache)  # warm the reference cache
        start = time.perf_counter()
        scores = score_backend(tasks, answers, pool, cache=cache)
        seconds = time.perf_counter() - start
    return seconds, sum(s.reward for s in scores) / len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=200, help="answers to score")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel sandboxes")
    args = parser.parse_args()

    pairs = make_workload(args.answers)
    active = [k for k, v in isolation_report().items() if v]
    print(f"isolation active: {', '.join(active)}")
    t_unsafe, r_unsafe = unsafe_inprocess(pairs)
    t_box, r_box = sandboxed(pairs, args.workers)
    n = len(pairs)
    print(f"unsafe in-process exec : {n / t_unsafe:10.1f} answers/s  ({t_unsafe * 1e3 / n:7.2f} ms/answer, "
          f"mean reward {r_unsafe:.3f})")
    print(f"sandbox pool ({args.workers} workers): {n / t_box:10.1f} answers/s  ({t_box * 1e3 / n:7.2f} ms/answer, "
          f"mean reward {r_box:.3f})")
    print(f"ratio (unsafe / sandbox throughput): {t_box / t_unsafe:.1f}x")


if __name__ == "__main__":
    main()
