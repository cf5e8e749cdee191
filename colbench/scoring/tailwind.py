"""Tailwind without the network: the vendored stylesheets and scripts in
`colbench/vendor/tailwind/`, and the purge that keeps a page's stylesheet small.

- `<link>`s to jsDelivr/unpkg get npm's prebuilt `tailwindcss@2.2.19` stylesheet,
  purged per page to the classes the page's text contains (`tailwind_css_for`), as
  Tailwind's production build does: identical renders, without shipping and parsing
  2.9 MB per page.
- The Play CDN (`cdn.tailwindcss.com`) gets npm's `@tailwindcss/browser` (v4) script
  (v3 there: a few utilities differ, e.g. colours are v4's oklch palette).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

ASSETS = Path(__file__).resolve().parent.parent / "vendor" / "tailwind"
TAILWIND_CSS = ASSETS / "tailwind-2.2.19.min.css"
TAILWIND_BROWSER_JS = ASSETS / "tailwindcss-browser-4.3.4.js"


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
def tailwind_rules() -> tuple[list[_CssRule], dict[str, list[int]]]:
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
    rules, index = tailwind_rules()
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


@lru_cache(maxsize=2)
def _asset(path: Path) -> bytes:
    return path.read_bytes()


def tailwind_script() -> bytes:
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
