"""The warm start's teachers (testbed/bed.py TEACHERS): the explorer that reads its dialogue
(after a side question it asks another side with probability p_other) and the blind one;
the solver's π0 is the named teacher's exact tabular policy, recorded in the warm start's
settings."""

import json
import math
import random

import pytest

from testbed import mdp
from testbed import policy_class as pc
from testbed import profile as tp
from testbed import bed as tb
from testbed.env import make_tasks

POS, NEG = (tb.question(f) for f in tb.design("default").fact_list)


def _answers_other_side_more_after_a_side(s: tb.BedDesign) -> bool:
    """Whether the explorer's next question depends on which side it just asked: after
    "positive" it asks "negative" more often than after "negative", and vice versa."""
    told = tb.not_sure_sentence
    after_pos = tb.explorer_probs(s, [POS, told(s.fact_list[0])])
    after_neg = tb.explorer_probs(s, [NEG, told(s.fact_list[1])])
    return after_pos[NEG] > after_neg[NEG] + 1e-9 and after_neg[POS] > after_pos[POS] + 1e-9


def test_the_reading_teachers_choice_depends_on_the_dialogue_the_blind_ones_does_not():
    reads, blind = tb.teacher_design("default", "reads"), tb.teacher_design("default", "blind")
    assert reads.p_other == tb.READS_P_OTHER == 0.5 and blind.p_other == 0.0
    assert _answers_other_side_more_after_a_side(reads)
    assert not _answers_other_side_more_after_a_side(blind)  # the same check fails for the blind teacher
    after = tb.explorer_probs(reads, [POS, tb.not_sure_sentence(reads.fact_list[0])])
    assert after[NEG] == pytest.approx(0.5 + 0.5 * 0.25) and after[POS] == pytest.approx(0.5 * 0.25)
    assert sum(after.values()) == pytest.approx(1.0)
    # the first turn, and after the vague question, it chooses as the blind explorer does
    assert tb.explorer_probs(reads, []) == tb.explorer_probs(blind, [])
    assert tb.explorer_probs(reads, [tb.QUESTION_VAGUE, tb.DONT_KNOW]) == tb.explorer_probs(blind, [tb.QUESTION_VAGUE,
                                                                                                     tb.DONT_KNOW])
    # its sampled dialogues follow it: P(other side | a side, then a question) = 0.625 / 0.875, the blind one's 1/3
    tasks = make_tasks("train", bed="default")
    from testbed.human import scripted_dialogue

    for p_other, want in ((0.5, 0.625 / 0.875), (0.0, 1 / 3)):
        rng, other, n = random.Random(0), 0, 0
        for i in range(800):
            qs = [t for role, t in scripted_dialogue(tasks[i % len(tasks)], rng, 0.75, p_other)[:-1] if role == "agent"]
            if len(qs) == 2 and qs[0] != tb.QUESTION_VAGUE:
                n, other = n + 1, other + (qs[1] not in (qs[0], tb.QUESTION_VAGUE))
        assert abs(other / n - want) < 3 * math.sqrt(want * (1 - want) / n), (p_other, other / n)


def test_teacher_names_and_bad_values_are_one_line_errors():
    assert tb.default_teacher("default") == "reads" and tb.default_teacher("legacy") == "blind"
    assert tb.teacher_design("default").p_other == tb.READS_P_OTHER
    assert tb.teacher_design("default", "reads", 0.25).p_other == 0.25
    with pytest.raises(ValueError, match="teacher: 'peeks'; one of reads, blind"):
        tb.teacher_design("default", "peeks")
    with pytest.raises(ValueError, match="needs a non-legacy bed"):
        tb.teacher_design("legacy", "reads")
    with pytest.raises(ValueError, match="p_other: 0.3 with teacher 'blind'"):
        tb.teacher_design("default", "blind", 0.3)
    with pytest.raises(ValueError, match="p_other"):
        tb.BedDesign("x", p_other=1.5)


def test_the_solvers_warm_start_is_the_teachers_and_the_blind_teacher_keeps_the_old_figures():
    """The reading teacher: success 0.540 (at most 0.55, the optimum 0.784), repeat rate 0.20;
    the blind one by name: today's 0.490 and 1/3, the default preset's own π0."""
    figures = {}
    for teacher in ("reads", "blind"):
        bed = mdp.build(tb.teacher_design("default", teacher))
        figures[teacher] = (mdp.evaluate(bed, bed.logp0).success, pc.repeat_rate(bed, bed.logp0), mdp.optimum(bed)[0])
    assert figures["reads"] == pytest.approx((0.5395, 0.2, 0.7844), abs=5e-5)
    assert figures["blind"] == pytest.approx((0.4902, 1 / 3, 0.7844), abs=5e-5)
    plain = mdp.build("default")
    assert mdp.evaluate(plain, plain.logp0).success == pytest.approx(figures["blind"][0])


def test_the_solvers_value_matches_the_scripted_teachers_dialogues():
    """Monte Carlo: the scored success of the reading teacher's scripted warm-start dialogues
    lies within the binomial 95% interval of the solver's exact value on the same tasks."""
    from sweet.core.models import load_tokenizer
    from testbed.warm_start import scripted_episodes

    n = 1200
    eps = scripted_episodes(load_tokenizer("tiny"), n, 0.75, seed=0, bed="default", teacher="reads")
    tasks = make_tasks("train", bed="default")
    exact = mdp.expected_success_on(tb.teacher_design("default", "reads"), [tasks[i % len(tasks)] for i in range(n)])
    rate = sum(e.success for e in eps) / n
    assert abs(rate - exact) <= 1.96 * math.sqrt(exact * (1 - exact) / n), (rate, exact)
    check = tp.reads_check("default", "reads", eps)
    assert check.matched == len(check.cells())  # the teacher's own dialogues match its exact profile
    # the five cells that tell reading from not (repeat rate, the four moves after a side): every
    # interval holds the teacher's value and none the blind explorer's
    assert check.telling() == (5, 5, 0)
    assert check.reads()  # the warm start's reading gate (testbed.pipeline.reads_gate) passes the teacher itself
    assert tp.reads_check("default", "blind", eps).matched < len(check.cells()) - 2  # ... and not the blind one's
    unread = scripted_episodes(load_tokenizer("tiny"), n, 0.75, seed=0, bed="default", teacher="blind")
    assert not tp.reads_check("default", "reads", unread).reads()  # the gate fails the explorer blind to its dialogue
    blind = scripted_episodes(load_tokenizer("tiny"), 40, 0.75, seed=0, bed="default", teacher="blind")
    from testbed.human import scripted_dialogue

    rng = random.Random(0)  # the blind teacher's dialogues are today's explorer's, draw for draw
    assert [[t.content for t in ep.turns] for ep in blind] == [
        [t for _, t in scripted_dialogue(tasks[i % len(tasks)], rng, p_ask=0.75)] for i in range(40)]


def test_the_teacher_and_p_other_are_in_the_warm_starts_settings(tmp_path):
    from testbed.warm_start import SETTINGS_FILE, WarmStartConfig, dialogue_settings, main

    cfg = WarmStartConfig(output_dir=str(tmp_path / "w"), bed="default")
    assert (cfg.teacher, cfg.p_other) == ("reads", tb.READS_P_OTHER)
    assert WarmStartConfig(bed="default", teacher="blind").p_other == 0.0
    assert WarmStartConfig(bed="legacy").teacher == "blind"
    with pytest.raises(ValueError, match="WarmStartConfig.teacher"):
        WarmStartConfig(bed="legacy", teacher="reads")
    with pytest.raises(ValueError, match="WarmStartConfig.p_other"):
        WarmStartConfig(bed="default", teacher="optimal", p_other=0.5)
    settings = dialogue_settings(cfg, 0.75)
    assert settings["teacher"] == "reads" and settings["p_other"] == 0.5
    # dialogues written with one p_other are never reused for another: a one-line refusal
    out = tmp_path / "w"
    out.mkdir()
    (out / "scripted_episodes.jsonl").write_text("")
    (out / SETTINGS_FILE).write_text(json.dumps({**settings, "p_other": 0.25}))
    with pytest.raises(ValueError, match="written with .*'p_other': 0.25.*use another --output_dir"):
        main(cfg)
    old = {("spec" if k == "bed" else k): v for k, v in settings.items()}  # recorded before "spec" became "bed"
    (out / SETTINGS_FILE).write_text(json.dumps({**old, "p_other": 0.25}))
    with pytest.raises(ValueError, match="written with \\{'bed': 'default', .*'p_other': 0.25"):  # read as "bed"
        main(cfg)
    (out / SETTINGS_FILE).unlink()  # nor dialogues whose settings were never recorded (an older, blind warm start)
    with pytest.raises(ValueError, match="unrecorded settings"):
        main(cfg)


def test_only_a_class_that_sees_the_questions_holds_the_reading_warm_start():
    """The blind policy classes (testbed.policy_class: told, turn) cannot start from a warm
    start that reads which question it asked; the benchmark and the main job then skip the
    blind prediction (testbed.frontier.policy_classes keeps the classes that hold it)."""
    reads, blind = mdp.build(tb.teacher_design("default", "reads")), mdp.build(tb.teacher_design("default", "blind"))
    assert {c: pc.holds_warm_start(reads, c) for c in pc.CLASSES} == {"history": True, "asked": True, "told": False,
                                                                      "turn": False}
    assert all(pc.holds_warm_start(blind, c) for c in pc.CLASSES)
    with pytest.raises(ValueError, match="unknown policy class"):
        pc.holds_warm_start(reads, "nope")
