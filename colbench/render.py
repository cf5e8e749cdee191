"""Offline, repeatable HTML rendering in headless Chromium, with a pool of contexts.

    from colbench.render import RenderPool
    with RenderPool(workers=2) as pool:
        [res] = pool.render(["<html>...</html>"], out_paths=[Path("page.png")])
        res.image, res.png_path, res.error

Untrusted HTML never runs in our process: it runs in Debian's chromium
(`/usr/bin/chromium`, or `$SWEET_CHROMIUM`) driven by Playwright, which we never let
download a browser. Every request the page makes is intercepted:

- Tailwind from a CDN is served from vendored copies in `colbench/assets/tailwind/`,
  so renders do not depend on the network: npm's prebuilt `tailwindcss@2.2.19`
  stylesheet for `<link>`s to jsDelivr/unpkg (purged per page to the classes the
  page's text contains, as Tailwind's production build does: identical renders,
  without shipping and parsing 2.9 MB per page), and npm's `@tailwindcss/browser`
  (v4) script for the Play CDN `cdn.tailwindcss.com` (v3 there: a few utilities
  differ, e.g. colours are v4's oklch palette).
- Images (placeholder photo services, or any image request) are generated here at
  the size the URL asks for, deterministically from the URL.
- Everything else is aborted, localhost included; a dead proxy catches anything the
  interception could miss (defence in depth).

Renders are repeatable: fixed viewport, scale 1, light scheme, UTC, animations off,
`Math.random` seeded, storage cleared between pages. Hostile pages (infinite loops,
dialogs, navigation away, popups, 100k-px pages) render or fail within `timeout_s`:
the page's own navigations are cancelled in the page (Navigation API; a 204 answer
at the network as backup), dialogs and `window.open` are stubbed, screenshots are
clipped at `max_height`, and a context that timed out or crashed is closed (killing
its renderer) and replaced, so the pool never stalls.

Playwright's API is not thread-safe: the browser lives on one dedicated thread with
its own asyncio loop, and `render` (callable from any thread) submits work to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import threading
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence
from urllib.parse import parse_qs, urlsplit

from PIL import Image

ASSETS = Path(__file__).parent / "assets" / "tailwind"
TAILWIND_CSS = ASSETS / "tailwind-2.2.19.min.css"
TAILWIND_BROWSER_JS = ASSETS / "tailwindcss-browser-4.3.4.js"

DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
    "--mute-audio",
    "--font-render-hinting=none",
    # Defence in depth: a request that escapes interception goes to a dead proxy
    # (loopback included, hence <-loopback>) instead of the network.
    "--proxy-server=http://127.0.0.1:1",
    "--proxy-bypass-list=<-loopback>",
)

# The page itself is served from this origin (a reserved TLD that never resolves).
PAGE_URL = "http://colbench.invalid/"

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

# Runs first in every document: seeded Math.random, fresh storage, no navigation away,
# no popups or dialogs.
INIT_SCRIPT = """
(() => {
  let s = 0x2545F491;
  Math.random = function () {
    s = (s + 0x6D2B79F5) | 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  try { localStorage.clear(); sessionStorage.clear(); } catch (e) {}
  window.name = "";
  // Cancel the page's own navigations (location = ..., reload, form submits) in the
  // page: a navigation cancelled later, at the network, can leave it never painting.
  if (window.navigation) navigation.addEventListener("navigate", e => { if (e.cancelable) e.preventDefault(); });
  window.open = () => null;
  window.alert = () => undefined;
  window.confirm = () => false;
  window.prompt = () => null;
  window.print = () => undefined;
})();
"""

# Resolves once the page is loaded and its layout stable: fonts ready and the style
# rule count unchanged across a frame (the Tailwind browser script builds its
# stylesheet asynchronously after DOM changes). Playwright's own "load" wait is not
# used: it never fires when the page starts a navigation we then cancel.
SETTLE_JS = """
async () => {
  const frame = () => new Promise(r => requestAnimationFrame(() => r()));
  const rules = () => Array.from(document.styleSheets).reduce((a, s) => {
    try { return a + s.cssRules.length; } catch (e) { return a; } }, 0);
  let last = -1;
  for (let i = 0; i < 600; i++) {
    await frame();
    if (document.readyState !== "complete") continue;
    try { await document.fonts.ready; } catch (e) {}
    const n = rules();
    if (n === last) break;
    last = n;
  }
}
"""
PAGE_HEIGHT_JS = """() => {
  const d = document.documentElement, b = document.body;
  return Math.max(d ? d.scrollHeight : 0, b ? b.scrollHeight : 0, 1);
}"""

# The visible structure of a page, for simulators without vision.
STRUCTURE_JS_PATH = Path(__file__).parent / "assets" / "structure.js"


class ChromiumNotFound(RuntimeError):
    """The chromium executable is missing."""


@dataclass
class RenderResult:
    """One render. `image` is None when rendering failed (then `error` says why).

    image:       RGB screenshot, `viewport_width` wide, at most `max_height` tall.
    png_path:    where the PNG was written, when an output path was given.
    page_height: the page's full height in CSS px before clipping.
    """

    image: Image.Image | None
    png_path: Path | None = None
    error: str | None = None
    page_height: int = 0

    @property
    def ok(self) -> bool:
        return self.image is not None


def chromium_path() -> str:
    """The chromium executable: $SWEET_CHROMIUM or /usr/bin/chromium; clear error if absent."""
    path = os.environ.get("SWEET_CHROMIUM", DEFAULT_CHROMIUM)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ChromiumNotFound(
            f"chromium not found at {path!r}: install it with `apt-get install chromium` "
            "(Debian's package; Playwright's own browser download does not work offline) or point $SWEET_CHROMIUM at a chromium binary"
        )
    return path


# ---------------------------------------------------------------- placeholder images


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


# ---------------------------------------------------------------- Tailwind v2 stylesheet

# Tailwind v2's purge extractors: every string in the page that could be a class name.
_BROAD_TOKENS = re.compile(r"[^<>\"'`\s]*[^<>\"'`\s:]")
_INNER_TOKENS = re.compile(r"[^<>\"'`\s.(){}\[\]#=%]*[^<>\"'`\s.(){}\[\]#=%:]")
_CLASS_IN_SELECTOR = re.compile(r"\.((?:\\[0-9a-fA-F]{1,6}\s?|\\[^0-9a-fA-F]|[\w-])+)")
_CSS_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_CSS_ESCAPE = re.compile(r"\\([0-9a-fA-F]{1,6})\s?|\\(.)")


def _unescape(ident: str) -> str:
    return _CSS_ESCAPE.sub(lambda m: chr(int(m[1], 16)) if m[1] else m[2], ident)


def _css_blocks(text: str, start: int, end: int):
    """Top-level `prelude{body}` blocks of CSS text[start:end], skipping comments and
    strings: yields (prelude without comments, body_start, body_end)."""
    i, prelude_start = start, start
    while i < end:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = end if j < 0 else j + 2
        elif c in "\"'":
            j = text.find(c, i + 1)
            i = end if j < 0 else j + 1
        elif c == "{":
            depth, j = 1, i + 1
            while j < end and depth:
                if text[j] in "\"'":
                    j = (text.find(text[j], j + 1) + 1) or end
                    continue
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            yield _CSS_COMMENT.sub("", text[prelude_start:i]).strip(), i + 1, j - 1
            i = prelude_start = j
        else:
            i += 1


@dataclass(frozen=True)
class _CssRule:
    media: str | None  # the enclosing @media prelude, if any
    text: str  # "selector{body}" or a whole @keyframes block
    alternatives: tuple[frozenset[str], ...]  # class names each comma-separated selector needs


@lru_cache(maxsize=1)
def _tailwind_rules() -> tuple[list[_CssRule], dict[str, list[int]]]:
    """The vendored stylesheet as rules, with an index class name -> rule ids."""
    css = TAILWIND_CSS.read_text()
    rules: list[_CssRule] = []

    def alternatives(prelude: str, b0: int, b1: int) -> tuple[frozenset[str], ...]:
        if prelude.startswith("@media"):  # nested (.container): needed if any inner rule is
            return tuple(a for p, i0, i1 in _css_blocks(css, b0, b1) for a in alternatives(p, i0, i1))
        if prelude.startswith("@"):
            return (frozenset(),)
        return tuple(frozenset(_unescape(c) for c in _CLASS_IN_SELECTOR.findall(sel)) for sel in prelude.split(","))

    def add(media: str | None, prelude: str, b0: int, b1: int) -> None:
        rules.append(_CssRule(media, f"{prelude}{{{css[b0:b1]}}}", alternatives(prelude, b0, b1)))

    for prelude, b0, b1 in _css_blocks(css, 0, len(css)):
        if prelude.startswith("@media"):
            for inner, i0, i1 in _css_blocks(css, b0, b1):
                add(prelude, inner, i0, i1)
        else:  # a plain rule, or @keyframes (always kept: a few hundred bytes)
            add(None, prelude, b0, b1)
    index: dict[str, list[int]] = {}
    for i, rule in enumerate(rules):
        for cls in set().union(*rule.alternatives):
            index.setdefault(cls, []).append(i)
    return rules, index


def tailwind_css_for(html: str) -> str:
    """The vendored Tailwind 2.2.19 stylesheet purged to the rules `html` can use.

    The same purge Tailwind's production build does: a rule is kept unless one of its
    classes appears nowhere in the page's text (the page's own scripts included), so
    it could not match. Renders are identical to the full 2.9 MB sheet, which costs
    ~0.5 s per page to ship through the DevTools pipe and parse.
    """
    rules, index = _tailwind_rules()
    tokens = set(_BROAD_TOKENS.findall(html)) | set(_INNER_TOKENS.findall(html))
    keep = {i for i, r in enumerate(rules) if any(not alt for alt in r.alternatives)}
    for cls in tokens & index.keys():
        for i in index[cls]:
            if i not in keep and any(alt <= tokens for alt in rules[i].alternatives):
                keep.add(i)
    out: list[str] = ["/*! tailwindcss v2.2.19 | MIT License | https://tailwindcss.com */"]
    media: str | None = None
    for i in sorted(keep):
        rule = rules[i]
        if rule.media != media:
            if media is not None:
                out.append("}")
            if rule.media is not None:
                out.append(rule.media + "{")
            media = rule.media
        out.append(rule.text)
    if media is not None:
        out.append("}")
    return "".join(out)


# ---------------------------------------------------------------- request routing


@lru_cache(maxsize=2)
def _asset(path: Path) -> bytes:
    return path.read_bytes()


def _tailwind_script() -> bytes:
    # Pages written for the v3 Play CDN set `tailwind.config = {...}`; define the global
    # so that line does not throw (the v4 browser build reads its config from CSS).
    return b"window.tailwind = window.tailwind || {config: {}};\n" + _asset(TAILWIND_BROWSER_JS)


def is_tailwind_url(url: str) -> bool:
    parts = urlsplit(url)
    host, path = parts.hostname or "", parts.path
    if host == "cdn.tailwindcss.com":
        return True
    if host in ("cdn.jsdelivr.net", "unpkg.com"):
        return bool(re.match(r"^/(npm/)?(@tailwindcss/browser|tailwindcss)(@|/|$)", path))
    return False


def route_request(url: str, resource_type: str, html: str = "") -> tuple[str, bytes] | None:
    """What to answer a page's request with: (content type, body), or None to abort.
    `html` is the page being rendered (the Tailwind v2 sheet is purged to it)."""
    parts = urlsplit(url)
    host, path = parts.hostname or "", parts.path
    if is_tailwind_url(url):
        if host == "cdn.tailwindcss.com" or "@tailwindcss/browser" in path:
            return "application/javascript", _tailwind_script()
        if resource_type == "script" or path.endswith(".js"):
            return "application/javascript", _tailwind_script()
        return "text/css", tailwind_css_for(html).encode()
    is_placeholder = any(host == h or host.endswith("." + h) for h in PLACEHOLDER_HOSTS)
    if resource_type == "image" or (is_placeholder and resource_type in ("other", "fetch", "xhr")):
        return "image/png", placeholder_png(url)
    return None


# ---------------------------------------------------------------- the pool


@dataclass
class _Slot:
    """A browser context with its one page, and the HTML that page is serving.

    The page is reused across renders (a new page costs a renderer process start);
    after a timeout or crash the whole context is closed, which kills its renderer.
    """

    context: Any  # None: a dead slot, replaced before its next use
    page: Any
    browser: Any = None  # the browser the context belongs to
    html: str = ""
    served: bool = False
    crashed: bool = False  # its renderer died (set by the page's "crash" event)


class RenderPool:
    """One chromium, `workers` reusable browser contexts, renders from any thread.

    workers:         contexts rendering at once.
    viewport_width:  screenshot width in CSS px (device scale 1).
    viewport_height: the viewport's height (what `100vh` means).
    timeout_s:       budget per page, load to screenshot; past it the page fails.
    max_height:      screenshots are clipped to this height.
    """

    def __init__(
        self,
        workers: int = 2,
        viewport_width: int = 1280,
        viewport_height: int = 800,
        timeout_s: float = 10.0,
        max_height: int = 8000,
    ) -> None:
        if workers < 1:
            raise ValueError(f"RenderPool.workers must be >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"RenderPool.timeout_s must be > 0, got {timeout_s}")
        self.workers = workers
        self.viewport = {"width": int(viewport_width), "height": int(viewport_height)}
        self.timeout_s = float(timeout_s)
        self.max_height = int(max_height)
        self.max_structure_items = 80  # blocks per page in extract_structure
        self.executable = chromium_path()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pw: Any = None
        self._browser: Any = None
        self._slots: asyncio.Queue[_Slot] | None = None
        self._restart_lock: asyncio.Lock | None = None
        self._closed = False
        self.n_recycled = 0  # contexts thrown away after a timeout or crash
        self._waiting = 0  # renders waiting for a free context (render thread only)
        # What the finalizer needs to stop the thread, without holding a reference to self
        # (so a pool that is garbage-collected or alive at exit still closes chromium).
        self._state: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, RenderPool._shutdown, self._state)

    # ---- public API

    def render(self, htmls: Sequence[str], out_paths: Sequence[Path | str] | None = None) -> list[RenderResult]:
        """Screenshot each page (full page at the fixed width, clipped at max_height).

        Results come back in order; a page that fails or times out gets
        `image=None` and `error`, never an exception. PNGs are written to
        `out_paths[i]` when given (parent folders are created).
        """
        if out_paths is not None and len(out_paths) != len(htmls):
            raise ValueError(f"render: {len(htmls)} pages but {len(out_paths)} out_paths")
        paths = [Path(p) if p is not None else None for p in (out_paths or [None] * len(htmls))]
        pngs = self._run_all(htmls, self._screenshot)
        results = []
        for (value, error), path in zip(pngs, paths):
            if error is not None:
                results.append(RenderResult(None, None, error))
                continue
            png, height = value
            image = Image.open(io.BytesIO(png)).convert("RGB")
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(png)
            results.append(RenderResult(image, path, None, height))
        return results

    def extract_structure(self, htmls: Sequence[str]) -> list[dict[str, Any]]:
        """The visible structure of each page, from the DOM after layout (see
        `colbench/assets/structure.js`): page size and background, then visible
        blocks in reading order with their box, text, colours and image sizes.
        A page that fails gives {"error": "..."}."""
        out = self._run_all(htmls, self._structure)
        return [value if error is None else {"error": error} for value, error in out]

    def close(self) -> None:
        """Close the browser and stop the rendering thread (idempotent)."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> "RenderPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- thread + loop plumbing

    @staticmethod
    def _shutdown(state: dict[str, Any]) -> None:
        loop, thread = state.get("loop"), state.get("thread")
        if loop is None or thread is None:
            return
        state["loop"] = None
        if loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_stop_playwright(state), loop).result(timeout=20)
            except Exception:
                pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=15)

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("RenderPool is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="colbench-render", daemon=True)
                thread.start()
                try:
                    asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout=90)
                except BaseException as e:  # leave no driver or browser behind
                    self._state.update(loop=loop, thread=thread)
                    RenderPool._shutdown(self._state)
                    self._state.clear()
                    if isinstance(e, Exception):
                        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                        raise RuntimeError(f"could not start chromium at {self.executable!r} ({first}); a working "
                                           "Debian chromium is needed: `apt-get install chromium`") from e
                    raise
                self._loop, self._thread = loop, thread
                self._state.update(loop=loop, thread=thread)
            return self._loop

    def _run_all(self, htmls: Sequence[str], action: Callable[[Any], Awaitable[Any]]) -> list[tuple[Any, str | None]]:
        if not htmls:
            return []
        loop = self._ensure_started()
        fut = asyncio.run_coroutine_threadsafe(self._gather(list(htmls), action), loop)
        # Each page is bounded by timeout_s plus recycling; this bound only guards bugs.
        budget = (len(htmls) / self.workers + 1) * (self.timeout_s + 30) + 60
        return fut.result(timeout=budget)

    # ---- async side (runs on the render thread only)

    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        # Index the Tailwind sheet (~1 s, once per process) while chromium starts, so
        # no page's time budget pays for it.
        indexing = asyncio.get_running_loop().run_in_executor(None, _tailwind_rules)
        self._pw = await async_playwright().start()
        self._state["pw"] = self._pw
        self._restart_lock = asyncio.Lock()
        await self._launch()
        await indexing
        self._slots = asyncio.Queue()
        for _ in range(self.workers):
            self._slots.put_nowait(await self._new_slot())

    async def _launch(self) -> None:
        self._browser = await self._pw.chromium.launch(
            executable_path=self.executable, args=list(CHROMIUM_ARGS), headless=True, timeout=60_000
        )
        self._state["browser"] = self._browser

    async def _new_slot(self) -> _Slot:
        if not self._browser.is_connected():
            await self._restart_browser()
        context = await self._browser.new_context(
            viewport=self.viewport,
            device_scale_factor=1,
            java_script_enabled=True,
            service_workers="block",
            accept_downloads=False,
            color_scheme="light",
            reduced_motion="reduce",
            locale="en-US",
            timezone_id="UTC",
        )
        context.set_default_timeout(self.timeout_s * 1000)
        await context.add_init_script(INIT_SCRIPT)
        page = await context.new_page()
        slot = _Slot(context, page, self._browser)
        await context.route("**/*", lambda route: self._route(slot, route))
        # WebSockets bypass HTTP routing: refuse them all.
        await context.route_web_socket("**/*", lambda ws: asyncio.ensure_future(_quietly(ws.close())))
        page.on("crash", lambda _: setattr(slot, "crashed", True))
        page.on("dialog", lambda d: asyncio.ensure_future(_quietly(d.dismiss())))
        # window.open is stubbed, but a target=_blank link clicked by a script still opens one.
        page.on("popup", lambda p: asyncio.ensure_future(_quietly(p.close(run_before_unload=False))))
        return slot

    async def _restart_browser(self, broken: Any = None) -> None:
        """Launch a new browser if the current one died, or is `broken` (hung); once,
        however many slots ask at the same time."""
        async with self._restart_lock:
            if self._browser.is_connected() and self._browser is not broken:
                return
            await _quietly(self._browser.close(), 5)  # Playwright kills it if it does not close
            await self._launch()

    async def _route(self, slot: _Slot, route: Any) -> None:
        request = route.request
        url = request.url
        try:
            if request.is_navigation_request():
                # Serve our page once, to our own top-level navigation; the page's own
                # navigations (location = ..., reloads, form posts, iframes) are refused.
                if url == PAGE_URL and not slot.served and request.frame.parent_frame is None:
                    slot.served = True
                    await route.fulfill(status=200, content_type="text/html; charset=utf-8", body=slot.html)
                else:  # 204 cancels a navigation and keeps the current document (an abort
                    await route.fulfill(status=204)  # would replace it with an error page)
                return
            answer = route_request(url, request.resource_type, slot.html)
            if answer is None:
                await route.abort("blockedbyclient")
            else:
                await route.fulfill(status=200, content_type=answer[0], body=answer[1])
        except Exception:
            pass  # the page went away mid-request

    async def _gather(self, htmls: list[str], action: Callable[[Any], Awaitable[Any]]) -> list[tuple[Any, str | None]]:
        return await asyncio.gather(*(self._one(html, action) for html in htmls))

    async def _one(self, html: str, action: Callable[[Any], Awaitable[Any]]) -> tuple[Any, str | None]:
        self._waiting += 1
        try:
            slot = await self._slots.get()
        finally:
            self._waiting -= 1
        healthy = False
        try:
            if (slot.context is None or slot.crashed or slot.browser is not self._browser
                    or not self._browser.is_connected()):
                slot = await self._replace(slot)  # its renderer or the browser died since
            slot.html, slot.served = html, False
            result = await asyncio.wait_for(self._load_and(slot.page, action), self.timeout_s)
            healthy = True
            return result, None
        except asyncio.TimeoutError:
            return None, f"render timed out after {self.timeout_s:g}s"
        except Exception as e:  # crashed page or browser: report, recycle
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return None, f"render failed: {type(e).__name__}: {first_line}"
        finally:
            self._slots.put_nowait(await self._release(slot, healthy))

    async def _load_and(self, page: Any, action: Callable[[Any], Awaitable[Any]]) -> Any:
        await page.goto(PAGE_URL, wait_until="commit")
        await page.evaluate(SETTLE_JS)
        return await action(page)

    async def _screenshot(self, page: Any) -> tuple[bytes, int]:
        height = int(await page.evaluate(PAGE_HEIGHT_JS))
        clip = {"x": 0, "y": 0, "width": self.viewport["width"], "height": min(max(height, 1), self.max_height)}
        png = await page.screenshot(type="png", full_page=True, clip=clip, animations="disabled", caret="hide")
        return png, height

    async def _structure(self, page: Any) -> dict[str, Any]:
        return await page.evaluate(_structure_js(), {"maxItems": self.max_structure_items})

    async def _release(self, slot: _Slot, healthy: bool) -> _Slot:
        """Park a healthy slot on about:blank (stops the page's timers); after a failure,
        replace it. Never raises: a slot that cannot be replaced now is handed back
        dead and replaced before its next use, so the pool never loses a worker."""
        slot.html = ""
        if healthy:
            try:
                await asyncio.wait_for(slot.context.clear_cookies(), 5)
                if not self._waiting:  # else the next render replaces the page right away
                    await asyncio.wait_for(slot.page.goto("about:blank"), 5)
                return slot
            except Exception:
                pass
        try:
            return await self._replace(slot)
        except Exception:
            return _Slot(None, None)

    async def _replace(self, slot: _Slot) -> _Slot:
        """Close a slot's context (killing its renderer, hung or not) and open a new one,
        restarting the browser if it died or hangs."""
        self.n_recycled += 1
        if slot.context is not None and slot.browser is self._browser and self._browser.is_connected():
            if not await _quietly(slot.context.close(), 5):
                await self._restart_browser(broken=slot.browser)  # the browser itself is stuck
        for attempt in range(3):
            browser = self._browser
            try:
                return await asyncio.wait_for(self._new_slot(), 30)
            except Exception:
                if attempt == 2:
                    raise
                await self._restart_browser(broken=browser)
        raise AssertionError("unreachable")


@lru_cache(maxsize=1)
def _structure_js() -> str:
    return STRUCTURE_JS_PATH.read_text()


async def _quietly(awaitable: Awaitable[Any], timeout: float = 10) -> bool:
    """Await with a timeout, swallowing errors (for cleanup); True if it completed."""
    try:
        await asyncio.wait_for(awaitable, timeout)
        return True
    except Exception:
        return False


async def _stop_playwright(state: dict[str, Any]) -> None:
    """Close the browser, then the Playwright driver (which kills anything left)."""
    if state.get("browser") is not None:
        await _quietly(state["browser"].close(), 10)
    if state.get("pw") is not None:
        await _quietly(state["pw"].stop(), 10)


def render_one(html: str, out_path: Path | str | None = None, **pool_kwargs: Any) -> RenderResult:
    """Render a single page with a throwaway pool (convenience; use a RenderPool for many)."""
    with RenderPool(workers=1, **pool_kwargs) as pool:
        return pool.render([html], [out_path] if out_path is not None else None)[0]

