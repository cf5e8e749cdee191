"""Training on recorded ids vs re-tokenising generated text (the naive way).

    python bench/policy_tokens.py                        # tiny model, 64 prompts x 4 samples
    python bench/policy_tokens.py --model hf:Qwen/Qwen2.5-0.5B-Instruct --device cuda --max-new-tokens 128

Samples completions with the hf engine, then builds each training example two ways:
- recorded (sweet.core.tokens): context = the prompt ids the engine sampled from,
  action = the generated ids + eos;
- naive: apply the chat template to prompt + the completion text as an assistant
  message, tokenise, take the tokens after the prompt as the action.
Prints how often the naive action differs from what was sampled, the log-prob the
trainer gives each (the naive one trains on tokens the policy never produced), and the
time to build the examples both ways.
"""

from __future__ import annotations

import argparse
import random
import time


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="model spec (default: the tiny offline Llama)")
    p.add_argument("--prompts", type=int, default=64, help="prompts to sample from")
    p.add_argument("--samples", type=int, default=4, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per completion at most")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    return p


def naive_example(tok, prompt, text):
    """Re-template prompt + completion text and cut after the prompt (what drifts)."""
    from engines.templating import normalize_messages, prompt_ids

    ctx = prompt_ids(tok, prompt)
    full = tok.apply_chat_template(normalize_messages(prompt + [{"role": "assistant", "content": text}]), tokenize=False)
    ids = tok(full, add_special_tokens=False)["input_ids"]
    return ctx, ids[len(ctx):] if ids[: len(ctx)] == ctx else ids


def main(argv=None) -> None:
    import torch

    from engines import EngineOptions, SamplingParams, load_engine
    from sweet.core.logprobs import token_logprobs
    from sweet.core.tokens import action_ids, make_batch

    args = make_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = load_engine(args.model, EngineOptions(device=args.device, dtype="float32", batch_size=64))
    tok, model = engine.tokenizer, engine.model
    rng = random.Random(args.seed)
    words = "ask the human which numbers and return a list sorted by key value count".split()
    prompts = [[{"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(4, 30)))}]
               for _ in range(args.prompts)]
    results = engine.generate(prompts, SamplingParams(n=args.samples, max_new_tokens=args.max_new_tokens, seed=args.seed))
    pairs = [(p, s) for p, ss in zip(prompts, results) for s in ss]

    t0 = time.perf_counter()
    recorded = [(list(s.prompt_token_ids), list(action_ids(s.token_ids, tok.eos_token_id, s.finish_reason)))
                for _, s in pairs]
    t_rec = time.perf_counter() - t0
    t0 = time.perf_counter()
    naive = [naive_example(tok, p, s.text) for p, s in pairs]
    t_naive = time.perf_counter() - t0

    def body(ids):  # without the end-of-turn token(s) and any template whitespace after them
        ids = list(ids)
        while ids and (ids[-1] == tok.eos_token_id or not tok.decode(ids[-1:]).strip()):
            ids.pop()
        return ids

    differ = sum(body(r[1]) != body(n[1]) for r, n in zip(recorded, naive))

    def mean_logp(examples):
        with torch.no_grad():
            batch = make_batch(examples, tok.pad_token_id).to(engine.device)
            lp = token_logprobs(model, batch)
            return ((lp * batch.action_mask).sum(-1) / batch.action_mask.sum(-1)).mean().item()

    print(f"{len(pairs)} sampled completions, model {args.model}")
    print(f"naive actions whose tokens differ from the sampled ids (end-of-turn ignored): {differ}/{len(pairs)} "
          f"({100 * differ / len(pairs):.1f}%)")
    print(f"mean per-token log-prob of the action  recorded: {mean_logp(recorded):.4f}   naive: {mean_logp(naive):.4f}")
    print(f"build time  recorded: {t_rec * 1e3:.1f} ms   naive: {t_naive * 1e3:.1f} ms   "
          f"ratio naive/recorded: {t_naive / max(t_rec, 1e-9):.1f}x")
    engine.close()


if __name__ == "__main__":
    main()
