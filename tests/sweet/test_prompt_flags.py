"""The prompt flags reach their consumers in the trainers (docs/prompts.md): the critic's
--critic_context_prompt (training, critic_config.json, the stage-2 scorer) and its
--agent_prompt check, stage 2's and RFT's check of the recorded prompts, LOOP's and the
collection's --agent_prompt / --human_prompt (the tiny model as agent and simulator), and
the prompt files in config.json and the fingerprint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from colbench.prompts import PromptError, load_prompt
from colbench.types import Episode

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
CONTEXT = "CTX-MARKER-5e1: the person's private notes, which the assistant never saw:\n{training_info}\n(end of notes)\n"
AGENT = "AGENT-MARKER-19c: at most {max_turns} turns; finish with {answer_marker} and the code.\n"
HUMAN = ("HUMAN-MARKER-2b: act as the person who wants {problem_description}. Private facts: {hidden_information}\n"
         "So far:\n{dialogue_history}\nAnswer the last message in two sentences.\n")


@pytest.fixture
def files(tmp_path):
    paths = {}
    for name, text in (("context", CONTEXT), ("agent", AGENT), ("human", HUMAN)):
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text(text)
    return paths


def _stamped(episodes: list[Episode], agent_file: Path | None) -> list[Episode]:
    """The episodes as collected with `agent_file` (None: our default) would record it."""
    rec = load_prompt("backend_agent", agent_file).record()
    return [replace(ep, meta={**ep.meta, "prompts": {"agent": rec}}) for ep in episodes]


def _write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def test_critic_trains_and_scores_with_the_context_prompt_file(tmp_path, files, tiny_tokenizer, make_synthetic,
                                                               fresh_accelerate):
    from sweet.critic.model import TrainedCritic, critic_context_ids
    from sweet.critic.train import cli

    tasks, episodes = make_synthetic(tiny_tokenizer, 6)
    eps = _write(tmp_path / "eps.jsonl", _stamped(episodes, files["agent"]))
    task_file = _write(tmp_path / "tasks.jsonl", tasks)
    out = tmp_path / "critic"
    cli(["--episodes", str(eps), "--tasks", str(task_file), "--output_dir", str(out), "--num_epochs", "1",
         "--batch_size", "2", "--micro_batch_size", "2", "--max_pairs", "2", "--max_length", "512",
         "--report_to", "none", "--critic_context_prompt", str(files["context"]), "--agent_prompt", str(files["agent"])])
    ctx, agent = load_prompt("critic_context", files["context"]), load_prompt("backend_agent", files["agent"])
    spec = json.loads((out / "critic_config.json").read_text())
    assert spec["context_template"] == CONTEXT and spec["context_prompt"] == ctx.record()
    config = json.loads((out / "config.json").read_text())
    assert config["prompts"]["critic.critic_context_prompt"]["sha256"] == ctx.sha256
    assert config["prompts"]["critic.agent_prompt"]["sha256"] == agent.sha256
    fp = json.loads((out / "fingerprint.json").read_text())
    assert fp["critic.critic_context_prompt"]["sha256"] == ctx.sha256 and fp["critic.critic_context_prompt"]["default"] is False
    # the stage-2 scorer builds its context from the recorded template: c inside our wording
    scorer = TrainedCritic.load(out, device="cpu")
    from sweet.core.records import episode_states

    state = episode_states(episodes[0], tasks[0].hidden)[0]
    ids = critic_context_ids(scorer.tokenizer, state, scorer.record.header, scorer.record.training_info,
                             scorer.record.context_template)
    text = scorer.tokenizer.decode(ids)
    assert "CTX-MARKER-5e1: the person's private notes" in text and tasks[0].hidden in text
    assert "Training-time information" not in text
    assert len(scorer.advantages(state, [[5, 6, 7]])) == 1


def test_trainers_refuse_episodes_of_another_or_mixed_agent_prompt(tmp_path, files, tiny_tokenizer, make_synthetic):
    from sweet.algorithms.rft import RFTConfig
    from sweet.algorithms.rft import main as rft_main
    from sweet.algorithms.sweet_rl import SweetConfig, load_states
    from sweet.critic.train import CriticConfig, build_data

    tasks, episodes = make_synthetic(tiny_tokenizer, 4)
    task_file = _write(tmp_path / "tasks.jsonl", tasks)
    ours = _write(tmp_path / "ours.jsonl", episodes)  # no record: our default
    mixed = _write(tmp_path / "mixed.jsonl", episodes[:4] + _stamped(episodes[4:], files["agent"]))
    theirs = _write(tmp_path / "theirs.jsonl", _stamped(episodes, files["agent"]))
    sha = load_prompt("backend_agent", files["agent"]).sha256[:12]
    # the critic
    with pytest.raises(PromptError, match=rf"mixed\.jsonl: episodes built with different agent prompts: .*{sha}"):
        build_data(CriticConfig(episodes=str(mixed), tasks=str(task_file)), tiny_tokenizer, 0)
    with pytest.raises(PromptError, match=rf"ours\.jsonl: episode .* assumed our default.*--agent_prompt is .*{sha}"):
        build_data(CriticConfig(episodes=str(ours), tasks=str(task_file), agent_prompt=str(files["agent"])),
                   tiny_tokenizer, 0)
    assert build_data(CriticConfig(episodes=str(theirs), tasks=str(task_file), agent_prompt=str(files["agent"])),
                      tiny_tokenizer, 0).train_pairs
    # stage 2: the states candidates are sampled at
    cfg = SweetConfig(episodes=str(theirs), tasks=str(task_file), critic="x", episode_fraction=1.0)
    with pytest.raises(PromptError, match=rf"theirs\.jsonl: episode .*{sha}.* this run's --agent_prompt is .*backend_agent\.txt"):
        load_states(cfg)
    assert len(load_states(replace(cfg, agent_prompt=str(files["agent"])))) == 2 * len(episodes)
    # RFT refuses before loading a model
    with pytest.raises(PromptError, match=r"mixed\.jsonl: episodes built with different agent prompts"):
        from sweet.algorithms.rft import RFTTrainConfig
        from sweet.core.config import ModelConfig

        rft_main(ModelConfig(), RFTTrainConfig(output_dir=str(tmp_path / "rft"), report_to="none"),
                 RFTConfig(episodes=str(mixed)))


def test_a_bad_prompt_file_is_one_line_exit_2_before_any_work(tmp_path):
    bad = tmp_path / "ctx.txt"
    bad.write_text("no placeholder here")
    r = subprocess.run([sys.executable, "-m", "sweet.train_critic", "--episodes", "e.jsonl", "--output_dir",
                        str(tmp_path / "o"), "--critic_context_prompt", str(bad)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "ctx.txt: the critic_context prompt lacks the required placeholder {training_info}" in r.stderr
    assert not (tmp_path / "o").exists()


def test_collection_builds_episodes_with_the_prompt_files(tmp_path, files):
    from colbench.rollout import episode_seeds
    from colbench.tasks import load_tasks
    from engines.base import SamplingParams
    from sweet.core.rollouts import policy_episodes

    tasks = load_tasks("builtin:train", env="backend", limit=1)
    eps = policy_episodes("tiny", tasks, env="backend", simulator="tiny", seeds=episode_seeds(0, 1),
                          sampling=SamplingParams(temperature=0.0, max_new_tokens=6), max_turns=2,
                          out_path=tmp_path / "eps.jsonl", progress=False, agent_prompt=str(files["agent"]),
                          human_prompt=str(files["human"]))
    [ep] = eps
    assert ep.meta["prompts"] == {"agent": load_prompt("backend_agent", files["agent"]).record(),
                                  "human": load_prompt("backend_human", files["human"]).record()}
    assert ep.agent_turns[0].prompt[0]["content"].startswith("AGENT-MARKER-19c: at most 2 turns; finish with I WANT")


def test_loop_rollouts_use_the_prompt_files_and_record_them(tmp_path, files):
    out = tmp_path / "loop"
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "loop", "--env", "backend", "--tasks",
           "builtin:train", "--simulator", "tiny", "--model", "tiny", "--iterations", "1", "--tasks_per_iteration", "1",
           "--k", "2", "--max_new_tokens", "6", "--max_turns", "2", "--micro_batch_size", "4", "--report_to", "none",
           "--agent_prompt", str(files["agent"]), "--human_prompt", str(files["human"]), "--output_dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    eps = [Episode.from_json(json.loads(x)) for x in (out / "episodes" / "iter-0000.jsonl").read_text().splitlines()]
    assert len(eps) == 2, res.stderr[-3000:]
    agent, human = load_prompt("backend_agent", files["agent"]), load_prompt("backend_human", files["human"])
    for ep in eps:
        assert ep.meta["prompts"] == {"agent": agent.record(), "human": human.record()}
        assert ep.agent_turns[0].prompt[0]["content"].startswith("AGENT-MARKER-19c: at most 2 turns")
    config = json.loads((out / "config.json").read_text())
    assert config["prompts"]["loop.agent_prompt"]["sha256"] == agent.sha256
    assert config["prompts"]["loop.human_prompt"]["sha256"] == human.sha256
    fp = json.loads((out / "fingerprint.json").read_text())
    assert fp["loop.human_prompt"]["sha256"] == human.sha256


def test_fingerprint_compares_prompt_files_by_content(tmp_path, files):
    from sweet.algorithms.loop import LoopConfig
    from sweet.core.fingerprint import differences, run_fingerprint

    cfg = LoopConfig(env="backend", simulator="tiny", agent_prompt=str(files["agent"]))
    before = run_fingerprint({"loop": cfg})
    files["agent"].write_text(AGENT + "Be brief.\n")
    after = run_fingerprint({"loop": cfg})
    assert [d.split(":")[0] for d in differences(before, after)] == ["loop.agent_prompt"]
    default = run_fingerprint({"loop": LoopConfig(env="backend", simulator="tiny")})
    old = {k: v for k, v in default.items() if not k.endswith("_prompt")}  # a run from before prompt files
    assert differences(old, default) == []
    assert [d.split(":")[0] for d in differences(old, after)] == ["loop.agent_prompt"]
