"""Our policy trainer against TRL's on the same data: tokens/s and peak memory.

    python bench/trainer_vs_trl.py                                 # tiny model on CPU (~1 CPU-minute, 1 thread)
    python bench/trainer_vs_trl.py --model hf:meta-llama/Llama-3.1-8B-Instruct --device cuda \\
        --lora --gradient_checkpointing --context 2048 --action 256 --batch_size 8 --micro_batch_size 2

Four runs, each in its own process (so peak memory is its own), on the same random-id data:

  DPO  ours: sweet.algorithms.policy_trainer (Trainer + dpo_loss_fn + reference_logps), the step that
             SWEET-RL stage 2 runs (per-turn pairs: one context, a chosen and a rejected
             action) and `--algorithm mtdpo` runs with one segment per side;
       TRL:  trl.DPOTrainer, loss_type ["sigmoid", "sft"] with weights [1, nll_coef].
  SFT  ours: sweet.algorithms.policy_trainer's SFT loss (RFT, warm start): token-mean NLL over actions;
       TRL:  trl.SFTTrainer, completion_only_loss (loss on the completion tokens only).

Same β, learning rate, schedule (linear to zero over the run), fused AdamW (transformers'
default optimiser, and ours: sweet.core.models.make_optimizer), gradient clip 1.0,
batch and micro-batch (TRL: per_device_train_batch_size x gradient_accumulation_steps),
max length, dtype and LoRA / gradient-checkpointing settings; the same items in the same
micro-batches (TRL reads our epoch-0 order with a sequential sampler; its dataset is given
as token ids, so nothing is re-tokenised); no sequence is long enough for either side to
truncate. Reference log-probs, both sides once before training with the initial policy
(no grad; LoRA: the base model under disabled adapters), no reference model kept:
ours `reference_logps` (micro-batches of chosen + rejected), TRL `precompute_ref_log_probs`
(its documented option; its default instead runs a frozen copy every step). That pass
is timed apart ("ref s"); tokens/s is over the optimiser steps after `--warmup_steps`.

Tokens: the non-pad tokens of every sequence a step trains on (a DPO pair is two: context
+ chosen, context + rejected), counted from the data for both (TRL's batches are checked
against that count). Peak memory: on CUDA torch.cuda.max_memory_allocated (GiB, model +
optimiser + activations); on CPU the process's resident high-water mark (VmHWM) above its
resident size just before the model is loaded (MiB).

Same maths: the first `--check_steps` optimiser steps' losses are printed side by side
(step 1: policy = reference, so the DPO term is log 2 on both and the difference is in
the NLL term; later steps test the update). TRL's "sft" term is a token mean over a
micro-batch's chosen tokens, ours a mean of per-pair token means: equal here because
every chosen action has the same length (`--action`); rejected actions and contexts vary.

Where the time goes (torch profiler, tiny model, CPU): both spend most of it in the same
matmuls and attention; TRL computes its log-probs with a fused LM head whose Triton kernel
(CUDA/XPU) scores only completion positions, but on CPU falls back to torch tiles over every
position, recomputed in backward (the largest share of its CPU time under the profiler),
and its SFTTrainer also computes entropy and top-1 accuracy. Ours builds fp32 logits over
the whole vocabulary at every position (sweet.core.logprobs.token_logprobs): cheap at a 4k
vocabulary, not at 128k, so on a GPU TRL's head should win until our log-probs are computed
at the action positions only (issue 25, part 3). Ours was slower in one place, fixed: its
AdamW ran the per-tensor loop (now fused, as transformers' default).

The last line is the headline, e.g. `ours / TRL tokens/s: DPO 1.3x, SFT 1.1x`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("ours:dpo", "trl:dpo", "ours:sft", "trl:sft")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="model spec: tiny, hf:<path or hub id>, or a path")
    p.add_argument("--device", default="", help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on a bf16 GPU, else fp32), float32, bfloat16")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (r 16) on both sides")
    p.add_argument("--gradient_checkpointing", action="store_true", help="on both sides")
    p.add_argument("--context", type=int, default=384, help="longest context; contexts are uniform in [context/2, context]")
    p.add_argument("--action", type=int, default=64, help="chosen and SFT action tokens at most (chosen: exactly)")
    p.add_argument("--batch_size", type=int, default=8, help="pairs (DPO) or examples (SFT) per optimiser step")
    p.add_argument("--micro_batch_size", type=int, default=2, help="pairs or examples per forward pass")
    p.add_argument("--warmup_steps", type=int, default=1, help="optimiser steps run before the clock starts")
    p.add_argument("--steps", type=int, default=4, help="optimiser steps timed")
    p.add_argument("--check_steps", type=int, default=3, help="steps whose losses are compared")
    p.add_argument("--beta", type=float, default=0.1, help="DPO β")
    p.add_argument("--nll_coef", type=float, default=0.01, help="α, the NLL weight (TRL: loss_weights [1, α])")
    p.add_argument("--learning_rate", type=float, default=1e-4, help="peak rate (large enough that steps 2+ move)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    p.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                   help="auto: wall time on CUDA (synchronised), the process's CPU time on CPU (a shared machine's "
                        "neighbours do not count; with --threads 1 it is the wall time of an idle machine)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of all runs, interleaved; the median tokens/s is shown")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma list of {', '.join(RUNS)}")
    p.add_argument("--json", default="", help="also write every run's figures to this file")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one run, in this process (the driver's child)
    return p


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class Shapes:
    """What every run derives its data and limits from."""

    n_items: int
    context: int
    action: int
    seed: int

    @property
    def max_length(self) -> int:
        return self.context + self.action + 1  # nothing is truncated on either side


def bench_data(tokenizer, shapes: Shapes):
    """DPO pairs (one context, a chosen action of exactly `action` tokens, a rejected one
    of 8..action) and SFT segments (context, 8..action tokens), random non-special ids."""
    import random

    from sweet.core.records import Pair
    from sweet.core.tokens import Segment

    rng = random.Random(shapes.seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    ids = lambda n: tuple(rng.choice(vocab) for _ in range(n))  # noqa: E731
    ctx_len = lambda: rng.randint(max(1, shapes.context // 2), shapes.context)  # noqa: E731
    low = min(8, shapes.action)
    pairs = []
    for i in range(shapes.n_items):
        context = ids(ctx_len())
        pairs.append(Pair((Segment(context, ids(shapes.action)),),
                          (Segment(context, ids(rng.randint(low, shapes.action))),), f"task-{i}"))
    examples = [Segment(ids(ctx_len()), ids(rng.randint(low, shapes.action))) for _ in range(shapes.n_items)]
    return pairs, examples


def step_items(n_items: int, batch: int, seed: int) -> list[list[int]]:
    """Item indices of each optimiser step of epoch 0, in our trainer's order (sweet.core.trainer.epoch_order)."""
    from sweet.core.trainer import epoch_order

    order = epoch_order(n_items, 0, seed)
    return [order[k : k + batch] for k in range(0, n_items, batch)]


def item_tokens(algo: str, item) -> int:
    """Non-pad tokens a step trains on for one item (a pair: both sequences)."""
    if algo == "dpo":
        return sum(len(s.context) + len(s.action) for side in (item.chosen, item.rejected) for s in side)
    return len(item.context) + len(item.action)


# ---------------------------------------------------------------- memory


class Memory:
    """Peak memory of one run: CUDA allocator peak, or resident high-water mark above a baseline."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def start(self) -> None:
        import gc

        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            return
        try:  # Linux: "5" resets the high-water mark to the current resident size
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        self.base = _status_kib("VmRSS")

    def peak(self) -> dict:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return {"peak": round(torch.cuda.max_memory_allocated() / 2**30, 2), "unit": "GiB"}
        hwm = _status_kib("VmHWM")
        return {"peak": None if hwm is None or self.base is None else round((hwm - self.base) / 1024, 1), "unit": "MiB"}


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- one run (a worker process)


def _configs(args, out: str):
    from sweet.algorithms.policy_trainer import PolicyTrainConfig
    from sweet.core.config import ModelConfig

    shapes = Shapes(args.batch_size * (args.warmup_steps + args.steps), args.context, args.action, args.seed)
    model_cfg = ModelConfig(model=args.model, lora=args.lora, gradient_checkpointing=args.gradient_checkpointing,
                            dtype=args.dtype, max_length=shapes.max_length, keep_head=0)
    train = PolicyTrainConfig(output_dir=out, learning_rate=args.learning_rate, batch_size=args.batch_size,
                              micro_batch_size=args.micro_batch_size, seed=args.seed, report_to="none",
                              resume=False, save_steps=0)
    return shapes, model_cfg, train


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_clock(args, device: str):
    """The run's clock: seconds now (wall after a CUDA sync, or this process's CPU time)."""
    kind = args.clock if args.clock != "auto" else ("wall" if device.startswith("cuda") else "cpu")

    def clock() -> float:
        _sync(device)
        return time.perf_counter() if kind == "wall" else time.process_time()

    clock.kind = kind
    return clock


def run_ours(args, algo: str, device: str, out: str, clock) -> dict:
    """Our trainer: the pieces `train_dpo` / `train_sft` wire, with the clock around each step."""
    from sweet.algorithms.policy_trainer import _trainer, dpo_loss_fn, reference_logps, sft_loss_fn
    from sweet.core.models import load_tokenizer

    shapes, model_cfg, train = _configs(args, out)
    tokenizer = load_tokenizer(model_cfg.model)
    pairs, examples = bench_data(tokenizer, shapes)
    items = pairs if algo == "dpo" else examples
    memory = Memory(device)
    memory.start()
    trainer = _trainer(model_cfg, train, tokenizer, len(items), None)
    pad = int(tokenizer.pad_token_id)
    ref_s = None
    if algo == "dpo":
        start = clock()
        ref = reference_logps(trainer, pairs, Path(out) / "ref_logprobs.pt")
        ref_s = clock() - start
        loss_fn, count_fn, key = dpo_loss_fn(pairs, ref, model_cfg, pad, args.beta, args.nll_coef), None, "loss/total"
    else:
        loss_fn, count_fn, key = sft_loss_fn(examples, model_cfg, pad), (lambda i: len(examples[i].action)), "loss/nll"
    losses, ends = [], []
    for idx in step_items(len(items), args.batch_size, args.seed):
        metrics = trainer.optimizer_step(idx, loss_fn, count_fn)
        trainer.log(metrics)
        ends.append(clock())
        losses.append(metrics[key])
    return _result(args, algo, items, losses, ends, ref_s, memory)


def run_trl(args, algo: str, device: str, out: str, clock) -> dict:
    """TRL's DPOTrainer / SFTTrainer on the same ids, order, batches and hyper-parameters."""
    import trl.trainer.dpo_trainer as trl_dpo
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    from sweet.core.models import load_model, load_tokenizer, set_seed

    shapes, model_cfg, train = _configs(args, out)
    tokenizer = load_tokenizer(model_cfg.model)
    pairs, examples = bench_data(tokenizer, shapes)
    items = pairs if algo == "dpo" else examples
    order = [i for step in step_items(len(items), args.batch_size, args.seed) for i in step]
    if algo == "dpo":
        rows = [{"prompt_ids": list(pairs[i].chosen[0].context), "chosen_ids": list(pairs[i].chosen[0].action),
                 "rejected_ids": list(pairs[i].rejected[0].action)} for i in order]
    else:
        rows = [{"input_ids": list(examples[i].context + examples[i].action),
                 "completion_mask": [0] * len(examples[i].context) + [1] * len(examples[i].action)} for i in order]
    losses: list[float] = []
    ends: list[float] = []
    micro_losses: list[float] = []
    seen_tokens: list[int] = []
    accum = -(-args.batch_size // args.micro_batch_size)

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(clock())
            step = micro_losses[-accum:]
            # DPO: each micro-batch's loss is its pairs' mean; SFT: its share of the step's token mean
            losses.append(sum(step) / len(step) if algo == "dpo" else sum(step))

    def recording(base):
        class Recording(base):
            ref_s = None

            def _prepare_dataset(self, dataset, *a, **k):
                if base is DPOTrainer:  # already token ids: nothing to re-tokenise
                    return dataset
                return super()._prepare_dataset(dataset, *a, **k)  # SFT: sees input_ids, only builds labels

            def _get_train_sampler(self, *_, **__):  # our epoch-0 order, already applied to the rows
                return SequentialSampler(self.train_dataset)

            def _precompute_ref_logps(self, *a, **k):
                start = clock()
                result = super()._precompute_ref_logps(*a, **k)
                type(self).ref_s = clock() - start
                return result

            def compute_loss(self, model, inputs, *a, **k):
                loss = super().compute_loss(model, inputs, *a, **k)
                if model.training:
                    micro_losses.append(float((loss[0] if isinstance(loss, tuple) else loss).detach()))
                    seen_tokens.append(int(inputs["attention_mask"].sum()))
                return loss

        return Recording

    common = dict(output_dir=out, learning_rate=args.learning_rate, per_device_train_batch_size=args.micro_batch_size,
                  gradient_accumulation_steps=accum, max_steps=len(order) // args.batch_size,
                  lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                  gradient_checkpointing=args.gradient_checkpointing, bf16=False, fp16=False,
                  use_cpu=not device.startswith("cuda"), seed=args.seed, data_seed=args.seed, logging_steps=1,
                  report_to=[], save_strategy="no", max_length=shapes.max_length, dataloader_num_workers=0)
    # TRL keys its reference cache by a sha256 of every weight (in fp32, on the CPU: about a minute
    # for an 8B model, before training, untimed); in this fresh process a key of the model's name
    # and size does the same job (the cache lives in a temporary folder of the process)
    if hasattr(trl_dpo, "hash_module"):
        trl_dpo.hash_module = lambda m: f"{model_cfg.model}:{sum(p.numel() for p in m.parameters())}"
    set_seed(args.seed)  # LoRA adapters initialised as on our side
    memory = Memory(device)
    memory.start()
    model = load_model(model_cfg)
    if algo == "dpo":
        config = DPOConfig(**common, beta=args.beta, loss_type=["sigmoid", "sft"], loss_weights=[1.0, args.nll_coef],
                           precompute_ref_log_probs=True, precompute_ref_batch_size=args.micro_batch_size)
        cls = recording(DPOTrainer)
    else:
        config = SFTConfig(**common, completion_only_loss=True, packing=False, padding_free=False)
        cls = recording(SFTTrainer)
    trainer = cls(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                  callbacks=[Clock()])
    trainer.train()
    want = [sum(item_tokens(algo, items[i]) for i in step) for step in step_items(len(items), args.batch_size, args.seed)]
    got = [sum(seen_tokens[k : k + accum]) for k in range(0, len(seen_tokens), accum)]
    if got != want:
        raise RuntimeError(f"TRL trained on other tokens than ours: {got} per step vs {want}")
    return _result(args, algo, items, losses, ends, cls.ref_s, memory)


def _result(args, algo: str, items, losses, ends, ref_s, memory: Memory) -> dict:
    steps = step_items(len(items), args.batch_size, args.seed)
    w = args.warmup_steps
    timed = steps[w:]
    tokens = sum(item_tokens(algo, items[i]) for step in timed for i in step)
    seconds = ends[-1] - ends[w - 1] if w else None
    ref_tokens = sum(item_tokens(algo, it) for it in items) if ref_s is not None else 0
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else None,
            "steps": len(timed), "ref_s": ref_s, "ref_tokens_per_s": ref_tokens / ref_s if ref_s else None,
            "losses": losses[: args.check_steps], **memory.peak()}


def worker(args) -> dict:
    import tempfile

    import torch

    from sweet.core.config import flush_denormals

    flush_denormals()
    torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    side, algo = args.worker.split(":")
    with tempfile.TemporaryDirectory(prefix="trainer-vs-trl-") as out:
        clock = make_clock(args, device)
        return {**(run_ours if side == "ours" else run_trl)(args, algo, device, out, clock), "clock": clock.kind}


# ---------------------------------------------------------------- driver


def spawn(run: str, argv: list[str], threads: int) -> dict:
    """One run in a fresh process; its last stdout line is its JSON result."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--worker", run], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        raise SystemExit(f"{run} failed (exit {res.returncode}):\n{res.stderr[-4000:]}")
    return json.loads(lines[-1])


def median_run(rounds: list[dict]) -> dict:
    """The round with the median tokens/s (its own figures, all from one process), and every round's tokens/s."""
    ranked = sorted(rounds, key=lambda r: r["tokens_per_s"] or 0.0)
    return {**ranked[(len(ranked) - 1) // 2], "rounds_tokens_per_s": [r["tokens_per_s"] for r in rounds]}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(results: dict[str, dict]) -> str:
    rows = ["| run | tokens/s | tokens | s | peak memory | ref s | ref tokens/s | losses (first steps) |",
            "|---|---|---|---|---|---|---|---|"]
    for run, r in results.items():
        losses = ", ".join(f"{x:.6f}" for x in r["losses"])
        rows.append(f"| {run} | {_fmt(r['tokens_per_s'], ',.0f')} | {r['tokens']:,} | {_fmt(r['seconds'], '.2f')} | "
                    f"{_fmt(r['peak'], ',')} {r['unit']} | {_fmt(r['ref_s'], '.2f')} | "
                    f"{_fmt(r['ref_tokens_per_s'], ',.0f')} | {losses} |")
    return "\n".join(rows)


def loss_check(results: dict[str, dict], algo: str) -> str | None:
    ours, trl = results.get(f"ours:{algo}"), results.get(f"trl:{algo}")
    if not ours or not trl:
        return None
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["losses"], trl["losses"])]
    listed = ", ".join(f"step {k + 1} {d:.1e}" for k, d in enumerate(diffs))
    return f"{algo.upper()} loss, ours vs TRL, relative difference: {listed}"


def headline(results: dict[str, dict]) -> str:
    parts = []
    for algo in ("dpo", "sft"):
        ours, trl = results.get(f"ours:{algo}"), results.get(f"trl:{algo}")
        if ours and trl and ours["tokens_per_s"] and trl["tokens_per_s"]:
            parts.append(f"{algo.upper()} {ours['tokens_per_s'] / trl['tokens_per_s']:.1f}x")
    return "ours / TRL tokens/s: " + ", ".join(parts)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.warmup_steps < 1 or args.steps < 1:
        parser.error("--warmup_steps and --steps must be >= 1 (the clock starts at the end of a warm-up step)")  # one line, exit 2
    if args.check_steps > args.warmup_steps + args.steps:
        parser.error("--check_steps must be <= --warmup_steps + --steps")  # one line, exit 2
    if args.batch_size % args.micro_batch_size:
        parser.error("--batch_size must be a multiple of --micro_batch_size (equal micro-batches on both sides)")  # one line, exit 2
    if args.worker:
        print(json.dumps(worker(args)))
        return {}
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if bad := [r for r in runs if r not in RUNS]:
        parser.error(f"--runs: unknown {bad}; choose from {', '.join(RUNS)}")  # one line, exit 2
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")  # one line, exit 2
    rounds: dict[str, list[dict]] = {run: [] for run in runs}
    for k in range(args.repeats):  # interleaved, so a slow spell of the machine hits every run alike
        for run in runs:
            rounds[run].append(spawn(run, argv, args.threads))
            print(f"[trainer_vs_trl] round {k + 1} {run}: {json.dumps(rounds[run][-1])}", file=sys.stderr, flush=True)
    results = {run: median_run(rs) for run, rs in rounds.items()}
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "rounds": rounds}, indent=2) + "\n")
    print(f"model {args.model}, {'LoRA' if args.lora else 'full'}, gradient checkpointing {args.gradient_checkpointing}, "
          f"batch {args.batch_size} / micro {args.micro_batch_size}, context <= {args.context}, action <= {args.action}, "
          f"{args.warmup_steps} warm-up + {args.steps} timed steps, {args.threads} thread(s), "
          f"{next(iter(results.values()))['clock']} clock, median of {args.repeats} round(s)")
    print(table(results))
    for algo in ("dpo", "sft"):
        if (line := loss_check(results, algo)) is not None:
            print(line)
    print(headline(results))
    return results


if __name__ == "__main__":
    main()
