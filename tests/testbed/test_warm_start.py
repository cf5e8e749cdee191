"""The warm start's copy check (testbed/warm_start.py): the held-out cases and their scoring."""

import json
from pathlib import Path

import pytest

from testbed.env import DEFAULT_A, DEFAULT_B, MAX_TURNS, answer_text
from testbed import bed as tb
from testbed import pipeline
from testbed.warm_start import copy_check_dialogues, copy_score


def test_copy_check_cases_are_held_out_three_question_dialogues_with_what_was_told():
    """On the legacy bed (4 turns) the always-asking explorer asks three times."""
    cases = copy_check_dialogues(n=40, seed=0, bed="legacy")
    assert len(cases) == 40
    kinds = set()
    for task, turns, (a, b) in cases:
        assert task.meta["split"] == "test"  # the legacy bed has no validation tasks
        assert [t.role for t in turns] == ["agent", "human"] * (MAX_TURNS - 1)  # three questions, no answer yet
        replies = [t.content for t in turns if t.role == "human"]
        assert (a is not None) == any(f"x * {task.meta['a']}" in r for r in replies)
        assert (b is not None) == any(f"x + {task.meta['b']}" in r for r in replies)
        assert a in (None, task.meta["a"]) and b in (None, task.meta["b"])
        kinds.add((a is not None, b is not None))
    assert {(True, True), (True, False), (False, True)} <= kinds  # one or both constants told
    assert copy_check_dialogues(n=40, seed=0, bed="legacy")[7][1] == cases[7][1]  # deterministic


def test_copy_score_counts_each_told_constant_once():
    told = [(3, 20), (2, None), (None, 10)]
    legacy = {"bed": "legacy"}
    right = [answer_text(3, 20), answer_text(2, DEFAULT_B), answer_text(DEFAULT_A, 10)]
    assert copy_score(right, told, **legacy) == 1.0
    # the defaults for what was not told are not held against it; miscopies are
    miscopied = [answer_text(2, 20), answer_text(3, 10), answer_text(2, 20)]
    assert copy_score(miscopied, told, **legacy) == pytest.approx(1 / 4)
    # no answer marker: the whole message is read as code; a question has none
    assert copy_score(["What happens to positive numbers?"] * 3, told, **legacy) == 0.0
    with pytest.raises(ValueError):
        copy_score([answer_text(3, 20)], told, **legacy)  # one answer per case


def test_bed_copy_check_asks_on_every_turn_but_the_last_and_wants_the_explorers_answer():
    """On a 3-turn bed the always-asking explorer asks twice; the check wants every
    constant as the explorer writes it: told ones copied, the fixed guess for the rest."""
    s = tb.design("default")
    cases = copy_check_dialogues(n=40, seed=0, bed="default")
    for task, turns, want in cases:
        assert task.meta["split"] == "val" and task.meta["bed"] == "default"  # never a test task
        assert [t.role for t in turns] == ["agent", "human"] * (s.turns - 1)
        replies = [t.content for t in turns if t.role == "human"]
        assert want == tb.guess_values(s, tb.told_values(s, replies))
    told = {sum(v is not None for v in tb.told_values(s, [t.content for t in turns if t.role == "human"]))
            for _, turns, _ in cases}
    assert told == {0, 1, 2}  # nothing, one side, or both (the docstring) told
    answers = [tb.answer_text(s, want) for _, _, want in cases]
    assert copy_score(answers, [w for _, _, w in cases], bed="default") == 1.0
    wrong = [tb.answer_text(s, (3, 20)) for _ in cases]  # the non-guess values everywhere
    expected = sum((w[0] == 3) + (w[1] == 20) for _, _, w in cases) / (2 * len(cases))
    assert copy_score(wrong, [w for _, _, w in cases], bed="default") == pytest.approx(expected)


def test_a_checked_phase_trains_again_until_the_bar_and_records_each_pass(tmp_path, monkeypatch):
    """A warm-start phase stops at the first pass over the bar, each pass continuing the
    last at its own learning rate; the reading teacher's behave phase also needs a pass that
    reads (`reads_gate`, only on passes that copy), later passes one epoch each; it resumes
    from <phase>_check.json, and raises rather than hand on a warm start that cannot copy."""
    trained, measured, read = [], [], []
    accuracy = {"copy": 0.5, "copy-2": pipeline.COPY_PASS, "behave": pipeline.BEHAVE_PASS - 0.01, "behave-2": 1.0,
                "behave-3": 1.0}
    reading = {"behave-2": False, "behave-3": True}

    def fake_reads(model, out, bed, teacher):
        read.append((model.split("/")[-2], out.name, bed, teacher))
        ok = reading[model.split("/")[-2]]
        return {"cells": 5, "teacher_within": 5 if ok else 2, "blind_within": 0 if ok else 1, "passed": ok}

    def fake_run(cfg):
        trained.append(cfg)
        return Path(cfg.output_dir) / "final"

    def fake_accuracy(model, seed=0, **bed):
        measured.append(model)
        return accuracy[model.split("/")[-2]]

    monkeypatch.setattr("testbed.warm_start.main", fake_run)
    monkeypatch.setattr("testbed.warm_start.copy_accuracy", fake_accuracy)
    monkeypatch.setattr(pipeline, "reads_gate", fake_reads)
    model = pipeline.warm_start(tmp_path / "ws", seed=0)
    assert model == tmp_path / "ws" / "behave-3" / "final"
    assert [c.output_dir.rsplit("/", 1)[1] for c in trained] == ["copy", "copy-2", "behave", "behave-2", "behave-3"]
    ws = str(tmp_path / "ws")
    assert [c.model for c in trained] == ["tiny", f"{ws}/copy/final", f"{ws}/copy-2/final", f"{ws}/behave/final",
                                          f"{ws}/behave-2/final"]
    assert [c.learning_rate for c in trained] == [2e-3, 1e-3, 1e-3, 1e-3, 1e-3]
    assert [c.p_ask for c in trained] == [1.0, 1.0, 0.75, 0.75, 0.75]  # the default bed's explorer in phase 2
    assert {c.bed for c in trained} == {"default"}
    assert [c.n_dialogues for c in trained] == [1600, 1600, 1800, 1800, 1800]  # the reading teacher's behave phase
    assert [c.epochs for c in trained] == [1, 1, 3, 1, 1]
    assert read == [("behave-2", "behave-2-reads", "default", None), ("behave-3", "behave-3-reads", "default", None)]
    assert pipeline.behave_size("default", "blind") == pipeline.behave_size("legacy", None) == (600, 1)
    assert len({c.seed for c in trained}) == 5  # fresh dialogues each pass
    for phase, want in (("copy", [0.5, pipeline.COPY_PASS]), ("behave", [pipeline.BEHAVE_PASS - 0.01, 1.0, 1.0])):
        record = json.loads((tmp_path / "ws" / f"{phase}_check.json").read_text())
        assert [r["copy_accuracy"] for r in record] == want
    behave = json.loads((tmp_path / "ws" / "behave_check.json").read_text())
    assert [r.get("reads", {}).get("passed") for r in behave] == [None, False, True]
    from testbed.demo import warm_start_checks

    assert warm_start_checks(tmp_path / "ws") == (
        "warm start checks: copy retried: passed on pass 2 (0.50; 0.90); behave retried: passed on pass 3 "
        "(0.96; 1.00, reads 2 of 5 (blind 1); 1.00, reads 5 of 5 (blind 0))")
    assert pipeline.warm_start(tmp_path / "ws", seed=0) == model  # resumed: nothing measured again
    assert len(measured) == 5 and len(read) == 2
    # no pass reads: the last one that copies is kept, and the checks line says so
    reading.update({"behave-3": False, "behave-4": False})
    accuracy["behave-4"] = 1.0
    assert pipeline.warm_start(tmp_path / "unread", seed=0) == tmp_path / "unread" / "behave-4" / "final"
    assert "behave did not read in 4 passes" in warm_start_checks(tmp_path / "unread")
    # the blind teacher's behave phase has nothing to read
    read.clear()
    pipeline.warm_start(tmp_path / "blind", seed=0, teacher="blind")
    assert read == []
    accuracy.update({"copy-2": 0.5, "copy-3": 0.5, "copy-4": 0.5})
    with pytest.raises(RuntimeError, match="copy phase did not reach"):
        pipeline.warm_start(tmp_path / "other", seed=0)


def test_the_optimal_teacher_imitates_the_solvers_optimal_agent():
    """--teacher optimal: the dialogues are the exact solver's optimal agent's, their scored
    success is the solver's optimum on those tasks, and they never repeat a question."""
    from testbed import mdp
    from testbed import profile as testbed_profile
    from testbed.env import make_tasks
    from sweet.core.models import load_tokenizer
    from testbed.warm_start import WarmStartConfig, scripted_episodes

    eps = scripted_episodes(load_tokenizer("tiny"), 56, 0.75, seed=0, bed="default", teacher="optimal")
    tasks = make_tasks("train", bed="default")
    for ep in eps[:8]:
        texts = [t.content for t in ep.turns]
        assert all(texts[i] == mdp.optimal_message("default", texts[:i]) for i in range(0, len(texts), 2))
    assert sum(e.success for e in eps) / 56 == pytest.approx(mdp.expected_success_on("default", tasks, "optimal"))
    prof = testbed_profile.profile("default", eps)
    assert prof.metrics["repeat"].value == 0.0 and prof.metrics["early"].value == 0.0
    with pytest.raises(ValueError, match="teacher"):
        WarmStartConfig(teacher="oracle")
    with pytest.raises(ValueError, match="optimal needs a non-legacy bed"):
        WarmStartConfig(teacher="optimal", bed="legacy")
    with pytest.raises(ValueError, match="optimal_shuffled needs a non-legacy bed"):
        WarmStartConfig(teacher="optimal_shuffled", bed="legacy")


def test_the_shuffled_optimal_teacher_asks_either_side_first_and_never_repeats():
    """--teacher optimal_shuffled: each dialogue is the optimal agent's under one order of
    the facts, both sides come first, none repeats or answers early, and the success
    matches the solver's exact value of the shuffled agent within sampling noise."""
    import itertools
    import math

    from testbed import mdp
    from testbed import profile as testbed_profile
    from testbed.env import make_tasks
    from sweet.core.models import load_tokenizer
    from testbed.warm_start import scripted_episodes

    n = 224
    eps = scripted_episodes(load_tokenizer("tiny"), n, 0.75, seed=0, bed="default", teacher="optimal_shuffled")
    firsts = set()
    for ep in eps:
        texts = [t.content for t in ep.turns]
        firsts.add(texts[0])
        assert any(all(texts[i] == mdp.optimal_message("default", texts[:i], order)
                       for i in range(0, len(texts), 2)) for order in itertools.permutations(range(2))), texts
    assert len(firsts) == 2
    prof = testbed_profile.profile("default", eps)
    assert prof.metrics["repeat"].value == 0.0 and prof.metrics["early"].value == 0.0
    tasks = make_tasks("train", bed="default")
    exact = mdp.expected_success_on("default", [tasks[i % len(tasks)] for i in range(n)], "optimal_shuffled")
    rate = sum(e.success for e in eps) / n
    assert abs(rate - exact) <= 1.96 * math.sqrt(exact * (1 - exact) / n), (rate, exact)
