"""testbed/learning.py end to end on toy sizes: the protocol's summary (success at matched KL,
predictions, pairs, the search record) from real training, evaluation and KL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import learning

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ("0.5", "1.0", "2.0")


def run_bench(out: Path, *args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "testbed.learning", "--seeds", "1", "--train-limit", "4",
                          "--test-limit", "4", "--out", str(out), *args], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1200, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def check_metric(m: dict) -> None:
    lo, hi = m["ci95"]
    assert 0.0 <= lo <= m["value"] <= hi <= 1.0


def check_schema(summary: dict, names: list[str]) -> None:
    assert list(summary["policies"]) == names
    for name, m in summary["policies"].items():
        for key in ("success_rate", "tests_passed", "samples", "train_wall_s", "budget", "kl", "at_kl", "predicted"):
            assert key in m, (name, key)
        assert set(m["budget"]) == {"episodes", "online_episodes", "candidates"}
        assert list(m["at_kl"]) == list(LEVELS)
        for level in LEVELS:
            at = m["at_kl"][level]
            check_metric(at["success_rate"])
            assert isinstance(at["reached"], bool)
    rows = summary["pairs"]
    n = len(names)
    assert len(rows) == n * (n - 1) // 2 * len(LEVELS)
    assert {(r["a"], r["b"]) for r in rows} == {(a, b) for i, a in enumerate(names) for b in names[i + 1:]}
    for r in rows:
        assert set(r) == {"a", "b", "kl", "predicted_gap", "measured_gap", "ci95"}
        assert r["ci95"][0] <= r["measured_gap"] <= r["ci95"][1]
    apart = [r for r in rows if r["predicted_gap"] is not None and abs(r["predicted_gap"]) >= 0.05]
    n = summary["replication"]
    assert n["predicted_apart"] == len(apart) == n["reproduced"] + n["undecided"] + n["reversed"]
    warm = summary["policies"]["warm_start"]
    assert warm["kl"] == 0.0  # by definition: the warm start's path is one point at KL 0
    assert all(not warm["at_kl"][k]["reached"] and warm["at_kl"][k]["kl"] == 0.0 for k in LEVELS)
    assert all(warm["at_kl"][k]["success_rate"] == warm["success_rate"] for k in LEVELS)


@pytest.fixture(scope="module")
def smoke_warm_start(tmp_path_factory) -> Path:
    from testbed.pipeline import warm_start

    return warm_start(tmp_path_factory.mktemp("warm"), smoke=True)


@pytest.mark.heavy
def test_toy_run_on_the_default_bed(tmp_path, smoke_warm_start, capsys):
    """The smoke warm start rarely succeeds, so RFT and MT-DPO find nothing to learn from and
    are evaluated as the warm start (said in their notes): the summary's schema, the search
    record (a grid of 1 and 3, a tie goes to 1), and the solver's finite-sample predictions
    at the run's own budget (4 tasks x 8 episodes)."""
    from testbed import predict

    summary = run_bench(tmp_path / "out", "--policies", "rft,mtdpo", "--hp-grid", "1,3", "--predict-finite", "2",
                        "--val-limit", "8", "--warm-start", str(smoke_warm_start))
    assert summary["bed"] == "default" and summary["seeds"] == 1
    check_schema(summary, ["warm_start", "rft", "mtdpo"])
    from testbed import bed as tb

    taught = tb.teacher_design("default")  # the solver predicts from the warm start's teacher (reads, by default)
    finite = predict.predict_finite(taught, 2, 4, 8, candidates=8)
    population = predict.predict(taught)
    assert population.warm_start == pytest.approx(0.5395, abs=5e-5)
    for name in ("rft", "mtdpo"):
        assert summary["policies"][name]["predicted"] == {f"{k:.1f}": round(v[0], 4) for k, v in finite[name].items()}
    assert summary["policies"]["warm_start"]["predicted"] == round(population.warm_start, 4)
    assert summary["predicted"] == {"warm_start": round(population.warm_start, 4),
                                    "optimum": round(population.optimum, 4), "source": "predict_finite"}
    pair = next(r for r in summary["pairs"] if r["a"] == "rft" and r["b"] == "mtdpo" and r["kl"] == "1.0")
    assert pair["predicted_gap"] == round(summary["policies"]["rft"]["predicted"]["1.0"]
                                          - summary["policies"]["mtdpo"]["predicted"]["1.0"], 4)
    hp = summary["hp"]
    assert hp["grid"] == [1.0, 3.0] and hp["choice"] == {"rft": 1.0, "mtdpo": 1.0}
    assert set(hp["validation"]["rft"]) == {"1", "3"} and "mean" in hp["validation"]["rft"]["3"]
    out = tmp_path / "out"
    assert (out / "frontier.png").stat().st_size > 0
    # the search ran on the first 8 validation tasks (--val-limit), 2 episodes each, and says so
    val = json.loads((out / "seed0" / "validation" / "leaderboard.json").read_text())
    assert {(r["n_tasks"], r["n_episodes"]) for r in val} == {(8, 16)}, val
    assert "the first 8, 2 episodes each" in hp["rule"]
    text = (out / "results.md").read_text()
    assert "*KL 0.00" in text and "Pairs (gap a − b)" in text
    # the repeat rate at matched KL, measured on the same episodes as success, beside the solver's
    # for a tabular policy and for one blind to the dialogue (testbed.policy_class)
    from testbed import mdp, policy_class as testbed_policy_class, profile as testbed_profile
    from colbench.episodes import read_episodes

    warm = summary["policies"]["warm_start"]
    episodes = read_episodes(out / "seed0" / "eval" / "episodes" / "warm_start.jsonl")
    assert warm["success_rate"]["value"] == pytest.approx(sum(e.success for e in episodes) / len(episodes))
    assert warm["tests_passed"]["value"] == pytest.approx(sum(e.reward for e in episodes) / len(episodes))
    assert warm["at_kl"]["0.5"]["repeat_rate"]["value"] == pytest.approx(
        testbed_profile.profile("default", episodes).metrics["repeat"].value)
    check_metric(warm["at_kl"]["1.0"]["repeat_rate"])
    # the reading teacher's repeat rate; the blind class does not hold a reading warm start, so
    # there is no blind prediction (testbed.policy_class.holds_warm_start)
    assert warm["predicted_repeat"] == {"history": 0.2}
    assert not testbed_policy_class.holds_warm_start(mdp.build(taught), "turn")
    _, (tabular,) = testbed_policy_class.predict_classes(taught, ("history",))
    assert summary["policies"]["mtdpo"]["predicted_repeat"] == {"history": tabular.to_json()["repeat_rate"]["mtdpo"]}
    assert all("predicted_blind" not in m for m in summary["policies"].values())
    assert "How often the second question repeats the first" in text and "| tabular | blind" in text

    # the seed's record alone gives the same summary and tables, training nothing (--records):
    # seeds measured by separate runs combine
    record = out / "records" / "seed0.json"
    again = tmp_path / "again"
    res = subprocess.run([sys.executable, "-m", "testbed.learning", "--records", str(record), "--out", str(again)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "nothing is trained" in res.stdout and not (again / "seed0").exists()
    assert json.loads((again / "summary.json").read_text()) == summary
    assert (again / "results.md").read_text() == text
    data = json.loads(record.read_text())
    assert data["policies"]["mtdpo"]["path"]["tasks"] == list(summary_tasks(out))
    import torch

    assert data["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert data["machine"]["torch"] == torch.__version__ and summary["machines"] == {"0": data["machine"]}
    twice = tmp_path / "seed1.json"  # the same numbers under another seed, from another machine
    elsewhere = "AVX2" if data["machine"]["torch_cpu_capability"] != "AVX2" else "AVX512"
    other = {**data["machine"], "torch_cpu_capability": elsewhere}
    twice.write_text(json.dumps({**data, "seed": 1, "warm_start": {**data["warm_start"], "model": "elsewhere"},
                                 "machine": other}))
    both = learning.main(["--records", str(record), str(twice), "--out", str(tmp_path / "both")])
    assert both["seeds"] == 2 and both["machines"] == {"0": data["machine"], "1": other}
    assert "the seeds ran on different machines" in capsys.readouterr().out
    assert both["policies"]["rft"]["success_rate"]["value"] == pytest.approx(summary["policies"]["rft"]["success_rate"]["value"])


def summary_tasks(out: Path) -> list[str]:
    from testbed.frontier import tasks_of

    return tasks_of(out / "seed0" / "eval" / "episodes" / "warm_start.jsonl")


@pytest.mark.parametrize("change, message", [
    ({"protocol": {"path_epochs": 99}}, "field 'protocol' differs from"),
    ({"warm_start": {"model": "elsewhere", "sha256": "y"}}, "field 'warm_start' differs from"),
    ({"seed": 0}, "seed 0 is already given"),
    ({"version": 0}, "not a version-1 seed record"),
])
def test_records_of_another_protocol_or_the_same_seed_do_not_combine(tmp_path, capsys, change, message):
    first = {"version": 1, "seed": 0, "bed": "default", "teacher": "reads", "warm_start": {"sha256": "x"},
             "protocol": {"path_epochs": 4}, "setup": {}, "policies": {"warm_start": {}}, "hp": {}}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps({**first, "seed": 1, **change}))
    with pytest.raises(SystemExit) as stop:
        learning.main(["--records", str(a), str(b), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--records {b}: {message}" in err


@pytest.mark.slow
def test_toy_run_with_training_paths(tmp_path):
    """A warm start that imitated the always-asking explorer answers on the legacy bed's
    last turn, so LOOP (online, one iteration per 48 episodes) and RFT train: their paths
    hold snapshots at KL > 0, the final KL is the path's end, and a level a path does not
    reach is reported at its largest KL."""
    from testbed.warm_start import WarmStartConfig
    from testbed.warm_start import main as imitate

    warm = imitate(WarmStartConfig(output_dir=str(tmp_path / "ws"), bed="legacy", p_ask=1.0, n_dialogues=800,
                                   epochs=1, batch_size=16, learning_rate=2e-3))
    out = tmp_path / "out"
    summary = run_bench(out, "--bed", "legacy", "--policies", "rft,loop", "--hp-grid", "1", "--episodes-per-task",
                        "24", "--snapshot-steps", "2", "--warm-start", str(warm))
    check_schema(summary, ["warm_start", "rft", "loop"])
    paths = json.loads((out / "results.json").read_text())["per_seed"]["0"]
    loop = paths["loop"]["path"]
    assert [p["step"] for p in loop] == [0, 1, 2] and loop[0]["kl"] == 0.0 and all(p["kl"] > 0 for p in loop[1:])
    assert summary["policies"]["loop"]["kl"] == loop[-1]["kl"]
    assert summary["policies"]["loop"]["budget"]["online_episodes"] == 96  # LOOP generated the offline budget
    assert summary["policies"]["rft"]["budget"] == {"episodes": 96, "online_episodes": 0, "candidates": 0}
    top = max(p["kl"] for p in loop)
    at = summary["policies"]["loop"]["at_kl"]["2.0"]
    assert top < 2.0 and not at["reached"] and at["kl"] == pytest.approx(top, abs=1e-4)  # results.json rounds
    if not paths["rft"]["note"]:
        rft = paths["rft"]["path"]
        assert len(rft) >= 2 and all(p["kl"] > 0 for p in rft[1:])
