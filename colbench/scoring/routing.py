"""Request routing: what the renderer answers each request of a page with.

Tailwind from a CDN gets the vendored copy (colbench.scoring.tailwind); images get a
generated placeholder (colbench.scoring.placeholders); everything else is aborted,
localhost included, so renders never depend on, or reach, the network.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from colbench.scoring.placeholders import PLACEHOLDER_HOSTS, placeholder_png
from colbench.scoring.tailwind import is_tailwind_url, tailwind_css_for, tailwind_script


def route_request(url: str, resource_type: str, html: str = "") -> tuple[str, bytes] | None:
    """What to answer a page's request with: (content type, body), or None to abort.
    `html` is the page being rendered (the Tailwind v2 sheet is purged to it)."""
    parts = urlsplit(url)
    host, path = parts.hostname or "", parts.path
    if is_tailwind_url(url):
        if host == "cdn.tailwindcss.com" or "@tailwindcss/browser" in path:
            return "application/javascript", tailwind_script()
        if resource_type == "script" or path.endswith(".js"):
            return "application/javascript", tailwind_script()
        return "text/css", tailwind_css_for(html).encode()
    is_placeholder = any(host == h or host.endswith("." + h) for h in PLACEHOLDER_HOSTS)
    if resource_type == "image" or (is_placeholder and resource_type in ("other", "fetch", "xhr")):
        return "image/png", placeholder_png(url)
    return None
