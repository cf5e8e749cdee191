"""The dialogue profile (testbed/profile.py): by hand on three dialogues,
on the scripted explorer's dialogues (the warm start's teacher: repeat rate 1/3), and the CLI."""

import json
import random

import pytest

from testbed import bed as tb
from testbed import profile as tp
from testbed.env import bed_tasks
from colbench.types import Episode, Score, Turn
from testbed.human import scripted_dialogue

S = tb.design("default")
POS, NEG = (tb.question(f) for f in S.fact_list)


def _episode(task_id: str, texts: list[str], success: bool) -> Episode:
    turns = [Turn("agent" if i % 2 == 0 else "human", t) for i, t in enumerate(texts)]
    return Episode(task_id, "testbed", "a", 0, turns, answer=texts[-1], score=Score(float(success), success))


def test_profile_by_hand():
    a, b = S.fact_list[0].values[1], S.fact_list[1].values[1]
    told_a = tb.stated_sentence(S.fact_list[0], a)
    eps = [
        # asks the same side twice, answers with what it was told (faithful)
        _episode("t0", [POS, told_a, POS, told_a, tb.answer_text(S, tb.guess_values(S, (a, None)))], False),
        # asks both sides, answers with a wrong constant (not faithful)
        _episode("t1", [POS, told_a, NEG, tb.stated_sentence(S.fact_list[1], b), tb.answer_text(S, (a, b + 1))], False),
        # the vague question once, then answers early: no second question
        _episode("t2", [tb.QUESTION_VAGUE, tb.DONT_KNOW, tb.answer_text(S, tb.guess(S))], True),
    ]
    p = tp.profile("default", eps)
    m = {k: v.value for k, v in p.metrics.items()}
    assert (p.episodes, p.asked_twice) == (3, 2)
    assert m == pytest.approx({"success": 1 / 3, "early": 1 / 3, "repeat": 1 / 2, "vague_first": 1 / 3,
                               "faithful": 2 / 3})
    assert set(p.to_json()) == {"episodes", "asked_twice", *tp.FIELDS}


def test_the_scripted_explorer_repeats_a_third_of_the_time():
    tasks = bed_tasks(S, "train")
    rng = random.Random(0)
    eps = []
    for i in range(600):
        task = tasks[i % len(tasks)]
        texts = [t for _, t in scripted_dialogue(task, rng, p_ask=S.p_ask)]
        eps.append(_episode(task.task_id, texts, False))
    p = tp.profile(S, eps)
    repeat, early, faithful = p.metrics["repeat"], p.metrics["early"], p.metrics["faithful"]
    assert repeat.low < 1 / 3 < repeat.high and 0.2 < repeat.value < 0.45
    assert early.low < 1 - S.p_ask ** 2 < early.high  # answers before its last (third) turn: 1 - p_ask²
    assert faithful.value == 1.0


def test_cli(tmp_path, capsys):
    path = tmp_path / "eps.jsonl"
    ep = _episode("t0", [POS, tb.DONT_KNOW, tb.answer_text(S, tb.guess(S))], False)
    path.write_text(json.dumps(ep.to_json()) + "\n")
    assert tp.main([str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[str(path)]["early"]["value"] == 1.0 and out[str(path)]["asked_twice"] == 0
    with pytest.raises(SystemExit):
        tp.main([str(tmp_path / "missing.jsonl")])
    assert "missing.jsonl: no such episodes file" in capsys.readouterr().err


def test_success_and_its_interval_are_the_leaderboards_whatever_the_file_order():
    from colbench.stats import env_metrics

    tasks = bed_tasks(S, "test")[:40]
    rng = random.Random(1)
    eps = []
    for task in tasks:  # task, then seed: the order the leaderboard scores in (colbench.rollout)
        for seed in (0, 1):
            texts = [t for _, t in scripted_dialogue(task, rng, p_ask=S.p_ask)]
            ep = _episode(task.task_id, texts, rng.random() < 0.5)
            ep.seed = seed
            eps.append(ep)
    shuffled = eps[:]
    random.Random(2).shuffle(shuffled)  # a file written as episodes finish
    assert tp.profile(S, shuffled).metrics["success"] == env_metrics("testbed", eps)["success_rate"]
