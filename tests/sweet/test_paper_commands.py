"""Every paper-scale command we document (README.md and the entry points' docstrings:
the ones naming Llama-3.1-8B or -70B) parsed with the REAL parsers (train_policy's
dispatch, the critic's CLI, colbench.evaluate's), defaults resolved, and checked against
the papers' settings. A command that drifts from the table fails here.

The table is written out below, independently of the code's defaults: SWEET-RL / ColBench
(arXiv 2503.15478) and LOOP (arXiv 2502.01600, and its public code), as summarised in
the project's reference facts. Learning rates: the papers give the full fine-tuning rate
(SWEET-RL 2e-7) or the LoRA rate (LOOP's code, 5e-5); the other one is the 10x LoRA rule.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCSTRING_MODULES = ("sweet.train_policy", "sweet.critic.train", "sweet.algorithms.sweet_rl", "sweet.algorithms.rft",
                     "sweet.algorithms.mtdpo", "sweet.algorithms.loop")
PAPER_MODEL = re.compile(r"Llama-3\.1-(8|70)B")
OUR_MODULES = ("sweet.train_policy", "sweet.train_critic", "colbench.evaluate")

SWEET_LR = {"full": 2e-7, "lora": 2e-6}  # paper (full); LoRA: the 10x rule
PAPER = {
    "critic": {"lr": SWEET_LR, "train.num_epochs": 4, "train.batch_size": 8, "critic.length_normalize": True,
               "critic.training_info": True, "critic.head": "lm", "critic.eval_fraction": 0.0,
               "critic.max_pairs": 0},
    "sweet": {"lr": SWEET_LR, "train.num_epochs": 1, "train.batch_size": 8, "algo.beta": 0.1, "algo.nll_coef": 0.01,
              "algo.pairs_per_state": 4, "algo.episode_fraction": 0.1, "algo.max_episodes": None,
              "cand.candidates_per_state": 16, "cand.temperature": 1.0, "rounds.rounds": 1},
    "mtdpo": {"lr": SWEET_LR, "train.num_epochs": 1, "train.batch_size": 8, "algo.beta": 0.1, "algo.nll_coef": 0.01,
              "algo.pairing": "paper"},
    "rft": {"lr": SWEET_LR, "train.num_epochs": 1, "train.batch_size": 8},
    "loop": {"lr": {"full": 5e-6, "lora": 5e-5}, "algo.k": 6, "algo.ppo_epochs": 2, "algo.clip_low": 1 / 1.1,
             "algo.clip_high": 1.1, "algo.advantage": "loo", "algo.ratio_level": "token",
             "algo.min_abs_advantage": 0.01, "algo.kl_coef": 0.0, "train.max_grad_norm": 1.0},
    "evaluate": {"config.max_turns": None, "config.max_reply_chars": 400, "config.limit": None},
}


def _logical_lines(text: str) -> list[str]:
    return [re.sub(r"\s+", " ", line).strip() for line in re.sub(r"\\\n", " ", text).splitlines()]


def paper_commands(text: str) -> list[str]:
    """The logical lines (continuations joined) that run one of our modules on a paper model,
    with the shell variables the text assigns (`SIM=...`) substituted."""
    out, variables = [], {}
    for line in _logical_lines(text):
        assignment = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(\S+)", line)
        if assignment:
            variables[assignment.group(1)] = assignment.group(2)
            continue
        line = re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda v: variables.get(v.group(1), v.group(0)), line)
        m = re.search(r"-m (\S+)", line)
        if m and m.group(1) in OUR_MODULES and PAPER_MODEL.search(line):
            out.append(line)
    return out


def documented() -> list[tuple[str, str]]:
    readme = (ROOT / "README.md").read_text()
    blocks = "\n".join(re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", readme, flags=re.DOTALL))
    found = [("README.md", c) for c in paper_commands(blocks)]
    for name in DOCSTRING_MODULES:
        found += [(name, c) for c in paper_commands(importlib.import_module(name).__doc__)]
    return found


def parse_command(command: str) -> tuple[str, dict]:
    """(row of PAPER, {"section.field": value}) from one command, with the real parsers."""
    module, rest = re.search(r"-m (\S+)(.*)", command).groups()
    argv = shlex.split(rest, comments=True)
    if module == "colbench.evaluate":
        from colbench.evaluate import parse_config

        config = parse_config(argv)
        return "evaluate", {"config": config}
    if module == "sweet.train_critic":
        from sweet.core.config import parse_configs
        from sweet.critic import train

        model, tcfg, ccfg = parse_configs(train.CONFIGS, argv)
        return "critic", {"model": model, "train": tcfg, "critic": ccfg}
    from sweet.train_policy import parse, split_algorithm

    name, _ = split_algorithm(argv)
    _, configs = parse(argv)
    sections = {"sweet": ("model", "train", "algo", "cand", "rounds")}.get(name, ("model", "train", "algo"))
    return name, dict(zip(sections, configs))


def drift(command: str) -> list[str]:
    """How the command's resolved settings differ from the paper's (empty: none)."""
    row, sections = parse_command(command)
    wrong = []
    for key, want in PAPER[row].items():
        if key == "lr":
            lora = sections["model"].lora
            want, got = want["lora" if lora else "full"], sections["train"].learning_rate
            key = f"learning_rate ({'LoRA' if lora else 'full'})"
        else:
            section, name = key.split(".")
            got = getattr(sections[section], name)
        if got != pytest.approx(want) if isinstance(want, float) else got != want:
            wrong.append(f"{key}: {got!r}, paper {want!r}")
    if row == "evaluate" and "70B" not in (sections["config"].simulator or "") and sections["config"].env == "backend":
        wrong.append(f"simulator: {sections['config'].simulator!r}, paper Llama-3.1-70B-Instruct")
    return wrong


COMMANDS = documented()


def test_the_documented_paper_commands_are_found():
    where = {w for w, _ in COMMANDS}
    assert sum(w == "README.md" for w, _ in COMMANDS) >= 3, "README.md: no paper-scale commands found"
    assert {"sweet.critic.train", "sweet.algorithms.sweet_rl", "sweet.algorithms.rft", "sweet.algorithms.mtdpo",
            "sweet.algorithms.loop", "sweet.train_policy"} <= where
    rows = {parse_command(c)[0] for _, c in COMMANDS}
    assert {"critic", "sweet", "rft", "mtdpo", "loop", "evaluate"} <= rows


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{i}" for i, (w, _) in enumerate(COMMANDS)])
def test_a_documented_paper_command_trains_as_the_paper(where, command, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing is written; relative paths stay out of the checkout
    assert drift(command) == [], f"{where}: {command}"


def test_a_drifted_command_fails():
    base = ("accelerate launch -m sweet.train_policy --algorithm mtdpo --episodes e.jsonl "
            "--model hf:meta-llama/Llama-3.1-8B-Instruct --lora")
    assert drift(base) == []
    assert drift(base + " --learning_rate 2e-7") == ["learning_rate (LoRA): 2e-07, paper 2e-06"]
    assert drift(base.replace(" --lora", "")) == []  # full fine-tuning resolves to the paper's 2e-7
    assert drift(base + " --beta 0.5 --batch_size 64") == ["train.batch_size: 64, paper 8", "algo.beta: 0.5, paper 0.1"]
    loop = "python -m sweet.train_policy --algorithm loop --lora true --model hf:meta-llama/Llama-3.1-8B-Instruct"
    assert drift(loop + " --k 4 --clip_high 1.2") == ["algo.k: 4, paper 6", "algo.clip_high: 1.2, paper 1.1"]
    critic = "python -m sweet.train_critic --model hf:meta-llama/Llama-3.1-8B-Instruct --episodes e.jsonl --tasks t"
    assert drift(critic + " --eval_fraction 0.1") == ["critic.eval_fraction: 0.1, paper 0.0"]
    sweet = ("python -m sweet.train_policy --algorithm sweet --episodes e.jsonl --tasks t --critic c "
             "--model hf:meta-llama/Llama-3.1-8B-Instruct")
    assert drift(sweet + " --max_episodes 100") == ["algo.max_episodes: 100, paper None"]
