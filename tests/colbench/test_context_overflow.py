"""Prompts longer than the model's context (issue 67), on the real components: the tiny model
and SmolLM2 as agents, the backend environment and its sandbox, `python -m colbench.evaluate`
as a user runs it.

- an agent's first prompt that does not fit: its episode alone is an engine error (counted in
  the leaderboard), the other rows are played and scored, and memory stays bounded by the
  model's context, not by the input (a 200,000-character row once took 12 GB and the run);
- a later turn that does not fit: the token-limit stop, the last agent message the answer;
- a prompt near the end of the context: the generation capped to fit, recorded on the turn;
- a simulated human's prompt that does not fit: a simulator failure, as any other.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from colbench.agents import ModelAgent
from colbench.envs import make_env
from colbench.protocols import SimReply
from colbench.rollout import rollout
from colbench.tasks import load_tasks
from colbench.types import STOP_ENGINE_ERROR, STOP_SIMULATOR_ERROR, STOP_SINGLE_TURN, STOP_TOKEN_LIMIT
from engines import EngineOptions, SamplingParams
from engines.templating import prompt_ids

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
GB = 2**30
LONG_CHARS = 200_000  # the row: ~62k SmolLM2 tokens (its context is 8,192)
# the child's address space, so that a regression fails fast here instead of taking a shared
# machine's memory (the unbounded run asked for a 15-29 GB attention mask)
ADDRESS_SPACE_LIMIT = 12 * GB


def long_text(chars: int) -> str:
    """Plain prose-like filler: ~3.2 characters per SmolLM2 token."""
    import random

    rng = random.Random(0)
    vocab = ("the function should return a list of values for each item in the input and handle empty cases "
             "when numbers are negative or zero raise an error unless the caller passes a default option").split()
    parts, n = [], 0
    while n < chars:
        w = rng.choice(vocab) if rng.random() < 0.8 else f"{rng.choice(vocab)}{rng.randint(0, 999)}"
        parts.append(w)
        n += len(w) + 1
    return " ".join(parts)[:chars]


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("builtin:test", env="backend", limit=4)


@pytest.fixture(scope="module")
def env():
    environment = make_env("backend")
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def engine(tiny_path):
    import torch

    from engines.hf import HFEngine

    torch.set_num_threads(1)  # 2 shared cores
    e = HFEngine(str(tiny_path), EngineOptions(device="cpu", dtype="float32", batch_size=16), spec="tiny")
    yield e
    e.close()


@pytest.fixture(scope="module")
def tiny_path():
    from engines.tiny import tiny_model_path

    return tiny_model_path()


def write_rows(path: Path, tasks, long_row: int = 1) -> Path:
    """The tasks in the published row format, row `long_row` with a LONG_CHARS description."""
    with path.open("w") as f:
        for i, t in enumerate(tasks):
            text = t.description if i != long_row else (t.description + " Notes: " + long_text(LONG_CHARS))[:LONG_CHARS]
            f.write(json.dumps({"problem_description": text, "ground_truth": t.hidden,
                                "test_cases": {f"test{j}": c for j, c in enumerate(t.tests)}}) + "\n")
    return path


def run_measured(args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, int]:
    """Run `args`; (the completed process, its peak resident bytes: the largest process of its
    tree, from wait4's rusage of this child alone)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    with open(os.devnull, "rb") as stdin:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=limit)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    out: dict[str, str] = {}
    readers = [threading.Thread(target=lambda k=k, s=s: out.__setitem__(k, s.read()))
               for k, s in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for r in readers:
        r.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return subprocess.CompletedProcess(args, proc.returncode, out["stdout"], out["stderr"]), usage.ru_maxrss * 1024


def evaluate_with_a_long_row(tmp_path: Path, tasks, agent: str, timeout: float):
    rows = write_rows(tmp_path / "tasks.jsonl", tasks)
    out = tmp_path / "out"
    run, peak = run_measured([PY, "-m", "colbench.evaluate", "--no-progress", "--env", "backend", "--agent", agent,
                              "--single-turn", "--max_new_tokens", "16", "--tasks", str(rows), "--output", str(out)],
                             timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    episodes = [json.loads(line) for line in (out / "episodes" / f"{agent}.jsonl").read_text().splitlines()]
    board = json.loads((out / "leaderboard.json").read_text())
    return run, peak, episodes, board


def check_only_the_long_row_failed(run, episodes, board, spec: str, context: int) -> None:
    by_row = {ep["task_id"]: ep for ep in episodes}
    assert len(by_row) == 4
    failed = [ep for ep in episodes if ep["stop_reason"] == STOP_ENGINE_ERROR]
    assert len(failed) == 1, [ep["stop_reason"] for ep in episodes]
    reason = failed[0]["meta"]["error"]
    assert reason.startswith(f"ContextOverflow: {spec}: prompt of ") and reason.endswith(
        f" tokens exceeds the context of {context}"), reason
    assert int(reason.split("prompt of ")[1].split()[0]) > context
    assert failed[0]["score"] == {"reward": 0.0, "success": False, "detail": {}, "error": reason}
    played = [ep for ep in episodes if ep is not failed[0]]
    assert all(ep["stop_reason"] == STOP_SINGLE_TURN and ep["score"] is not None for ep in played)
    assert all(ep["turns"][0]["token_ids"] is not None for ep in played)  # the model played them
    row, = board
    assert row["n_tasks"] == 4 and row["n_episodes"] == 4
    assert row["n_unusable_tasks"] == 0  # not an unusable row: another model's context may hold it
    assert row["behaviour"]["engine_errors"] == 1 and row["behaviour"]["first_engine_error"] == reason
    assert f"Engine errors: {spec}: 1 of 4 episodes failed (scored 0); first: {reason}" in run.stdout + run.stderr


# ------------------------------------------------------------------------------ evaluate, for real


def test_a_row_longer_than_the_tiny_models_context_costs_only_its_own_episode(tmp_path, tasks, record_property):
    run, peak, episodes, board = evaluate_with_a_long_row(tmp_path, tasks, "tiny", timeout=300)
    record_property("peak_rss_gb", f"{peak / GB:.2f}")
    check_only_the_long_row_failed(run, episodes, board, "tiny", 4096)
    assert peak < 4 * GB, f"peak resident {peak / GB:.2f} GB"


@pytest.mark.heavy
@pytest.mark.timeout(1200)
def test_smollm2_plays_the_three_ordinary_rows_beside_a_200k_character_one_under_4_gb(tmp_path, tasks,
                                                                                      record_property):
    """The issue's run: SmolLM2 (context 8,192), --single-turn, four backend tasks, one of
    200,000 characters (~62k tokens). It died at 12 GB without writing an episode."""
    run, peak, episodes, board = evaluate_with_a_long_row(tmp_path, tasks, "smollm2", timeout=1100)
    record_property("peak_rss_gb", f"{peak / GB:.2f}")
    check_only_the_long_row_failed(run, episodes, board, "smollm2", 8192)
    assert peak < 4 * GB, f"peak resident {peak / GB:.2f} GB"


# ------------------------------------------------------------------------------ the episode rules (tiny)


def sized(engine, env, task, n_tokens: int, single_turn: bool = True):
    """`task` with a description that makes its first agent prompt exactly `n_tokens` tokens."""
    def length(t):
        return len(prompt_ids(engine.tokenizer, env.agent_messages(t, [], single_turn)))

    words = max(1, n_tokens - length(task))
    for _ in range(50):
        t = dataclasses.replace(task, description=task.description + " " + "word " * words)
        have = length(t)
        if have == n_tokens:
            return t
        words += max(1, n_tokens - have) if have < n_tokens else -max(1, have - n_tokens)
    raise AssertionError(f"could not size a prompt to {n_tokens} tokens")


def test_a_prompt_near_the_end_of_the_context_is_capped_and_the_turn_records_it(tmp_path, engine, env, tasks):
    near = sized(engine, env, tasks[0], 4096 - 5)
    agent = ModelAgent(engine, SamplingParams(temperature=0.0, max_new_tokens=32), name="tiny")
    out = tmp_path / "episodes.jsonl"
    capped, ordinary = rollout(env, [near, tasks[1]], agent, None, single_turn=True, out_path=out)
    turn = capped.agent_turns[0]
    assert capped.stop_reason == STOP_SINGLE_TURN and capped.score is not None
    assert turn.capped_max_new_tokens == 5 and len(turn.token_ids) <= 5 and len(turn.prompt_token_ids) == 4091
    assert ordinary.agent_turns[0].capped_max_new_tokens is None
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert stored[0]["turns"][0]["capped_max_new_tokens"] == 5
    assert "capped_max_new_tokens" not in stored[1]["turns"][0]  # only where it happened


class LongReplies:
    """A simulated human whose every reply is `words` words long (and never leaks the reference)."""

    def __init__(self, words: int):
        self.words, self.name = words, "long-replies"

    def reply(self, requests):
        return [SimReply("I am not sure, " + "maybe " * self.words) for _ in requests]


def test_a_later_turn_that_no_longer_fits_ends_by_the_token_limit_with_the_last_message_the_answer(engine, env, tasks):
    agent = ModelAgent(engine, SamplingParams(temperature=0.0, max_new_tokens=16), name="tiny")
    ep, = rollout(env, tasks[:1], agent, LongReplies(5000), max_turns=5)
    assert ep.stop_reason == STOP_TOKEN_LIMIT, (ep.stop_reason, ep.meta.get("error"))
    assert len(ep.agent_turns) == 1 and [t.role for t in ep.turns] == ["agent", "human"]
    assert ep.meta["token_limit"].startswith("ContextOverflow: tiny: prompt of ")
    assert ep.meta["token_limit"].endswith("tokens exceeds the context of 4096")
    assert ep.answer == env.extract_answer(ep.agent_turns[0].content) and ep.score is not None
    assert "error" not in ep.meta  # not an engine error (the score may hold the sandbox's verdict on junk code)


def test_a_simulators_prompt_that_does_not_fit_is_a_simulator_failure(engine, env, tasks):
    from simulators.llm import LLMSimulator

    huge = dataclasses.replace(tasks[0], hidden=tasks[0].hidden + "\n# " + "note " * 6000)
    simulator = LLMSimulator(engine)  # the agent's prompt fits; the human's holds the hidden reference
    agent = ModelAgent(engine, SamplingParams(temperature=0.0, max_new_tokens=16), name="tiny")
    failed, ordinary = rollout(env, [huge, tasks[1]], agent, simulator, max_turns=2, leak_guard=False)
    assert failed.stop_reason == STOP_SIMULATOR_ERROR and failed.n_simulator_failures == 1
    human = failed.turns[-1]
    assert human.failed and human.error.startswith("ContextOverflow: tiny: prompt of ")
    assert human.error.endswith("tokens exceeds the context of 4096")
    assert ordinary.n_simulator_failures == 0 and ordinary.stop_reason != STOP_SIMULATOR_ERROR
