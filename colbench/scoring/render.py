"""Offline, repeatable HTML rendering in headless Chromium, with a pool of contexts.

    from colbench.scoring.render import RenderPool, RenderCache
    with RenderPool(workers=2) as pool:
        [res] = pool.render(["<html>...</html>"], out_paths=[Path("page.png")])
        res.image, res.png_path, res.error
    cache = RenderCache("runs/x/renders")     # by content: each distinct page rendered once
    [res] = cache.render(["<html>...</html>"])

Untrusted HTML never runs in our process: it runs in Debian's chromium
(`/usr/bin/chromium`, or `$SWEET_CHROMIUM`) driven by Playwright, which we never let
download a browser. Every request the page makes is intercepted and answered by
`colbench.scoring.routing` (vendored Tailwind, generated placeholder images);
everything else is aborted, localhost included, and a dead proxy catches anything
the interception could miss (defence in depth).

Renders are repeatable: fixed viewport, scale 1, light scheme, UTC, animations off,
`Math.random` seeded, storage cleared between pages. Hostile pages (infinite loops,
dialogs, navigation away, popups, 100k-px pages) render or fail within `timeout_s`:
the page's own navigations are cancelled in the page (Navigation API; a 204 answer
at the network as backup), dialogs and `window.open` are stubbed, screenshots are
clipped at `max_height`, and a context that timed out or crashed is closed (killing
its renderer) and replaced, so the pool never stalls. One page never affects another:
a finished page leaves for about:blank (a beforeunload prompt is accepted) before its
context serves the next render, and a page that will not leave in LEAVE_TIMEOUT_S (an
unload handler that hangs) has its context replaced instead.

Playwright's API is not thread-safe: the browser lives on one dedicated thread with
its own asyncio loop, and `render` (callable from any thread) submits work to it.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from PIL import Image

from colbench.io import atomic_write
from colbench.scoring.routing import route_request
from colbench.scoring.tailwind import tailwind_rules

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
# How long a finished page may take to unload (leave for about:blank) before its context
# is replaced instead.
LEAVE_TIMEOUT_S = 2.0  # normally milliseconds; a false timeout only costs a new context

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
STRUCTURE_JS_PATH = Path(__file__).resolve().parent.parent / "assets" / "structure.js"


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


class RenderCache:
    """Screenshots by content: each distinct HTML is rendered once, by a RenderPool started
    on the first page not already there, and its PNG kept as `folder/<sha256[:20]>.png`;
    later calls (and later runs with the same folder) read it back instead of rendering.
    A failed render is remembered for this object's life only (a later run retries it).

    `rendered` counts the pages actually rendered (what a cache hit saves).
    """

    def __init__(self, folder: str | Path, pool: "RenderPool | None" = None, **pool_options: Any) -> None:
        self.folder = Path(folder)
        self._pool, self._own_pool, self._options = pool, pool is None, pool_options
        self._memory: dict[str, RenderResult] = {}
        self._lock = threading.Lock()
        self.rendered = 0

    @staticmethod
    def key(html: str) -> str:
        import hashlib

        return hashlib.sha256(html.encode("utf-8", "replace")).hexdigest()[:20]

    def render(self, htmls: Sequence[str]) -> list[RenderResult]:
        """One RenderResult per page, in order; the distinct pages not cached are rendered in one batch."""
        keys = [self.key(h) for h in htmls]
        with self._lock:
            missing: dict[str, str] = {}
            for k, html in zip(keys, htmls):
                if k in self._memory or k in missing:
                    continue
                path = self.folder / f"{k}.png"
                if path.exists():
                    image = Image.open(path).convert("RGB")
                    self._memory[k] = RenderResult(image, path)
                else:
                    missing[k] = html
            if missing:
                if self._pool is None:
                    self._pool = RenderPool(**self._options)
                results = self._pool.render(list(missing.values()), [self.folder / f"{k}.png" for k in missing])
                self.rendered += len(missing)
                self._memory.update(zip(missing, results))
            return [self._memory[k] for k in keys]

    def close(self) -> None:
        """Close the pool this cache started (a pool passed in belongs to its owner)."""
        if self._pool is not None and self._own_pool:
            self._pool.close()
        self._pool = None


def chromium_path() -> str:
    """The chromium executable: $SWEET_CHROMIUM or /usr/bin/chromium; clear error if absent."""
    path = os.environ.get("SWEET_CHROMIUM", DEFAULT_CHROMIUM)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ChromiumNotFound(
            f"chromium not found at {path!r}: install it with `apt-get install chromium` "
            "(Debian's package; Playwright's own browser download does not work offline) or point $SWEET_CHROMIUM at a chromium binary"
        )
    return path


# ---------------------------------------------------------------- Tailwind v2 stylesheet

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
        # What the finalizer needs to stop the thread, without holding a reference to self
        # (so a pool that is garbage-collected or alive at exit still closes chromium).
        self._state: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, RenderPool._shutdown, self._state)

    # ---- public API

    def render(self, htmls: Sequence[str], out_paths: Sequence[Path | str] | None = None,
               timeout_s: float | None = None) -> list[RenderResult]:
        """Screenshot each page (full page at the fixed width, clipped at max_height).

        Results come back in order; a page that fails or times out gets
        `image=None` and `error`, never an exception. PNGs are written to
        `out_paths[i]` when given (parent folders are created). `timeout_s`: this call's
        budget per page (default the pool's `timeout_s`).
        """
        if out_paths is not None and len(out_paths) != len(htmls):
            raise ValueError(f"render: {len(htmls)} pages but {len(out_paths)} out_paths")
        paths = [Path(p) if p is not None else None for p in (out_paths or [None] * len(htmls))]
        pngs = self._run_all(htmls, self._screenshot, timeout_s)
        results = []
        for (value, error), path in zip(pngs, paths):
            if error is not None:
                results.append(RenderResult(None, None, error))
                continue
            png, height = value
            image = Image.open(io.BytesIO(png)).convert("RGB")
            if path is not None:
                atomic_write(path, png, fsync=False)
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

    def _run_all(self, htmls: Sequence[str], action: Callable[[Any], Awaitable[Any]],
                 timeout_s: float | None = None) -> list[tuple[Any, str | None]]:
        if not htmls:
            return []
        timeout = float(timeout_s) if timeout_s else self.timeout_s
        loop = self._ensure_started()
        fut = asyncio.run_coroutine_threadsafe(self._gather(list(htmls), action, timeout), loop)
        # Each page is bounded by its timeout plus recycling; this bound only guards bugs.
        budget = (len(htmls) / self.workers + 1) * (timeout + 30) + 60
        return fut.result(timeout=budget)

    # ---- async side (runs on the render thread only)

    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        # Index the Tailwind sheet (~1 s, once per process) while chromium starts, so
        # no page's time budget pays for it.
        indexing = asyncio.get_running_loop().run_in_executor(None, tailwind_rules)
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
        page.on("dialog", lambda d: asyncio.ensure_future(_quietly(_answer_dialog(d))))
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
                if url == PAGE_URL and not slot.served and request.frame == slot.page.main_frame:
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

    async def _gather(self, htmls: list[str], action: Callable[[Any], Awaitable[Any]],
                      timeout: float) -> list[tuple[Any, str | None]]:
        return await asyncio.gather(*(self._one(html, action, timeout) for html in htmls))

    async def _one(self, html: str, action: Callable[[Any], Awaitable[Any]], timeout: float) -> tuple[Any, str | None]:
        slot = await self._slots.get()
        healthy = False
        try:
            if (slot.context is None or slot.crashed or slot.browser is not self._browser
                    or not self._browser.is_connected()):
                slot = await self._replace(slot)  # its renderer or the browser died since
            slot.html, slot.served = html, False
            slot.page.set_default_timeout(timeout * 1000)  # Playwright's own waits: this render's budget
            result = await asyncio.wait_for(self._load_and(slot.page, action), timeout)
            healthy = True
            return result, None
        except asyncio.TimeoutError:
            return None, f"render timed out after {timeout:g}s"
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
        """Leave the page for about:blank (its document unloads, its timers stop) before the
        slot is handed to another render; after a failure, or when the page does not leave
        within LEAVE_TIMEOUT_S, replace the context. So one page never affects another's
        render: what a page leaves behind costs its own slot's time, before the next render
        starts. Never raises: a slot that cannot be replaced now is handed back dead and
        replaced before its next use, so the pool never loses a worker."""
        slot.html = ""
        if healthy:
            try:
                await asyncio.wait_for(slot.context.clear_cookies(), 5)
                # Always, even with renders waiting: the next render must not start from this
                # page's document, whose beforeunload, pagehide and unload handlers would run
                # during (and could veto or hang) the next render's navigation.
                await asyncio.wait_for(slot.page.goto("about:blank"), LEAVE_TIMEOUT_S)
                return slot
            except Exception:
                pass  # it would not leave (hung in an unload handler, ...): replace the context
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


async def _answer_dialog(dialog: Any) -> None:
    """Dialogs never block a render: alert/confirm/prompt are dismissed; a beforeunload
    prompt is accepted, so a page cannot veto leaving it (its slot's next navigation)."""
    if dialog.type == "beforeunload":
        await dialog.accept()
    else:
        await dialog.dismiss()


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
