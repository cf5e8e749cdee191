"""Placeholder images: what a page's image requests get instead of the network.

WebSight pages point their images at placeholder photo services; the renderer answers
every image request with a PNG generated here, at the size the URL asks for and
deterministically from the URL (a gradient with a few blocks, so CLIP can tell
images apart), so renders are offline and repeatable.
"""

from __future__ import annotations

import hashlib
import io
import re
from functools import lru_cache
from urllib.parse import parse_qs, urlsplit

from PIL import Image

PLACEHOLDER_HOSTS = (
    "picsum.photos",
    "source.unsplash.com",
    "images.unsplash.com",
    "placehold.co",
    "placehold.it",
    "placeholder.com",
    "via.placeholder.com",
    "dummyimage.com",
    "fakeimg.pl",
    "loremflickr.com",
    "placekitten.com",
)
DEFAULT_IMAGE_SIZE = (400, 300)
MAX_IMAGE_SIDE = 4000


def image_size_from_url(url: str) -> tuple[int, int]:
    """The (width, height) a placeholder-image URL asks for; DEFAULT_IMAGE_SIZE if none.

    Understands `.../400x300...` (unsplash, placehold.co, dummyimage, via.placeholder),
    picsum's `/W/H` and `/W` paths, and `?w=..&h=..` / `?width=..&height=..` queries.
    """
    parts = urlsplit(url)
    path = parts.path
    query = parse_qs(parts.query)
    w = h = None
    m = re.search(r"(?<![\d.])(\d{1,5})\s*[xX×]\s*(\d{1,5})(?!\d)", path)
    if m:
        w, h = int(m[1]), int(m[2])
    else:
        nums = [int(s) for s in path.split("/") if s.isdigit()]
        if "/id/" in path and nums:  # picsum.photos/id/237/200/300: the first number is the photo id
            nums = nums[1:]
        if len(nums) >= 2:
            w, h = nums[-2], nums[-1]
        elif len(nums) == 1:
            w = h = nums[0]
    qw = query.get("w") or query.get("width")
    qh = query.get("h") or query.get("height")
    if qw and qw[0].isdigit():
        w = int(qw[0])
        h = int(qh[0]) if qh and qh[0].isdigit() else h or w
    elif qh and qh[0].isdigit():
        h = int(qh[0])
        w = w or h
    if not w or not h:
        return DEFAULT_IMAGE_SIZE
    return min(max(w, 1), MAX_IMAGE_SIDE), min(max(h, 1), MAX_IMAGE_SIDE)


@lru_cache(maxsize=256)
def placeholder_png(url: str) -> bytes:
    """A PNG at the URL's requested size: a gradient with a few blocks, seeded by the URL."""
    import numpy as np

    w, h = image_size_from_url(url)
    seed = int.from_bytes(hashlib.sha256(url.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    c0, c1 = rng.integers(40, 216, size=(2, 3))
    t = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    row = (c0 * (1 - t) + c1 * t).astype(np.uint8)  # [1, W, 3]
    img = np.repeat(row, h, axis=0)  # [H, W, 3]
    for _ in range(3):  # blocks make images distinguishable to CLIP, not just tints
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(1, max(2, w // 2))), y0 + int(rng.integers(1, max(2, h // 2)))
        img[y0:y1, x0:x1] = rng.integers(0, 256, size=3)
    buf = io.BytesIO()
    Image.fromarray(img, "RGB").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
