"""The vision-language critic's screenshots at stage 2: rendered once per page by content
(colbench.scoring.render.RenderCache) vs rendered for every candidate (the naive way), same
pages, same pool, same run.

    python bench/critic_renders.py                       # 4 states x 8 candidates
    python bench/critic_renders.py --states 8 --candidates 16 --page_share 0.5

Each state's critic context holds its task's target page and a candidate's latest draft; a
`--page_share` of the candidates hold a page of their own (drawn from a few distinct
drafts, as sampled candidates repeat), the others show the state's earlier draft. Prints
renders and seconds for both ways and the ratio.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def page(colour: str, title: str) -> str:
    return (f"<html><body style='margin:0;background:{colour}'><h1 style='color:white;font-size:64px'>{title}</h1>"
            "<p style='color:white'>" + "Lorem ipsum dolor sit amet. " * 40 + "</p></body></html>")


def workload(states: int, candidates: int, share: float, seed: int = 0) -> list[list[str]]:
    """Per candidate of every state, the pages its critic context shows (target, draft)."""
    rng = random.Random(seed)
    colours = ["#c62828", "#1565c0", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f"]
    out = []
    for s in range(states):
        target, earlier = page(colours[s % len(colours)], f"Task {s % 2}"), page("#455a64", f"Draft {s}")
        drafts = [page(rng.choice(colours), f"Candidate {s}-{k}") for k in range(3)]
        for _ in range(candidates):
            out.append([target, rng.choice(drafts) if rng.random() < share else earlier])
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--states", type=int, default=4)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--page_share", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)

    from colbench.scoring.render import RenderCache, RenderPool

    contexts = workload(args.states, args.candidates, args.page_share)
    with RenderPool(workers=args.workers) as pool:
        pool.render([page("#000", "warm-up")])  # the pool's start is not counted
        start = time.perf_counter()
        naive = [pool.render(pages) for pages in contexts]
        naive_s = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as folder:
            cache = RenderCache(Path(folder), pool=pool)
            start = time.perf_counter()
            cached = [cache.render(pages) for pages in contexts]
            cached_s = time.perf_counter() - start
    assert all(a.ok and b.ok for x, y in zip(naive, cached) for a, b in zip(x, y))
    n = sum(len(c) for c in contexts)
    print(f"{args.states} states x {args.candidates} candidates, {n} screenshots shown, page share {args.page_share}")
    print(f"  every candidate rendered: {n} renders, {naive_s:.2f} s")
    print(f"  RenderCache (by content): {cache.rendered} renders, {cached_s:.2f} s")
    print(f"  ratio: x{naive_s / max(cached_s, 1e-9):.1f} faster, x{n / max(cache.rendered, 1):.1f} fewer renders")


if __name__ == "__main__":
    main()
