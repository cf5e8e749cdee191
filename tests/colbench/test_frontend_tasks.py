"""The bundled frontend task sets (tasks/frontend/{train,test}.jsonl) are well formed.

Each row is a WebSight-v0.2-style task written for this project: a vague website idea
(`problem_description`) and a complete Tailwind HTML page (`ground_truth`) that loads
Tailwind from a CDN and uses placeholder images, which the offline renderer intercepts.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

FRONTEND_DIR = Path(__file__).resolve().parents[2] / "tasks" / "frontend"
SPLITS = ("train", "test")
FIELDS = {"task_id", "problem_description", "ground_truth"}
TAILWIND_CDN = (
    '<script src="https://cdn.tailwindcss.com"></script>',
    '<link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">',
)
PLACEHOLDER_IMAGE = re.compile(
    r"https://(picsum\.photos/seed/[\w-]+/\d+/\d+|source\.unsplash\.com/random/\d+x\d+/\?[\w,]+)"
)
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


def _rows(split: str) -> list[tuple[int, dict]]:
    """(line number, decoded row) for every non-empty line; a bad line fails with file:line."""
    path = FRONTEND_DIR / f"{split}.jsonl"
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
            pytest.fail(f"{path}:{lineno}: not JSON: {e}")
    return rows


class _TagBalance(HTMLParser):
    """Records the first mismatched closing tag and any tag left open."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID_TAGS:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> at line {self.getpos()[0]} closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()


@pytest.mark.parametrize("split", SPLITS)
def test_rows_have_fields_and_ids(split):
    rows = _rows(split)
    assert rows, f"{split}.jsonl is empty"
    for i, (lineno, row) in enumerate(rows, 1):
        where = f"{split}.jsonl:{lineno}"
        assert set(row) == FIELDS, f"{where}: fields {sorted(row)}"
        assert row["task_id"] == f"frontend-{split}-{i:04d}", where
        n_sentences = len(re.findall(r"[.!?](\s|$)", row["problem_description"]))
        assert 1 <= n_sentences <= 3 and 40 <= len(row["problem_description"]) <= 300, where


def test_split_sizes_ids_unique_and_disjoint():
    train, test = ([r for _, r in _rows(s)] for s in SPLITS)
    assert len(train) >= 22 and len(test) >= 10 and len(train) + len(test) >= 32
    ids = [r["task_id"] for r in train + test]
    assert len(ids) == len(set(ids))
    # Disjoint in content too: no page or description appears in both splits.
    assert not {r["ground_truth"] for r in train} & {r["ground_truth"] for r in test}
    assert not {r["problem_description"] for r in train} & {r["problem_description"] for r in test}


@pytest.mark.parametrize("split", SPLITS)
def test_ground_truth_is_full_tailwind_document(split):
    for lineno, row in _rows(split):
        html, where = row["ground_truth"], f"{split}.jsonl:{lineno}"
        assert html.startswith("<!DOCTYPE html>"), where
        assert html.rstrip().endswith("</html>"), where
        for tag in ("<html", "<head>", "<title>", "<body", "</body>"):
            assert tag in html, f"{where}: no {tag}"
        assert sum(cdn in html for cdn in TAILWIND_CDN) == 1, f"{where}: Tailwind must load from exactly one CDN"
        # Every image is a placeholder the renderer can synthesise (pricing pages may have none).
        for src in re.findall(r'<img[^>]*\ssrc="([^"]+)"|url\(\'([^\']+)\'\)', html):
            url = src[0] or src[1]
            assert PLACEHOLDER_IMAGE.fullmatch(url), f"{where}: image {url!r} is not a placeholder"
        assert 40 <= html.count("\n") <= 120, f"{where}: {html.count(chr(10))} lines"
        parser = _TagBalance()
        parser.feed(html)
        assert not parser.errors and not parser.stack, f"{where}: {parser.errors[:1]} open={parser.stack[:3]}"


def test_both_cdns_and_varied_pages():
    rows = [r for s in SPLITS for _, r in _rows(s)]
    pages = [r["ground_truth"] for r in rows]
    for cdn in TAILWIND_CDN:
        assert sum(cdn in p for p in pages) >= 10, f"too few pages use {cdn}"
    assert sum(bool(PLACEHOLDER_IMAGE.search(p)) for p in pages) >= 0.8 * len(pages), "most pages show images"
    titles = [re.search(r"<title>(.*?)</title>", p).group(1) for p in pages]
    assert len(set(titles)) == len(titles)
    # Layout variety: grids, forms, tables and sidebars each appear in several pages.
    for marker in ("grid-cols-", "<form", "<table", "<aside"):
        assert sum(marker in p for p in pages) >= 3, marker


def test_loader_reads_bundled_sets():
    """The project's task loader accepts the bundled rows as frontend tasks."""
    tasks_mod = pytest.importorskip("colbench.tasks", reason="colbench.tasks not available")
    for split in SPLITS:
        tasks = tasks_mod.load_tasks(str(FRONTEND_DIR / f"{split}.jsonl"), env="frontend", split=split)
        assert len(tasks) == len(_rows(split))
        assert all(t.env == "frontend" and t.hidden.startswith("<!DOCTYPE html>") and not t.tests for t in tasks)
