"""Rendering the published frontend targets: the RenderPool (one chromium, reused
contexts) vs a fresh browser per page (the naive way), same pages, same run.

    python bench/real_render.py                   # the first 50 target pages
    python bench/real_render.py --limit 200 --workers 4
    python bench/real_render.py --tasks my_rows.jsonl

Pages are the `ground_truth` HTML of ../shared/data/colbench-test/frontend_test.jsonl (the
public copy of the published frontend rows, kept outside the repo: Tailwind 2.2.19 from
jsDelivr, picsum.photos images, served offline by the renderer) or of --tasks, in the same
format. Prints the rows used, pages/s both ways (the pool's one-time start apart, as in
bench/render.py, whose comparison this runs), the pages (rows) that failed either way, and
the speed-up last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.render import compare  # noqa: E402

PUBLISHED = ROOT.parent / "shared" / "data" / "colbench-test" / "frontend_test.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, default=PUBLISHED, help="frontend rows (JSONL with ground_truth)")
    ap.add_argument("--limit", type=int, default=50, help="first rows to render each way")
    ap.add_argument("--workers", type=int, default=2, help="pool contexts rendering at once")
    ap.add_argument("--timeout", type=float, default=20.0, help="per-page render timeout (s)")
    args = ap.parse_args()
    if not args.tasks.is_file():
        print(f"error: no frontend rows at {args.tasks} (the public copy belongs in ../shared/data/colbench-test/; "
              "or pass --tasks)", file=sys.stderr)
        return 1
    pages = []
    with args.tasks.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip() and len(pages) < args.limit:
                pages.append(json.loads(line)["ground_truth"])
    print(f"{len(pages)} rows of {args.tasks}")
    compare(pages, args.workers, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
