"""Frontend training with its defaults: CLIP rewards have no "success", so each
environment supplies its own pairing and filtering defaults (colbench.envs.training_defaults),
read by the critic, multi-turn DPO and RFT when no flag is given.

The end-to-end test runs the real pieces on the frontend environment: the tiny model
as the agent, the text simulator (tiny model, real renders), the tiny CLIP scorer,
then critic -> SWEET-RL stage 2 -> evaluate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from colbench.envs import training_defaults
from colbench.envs.frontend import NO_DRAFT
from colbench.types import Episode, Score, Turn

REPO = Path(__file__).resolve().parents[2]
FAR_PAGE = "<html><body style='background:#111'><h1 style='color:lime;font-size:90px'>Totally different</h1></body></html>"


def _episode(task_id: str, seed: int, reward: float, env: str = "frontend") -> Episode:
    turns = [Turn("agent", f"page {seed}", token_ids=[10 + seed, 11], prompt_token_ids=[1, 2], finish_reason="stop")]
    return Episode(task_id, env, "a", seed, turns, answer="<p/>", score=Score(reward, reward >= 0.9), stop_reason="answered")


# CLIP-like rewards, set explicitly: nothing reaches 1.0; in t1, 0.7 and 0.6 are exactly the
# published 0.1 apart (kept, though 0.7 - 0.6 is 0.0999... in floats), 0.65 is 0.05 from each;
# t2's 0.502/0.500 never pair
CLIP_EPISODES = [_episode("t1", 0, 0.7), _episode("t1", 1, 0.6), _episode("t1", 2, 0.65),
                 _episode("t2", 0, 0.502), _episode("t2", 1, 0.500), _episode("t3", 0, 0.3),
                 _episode("t3", 1, 0.9), _episode("t3", 2, 0.5)]
PUBLISHED_PAIRS = [("t1", 0, 1), ("t3", 1, 0), ("t3", 2, 0), ("t3", 1, 2)]  # every two at least 0.1 apart


def test_each_environment_supplies_its_defaults():
    assert training_defaults("backend") == training_defaults("testbed")  # the paper's rule: success = 1.0
    assert training_defaults("backend").success_threshold == 1.0
    assert training_defaults("backend").pairing_rule == "best"
    fe = training_defaults("frontend")
    assert fe.success_threshold == 0.0 and fe.rft_top_fraction < 1.0
    assert (fe.pairing_rule, fe.min_reward_gap) == ("all", 0.1)  # published scripts/evaluate_html.py
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        training_defaults("nope")


def test_critic_and_mtdpo_pair_clip_rewards_with_the_frontend_defaults():
    from sweet.algorithms.mtdpo import MTDPOConfig, trajectory_pairs
    from sweet.core.records import make_trajectory_pairs
    from sweet.critic.train import CriticConfig

    critic = CriticConfig(env="frontend")
    assert (critic.pairing_rule, critic.success_threshold, critic.min_reward_gap) == ("all", 0.0, 0.1)
    published = PUBLISHED_PAIRS
    got = lambda pairs: [(p.task_id, p.chosen.seed, p.rejected.seed) for p in pairs]  # noqa: E731
    assert got(critic_pairs(critic, CLIP_EPISODES)) == published
    assert got(make_trajectory_pairs(CLIP_EPISODES, 0.0, 0.0, "best")) == [
        ("t1", 0, 1), ("t1", 0, 2), ("t2", 0, 1), ("t3", 1, 0), ("t3", 1, 2)]
    # the backend rule finds nothing here: no CLIP reward reaches 1.0
    backend = CriticConfig(env="backend")
    assert backend.pairing_rule == "best"
    assert make_trajectory_pairs(CLIP_EPISODES, backend.success_threshold, backend.min_reward_gap) == []
    for pairing, want in (("paper", published), ("best_vs_worst", [("t3", 1, 0)])):
        cfg = MTDPOConfig(episodes="e.jsonl", env="frontend", pairing=pairing)
        assert got(trajectory_pairs(CLIP_EPISODES, cfg)) == want
    # flags still win over the environment's defaults
    assert CriticConfig(env="frontend", success_threshold=0.8, min_reward_gap=0.0).success_threshold == 0.8
    assert got(critic_pairs(CriticConfig(env="frontend", min_reward_gap=0.05), CLIP_EPISODES)) == [
        ("t1", 0, 1), ("t1", 0, 2), ("t1", 2, 1), ("t3", 1, 0), ("t3", 2, 0), ("t3", 1, 2)]
    assert got(critic_pairs(CriticConfig(env="frontend", pairing_rule="best"), CLIP_EPISODES)) == [
        ("t3", 1, 0), ("t3", 1, 2)]
    assert MTDPOConfig(episodes="e.jsonl", env="frontend", pairing_rule="best").pairing_rule == "best"
    with pytest.raises(ValueError, match="pairing_rule must be one of"):
        CriticConfig(env="frontend", pairing_rule="every")


def critic_pairs(cfg, episodes):
    """The critic's own pairing of `episodes` (sweet.critic.train._pairs: what it trains on)."""
    from sweet.critic.train import _pairs

    return _pairs(cfg, list(episodes), "test")


def test_the_inspector_pairs_with_the_critics_recorded_rule(tmp_path):
    """The credit inspector pairs with the critic run's recorded settings; a run recorded
    before the rule was (settings without it) paired the best against each worse."""
    from sweet.critic.inspect import training_pairs

    def pairs_with(settings):
        (tmp_path / "config.json").write_text(json.dumps({"critic": settings}))
        return [(p.task_id, p.chosen.seed, p.rejected.seed) for p in training_pairs(str(tmp_path), CLIP_EPISODES)]

    assert pairs_with({"env": "frontend", "pairing_rule": "all", "success_threshold": 0.0,
                       "min_reward_gap": 0.1}) == PUBLISHED_PAIRS
    assert pairs_with({"env": "frontend", "success_threshold": 0.0, "min_reward_gap": 0.1}) == [
        ("t3", 1, 0), ("t3", 1, 2)]
    assert pairs_with({"env": "frontend"}) == PUBLISHED_PAIRS


def test_rft_keeps_the_best_fraction_on_frontend(tiny_tokenizer):
    from sweet.algorithms.rft import RFTConfig, rft_segments

    cfg = RFTConfig(episodes="e.jsonl", env="frontend")
    assert (cfg.success_threshold, cfg.top_fraction) == (0.0, 0.25)
    kept, segments = rft_segments(CLIP_EPISODES, tiny_tokenizer, cfg.success_threshold, top_fraction=cfg.top_fraction)
    assert [(e.task_id, e.seed) for e in kept] == [("t1", 0), ("t3", 1)]  # ceil(0.25 × 8) = 2 best
    assert len(segments) == 2
    backend = RFTConfig(episodes="e.jsonl")
    assert rft_segments(CLIP_EPISODES, tiny_tokenizer, backend.success_threshold, top_fraction=backend.top_fraction)[0] == []
    with pytest.raises(ValueError, match="top_fraction"):
        RFTConfig(episodes="e.jsonl", top_fraction=0.0)


@pytest.mark.parametrize("cmd, flags", [
    (["sweet.train_critic"], ["--success_threshold", "--min_reward_gap", "--pairing_rule"]),
    (["sweet.train_policy", "--algorithm", "mtdpo"], ["--success_threshold", "--min_reward_gap", "--pairing_rule"]),
    (["sweet.train_policy", "--algorithm", "rft"], ["--success_threshold", "--top_fraction"]),
])
def test_help_states_each_environments_default(cmd, flags):
    out = subprocess.run([sys.executable, "-m", *cmd, "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120).stdout
    text = " ".join(out.split())  # argparse wraps lines
    for flag in flags:
        assert flag in text
    assert "frontend 0," in text and "backend 1," in text  # success threshold per environment
    assert "frontend 0.1" in text or "frontend 0.25" in text


# ---- end to end on the frontend environment -------------------------------------------------------


def _frontend_episodes(out: Path):
    """2 tasks × 2 seeds of the tiny agent against the text simulator, scored by the tiny
    CLIP. Seed-1 episodes end with a page unlike any target (ids from the tokenizer, as a
    model emitting that text would produce). The tiny CLIP scores any two pages alike, so
    the rewards the critic learns from are then set explicitly: seed 0 0.8, seed 1 0.3."""
    from colbench.agents import ModelAgent
    from colbench.envs import make_env
    from colbench.rollout import rollout
    from colbench.tasks import load_tasks
    from engines import EngineOptions, SamplingParams, load_engine
    from simulators import load_simulator

    tasks = load_tasks("builtin:train", env="frontend", limit=2)
    env = make_env("frontend", clip_model="tiny", render_dir=out / "renders", render_timeout_s=20.0)
    engine = load_engine("tiny", EngineOptions(device="cpu", dtype="float32"))
    simulator = load_simulator("text+tiny", env, engine_options=EngineOptions(device="cpu", dtype="float32"),
                               max_new_tokens=16)
    try:
        agent = ModelAgent(engine, SamplingParams(temperature=1.0, max_new_tokens=16), name="tiny")
        episodes = rollout(env, tasks, agent, simulator, seeds=(0, 1), max_turns=2)
        by_id = {t.task_id: t for t in tasks}
        final = []
        for ep in episodes:
            if ep.seed == 1:
                task = by_id[ep.task_id]
                text = f"{env.answer_marker}\n```html\n{FAR_PAGE}\n```"
                last = ep.agent_turns[-1]
                turns = list(ep.turns)
                turns[turns.index(last)] = replace(last, content=text, logprobs=None, finish_reason="stop",
                                                   token_ids=engine.tokenizer(text, add_special_tokens=False)["input_ids"])
                answer = env.extract_answer(text)
                ep = replace(ep, turns=turns, answer=answer, score=env.score([task], [answer])[0], stop_reason="answered")
                assert ep.score.error is None  # the page was rendered and scored
            final.append(replace(ep, score=Score(0.8 if ep.seed == 0 else 0.3, False)))
    finally:
        simulator.close()
        engine.close()
        env.close()
    eps_path, tasks_path = out / "episodes.jsonl", out / "tasks.jsonl"
    eps_path.write_text("".join(ep.dumps() + "\n" for ep in final))
    tasks_path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    return eps_path, tasks_path, final


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_critic_stage2_evaluate_on_frontend_with_the_defaults(tmp_path):
    episodes, tasks, eps = _frontend_episodes(tmp_path)
    rewards = {(e.task_id, e.seed): e.reward for e in eps}
    gap = training_defaults("frontend").min_reward_gap
    assert all(rewards[(t, 0)] - rewards[(t, 1)] >= gap for t, _ in rewards)  # the data can pair

    # stage 1: no --success_threshold / --min_reward_gap: the frontend defaults pair the tasks
    critic = tmp_path / "critic"
    _run("sweet.train_critic", "--model", "tiny", "--env", "frontend", "--episodes", str(episodes), "--tasks",
         str(tasks), "--output_dir", str(critic), "--num_epochs", "1", "--learning_rate", "1e-3", "--max_length",
         "1024", "--keep_head", "128", "--eval_fraction", "0", "--report_to", "none", "--dtype", "float32")
    saved = json.loads((critic / "config.json").read_text())
    recorded = saved["critic"]
    assert (recorded["pairing_rule"], recorded["success_threshold"], recorded["min_reward_gap"]) == ("all", 0.0, gap)
    assert (critic / "critic_config.json").exists()

    # stage 2: candidates of every agent turn ranked by that critic, per-turn DPO
    policy = tmp_path / "sweet"
    _run("sweet.train_policy", "--algorithm", "sweet", "--env", "frontend", "--episodes", str(episodes), "--tasks",
         str(tasks), "--critic", str(critic), "--output_dir", str(policy), "--model", "tiny", "--dtype", "float32",
         "--report_to", "none", "--max_length", "1024", "--keep_head", "128", "--candidates_per_state", "4",
         "--max_new_tokens", "8", "--learning_rate", "1e-3", "--micro_batch_size", "4", "--episode_fraction", "1")
    from sweet.algorithms.sweet_rl import CANDIDATES_FILE, read_candidates

    rows = read_candidates(policy / CANDIDATES_FILE)
    assert len(rows) == sum(len(e.agent_turns) for e in eps)
    assert any(len({c.advantage for c in r.candidates}) > 1 for r in rows.values())
    assert (policy / "final" / "config.json").exists()

    # evaluate: the trained policy plays the frontend tasks against the text simulator, scored by CLIP
    report = tmp_path / "eval"
    _run("colbench.evaluate", "--env", "frontend", "--tasks", "builtin:train", "--limit", "2",
         "--agent", f"sweet=hf:{policy / 'final'}", "--simulator", "text+tiny", "--clip-model", "tiny",
         "--max-turns", "2", "--max-new-tokens", "8", "--simulator-max-new-tokens", "16", "--device", "cpu",
         "--dtype", "float32", "--output", str(report), "--no-progress")
    played = [json.loads(line) for line in (report / "episodes" / "sweet.jsonl").read_text().splitlines()]
    # a page the tiny policy drafted is scored by CLIP; without a draft the episode scores 0, saying why
    assert len(played) == 2 and all(0.0 < ep["score"]["reward"] <= 1.0 + 1e-6 if ep["answer"] else
                                    ep["score"]["reward"] == 0.0 and ep["score"]["error"] == NO_DRAFT for ep in played)
    assert all(t["finish_reason"] in ("stop", "length") for ep in played for t in ep["turns"] if t["role"] == "agent")
