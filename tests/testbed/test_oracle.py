"""The oracle critic (testbed/oracle.py, `--critic oracle`): the test bed's exact
advantage (testbed.mdp.exact_advantage) scored on States of a real legacy-bed episode and
of a default-bed task, and wired into stage 2."""

from __future__ import annotations

import json

import pytest

from testbed.env import DEFAULT_B, QUESTION_NEG, QUESTION_VAGUE, answer_text
from testbed.mdp import exact_advantage
from testbed.oracle import OracleCritic


@pytest.fixture(scope="module")
def episode(scripted_testbed_episode):
    """(task, the four States of one real test-bed episode, the episode): vague, vague,
    positive, then the answer, against the scripted human (tests/conftest.py)."""
    e = scripted_testbed_episode
    return e.task, e.states, e.episode


def _ids(tokenizer, texts, eos: bool = True) -> list[list[int]]:
    """Candidate ids as a sampler returns them (an end-of-turn id would be skipped in decoding)."""
    return [tokenizer(t, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
            for t in texts]


def test_oracle_scores_candidates_of_real_states(episode, tiny_tokenizer):
    task, states, ep = episode
    a, b = task.meta["a"], task.meta["b"]
    assert ep.success and [s.turn_index for s in states] == [0, 1, 2, 3]
    assert f"x * {a}" in states[3].prompt[-1]["content"]  # the human told A before the last turn
    texts = [QUESTION_NEG, "What about positive and negative numbers?", QUESTION_VAGUE, answer_text(a, b),
             answer_text(a, DEFAULT_B)]
    ranker = OracleCritic(tiny_tokenizer, "testbed", bed="legacy")
    items = [(s, _ids(tiny_tokenizer, texts), ["stop"] * len(texts)) for s in states]
    scores = ranker.score_states(items)
    # hand-computed Q* - V* in success: turn 0 has time for anything but a wrong answer; turn 1
    # (3 left) none for the vague question; at turn 2 (nothing known, 2 left) no action of the
    # bed succeeds, but the question naming both sides and the lucky right answer do; turn 3
    # (A known, last turn): only the right answer succeeds
    assert scores == [
        [0.0, 0.0, 0.0, 0.0, -1.0],
        [0.0, 0.0, -1.0, 0.0, -1.0],
        [0.0, 1.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0, 0.0],
    ]
    # the same numbers as the pure function on the state's human replies (the description is not one)
    replies = [m["content"] for m in states[3].prompt[2:] if m["role"] == "user"]
    assert scores[3] == [exact_advantage("legacy", task.hidden, replies, t, 1) for t in texts]


def test_oracle_decodes_without_special_tokens_and_scores_cut_answers(episode, tiny_tokenizer):
    task, states, _ = episode
    right = answer_text(task.meta["a"], task.meta["b"])
    ids = _ids(tiny_tokenizer, [right], eos=False)[0]
    ranker = OracleCritic(tiny_tokenizer, bed="legacy")
    [[with_eos, without_eos, cut]] = ranker.score_states(
        [(states[3], [ids + [tiny_tokenizer.eos_token_id], ids, ids[:12]], ["stop", "stop", "length"])])
    assert with_eos == without_eos == 1.0
    assert cut == 0.0  # cut at max_new_tokens: the code does not compile, the answer fails like the bed's best


def test_oracle_is_for_the_test_bed_only(tiny_tokenizer):
    from sweet.algorithms.sweet_rl import SweetConfig, load_ranker
    from sweet.core.config import ModelConfig

    with pytest.raises(ValueError, match="'testbed' environment only.*'backend'"):
        OracleCritic(tiny_tokenizer, "backend")
    cfg = SweetConfig(episodes="eps.jsonl", tasks="builtin:train", env="backend", critic="oracle")
    with pytest.raises(ValueError, match="--critic oracle .*--env testbed, got --env backend"):
        load_ranker(ModelConfig(model="tiny"), cfg)
    tb = SweetConfig(episodes="eps.jsonl", tasks="builtin:train", env="testbed", critic="oracle")
    ranker = load_ranker(ModelConfig(model="tiny"), tb)
    assert isinstance(ranker, OracleCritic) and ranker.design.name == "default"
    # the bed comes from the tasks
    legacy = SweetConfig(episodes="eps.jsonl", tasks="builtin:legacy/train", env="testbed", critic="oracle")
    assert load_ranker(ModelConfig(model="tiny"), legacy).design.name == "legacy"


def test_stage2_samples_with_the_oracle(episode, tmp_path, one_torch_thread):
    """`--critic oracle` through stage 2's sampling: no critic dir is read, the settings
    record the bed, every candidate carries the oracle's score of its text."""
    from dataclasses import replace

    from sweet.algorithms.sweet_rl import (
        CANDIDATES_FILE,
        SAMPLING_FILE,
        CandidateConfig,
        SweetConfig,
        SweetTrainConfig,
        main,
        read_candidates,
    )
    from sweet.core.config import ModelConfig
    from sweet.workflows.rounds import RoundsConfig
    from sweet.workflows.rounds import main as sweet_rounds

    task, states, ep = episode
    episodes, tasks = tmp_path / "episodes.jsonl", tmp_path / "tasks.jsonl"
    episodes.write_text(ep.dumps() + "\n")
    tasks.write_text(json.dumps(task.to_json()) + "\n")
    out = tmp_path / "sweet"
    model = ModelConfig(model="tiny", dtype="float32")
    train = SweetTrainConfig(output_dir=str(out), report_to="none")
    cfg = SweetConfig(episodes=str(episodes), tasks=str(tasks), env="testbed", critic="oracle", stage="sample")
    cand = CandidateConfig(candidates_per_state=2, max_new_tokens=6)
    assert main(model, train, cfg, cand) is None
    assert json.loads((out / SAMPLING_FILE).read_text())["critic"] == "oracle"
    rows = read_candidates(out / CANDIDATES_FILE)
    assert len(rows) == len(states)
    for s in states:
        replies = [m["content"] for m in s.prompt[2:] if m["role"] == "user"]
        for c in rows[f"{s.episode_id}#{s.turn_index}"].candidates:
            assert c.advantage == exact_advantage("legacy", task.hidden, replies, c.text, 4 - s.turn_index)
    # rounds retrain the critic from its dir: refused up front, not after a round
    with pytest.raises(ValueError, match="--critic oracle runs one round"):
        sweet_rounds(model, train, replace(cfg, stage="all"), cand, RoundsConfig(rounds=2, simulator="scripted:testbed"))


def test_oracle_on_another_bed_scores_the_solvers_advantage():
    """With `bed`, the oracle ranks by testbed.mdp.exact_advantage (success-valued)."""
    from testbed import bed as tb
    from testbed.env import TestbedEnv, make_tasks
    from colbench.types import Turn
    from sweet.core.records import State
    from testbed.oracle import exact_advantages

    s = tb.design("default")
    reference = tb.reference_source(s, tb.Hidden((3, 20), (False, True), False))  # A an expression, no docstring
    task = make_tasks("test", n=1, bed="default")[0]
    turns = [Turn("agent", "What happens to positive numbers?"), Turn("human", tb.human_reply(s, reference,
                                                                                                "positive?"))]
    prompt = TestbedEnv(bed="default").agent_messages(task, turns)
    state = State(task.task_id, "e", 1, tuple(prompt), None, reference)
    texts = ["What happens to negative numbers?", "Can you tell me more?", tb.answer_text(s, (3, 20)),
             tb.answer_text(s, (2, 10))]
    # A unknowable (not stated, no docstring, the guess 2 wrong): V* = 0 from here, except a lucky
    # answer writing the true constants, which the oracle sees (+1)
    assert exact_advantages(state, texts, "default") == [0.0, 0.0, 1.0, 0.0]
