"""One forward pass per trajectory against one row per turn, and one prefill per state
against one per candidate, in the same run.

    python bench/one_pass.py                      # SmolLM2-135M-Instruct in bfloat16, 2 pairs
    python bench/one_pass.py --model tiny --dtype float32 --pairs 4

Builds 3-turn dialogues the way rollouts build them (token in, token out:
colbench.agents.turn_prompt_ids) with turns long enough for ~1,500-2,000 tokens per
trajectory, then times one critic step (the Bradley-Terry loss over Σ_t A(o_t, a_t), A the
mean of log π_θ − log π_ref over a_t's tokens: sweet.critic.model's pure functions, π_ref's
sums given, as training caches them) and one multi-turn DPO step (chosen and rejected
trajectories, forward and backward through sweet.algorithms.policy_trainer.sequence_logps),
each two ways:

- per-turn rows: each turn its own row (its whole context, then its action), as the
  trainers did before trajectories were packed (make_batch(packed=False));
- one pass: each trajectory one row, every turn's action read from it (make_batch(packed=True)).

It prints the tokens each way runs through the model, the seconds per pair and the ratio,
and checks that both give the same loss. Then stage 2's sampler: n candidates from one state,
with the hf engine's shared prefill (one prefill per distinct prompt) and without it (the
naive way: the prompt prefilled once per candidate row).
"""

from __future__ import annotations

import argparse
import random
import time


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="model spec (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="bfloat16", help="training and sampling precision")
    p.add_argument("--pairs", type=int, default=2, help="trajectory pairs to time (one DPO step each)")
    p.add_argument("--words", type=int, default=330,
                   help="words per message (sets the trajectory's length: 330 gives SmolLM2 ~1,850 tokens)")
    p.add_argument("--candidates", type=int, default=16, help="stage 2's candidates per state")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    return p


def trajectory(tok, rng: random.Random, words: int):
    """Segments of a 3-turn dialogue whose turns continue one another (token in, token out)."""
    from colbench.agents import turn_prompt_ids
    from colbench.types import Turn
    from sweet.core.tokens import Segment, action_ids, eos_id

    vocab = "ask the human which numbers and return a list sorted by key value count then write code".split()

    def text(n):
        return " ".join(rng.choice(vocab) for _ in range(n))

    chat = [{"role": "system", "content": text(words)}, {"role": "user", "content": text(words)}]
    previous, segments = None, []
    for _ in range(3):
        ids = turn_prompt_ids(tok, chat, previous)
        generated = tok(text(words // 2), add_special_tokens=False)["input_ids"]
        segments.append(Segment(tuple(ids), action_ids(generated, eos_id(tok), "stop")))
        previous = Turn("agent", tok.decode(generated), prompt=chat, prompt_token_ids=ids, token_ids=generated,
                        finish_reason="stop")
        chat = chat + [{"role": "assistant", "content": previous.content}, {"role": "user", "content": text(words)}]
    return segments


def dpo_step(model, model_cfg, groups, packed: bool):
    """One MT-DPO loss + backward over [chosen..., rejected...] groups; (loss, tokens run)."""
    from sweet.algorithms.losses import dpo_loss
    from sweet.algorithms.policy_trainer import sequence_logps
    from sweet.core.tokens import make_batch

    flat = [(s.context, s.action) for g in groups for s in g]
    tokens = int(make_batch(flat, 0, packed=packed).attention_mask.sum())
    logps, counts = sequence_logps(model, model_cfg, 0, groups, packed=packed)
    n = len(groups) // 2
    loss, _ = dpo_loss(logps[:n], logps[n:], logps[:n].detach(), logps[n:].detach(), counts[:n], beta=0.1,
                       nll_coef=0.01)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item(), tokens


def critic_step(model, groups, packed: bool):
    """One critic Bradley-Terry loss + backward over a (chosen, rejected) pair of segment
    lists; (loss, tokens run)."""
    import torch

    from sweet.core.tokens import make_batch
    from sweet.critic.model import action_logprob_sums, bradley_terry_loss, per_turn_advantage, trajectory_scores

    flat = [(s.context, s.action) for g in groups for s in g]
    batch = make_batch(flat, 0, packed=packed)
    sums = action_logprob_sums(model, batch)
    n = torch.tensor([len(a) for _, a in flat])
    advantages = per_turn_advantage(sums, torch.zeros_like(sums), n, beta=0.1)  # π_ref's sums as given
    owner = torch.tensor([k for k, g in enumerate(groups) for _ in g])
    scores = trajectory_scores(advantages, owner, len(groups))
    loss, _ = bradley_terry_loss(scores[:1], scores[1:])
    loss.mean().backward()
    model.zero_grad(set_to_none=True)
    return loss.mean().item(), int(batch.attention_mask.sum())


def timed(step, model, model_cfg, pairs, label: str) -> None:
    """`step` over every pair, per-turn rows then one pass: tokens, seconds per pair, ratio."""
    seconds, tokens, losses = {}, {}, {}
    for packed in (False, True):  # warm-up, both ways
        step(model, model_cfg, list(pairs[0]), packed)
    for packed in (False, True):
        t0 = time.perf_counter()
        out = [step(model, model_cfg, [c, r], packed) for c, r in pairs]
        seconds[packed] = (time.perf_counter() - t0) / len(pairs)
        tokens[packed] = sum(t for _, t in out) / len(pairs)
        losses[packed] = [round(l, 4) for l, _ in out]
    print(f"{label}, per-turn rows: {tokens[False]:.0f} tokens, {seconds[False]:.2f} s per pair")
    print(f"{label}, one pass:      {tokens[True]:.0f} tokens, {seconds[True]:.2f} s per pair")
    print(f"{label} ratio: {tokens[False] / tokens[True]:.2f}x fewer tokens, {seconds[False] / seconds[True]:.2f}x "
          f"faster; losses {'equal' if losses[True] == losses[False] else 'DIFFER'} ({losses[True]})")


def main(argv=None) -> None:
    import torch

    from engines import EngineOptions, SamplingParams, load_engine
    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model

    args = make_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    model_cfg = ModelConfig(model=args.model, dtype=args.dtype, max_length=None)
    model = load_model(model_cfg, trainable=True)
    engine = load_engine(args.model, EngineOptions(device="cpu", dtype=args.dtype, batch_size=args.candidates))
    tok = engine.tokenizer
    rng = random.Random(args.seed)
    pairs = [(trajectory(tok, rng, args.words), trajectory(tok, rng, args.words)) for _ in range(args.pairs)]
    lengths = [len(s[-1].context) + len(s[-1].action) for p in pairs for s in p]
    print(f"{args.model} ({args.dtype}, {args.threads} threads): {len(pairs)} pairs of 3-turn trajectories, "
          f"{min(lengths)}-{max(lengths)} tokens each")
    timed(lambda m, _cfg, g, packed: critic_step(m, g, packed), model, model_cfg, pairs, "critic step")
    timed(dpo_step, model, model_cfg, pairs, "MT-DPO step")

    state = list(pairs[0][0][-1].context)  # stage 2: the last turn's state, n candidates
    params = SamplingParams(n=args.candidates, temperature=1.0, max_new_tokens=8, seed=args.seed)
    shared_fn = engine._shared_prefill
    timing = {}
    for name, fn in (("one prefill", shared_fn), ("a prefill per candidate", lambda *a: {})):
        engine._shared_prefill = fn
        t0 = time.perf_counter()
        out = engine.generate_from_ids([state], params)
        timing[name] = (time.perf_counter() - t0, [s.token_ids for s in out[0]])
    engine._shared_prefill = shared_fn
    same = timing["one prefill"][1] == timing["a prefill per candidate"][1]
    print(f"stage 2, {args.candidates} candidates of a {len(state)}-token state: one prefill "
          f"{timing['one prefill'][0]:.2f} s, a prefill per candidate {timing['a prefill per candidate'][0]:.2f} s; "
          f"ratio {timing['a prefill per candidate'][0] / timing['one prefill'][0]:.2f}x; "
          f"same candidates: {same}")
    engine.close()


if __name__ == "__main__":
    main()
