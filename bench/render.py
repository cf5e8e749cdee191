"""Rendering throughput: the RenderPool (one chromium, reused contexts) vs a fresh
browser per page (the naive way), same pages, same run.

    python bench/render.py                      # 12 pages from tasks/frontend (else synthetic)
    python bench/render.py --pages 40 --workers 4

Prints pages/s for both and the ratio. The pool's one-time start (chromium launch,
Tailwind index) is reported separately and not counted in its throughput; the naive
way pays a browser launch per page, which is the point.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_pages(n: int) -> list[str]:
    """Target pages of the bundled frontend tasks, padded with synthetic Tailwind pages."""
    pages: list[str] = []
    for split in ("test", "train"):
        path = ROOT / "tasks" / "frontend" / f"{split}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip() and len(pages) < n:
                    pages.append(json.loads(line)["ground_truth"])
    tw = '<link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">'
    i = 0
    while len(pages) < n:
        cards = "".join(f'<div class="p-6 bg-white rounded shadow"><img src="https://picsum.photos/seed/{i}-{k}/400/240">'
                        f'<h3 class="text-xl font-bold mt-4">Card {k}</h3><p class="text-gray-600">Text {i}</p></div>'
                        for k in range(6))
        pages.append(f'<html><head>{tw}</head><body class="bg-gray-100"><header class="bg-indigo-700 text-white p-8 '
                     f'text-3xl">Site {i}</header><main class="grid grid-cols-3 gap-6 p-8">{cards}</main></body></html>')
        i += 1
    return pages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=12, help="pages to render each way")
    ap.add_argument("--workers", type=int, default=2, help="pool contexts rendering at once")
    ap.add_argument("--timeout", type=float, default=20.0, help="per-page render timeout (s)")
    args = ap.parse_args()
    compare(load_pages(args.pages), args.workers, args.timeout)


def compare(pages: list[str], workers: int, timeout: float) -> tuple[list, list]:
    """Render `pages` with a pool of `workers` contexts, then with a fresh browser per page;
    print both rates, the pool's one-time start, the failing pages (1-based) and the speed-up
    (last line).
    Returns the (pooled, fresh) RenderResults."""
    from colbench.scoring.render import RenderPool
    from colbench.scoring.tailwind import tailwind_rules

    tailwind_rules()  # index once for both ways: neither pays it below

    t0 = time.perf_counter()
    pool = RenderPool(workers=workers, timeout_s=timeout)
    pool.render(pages[:1])  # start chromium and the contexts
    startup = time.perf_counter() - t0
    t0 = time.perf_counter()
    pooled = pool.render(pages)
    pool_s = time.perf_counter() - t0
    pool.close()

    t0 = time.perf_counter()
    fresh = []
    for html in pages:  # the naive way: launch, render, close per page
        with RenderPool(workers=1, timeout_s=timeout) as one:
            fresh.extend(one.render([html]))
    fresh_s = time.perf_counter() - t0

    same = sum(a.ok and b.ok and a.image.tobytes() == b.image.tobytes() for a, b in zip(pooled, fresh))
    failing = [f"{i + 1}: {(a.error if not a.ok else b.error)}" for i, (a, b) in enumerate(zip(pooled, fresh))
               if not (a.ok and b.ok)]
    n_pool, n_fresh = sum(not r.ok for r in pooled), sum(not r.ok for r in fresh)
    print(f"pages: {len(pages)}  (pool failures: {n_pool}, fresh failures: {n_fresh})"
          + (f"; failing pages (1-based): {'; '.join(failing)}" if failing else ""))
    print(f"pool ({workers} contexts): {len(pages) / pool_s:6.2f} pages/s  ({pool_s:.1f} s; "
          f"one-time start {startup:.1f} s)")
    print(f"fresh browser per page:  {len(pages) / fresh_s:6.2f} pages/s  ({fresh_s:.1f} s)")
    print(f"speed-up: {fresh_s / pool_s:.1f}x   identical screenshots both ways: {same}/{len(pages)}")
    return pooled, fresh

if __name__ == "__main__":
    main()
