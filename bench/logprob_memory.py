"""Peak memory of action log-probs: full-vocabulary float32 logits (the naive way) vs
sweet.core.logprobs' chunked head on the scored positions only.

    python bench/logprob_memory.py                      # 8k tokens, 128k vocab (Llama-3), CPU, ~1 minute
    python bench/logprob_memory.py --tokens 2048 --backward     # with gradients (a loss): ~4 GB for the naive way
    python bench/logprob_memory.py --tokens 1024 --vocab 32000 --hidden 32   # seconds (the test's size)

A Llama-shaped model with Llama-3's vocabulary (128,256) and sequence length (8,192),
scaled so it runs on a CPU: a small hidden size and 2 layers (the log-prob memory grows
with tokens x vocabulary, the part that is kept at full size). One sequence of `--tokens`
tokens whose last `--action` tokens are scored (one agent turn after its context),
without gradients by default (the scoring passes: critic scores, π_ref and LOOP's old
log-probs), `--backward` for forward + backward as a loss takes it (the naive path then
needs ~4x its logits: about 17 GB at the default size, so use a smaller --tokens on a
shared machine; bench/gpu_check.py measures both at the 8B shape on a GPU).

Each path runs in its own fresh subprocess; its peak is the process's resident high-water
mark (getrusage ru_maxrss) minus the resident size just before the pass (model built,
inputs made): what the pass adds on top of the model. Both paths' log-probs are compared.
The last line is the ratio, e.g. `peak memory, full logits / chunked: 5.2x`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8192, help="sequence length (context + action)")
    p.add_argument("--action", type=int, default=512, help="scored tokens at the end of the sequence")
    p.add_argument("--vocab", type=int, default=128256, help="vocabulary size (Llama 3: 128256)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (scaled down from 4096)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (scaled down from 32)")
    p.add_argument("--backward", action="store_true", help="forward + backward of the log-probs' sum "
                                                           "(default: scoring without gradients)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--path", choices=["full", "chunked"], help=argparse.SUPPRESS)  # one measurement (the child)
    return p


def full_logits_logprobs(model, batch):
    """The naive way (sweet.core.tokens before chunking): float32 logits over the whole
    vocabulary at every position, log-softmaxed, gathered: [B, L], zero at position 0."""
    import torch
    import torch.nn.functional as F

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logp = torch.gather(F.log_softmax(logits[:, :-1], dim=-1), 2, batch.input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(logp, (1, 0))


def llama_model(vocab: int, hidden: int, layers: int, max_positions: int, device: str = "cpu", dtype=None):
    """A random-weight Llama of the given shape (4 heads of hidden/4, 2 KV heads, untied head)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).to(dtype or torch.float32)


def turn_batch(tokens: int, action: int, vocab: int, device: str = "cpu"):
    """One sequence: `tokens - action` context ids, then `action` scored ids."""
    import torch

    from sweet.core.tokens import make_batch

    ids = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    return make_batch([(ids[: tokens - action], ids[tokens - action :])], pad_id=0).to(device)


def _rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _rss_now_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / MIB


def measure(args) -> dict:
    """One path in this (fresh) process: its log-probs' sum, seconds and memory."""
    import torch

    from sweet.core.logprobs import token_logprobs

    torch.set_num_threads(args.threads)
    model = llama_model(args.vocab, args.hidden, args.layers, max(args.tokens, 128))
    batch = turn_batch(args.tokens, args.action, args.vocab)
    fn = full_logits_logprobs if args.path == "full" else token_logprobs

    def one_pass(batch):
        with torch.set_grad_enabled(args.backward):
            logp = fn(model, batch)
            total = (logp * batch.action_mask).sum()
            if args.backward:
                total.backward()
        return logp, total

    one_pass(turn_batch(16, 4, args.vocab))  # warm-up: lazy kernel and thread-pool set-up, gradient buffers
    before = _rss_now_mib()
    start = time.perf_counter()
    logp, total = one_pass(batch)
    seconds = time.perf_counter() - start
    action = logp[batch.action_mask.bool()].detach()
    return {"path": args.path, "seconds": round(seconds, 2), "rss_before_mib": round(before, 1),
            "rss_peak_mib": round(_rss_peak_mib(), 1), "pass_mib": round(_rss_peak_mib() - before, 1),
            "logp_sum": float(total), "logp": action.tolist()}


def run_child(args, path: str) -> dict:
    argv = [sys.executable, __file__, "--path", path] + [
        a for k, v in vars(args).items() if k != "path" and v is not None and v is not False
        for a in ([f"--{k.replace('_', '-')}"] if v is True else [f"--{k.replace('_', '-')}", str(v)])]
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=None)
    if res.returncode != 0:
        raise SystemExit(f"the {path} path failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not 0 < args.action < args.tokens:
        parser.error(f"--action must be in 1..{args.tokens - 1} (--tokens), got {args.action}")  # one line, exit 2
    if args.path:  # the child: one measurement, as JSON on the last line
        print(json.dumps(measure(args)))
        return
    full, chunked = run_child(args, "full"), run_child(args, "chunked")
    gap = max(abs(a - b) for a, b in zip(full["logp"], chunked["logp"]))
    mode = "forward + backward" if args.backward else "scoring (no grad)"
    print(f"Llama-shaped model: vocab {args.vocab:,}, hidden {args.hidden}, {args.layers} layers, float32, CPU; "
          f"{args.tokens:,} tokens, the last {args.action:,} scored; {mode}")
    print(f"full-vocabulary logits alone: {args.tokens * args.vocab * 4 / MIB:,.0f} MiB in float32 (and the log-softmax as much again)")
    for r in (full, chunked):
        print(f"  {r['path']:8s} pass +{r['pass_mib']:,.0f} MiB over the loaded model "
              f"(process peak {r['rss_peak_mib']:,.0f} MiB), {r['seconds']} s")
    print(f"max |log-prob difference| over the {args.action} scored tokens: {gap:.2e}")
    print(f"peak memory, full logits / chunked: {full['pass_mib'] / max(chunked['pass_mib'], 1.0):.1f}x")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
