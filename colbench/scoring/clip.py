"""CLIP image similarity: the ColBench frontend reward.

    from colbench.scoring.clip import ClipScorer
    scorer = ClipScorer()                       # paper: OpenAI CLIP ViT-B/32, scheme="pad"
    scorer.similarity([agent_png], [target_png])   # -> [cosine]
    ClipScorer("tiny")                          # the project's random-weight tiny CLIP (tests)
    ClipScorer("ViT-L-14", "laion2b_s32b_b82k") # any open_clip model + pretrained tag
    ClipScorer("ViT-B-32-quickgelu", "/ckpt/clip.safetensors")  # a local checkpoint file

The reward of a frontend answer is the cosine similarity of the CLIP image embeddings
of its render and of the target's render (paper: OpenAI CLIP ViT-B/32).

Departure from the reference, on purpose: the reference resizes each screenshot's
*shorter* side to 224 px and centre-crops a 224 x 224 square, so on a page taller than
it is wide everything above and below the middle square is thrown away and two pages
that differ only in their header or footer score 1.0. Schemes (`scheme=`):

- "pad" (default): resize the whole page so its longer side is the model's input
  size (aspect ratio kept), paste it centred on a white square, normalise with the
  model's mean/std. Nothing is cut; long pages become narrow strips, so fine detail
  is lost but every section still counts.
- "tiles": cut the page top to bottom into squares as wide as the page (the last one
  aligned to the bottom edge, so no tile is mostly padding; a page shorter than its
  width is one padded tile), embed every tile at full input resolution, average the
  L2-normalised tile embeddings and re-normalise. More detail than "pad", more cost.
- "center_crop": the paper's preprocessing (shorter side resized, centre crop), for
  numbers comparable with the published ones.

For OpenAI weights the QuickGELU activation they were trained with is switched on
from the tag (open_clip's plain "ViT-B-32" config uses GELU); with a checkpoint file,
name a "-quickgelu" model yourself, as in the example above.

Weights are resolved without surprises offline: a pretrained tag is first looked up
in the local caches (Hugging Face hub cache, ~/.cache/clip); only when absent does
open_clip try to download it, and any failure becomes one ClipWeightsUnavailable
error saying what to pass instead. Set HF_HUB_OFFLINE=1 to fail fast on a machine
without network (otherwise the hub client retries for about a minute first).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from PIL import Image

log = logging.getLogger(__name__)

SCHEMES = ("pad", "tiles", "center_crop")
TINY = "tiny"  # model name for engines.tiny's random-weight CLIP
PAD_COLOR = (255, 255, 255)  # web pages are white by default: padding should look like page margin
_INTERPOLATION = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
}


class ClipWeightsUnavailable(RuntimeError):
    """The requested CLIP model or weights cannot be loaded (unknown, or not available offline)."""


def _weights_error(model: str, pretrained: str, cause: str) -> ClipWeightsUnavailable:
    return ClipWeightsUnavailable(
        f"CLIP weights for {model}/{pretrained} are not available: {cause}. "
        "Pass --clip-model tiny for tests, or a local checkpoint with --clip-pretrained PATH, "
        "or run once online to cache them"
    )


def cached_tag_weights(tag_cfg: dict[str, Any], hub_cache: str | None = None) -> str | None:
    """Path of already-downloaded weights for an open_clip pretrained tag, or None.
    Mirrors where open_clip's downloader puts them (Hugging Face hub cache, or
    ~/.cache/clip for URL downloads); never touches the network."""
    from huggingface_hub import try_to_load_from_cache

    hub = tag_cfg.get("hf_hub", "")
    if hub:
        repo_id, filename = os.path.split(hub)
        names = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        if filename.endswith(".bin"):
            names.insert(0, filename[: -len(".bin")] + ".safetensors")
        for name in names:
            hit = try_to_load_from_cache(repo_id, name, cache_dir=hub_cache)
            if isinstance(hit, str) and os.path.isfile(hit):
                return hit
    url = tag_cfg.get("url", "")
    if url:
        path = Path.home() / ".cache" / "clip" / os.path.basename(url)
        if path.is_file():
            return str(path)
    return None


def load_clip(model: str, pretrained: str, device: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Build an open_clip model in eval mode on `device`; returns (model, preprocess cfg).

    model="tiny" loads engines.tiny's CLIP; `pretrained` may be an open_clip tag or a
    checkpoint file. Raises ClipWeightsUnavailable with what to do instead on failure.
    """
    import open_clip

    kwargs: dict[str, Any] = {}
    if model == TINY:
        from engines.tiny import tiny_clip_path

        folder = tiny_clip_path()
        open_clip.add_model_config(folder / "tiny-clip.json")
        model, pretrained = "tiny-clip", str(folder / "open_clip_model.safetensors")
    elif pretrained and not os.path.isfile(pretrained) and "hf-hub:" not in model and "local-dir:" not in model:
        if model not in open_clip.list_models():
            raise _weights_error(model, pretrained, f"open_clip has no model {model!r} (see open_clip.list_models())")
        tag_cfg = open_clip.get_pretrained_cfg(model, pretrained)
        if not tag_cfg:
            known = ", ".join(open_clip.list_pretrained_tags_by_model(model)[:8])
            cause = f"{pretrained!r} is neither a pretrained tag of {model} ({known}, ...) nor a file"
            raise _weights_error(model, pretrained, cause)
        # OpenAI weights were trained with QuickGELU; open_clip's plain "ViT-B-32" config
        # uses GELU, which would silently change the embeddings.
        kwargs["force_quick_gelu"] = bool(tag_cfg.get("quick_gelu", False))
        cached = cached_tag_weights(tag_cfg)
        if cached is not None:  # load the file directly: no hub round-trip, same preprocessing
            pretrained = cached
            kwargs.update(image_mean=tag_cfg.get("mean"), image_std=tag_cfg.get("std"))
            kwargs.update(image_interpolation=tag_cfg.get("interpolation"))
        else:
            log.info("downloading CLIP weights %s/%s (set HF_HUB_OFFLINE=1 to fail fast offline)", model, pretrained)
    try:
        clip, _, _ = open_clip.create_model_and_transforms(
            model, pretrained=pretrained or None, device=device, **kwargs
        )
    except Exception as e:  # open_clip raises RuntimeError/FileNotFoundError/OSError/ValueError
        offline = "download" in str(e).lower()
        cause = "not in the local cache and the download failed (offline?)" if offline else "loading failed"
        raise _weights_error(model, pretrained, f"{cause}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    clip.eval()
    return clip, dict(open_clip.get_model_preprocess_cfg(clip))


class ClipScorer:
    """CLIP image embeddings and cosine similarities of page screenshots.

    model:      open_clip model name, or "tiny" for the project's tiny CLIP.
    pretrained: open_clip pretrained tag, or a local checkpoint file.
    scheme:     "pad" | "tiles" | "center_crop" (see the module docstring).
    device:     torch device; default cuda when available, else cpu.
    batch_size: images (or tiles) per forward pass.
    """

    def __init__(
        self,
        model: str = "ViT-B-32",
        pretrained: str = "openai",
        *,
        scheme: str = "pad",
        device: str | None = None,
        batch_size: int = 32,
    ):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_name, self.pretrained, self.scheme, self.batch_size = model, pretrained, scheme, batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model, cfg = load_clip(model, pretrained, str(self.device))
        size = cfg.get("size", 224)
        self.input_size = int(size if isinstance(size, int) else size[0])  # CLIP inputs are square
        self.mean = torch.tensor(cfg.get("mean", (0.48145466, 0.4578275, 0.40821073))).view(3, 1, 1)
        self.std = torch.tensor(cfg.get("std", (0.26862954, 0.26130258, 0.27577711))).view(3, 1, 1)
        self.embed_dim = int(getattr(self.model.visual, "output_dim", 0) or 0)
        self.interpolation = _INTERPOLATION.get(str(cfg.get("interpolation", "bicubic")), Image.Resampling.BICUBIC)

    # ---------------------------------------------------------------- preprocessing

    def _to_tensor(self, square: Image.Image) -> torch.Tensor:
        """[3, S, S] normalised like torchvision's ToTensor + Normalize with the model's mean/std."""
        x = torch.from_numpy(np.asarray(square, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255.0)
        return (x - self.mean) / self.std

    def _pad(self, img: Image.Image) -> torch.Tensor:
        """Whole page, longer side -> input size, centred on a white square."""
        s, (w, h) = self.input_size, img.size
        scale = s / max(w, h)
        new = (max(1, round(w * scale)), max(1, round(h * scale)))
        canvas = Image.new("RGB", (s, s), PAD_COLOR)
        canvas.paste(img.resize(new, self.interpolation), ((s - new[0]) // 2, (s - new[1]) // 2))
        return self._to_tensor(canvas)

    def _center_crop(self, img: Image.Image) -> torch.Tensor:
        """The paper's preprocessing: shorter side -> input size, then the centre square."""
        s, (w, h) = self.input_size, img.size
        # torchvision Resize(int) rounding (what open_clip's and the reference's pipelines use)
        new_w, new_h = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
        resized = img.resize((new_w, new_h), self.interpolation)
        left, top = int(round((new_w - s) / 2.0)), int(round((new_h - s) / 2.0))
        return self._to_tensor(resized.crop((left, top, left + s, top + s)))

    def _tiles(self, img: Image.Image) -> list[torch.Tensor]:
        """Page-wide squares top to bottom; the last one aligned to the bottom edge."""
        w, h = img.size
        if h <= w:
            return [self._pad(img)]
        tops = list(range(0, h - w + 1, w))
        if tops[-1] + w < h:
            tops.append(h - w)
        s = self.input_size
        return [self._to_tensor(img.crop((0, t, w, t + w)).resize((s, s), self.interpolation)) for t in tops]

    def preprocess(self, image: Image.Image) -> list[torch.Tensor]:
        """Model inputs for one image under the scorer's scheme: one [3, S, S] tensor,
        or several for "tiles"."""
        img = image.convert("RGB")
        if self.scheme == "tiles":
            return self._tiles(img)
        return [self._pad(img) if self.scheme == "pad" else self._center_crop(img)]

    # ---------------------------------------------------------------- embeddings

    def _forward(self, inputs: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
        """Embed a stream of preprocessed inputs batch_size at a time; yields [D] rows (normalised)."""
        batch: list[torch.Tensor] = []

        def run() -> torch.Tensor:
            x = torch.stack(batch).to(self.device, non_blocking=True)
            feats = self.model.encode_image(x).float()
            return torch.nn.functional.normalize(feats, dim=-1).cpu()

        for x in inputs:
            batch.append(x)
            if len(batch) == self.batch_size:
                yield from run()
                batch = []
        if batch:
            yield from run()

    @torch.inference_mode()
    def embed(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """[N, D] float32 CPU tensor of L2-normalised image embeddings, batched.

        Under "tiles" each row is the re-normalised mean of the page's tile embeddings.
        """
        if not images:
            return torch.empty(0, self.embed_dim)
        counts: list[int] = []

        def stream() -> Iterator[torch.Tensor]:
            for image in images:  # preprocess lazily: a batch of tiles never all sits in memory
                xs = self.preprocess(image)
                counts.append(len(xs))
                yield from xs

        rows = torch.stack(list(self._forward(stream())))
        if self.scheme != "tiles":
            return rows
        means = torch.stack([chunk.mean(0) for chunk in torch.split(rows, counts)])
        return torch.nn.functional.normalize(means, dim=-1)

    def similarity(self, images_a: Sequence[Image.Image], images_b: Sequence[Image.Image]) -> list[float]:
        """Cosine similarity of images_a[i] with images_b[i], for every i (in [-1, 1])."""
        if len(images_a) != len(images_b):
            raise ValueError(f"similarity needs pairs: got {len(images_a)} and {len(images_b)} images")
        if not images_a:
            return []
        emb = self.embed(list(images_a) + list(images_b))
        a, b = emb[: len(images_a)], emb[len(images_a) :]
        return (a * b).sum(-1).clamp(-1.0, 1.0).tolist()
