"""vLLM against our HF engine, in one run on the same prompts: batched generation tokens/s
in float32 and bf16, and ColBench backend episodes per minute with each engine as the agent
and as the simulated human. Prints each ratio (vLLM / HF). Run it in .venv-vllm (vLLM's CPU
build, scripts/setup_vllm.sh) or on a GPU machine with the `vllm` extra.

    .venv-vllm/bin/python bench/vllm_vs_hf.py                        # the tiny model
    .venv-vllm/bin/python bench/vllm_vs_hf.py --model smollm2        # any name both backends take
    .venv-vllm/bin/python bench/vllm_vs_hf.py --skip-episodes --prompts 16 --max-new-tokens 128

`--model NAME` is used as `hf:NAME` and `vllm:NAME` (a spec name such as `tiny`, a path or
a hub id). Generation: `--prompts` conversations, one sample each at temperature 1, all
in one generate call after a warm-up call; tokens/s = the tokens each engine really
generated / the call's wall time. Episodes: `--tasks`
backend tasks x 2 seeds, 3 turns, with agent and human both from the engine under test
(the human through the same backend as a simulator spec), timed after a one-episode warm-up;
the engines' start is printed on its own line. vLLM binds its threads to all
the process's cores (engines.vllm_engine.cpu_share); the HF engine uses `--threads` torch
threads (default: the same cores).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="model name both backends take (default: tiny)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--tasks", type=int, default=3, help="backend tasks for the episodes comparison (x 2 seeds)")
    p.add_argument("--skip-episodes", action="store_true")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    return p


def conversations(n: int) -> list[list[dict]]:
    topics = ["sort a list", "parse a date", "count words", "merge two dicts", "reverse a string", "sum digits"]
    return [[{"role": "user", "content": f"Write a Python function to {topics[i % len(topics)]} (variant {i})."}]
            for i in range(n)]


def tokens_per_second(spec: str, dtype: str, args) -> float:
    from engines import EngineOptions, SamplingParams, load_engine

    options = EngineOptions(dtype=dtype, device="cpu" if spec.startswith("hf:") else None, batch_size=args.prompts,
                            max_model_len=2048)
    engine = load_engine(spec, options)
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
        convs = conversations(args.prompts)
        engine.generate(convs[:2], params)  # warm-up
        t0 = time.perf_counter()
        out = engine.generate(convs, params)
        seconds = time.perf_counter() - t0
    finally:
        engine.close()
    return sum(len(s[0].token_ids) for s in out) / seconds


def episodes_per_minute(backend: str, args) -> tuple[float, float]:
    """(seconds to start the agent's and the human's engines, episodes per minute after a
    one-episode warm-up): a vLLM start on CPU takes a minute or more, which a handful of
    episodes would otherwise be dominated by."""
    from contextlib import closing

    from colbench.agents import ModelAgent
    from colbench.rollout import rollout
    from colbench.tasks import load_tasks
    from engines import EngineOptions, SamplingParams, load_engine
    from sweet.core.rollouts import rollout_session

    spec = f"{backend}:{args.model}"
    tasks = load_tasks("builtin:train", env="backend")[: args.tasks]
    options = EngineOptions(dtype="float32", device="cpu" if backend == "hf" else None, max_model_len=4096)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64)
    t0 = time.perf_counter()
    with rollout_session("backend", spec, max_turns=3) as (env, human), closing(load_engine(spec, options)) as engine:
        start = time.perf_counter() - t0
        agent = ModelAgent(engine, sampling, name="policy")
        with tempfile.TemporaryDirectory() as tmp:
            rollout(env, tasks[:1], agent, human, seeds=[99], max_turns=3, out_path=f"{tmp}/warm.jsonl", progress=False)
            t1 = time.perf_counter()
            episodes = rollout(env, tasks, agent, human, seeds=[0, 1], max_turns=3, out_path=f"{tmp}/episodes.jsonl",
                               progress=False)
            minutes = (time.perf_counter() - t1) / 60
    return start, len(episodes) / minutes


def main(argv: list[str] | None = None) -> None:
    import torch

    args = make_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"model {args.model}; {args.prompts} prompts x {args.max_new_tokens} tokens; cores "
          f"{sorted(os.sched_getaffinity(0))}; load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for dtype in args.dtypes.split(","):
        hf = tokens_per_second(f"hf:{args.model}", dtype, args)
        vl = tokens_per_second(f"vllm:{args.model}", dtype, args)
        print(f"generation {dtype:>9}: hf {hf:8.1f} tok/s   vllm {vl:8.1f} tok/s   ratio vllm/hf {vl / hf:5.2f}x",
              flush=True)
    if not args.skip_episodes:
        (hf_start, hf), (vl_start, vl) = episodes_per_minute("hf", args), episodes_per_minute("vllm", args)
        print(f"engines' start (agent + human): hf {hf_start:6.1f} s   vllm {vl_start:6.1f} s")
        print(f"episodes (agent + human, after a warm-up): hf {hf:6.2f}/min   vllm {vl:6.2f}/min   "
              f"ratio vllm/hf {vl / hf:5.2f}x")
    load = os.getloadavg()
    print(f"load after {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
