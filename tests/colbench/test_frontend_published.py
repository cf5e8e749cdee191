"""The frontend as the published code runs it (sweet_rl's human_design_interaction_env.py,
scripts/evaluate_html.py, scripts/filter_websites.py), through the real loader, renderer and
evaluate CLI with the tiny CLIP: unrenderable targets are unusable rows (counted, named,
--strict-tasks stops), the target check is cached by content, each environment has its own
reply cap and scoring version, and --rescore re-extracts the answer from the stored turns.
Rewards are never compared across pages: the tiny CLIP scores any two pages alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import colbench.tasks as tasks_mod
from colbench.envs.frontend import FrontendEnv
from colbench.episodes import read_episodes
from colbench.evaluate import main
from colbench.scoring.render import DEFAULT_CHROMIUM
from colbench.tasks import check_targets, load_tasks
from colbench.types import STOP_UNUSABLE, Task

pytestmark = pytest.mark.skipif(not Path(DEFAULT_CHROMIUM).exists(), reason="chromium not installed")

GOOD = "<html><body><h1 class='text-4xl p-8 bg-blue-700 text-white'>Acme Bakery</h1><p>Fresh bread.</p></body></html>"
BLANK = "<html><body></body></html>"  # renders one colour: no page to compare with
RED = "<html><body style='background:#c00'><div style='height:300px'></div></body></html>"
ROWS = [{"problem_description": "A bakery homepage.", "ground_truth": GOOD},
        {"problem_description": "An empty page.", "ground_truth": BLANK},
        {"problem_description": "A red page.", "ground_truth": RED},
        {"problem_description": "Whitespace.", "ground_truth": "   \n"}]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("SWEET_COLBENCH_CACHE", str(folder))
    return folder


@pytest.fixture
def rows(tmp_path) -> Path:
    path = tmp_path / "fe.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_unrenderable_targets_are_unusable_and_the_check_is_cached(rows, cache):
    before = tasks_mod.TARGET_STATS["renders"]
    tasks = load_tasks(str(rows), env="frontend")
    reasons = [t.meta.get("unusable") for t in tasks]
    assert reasons[0] is None
    assert reasons[1:3] == ["the target page renders blank (one colour)"] * 2 and "empty" in reasons[3]
    assert [t.meta["where"] for t in tasks[1:]] == [f"{rows}:{n}" for n in (2, 3, 4)]
    # the blank pages were rendered twice (a second try before a verdict), the good one once
    assert tasks_mod.TARGET_STATS["renders"] - before == 1 + 2 * 2
    before = tasks_mod.TARGET_STATS["renders"]
    assert [t.meta.get("unusable") for t in load_tasks(str(rows), env="frontend")] == reasons  # cached: no render
    assert tasks_mod.TARGET_STATS["renders"] == before
    assert load_tasks(str(rows), env="frontend", validate=False)[1].meta.get("unusable") is None
    with pytest.raises(tasks_mod.TaskFormatError, match=r"fe.jsonl:2: the target page renders blank"):
        load_tasks(str(rows), env="frontend", on_error="raise")


def test_a_target_that_times_out_is_unusable_but_not_cached(cache, monkeypatch):
    monkeypatch.setattr(tasks_mod, "TARGET_TIMEOUT_S", 2.0)
    hang = Task("hang", "frontend", "x", "<html><body><h1>x</h1><script>while(true){}</script></body></html>")
    assert "render timed out" in check_targets([hang])["hang"]
    assert not list((cache / "validation").rglob("*.json"))  # maybe the machine's load: never cached


def test_evaluate_counts_and_names_unusable_targets_and_strict_stops(rows, cache, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--env", "frontend", "--agent", "reference", "--clip-model", "tiny", "--tasks", str(rows),
            "--output", str(out), "--progress", "false"]
    assert main(args) == 0
    by_id = {ep.task_id: ep for ep in read_episodes(out / "episodes" / "reference.jsonl")}
    episodes = [by_id[t.task_id] for t in load_tasks(str(rows), env="frontend")]
    assert [ep.stop_reason == STOP_UNUSABLE for ep in episodes] == [False, True, True, True]
    assert all(ep.reward == 0.0 for ep in episodes[1:]) and episodes[0].score.error is None
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["n_unusable_tasks"] == 3
    assert [u["where"] for u in row["unusable_tasks"]] == [f"{rows}:{n}" for n in (2, 3, 4)]
    assert row["n_tasks"] == 4 and "Unusable tasks: 3 of 4" in (out / "leaderboard.md").read_text()
    capsys.readouterr()
    assert main([*args[:-4], "--output", str(tmp_path / "strict"), "--strict-tasks", "--progress", "false"]) == 2
    err = capsys.readouterr().err
    assert f"{rows}:2: the target page renders blank" in err and f"{rows}:4" in err


def test_reply_cap_is_the_environments_and_recorded(rows, cache, tmp_path):
    out = tmp_path / "run"
    assert main(["--env", "frontend", "--agent", "reference", "--clip-model", "tiny", "--tasks", str(rows),
                 "--limit", "1", "--output", str(out), "--progress", "false"]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["max_reply_chars"] == 1000
    from simulators import load_simulator
    from sweet.core.rollouts import rollout_session

    env = FrontendEnv(clip_model="tiny")
    try:
        assert load_simulator("scripted:idk", env).max_reply_chars == 1000
        assert load_simulator("scripted:idk", env, max_reply_chars=50).max_reply_chars == 50
    finally:
        env.close()
    with rollout_session("frontend", "scripted:idk") as (_, human):
        assert human.max_reply_chars == 1000
    with rollout_session("backend", "scripted:backend") as (_, human):
        assert human.max_reply_chars == 400
    from sweet.algorithms.loop import LoopConfig, session

    with session(LoopConfig(max_reply_chars=77)) as (_, human):  # LOOP's --max_reply_chars
        assert human.max_reply_chars == 77


def test_rescore_extracts_the_answer_again_from_the_stored_turns(rows, cache, tmp_path, capsys):
    """A folder of the former frontend rules (version 2: the final message's text was the
    answer) is refused; --rescore re-extracts the last draft from the turns and scores it."""
    out = tmp_path / "run"
    args = ["--env", "frontend", "--agent", "reference", "--clip-model", "tiny", "--tasks", str(rows), "--limit", "1",
            "--output", str(out), "--progress", "false"]
    assert main(args) == 0
    file = out / "episodes" / "reference.jsonl"
    [row] = [json.loads(x) for x in file.read_text().splitlines()]
    row["meta"]["scoring_version"], row["answer"] = 2, "stale text the former rule kept"
    del row["meta"]["answer_turn"]
    file.write_text(json.dumps(row) + "\n")
    capsys.readouterr()
    assert main(args) == 2
    assert "version 2" in capsys.readouterr().err
    assert main([*args, "--rescore"]) == 0
    [ep] = read_episodes(file)
    assert ep.answer == GOOD and ep.meta["answer_turn"] == 0
    assert ep.meta["scoring_version"] == FrontendEnv.scoring_version and ep.score.error is None
