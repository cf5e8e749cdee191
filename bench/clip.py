"""CLIP reward throughput: images embedded per second, batched vs one at a time, same run.

    python bench/clip.py                                   # tiny CLIP, 64 page images, scheme pad
    python bench/clip.py --scheme tiles --images 32 --height 4000
    python bench/clip.py --clip-model ViT-B-32 --clip-pretrained openai --device cuda --images 512

Both runs use the same scorer (model, scheme, device) and the same images: synthetic
page screenshots (1280 px wide, heights varied around --height) with header, cards and
footer blocks. "Batched" is one `embed` call (`--batch-size` images or tiles per forward
pass); "one at a time" calls `embed([image])` per image, the way a naive per-episode
scorer does. Preprocessing (resize, pad/tile, normalise) is inside both timings, as in
real scoring; with the tiny CLIP it dominates, so the speed-up grows with model size.
The embeddings of the two runs are compared to show batching changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clip-model", default="tiny", help='open_clip model name, or "tiny" (default)')
    p.add_argument("--clip-pretrained", default="openai", help="open_clip pretrained tag or checkpoint file")
    p.add_argument("--scheme", default="pad", choices=("pad", "tiles", "center_crop"), help="preprocessing scheme")
    p.add_argument("--images", type=int, default=64, help="number of page images")
    p.add_argument("--height", type=int, default=2000, help="typical page height in px (width is 1280)")
    p.add_argument("--batch-size", type=int, default=32, help="images (or tiles) per forward pass when batched")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    return p


def synthetic_pages(count: int, height: int, seed: int):
    """Page-like screenshots: white background, coloured header, card grid, footer."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    pages = []
    for _ in range(count):
        h = max(400, int(height * rng.uniform(0.5, 1.5)))
        img = Image.new("RGB", (1280, h), "white")
        draw = ImageDraw.Draw(img)
        colour = tuple(rng.randrange(256) for _ in range(3))
        draw.rectangle((0, 0, 1280, 80), fill=colour)
        for y in range(140, h - 200, 320):
            for x in range(80, 1200, 380):
                draw.rectangle((x, y, x + 340, y + 280), fill=tuple(rng.randrange(256) for _ in range(3)))
                draw.text((x + 20, y + 240), "Card title", fill="black")
        draw.rectangle((0, h - 120, 1280, h), fill=(30, 30, 30))
        pages.append(img)
    return pages


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    import torch

    from colbench.scoring.clip import ClipScorer

    torch.set_num_threads(args.threads)
    scorer = ClipScorer(args.clip_model, args.clip_pretrained, scheme=args.scheme, device=args.device,
                        batch_size=args.batch_size)
    pages = synthetic_pages(args.images, args.height, args.seed)
    scorer.embed(pages[:2])  # warm-up (allocations, cuDNN autotune)

    def timed(fn):
        if scorer.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if scorer.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    t_batched, e_batched = timed(lambda: scorer.embed(pages))
    t_single, e_single = timed(lambda: torch.cat([scorer.embed([p]) for p in pages]))

    print(f"CLIP {args.clip_model}/{args.clip_pretrained if args.clip_model != 'tiny' else 'random'}, "
          f"scheme {args.scheme}, {args.images} images 1280 x ~{args.height}, device {scorer.device}, "
          f"{args.threads} threads")
    print(f"{'run':<28}{'seconds':>10}{'images/s':>12}")
    print(f"{f'batched (batch {args.batch_size})':<28}{t_batched:>10.2f}{args.images / t_batched:>12.1f}")
    print(f"{'one at a time':<28}{t_single:>10.2f}{args.images / t_single:>12.1f}")
    print(f"speed-up batched / one-at-a-time: {t_single / t_batched:.2f}x "
          f"(max |embedding difference| {float((e_batched - e_single).abs().max()):.1e})")


if __name__ == "__main__":
    main()
