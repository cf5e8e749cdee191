"""Stage-2 scoring: A(o_t, a, c) for N candidate actions of one state, batched
(`TrainedCritic.advantages(state, actions)`: the context once, its KV cache shared by
all candidates) vs the naive way (one context + action pass per candidate), and the
padded batch without prefix sharing. Prints the times, ratios and largest difference.

    python bench/critic_scoring.py                         # tiny model, 16 candidates
    python bench/critic_scoring.py --critic_dir runs/critic --candidates 16 --device cuda
"""

from __future__ import annotations

import argparse
import random
import time


def make_state_and_actions(tokenizer, turns: int, candidates: int, action_tokens: int, seed: int):
    from sweet.core.records import State

    rng = random.Random(seed)
    words = "the function returns a list of numbers sorted by value unless empty then none".split()
    prompt = [{"role": "system", "content": "Ask the human about f, then write I WANT TO ANSWER: and the code."},
              {"role": "user", "content": "I need a function that processes my numbers."}]
    for _ in range(turns):
        prompt.append({"role": "assistant", "content": " ".join(rng.choices(words, k=20)) + "?"})
        prompt.append({"role": "user", "content": " ".join(rng.choices(words, k=30)) + "."})
    state = State("bench", "bench/0", turns, tuple(prompt), None, "def f(xs):\n    return sorted(xs) or None\n")
    vocab = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.all_special_ids]
    actions = [[rng.choice(vocab) for _ in range(rng.randint(action_tokens // 2, action_tokens))] for _ in range(candidates)]
    return state, actions


def make_scorer(args):
    import torch

    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model, load_tokenizer
    from sweet.critic.model import TrainedCritic, CriticRecord

    if args.critic_dir:
        return TrainedCritic.load(args.critic_dir, device=args.device, batch_size=args.candidates)
    # stand-in critic: π_ref = the model, θ = the model with seeded noise (so A ≠ 0)
    tok = load_tokenizer(args.model)
    cfg = ModelConfig(model=args.model)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    record = CriticRecord(beta=1.0, length_normalize=True, header="Training-time information",
                          reference_model=args.model, eos_token_id=tok.eos_token_id, lora=False)
    theta = load_model(cfg, trainable=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in theta.parameters():
            param.add_(0.02 * param.float().std() * torch.randn(param.shape, generator=g).to(param.dtype))
    return TrainedCritic(record, theta.to(device), load_model(cfg, trainable=False).to(device), tok, device,
                        batch_size=args.candidates)


def timed(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--critic_dir", default="", help="a train_critic output_dir (default: the untrained tiny model)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default=None)
    p.add_argument("--candidates", type=int, default=16)
    p.add_argument("--turns", type=int, default=3, help="dialogue turns before the state")
    p.add_argument("--action_tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave)")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    scorer = make_scorer(args)
    state, actions = make_state_and_actions(scorer.tokenizer, args.turns, args.candidates, args.action_tokens, 0)
    scorer.advantages(state, actions[:2])  # warm-up
    t_batched, batched = timed(lambda: scorer.advantages(state, actions), args.repeats)
    t_single, single = timed(lambda: [scorer.advantages(state, [a])[0] for a in actions], args.repeats)
    from sweet.core.tokens import action_ids
    from sweet.critic.model import CriticTurn

    examples = [CriticTurn(state, action_ids(a, scorer.record.eos_token_id, None)) for a in actions]
    t_padded, padded = timed(lambda: scorer._padded_advantages(examples), args.repeats)
    diff = max(max(abs(a - b), abs(a - c)) for a, b, c in zip(batched, single, padded))
    n_ctx = len(scorer.tokenizer.apply_chat_template(list(state.prompt), tokenize=False))
    print(f"{args.candidates} candidates of one state ({n_ctx} context chars), device {scorer.device}")
    print(f"  naive, one at a time      : {t_single * 1000:9.1f} ms")
    print(f"  padded batch              : {t_padded * 1000:9.1f} ms   ({t_single / t_padded:.2f}x)")
    print(f"  batched, shared prefix    : {t_batched * 1000:9.1f} ms   ({t_single / t_batched:.2f}x vs naive)")
    print(f"  max |A difference| across the three: {diff:.2e}")


if __name__ == "__main__":
    main()
