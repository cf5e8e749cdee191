"""Generation throughput of the hf backend: batched vs one conversation at a time.

    python bench/generation.py                                  # tiny model, 64 conversations x 4 samples
    python bench/generation.py --conversations 16 --samples 8 --max-new-tokens 64
    python bench/generation.py --model hf:Qwen/Qwen2.5-0.5B-Instruct --device cuda --batch-size 128

Both runs use the same engine, prompts, sampling parameters and seed. "Batched" sends
all conversations in one `generate` call (rows sorted by prompt length, left padded,
`--batch-size` rows per forward pass); "one at a time" calls `generate` per
conversation (its n samples still share a batch), the way a naive agent loop does.
"""

from __future__ import annotations

import argparse
import random
import time


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="model spec (default: the tiny offline Llama)")
    p.add_argument("--conversations", type=int, default=64, help="number of conversations")
    p.add_argument("--samples", type=int, default=4, help="samples per conversation (n)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per sample at most")
    p.add_argument("--batch-size", type=int, default=64, help="rows per forward pass in the batched run")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 avoids contention on shared cores)")
    p.add_argument("--seed", type=int, default=0)
    return p


def conversations(count: int, seed: int) -> list[list[dict]]:
    """Prompts of varied length, so batching has to pad."""
    rng = random.Random(seed)
    words = "function list value return sort the numbers of a string and count each key in order".split()
    return [
        [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(5, 60)))}]
        for _ in range(count)
    ]


def timed(engine, convs, params) -> tuple[float, int, int]:
    """(seconds, generated tokens, samples) for one generate pass."""
    start = time.perf_counter()
    out = engine.generate(convs, params)
    seconds = time.perf_counter() - start
    return seconds, sum(len(s.token_ids) for samples in out for s in samples), sum(len(s) for s in out)


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    import torch

    from engines import EngineOptions, SamplingParams, load_engine

    torch.set_num_threads(args.threads)
    engine = load_engine(args.model, EngineOptions(device=args.device, batch_size=args.batch_size))
    convs = conversations(args.conversations, args.seed)
    params = SamplingParams(n=args.samples, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    engine.generate(convs[:2], SamplingParams(n=2, max_new_tokens=4))  # warm-up

    batched = timed(engine, convs, params)
    naive = [timed(engine, [c], params) for c in convs]
    naive_total = (sum(r[0] for r in naive), sum(r[1] for r in naive), sum(r[2] for r in naive))

    print(f"model {args.model}: {args.conversations} conversations x {args.samples} samples, "
          f"max {args.max_new_tokens} new tokens, device {args.device}, {args.threads} threads")
    print(f"{'run':<28}{'seconds':>10}{'tokens/s':>12}{'samples/s':>12}")
    rates = {}
    for name, (seconds, tokens, samples) in [
        (f"batched (batch {args.batch_size})", batched),
        ("one conversation at a time", naive_total),
    ]:
        rates[name] = (tokens / seconds, samples / seconds)
        print(f"{name:<28}{seconds:>10.2f}{tokens / seconds:>12.1f}{samples / seconds:>12.2f}")
    (b_tok, b_smp), (n_tok, n_smp) = rates.values()
    print(f"speed-up batched / one-at-a-time: {b_tok / n_tok:.2f}x tokens/s, {b_smp / n_smp:.2f}x samples/s")
    engine.close()


if __name__ == "__main__":
    main()
