"""The frontend's vision-language critic: what it sees and how its batches are built.

The published training fork (YifeiZhou02/collab_openrlhf: `openrlhf/cli/train_dpo_qwen.py`,
`openrlhf/cli/train_rm_qwen.py`, `openrlhf/datasets/reward_dataset.py`) trains Qwen2-VL on
screenshots passed as `pixel_values` / `image_grid_thw`, resized by Qwen2-VL's image processor
to between 16x28x28 and 64x28x28 pixels (`openrlhf/utils/utils.py`). Our critic with a
vision-language `--model` (a config with a `vision_config`, e.g. Qwen2-VL, `tiny-vl`):

- c is the target page's screenshot: it takes the place of the target HTML in the
  critic_context template (`with_training_info`), as an image.
- At turn t it also sees the screenshot of the agent's latest draft: the last HTML among its
  messages up to and including a_t (`latest_draft`), appended to the last message of o_t
  (`DRAFT_NOTE`). Without a draft yet, or when it does not render, a note says so instead.
- The turn's text is as for the text critic: o_t's messages, chat-templated, and a_t.
- a_t is the turn's TEXT tokenised by the critic's own tokenizer (+ its end-of-turn id when
  the model ended the turn): a VLM critic's vocabulary is not the policy's. Stage 2 gets the
  candidates' text by decoding their ids with the policy's tokenizer.
- Pages are rendered offline by `colbench.scoring.render.RenderCache` (by content: a page is
  rendered once per cache folder) and resized by the processor's image processor to at most
  `max_pixels` (default the fork's 64x28x28; `--max_pixels`).
- Each image slot `<|vision_start|><|image_pad|><|vision_end|>` is expanded to the image's
  token count (grid t*h*w / merge_size^2), the rule of Qwen2-VL's processor; the model gets
  `pixel_values`, `image_grid_thw` and `mm_token_type_ids` (`VisionBatch.model_inputs`).
  Vision special tokens written by the agent or the human are defused (never read as images).
- Contexts are cut in the middle as for the text critic; a cut that would split or drop a
  screenshot is an error naming the turn (raise `--max_length`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from colbench.envs.frontend import extract_html, has_html
from sweet.core.records import State
from sweet.core.tokens import TokenBatch, action_ids, make_batch, template_ids, text_ids, with_training_info

if TYPE_CHECKING:
    import torch

    from colbench.scoring.render import RenderCache

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
IMAGE_SLOT = VISION_START + IMAGE_PAD + VISION_END
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END, "<|video_pad|>")
MIN_PIXELS, MAX_PIXELS = 16 * 28 * 28, 64 * 28 * 28  # the published critic's processor
DRAFT_NOTE = "[Screenshot of the agent's latest page draft]\n" + IMAGE_SLOT
NO_DRAFT_NOTE = "[The agent has not shown a page draft yet]"
BROKEN_DRAFT_NOTE = "[The agent's latest page draft did not render]"
BROKEN_TARGET_NOTE = "[The target page did not render]"


def defuse(text: str) -> str:
    """`text` with Qwen2-VL's vision special tokens broken up (`<|` -> `< |`), so that text
    written by the agent or the human never opens an image slot."""
    for token in VISION_TOKENS:
        text = text.replace(token, "< |" + token[2:])
    return text


def latest_draft(state: State, action_text: str) -> str | None:
    """The HTML of the agent's latest draft at this turn: a_t's when it holds a page, else
    the last earlier agent message's that does (`colbench.envs.frontend.has_html`); None
    when the agent has shown none."""
    for text in [action_text, *(str(m["content"]) for m in reversed(state.prompt) if m["role"] == "assistant")]:
        if has_html(text):
            return extract_html(text)
    return None


@dataclass
class VisionBatch(TokenBatch):
    """A TokenBatch whose contexts hold image tokens, with the images' inputs.

    pixel_values:   [patches, channels*temporal*patch*patch], every row's images in order
    image_grid_thw: [images, 3]
    image_token_id: the id the model fills with image features
    """

    pixel_values: Any = None
    image_grid_thw: Any = None
    image_token_id: int = -1

    def to(self, device) -> "VisionBatch":
        move = (lambda t: t.to(device) if t is not None else None)
        return VisionBatch(self.input_ids.to(device), self.attention_mask.to(device), self.action_mask.to(device),
                           self.spans, pixel_values=move(self.pixel_values), image_grid_thw=move(self.image_grid_thw),
                           image_token_id=self.image_token_id)

    def model_inputs(self) -> dict[str, Any]:
        """The keyword arguments a Qwen2-VL forward needs besides input_ids / attention_mask."""
        if self.image_grid_thw is None:
            return {}
        return {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw,
                "mm_token_type_ids": (self.input_ids == self.image_token_id).int()}


def model_inputs(batch: TokenBatch) -> dict[str, Any]:
    """A batch's image inputs ({} for a text batch)."""
    return batch.model_inputs() if isinstance(batch, VisionBatch) else {}


class ScreenshotView:
    """What a vision-language critic sees of a turn (module docstring): its context ids with
    image tokens, its action ids (the turn's text, the critic's tokenizer) and its images.

    processor:  the model's processor (tokenizer + Qwen2-VL image processor).
    renders:    a RenderCache: pages rendered once by content.
    max_pixels / min_pixels: the processor's resize bounds for every screenshot.
    """

    def __init__(self, processor, renders: "RenderCache", max_pixels: int = MAX_PIXELS, min_pixels: int = MIN_PIXELS):
        if not 0 < min_pixels <= max_pixels:
            raise ValueError(f"screenshot size: need 0 < min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
        self.processor, self.tokenizer, self.renders = processor, processor.tokenizer, renders
        self.max_pixels, self.min_pixels = max_pixels, min_pixels
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if self.image_token_id is None or self.image_token_id == self.tokenizer.unk_token_id:
            raise ValueError(f"tokenizer {self.tokenizer.name_or_path!r} has no {IMAGE_PAD} token: "
                             "not a Qwen2-VL processor")
        self.merge = int(getattr(processor.image_processor, "merge_size", 2))
        self._pixels: dict[str, tuple] = {}  # page hash -> (pixel_values, grid_thw)

    # ---- text

    def action_ids(self, text: str, finish_reason: str | None) -> tuple[int, ...]:
        """a_t as this critic reads it: the turn's text (defused) in its tokenizer, + its
        end-of-turn id when the model ended the turn (`sweet.core.tokens.action_ids`)."""
        return action_ids(text_ids(self.tokenizer, defuse(text)), int(self.tokenizer.eos_token_id), finish_reason)

    def action_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def pages(self, state: State, ids: Sequence[int], training_info: bool = True) -> tuple[str | None, str | None]:
        """(target HTML or None when c is left out, latest draft HTML or None)."""
        return (state.training_info if training_info else None), latest_draft(state, self.action_text(ids))

    # ---- images

    def pixels(self, html: str, image) -> tuple:
        """(pixel_values, image_grid_thw) of the screenshot `image` of page `html` (kept per page)."""
        key = hashlib.sha256(html.encode("utf-8", "replace")).hexdigest()
        if key not in self._pixels:
            size = {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}
            out = self.processor.image_processor(images=[image], return_tensors="pt", size=size)
            self._pixels[key] = (out["pixel_values"], out["image_grid_thw"])
        return self._pixels[key]

    def context(self, state: State, ids: Sequence[int], header: str, training_info: bool, template: str | None
                ) -> tuple[list[int], list[tuple]]:
        """(o_t, c, latest draft) as ids with every image slot expanded, and the images' (pixel
        values, grid) in slot order."""
        target, draft = self.pages(state, ids, training_info)
        wanted = [h for h in (target, draft) if h is not None]
        renders = dict(zip(wanted, self.renders.render(wanted))) if wanted else {}
        images = []
        messages = [dict(m, content=defuse(str(m["content"]))) for m in state.prompt]
        if target is not None:
            ok = renders[target].ok
            messages = with_training_info(messages, IMAGE_SLOT if ok else BROKEN_TARGET_NOTE, header, template)
            if ok:
                images.append(self.pixels(target, renders[target].image))
        note = NO_DRAFT_NOTE if draft is None else DRAFT_NOTE if renders[draft].ok else BROKEN_DRAFT_NOTE
        messages[-1] = dict(messages[-1], content=str(messages[-1]["content"]) + "\n\n" + note)
        if note == DRAFT_NOTE:
            images.append(self.pixels(draft, renders[draft].image))
        return self.expand(template_ids(self.tokenizer, messages), images), images

    def expand(self, ids: Sequence[int], images: list[tuple]) -> list[int]:
        """`ids` with each image slot's pad token repeated to its image's token count."""
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise RuntimeError(f"critic context has {len(slots)} image slots for {len(images)} screenshots")
        out, start = [], 0
        for pos, (_, grid) in zip(slots, images):
            out.extend(ids[start:pos])
            out.extend([self.image_token_id] * (int(grid.prod()) // self.merge ** 2))
            start = pos + 1
        return out + list(ids[start:])

    def batch(self, examples: Sequence, header: str, max_length: int | None, keep_head: int,
              training_info: bool = True, template: str | None = None) -> VisionBatch:
        """Right-padded batch of CriticTurns with their screenshots, one row per turn (each
        turn's context holds other screenshots, so turns never share a row); contexts cut as
        `make_batch` cuts them, an error when a cut would reach a screenshot."""
        import torch

        pairs, images = [], []
        for ex in examples:
            ids, imgs = self.context(ex.state, ex.action_ids, header, training_info, template)
            pairs.append((ids, ex.action_ids))
            images.append(imgs)
        batch = make_batch(pairs, self.tokenizer.pad_token_id, max_length=max_length, keep_head=keep_head)
        for row, (ex, (ids, _)) in enumerate(zip(examples, pairs)):
            want = ids.count(self.image_token_id)
            if int((batch.input_ids[row] == self.image_token_id).sum()) != want:
                raise ValueError(f"episode {ex.state.episode_id} turn {ex.state.turn_index}: the critic's context "
                                 f"({len(ids)} tokens with its screenshots) does not fit --max_length {max_length} "
                                 "without cutting a screenshot; raise --max_length or lower --max_pixels")
        flat = [img for imgs in images for img in imgs]
        if not flat:
            return VisionBatch(batch.input_ids, batch.attention_mask, batch.action_mask, batch.spans,
                               image_token_id=self.image_token_id)
        return VisionBatch(batch.input_ids, batch.attention_mask, batch.action_mask, batch.spans,
                           pixel_values=torch.cat([p for p, _ in flat]), image_grid_thw=torch.cat([g for _, g in flat]),
                           image_token_id=self.image_token_id)


def load_processor(spec: str):
    """The processor of a vision-language model spec (`tiny-vl`, a path, a hub id)."""
    from transformers import AutoProcessor

    from sweet.core.models import resolve_model_path

    path = resolve_model_path(spec)
    try:
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load the processor of vision-language model {spec!r} ({path}): "
                         f"{str(e).splitlines()[0]}") from None
    if processor.tokenizer.pad_token_id is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return processor

