"""Offline rendering in real chromium: repeatable, Tailwind from vendored copies,
local placeholder images, no network, hostile pages contained."""

from __future__ import annotations

import asyncio
import http.server
import io
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from colbench.scoring import placeholders, routing, tailwind
from colbench.scoring.placeholders import image_size_from_url
from colbench.scoring.render import DEFAULT_CHROMIUM, ChromiumNotFound, RenderPool

pytestmark = pytest.mark.skipif(not Path(DEFAULT_CHROMIUM).exists(), reason="chromium not installed (apt-get install chromium)")

TW2_JSDELIVR = '<link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">'
TW2_UNPKG = '<link href="https://unpkg.com/tailwindcss@^2/dist/tailwind.min.css" rel="stylesheet">'
TW_PLAY_CDN = '<script src="https://cdn.tailwindcss.com"></script>'

RED_BOX = '<div class="bg-red-500 w-64 h-64"></div>'
NORMAL = f"<html><head>{TW2_JSDELIVR}</head><body>{RED_BOX}<p class='text-xl'>normal</p></body></html>"


def page(head: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>"


@pytest.fixture(scope="module")
def pool():
    with RenderPool(workers=2, timeout_s=6.0) as p:
        yield p


def is_red(px: tuple[int, int, int]) -> bool:
    return px[0] > 200 and px[1] < 90 and px[2] < 90


# ---------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(
    "url, size",
    [
        ("https://picsum.photos/200/300", (200, 300)),
        ("https://picsum.photos/250", (250, 250)),
        ("https://picsum.photos/id/237/640/480?grayscale", (640, 480)),
        ("https://picsum.photos/seed/abc/320/200", (320, 200)),
        ("https://source.unsplash.com/random/400x250", (400, 250)),
        ("https://source.unsplash.com/1600x900/?nature,water", (1600, 900)),
        ("https://placehold.co/600x400/png", (600, 400)),
        ("https://via.placeholder.com/150", (150, 150)),
        ("https://via.placeholder.com/150x50.png?text=hi", (150, 50)),
        ("https://dummyimage.com/728x90/000/fff", (728, 90)),
        ("https://images.unsplash.com/photo-1?w=500&h=200&fit=crop", (500, 200)),
        ("https://source.unsplash.com/random", placeholders.DEFAULT_IMAGE_SIZE),
        ("https://example.com/logo.png", placeholders.DEFAULT_IMAGE_SIZE),
        ("https://picsum.photos/99999/5", (placeholders.MAX_IMAGE_SIDE, 5)),
    ],
)
def test_image_size_from_url(url, size):
    assert image_size_from_url(url) == size


def test_placeholder_png_is_deterministic_per_url():
    a, b = placeholders.placeholder_png("https://picsum.photos/64/48"), placeholders.placeholder_png("https://picsum.photos/64/48?x")
    assert Image.open(io.BytesIO(a)).size == (64, 48)
    placeholders.placeholder_png.cache_clear()
    assert placeholders.placeholder_png("https://picsum.photos/64/48") == a
    assert a != b


def test_purged_tailwind_keeps_every_rule_when_every_class_is_used():
    rules, index = tailwind.tailwind_rules()
    full = tailwind.tailwind_css_for('<div class="%s">' % " ".join(index))
    strip = lambda css: re.sub(r"/\*.*?\*/", "", css, flags=re.S)  # noqa: E731
    assert strip(full) == strip(tailwind.TAILWIND_CSS.read_text())
    small = tailwind.tailwind_css_for('<div class="md:w-1/2 hover:bg-blue-200 group"><p class="group-hover:text-white">')
    assert ".md\\:w-1\\/2{width:50%}" in small and ".group:hover .group-hover\\:text-white" in small
    assert ".bg-red-500" not in small and len(small) < 50_000


@pytest.mark.parametrize(
    "url, kind",
    [
        ("https://cdn.tailwindcss.com", "application/javascript"),
        ("https://cdn.tailwindcss.com/3.4.1?plugins=forms", "application/javascript"),
        ("https://cdn.jsdelivr.net/npm/@tailwindcss/browser@4", "application/javascript"),
        ("https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css", "text/css"),
        ("https://unpkg.com/tailwindcss@2.0.0/dist/tailwind.min.css", "text/css"),
        ("https://unpkg.com/tailwindcss-forms.css", None),
        ("https://fonts.googleapis.com/css2?family=Inter", None),
        ("http://127.0.0.1:8000/x.js", None),
    ],
)
def test_route_request_maps_cdns_and_blocks_the_rest(url, kind):
    resource = "script" if kind == "application/javascript" else "stylesheet"
    answer = routing.route_request(url, resource, "<div class='p-4'>")
    assert (answer[0] if answer else None) == kind


def test_missing_chromium_says_how_to_install(monkeypatch):
    monkeypatch.setenv("SWEET_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(ChromiumNotFound, match="apt-get install chromium"):
        RenderPool()


# ---------------------------------------------------------------- real chromium


def test_identical_html_renders_identically(pool, tmp_path):
    html = page(TW2_JSDELIVR, RED_BOX + '<img src="https://picsum.photos/300/200"><p class="text-3xl font-bold">Hello</p>'
                "<script>document.body.append(String(Math.random()))</script>")
    a, b = pool.render([html, html], [tmp_path / "a.png", tmp_path / "b.png"])
    (c,) = pool.render([html])
    assert a.error is None and b.error is None and c.error is None
    assert a.image.size == (1280, 800)
    assert a.image.tobytes() == b.image.tobytes() == c.image.tobytes()
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


@pytest.mark.parametrize("head", [TW2_JSDELIVR, TW2_UNPKG, TW_PLAY_CDN], ids=["css-jsdelivr", "css-unpkg", "play-cdn"])
def test_tailwind_applies_offline(pool, head):
    (res,) = pool.render([page(head, RED_BOX + '<div class="bg-blue-500 w-32 h-32"></div>')])
    assert res.error is None
    assert is_red(res.image.getpixel((100, 100)))  # inside the 256x256 (w-64 h-64) red box
    blue = res.image.getpixel((50, 300))
    assert blue[2] > 200 and blue[0] < 120
    assert res.image.getpixel((600, 100)) == (255, 255, 255)  # outside: unstyled white body


def test_responsive_variants_apply_at_the_viewport_width(pool):
    html = page(TW2_JSDELIVR, '<div class="w-full md:w-1/2 h-10 bg-red-500"></div>')
    (s,) = pool.extract_structure([html])
    assert s["blocks"][0]["box"][2] == 640  # md: applies at 1280 px


def test_placeholder_images_render_at_requested_size(pool):
    html = page("", '<img id="a" src="https://picsum.photos/200/300"><img src="https://source.unsplash.com/random/400x120">'
                    '<img src="https://placehold.co/90x60">')
    (s,) = pool.extract_structure([html])
    imgs = [b for b in s["blocks"] if b["tag"] == "img"]
    assert [b["natural"] for b in imgs] == [[200, 300], [400, 120], [90, 60]]
    assert [b["box"][2:] for b in imgs] == [[200, 300], [400, 120], [90, 60]]
    (res,) = pool.render([html])
    assert len(res.image.crop((0, 0, 200, 300)).getcolors(maxcolors=10_000) or []) > 3  # an actual picture, not blank


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802
        _Recorder.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"x")

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


def test_external_and_local_requests_are_blocked(pool):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.hits = []
    try:
        port = server.server_address[1]
        # every way a page can reach out, to both 127.0.0.1 and localhost
        probes = "".join(
            f"""<link rel="stylesheet" href="http://{h}:{port}/css"><script src="http://{h}:{port}/js"></script>
            <img src="http://{h}:{port}/img.png"><iframe src="http://{h}:{port}/frame"></iframe>
            <link rel="prefetch" href="http://{h}:{port}/prefetch"><video src="http://{h}:{port}/v.mp4"></video>
            <form id="f{i}" action="http://{h}:{port}/form" method="post"></form>
            <script>
              fetch("http://{h}:{port}/fetch").catch(() => {{}});
              const x = new XMLHttpRequest(); x.open("GET", "http://{h}:{port}/xhr"); x.send();
              navigator.sendBeacon("http://{h}:{port}/beacon", "b");
              try {{ new WebSocket("ws://{h}:{port}/ws"); }} catch (e) {{}}
              new EventSource("http://{h}:{port}/sse");
              new Image().src = "http://{h}:{port}/img2";
            </script>"""
            for i, h in enumerate(["127.0.0.1", "localhost"])
        )
        probes += f'<script>setTimeout(() => {{ document.getElementById("f0").submit(); }}, 0);' \
                  f'setTimeout(() => {{ location.href = "http://127.0.0.1:{port}/nav"; }}, 50);</script>'
        (res,) = pool.render([page("", probes + RED_BOX)])
        time.sleep(0.5)
        assert res.error is None
        assert _Recorder.hits == []
    finally:
        server.shutdown()


HOSTILE = {
    "infinite-loop": "<script>while(true){}</script><p>never</p>",
    "loop-after-load": "<p>x</p><script>setTimeout(() => { while(true){} }, 0)</script>",
    "dialogs": "<script>alert('a'); confirm('b'); prompt('c');</script>" + RED_BOX,
    "navigate-away": '<script>location = "https://example.com/";</script>' + RED_BOX,
    "reload-loop": "<script>setTimeout(() => location.reload(), 0)</script>" + RED_BOX,
    "meta-refresh": '<meta http-equiv="refresh" content="0; url=https://example.com/">' + RED_BOX,
    "window-open": '<script>window.open("https://example.com"); window.open("about:blank");</script>'
                   '<a id="l" href="https://example.com" target="_blank">x</a><script>l.click()</script>' + RED_BOX,
    "huge-page": '<div style="height:100000px;background:linear-gradient(red, blue)"></div>',
    "malformed": "<div><p><span>unclosed <table><tr><td>x</div></b></i><<>>&&&;<script>if(</script>" + RED_BOX,
    "beforeunload": "<script>onbeforeunload = e => { e.preventDefault(); e.returnValue = 'stay'; }</script>" + RED_BOX,
    # what a page leaves behind when the next render navigates its context's page
    "pagehide-loop": "<script>addEventListener('pagehide', () => { while(true){} })</script>" + RED_BOX,
    "unload-loop": "<script>addEventListener('unload', () => { while(true){} })</script>" + RED_BOX,
    "popup-to-page-url": '<a id="l" href="http://colbench.invalid/" target="_blank">x</a>'
                         "<script>setTimeout(() => l.click(), 100)</script>" + RED_BOX,
}
RENDERS = ("dialogs", "navigate-away", "reload-loop", "meta-refresh", "window-open", "malformed", "beforeunload",
           "pagehide-loop", "unload-loop", "popup-to-page-url")  # the hostile pages that render normally


def test_hostile_pages_render_or_fail_within_the_timeout(pool):
    names = list(HOSTILE)
    htmls = [page(TW2_JSDELIVR, HOSTILE[n]) for n in names] + [NORMAL]
    results = dict(zip(names + ["normal"], pool.render(htmls)))
    for name in ("infinite-loop", "loop-after-load"):
        assert results[name].image is None and "timed out" in results[name].error
    for name in RENDERS + ("normal",):
        assert results[name].error is None, (name, results[name].error)
        assert is_red(results[name].image.getpixel((100, 100))), name
    huge = results["huge-page"]
    assert huge.error is None and huge.image.size == (1280, pool.max_height) and huge.page_height >= 100_000
    # the pool recovered: the contexts that hung were replaced and both workers render
    after = pool.render([NORMAL, NORMAL])
    assert all(r.error is None and is_red(r.image.getpixel((100, 100))) for r in after)
    assert pool.n_recycled >= 2


def test_one_page_never_affects_another():
    """Each normal page right after a hostile one in the same context (one worker), every
    hostile page that renders (a page that times out has its context closed) twice: every
    normal page renders, red where its box is. A finished page leaves for about:blank
    before its context serves another render, so its beforeunload veto, hung unload
    handlers, timers and popups cannot abort or stall the next page."""
    names = [n for n in HOSTILE if n in RENDERS or n == "huge-page"] * 2
    htmls = [h for n in names for h in (page(TW2_JSDELIVR, HOSTILE[n]), NORMAL)]
    with RenderPool(workers=1, timeout_s=6.0) as one:
        results = one.render(htmls)
    for name, normal in zip(names, results[1::2]):
        assert normal.error is None, (f"normal page after {name}", normal.error)
        assert is_red(normal.image.getpixel((100, 100))), f"normal page after {name}"
    for name, res in zip(names, results[0::2]):
        assert res.error is None, (name, res.error)


def test_render_is_thread_safe(pool):
    htmls = [page(TW2_JSDELIVR, f'<div class="bg-green-500 h-{8 * (i % 3 + 1)}">{i}</div>') for i in range(6)]
    with ThreadPoolExecutor(3) as ex:
        runs = list(ex.map(lambda h: pool.render([h])[0], htmls))
    serial = pool.render(htmls)
    assert all(r.error is None for r in runs + serial)
    assert [r.image.tobytes() for r in runs] == [r.image.tobytes() for r in serial]


@pytest.mark.parametrize("head", [TW2_JSDELIVR, TW_PLAY_CDN], ids=["css", "play-cdn-oklch"])
def test_extract_structure_reports_text_colours_and_layout(pool, head):
    html = page(head, '<header class="bg-blue-600 text-white p-4"><h1 class="text-3xl font-bold">Acme</h1></header>'
                              '<main class="p-8"><p class="text-gray-700">Welcome home</p><button class="bg-red-500">Buy</button></main>')
    (s,) = pool.extract_structure([html])
    texts = [b.get("text") for b in s["blocks"]]
    assert texts.index("Acme") < texts.index("Welcome home")
    h1 = next(b for b in s["blocks"] if b.get("text") == "Acme")
    assert h1["color"] == "#ffffff" and h1["font"] == "30px bold"
    r, g, b = (int(h1["bg"][i:i + 2], 16) for i in (1, 3, 5))  # blue-600: #2563eb in v2, oklch in v4
    assert b > 200 and r < 80 and g < 120
    assert any(b["tag"] == "button" and b["label"] == "Buy" for b in s["blocks"])


def _on_render_thread(pool, make_coro):
    return asyncio.run_coroutine_threadsafe(make_coro(), pool._loop).result(timeout=30)


def test_pool_recovers_from_renderer_and_browser_crashes(pool):
    pool.render([NORMAL])  # make sure the pool is started

    async def crash_renderer():  # a renderer process dies (as on out-of-memory)
        slot = pool._slots._queue[0]
        cdp = await slot.context.new_cdp_session(slot.page)
        try:
            await asyncio.wait_for(cdp.send("Page.crash"), 2)  # never answers: the renderer is gone
        except Exception:
            pass

    _on_render_thread(pool, crash_renderer)
    assert all(r.error is None for r in pool.render([NORMAL, NORMAL, NORMAL]))

    async def crash_browser():  # the whole browser dies
        cdp = await pool._browser.new_browser_cdp_session()
        try:
            await asyncio.wait_for(cdp.send("Browser.crash"), 2)
        except Exception:
            pass

    old = pool._browser
    _on_render_thread(pool, crash_browser)
    results = pool.render([NORMAL] * 3)
    assert pool._browser is not old
    assert all(r.error is None and is_red(r.image.getpixel((100, 100))) for r in results)


def test_a_browser_that_does_not_start_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("SWEET_CHROMIUM", "/bin/false")
    render_threads = lambda: {t for t in threading.enumerate() if t.name == "colbench-render"}  # noqa: E731
    before = render_threads()
    broken = RenderPool()
    with pytest.raises(RuntimeError, match="could not start chromium at '/bin/false'.*apt-get install chromium"):
        broken.render(["<p>x</p>"])
    assert render_threads() == before  # the render thread and the driver were stopped


def test_vendored_assets_are_small():
    total = sum(p.stat().st_size for p in tailwind.ASSETS.parent.rglob("*") if p.is_file())
    assert total < 5_000_000


def test_purged_stylesheet_renders_like_the_full_one(pool):
    body = ('<div class="container mx-auto md:flex space-x-4 p-4 group"><div class="w-full md:w-1/3 bg-indigo-600 '
            'text-white rounded-lg shadow-lg p-6 hover:bg-red-500"><h2 class="text-2xl font-bold tracking-wide">Hi</h2>'
            '<p class="mt-2 text-indigo-100 group-hover:text-white">text</p></div><button class="px-4 py-2 border-2 '
            'border-green-500 rounded-full focus:outline-none">Go</button><ul class="list-disc pl-8 divide-y">'
            '<li class="py-1">a</li><li class="py-1">b</li></ul></div>')
    full = f"<style>{tailwind.TAILWIND_CSS.read_text()}</style>"
    purged, unpurged = pool.render([page(TW2_JSDELIVR, body), page(full, body)])
    assert purged.error is None and unpurged.error is None
    assert purged.image.tobytes() == unpurged.image.tobytes()
