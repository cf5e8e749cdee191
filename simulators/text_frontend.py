"""A text-only simulated human for frontend design, for servers without vision.

Instead of screenshots the model reads what is visible on both pages, taken from the
DOM after layout in chromium (colbench.scoring.render.RenderPool.extract_structure): page
size and background, then the visible blocks top to bottom with their box, text,
colours (as words and hex) and image sizes. It describes the differences in words,
as the person who wants the target, with the dialogue so far.

    sim = TextFrontendSimulator(load_engine("openai:meta-llama/Llama-3.1-70B-Instruct@http://host:8000/v1"),
                                env.renderer)

The prompt lives in `simulators/prompts/frontend_text.txt` (placeholder `{problem_description}`;
kind "frontend_text" of colbench.prompts, `--human_prompt FILE` picks another).
Conversation layout, reply cleaning and failure handling are the VLM simulator's.
"""

from __future__ import annotations

import colorsys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from colbench.envs.frontend import extract_html, has_html
from colbench.types import Task, Turn
from engines.base import Engine, Message, SamplingParams
from simulators.base import SimReply, SimRequest, check_requests
from colbench.prompts import KINDS, load_prompt
from simulators.vlm import (
    DEFAULT_SAMPLING,
    PROMPTS_DIR,
    _digest,
    dialogue_messages,
    fill_human_prompt,
    generate_replies,
    single_message,
    spoken_text,
)

if TYPE_CHECKING:
    from colbench.scoring.render import RenderPool

DEFAULT_PROMPT = KINDS["frontend_text"].default_path()  # the registry's default (colbench.prompts)
COMPARE_NOTE = "Here is my page (first description) and the page you want (second). How is mine different?"
NO_PAGE_NOTE = ("I have not shown you a page yet. Tell me so in one short sentence, then describe the overall look "
                "of the page you want in two or three sentences.")
_HUES = [(15, "red"), (40, "orange"), (65, "yellow"), (170, "green"), (195, "teal"), (255, "blue"),
         (290, "purple"), (335, "pink"), (360, "red")]


def colour_name(hex_colour: str | None) -> str:
    """A rough colour word for '#rrggbb' ("dark blue", "light gray", "white")."""
    if not hex_colour or len(hex_colour) != 7:
        return "none"
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, _, s = colorsys.rgb_to_hls(r, g, b)
    luma = 0.299 * r + 0.587 * g + 0.114 * b  # perceived brightness decides dark/light
    if s < 0.15 or luma < 0.06 or luma > 0.96:
        return "white" if luma > 0.93 else "black" if luma < 0.1 else (
            "light gray" if luma > 0.7 else "dark gray" if luma < 0.35 else "gray")
    name = next(n for limit, n in _HUES if h * 360 <= limit)
    if name == "orange" and luma < 0.4:
        name = "brown"
    return ("dark " if luma < 0.3 else "light " if luma > 0.75 else "") + name


def _colour(hex_colour: str | None) -> str:
    return f"{colour_name(hex_colour)} ({hex_colour})" if hex_colour else "none"


def summarise_structure(s: dict[str, Any], max_chars: int = 4000) -> str:
    """Compact text for one page's extract_structure() output."""
    if "error" in s:
        return f"(the page did not load: {s['error']})"
    lines = [f"Page {s['width']} x {s['height']} px, background {_colour(s['background'])}."]
    if s.get("title"):
        lines.append(f"Title: {s['title'][:80]!r}")
    for b in s["blocks"]:
        x, y, w, h = b["box"]
        line = f"- {b['tag']} at ({x},{y}) {w}x{h}"
        if b.get("bg") and b["bg"] != s["background"]:
            line += f", background {_colour(b['bg'])}"
        if b["tag"] == "img":
            line += f", picture{' ' + repr(b['alt']) if b.get('alt') else ''}"
        if b.get("label"):
            line += f", label {b['label']!r}"
        if b.get("text"):
            colour = f"{colour_name(b['color'])} " if b.get("color") else ""
            line += f": {b['text']!r} ({colour}text, {b.get('font', '')}"
            line += ", centred)" if b.get("align") == "center" else ")"
        lines.append(line)
    if s.get("truncated"):
        lines.append("- ... (more below)")
    text, out = 0, []
    for line in lines:
        if text + len(line) > max_chars:
            out.append("- ... (more below)")
            break
        out.append(line)
        text += len(line) + 1
    return "\n".join(out)


def build_text_conversation(system: str, turns: Sequence[Turn], agent_page: str | None, target_page: str) -> list[Message]:
    """The chat the text model sees for a reply to `turns[-1]` (pure).

    agent_page / target_page: summarise_structure() text; agent_page None = no HTML."""
    messages = dialogue_messages(system, turns[:-1])
    said = spoken_text(turns[-1].content)
    if agent_page is None:
        body = f"{said}\n\n{NO_PAGE_NOTE}\n\nThe page you want:\n{target_page}"
    else:
        body = f"{said}\n\n{COMPARE_NOTE}\n\nMy page:\n{agent_page}\n\nThe page you want:\n{target_page}"
    messages.append({"role": "user", "content": body})
    return messages


class TextFrontendSimulator:
    """A frontend simulated human backed by a text-only `Engine`.

    engine:          any Engine (text only).
    renderer:        the env's RenderPool (FrontendEnv.renderer), for the DOM structure.
    max_reply_chars: replies are cut to this (paper: 400).
    max_page_chars:  each page's summary is cut to this.
    """

    def __init__(self, engine: Engine, renderer: "RenderPool", *, max_reply_chars: int = 400,
                 sampling: SamplingParams = DEFAULT_SAMPLING, prompt_file: str | Path | None = None,
                 max_page_chars: int = 4000):
        self.engine = engine
        self.renderer = renderer
        self.max_reply_chars = max_reply_chars
        self.max_page_chars = max_page_chars
        self.sampling = sampling if sampling.n == 1 else SamplingParams(**{**sampling.__dict__, "n": 1})
        self.prompt = load_prompt("frontend_text", prompt_file)  # PromptError: one line naming file + placeholder
        self.prompt_file, self.template = self.prompt.path, self.prompt.text
        self._targets: dict[tuple[str, str], str] = {}  # (task_id, html digest) -> summary
        self._lock = threading.Lock()
        self.name = f"text-frontend:{engine.spec}"

    def system_prompt(self, task: Task, turns: Sequence[Turn] = ()) -> str:
        """The filled template; `turns` (all but the latest) fill `{dialogue_history}` if it has one."""
        return fill_human_prompt(self.prompt, task, turns)

    def conversation(self, task: Task, turns: Sequence[Turn], agent_page: str | None, target_page: str
                     ) -> list[Message]:
        """The chat the model sees for a reply to `turns[-1]` (layouts as VLMSimulator's)."""
        messages = build_text_conversation(self.system_prompt(task, turns[:-1]), turns, agent_page, target_page)
        return single_message(messages) if self.prompt.has("dialogue_history") else messages

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        if not requests:
            return []
        check_requests(requests)
        keys = [(r.task.task_id, _digest(r.task.hidden)) for r in requests]
        with self._lock:
            missing = {k: r.task.hidden for k, r in zip(keys, requests) if k not in self._targets}
        drafts = {i: extract_html(r.turns[-1].content) for i, r in enumerate(requests) if has_html(r.turns[-1].content)}
        # one pass over chromium for the new targets and all drafts
        structures = self.renderer.extract_structure(list(missing.values()) + list(drafts.values()))
        target_errors = {}
        for k, s in zip(missing, structures[:len(missing)]):
            if "error" in s:
                target_errors[k] = f"target render failed: {s['error']}"
            else:
                with self._lock:
                    self._targets[k] = summarise_structure(s, self.max_page_chars)
        pages = dict(zip(drafts, structures[len(missing):]))

        replies: list[SimReply | None] = [None] * len(requests)
        conversations, asked = [], []
        for i, (r, k) in enumerate(zip(requests, keys)):
            if k not in self._targets:
                replies[i] = SimReply("", failed=True, error=target_errors.get(k, "target not rendered"))
            elif i in pages and "error" in pages[i]:
                replies[i] = SimReply(f"I could not see your page: it did not load in my browser ({pages[i]['error']}). "
                                      "Could you send a simpler version?")
            else:
                agent = summarise_structure(pages[i], self.max_page_chars) if i in pages else None
                conversations.append(self.conversation(r.task, r.turns, agent, self._targets[k]))
                asked.append(i)
        for i, reply in zip(asked, generate_replies(self.engine, conversations, self.sampling, self.max_reply_chars)):
            replies[i] = reply
        return replies  # type: ignore[return-value]

    def close(self) -> None:
        """Close the engine (the renderer belongs to the env)."""
        self.engine.close()
