"""CLIP reward with the tiny random-weight CLIP (engines.tiny): nothing is downloaded.

Random weights still make CLIP a fixed, input-sensitive function, which is all these
properties need: normalisation, self-similarity, batching invariance, and that the
"pad"/"tiles" schemes see content that the paper's centre crop throws away.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from colbench.scoring.clip import SCHEMES, ClipScorer, ClipWeightsUnavailable, cached_tag_weights

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scorer():
    torch.set_num_threads(2)
    return ClipScorer("tiny", device="cpu", batch_size=4)


def _noise(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _pages() -> list[Image.Image]:
    """Screenshots of assorted shapes: wide, square, tall, very tall."""
    return [_noise(120, 80, 0), _noise(64, 64, 1), _noise(100, 300, 2), _noise(90, 900, 3), _noise(50, 70, 4)]


def _tall_pair() -> tuple[Image.Image, Image.Image]:
    """Two 100 x 1000 pages, identical in their top 650 rows, different below.

    Under the paper's centre crop (tiny CLIP input 64 px) the page is resized to
    64 x 640 and rows 288..352 are kept, i.e. original rows 450..550; the bicubic
    filter at this 10x downscale reads at most 20 rows further (430..570), all in the
    shared part. So the centre crop sees identical pixels, while the footers differ.
    """
    top = np.asarray(_noise(100, 650, 7))
    a = np.concatenate([top, np.full((350, 100, 3), 255, np.uint8)])  # white footer
    b = np.concatenate([top, np.asarray(_noise(100, 350, 8))])  # busy footer
    return Image.fromarray(a), Image.fromarray(b)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_embeddings_are_normalised_and_self_similarity_is_one(scorer, scheme):
    scorer.scheme = scheme
    pages = _pages()
    emb = scorer.embed(pages)
    assert emb.shape == (len(pages), scorer.embed_dim) and emb.dtype == torch.float32
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(len(pages)), atol=1e-5, rtol=0)
    sims = scorer.similarity(pages, [p.copy() for p in pages])
    assert sims == pytest.approx([1.0] * len(pages), abs=1e-5)
    # and distinct pages are not identical to the model
    assert scorer.similarity(pages[:1], pages[1:2])[0] < 1 - 1e-4


@pytest.mark.parametrize("scheme", SCHEMES)
def test_batched_equals_one_at_a_time(scorer, scheme):
    scorer.scheme = scheme
    pages = _pages()
    batched = scorer.embed(pages)  # batch_size 4: two forward passes (tiles: more)
    single = torch.cat([scorer.embed([p]) for p in pages])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=0)


def test_long_page_content_is_kept_by_pad_and_tiles_but_not_center_crop(scorer):
    a, b = _tall_pair()
    scorer.scheme = "center_crop"
    # The centre crop literally sees the same pixels: the footers are invisible to it.
    torch.testing.assert_close(scorer.preprocess(a)[0], scorer.preprocess(b)[0], atol=0, rtol=0)
    assert scorer.similarity([a], [b])[0] == pytest.approx(1.0, abs=1e-6)
    # Random weights move little (~2e-4 here), but far beyond float noise (~1e-7),
    # which is what separates "sees the footer" from "cannot see it".
    for scheme in ("pad", "tiles"):
        scorer.scheme = scheme
        assert scorer.similarity([a], [b])[0] < 1 - 2e-5, scheme


def test_pad_keeps_whole_page_on_white(scorer):
    scorer.scheme = "pad"
    s = scorer.input_size
    black_tall = Image.new("RGB", (100, 400), (0, 0, 0))  # -> 16 x 64 strip, centred
    [x] = scorer.preprocess(black_tall)
    assert x.shape == (3, s, s)
    white = (1 - scorer.mean) / scorer.std
    black = (0 - scorer.mean) / scorer.std
    torch.testing.assert_close(x[:, :, :20], white.expand(3, s, 20))  # left margin: padding
    torch.testing.assert_close(x[:, :, -20:], white.expand(3, s, 20))  # right margin
    torch.testing.assert_close(x[:, :, 26:38], black.expand(3, s, 12))  # the page, full height


def test_tiles_cover_the_page_with_last_tile_bottom_aligned(scorer):
    scorer.scheme = "tiles"
    assert len(scorer.preprocess(_noise(100, 1000, 0))) == 10
    assert len(scorer.preprocess(_noise(100, 1050, 0))) == 11
    assert len(scorer.preprocess(_noise(200, 100, 0))) == 1  # wider than tall: one padded tile
    # The last tile of a 1050 px page is rows 950..1050, i.e. the page's bottom edge.
    page = _noise(100, 1050, 5)
    last = scorer.preprocess(page)[-1]
    bottom = scorer.preprocess(page.crop((0, 950, 100, 1050)))[0]
    torch.testing.assert_close(last, bottom, atol=0, rtol=0)


def test_similarity_validates_pairs(scorer):
    with pytest.raises(ValueError, match="pairs"):
        scorer.similarity(_pages()[:2], _pages()[:1])
    assert scorer.similarity([], []) == []
    assert scorer.embed([]).shape == (0, scorer.embed_dim)
    with pytest.raises(ValueError, match="scheme"):
        ClipScorer("tiny", scheme="crop")


@pytest.mark.gpu
def test_cuda_embeddings_match_cpu(scorer):
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    gpu = ClipScorer("tiny", device="cuda", batch_size=4)
    for scheme in SCHEMES:
        scorer.scheme = gpu.scheme = scheme
        torch.testing.assert_close(gpu.embed(_pages()), scorer.embed(_pages()), atol=1e-4, rtol=0)


def test_unknown_model_or_tag_gives_one_clear_error():
    with pytest.raises(ClipWeightsUnavailable, match=r"bogus-tag.*--clip-model tiny.*--clip-pretrained PATH"):
        ClipScorer("ViT-B-32", "bogus-tag", device="cpu")
    with pytest.raises(ClipWeightsUnavailable, match=r"no model 'NoSuchNet'"):
        ClipScorer("NoSuchNet", "openai", device="cpu")


def test_offline_without_cached_weights_fails_fast_with_clear_error(tmp_path):
    """The default (OpenAI ViT-B/32) with HF_HUB_OFFLINE=1 and an empty cache: one
    ClipWeightsUnavailable naming the options, no network attempt, no hang."""
    code = (
        "from colbench.scoring.clip import ClipScorer, ClipWeightsUnavailable\n"
        "try:\n    ClipScorer(device='cpu')\n"
        "except ClipWeightsUnavailable as e:\n    print('ERR', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HOME": str(tmp_path)}
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERR CLIP weights for ViT-B-32/openai are not available" in out.stdout
    assert "--clip-model tiny" in out.stdout and "--clip-pretrained PATH" in out.stdout


def test_cached_hub_weights_are_found_without_network(tmp_path):
    """A tag's weights already in the Hugging Face cache are used directly."""
    repo = tmp_path / "models--timm--vit_base_patch32_clip_224.openai"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snap / "open_clip_model.safetensors").write_bytes(b"x")
    cfg = {"hf_hub": "timm/vit_base_patch32_clip_224.openai/", "quick_gelu": True}
    assert cached_tag_weights(cfg, hub_cache=str(tmp_path)) == str(snap / "open_clip_model.safetensors")
    assert cached_tag_weights({"hf_hub": "timm/other/"}, hub_cache=str(tmp_path)) is None


def test_bundled_pages_render_and_score(scorer):
    """End to end: two bundled targets rendered offline; a page matches itself and
    scores lower against a different page."""
    from colbench.scoring import render
    if not Path(os.environ.get("SWEET_CHROMIUM", render.DEFAULT_CHROMIUM)).exists():
        pytest.skip("chromium is not installed")
    rows = [json.loads(line) for line in (ROOT / "tasks" / "frontend" / "test.jsonl").read_text().splitlines()[:2]]
    with render.RenderPool(workers=1, viewport_width=640, max_height=3000, timeout_s=60) as pool:
        shots = pool.render([r["ground_truth"] for r in rows] + [rows[0]["ground_truth"]])
    assert all(s.image is not None for s in shots), [s.error for s in shots]
    scorer.scheme = "pad"
    same, different = scorer.similarity([shots[0].image, shots[0].image], [shots[2].image, shots[1].image])
    assert same == pytest.approx(1.0, abs=1e-5)
    assert different < same - 1e-3
