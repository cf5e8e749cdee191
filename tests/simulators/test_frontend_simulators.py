"""Frontend simulated humans: the VLM one (screenshots) and the text one (DOM structure),
with real chromium renders, a real OpenAI-compatible HTTP server and the tiny model."""

from __future__ import annotations

import base64
import io
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from local_http import LocalServer, send_json
from PIL import Image

from colbench.scoring.render import DEFAULT_CHROMIUM, RenderPool
from colbench.types import Task, Turn
from engines import EngineOptions, load_engine
from simulators.base import SimRequest
from simulators.text_frontend import TextFrontendSimulator, build_text_conversation, colour_name, summarise_structure
from simulators.vlm import DRAFT_NOTE, VLMSimulator, build_vlm_conversation, png_data_url

pytestmark = pytest.mark.skipif(not Path(DEFAULT_CHROMIUM).exists(), reason="chromium not installed")

TW = '<link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">'
TARGET = (f"<html><head>{TW}</head><body><header class='bg-blue-800 text-white p-6'><h1 class='text-3xl font-bold'>"
          "Acme Bakery</h1></header><img src='https://picsum.photos/600/300'><p class='p-6'>Fresh bread daily.</p></body></html>")
DRAFT = f"<html><head>{TW}</head><body><h1 class='text-red-600 text-5xl'>Bakery</h1></body></html>"
TASK = Task("fe-sim-1", "frontend", "A homepage for my bakery.", TARGET)
HISTORY = [Turn("agent", f"First try:\n```html\n{DRAFT}\n```"), Turn("human", "The title should be in a dark blue bar.")]


def with_latest(text: str) -> list[Turn]:
    return HISTORY + [Turn("agent", text)]


@pytest.fixture(scope="module")
def pool():
    with RenderPool(workers=2, timeout_s=6.0) as p:
        yield p


@pytest.fixture(scope="module")
def tiny_engine():
    import torch

    torch.set_num_threads(1)
    engine = load_engine("tiny", EngineOptions(device="cpu", dtype="float32"))
    yield engine
    engine.close()


def decode_data_url(url: str) -> Image.Image:
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


# ---------------------------------------------------------------- pure message building


def test_vlm_conversation_has_dialogue_and_both_images():
    png = io.BytesIO()
    Image.new("RGB", (1280, 5000), "red").save(png, format="PNG")
    url = png_data_url(png.getvalue(), width=640, max_height=1000)
    assert decode_data_url(url).size == (640, 1000)  # scaled to the width, cropped to max height
    msgs = build_vlm_conversation("SYSTEM", with_latest("Second try:\n```html\n<div>v2</div>\n```"), url, url)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"] == f"First try: {DRAFT_NOTE}"  # earlier HTML shown as a note, not code
    assert msgs[2]["content"] == "The title should be in a dark blue bar."  # its own earlier reply
    parts = msgs[-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]
    assert parts[0]["text"].startswith(f"Second try: {DRAFT_NOTE}") and "first picture" in parts[0]["text"]
    assert "<div>" not in json.dumps(msgs)
    no_page = build_vlm_conversation("SYSTEM", with_latest("What colours do you like?"), None, url)[-1]["content"]
    assert [p["type"] for p in no_page] == ["text", "image_url"] and "not shown you a page yet" in no_page[0]["text"]


@pytest.mark.parametrize("hex_colour, name", [("#ffffff", "white"), ("#000000", "black"), ("#1e40af", "dark blue"),
                                              ("#ef4444", "red"), ("#9ca3af", "gray"), ("#fde68a", "light yellow"),
                                              ("#10b981", "green"), (None, "none")])
def test_colour_name(hex_colour, name):
    assert colour_name(hex_colour) == name


# ---------------------------------------------------------------- VLM over a real OpenAI-compatible server


class _ChatServer(LocalServer):
    """A real HTTP server speaking the chat-completions protocol; records request bodies."""

    REPLY = "Make the header a dark blue bar. ```html\n<div>never code</div>\n``` " + "Also bigger photos. " * 40

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                send_json(self, 200, {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": outer.REPLY}, "finish_reason": "stop"}]})

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def test_vlm_sends_screenshots_and_dialogue_over_the_openai_protocol(pool, tmp_path):
    server = _ChatServer()
    try:
        engine = load_engine(f"openai:qwen-vl@{server.url}", EngineOptions(max_retries=0))
        sim = VLMSimulator(engine, pool, max_reply_chars=120, render_dir=tmp_path)
        draft2 = DRAFT.replace("text-red-600", "text-blue-800")
        replies = sim.reply([SimRequest(TASK, with_latest(f"```html\n{draft2}\n```")),
                             SimRequest(TASK, with_latest("Which photos do you want?"))])
        sim.close()
    finally:
        server.close()
    assert len(server.bodies) == 2
    by_images = sorted(server.bodies, key=lambda b: -sum(isinstance(m["content"], list) and len(m["content"]) for m in b["messages"]))
    with_page, without_page = by_images
    for body in (with_page, without_page):
        msgs = body["messages"]
        assert msgs[0]["role"] == "system" and TASK.description in msgs[0]["content"]
        assert msgs[2] == {"role": "assistant", "content": "The title should be in a dark blue bar."}
        assert TARGET not in json.dumps(body)  # the simulator sees the target as a picture
    images = [decode_data_url(p["image_url"]["url"]) for p in with_page["messages"][-1]["content"] if p["type"] == "image_url"]
    assert len(images) == 2 and all(im.width == 768 for im in images)
    agent_img, target_img = images
    assert agent_img.tobytes() != target_img.tobytes()
    assert [p["type"] for p in without_page["messages"][-1]["content"]] == ["text", "image_url"]
    # replies: code removed, cut at a word boundary, agent render recorded
    page_reply, no_page_reply = replies
    assert not page_reply.failed and page_reply.text.startswith("Make the header a dark blue bar. Also bigger")
    assert len(page_reply.text) <= 120 and "never code" not in page_reply.text
    assert Path(page_reply.render).is_file() and no_page_reply.render is None


def test_vlm_engine_failure_is_recorded_not_replaced(pool, tiny_engine, tmp_path):
    # the tiny text model's chat template cannot take image parts: a real engine failure
    sim = VLMSimulator(tiny_engine, pool, render_dir=tmp_path)
    broken = Task("fe-broken", "frontend", "x", "<script>while(true){}</script>")
    replies = sim.reply([SimRequest(TASK, with_latest(f"```html\n{DRAFT}\n```")),
                         SimRequest(TASK, with_latest("```html\n<script>while(true){}</script>\n```")),
                         SimRequest(broken, with_latest("A question?"))])
    failed, hung_page, hung_target = replies
    assert failed.failed and failed.text == "" and failed.error
    assert not hung_page.failed and "did not load" in hung_page.text and "timed out" in hung_page.text
    assert hung_target.failed and "target render failed" in hung_target.error
    with pytest.raises(ValueError, match="last turn"):
        sim.reply([SimRequest(TASK, HISTORY)])


# ---------------------------------------------------------------- text simulator


def test_structure_summary_names_what_is_visible(pool):
    target, draft = pool.extract_structure([TARGET, DRAFT])
    t = summarise_structure(target)
    assert "'Acme Bakery' (white text, 30px bold)" in t and "dark blue (#1e40af)" in t
    assert "- img at (0," in t and "600x300, picture" in t and "'Fresh bread daily.'" in t
    d = summarise_structure(draft)
    assert "'Bakery' (red text, 48px)" in d
    msgs = build_text_conversation("SYS", with_latest("v2"), d, t)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[-1]["content"].index("My page:") < msgs[-1]["content"].index("The page you want:")
    assert summarise_structure(target, max_chars=80).endswith("(more below)")


def test_text_simulator_with_the_tiny_model(pool, tiny_engine):
    sim = TextFrontendSimulator(tiny_engine, pool, max_reply_chars=200)
    seen = []
    real_generate = tiny_engine.generate

    def recording(conversations, params):  # the real engine, with its inputs kept for the asserts
        seen.extend(conversations)
        return real_generate(conversations, params)

    tiny_engine.generate = recording
    try:
        replies = sim.reply([SimRequest(TASK, with_latest(f"```html\n{DRAFT}\n```")),
                             SimRequest(TASK, with_latest("Do you like red?"))])
    finally:
        del tiny_engine.generate
    assert len(seen) == 2  # one batched call
    assert "My page:" in seen[0][-1]["content"] and "'Bakery' (red text" in seen[0][-1]["content"]
    assert "My page:" not in seen[1][-1]["content"] and "'Acme Bakery'" in seen[1][-1]["content"]
    for r in replies:
        assert r.failed or (r.text and len(r.text) <= 200 and "```" not in r.text)
        assert not r.failed or r.error == "empty reply after removing code"


def test_registry_builds_frontend_simulators(tmp_path):
    from colbench.envs.frontend import FrontendEnv
    from simulators import load_simulator

    env = FrontendEnv(clip_model="tiny", render_dir=tmp_path)
    try:
        text_sim = load_simulator("text+tiny", env, engine_options=EngineOptions(device="cpu"))
        vlm_sim = load_simulator("tiny", env, engine_options=EngineOptions(device="cpu"))
        assert isinstance(text_sim, TextFrontendSimulator) and isinstance(vlm_sim, VLMSimulator)
        assert text_sim.renderer is env.renderer is vlm_sim.renderer
        text_sim.close()
        vlm_sim.close()
    finally:
        env.close()
