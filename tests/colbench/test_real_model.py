"""SmolLM2-135M-Instruct as agent and simulated human through `python -m colbench.evaluate`, with the
published evaluator's prompt shape (one user message with `{dialogue_history}`): real chat
templates, end-of-turn tokens, answer extraction and the leak guard on a real model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colbench.episodes import read_episodes
from colbench.leaks import leaked_lines
from colbench.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
TEST = ROOT / "tasks/backend/test.jsonl"
PUBLISHED = ROOT.parent / "shared/data/colbench-test/backend_test.jsonl"  # ../shared beside the checkout
PUBLISHED_SHAPE = """You play a person who asked a coding helper for this: {problem_description}
What you privately know (answer only from it, otherwise say "I don't know"):
{hidden_information}
Conversation until now:
{dialogue_history}
Reply to the helper's last message in two sentences at most, and write nothing else.
"""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_smollm2_plays_both_seats_with_a_published_shape_prompt(tmp_path):
    prompt = tmp_path / "published_shape.txt"
    prompt.write_text(PUBLISHED_SHAPE)
    source = f"{PUBLISHED}[0:2]" if PUBLISHED.exists() else f"{TEST}[0:2]"
    cmd = [PY, "-m", "colbench.evaluate", "--env", "backend", "--agent", "smollm2", "--simulator", "smollm2",
           "--human_prompt", str(prompt), "--tasks", source, "--max_turns", "2", "--max_new_tokens", "128",
           "--simulator_max_new_tokens", "64", "--output", str(tmp_path / "run"), "--progress", "false"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=1700)
    assert done.returncode == 0, done.stderr[-2000:]
    episodes = read_episodes(tmp_path / "run/episodes/smollm2.jsonl")
    tasks = {t.task_id: t for t in load_tasks(source, validate=False)}
    assert len(episodes) == 2
    for ep in episodes:
        agent = ep.agent_turns
        assert all(t.finish_reason in ("stop", "length") for t in agent) and agent[0].token_ids
        assert 2 not in agent[0].token_ids  # <|im_end|> ends a turn, never inside one
        human = [t for t in ep.turns if t.role == "human"]
        for t in human:  # the simulator got one user message with the dialogue as text
            assert not leaked_lines(t.content, tasks[ep.task_id].hidden, tasks[ep.task_id].description)
        assert ep.meta["prompts"]["human"]["path"] == str(prompt)
        assert ep.stop_reason in ("answered", "turn_limit", "simulator_error") and ep.score is not None
    config = json.loads((tmp_path / "run/config.json").read_text())
    assert config["config"]["leak_guard"] is True and config["prompts"]["human"]["path"] == str(prompt)
    board = (tmp_path / "run/leaderboard.md").read_text()
    assert "answer parses" in board and "leaks" in board
