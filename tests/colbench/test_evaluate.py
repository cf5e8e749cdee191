"""The evaluate CLI end to end: reference and replay scores, the tiny model through
the LLM simulated human (as a subprocess), resume, bad input, the statistics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colbench.evaluate import main, parse_config
from colbench.stats import Metric, bootstrap_ci, win_outcomes
from colbench.tasks import load_tasks
from colbench.types import Episode, Score

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
ERR = "python -m colbench.evaluate: error:"

HALF_WATER_BILL = "def water_bill(gallons):\n    if gallons > 5000:\n        return 0.0\n" \
                  "    if gallons <= 0:\n        return 12.0\n    return round(12.0 + gallons / 1000 * 3.0, 2)\n"


def cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [PY, "-c", code, *args] if code else [PY, "-m", "colbench.evaluate", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=540)


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("builtin:test", env="backend", limit=3)


@pytest.fixture()
def replay_file(tmp_path, tasks):
    good, water, wrong = tasks[1], tasks[0], tasks[2]
    assert "water_bill" in water.description
    rows = [{"task_id": good.task_id, "answer": good.hidden},
            {"task_id": water.task_id, "answer": HALF_WATER_BILL},
            {"task_id": wrong.task_id, "answer": "def nope():\n    pass\n"}]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def metric(row: dict, name: str) -> float:
    m = row["metrics"][name]
    assert m["ci95"][0] <= m["value"] <= m["ci95"][1]
    return m["value"]


def test_reference_via_cli_scores_one_and_never_imports_sweet_or_torch(tmp_path):
    # transformers' argument parser (colbench.cli) is allowed; its models and torch are not
    code = ("import sys; from colbench.evaluate import main; rc = main(sys.argv[1:]); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sweet', 'torch') "
            "or m.startswith(('transformers.models', 'transformers.modeling'))); "
            "print('HEAVY', bad); sys.exit(rc)")
    out = tmp_path / "ref"
    r = cli("--env", "backend", "--agent", "reference", "--output", str(out), "--no-progress", code=code)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["agent"] == "reference" and row["n_tasks"] == row["n_episodes"] >= 10
    assert metric(row, "tests_passed") == 1.0 and metric(row, "success_rate") == 1.0
    assert row["behaviour"]["answered_without_asking"] == 1.0 and row["behaviour"]["mean_turns"] == 1.0


def test_replay_gives_exact_scores_and_resume_reuses(tmp_path, replay_file, capsys):
    out = tmp_path / "run"
    args = ["--env", "backend", "--agent", f"replay:{replay_file}", "--limit", "3", "--output", str(out),
            "--no-progress"]
    assert main(args) == 0
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["agent"] == "replay-answers" and row["n_episodes"] == 3
    assert metric(row, "tests_passed") == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3
    assert metric(row, "success_rate") == pytest.approx(1 / 3)
    eps = (out / "episodes" / "replay-answers.jsonl").read_text()
    assert main(args + ["--agent", "reference"]) == 0
    assert (out / "episodes" / "replay-answers.jsonl").read_text() == eps
    assert "replay-answers: reusing 3 finished episodes" in capsys.readouterr().err
    rows = json.loads((out / "leaderboard.json").read_text())
    assert [r["agent"] for r in rows] == ["replay-answers", "reference"]
    assert main(args[:-1] + ["--max-turns", "3"]) == 2  # same DIR, different episode settings
    assert "holds a run with max_turns=None" in capsys.readouterr().err
    ref = out / "episodes" / "reference.jsonl"
    ref.write_text("{oops\n" + ref.read_text())
    assert main(args + ["--agent", "reference"]) == 2
    assert f"{ref}:1: not a valid episode record" in capsys.readouterr().err


def test_baseline_win_rate(tmp_path, replay_file):
    out = tmp_path / "win"
    assert main(["--env", "backend", "--agent", f"replay:{replay_file}", "--baseline-agent", "reference",
                 "--limit", "3", "--output", str(out), "--no-progress"]) == 0
    rows = {r["agent"]: r for r in json.loads((out / "leaderboard.json").read_text())}
    # replay ties the reference on the one correct task and loses the others: (0.5 + 0 + 0) / 3
    assert metric(rows["replay-answers"], "win_rate") == pytest.approx(1 / 6)
    assert metric(rows["reference"], "win_rate") == 0.5 and rows["reference"]["baseline"]


def test_a_seed_round_samples_its_own_episode_seeds(tmp_path):
    """--seed-round R runs seeds R*1000.. (colbench.rollout.episode_seeds), so repeated
    evaluations of one policy are independent, and reuses nothing of round 0's."""
    out = tmp_path / "rounds"
    base = ["--env", "testbed", "--tasks", "builtin:test", "--agent", "reference", "--limit", "2", "--seeds", "2",
            "--temperature", "0.7", "--output", str(out), "--no-progress"]
    assert main(base) == 0 and main([*base, "--seed-round", "3"]) == 0
    assert json.loads((out / "config.json").read_text())["seeds"] == [3000, 3001]
    seeds = [json.loads(line)["seed"] for line in (out / "episodes" / "reference.jsonl").read_text().splitlines()]
    assert sorted(seeds) == [0, 0, 1, 1, 3000, 3000, 3001, 3001]  # round 0's kept, round 3's added
    assert json.loads((out / "leaderboard.json").read_text())[0]["n_episodes"] == 4
    with pytest.raises(ValueError, match="--seed-round: invalid value -1"):
        parse_config([*base, "--seed-round", "-1"])


def test_bad_input_one_error_line_exit_2(tmp_path, replay_file, tasks, capsys):
    bad_rows = tmp_path / "bad.jsonl"
    bad_rows.write_text(json.dumps({"task_id": tasks[0].task_id, "answer": "x"}) + "\n{oops\n")
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"task_id": "no-such-task", "answer": "x"}) + "\n")
    out = str(tmp_path / "o")
    cases = [
        (["--agent", "foo:bar"], "unknown backend 'foo'"),
        (["--agent", "reference", "--tasks", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
        (["--agent", f"replay:{bad_rows}"], f"{bad_rows}:2: not valid JSON"),
        (["--agent", f"replay:{unknown}"], f"{unknown}:1: unknown task_id 'no-such-task'"),
        (["--agent", f"replay:{replay_file}"], "has no answer for task"),  # 3 answers, 20 tasks
        (["--agent", "tiny"], "give --simulator SPEC or use --single-turn"),
        (["--agent", "tiny", "--simulator", "scripted:nope"], "unknown simulator 'scripted:nope'"),
        (["--agent", "reference", "--env", "nope"], "unknown environment 'nope'"),
        (["--agent", "reference", "--seeds", "0"], "--episodes-per-task: invalid value 0"),
        (["--agent", "a=reference", "--agent", "a=tiny", "--simulator", "tiny"], "share the name 'a'"),
        (["--agent", "reference"], "--output DIR is required"),
    ]
    for args, message in cases:
        full = args + (["--output", out] if "required" not in message else [])
        assert main(full) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(ERR) and message in err[0], (args, err)
    assert not Path(out).exists()  # nothing written, nothing loaded


def test_bad_input_exit_code_as_subprocess_loads_no_model(tmp_path):
    code = ("import sys; from colbench.evaluate import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules; sys.exit(rc)")
    r = cli("--agent", "hf:/no/such/model", "--simulator", "tiny", "--output", str(tmp_path), code=code)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"{ERR} model spec 'hf:/no/such/model': path /no/such/model does not exist"]


def test_yaml_config_with_flag_override(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("env: backend\nagent: [reference]\nseeds: 2\ntemperature: 0.7\noutput: out\n")
    c = parse_config(["--config", str(cfg), "--seeds", "3"])
    assert (c.agent, c.episodes_per_task, c.temperature, c.output) == (["reference"], 3, 0.7, "out")
    cfg.write_text("agents: [reference]\n")
    with pytest.raises(ValueError, match="unknown setting 'agents'"):
        parse_config(["--config", str(cfg)])


def _ep(task: str, seed: int, reward: float) -> Episode:
    return Episode(task, "backend", "a", seed, score=Score(reward, reward == 1.0))


def test_bootstrap_is_deterministic_and_over_tasks():
    per_task = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5]]
    a, b = bootstrap_ci(per_task), bootstrap_ci(per_task)
    assert a == b and a.value == 0.5 and 0 <= a.low < 0.5 < a.high <= 1
    assert bootstrap_ci([[1.0], [1.0]]) == Metric(1.0, 1.0, 1.0)  # no spread, no interval


def test_win_outcomes_compare_seed_means_ties_half():
    mine = [_ep("t1", 0, 1.0), _ep("t1", 1, 0.0), _ep("t2", 0, 0.3), _ep("t3", 0, 0.2)]
    base = [_ep("t1", 0, 0.5), _ep("t2", 0, 0.1), _ep("t3", 0, 0.9)]
    assert win_outcomes(mine, base) == [0.5, 1.0, 0.0]  # t1: mean 0.5 ties the baseline's 0.5


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "run"
    args = ["--env", "backend", "--agent", "tiny", "--simulator", "tiny", "--limit", "2", "--max-turns", "3",
            "--max-new-tokens", "8", "--simulator-max-new-tokens", "8", "--device", "cpu",
            "--output", str(out), "--no-progress"]
    r = cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tiny: sharing the simulator's engine (tiny)" in r.stderr  # the model is loaded once
    return out, args


def test_tiny_model_end_to_end_through_llm_simulator(tiny_run):
    out, _ = tiny_run
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["agent"] == "tiny" and row["n_tasks"] == 2 and row["n_episodes"] == 2
    assert set(row["metrics"]) == {"tests_passed", "success_rate"}
    for m in row["metrics"].values():
        assert 0 <= m["ci95"][0] <= m["value"] <= m["ci95"][1] <= 1
    assert {"mean_turns", "asked_before_answering", "answered_without_asking", "mean_agent_reply_chars",
            "simulator_dont_know_rate", "simulator_failures"} <= set(row["behaviour"])
    eps = [Episode.from_json(json.loads(ln)) for ln in (out / "episodes" / "tiny.jsonl").read_text().splitlines()]
    assert len(eps) == 2
    for ep in eps:
        assert 1 <= len(ep.agent_turns) <= 3 and ep.score is not None
        assert ep.meta["simulator"].startswith("llm:")
        first = ep.agent_turns[0]
        assert first.token_ids and len(first.logprobs) == len(first.token_ids) <= 8 and first.prompt_token_ids
        for t in ep.turns:
            if t.role == "human" and not t.failed:
                assert t.content and "```" not in t.content and len(t.content) <= 400
    html = (out / "report.html").read_text()
    assert html.count("<img") >= 3 and "data:image/png;base64," in html
    assert "| tiny |" in (out / "leaderboard.md").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["max_turns"] == 3 and config["seeds"] == [0]


def test_rerun_with_one_more_agent_reuses_finished_episodes(tiny_run):
    out, args = tiny_run
    path = out / "episodes" / "tiny.jsonl"
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    r = cli(*args, "--agent", "reference")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert "tiny: reusing 2 finished episodes" in r.stderr and "Loading weights" not in r.stderr
    assert [row["agent"] for row in json.loads((out / "leaderboard.json").read_text())] == ["tiny", "reference"]


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists() and not os.environ.get("SWEET_CHROMIUM"),
                    reason="needs chromium for rendering")
def test_frontend_reference_beats_replayed_baseline_with_thumbnails(tmp_path):
    tasks = load_tasks("builtin:test", env="frontend", limit=2)
    base = tmp_path / "base.jsonl"
    base.write_text("".join(json.dumps({"task_id": t.task_id, "answer": "<html><body><h1>Hello</h1></body></html>"})
                            + "\n" for t in tasks))
    out = tmp_path / "fe"
    assert main(["--env", "frontend", "--agent", "reference", "--baseline-agent", f"base=replay:{base}",
                 "--clip-model", "tiny", "--limit", "2", "--output", str(out), "--no-progress"]) == 0
    ref, baseline = json.loads((out / "leaderboard.json").read_text())
    assert set(ref["metrics"]) == {"clip_similarity", "win_rate"}
    assert metric(ref, "clip_similarity") == pytest.approx(1.0, abs=1e-4)  # the target, rendered the same way
    assert metric(baseline, "clip_similarity") < 1.0
    assert metric(ref, "win_rate") == 1.0 and metric(baseline, "win_rate") == 0.5 and baseline["baseline"]
    html = (out / "report.html").read_text()
    assert "Final renders next to targets" in html and html.count("<img") == 4
    assert len(list((out / "renders" / "targets").glob("*.png"))) == 2


def test_behaviour_stats_by_hand():
    from colbench.stats import behaviour_stats
    from colbench.types import Turn

    asked = Episode("t1", "backend", "a", 0, stop_reason="answered", score=Score(1.0, True), turns=[
        Turn("agent", "Q1?"), Turn("human", "I don't know."), Turn("agent", "Q2?"), Turn("human", "It is 3."),
        Turn("agent", "I WANT TO ANSWER: x")])
    failed = Episode("t2", "backend", "a", 0, stop_reason="simulator_error", n_simulator_failures=1,
                     score=Score(0.0, False), turns=[Turn("agent", "Q?"), Turn("human", "", failed=True, error="e")])
    at_once = Episode("t3", "backend", "a", 0, stop_reason="answered", score=Score(0.5, False),
                      turns=[Turn("agent", "I WANT TO ANSWER: yy")])
    b = behaviour_stats([asked, failed, at_once])
    assert b["mean_turns"] == pytest.approx(5 / 3)  # 3 + 1 + 1 agent turns
    assert b["asked_before_answering"] == pytest.approx(2 / 3) and b["answered_without_asking"] == pytest.approx(1 / 3)
    assert b["simulator_replies"] == 2 and b["simulator_dont_know_rate"] == 0.5  # the failed reply is not counted
    assert b["simulator_failures"] == 1
    assert b["mean_agent_reply_chars"] == pytest.approx((3 + 3 + 19 + 2 + 20) / 5)
    assert b["stop_reasons"] == {"answered": 2, "simulator_error": 1}


def test_workers_roll_agents_out_in_forked_processes_with_the_same_episodes(tmp_path, capfd):
    """--workers 2: each agent's episodes come from another process, and they, the leaderboard
    and the report's rows are those of one process."""
    from colbench.evaluate import EvalConfig, evaluate
    from colbench.episodes import read_episodes

    def run(workers: int) -> tuple[list[dict], dict]:
        out = tmp_path / f"w{workers}"
        evaluate(EvalConfig(output=str(out), env="testbed", simulator="scripted:testbed", tasks="builtin:default/test",
                            agent=["a=hf:tiny", "b=hf:tiny", "c=reference"], limit=4, episodes_per_task=2,
                            max_new_tokens=24, device="cpu", dtype="float32", progress=False, workers=workers))
        rows = json.loads((out / "leaderboard.json").read_text())
        eps = {name: [(e.episode_id, [t.token_ids for t in e.agent_turns], e.score.reward)
                      for e in read_episodes(out / "episodes" / f"{name}.jsonl")] for name in "abc"}
        return rows, eps

    rows1, eps1 = run(1)
    capfd.readouterr()
    rows2, eps2 = run(2)
    err = capfd.readouterr().err
    pids = {line.split("process ")[1].split()[0] for line in err.splitlines() if "--workers 2: process" in line}
    assert len(pids) == 2 and str(os.getpid()) not in pids, err[-2000:]
    assert "rolls out a, c" in err and "rolls out b" in err
    assert eps2 == eps1 and all(len(v) == 8 for v in eps1.values())
    assert [r["metrics"] for r in rows2] == [r["metrics"] for r in rows1]


def test_a_worker_that_cannot_load_its_agent_is_one_line_and_keeps_the_others_episodes(tmp_path, monkeypatch, capfd):
    from colbench.cli import UserError
    from colbench.evaluate import EvalConfig, evaluate
    from colbench.episodes import read_episodes

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = tmp_path / "bad-model"
    bad.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        (bad / name).write_text("{")
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"--workers 2: the process rolling out b failed .* kept in "):
        evaluate(EvalConfig(output=str(out), env="testbed", simulator="scripted:testbed", tasks="builtin:default/test",
                            agent=["a=hf:tiny", f"b=hf:{bad}"], limit=2, max_new_tokens=16, device="cpu",
                            dtype="float32", progress=False, workers=2))
    err = capfd.readouterr().err
    assert "error: b: cannot load model" in err and "Traceback" not in err
    assert len(read_episodes(out / "episodes" / "a.jsonl")) == 2
