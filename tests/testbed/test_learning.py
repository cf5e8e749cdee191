"""testbed/learning.py's check of a critic's stage-2 rankings against the test bed's exact
advantage, on a real test-bed episode and hand-scored candidates."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from testbed import critic_check, learning
from testbed.env import DEFAULT_B, QUESTION_NEG, QUESTION_POS, QUESTION_VAGUE, answer_text
from testbed.pipeline import TestbedSetup

ROOT = Path(__file__).resolve().parents[2]


def test_critic_rankings_are_checked_against_the_exact_advantage(tmp_path, scripted_testbed_episode):
    """The episode (tests/conftest.py) asks vague, vague, positive, then answers on its last turn."""
    task, ep = scripted_testbed_episode.task, scripted_testbed_episode.episode
    a, b = task.meta["a"], task.meta["b"]
    sd = tmp_path / "seed0"
    sd.mkdir()
    shutil.copy(scripted_testbed_episode.path, sd / "episodes.jsonl")
    assert ep.success
    episode_id = f"{task.task_id}/policy/0"

    def row(turn: int, scored: list[tuple[str, float]]) -> dict:
        return {"key": f"{episode_id}#{turn}", "task_id": task.task_id, "episode_id": episode_id, "turn_index": turn,
                "candidates": [{"text": t, "token_ids": [1], "advantage": adv, "finish_reason": "stop"} for t, adv in scored]}

    both = "What happens to positive and negative numbers?"
    rows = [
        # first turn (4 left): A* (success-valued, testbed.mdp.exact_advantage) = 0 for any question,
        # -1 for answering at once. The critic orders both (question, answer) pairs right and
        # splits the two questions (same A*: not a pair, a tie).
        row(0, [(QUESTION_NEG, 0.5), (QUESTION_VAGUE, 0.1), (answer_text(1, 0), -2.0)]),
        # two turns before the end, nothing known: no action of the bed can still succeed
        # (A* 0), but the question naming both sides and the lucky right answer do (+1).
        # Pairs: (both, vague) right, (both, positive) wrong, (answer, vague) and (answer,
        # positive) right: 3 of 4; the question pairs 1 of 2; (both, answer), (vague, positive) tie.
        row(2, [(both, 0.3), (QUESTION_VAGUE, 0.25), (answer_text(a, b), 0.4), (QUESTION_POS, 0.35)]),
        # last turn, A told (V* = 0): the right answer (B guessed) +1, a wrong B 0, a question
        # 0. The critic orders both pairs backwards: 0 of 2 right.
        row(3, [(answer_text(a, b), 1.0), (answer_text(a, DEFAULT_B), 1.5), (QUESTION_NEG, 2.0)]),
    ]
    (sd / "sweet").mkdir(parents=True)
    (sd / "sweet" / "candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    checks = critic_check.critic_vs_oracle(tmp_path, [0], ["rft", "sweet", "sweet_sum"], TestbedSetup.for_bed("legacy"))
    assert set(checks) == {"sweet"}  # rft has no critic; sweet_sum has no candidates here
    c = checks["sweet"]
    assert c["n_pairs"] == 8 and c["pairs"] == 5 / 8  # turn 0: 2 of 2 right; turn 2: 3 of 4; last turn: 0 of 2
    assert c["n_states"] == 3 and c["top1"] == 2 / 3 and c["n_last"] == 1 and c["top1_last"] == 0.0
    assert c["n_questions"] == 2 and c["questions"] == 0.5
    # equal A*: one pair at turn 0, two at turn 2, one at the last turn, all scored apart
    assert c["n_ties"] == 4 and c["ties_split"] == 1.0
    assert c["per_turn"] == {"0": {"pairs": 1.0, "n_pairs": 2}, "2": {"pairs": 0.75, "n_pairs": 4},
                             "3": {"pairs": 0.0, "n_pairs": 2}}
    # stage 2's own pairs, drawn again (no config.json here: 4 per state, seed 0): turn 0 pairs
    # the question (top) with the answer (bottom), 4 as A*; the last turn pairs the question
    # with the right answer, 4 reversed; turn 2's top half {answer +1, positive 0} against
    # {both +1, vague 0} gives A*-ties or not by the draw
    s2 = c["stage2"]
    assert s2["pairs"] == 12 and s2["agree"] + s2["tied"] + s2["reversed"] == 12
    assert s2["agree"] >= 4 and s2["reversed"] >= 4 and s2["tied"] >= 1
    table = critic_check.checks_table(checks)
    drawn = f"{s2['agree']} / {s2['tied']} / {s2['reversed']} (of 12)"
    assert f"| sweet | 0.62 (of 8) | 0.67 (of 3) | 0.00 (of 1) | 0.50 (of 2) | 1.00 (of 4) | {drawn} |" in table
    assert "| sweet | 1.00 (of 2) | 0.75 (of 4) | 0.00 (of 2) |" in table  # per turn 0, 2, 3

    # the run's own settings, from its config.json: one pair per state, and its seed
    (sd / "sweet" / "config.json").write_text(json.dumps({
        "sweet": {"episodes": "/elsewhere/episodes.jsonl", "tasks": TestbedSetup.for_bed("legacy").train_tasks,
                  "env": "testbed", "episode_fraction": 1.0, "pairs_per_state": 1}, "train": {"seed": 7}}))
    one = critic_check.critic_vs_oracle(tmp_path, [0], ["sweet"], TestbedSetup.for_bed("legacy"))["sweet"]["stage2"]
    assert one["pairs"] == 3 and one["agree"] >= 1 and one["reversed"] >= 1


@pytest.mark.heavy
def test_the_solvers_needed_agreement_is_computed_once_and_tabled_beside_the_check(tmp_path):
    setup = TestbedSetup.for_bed("default")
    needed = learning.agreement_needed("default", setup, tmp_path)
    assert json.loads((tmp_path / "agreement_needed.json").read_text())["agreement_needed"] == needed
    (tmp_path / "agreement_needed.json").write_text(json.dumps({"key": {"bed": "default", "episodes_per_task":
                                                               setup.episodes_per_task, "candidates": setup.candidates},
                                                               "agreement_needed": {**needed, "bed": "cached"}}))
    assert learning.agreement_needed("default", setup, tmp_path)["bed"] == "cached"  # read back, not recomputed
    (tmp_path / "agreement_needed.json").write_text(json.dumps({"key": {"spec": "default", "episodes_per_task":
                                                               setup.episodes_per_task, "candidates": setup.candidates},
                                                               "agreement_needed": {**needed, "bed": "old"}}))
    assert learning.agreement_needed("default", setup, tmp_path)["bed"] == "old"  # a cache keyed "spec" too
    table = learning.needed_table(needed)
    # on `default` the exact critic is below MT-DPO at KL 0.5 and 1 (0.624, 0.697 against 0.646, 0.716)
    assert "| Q* + noise per action | none suffices (the oracle is below MT-DPO) | none suffices" in table
    assert "The solver's own learned critics, same measure in the population: sweet 1.00 (turn 0 1.00" in table


def test_credit_splits_pool_over_seeds_by_pairs_and_table_the_answers_share():
    from testbed.critic_check import credit_table, pool_splits

    seeds = [{"pairs": 10, "earlier": 1.0, "last": 3.0, "ordered_by_earlier": 0.5, "ordered_by_last": 1.0},
             {"pairs": 30, "earlier": -1.0, "last": 5.0, "ordered_by_earlier": 0.7, "ordered_by_last": 0.9}]
    pooled = pool_splits(seeds)
    assert pooled["pairs"] == 40
    assert pooled["earlier"] == pytest.approx((10 - 30) / 40) and pooled["last"] == pytest.approx((30 + 150) / 40)
    assert pooled["ordered_by_earlier"] == pytest.approx(0.65) and pooled["ordered_by_last"] == pytest.approx(0.925)
    assert pooled["last_share"] == pytest.approx(4.5 / 4.0)  # the questions' terms point the other way
    table = credit_table({"sweet": {"pooled": pooled, "per_seed": {}}})
    assert "| sweet | 40 | +4.00 | 112% | 0.93 | 0.65 |" in table


def test_sweet_variants_rank_the_candidates_the_first_finished_variant_sampled(tmp_path):
    sd = tmp_path / "seed0"
    from sweet.core.trainer import mark_finished

    assert learning.shared_candidates(sd, "sweet_no_info") == {}  # nothing finished yet: it samples
    (sd / "sweet_no_info" / "final").mkdir(parents=True)
    (sd / "sweet_no_info" / "final" / "config.json").write_text("{}")
    assert learning.shared_candidates(sd, "sweet_sum") == {}  # a final/ without the finished marker: unfinished
    mark_finished(sd / "sweet_no_info", final="final")
    assert learning.shared_candidates(sd, "sweet_sum") == {}  # a marker whose final/ holds no weights: unfinished
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(sd / "sweet_no_info" / "final" / "model.safetensors"))
    assert learning.shared_candidates(sd, "sweet") == {}  # only earlier variants (the run order) are sources
    assert learning.shared_candidates(sd, "sweet_sum") == {"reuse_candidates": str(sd / "sweet_no_info" / "candidates.jsonl")}
    assert learning.shared_candidates(sd, "rft") == {} and learning.shared_candidates(sd, "loop") == {}


def test_a_variant_with_sweets_critic_settings_uses_sweets_critic():
    assert learning.critic_owner("sweet") == "sweet"
    assert learning.critic_owner("sweet_anchor") == "sweet"  # only its stage 2 differs
    assert learning.critic_owner("sweet_no_info") == "sweet_no_info"
    assert dict(learning.POLICIES["sweet_anchor"].stage2_settings) == {"anchor_coef": 1.0}
    assert "sweet_anchor" in learning.DIAGNOSTICS  # run only when named

@pytest.mark.slow
def test_parallel_jobs_train_and_evaluate_exactly_as_one_process(tmp_path):
    """`--jobs 2` runs (seed, policy) jobs in worker processes with one torch thread each;
    with one thread in the parent too, every trained weight, sample count and evaluation
    metric must be the one `--jobs 1` produces, each under its own seed and name."""
    import os
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file

    from testbed.warm_start import WarmStartConfig
    from testbed.warm_start import main as imitate

    # the tiny model after a short imitation of the always-asking explorer: it writes code
    # that passes some tests, so LOOP's groups have reward variance to learn from
    warm = imitate(WarmStartConfig(output_dir=str(tmp_path / "ws"), p_ask=1.0, n_dialogues=800, epochs=1,
                                   batch_size=16, learning_rate=2e-3))
    runs = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        subprocess.run([sys.executable, "-m", "testbed.learning", "--bed", "legacy", "--seeds", "2",
                        "--policies", "rft,loop",
                        "--warm-start", str(warm),
                        "--train-limit", "2", "--test-limit", "2", "--episodes-per-task", "4", "--jobs", str(jobs),
                        "--out", str(out)], check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=900)
        runs[jobs] = out

    def record(jobs: int, name: str):
        """A run's JSON output without what may differ: wall times, and the run's folder
        inside notes (e.g. "untrained (<out>/seed0/episodes.jsonl: no episode ...)")."""
        def strip(x):
            return {k: strip(v) for k, v in x.items() if k != "train_wall_s"} if isinstance(x, dict) else x
        return strip(json.loads((runs[jobs] / name).read_text().replace(str(runs[jobs]), "OUT")))

    assert record(1, "results.json")["per_seed"] == record(2, "results.json")["per_seed"]
    trained = 0
    for seed in (0, 1):
        for name in ("rft", "loop"):
            final = Path(f"seed{seed}") / name / "final" / "model.safetensors"
            if not (runs[1] / final).exists():
                assert not (runs[2] / final).exists()
                continue
            a, b = load_file(runs[1] / final), load_file(runs[2] / final)
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (seed, name)
            trained += 1
    assert trained >= 2  # LOOP trains online on both seeds whatever the warm start's success
    assert record(1, "summary.json") == record(2, "summary.json")


def test_paths_are_evaluated_at_geometrically_spaced_snapshots_from_the_first_to_the_last():
    assert learning.spaced([1, 2, 3], 8) == [1, 2, 3]
    assert learning.spaced(list(range(1, 27)), 8) == [1, 2, 3, 5, 7, 11, 17, 26]
    assert learning.spaced(list(range(1, 10)), 8) == [1, 2, 3, 4, 5, 6, 7, 9]  # merged early points refilled
    assert learning.spaced(list(range(1, 10)), 1) == [9]


def test_hp_grid_flag_parses_fractions_and_puts_the_base_rate_first():
    assert learning._grid("1/3,1,3") == (1.0, 1 / 3, 3.0)
    assert learning._grid("1") == (1.0,)
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="must be > 0"):
        learning._grid("0,1")


def test_runs_at_other_learning_rates_are_evaluated_under_their_own_names(tmp_path):
    """A policy's run at the base rate and at a searched multiplier must never share (or
    resume) evaluation episodes: each point is named after its run's folder."""
    sd = tmp_path / "seed0"
    base = {"folder": str(learning.policy_dir(sd, "mtdpo", 1.0))}
    scaled = {"folder": str(learning.policy_dir(sd, "mtdpo", 3.0))}
    names = {learning.point_name(learning.run_label("mtdpo", r), 8) for r in (base, scaled)}
    assert names == {"mtdpo.step-8", "mtdpo.lr3.step-8"}
    assert learning.point_name(learning.run_label("warm_start", {"points": []}), 0) == "warm_start"


@pytest.mark.parametrize("flag", ["--train-limit", "--test-limit", "--val-limit"])
def test_a_task_limit_below_one_is_a_one_line_usage_error(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as stop:
        learning.main([flag, "0", "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert f"{flag} must be >= 1 (or left out: all tasks)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written
