"""`python -m sweet.critic.export --format openrlhf`: the critic's and stage 2's pairs in the
files the published sweet_rl scripts write (scripts/evaluate_code.py, evaluate_html.py,
generate_random_pairs_from_ranks.py), and those files read back into our episode records, on
which our critic and multi-turn DPO make exactly the file's pairs. Rewards are set explicitly."""

from __future__ import annotations

import json
import random

import pytest

from colbench.episodes import read_episodes, write_episodes
from colbench.types import Episode, Score, Task, Turn
from sweet.core.models import load_tokenizer
from sweet.core.records import CandidatesRow, SampledAction, episode_states, state_key
from sweet.critic.export import C_PREFIX, cli

TARGET = "<html><body><h1>Acme. Bakery.</h1></body></html>"  # c, with dots of its own
SYSTEM = {"role": "system", "content": "Build the page."}


def _episode(task: Task, seed: int, reward: float, turns: list[tuple[str, str]]) -> Episode:
    """An episode of agent turns (human reply, agent text); each agent turn's prompt is the
    dialogue so far, as the runner records it."""
    messages = [SYSTEM, {"role": "user", "content": task.description}]
    recorded = []
    for human, text in turns:
        if human:
            messages.append({"role": "user", "content": human})
            recorded.append(Turn("human", human))
        recorded.append(Turn("agent", text, prompt=list(messages)))
        messages.append({"role": "assistant", "content": text})
    return Episode(task.task_id, task.env, "a", seed, recorded, answer="", score=Score(reward, reward >= 1.0),
                   stop_reason="answered", meta={"task": task.to_json()})


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def _frontend_episodes(path):
    task = Task("fe-1", "frontend", "A bakery page.", TARGET)
    eps = [_episode(task, 0, 0.9, [("", "```html\n<p>v1</p>\n```"), ("Bigger.", "I WANT TO ANSWER: ```html\n<h1>B</h1>\n```")]),
           _episode(task, 1, 0.5, [("", "I WANT TO ANSWER: ```html\n<p>x</p>\n```")]),
           _episode(task, 2, 0.85, [("", "I WANT TO ANSWER: ```html\n<p>y</p>\n```")])]  # 0.05 from 0.9: no pair
    write_episodes(path, eps)
    return eps


def test_frontend_critic_pairs_round_trip(tmp_path, tok):
    eps = _frontend_episodes(tmp_path / "eps.jsonl")
    out = tmp_path / "critic.jsonl"
    cli(["--format", "openrlhf", "--kind", "critic", "--env", "frontend", "--episodes", str(tmp_path / "eps.jsonl"),
         "--output", str(out)])
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    # the published frontend pairing (every two at least 0.1 apart, the higher chosen): 0.9/0.5, 0.85/0.5
    assert len(rows) == 2 and set(rows[0]) == {"chosen", "rejected"}
    chosen, rejected = rows[0]["chosen"], rows[0]["rejected"]
    assert set(chosen) == {"input", "output"}  # evaluate_html.py's layout
    head = C_PREFIX.format(c=TARGET)
    assert chosen["input"].startswith(head) and rejected["input"].startswith(head)
    last = eps[0].agent_turns[-1]
    assert chosen["output"] == last.content and chosen["input"][len(head):] == tok.apply_chat_template(
        last.prompt, tokenize=False, add_generation_prompt=True)  # the last turn's templated prompt
    assert rejected["output"] == eps[1].agent_turns[-1].content

    imported = tmp_path / "imported.jsonl"
    cli(["--format", "openrlhf", "--import_pairs", str(out), "--env", "frontend", "--output", str(imported)])
    back = read_episodes(imported)
    assert [(e.task_id, e.reward) for e in back] == [("openrlhf-000001", 1.0), ("openrlhf-000001", 0.0),
                                                     ("openrlhf-000002", 1.0), ("openrlhf-000002", 0.0)]
    assert Task.from_json(back[0].meta["task"]).hidden == TARGET  # c recovered from the prompt
    assert [len(e.agent_turns) for e in back] == [1] * 4  # the turns before the last are not in the file
    # and written again: the same file
    again = tmp_path / "again.jsonl"
    cli(["--format", "openrlhf", "--kind", "critic", "--env", "frontend", "--episodes", str(imported),
         "--output", str(again)])
    assert again.read_text() == out.read_text()


def test_imported_pairs_train_the_critic_on_exactly_the_files_pairs(tmp_path, tok):
    from sweet.critic.train import CriticConfig, build_data

    _frontend_episodes(tmp_path / "eps.jsonl")
    out, imported = tmp_path / "critic.jsonl", tmp_path / "imported.jsonl"
    cli(["--kind", "critic", "--env", "frontend", "--episodes", str(tmp_path / "eps.jsonl"), "--output", str(out)])
    cli(["--import_pairs", str(out), "--env", "frontend", "--output", str(imported)])
    for rule in ("all", "best"):
        data = build_data(CriticConfig(env="frontend", episodes=str(imported), pairing_rule=rule,
                                       tokenize_missing_actions=True), tok, seed=0)
        assert len(data.train_pairs) == 2 and len(data.turns) == 4
        assert TARGET in str(data.turns[0].state.prompt) or data.turns[0].state.training_info == TARGET


def test_backend_critic_strings_round_trip(tmp_path, tok):
    task = Task("be-1", "backend", "Write f.", "def f(x):\n    return x. real\n", tests=["f(1)"])
    eps = [_episode(task, 0, 1.0, [("", "I WANT TO ANSWER: def f(x): return x")]),
           _episode(task, 1, 0.4, [("", "I WANT TO ANSWER: def f(x): return 0")])]
    write_episodes(tmp_path / "eps.jsonl", eps)
    out = tmp_path / "critic.jsonl"
    cli(["--kind", "critic", "--env", "backend", "--episodes", str(tmp_path / "eps.jsonl"), "--output", str(out)])
    [row] = [json.loads(x) for x in out.read_text().splitlines()]
    assert isinstance(row["chosen"], str) and row["chosen"].startswith(C_PREFIX.format(c=task.hidden))
    assert row["chosen"].endswith("<|start_header_id|>assistant<|end_header_id|>\n\nI WANT TO ANSWER: def f(x): return x")
    plain = tmp_path / "plain.jsonl"  # the --preference_path file: no c
    cli(["--kind", "critic", "--env", "backend", "--episodes", str(tmp_path / "eps.jsonl"), "--training_info", "false",
         "--output", str(plain)])
    assert json.loads(plain.read_text())["chosen"] == row["chosen"][len(C_PREFIX.format(c=task.hidden)):]
    imported = tmp_path / "imported.jsonl"
    cli(["--import_pairs", str(out), "--env", "backend", "--output", str(imported)])
    back = read_episodes(imported)
    assert Task.from_json(back[0].meta["task"]).hidden == task.hidden
    assert [e.agent_turns[0].content for e in back] == ["I WANT TO ANSWER: def f(x): return x",
                                                         "I WANT TO ANSWER: def f(x): return 0"]
    again = tmp_path / "again.jsonl"
    cli(["--kind", "critic", "--env", "backend", "--episodes", str(imported), "--output", str(again)])
    assert again.read_text() == out.read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"chosen": "no header here", "rejected": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a published pair"):
        cli(["--import_pairs", str(bad), "--env", "backend", "--output", str(tmp_path / "x.jsonl")])


def test_policy_pairs_are_stage_2s_pairs_and_import_as_dpo_pairs(tmp_path, tok):
    from sweet.algorithms.mtdpo import MTDPOConfig, trajectory_pairs
    from sweet.algorithms.sweet_rl import make_action_pairs

    eps = _frontend_episodes(tmp_path / "eps.jsonl")
    states = [s for ep in eps for s in episode_states(ep, "")]
    rows = []
    for i, s in enumerate(states):
        actions = tuple(SampledAction(f"action {i}.{k}", (5 + k,), None, "stop", float(k % 3)) for k in range(4))
        rows.append(CandidatesRow(state_key(s), s.task_id, s.episode_id, s.turn_index, None, actions))
    cands = tmp_path / "candidates.jsonl"
    cands.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    out = tmp_path / "policy.jsonl"
    cli(["--kind", "policy", "--env", "frontend", "--episodes", str(tmp_path / "eps.jsonl"), "--candidates", str(cands),
         "--seed", "3", "--output", str(out)])
    written = [json.loads(x) for x in out.read_text().splitlines()]
    by_key = {r.key: r for r in rows}
    want, _ = make_action_pairs([(s, by_key[state_key(s)].for_state(s)) for s in states], 4, random.Random(3))
    assert len(written) == len(want) > 0 and all(set(r) == {"chosen", "rejected"} for r in written)  # --no_prompt
    for row, pair in zip(written, want):
        prompt = tok.apply_chat_template(list(pair.state.prompt), tokenize=False, add_generation_prompt=True)
        assert row == {"chosen": prompt + pair.chosen.text + tok.eos_token,
                       "rejected": prompt + pair.rejected.text + tok.eos_token}
    imported = tmp_path / "imported.jsonl"
    cli(["--import_pairs", str(out), "--env", "frontend", "--output", str(imported)])
    pairs = trajectory_pairs(read_episodes(imported), MTDPOConfig(episodes=str(imported), env="frontend"))
    assert [(p.chosen.agent_turns[0].content, p.rejected.agent_turns[0].content) for p in pairs] == [
        (p.chosen.text, p.rejected.text) for p in want]
    prompted = tmp_path / "prompted.jsonl"
    cli(["--kind", "policy", "--env", "frontend", "--episodes", str(tmp_path / "eps.jsonl"), "--candidates", str(cands),
         "--seed", "3", "--layout", "prompt", "--output", str(prompted)])
    first = json.loads(prompted.read_text().splitlines()[0])
    assert first["prompt"] + first["chosen"] == written[0]["chosen"]
