"""The README's main job, end to end at toy sizes: warm start -> episodes -> critic ->
SWEET-RL policy -> leaderboard -> credit inspector (the full-size run is `bash scripts/demo.sh`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_demo_smoke_runs_every_step_and_resumes(tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "testbed.demo", "--smoke", "true", "--seed", "1", "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rows = json.loads((out / "leaderboard" / "leaderboard.json").read_text())
    assert [r["agent"] for r in rows] == ["warm_start", "sweet_rl"]
    for r in rows:
        assert 0.0 <= r["metrics"]["success_rate"]["value"] <= 1.0 and r["n_tasks"] == 4
    assert (out / "leaderboard" / "report.html").exists()
    # seed 1 evaluates with round 1's episode seeds (each seed its own draws), both policies alike (paired)
    from colbench.rollout import episode_seeds

    for agent in ("warm_start", "sweet_rl"):
        lines = (out / "leaderboard" / "episodes" / f"{agent}.jsonl").read_text().splitlines()
        assert {json.loads(line)["seed"] for line in lines} == set(episode_seeds(1, 1))
    assert (out / "critic" / "critic_config.json").exists()
    assert (out / "sweet" / "final" / "config.json").exists()
    # stage 2 trains with the main job's optimiser: Adam with eps 1e-2 at 50x the pipeline's rate (testbed.demo)
    train = json.loads((out / "sweet" / "config.json").read_text())["train"]
    assert (train["adam_epsilon"], train["learning_rate"]) == (1e-2, 50 * 3e-5)
    # the policy was chosen on the first 8 validation tasks (the smoke's val_limit), never on test tasks
    selected = json.loads((out / "selection" / "selected.json").read_text())
    assert selected["validation_tasks"] == "builtin:default/val" and selected["validation_limit"] == 8
    val = json.loads((out / "selection" / "validation" / "leaderboard.json").read_text())
    assert val and all(r["n_tasks"] == 8 for r in val)
    assert "leaderboard:" in res.stdout and "report with plots:" in res.stdout
    assert "sweet_rl success / warm_start success =" in res.stdout
    # summary.json: both policies' success as printed, the exact solver's optimum of the default bed
    summary = json.loads((out / "summary.json").read_text())
    by_agent = {r["agent"]: r["metrics"]["success_rate"] for r in rows}
    assert summary["warm_start"] == by_agent["warm_start"] and summary["sweet_rl"] == by_agent["sweet_rl"]
    # ... from the warm start's teacher, the explorer that reads its dialogue (testbed_bed.TEACHERS)
    assert summary["bed"] == "default" and summary["optimum"] == 0.7844 and summary["predicted_warm_start"] == 0.5395
    assert (summary["teacher"], summary["p_other"]) == ("reads", 0.5)
    assert json.loads((out / "warm_start" / "behave" / "warm_start.json").read_text())["p_other"] == 0.5
    # the solver's SWEET-RL at the policy's measured KL, printed beside the measured success
    at = summary["predicted_at_kl"]
    assert 0.539 <= at["sweet_rl"] <= 0.7844 and at["kl"] == round(at["kl"], 4)
    assert (f"SWEET-RL measured {summary['sweet_rl']['value']:.3f} at KL {at['kl']:.3f} from the warm start; "
            f"the exact solver's SWEET-RL at that KL: {at['sweet_rl']:.3f}") in res.stdout
    # the warm start's held-out dialogues beside its teacher's exact profile
    check = summary["reads_check"]
    assert check["teacher"] == "reads" and check["cells"] == 11 and check["repeat"]["teacher"] == 0.2
    assert "of 11 (repeat rate and every P(move | history)) within the 95% intervals" in res.stdout
    telling = check["telling"]
    assert telling["cells"] == 5 and 0 <= telling["blind_within"] <= 5
    assert (f"where the teacher and the blind explorer differ, {telling['teacher_within']} of 5 intervals hold the "
            f"teacher's value and {telling['blind_within']} the blind one's") in res.stdout
    assert f"optimum {summary['optimum']:.3f}" in res.stdout and "warm start checks:" in res.stdout
    # no prediction for a policy blind to which question it asked: the reading warm start is in no blind class
    assert summary["predicted_blind"] is None and "blind to which question it asked" not in res.stdout
    # the credit inspector shows the critic's advantage on the training dialogues' turns
    page = (out / "inspect" / "index.html").read_text()
    assert "per-turn credit inspector: " + str(out / "inspect" / "index.html") in res.stdout
    assert page.count("A = ") >= 8 and "stage 2:" in page
    # ... and where the critic's margin on its own pairs sits (answer vs questions), printed and kept
    credit = summary["critic_credit"]
    assert credit == json.loads((out / "inspect" / "credit_split.json").read_text()) and credit["pairs"] >= 1
    assert 0.0 <= credit["ordered_by_earlier"] <= 1.0 and 0.0 <= credit["ordered_by_last"] <= 1.0
    assert f"critic credit on {credit['pairs']} trajectory pairs of equal length" in res.stdout.split("=== results")[1]
    # each policy's dialogues as the solver's actions, printed and kept; the success they count is the leaderboard's
    for agent in ("warm_start", "sweet_rl"):
        prof = summary["dialogue"][agent]
        assert prof["episodes"] == rows[0]["n_episodes"] and prof["success"] == by_agent[agent]  # interval too
        assert f"{agent} dialogues: success {prof['success']['value']:.3f}" in res.stdout
        assert 0.0 <= prof["faithful"]["value"] <= 1.0
    # the warm start learned the dialogue format from the scripted explorer
    warm_metrics = [json.loads(line) for line in (out / "warm_start" / "behave" / "metrics.jsonl").read_text().splitlines()]
    nll = [m["loss/nll"] for m in warm_metrics if "loss/nll" in m]
    assert nll[-1] < nll[0] / 2
    # every step's output exists, so a rerun skips them all and prints the same table
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.split("=== results")[1].split("wall time")[0] == res.stdout.split("=== results")[1].split("wall time")[0]
