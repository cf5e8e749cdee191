"""The test bed's designs (testbed/bed.py): presets, the legacy bed unchanged,
tasks drawn from the bed, a human decided by the hidden reference alone, and the one
scripted explorer."""

import hashlib
import json
import random
from dataclasses import replace

import pytest

from colbench.agents import check_agent_spec
from testbed.agents import ScriptedTestbedAgent
from testbed import bed as tb
from testbed.env import (DEFAULT_A, DEFAULT_B, QUESTION_NEG, QUESTION_POS, QUESTION_VAGUE, TestbedEnv,
                                   answer_text, make_tasks)
from colbench.rollout import rollout
from colbench.tasks import load_tasks
from colbench.types import Turn
from simulators.base import SimRequest
from testbed.human import TestbedSimulator, scripted_dialogue

# sha256 of today's legacy bed (tasks, replies, explorer dialogues, scores, prompt, turn
# limit) as the code before the bed printed it: /tmp/fp.py-style fingerprint, `legacy_blob`.
LEGACY_FINGERPRINT = "d4dcf133aa3da2a16561587851a0624131dfefb6c2934244e2ceca7c2d1eea30"


def legacy_blob() -> str:
    tasks = (make_tasks("train", bed="legacy") + make_tasks("test", bed="legacy")
             + load_tasks("builtin:legacy/train", env="testbed"))
    sim = TestbedSimulator()
    qs = [QUESTION_POS, QUESTION_NEG, QUESTION_VAGUE, "positive and negative?", "hello"]
    replies = [r.text for t in tasks for r in sim.reply([SimRequest(t, [Turn("agent", q)]) for q in qs])]
    rng = random.Random(0)
    dialogues = [scripted_dialogue(tasks[i % 56], rng, p_ask=0.6) for i in range(200)]
    env = TestbedEnv(bed="legacy")
    answers = [answer_text(a, b) for a in (1, 2, 3) for b in (0, 10, 20)]
    scores = [s.reward for s in env.score([tasks[0]] * len(answers), [env.extract_answer(a) for a in answers])]
    env.close()
    return json.dumps([[t.to_json() for t in tasks], replies, dialogues, scores, env.agent_messages(tasks[0], []),
                       env.max_turns], sort_keys=True)


def test_legacy_bed_is_bit_identical_to_todays():
    assert hashlib.sha256(legacy_blob().encode()).hexdigest() == LEGACY_FINGERPRINT
    assert load_tasks("builtin:legacy/test", env="testbed") == make_tasks("test", bed="legacy")


def test_default_is_the_default_everywhere():
    """`default` is what every unnamed bed means: builtin:<split>, make_tasks, TestbedEnv()."""
    assert tb.DEFAULT_BED == "default"
    for split in ("train", "val", "test"):
        assert load_tasks(f"builtin:{split}", env="testbed") == load_tasks(f"builtin:default/{split}", env="testbed")
    assert make_tasks("test") == make_tasks("test", bed="default")
    env = TestbedEnv()
    try:
        assert env.design.name == "default" and env.max_turns == 3
        legacy_task = make_tasks("test", n=1, bed="legacy")[0]
        # a legacy task at the default bed's limit would silently lose a turn: refused ...
        with pytest.raises(ValueError, match="legacy test bed \\(4 agent turns\\).*--max-turns 4"):
            env.agent_messages(legacy_task, [])
        env.max_turns = 2  # ... unless a limit is chosen for it (--max-turns)
        assert env.agent_messages(legacy_task, [])
        assert TestbedEnv(bed="legacy").max_turns == 4 and TestbedEnv(bed="legacy").agent_messages(legacy_task, [])
    finally:
        env.close()


def test_presets_parse_and_bad_names_list_them():
    assert list(tb.PRESETS) == ["default", "long", "legacy"]
    d = tb.design("default")
    assert (d.facts, d.turns, d.p_state, d.p_doc, d.one_side, d.p_guess_right, d.p_ask) == (2, 3, 0.75, 0.35, True, 0.5, 0.75)
    assert (tb.design("long").facts, tb.design("long").turns) == (3, 5)
    assert tb.design(d) is d
    with pytest.raises(ValueError, match="unknown test bed 'nope'; presets: default, long, legacy"):
        tb.design("nope")
    with pytest.raises(ValueError, match="invalid p_doc=1.5"):
        replace(d, p_doc=1.5)
    for source in ("builtin:nope/train", "builtin:default/dev"):
        with pytest.raises(ValueError, match="builtin:<bed>/<split> with bed one of default, long, legacy"):
            load_tasks(source, env="testbed")


def test_bed_tasks_carry_their_bed_and_test_tasks_are_fresh_draws():
    train, test = load_tasks("builtin:default/train", env="testbed"), load_tasks("builtin:default/test", env="testbed")
    assert len(train) == 56 and len(test) == 256 and make_tasks("train", bed="default") == train
    assert all(t.meta["bed"] == "default" and len(t.tests) == 10 for t in train + test)
    assert {t.hidden for t in train} & {t.hidden for t in test}  # the same few references ...
    assert [t.hidden for t in train[:20]] != [t.hidden for t in test[:20]]  # ... drawn afresh
    # validation tasks: the train stream's next draws, never a train or a test task
    val = load_tasks("builtin:default/val", env="testbed")
    assert len(val) == 128 and all(t.meta["split"] == "val" for t in val)
    assert val[0].task_id == "testbed-default-train-0056" and {t.task_id for t in val}.isdisjoint(t.task_id for t in train)
    assert [t.hidden for t in val] != [t.hidden for t in train[:16]] != [t.hidden for t in test[:16]]
    with pytest.raises(ValueError, match="val"):
        load_tasks("builtin:legacy/val", env="testbed")
    long = make_tasks("test", n=3, bed="long")
    assert len(long) == 3 and all(len(t.tests) == 15 for t in long)
    # every draw of c is rendered in the reference and read back from it
    for s, tasks in ((tb.design("default"), train + test), (tb.design("long"), make_tasks("train", bed="long"))):
        hidden = [tb.read_reference(s, t.hidden) for t in tasks]
        assert {h.doc for h in hidden} == {True, False} and {st for h in hidden for st in h.stated} == {True, False}
        assert all(tb.reference_source(s, h) == t.hidden for h, t in zip(hidden, tasks))


@pytest.mark.parametrize("stated,doc,question,expected", [
    ((True, True), False, QUESTION_POS, "For positive numbers it is x * 3."),
    ((False, True), False, QUESTION_POS, "For positive numbers I am not sure."),  # an expression: int("3")
    ((False, True), False, QUESTION_VAGUE, "I don't know."),
    ((False, False), True, QUESTION_VAGUE, "For positive numbers it is x * 3. For negative numbers it is x + 20."),
    ((True, True), True, "positive and negative?", "For positive numbers it is x * 3."),  # one side per message
    ((True, True), True, "negative, then positive?", "For negative numbers it is x + 20."),  # the first named
])
def test_the_human_reads_everything_from_the_reference(stated, doc, question, expected):
    s = tb.design("default")
    reference = tb.reference_source(s, tb.Hidden((3, 20), stated, doc))
    assert tb.human_reply(s, reference, question) == expected
    task = make_tasks("test", n=1, bed="default")[0]
    task = replace(task, hidden=reference, meta={"bed": "default"})  # the reference alone decides
    [reply] = TestbedSimulator().reply([SimRequest(task, [Turn("agent", question)])])
    assert not reply.failed and reply.text == expected


def test_the_human_is_deterministic_given_c_and_random_for_the_policy():
    s = tb.design("default")
    tasks = make_tasks("train", bed="default") + make_tasks("test", bed="default")
    sim = TestbedSimulator()
    requests = [SimRequest(t, [Turn("agent", QUESTION_POS)]) for t in tasks]
    first, again = sim.reply(requests), sim.reply(requests[::-1])[::-1]
    assert [r.text for r in first] == [r.text for r in again]  # same reference and question: same reply
    # the policy sees the same description and question on every task, yet the reply varies with c:
    not_sure = sum("not sure" in r.text for r in first) / len(tasks)
    assert 0.1 < not_sure < 0.4  # 1 - p_state = 0.25 (120 draws)
    docs = sum(tb.read_reference(s, t.hidden).doc for t in tasks) / len(tasks)
    assert 0.2 < docs < 0.5  # p_doc = 0.35
    bad = replace(tasks[0], hidden="def f(x):\n    return x\n")
    [failed] = sim.reply([SimRequest(bad, [Turn("agent", QUESTION_POS)])])
    assert failed.failed and "not a 'default' test-bed reference" in failed.error


def test_answers_are_scored_by_the_sandbox_as_the_bed_says():
    s = tb.design("default")
    env = TestbedEnv(bed="default")
    assert env.max_turns == 3
    try:
        task = make_tasks("test", n=1, bed="default")[0]
        values = tb.read_reference(s, task.hidden).values
        wrong = (values[0] + 1, values[1])
        texts = [tb.answer_text(s, values), tb.answer_text(s, wrong)]
        scores = env.score([task] * 2, [env.extract_answer(t) for t in texts])
        assert [sc.reward for sc in scores] == [1.0, 0.5] and scores[0].success
        assert tb.answer_values(s, texts[1]) == wrong and tb.answer_values(s, "no code") == (None, None)
        with pytest.raises(ValueError, match="bed 'default' \\(3 agent turns\\) but the env allows 4"):
            TestbedEnv(bed="legacy").agent_messages(task, [])
    finally:
        env.close()


def test_explorer_is_one_function_and_legacy_matches_todays_script():
    legacy = tb.design("legacy")
    probs = tb.explorer_probs(legacy, [])
    assert probs == pytest.approx({QUESTION_POS: 0.2, QUESTION_NEG: 0.2, QUESTION_VAGUE: 0.2,
                                   answer_text(DEFAULT_A, DEFAULT_B): 0.4})
    # today's scripted dialogue answers exactly as the function says after the same questions
    rng = random.Random(3)
    task = make_tasks("train", n=1, bed="legacy")[0]
    for _ in range(50):
        d = scripted_dialogue(task, rng, p_ask=0.6)
        history = [text for _, text in d[:-1]]
        assert d[-1][1] in tb.explorer_probs(legacy, history)
    d = tb.design("default")
    told = ["What happens to positive numbers?", "For positive numbers it is x * 3.", "Can you tell me more?",
            "I don't know."]
    assert tb.explorer_probs(d, told) == {tb.answer_text(d, (3, 10)): 1.0}  # last turn: told A, guess B = 10
    with pytest.raises(ValueError, match="already has 3 agent turns"):
        tb.explorer_probs(d, told + [tb.answer_text(d, (3, 10)), "?"])
    first = tb.explorer_probs(d, [])
    assert first == pytest.approx({**{q: 0.25 for q in d.questions()}, tb.answer_text(d, (2, 10)): 0.25})


def test_scripted_agents_run_in_the_real_runner():
    check_agent_spec("explorer")
    check_agent_spec("optimal")
    tasks = make_tasks("test", n=4, bed="default")
    env = TestbedEnv(bed="default")
    try:
        eps = rollout(env, tasks, ScriptedTestbedAgent("explorer"), TestbedSimulator(), seeds=range(3))
        again = rollout(env, tasks, ScriptedTestbedAgent("explorer"), TestbedSimulator(), seeds=range(3))
        opt = rollout(env, tasks, ScriptedTestbedAgent("optimal"), TestbedSimulator(), seeds=(0,))
    finally:
        env.close()
    assert [e.turns for e in eps] == [e.turns for e in again]  # seeded per (task, seed, turn)
    assert all(len(e.agent_turns) <= 3 for e in eps + opt)
    assert all(e.agent_turns[0].content == QUESTION_POS for e in opt)  # the optimum asks one side first


def test_scripted_dialogues_sample_the_one_explorer_on_any_bed():
    from collections import Counter

    s = tb.design("default")
    task = make_tasks("train", n=1, bed="default")[0]
    rng = random.Random(0)
    dialogues = [scripted_dialogue(task, rng, p_ask=s.p_ask) for _ in range(2000)]
    first = Counter(d[0][1] for d in dialogues)
    for text, p in tb.explorer_probs(s, []).items():  # 0.25 each: three questions and the answer
        assert abs(first[text] / len(dialogues) - p) < 0.04
    for d in dialogues:
        assert sum(role == "agent" for role, _ in d) <= s.turns and d[-1][0] == "agent"
        assert all(tb.human_reply(s, task.hidden, q) == r for (_, q), (_, r) in zip(d[0:-1:2], d[1:-1:2]))


def test_evaluate_takes_a_beds_turn_limit_from_its_tasks(tmp_path):
    from colbench.evaluate import main

    assert TestbedEnv.turns_for(make_tasks("test", bed="legacy")) == 4  # the legacy bed's, though its tasks carry none
    assert TestbedEnv.turns_for(make_tasks("test", bed="long")) == 5
    with pytest.raises(ValueError, match="mix test beds"):
        TestbedEnv.turns_for(make_tasks("test", n=1, bed="legacy") + make_tasks("test", n=1))
    base = ["--env", "testbed", "--tasks", "builtin:default/test", "--limit", "4", "--agent", "explorer",
            "--simulator", "scripted:testbed", "--no-progress"]
    assert main(base + ["--output", str(tmp_path / "bad"), "--max-turns", "4"]) == 2  # one error line
    assert main(base + ["--output", str(tmp_path / "ok")]) == 0
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    assert config["episode"]["max_turns"] == 3
    legacy = ["--env", "testbed", "--tasks", "builtin:legacy/test", "--limit", "2", "--agent", "reference",
              "--simulator", "scripted:testbed", "--no-progress", "--output", str(tmp_path / "legacy")]
    assert main(legacy) == 0  # the default env's limit is not the legacy bed's: its tasks set theirs
    assert json.loads((tmp_path / "legacy" / "config.json").read_text())["episode"]["max_turns"] == 4


def test_a_task_written_before_the_rename_is_read_by_its_meta_spec():
    """Tasks saved with the older key `meta["spec"]` keep their bed: the design, the env's
    turn limit, the optimal agent and the human read it as they read `meta["bed"]`."""
    from testbed.human import optimal_dialogue

    new = make_tasks("test", n=2, bed="long")
    old = [replace(t, meta={"spec": t.meta["bed"], "split": "test"}) for t in new]
    assert [tb.task_bed(t) for t in old] == ["long", "long"] and tb.task_design(old[0]) is tb.design("long")
    assert tb.task_bed(make_tasks("test", n=1, bed="legacy")[0]) is None
    assert tb.task_design(make_tasks("test", n=1, bed="legacy")[0]).legacy
    assert TestbedEnv.turns_for(old) == 5 and TestbedEnv.turns_for(old + new) == 5
    with pytest.raises(ValueError, match="mix test beds"):
        TestbedEnv.turns_for(old + make_tasks("test", n=1, bed="legacy"))
    assert TestbedEnv(bed="long").agent_messages(old[0], [])
    with pytest.raises(ValueError, match="bed 'long' \\(5 agent turns\\) but the env allows 3"):
        TestbedEnv().agent_messages(old[0], [])
    assert optimal_dialogue(old[0]) == optimal_dialogue(new[0])
    with pytest.raises(ValueError, match="needs a non-legacy task"):
        optimal_dialogue(make_tasks("test", n=1, bed="legacy")[0])


def test_a_record_written_before_the_rename_names_its_bed():
    """Caches and settings files keyed "spec" read as keyed "bed" (testbed.bed.bed_record)."""
    old = {"spec": "long", "episodes_per_task": 8}
    assert tb.bed_record(old) == {"bed": "long", "episodes_per_task": 8}
    assert tb.bed_record({"bed": "default"}) == {"bed": "default"}


def test_the_bed_flag_keeps_spec_as_its_alias(capsys):
    """`--bed` on every test-bed command line; `--spec`, its earlier name, names the same
    setting (both in one command: an error naming both, on the config-dataclass CLIs)."""
    from colbench.cli import parse_configs
    from testbed import predict
    from testbed.demo import DemoConfig
    from testbed.warm_start import WarmStartConfig

    assert parse_configs([WarmStartConfig], ["--spec", "long"])[0].bed == "long"
    assert parse_configs([DemoConfig], ["--spec", "legacy"])[0].bed == "legacy"
    assert parse_configs([DemoConfig], ["--bed", "long"])[0].bed == "long"
    with pytest.raises(SystemExit):
        parse_configs([DemoConfig], ["--bed", "long", "--spec", "legacy"])
    assert "--bed and --spec name the same setting (bed)" in capsys.readouterr().err
    assert predict.main(["--bed", "default", "--json"]) == 0
    by_bed = json.loads(capsys.readouterr().out)
    assert predict.main(["--spec", "default", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == by_bed and by_bed["bed"] == "default"
