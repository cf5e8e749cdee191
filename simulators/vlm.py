"""The vision-language simulated human for frontend design (ColBench; paper: Qwen2-VL-72B).

For each request it renders the agent's latest HTML draft and the hidden target page
(colbench.scoring.render.RenderPool, offline), and asks a VLM, shown both screenshots, to
describe the most important differences in words, as the person who wants the target.

    sim = VLMSimulator(load_engine("openai:Qwen/Qwen2-VL-72B-Instruct@http://host:8000/v1"), env.renderer)
    replies = sim.reply([SimRequest(task, turns), ...])   # one batched generate call

Conversation layout (OpenAI chat format, images as PNG data URLs in content parts):
the prompt (`simulators/prompts/frontend_vlm.txt`, placeholder `{problem_description}`;
kind "frontend_vlm" of colbench.prompts, `--human_prompt FILE` picks another) is the
system message; earlier agent turns are "user" turns with their HTML replaced by a
note (the person saw it as a page, not code) and the simulator's own replies are
"assistant" turns; the latest agent turn carries the two screenshots, agent's first.
Departure from the reference, on purpose: the reference shows the model no dialogue,
so its feedback contradicts itself from turn to turn; here it sees what it said.
A file with `{dialogue_history}` is sent as ONE user message instead (the published
layout): the filled template (the dialogue so far as text), then the latest turn and
the two screenshots.

When the agent's turn holds no HTML, the model sees only the target and says there is
no page to compare yet, describing the wanted page's overall look. When the agent's
page does not render (timeout, crash), the reply says so without calling the model.
Replies are cleaned like the backend simulator's (no code, whitespace collapsed, cut
to `max_reply_chars`); an engine failure or an empty reply is `failed=True`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from PIL import Image

from colbench.envs.frontend import extract_html, has_html
from colbench.prompts import KINDS, PromptTemplate, dialogue_text, load_prompt
from colbench.types import Task, Turn
from engines.base import BatchError, Engine, Message, SamplingParams
from simulators.base import SimReply, SimRequest, check_requests
from simulators.llm import clean_reply

if TYPE_CHECKING:
    from colbench.scoring.render import RenderPool

PROMPTS_DIR = Path(__file__).parent / "prompts"
DEFAULT_PROMPT = KINDS["frontend_vlm"].default_path()  # the registry's default (colbench.prompts)
DEFAULT_SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=256)

DRAFT_NOTE = "[I showed you a draft of the page.]"
COMPARE_NOTE = "Here is my page (first picture) and the page you want (second picture). How is mine different?"
NO_PAGE_NOTE = ("I have not shown you a page yet. Tell me so in one short sentence, then describe the overall look "
                "of the page you want (the picture) in two or three sentences.")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:12]


def _slug(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", task_id)[:80] or "task"


def spoken_text(agent_text: str) -> str:
    """An agent message as the person perceives it: code is shown as a page, not read."""
    text = re.sub(r"```.*?(```|$)", f" {DRAFT_NOTE} ", agent_text, flags=re.DOTALL)
    text = re.sub(r"<html\b.*?(</html\s*>|$)", f" {DRAFT_NOTE} ", text, flags=re.DOTALL | re.IGNORECASE)
    text = " ".join(text.split())
    return text or DRAFT_NOTE


def dialogue_messages(system: str, turns: Sequence[Turn]) -> list[Message]:
    """System prompt, then the dialogue from the simulator's side: agent turns as
    "user" (code replaced by a note), its own replies as "assistant"; failed human
    turns (no text) are skipped."""
    messages: list[Message] = [{"role": "system", "content": system}]
    for t in turns:
        if t.role == "agent":
            messages.append({"role": "user", "content": spoken_text(t.content)})
        elif t.content:
            messages.append({"role": "assistant", "content": t.content})
    return messages


def fill_human_prompt(prompt: PromptTemplate, task: Task, earlier: Sequence[Turn]) -> str:
    """A frontend simulator's template filled: `{problem_description}`, and `{dialogue_history}`
    with the turns before the latest as text (agent code shown as a note, as the person sees it)."""
    spoken = [replace(t, content=spoken_text(t.content)) if t.role == "agent" else t for t in earlier]
    return prompt.fill(problem_description=task.description, dialogue_history=dialogue_text(spoken))


def single_message(messages: list[Message]) -> list[Message]:
    """The published layout: the filled template (the system message) and the latest
    user message merged into ONE user message; the earlier chat turns are dropped (the
    template holds them as text)."""
    system, latest = messages[0]["content"], messages[-1]["content"]
    if isinstance(latest, str):
        return [{"role": "user", "content": f"{system}\n\n{latest}"}]
    first, *rest = latest
    return [{"role": "user", "content": [{"type": "text", "text": f"{system}\n\n{first['text']}"}, *rest]}]


def png_data_url(png: bytes, width: int = 768, max_height: int = 2048) -> str:
    """A screenshot as a data URL for a VLM: scaled to `width`, cropped to `max_height`."""
    img = Image.open(io.BytesIO(png)).convert("RGB")
    if img.width > width:
        img = img.resize((width, max(1, round(img.height * width / img.width))), Image.Resampling.LANCZOS)
    if img.height > max_height:
        img = img.crop((0, 0, img.width, max_height))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def build_vlm_conversation(system: str, turns: Sequence[Turn], agent_image: str | None, target_image: str) -> list[Message]:
    """The chat the VLM sees for a reply to `turns[-1]` (pure: images as data URLs).

    agent_image: the agent's latest page, or None when its turn holds no HTML."""
    messages = dialogue_messages(system, turns[:-1])
    said = spoken_text(turns[-1].content)
    if agent_image is None:
        parts = [{"type": "text", "text": f"{said}\n\n{NO_PAGE_NOTE}"}, image_part(target_image)]
    else:
        parts = [{"type": "text", "text": f"{said}\n\n{COMPARE_NOTE}"}, image_part(agent_image), image_part(target_image)]
    messages.append({"role": "user", "content": parts})
    return messages


def generate_replies(engine: Engine, conversations: list[list[Message]], sampling: SamplingParams,
                     max_reply_chars: int) -> list[SimReply]:
    """One batched engine call, replies cleaned; an engine failure fails the batch's
    replies (recorded with the error, never replaced), an empty reply fails alone."""
    if not conversations:
        return []
    try:
        results = engine.generate(conversations, sampling)
    except BatchError as e:  # some replies failed on their own: only those
        results = e.results
    except Exception as e:  # EngineError after retries, or a backend that cannot take images
        return [SimReply("", failed=True, error=_error_text(e)) for _ in conversations]
    out = []
    for samples in results:
        if isinstance(samples, Exception):
            out.append(SimReply("", failed=True, error=_error_text(samples)))
            continue
        text = clean_reply(samples[0].text, max_reply_chars)
        out.append(SimReply(text) if text else SimReply("", failed=True, error="empty reply after removing code"))
    return out


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


class VLMSimulator:
    """A simulated human for frontend design backed by a vision-language `Engine`.

    engine:          any Engine whose server accepts image content parts (vLLM, OpenAI).
    renderer:        the env's RenderPool (FrontendEnv.renderer).
    max_reply_chars: replies are cut to this (paper: 400).
    render_dir:      where the agent's renders are saved (SimReply.render); default a temp dir.
    image_width, max_image_height: screenshots are scaled/cropped to this before sending.
    """

    def __init__(self, engine: Engine, renderer: "RenderPool", *, max_reply_chars: int = 400,
                 sampling: SamplingParams = DEFAULT_SAMPLING, prompt_file: str | Path | None = None,
                 render_dir: str | Path | None = None, image_width: int = 768, max_image_height: int = 2048):
        self.engine = engine
        self.renderer = renderer
        self.max_reply_chars = max_reply_chars
        self.sampling = sampling if sampling.n == 1 else SamplingParams(**{**sampling.__dict__, "n": 1})
        self.prompt = load_prompt("frontend_vlm", prompt_file)  # PromptError: one line naming file + placeholder
        self.prompt_file, self.template = self.prompt.path, self.prompt.text
        self.render_dir = Path(render_dir) if render_dir is not None else Path(tempfile.mkdtemp(prefix="colbench-vlm-"))
        self.image_width, self.max_image_height = image_width, max_image_height
        self._targets: dict[tuple[str, str], Path] = {}  # (task_id, html digest) -> target PNG
        self._lock = threading.Lock()
        self.name = f"vlm:{engine.spec}"

    def system_prompt(self, task: Task, turns: Sequence[Turn] = ()) -> str:
        """The filled template; `turns` (all but the latest) fill `{dialogue_history}` if it has one."""
        return fill_human_prompt(self.prompt, task, turns)

    def conversation(self, task: Task, turns: Sequence[Turn], agent_image: str | None, target_image: str
                     ) -> list[Message]:
        """The chat the VLM sees for a reply to `turns[-1]` (module docstring)."""
        messages = build_vlm_conversation(self.system_prompt(task, turns[:-1]), turns, agent_image, target_image)
        return single_message(messages) if self.prompt.has("dialogue_history") else messages

    def _target_pngs(self, tasks: Sequence[Task]) -> list[Path | str]:
        """Each task's target screenshot path (rendered once per target), or an error string."""
        keys = [(t.task_id, _digest(t.hidden)) for t in tasks]
        with self._lock:
            missing = {k: t for k, t in zip(keys, tasks) if k not in self._targets}
        errors: dict[tuple[str, str], str] = {}
        if missing:
            paths = [self.render_dir / "targets" / f"{_slug(k[0])}-{k[1]}.png" for k in missing]
            for k, res in zip(missing, self.renderer.render([t.hidden for t in missing.values()], paths)):
                if res.ok:
                    with self._lock:
                        self._targets[k] = res.png_path
                else:
                    errors[k] = f"target render failed: {res.error}"
        return [self._targets.get(k) or errors[k] for k in keys]

    def reply(self, requests: Sequence[SimRequest]) -> list[SimReply]:
        if not requests:
            return []
        check_requests(requests)
        targets = self._target_pngs([r.task for r in requests])
        drafts = {i: extract_html(r.turns[-1].content) for i, r in enumerate(requests) if has_html(r.turns[-1].content)}
        paths = [self.render_dir / "drafts" / f"{_slug(requests[i].task.task_id)}-{_digest(h)}.png" for i, h in drafts.items()]
        renders = dict(zip(drafts, self.renderer.render(list(drafts.values()), paths)))

        replies: list[SimReply | None] = [None] * len(requests)
        conversations, asked = [], []
        for i, r in enumerate(requests):
            target, render = targets[i], renders.get(i)
            if isinstance(target, str):
                replies[i] = SimReply("", failed=True, error=target)
            elif render is not None and not render.ok:  # the agent's page is broken: say so
                replies[i] = SimReply(f"I could not see your page: it did not load in my browser ({render.error}). "
                                      "Could you send a simpler version?")
            else:
                agent_url = png_data_url(render.png_path.read_bytes(), self.image_width, self.max_image_height) if render else None
                target_url = png_data_url(target.read_bytes(), self.image_width, self.max_image_height)
                conversations.append(self.conversation(r.task, r.turns, agent_url, target_url))
                asked.append(i)
        for i, reply in zip(asked, generate_replies(self.engine, conversations, self.sampling, self.max_reply_chars)):
            render = renders.get(i)
            replies[i] = SimReply(reply.text, reply.failed, reply.error, str(render.png_path) if render else None)
        return replies  # type: ignore[return-value]

    def close(self) -> None:
        """Close the engine (the renderer belongs to the env)."""
        self.engine.close()
