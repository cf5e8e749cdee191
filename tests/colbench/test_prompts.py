"""Prompt templates chosen by flags (colbench.prompts): validation on load, the published
evaluator's single-message simulator layout run through `python -m colbench.evaluate`
with the tiny model, the records in episodes / config.json / leaderboard, and the refusal
of episodes built with different prompt files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colbench.prompts import (
    KINDS,
    PromptError,
    check_episode_prompts,
    check_prompt_flags,
    dialogue_text,
    load_prompt,
)
from colbench.types import Episode, Task, Turn

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}

# The published contract's shape (facts.md): one user message holding the description, the
# hidden information and the dialogue as text. Our own wording, not the published text.
PUBLISHED_SHAPE = """MARKER-7f3a: Pretend to be someone who asked a coding helper for this: {problem_description}
You want an answer tailored to you. What you privately know (answer only from it, otherwise say "I don't know"):
{hidden_information}
Conversation until now:
{dialogue_history}
Reply to the helper's last message in two sentences at most, and write nothing else.
"""
AGENT_PROMPT = "AGENT-MARKER-19c: work with the user for at most {max_turns} turns, then write {answer_marker} and code.\n"


def test_every_shipped_template_loads_with_its_placeholders():
    for kind, spec in KINDS.items():
        tpl = load_prompt(kind)
        assert tpl.path == spec.default_path().resolve() and len(tpl.sha256) == 64
        assert set(spec.required) <= tpl.placeholders <= set(spec.placeholders), kind
    assert load_prompt("backend_human").placeholders == {"problem_description", "hidden_information"}
    assert "dialogue_history" not in load_prompt("backend_human").placeholders  # ours: a chat history


def test_placeholder_errors_name_the_file_and_the_placeholder(tmp_path):
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("{problem_description} {hidden_information} {secret_sauce}")
    with pytest.raises(PromptError, match=r"--human_prompt .*unknown\.txt: unknown placeholder \{secret_sauce\}"):
        load_prompt("backend_human", unknown)
    missing = tmp_path / "missing.txt"
    missing.write_text("Help with {problem_description}; json like {\"a\": 1} is text.")
    with pytest.raises(PromptError, match=r"missing\.txt: the backend_human prompt lacks the required placeholder "
                                          r"\{hidden_information\}"):
        load_prompt("backend_human", missing)
    with pytest.raises(PromptError, match=r"--critic_context_prompt .*missing\.txt: unknown placeholder"):
        load_prompt("critic_context", missing)
    with pytest.raises(PromptError, match="cannot read"):
        load_prompt("backend_agent", tmp_path / "nope.txt")
    old = tmp_path / "old.txt"
    old.write_text("{description} / {hidden}")  # the names before the registry: aliases
    assert load_prompt("backend_human", old).fill(problem_description="D", hidden_information="H") == "D / H"


def test_a_flag_nothing_reads_is_refused():
    with pytest.raises(PromptError, match="--human_prompt x.txt: simulator 'scripted:backend'"):
        check_prompt_flags("backend", "scripted:backend", None, "x.txt")
    with pytest.raises(PromptError, match="--agent_prompt x.txt: env 'testbed'"):
        check_prompt_flags("testbed", None, "x.txt", None)
    assert set(check_prompt_flags("frontend", "text+tiny", None, None)) == {"agent", "human"}
    assert check_prompt_flags("frontend", "text+tiny", None, None)["human"].kind == "frontend_text"


def test_llm_simulator_layouts(tmp_path):
    from simulators.llm import LLMSimulator

    class NoEngine:
        spec = "none"

    task = Task("t1", "backend", "Write f(x).", "def f(x):\n    return 2 * x\n")
    turns = [Turn("agent", "What does f return?"), Turn("human", "Twice x."), Turn("agent", "For negatives too?")]
    ours = LLMSimulator(NoEngine()).conversation(task, turns)
    assert [m["role"] for m in ours] == ["system", "user", "assistant", "user"]
    assert "Write f(x)." in ours[0]["content"] and "return 2 * x" in ours[0]["content"]
    path = tmp_path / "published_shape.txt"
    path.write_text(PUBLISHED_SHAPE)
    [msg] = LLMSimulator(NoEngine(), prompt_file=path).conversation(task, turns)
    assert msg["role"] == "user" and msg["content"].startswith("MARKER-7f3a")
    assert dialogue_text(turns) in msg["content"] and "return 2 * x" in msg["content"]
    assert "{" not in msg["content"].replace('"I don\'t know"', "")


def _episode(seed: int, prompts: dict | None, simulator: str | None = "llm:tiny") -> Episode:
    meta = {"simulator": simulator} if simulator else {}
    if prompts is not None:
        meta["prompts"] = prompts
    return Episode(task_id="t", env="backend", agent="a", seed=seed, meta=meta)


def test_episodes_of_different_prompt_files_are_refused(tmp_path):
    ours = load_prompt("backend_agent")
    other_path = tmp_path / "agent.txt"
    other_path.write_text(AGENT_PROMPT)
    other = load_prompt("backend_agent", other_path)
    e_ours = _episode(0, {"agent": ours.record()})
    e_old = _episode(1, None)  # no record: assumed our default
    e_other = _episode(2, {"agent": other.record()})
    check_episode_prompts([e_ours, e_old], {"agent": ours}, "eps.jsonl")  # same file
    with pytest.raises(PromptError, match=r"eps\.jsonl: episodes built with different agent prompts: .*"
                                          + ours.sha256[:12] + ".*" + other.sha256[:12]):
        check_episode_prompts([e_ours, e_other], {"agent": ours}, "eps.jsonl")
    with pytest.raises(PromptError, match=r"was built with the agent prompt .*assumed our default.*"
                                          r"this run's --agent_prompt is .*agent\.txt"):
        check_episode_prompts([e_old], {"agent": other}, "eps.jsonl")
    check_episode_prompts([e_other], {"agent": other}, "eps.jsonl")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m colbench.evaluate ARGS` with the model engine's prompts spied on: every
    conversation the engine is prompted with (a simulator's through generate, the agent's
    through its token-in/token-out prompt ids) is appended to tmp_path/seen.jsonl (nothing
    is changed)."""
    spy = tmp_path / "spy.py"
    spy.write_text(
        "import json, runpy, sys\n"
        "import colbench.agents as agents\n"
        "import engines.hf as hf\n"
        "def seen(conversations):\n"
        f"    with open({str(tmp_path / 'seen.jsonl')!r}, 'a') as f:\n"
        "        for c in conversations:\n"
        "            f.write(json.dumps(c) + '\\n')\n"
        "real, real_ids = hf.HFEngine.generate, agents.turn_prompt_ids\n"
        "def generate(self, conversations, params):\n"
        "    seen(conversations)\n"
        "    return real(self, conversations, params)\n"
        "def turn_prompt_ids(tokenizer, messages, previous):\n"
        "    seen([messages])\n"
        "    return real_ids(tokenizer, messages, previous)\n"
        "hf.HFEngine.generate, agents.turn_prompt_ids = generate, turn_prompt_ids\n"
        "sys.argv = ['colbench.evaluate', *sys.argv[1:]]\n"
        "runpy.run_module('colbench.evaluate', run_name='__main__')\n")
    return subprocess.run([PY, str(spy), *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=540)


def test_evaluate_with_a_published_shape_simulator_prompt_and_our_agent_prompt_flag(tmp_path):
    human = tmp_path / "published_shape.txt"
    human.write_text(PUBLISHED_SHAPE)
    agent = tmp_path / "agent.txt"
    agent.write_text(AGENT_PROMPT)
    out = tmp_path / "run"
    args = ["--env", "backend", "--agent", "tiny", "--simulator", "tiny", "--limit", "2", "--max-turns", "2",
            "--max-new-tokens", "6", "--simulator-max-new-tokens", "6", "--device", "cpu", "--no-progress",
            "--human_prompt", str(human), "--agent_prompt", str(agent), "--output", str(out)]
    r = _run(tmp_path, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    from colbench.tasks import load_tasks

    tasks = load_tasks("builtin:test", env="backend", limit=2)
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    sim = [c for c in seen if "MARKER-7f3a" in json.dumps(c)]
    agent_calls = [c for c in seen if c not in sim]
    assert sim and agent_calls
    for conv in sim:  # the simulator got ONE user message built from the file
        assert len(conv) == 1 and conv[0]["role"] == "user"
        text = conv[0]["content"]
        assert text.startswith("MARKER-7f3a: Pretend to be someone")
        task = next(t for t in tasks if t.description in text)
        assert task.hidden.strip() in text and "Conversation until now:\nAssistant: " in text
    for conv in agent_calls:  # the agent's system message came from --agent_prompt, filled
        assert conv[0]["content"].startswith("AGENT-MARKER-19c: work with the user for at most 2 turns, then write I WANT")
    human_rec, agent_rec = load_prompt("backend_human", human).record(), load_prompt("backend_agent", agent).record()
    eps = [Episode.from_json(json.loads(x)) for x in (out / "episodes" / "tiny.jsonl").read_text().splitlines()]
    assert len(eps) == 2 and all(ep.meta["prompts"] == {"agent": agent_rec, "human": human_rec} for ep in eps)
    assert eps[0].agent_turns[0].prompt[0]["content"].startswith("AGENT-MARKER-19c")
    config = json.loads((out / "config.json").read_text())
    assert config["prompts"] == {"agent": agent_rec, "human": human_rec}
    [row] = json.loads((out / "leaderboard.json").read_text())
    assert row["prompts"] == {"agent": [agent_rec], "human": [human_rec]}
    md = (out / "leaderboard.md").read_text()
    assert f"human {human.resolve()} (sha256 {human_rec['sha256'][:12]})" in md
    # the same DIR with our default simulator prompt: its episodes would mix, refused in one line
    r = _run(tmp_path, *[a for a in args if a not in ("--human_prompt", str(human))])
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "holds episodes built with the human prompt" in r.stderr and "--human_prompt" in r.stderr


def test_evaluate_bad_prompt_file_is_one_line_exit_2(tmp_path):
    from colbench.evaluate import main

    bad = tmp_path / "bad.txt"
    bad.write_text("Hi {problem_description}, {hidden_informaton}")
    rc = main(["--env", "backend", "--agent", "tiny", "--simulator", "tiny", "--human_prompt", str(bad),
               "--output", str(tmp_path / "o")])
    assert rc == 2 and not (tmp_path / "o").exists()


def test_frontend_simulators_single_message_layout(tmp_path):
    from simulators.text_frontend import TextFrontendSimulator
    from simulators.vlm import VLMSimulator

    class NoEngine:
        spec = "none"

    task = Task("f1", "frontend", "A bakery site.", "<html></html>")
    turns = [Turn("agent", "Draft:\n```html\n<div>v1</div>\n```"), Turn("human", "Make the header blue."),
             Turn("agent", "Better?\n```html\n<div>v2</div>\n```")]
    path = tmp_path / "fe.txt"
    path.write_text("FE-MARKER: you want {problem_description} Earlier:\n{dialogue_history}\n")
    vlm = VLMSimulator(NoEngine(), None, prompt_file=path, render_dir=tmp_path)
    [msg] = vlm.conversation(task, turns, "data:agent", "data:target")
    text, agent_img, target_img = msg["content"]
    assert msg["role"] == "user" and agent_img["image_url"]["url"] == "data:agent"
    assert target_img["image_url"]["url"] == "data:target"  # the agent's render first, then the target
    assert text["text"].startswith("FE-MARKER: you want A bakery site. Earlier:\nAssistant: Draft: [I showed you")
    assert "You: Make the header blue." in text["text"] and "<div>v1</div>" not in text["text"]
    assert "Better?" in text["text"].split("Earlier:")[1].split("You: Make the header blue.")[1]  # the latest turn
    ours = VLMSimulator(NoEngine(), None, render_dir=tmp_path).conversation(task, turns, "data:agent", "data:target")
    assert [m["role"] for m in ours] == ["system", "user", "assistant", "user"]  # ours: the history as chat
    [tmsg] = TextFrontendSimulator(NoEngine(), None, prompt_file=path).conversation(task, turns, "PAGE A", "PAGE B")
    assert tmsg["role"] == "user" and tmsg["content"].startswith("FE-MARKER") and tmsg["content"].endswith("PAGE B")
    with pytest.raises(PromptError, match=r"fe\.txt: unknown placeholder \{hidden_information\} in a frontend_vlm"):
        path.write_text("{hidden_information}")
        VLMSimulator(NoEngine(), None, prompt_file=path, render_dir=tmp_path)
