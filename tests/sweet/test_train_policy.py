"""End to end: episodes from real tiny-model runs -> (critic) -> policy checkpoint ->
loads as an engine, for `python -m sweet.train_policy --algorithm {sweet,rft,mtdpo}`.

Also: candidate pairing, resumable candidate files, resume with identical metrics,
config validation, and (slow) a 2-process CPU run with accelerate.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from policy_fixtures import FAST, cached_tiny_episodes, read_metrics

from sweet.core.records import Candidate, State

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(episodes.jsonl, tasks.jsonl, episodes): 3 test-bed tasks × 2 seeds, 2 agent turns."""
    torch.set_num_threads(2)
    return cached_tiny_episodes(tmp_path_factory.getbasetemp())


def _cli(*args: str, timeout: int = 300, launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = (launcher or [sys.executable, "-m"]) + ["sweet.train_policy", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _weights(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(str(path)).state_dict().items()}


def _assert_trained(final: Path, run_dir: Path, loss_key: str) -> None:
    """A loss was logged, weights moved, and the checkpoint generates through hf:<path>."""
    from engines import EngineOptions, SamplingParams, load_engine
    from engines.tiny import tiny_model_path

    rows = [r for r in read_metrics(run_dir) if loss_key in r]
    assert rows and all(torch.isfinite(torch.tensor(r[loss_key])) for r in rows)
    before, after = _weights(tiny_model_path()), _weights(final)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    engine = load_engine(f"hf:{final}", EngineOptions(device="cpu", dtype="float32"))
    out = engine.generate([[{"role": "user", "content": "hi"}]], SamplingParams(n=2, max_new_tokens=4, seed=0))
    assert len(out[0]) == 2 and all(s.token_ids for s in out[0])


# ---- pairing (pure) ------------------------------------------------------------------------


def _state(i: int = 0) -> State:
    return State("t", "t/a/0", i, ({"role": "user", "content": "x"},), (1, 2), "c")


def _cands(state, advs):
    return [Candidate(state, f"c{j}", (10 + j,), advantage=a) for j, a in enumerate(advs)]


def test_pairs_are_top_half_vs_bottom_half_and_ties_are_skipped():
    from sweet.algorithms.sweet_rl import make_action_pairs

    s0, s1, s2 = _state(0), _state(1), _state(2)
    scored = [(s0, _cands(s0, [0.9, 0.1, 0.5, 0.3, 0.7])),  # odd K: median 0.5 in neither half
              (s1, _cands(s1, [0.2, 0.2, 0.2, 0.2])),  # all tie -> skipped
              (s2, _cands(s2, [1.0, 0.0, 0.0, 0.0]))]  # top {1.0, 0.0}, bottom {0.0, 0.0}
    pairs, m = make_action_pairs(scored, pairs_per_state=50, rng=random.Random(0))
    first = [p for p in pairs if p.state == s0]
    assert len(first) == 50
    assert {p.chosen.advantage for p in first} == {0.9, 0.7}
    assert {p.rejected.advantage for p in first} == {0.1, 0.3}
    assert not [p for p in pairs if p.state == s1]
    third = [p for p in pairs if p.state == s2]
    assert third and all(p.chosen.advantage == 1.0 and p.rejected.advantage == 0.0 for p in third)
    assert m["sweet/tied_states"] == 1 and m["sweet/states"] == 3
    assert m["sweet/dropped_equal_pairs"] == 50 - len(third)  # 0.0 drawn from the top half vs 0.0
    assert m["sweet/critic_score_range"] == pytest.approx((0.8 + 0.0 + 1.0) / 3)
    assert m["sweet/critic_score_std"] > 0


def test_anchors_come_from_the_tied_states_round_robin():
    from sweet.algorithms.sweet_rl import anchor_candidates

    s0, s1, s2, s3 = _state(0), _state(1), _state(2), _state(3)
    scored = [(s0, _cands(s0, [0.9, 0.1])),  # ranked: never an anchor
              (s1, _cands(s1, [0.2, 0.2, 0.2])),  # tied
              (s2, _cands(s2, [1.0, 0.0])),
              (s3, _cands(s3, [-1.0, -1.0]))]  # tied
    drawn = anchor_candidates(scored, 5, random.Random(0))
    assert len(drawn) == 5
    assert {s.turn_index for s, _ in drawn} == {1, 3}
    assert all(c.text == "c0" and c.state == s for s, c in drawn)  # the state's first candidate
    assert [s.turn_index for s, _ in drawn[2:4]] == [s.turn_index for s, _ in drawn[:2]]  # round-robin
    assert drawn == anchor_candidates(scored, 5, random.Random(0))
    assert anchor_candidates(scored[:1] + scored[2:3], 5, random.Random(0)) == []


# ---- rft -----------------------------------------------------------------------------------


def test_rft_trains_and_resumes_with_identical_metrics(data, tmp_path, capsys):
    episodes, _, eps = data
    out = tmp_path / "rft"
    args = ["--algorithm", "rft", "--episodes", str(episodes), "--output_dir", str(out), *FAST,
            "--learning_rate", "1e-3", "--batch_size", "4", "--micro_batch_size", "2", "--save_steps", "1"]
    from sweet.train_policy import main

    main(args)
    n_success = sum(ep.reward >= 1.0 for ep in eps)
    assert f"rft: {n_success}/{len(eps)} episodes" in capsys.readouterr().out
    _assert_trained(out / "final", out, "loss/nll")
    first = read_metrics(out)
    assert json.loads((out / "config.json").read_text())["rft"]["episodes"] == str(episodes)
    # interrupt after step 1: drop the final model and the finished marker; the rerun resumes from checkpoint-1
    import shutil

    shutil.rmtree(out / "final")
    (out / "finished.json").unlink()
    main(args)
    assert "resuming from" in capsys.readouterr().out
    again = read_metrics(out)
    assert again == first and again[-1]["step"] == 2  # step 2 was redone, identically, and logged once


def test_a_finished_run_without_its_final_weights_runs_again(data, tmp_path, capsys):
    """The one finished check (sweet.core.trainer.finished) looks at the final weights: a run
    whose final/*.safetensors were deleted (or truncated) is not taken as finished; the rerun
    resumes from its last checkpoint and writes the same final weights again."""
    from safetensors.torch import load_file

    episodes, _, _ = data
    out = tmp_path / "rft"
    args = ["--algorithm", "rft", "--episodes", str(episodes), "--output_dir", str(out), *FAST,
            "--learning_rate", "1e-3", "--batch_size", "4", "--micro_batch_size", "2", "--save_steps", "1"]
    from sweet.train_policy import main

    main(args)
    weights = sorted((out / "final").glob("*.safetensors"))
    assert weights
    first = {f.name: load_file(f) for f in weights}
    main(args)  # finished: nothing to do
    assert "training already finished" in capsys.readouterr().out
    for f in weights:
        f.unlink()
    main(args)
    said = capsys.readouterr().out
    assert "says finished, but" in said and "has no weights" in said and "resuming from" in said
    again = {f.name: load_file(f) for f in sorted((out / "final").glob("*.safetensors"))}
    assert again.keys() == first.keys()
    assert all(torch.equal(again[n][k], first[n][k]) for n in first for k in first[n])
    # a truncated weights file is damaged, not finished
    big = max(weights, key=lambda f: f.stat().st_size)
    big.write_bytes(big.read_bytes()[:-100])
    main(args)
    assert "is damaged" in capsys.readouterr().out
    assert all(torch.equal(load_file(big)[k], first[big.name][k]) for k in first[big.name])


# ---- mtdpo ---------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type,first_loss", [("sigmoid", 0.693147), ("ipo", 25.0)])
def test_mtdpo_lora_end_to_end(data, tmp_path, loss_type, first_loss, capsys):
    from colbench.episodes import prefix_consistent
    from sweet.train_policy import main

    episodes, _, eps = data
    out = tmp_path / "mtdpo"
    final = main(["--algorithm", "mtdpo", "--episodes", str(episodes), "--output_dir", str(out), *FAST,
                  "--lora", "--lora_r", "4", "--learning_rate", "1e-2", "--micro_batch_size", "2",
                  "--batch_size", "2", "--save_steps", "0", "--loss_type", loss_type])
    assert final == out / "final" and (out / "final-adapter").exists()
    n_tasks = len({ep.task_id for ep in eps})
    assert read_metrics(out)[0]["data/pairs"] == n_tasks  # one solved vs one failed per task
    # every episode is in one pair; those that are one token sequence run as one pass
    one = sum(prefix_consistent(ep) for ep in eps)
    assert f"mtdpo: {one} of {2 * n_tasks} trajectories run as one pass each" in capsys.readouterr().out
    refs = torch.load(out / "ref_logprobs.pt", weights_only=False)["values"].tolist()
    assert len(refs) == n_tasks and all(c < 0 and r < 0 for c, r in refs)
    rows = [r for r in read_metrics(out) if "loss/dpo" in r]
    # first step: the policy equals the reference, so every log-ratio is 0: L_DPO = log 2, L_IPO = (1/(2β))²
    assert rows[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-5)
    assert rows[0]["loss/dpo"] == pytest.approx(first_loss, abs=1e-4)
    _assert_trained(final, out, "loss/dpo")


# ---- sweet -------------------------------------------------------------------------------


def low_ids_score(action) -> float:
    return -sum(action) / max(len(action), 1)


class LowIdsWin:
    """A deterministic ranker with the CandidateRanker interface: A = −mean(action ids)."""

    def __init__(self):
        self.calls = 0

    def score_states(self, items):
        self.calls += 1
        return [[low_ids_score(a) for a in item[1]] for item in items]  # (state, actions, finish reasons)


def test_sweet_pairs_by_score_and_resumes_candidates(data, tmp_path):
    from sweet.algorithms.sweet_rl import (
        CANDIDATES_FILE,
        CandidateConfig,
        SweetConfig,
        SweetTrainConfig,
        main,
        read_candidates,
    )
    from sweet.core.config import ModelConfig

    episodes, tasks, eps = data
    out = tmp_path / "sweet"
    model = ModelConfig(model="tiny", dtype="float32", max_length=512, keep_head=64)
    train = SweetTrainConfig(output_dir=str(out), report_to="none", learning_rate=1e-3, micro_batch_size=4,
                             save_steps=0)
    cfg = SweetConfig(episodes=str(episodes), tasks=str(tasks), env="testbed", pairs_per_state=2, max_episodes=2,
                      stage="sample")
    cand = CandidateConfig(candidates_per_state=4, max_new_tokens=8)
    ranker = LowIdsWin()
    assert main(model, train, cfg, cand, ranker=ranker) is None  # sample only
    rows = read_candidates(out / CANDIDATES_FILE)
    n_states = sum(len(ep.agent_turns) for ep in eps[:2])
    assert len(rows) == n_states and ranker.calls >= 1
    for row in rows.values():
        assert len(row.candidates) == 4
        assert all(c.advantage == pytest.approx(low_ids_score(c.token_ids)) for c in row.candidates)
        assert row.prompt_token_ids  # the sampler reported the prompt it sampled from
    text = (out / CANDIDATES_FILE).read_text()

    # a rerun finds every state sampled: no sampling, no scoring, same file
    cfg_all = SweetConfig(**{**cfg.__dict__, "stage": "all"})
    final = main(model, train, cfg_all, cand, ranker=LowIdsWin())
    assert (out / CANDIDATES_FILE).read_text() == text
    metrics = read_metrics(out)
    assert {"sweet/critic_score_std", "sweet/critic_score_range", "sweet/tied_states"} <= set(metrics[0])
    logged = {k for r in metrics for k in r}
    assert {"loss/dpo", "loss/nll", "rewards/margin", "rewards/accuracy", "logps/chosen", "logps/rejected"} <= logged
    _assert_trained(final, out, "loss/dpo")


class FirstTurnOnly(LowIdsWin):
    """Ranks the first agent turn's candidates (−mean ids); every later state's all tie."""

    def score_states(self, items):
        self.calls += 1
        return [[low_ids_score(a) if item[0].turn_index == 0 else 0.0 for a in item[1]] for item in items]


def test_sweet_anchor_trains_the_tied_states_candidates(data, tmp_path):
    """--anchor_coef: the states the critic leaves unranked give each pair an NLL anchor; the
    anchor is logged, counted, and changes the update (the same pairs without it end elsewhere)."""
    from sweet.algorithms.sweet_rl import CandidateConfig, SweetConfig, SweetTrainConfig, main
    from sweet.core.config import ModelConfig

    episodes, tasks, eps = data
    model = ModelConfig(model="tiny", dtype="float32", max_length=512, keep_head=64)
    cand = CandidateConfig(candidates_per_state=4, max_new_tokens=8)
    finals = {}
    for coef in (0.0, 1.0):
        out = tmp_path / f"anchor{coef}"
        train = SweetTrainConfig(output_dir=str(out), report_to="none", learning_rate=1e-3, micro_batch_size=4,
                                 save_steps=0)
        cfg = SweetConfig(episodes=str(episodes), tasks=str(tasks), env="testbed", pairs_per_state=2, max_episodes=3,
                          anchor_coef=coef)
        finals[coef] = main(model, train, cfg, cand, ranker=FirstTurnOnly())
        metrics = read_metrics(out)
        later = sum(len(ep.agent_turns) - 1 for ep in eps[:3])
        assert metrics[0]["sweet/tied_states"] == later
        logged = {k for r in metrics for k in r}
        if coef:
            assert metrics[0]["sweet/anchor_states"] == later
            assert all(r["loss/anchor"] > 0 for r in metrics if "loss/dpo" in r)
        else:
            assert "loss/anchor" not in logged and "sweet/anchor_states" not in metrics[0]
    a, b = _weights(finals[0.0]), _weights(finals[1.0])
    assert any(not torch.equal(a[k], b[k]) for k in a)

def test_sweet_candidate_file_is_resumed_after_interruption(data, tmp_path):
    """A candidates file cut mid-line (crash) keeps its whole rows; only missing states are sampled."""
    from sweet.algorithms.sweet_rl import (
        CANDIDATES_FILE,
        CandidateConfig,
        SweetConfig,
        SweetTrainConfig,
        main,
        read_candidates,
    )
    from sweet.core.config import ModelConfig

    episodes, tasks, _ = data
    out = tmp_path / "sweet-resume"
    model = ModelConfig(model="tiny", dtype="float32")
    train = SweetTrainConfig(output_dir=str(out), report_to="none")
    cfg = SweetConfig(episodes=str(episodes), tasks=str(tasks), env="testbed", max_episodes=2, stage="sample")
    cand = CandidateConfig(candidates_per_state=2, max_new_tokens=4, sample_batch_size=1)
    main(model, train, cfg, cand, ranker=LowIdsWin())
    path = out / CANDIDATES_FILE
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 4  # 2 episodes × 2 agent turns
    path.write_text("".join(lines[:2]) + lines[2][:20])  # 2 whole rows and a torn one
    ranker = LowIdsWin()
    main(model, train, cfg, cand, ranker=ranker)
    assert ranker.calls == 2  # only the 2 missing states, one per call
    new_lines = path.read_text().splitlines(keepends=True)
    assert new_lines[:2] == lines[:2] and len(new_lines) == 4
    assert set(read_candidates(path)) == {json.loads(line)["key"] for line in lines}
    # other sampling settings would mix stale candidates in: refused, naming the file and the change
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"candidates.jsonl was sampled with other settings.*candidates_per_state"):
        main(model, train, cfg, replace(cand, candidates_per_state=3), ranker=LowIdsWin())


class HighIdsWin:
    """The opposite ranking: A = +mean(action ids)."""

    def __init__(self):
        self.seen = []

    def score_states(self, items):
        self.seen += [item[1] for item in items]
        return [[-low_ids_score(a) for a in item[1]] for item in items]


def test_sweet_reuses_another_runs_candidates_and_scores_them_with_its_own_critic(data, tmp_path):
    """--reuse_candidates: the very same samples (texts, ids, finish reasons, prompt ids),
    no sampler loaded, each scored by this run's critic; a source sampled otherwise, or
    missing a state, is refused with the file named."""
    from dataclasses import replace

    from sweet.algorithms.sweet_rl import (
        CANDIDATES_FILE,
        CandidateConfig,
        SweetConfig,
        SweetTrainConfig,
        main,
        read_candidates,
    )
    from sweet.core.config import ModelConfig

    episodes, tasks, _ = data
    model = ModelConfig(model="tiny", dtype="float32")
    cfg = SweetConfig(episodes=str(episodes), tasks=str(tasks), env="testbed", max_episodes=2, stage="sample")
    cand = CandidateConfig(candidates_per_state=3, max_new_tokens=6, temperature=1.0)
    source = tmp_path / "source"
    main(model, SweetTrainConfig(output_dir=str(source), report_to="none", seed=3), cfg, cand, ranker=LowIdsWin())
    theirs = read_candidates(source / CANDIDATES_FILE)

    reuse = replace(cand, reuse_candidates=str(source / CANDIDATES_FILE), sampler="no-such-engine:x")
    ranker = HighIdsWin()
    with pytest.raises(ValueError, match="sampled with other settings.*sampler"):  # its sampler differs
        main(model, SweetTrainConfig(output_dir=str(tmp_path / "a"), report_to="none", seed=3), cfg, reuse,
             ranker=ranker)
    reuse = replace(reuse, sampler="")
    out = tmp_path / "reused"
    main(model, SweetTrainConfig(output_dir=str(out), report_to="none", seed=3), cfg, reuse, ranker=ranker)
    ours = read_candidates(out / CANDIDATES_FILE)
    assert ours.keys() == theirs.keys()
    for key, row in ours.items():
        assert row.prompt_token_ids == theirs[key].prompt_token_ids
        for c, t in zip(row.candidates, theirs[key].candidates, strict=True):
            assert (c.text, c.token_ids, c.finish_reason) == (t.text, t.token_ids, t.finish_reason)
            assert c.advantage == pytest.approx(-t.advantage)  # this run's critic, not theirs
    assert len(ranker.seen) == len(ours)
    with pytest.raises(ValueError, match=r"source.candidates.jsonl was sampled with other settings.*seed"):
        main(model, SweetTrainConfig(output_dir=str(tmp_path / "b"), report_to="none", seed=4), cfg, reuse,
             ranker=HighIdsWin())
    more = SweetConfig(**{**cfg.__dict__, "max_episodes": 3})
    with pytest.raises(ValueError, match=r"source.candidates.jsonl: no candidates for state"):
        main(model, SweetTrainConfig(output_dir=str(tmp_path / "c"), report_to="none", seed=3), more, reuse,
             ranker=HighIdsWin())


@pytest.fixture(scope="module")
def critic(data, tmp_path_factory):
    """A stage-1 critic trained on the episodes by `python -m sweet.train_critic`."""
    episodes, tasks, _ = data
    critic = tmp_path_factory.mktemp("critic") / "critic"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "sweet.train_critic", "--model", "tiny", "--episodes", str(episodes), "--tasks", str(tasks),
         "--env", "testbed", "--output_dir", str(critic), "--num_epochs", "1", "--learning_rate", "1e-3",
         "--max_length", "512", "--report_to", "none", "--eval_fraction", "0", "--dtype", "float32"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return critic


def test_sweet_end_to_end_with_the_real_critic(data, critic, tmp_path):
    """episodes -> python -m sweet.train_critic -> python -m sweet.train_policy --algorithm sweet -> hf engine
    -> python -m colbench.evaluate."""
    episodes, tasks, eps = data
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "sweet"
    _cli("--algorithm", "sweet", "--episodes", str(episodes), "--tasks", str(tasks), "--env", "testbed",
         "--critic", str(critic), "--output_dir", str(out), *FAST, "--candidates_per_state", "4",
         "--max_new_tokens", "8",
         "--max_episodes", "2", "--learning_rate", "1e-3", "--micro_batch_size", "4")
    from sweet.algorithms.sweet_rl import CANDIDATES_FILE, read_candidates

    rows = read_candidates(out / CANDIDATES_FILE)
    assert len(rows) == sum(len(ep.agent_turns) for ep in eps[:2])
    # the critic's scores are real: they vary between candidates of a state
    assert any(len({c.advantage for c in r.candidates}) > 1 for r in rows.values())
    _assert_trained(out / "final", out, "loss/dpo")

    # the checkpoint plays through the evaluation CLI beside the reference agent
    report = tmp_path / "eval"
    proc = subprocess.run(
        [sys.executable, "-m", "colbench.evaluate", "--env", "testbed", "--tasks", "builtin:legacy/train", "--limit", "2",
         "--agent", f"sweet=hf:{out / 'final'}", "--agent", "reference", "--simulator", "scripted:testbed",
         "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32",
         "--output", str(report), "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweet_eps = [json.loads(line) for line in (report / "episodes" / "sweet.jsonl").read_text().splitlines()]
    assert len(sweet_eps) == 2 and all(ep["turns"][0]["token_ids"] for ep in sweet_eps)


@pytest.mark.slow
def test_sweet_two_rounds(data, critic, tmp_path):
    """Round 2 collects episodes with round 1's policy, retrains the critic, trains again from round 1's policy."""
    episodes, tasks, _ = data
    out = tmp_path / "rounds"
    _cli("--algorithm", "sweet", "--episodes", str(episodes), "--tasks", str(tasks), "--env", "testbed",
         "--critic", str(critic), "--output_dir", str(out), *FAST, "--candidates_per_state", "4",
         "--max_new_tokens", "8",
         "--max_episodes", "2", "--learning_rate", "1e-3", "--micro_batch_size", "4", "--rounds", "2",
         "--simulator", "scripted:testbed", "--rollouts_per_task", "2", "--max_turns", "2", timeout=900)
    r1 = out / "round-1"
    new_eps = [json.loads(line) for line in (r1 / "episodes.jsonl").read_text().splitlines()]
    assert len(new_eps) == 2 and {e["agent"] for e in new_eps} == {"policy"}
    assert (r1 / "critic" / "critic_config.json").exists()
    cfg = json.loads((r1 / "config.json").read_text())
    assert cfg["model"]["model"] == str(out / "final") and cfg["sweet"]["critic"] == str(r1 / "critic")
    _assert_trained(r1 / "final", r1, "loss/dpo")


# ---- CLI -----------------------------------------------------------------------------------


def test_cli_errors_name_the_bad_field(tmp_path):
    from sweet.train_policy import main

    with pytest.raises(ValueError, match="MTDPOConfig.pairing"):  # a UserError: one line, exit 2 from the CLI
        main(["--algorithm", "mtdpo", "--episodes", "x.jsonl", "--pairing", "nope"])
    # a UserError: one line, exit 2 from the CLI
    with pytest.raises(ValueError, match="CandidateConfig.candidates_per_state"):
        main(["--algorithm", "sweet", "--episodes", "x", "--tasks", "y", "--candidates_per_state", "1"])
    with pytest.raises(ValueError, match="unknown 'ppo'"):  # a UserError: one line, exit 2 from the CLI
        main(["--algorithm", "ppo"])
    with pytest.raises(ValueError, match="RFTConfig.episodes is required"):  # a UserError: one line, exit 2 from the CLI
        main(["--algorithm", "rft"])
    cfg = tmp_path / "run.yaml"
    cfg.write_text("episodes: missing.jsonl\nsuccess_threshold: 0.5\n")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        main(["--algorithm", "rft", "--config", str(cfg), "--output_dir", str(tmp_path / "o"), "--report_to", "none"])


def test_plain_help_lists_every_algorithm_with_one_line():
    import sweet.train_policy as tp

    proc = subprocess.run([sys.executable, "-m", "sweet.train_policy", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in tp.ALGORITHMS:
        assert sum(line.split()[:1] == [name] for line in lines) == 1, name  # one line each
        assert name in tp.__doc__.split("\n\n")[1]  # the usage line of the docstring names it too


@pytest.mark.parametrize("algorithm", ["sweet", "rft", "mtdpo"])
def test_help_lists_the_algorithm_flags(algorithm, capsys):
    from sweet.train_policy import main

    with pytest.raises(SystemExit) as exc:
        main(["--algorithm", algorithm, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--episodes" in out and "--learning_rate" in out and "--lora" in out
    assert ("--candidates_per_state" in out) == (algorithm == "sweet")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("algorithm, extra, loss_key", [
    ("mtdpo", ["--pairing", "best_vs_worst"], "loss/dpo"),  # 3 pairs, batch 2: the second step has one pair
    ("rft", [], "loss/nll"),  # a token mean over the whole step, tokens split unevenly over the ranks
])
def test_two_cpu_processes_match_one(data, tmp_path, algorithm, extra, loss_key):
    """Two DDP processes give one process's update."""
    from engines.tiny import tiny_model_path

    episodes, _, _ = data
    args = ["--algorithm", algorithm, "--episodes", str(episodes), *FAST, *extra,
            "--learning_rate", "1e-3", "--micro_batch_size", "1", "--batch_size", "2"]
    out = tmp_path / "ddp"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO / "sweet" / "configs" / "ddp_cpu_2proc.yaml"), "-m"]
    _cli(*args, "--output_dir", str(out), launcher=launcher, timeout=600)
    _assert_trained(out / "final", out, loss_key)
    _cli(*args, "--output_dir", str(tmp_path / "one"))
    start, two, one = _weights(tiny_model_path()), _weights(out / "final"), _weights(tmp_path / "one" / "final")
    d_two = torch.cat([(two[k] - start[k]).flatten() for k in start])
    d_one = torch.cat([(one[k] - start[k]).flatten() for k in start])
    assert ((d_two - d_one).norm() / d_one.norm()).item() < 1e-3
