"""What importing a sandbox library (numpy by default) costs each sandboxed job.

    python bench/sandbox_imports.py              # 30 jobs of each kind per way (~1 min on 2 cores)
    python bench/sandbox_imports.py --jobs 100 --module pandas

Each job is one sandbox with one call, run one at a time; the script prints the median wall
time of a plain job and of one whose source imports the module, for a fresh interpreter
(`run_calls`) and for the pool's zygote (the default), their ratio, and each sandbox's
address space and RSS (what RLIMIT_AS, `SandboxLimits.memory_mb`, counts). The zygote
does not pre-import the module: docs/benchmarks.md records why. Needs the sandbox's
libraries (scripts/setup.sh).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from colbench.scoring.sandbox import SandboxPool, run_calls, sandbox_libraries, sandbox_site  # noqa: E402

MEM = ("def _mem():\n    d = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
       "    return int(d['VmSize'].split()[0]) // 1024, int(d['VmRSS'].split()[0]) // 1024\n")


def median_ms(run, source: str, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        out = run(source, ["f()"])
        times.append(time.perf_counter() - start)
        if not out[0].ok:
            raise SystemExit(f"bench/sandbox_imports.py: the job failed in the sandbox: {out[0].error}")
    return statistics.median(times) * 1e3


def memory_mb(run, source: str) -> tuple[int, int]:
    out = run(source + MEM, ["_mem()"])[0]
    return tuple(x["value"] for x in out.value["items"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30, help="jobs of each kind per way")
    parser.add_argument("--module", default="numpy", help="the module to import (from the sandbox's libraries)")
    args = parser.parse_args()
    if not sandbox_libraries():
        raise SystemExit(f"bench/sandbox_imports.py: no sandbox libraries at {sandbox_site()} (run scripts/setup.sh)")
    plain = "def f():\n    return 1\n"
    imports = f"import {args.module}\n\ndef f():\n    return 1\n"
    rows = []
    with SandboxPool(workers=1) as pool:
        for label, run in (("fresh interpreter (run_calls)", lambda src, calls: run_calls(src, calls)),
                           ("pool + zygote", lambda src, calls: pool.run_many([(src, calls)])[0])):
            median_ms(run, imports, 3)  # warm: the zygote started, the files in the page cache
            rows.append((label, median_ms(run, plain, args.jobs), median_ms(run, imports, args.jobs),
                         memory_mb(run, plain), memory_mb(run, imports)))
    print(f"{args.module} {sandbox_libraries().get(args.module, '?')}: median of {args.jobs} jobs each, one at a time")
    for label, t_plain, t_imp, m_plain, m_imp in rows:
        print(f"{label:30s}: plain job {t_plain:6.1f} ms, importing job {t_imp:6.1f} ms "
              f"(the import costs {t_imp - t_plain:6.1f} ms, ratio {t_imp / t_plain:4.1f}x); "
              f"VmSize/RSS MB plain {m_plain[0]}/{m_plain[1]}, importing {m_imp[0]}/{m_imp[1]}")


if __name__ == "__main__":
    main()
