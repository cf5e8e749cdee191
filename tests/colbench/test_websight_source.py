"""The frontend source `hf:HuggingFaceM4/WebSight[train|test]`: the paper's split, description,
URL mapping and test size, through the real loader and a real streaming `datasets` object.

Only the download is stood in for: `datasets.load_dataset` returns an IterableDataset over
generated rows of WebSight v0.2's shape (`llm_generated_idea`, `text`, `image`), so nothing
is downloaded and no published row is copied here."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from colbench import tasks as loader
from colbench.tasks import load_tasks, stable_task_id, websight_target_html

PUBLISHED_FRONTEND = Path(__file__).resolve().parents[3] / "shared" / "data" / "colbench-test" / "frontend_test.jsonl"
TAILWIND = '<link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">'


def _raw(i: int) -> dict:
    """Row i of a made-up WebSight v0.2: an idea and a Tailwind page with Unsplash Source photos."""
    w, h = 100 + i % 7 * 100, 50 + i % 5 * 50
    text = (f"<html><head>{TAILWIND}</head><body><h1 class='text-3xl'>Shop {i}</h1>"
            f"<img src=\"https://source.unsplash.com/random/{w}x{h}/?shop\">"
            f"<div style=\"background-image: url('https://source.unsplash.com/random/1600x900/?real-estate')\"></div>"
            f"</body></html>")
    return {"image": None, "text": text, "llm_generated_idea": f"Shop {i} website: a hero image and a product grid."}


@pytest.fixture
def websight(monkeypatch):
    """Stand in for the download: 20,000 generated rows, streamed; records the call and how
    many rows were read."""
    seen = {"calls": [], "read": 0}

    def rows():
        for i in range(20_000):
            seen["read"] = i + 1
            yield _raw(i)

    def load_dataset(path, name=None, **kwargs):
        seen["calls"].append((path, name, kwargs))
        return datasets.IterableDataset.from_generator(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return seen


def test_test_split_is_rows_10000_on_and_the_paper_size(websight):
    # the split, its size and its rows; the target check renders pages (seconds each) and is
    # checked on three of them below
    got = load_tasks("hf:HuggingFaceM4/WebSight[test]", env="frontend", validate=False)
    assert websight["calls"] == [("HuggingFaceM4/WebSight", "v0.2", {"split": "train", "streaming": True})]
    assert len(got) == loader.PAPER_FRONTEND_TEST_SIZE == 500
    assert websight["read"] <= 10_500 + 1  # streamed up to the last task needed, not the set
    first, last = got[0], got[-1]
    raw = _raw(10_000)
    assert first.description == raw["llm_generated_idea"]
    assert first.hidden == websight_target_html(raw["text"])
    assert '<img src="https://picsum.photos/id/48/500/50">' in first.hidden  # row 10,000: 500x50
    assert "url('https://picsum.photos/id/48/1600/900-estate')" in first.hidden
    assert last.description == _raw(10_499)["llm_generated_idea"]
    assert first.task_id == stable_task_id("frontend", first.description, first.hidden)
    assert first.env == "frontend" and first.tests == () and first.meta["split"] == "test"
    assert first.meta["where"] == "hf:HuggingFaceM4/WebSight[test]:1"
    checked = load_tasks("hf:HuggingFaceM4/WebSight[test]", env="frontend", limit=3)  # validate: the default
    assert [t.task_id for t in checked] == [t.task_id for t in got[:3]]
    assert not any(loader.UNUSABLE in t.meta for t in checked)  # each target rendered and passed its check


def test_train_split_and_quick_runs(websight):
    # the split and its rows only: the target pages are not rendered (validate=False; the target
    # check has its own tests), or the 10,000-row split would render 10,000 pages
    train = load_tasks("hf:HuggingFaceM4/WebSight", env="frontend", split="train", limit=3, validate=False)
    assert [t.description for t in train] == [_raw(i)["llm_generated_idea"] for i in range(3)]
    quick = load_tasks("hf:HuggingFaceM4/WebSight[test]", env="frontend", limit=100, validate=False)
    assert len(quick) == 100 and quick[0].description == _raw(10_000)["llm_generated_idea"]
    assert len(load_tasks("hf:HuggingFaceM4/WebSight[test]", env="frontend", limit=20_000, validate=False)) == 10_000


@pytest.mark.parametrize("source, env, message", [
    ("hf:HuggingFaceM4/WebSight[test]", "backend", "frontend tasks only"),
    ("hf:HuggingFaceM4/WebSight[val]", "frontend", "split must be one of"),
    ("hf:facebook/collaborative_agent_bench[test]", "frontend", "hf:HuggingFaceM4/WebSight"),
])
def test_wrong_env_or_split_is_one_clear_error(websight, source, env, message):
    with pytest.raises(ValueError, match=message):
        load_tasks(source, env=env)
    assert websight["calls"] == []


def test_image_urls_map_as_in_the_published_rows():
    text = ('<img src="https://source.unsplash.com/random/300x200/?learning">'
            '<img src="https://source.unsplash.com/random/1600x900/?real-estate">'
            "<div style=\"background: url('https://picsum.photos/640/480')\"></div>"
            '<img src="https://via.placeholder.com/32"><img src="https://picsum.photos/id/48/5/5">')
    assert websight_target_html(text) == (
        '<img src="https://picsum.photos/id/48/300/200">'
        '<img src="https://picsum.photos/id/48/1600/900-estate">'  # the keyword stops at "-"
        "<div style=\"background: url('https://picsum.photos/id/48/640/480')\"></div>"
        '<img src="https://via.placeholder.com/32"><img src="https://picsum.photos/id/48/5/5">')


@pytest.mark.skipif(not PUBLISHED_FRONTEND.exists(), reason="no public copy at ../shared/data/colbench-test/")
def test_published_targets_are_fixed_points_of_the_mapping():
    """The published frontend targets are already mapped: mapping them again changes nothing,
    and every Lorem Picsum photo in them is photo 48, as the mapping writes it."""
    import re

    rows = [json.loads(line) for line in PUBLISHED_FRONTEND.read_text(encoding="utf-8").splitlines() if line.strip()]
    for i, row in enumerate(rows):
        html = row["ground_truth"]
        assert websight_target_html(html) == html, i
        assert "source.unsplash.com" not in html, i
        photos = re.findall(r"https://picsum\.photos/[^\s\"')]*", html)
        assert all(u.startswith("https://picsum.photos/id/48/") for u in photos), i
