"""Warm start for the CPU test bed: supervised training on a scripted explorer.

A random-weight tiny model cannot hold a dialogue, so every algorithm starts from
the same warm start: the tiny model fine-tuned on dialogues of the scripted
exploratory agent (testbed/env.py), which asks the right questions only
some of the time. The warm-started policy therefore has a modest, non-zero success
rate, and there is something for RL to improve.

    python -m testbed.warm_start --output_dir runs/warm_start          # ~3-4 min on 2 CPU cores

The scripted dialogues are written as Episodes (agent turns carry prompt ids and
action ids from the tokenizer, since no engine generated them), so this is plain
rejection fine-tuning with no reward filter, reusing the same training code.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from colbench.agents import turn_prompt_ids
from colbench.episodes import write_episodes
from colbench.io import atomic_write
from colbench.types import STOP_ANSWERED, Episode, Turn
from engines import EngineOptions, SamplingParams, load_engine
from sweet.algorithms import rft
from sweet.core.config import ModelConfig, parse_configs
from sweet.core.models import load_tokenizer
from sweet.core.runs import run_cli, trainer_run
from sweet.core.tokens import text_ids
from sweet.core.trainer import finished
from testbed import bed as testbed_bed
from testbed.env import TestbedEnv, answer_constants, make_tasks, told_constants
from testbed.human import optimal_dialogue, scripted_dialogue
from testbed.bed import DEFAULT_BED


@dataclass
class WarmStartConfig:
    output_dir: str = field(default="runs/warm_start", metadata={"help": "where the warm-started model goes (final/)"})
    model: str = field(default="tiny", metadata={"help": "model to fine-tune"})
    n_dialogues: int = field(default=1200, metadata={"help": "scripted dialogues to train on"})
    bed: str = field(default=DEFAULT_BED, metadata={"help": "test-bed preset (testbed/bed.py) whose train tasks "
                                                            "the dialogues are on", "aliases": ["--spec"]})
    p_ask: float | None = field(default=None, metadata={"help": "probability that the explorer asks on each turn "
                                                                "before the last (default: the bed's)"})
    epochs: int = field(default=2, metadata={"help": "passes over the dialogues"})
    learning_rate: float = field(default=2e-3, metadata={"help": "AdamW learning rate"})
    batch_size: int = field(default=8, metadata={"help": "examples per step (small: many steps let copying emerge)"})
    micro_batch_size: int | None = field(default=None, metadata={"help": "examples per forward pass (default: batch_size; "
                                                                         "the update does not depend on it)"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    teacher: str | None = field(default=None, metadata={
        "help": "whose dialogues to imitate: reads (the explorer that reads its dialogue: right after a side question "
                "it asks another side with probability p_other; the default on a non-legacy bed), blind (the explorer "
                "whose choice ignores the dialogue; the default on the legacy bed), optimal (the exact solver's "
                "optimal agent on a non-legacy bed: a reference point, not a method, since it uses the solver) or "
                "optimal_shuffled (the same agent with its facts in a random order per dialogue)"})
    p_other: float | None = field(default=None, metadata={
        "help": "the reading explorer's probability of asking another side right after a side question "
                f"(default: {testbed_bed.READS_P_OTHER}, testbed_bed.READS_P_OTHER)"})

    def __post_init__(self):
        if self.teacher is None:
            self.teacher = testbed_bed.default_teacher(self.bed)
        if self.teacher not in TEACHERS:
            raise ValueError(f"WarmStartConfig.teacher: {self.teacher!r}; one of {', '.join(TEACHERS)}")
        if self.teacher not in testbed_bed.TEACHERS and testbed_bed.design(self.bed).legacy:
            raise ValueError(f"WarmStartConfig.teacher: {self.teacher} needs a non-legacy bed (--bed default, long), "
                             f"not {self.bed!r}")
        if self.teacher in testbed_bed.TEACHERS:
            try:  # resolved here, so that the recorded settings (SETTINGS_FILE) say which explorer it was
                self.p_other = testbed_bed.teacher_design(self.bed, self.teacher, self.p_other).p_other
            except ValueError as e:
                raise ValueError(f"WarmStartConfig.{e}") from None
        elif self.p_other is not None:
            raise ValueError(f"WarmStartConfig.p_other: {self.p_other} is the explorer's; teacher {self.teacher} has none")


TEACHERS = (*testbed_bed.TEACHERS, "optimal", "optimal_shuffled")
SETTINGS_FILE = "warm_start.json"  # the settings the scripted dialogues were written with


def bed_env(bed: str) -> TestbedEnv:
    """The test-bed env of a preset (its turn limit)."""
    return TestbedEnv(bed=bed)


def scripted_episodes(tokenizer, n: int, p_ask: float, seed: int, bed: str = DEFAULT_BED,
                      teacher: str | None = None, p_other: float | None = None) -> list[Episode]:
    """`n` scripted episodes of `teacher` (`WarmStartConfig.teacher`: the explorer that
    reads its dialogue or the blind one, at `p_ask` and `p_other`; or the solver's optimal
    agent, "optimal_shuffled" with a random order of the facts per dialogue) on the test
    bed's train tasks of `bed`, tokenised."""

    env = bed_env(bed)
    tasks = make_tasks("train", bed=bed)
    rng = random.Random(seed)
    teacher = testbed_bed.default_teacher(bed) if teacher is None else teacher
    if teacher in testbed_bed.TEACHERS:
        p_other = testbed_bed.teacher_design(bed, teacher, p_other).p_other
    episodes = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        turns = scripted_turns(tokenizer, env, task, _teacher_dialogue(teacher, task, rng, p_ask, p_other or 0.0))
        episodes.append(Episode(task.task_id, "testbed", "scripted-explorer", i, turns, answer=turns[-1].content,
                                stop_reason=STOP_ANSWERED))
    answers = [env.extract_answer(ep.answer) for ep in episodes]
    for ep, score in zip(episodes, env.score([tasks[i % len(tasks)] for i in range(n)], answers)):
        ep.score = score
    env.close()
    return episodes


def scripted_turns(tokenizer, env: TestbedEnv, task, dialogue) -> list[Turn]:
    """A scripted dialogue's (role, text) lines as turns, each agent turn with the ids a
    model agent would have been prompted with (colbench.agents.turn_prompt_ids) and its
    text's ids, ended by the model (a demonstration ends its turn)."""
    turns: list[Turn] = []
    for role, text in dialogue:
        if role == "agent":
            prompt = env.agent_messages(task, turns)
            previous = next((t for t in reversed(turns) if t.role == "agent"), None)
            turns.append(Turn("agent", text, prompt=prompt, prompt_token_ids=turn_prompt_ids(tokenizer, prompt, previous),
                              token_ids=list(text_ids(tokenizer, text)), finish_reason="stop"))
        else:
            turns.append(Turn("human", text))
    return turns


def _dialogue(task, rng, p_ask, p_other: float = 0.0):
    return scripted_dialogue(task, rng, p_ask=p_ask, p_other=p_other)


def _teacher_dialogue(teacher: str, task, rng: random.Random, p_ask: float, p_other: float):
    if teacher in testbed_bed.TEACHERS:
        return _dialogue(task, rng, p_ask, p_other)
    facts = testbed_bed.task_design(task).facts
    return optimal_dialogue(task, rng.sample(range(facts), facts) if teacher == "optimal_shuffled" else None)


def check_split(bed: str = DEFAULT_BED) -> str:
    """The split the copy check reads: the validation tasks ("val") where the bed has them,
    so that the warm start's gate never looks at a test task; the legacy bed has none, and
    its check reads "test"."""
    s = testbed_bed.design(bed)
    return "val" if not s.legacy and s.n_val > 0 else "test"


def copy_check_dialogues(n: int = 48, seed: int = 0, bed: str = DEFAULT_BED):
    """`n` held-out copy-check cases: the always-asking explorer's questions (one on every
    turn before the last: three on the legacy bed, two on a 3-turn bed) and the human's
    replies on the tasks of `check_split(bed)`, as (task, turns, want). want: per
    constant, what the answer must write, or None where it is not checked. Legacy: the
    constants the replies stated (A or None, B or None). Another bed: what the explorer
    would write, every constant (told ones copied, the fixed guess for the rest), since
    its warm start's success rests on both."""

    tasks = make_tasks(check_split(bed), bed=bed)
    s = testbed_bed.design(bed)
    rng = random.Random(f"copy-check-{seed}")
    cases = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        turns = [Turn(role, text) for role, text in _dialogue(task, rng, 1.0)[:-1]]  # not the explorer's answer
        replies = [t.content for t in turns if t.role == "human"]
        if s.legacy:
            a, b = task.meta["a"], task.meta["b"]
            know_a, know_b = told_constants(replies, a, b)
            want: tuple[int | None, ...] = (a if know_a else None, b if know_b else None)
        else:
            want = testbed_bed.guess_values(s, testbed_bed.told_values(s, replies))
        cases.append((task, turns, want))
    return cases


def copy_score(answers: list[str], told: list[tuple[int | None, ...]], bed: str = DEFAULT_BED) -> float:
    """The share of checked constants (not None in `told`) that the answers wrote, read
    as the scorer reads an answer (legacy: testbed.env.answer_constants; another
    bed: testbed.bed.answer_values)."""

    s = testbed_bed.design(bed)
    right = total = 0
    for text, want in zip(answers, told, strict=True):
        got = answer_constants(text) if s.legacy else testbed_bed.answer_values(s, text)
        for g, w in zip(got, want):
            if w is not None:
                right, total = right + (g == w), total + 1
    return right / max(total, 1)


def copy_accuracy(model: str, n: int = 48, seed: int = 0, bed: str = DEFAULT_BED, workers: int = 1) -> float:
    """How often `model`, answering greedily after the always-asking explorer's questions
    on held-out tasks of `bed` (its validation tasks: `check_split`), writes each constant as checked (`copy_check_dialogues`,
    `copy_score`). The warm start's copy phase must pass this before the behaviour
    phase: a cosmetic change to the prompt once flipped it from 28/28 to 8/28, and every
    algorithm then started from a policy that miscopies. `workers`: EngineOptions.workers."""

    env = bed_env(bed)
    cases = copy_check_dialogues(n, seed, bed)
    engine = load_engine(f"hf:{model}", EngineOptions(workers=workers))
    try:
        prompts = []
        for task, turns, _ in cases:  # prompted as a rollout prompts the model (token in, token out)
            turns = scripted_turns(engine.tokenizer, env, task, [(t.role, t.content) for t in turns])
            previous = next((t for t in reversed(turns) if t.role == "agent"), None)
            prompts.append(turn_prompt_ids(engine.tokenizer, env.agent_messages(task, turns), previous))
        env.close()
        samples = engine.generate_from_ids(prompts, SamplingParams(temperature=0.0, max_new_tokens=64))
    finally:
        engine.close()
    return copy_score([s[0].text for s in samples], [want for _, _, want in cases], bed)


def dialogue_settings(cfg: WarmStartConfig, p_ask: float) -> dict:
    """What the scripted dialogues depend on (the teacher and its p_other included), as
    recorded in OUT/warm_start.json: a rerun with other settings is refused."""
    return {"bed": cfg.bed, "teacher": cfg.teacher, "p_ask": p_ask, "p_other": cfg.p_other,
            "n_dialogues": cfg.n_dialogues, "seed": cfg.seed}


def main(cfg: WarmStartConfig) -> Path:
    """Write scripted episodes, then fine-tune on all of them (RFT with no filter). The
    dialogues' settings (`dialogue_settings`) are recorded beside them; reusing the
    folder with other settings is a one-line error, so a blind warm start is never taken
    for a reading one."""

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    episodes_path = out / "scripted_episodes.jsonl"
    p_ask = testbed_bed.design(cfg.bed).p_ask if cfg.p_ask is None else cfg.p_ask
    settings = dialogue_settings(cfg, p_ask)
    record = out / SETTINGS_FILE
    if episodes_path.exists():  # the dialogues' settings are part of the run's fingerprint (their hash)
        old = testbed_bed.bed_record(json.loads(record.read_text())) if record.exists() else None
        if old != settings:
            raise ValueError(f"{episodes_path}: written with {old or 'unrecorded settings'}, not {settings}: "
                             f"use another --output_dir")
    else:
        tokenizer = load_tokenizer(cfg.model)
        episodes = scripted_episodes(tokenizer, cfg.n_dialogues, p_ask, cfg.seed, cfg.bed, cfg.teacher, cfg.p_other)
        write_episodes(episodes_path, episodes)
        atomic_write(record, json.dumps(settings, indent=2))
        success = sum(e.success for e in episodes) / len(episodes)
        print(f"warm start: {len(episodes)} scripted dialogues, {cfg.teacher} success rate {success:.2f}")
    if finished(out) is not None:
        print(f"warm start: {out / 'final'} exists, reusing it")
        return out / "final"
    model_cfg = ModelConfig(model=cfg.model, max_length=512, keep_head=64)
    train = rft.RFTTrainConfig(output_dir=str(out), learning_rate=cfg.learning_rate, num_epochs=cfg.epochs,
                               batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size or cfg.batch_size, seed=cfg.seed,
                               warmup_ratio=0.05, report_to="none", save_steps=0)
    return rft.main(model_cfg, train, rft.RFTConfig(episodes=str(episodes_path), env="testbed", success_threshold=0.0))


def cli(argv: list[str] | None = None) -> Path:
    """`python -m testbed.warm_start`: parse the command line, then `main(cfg)`."""
    (cfg,) = parse_configs([WarmStartConfig], argv, description=__doc__.split("\n\n")[0])
    with trainer_run(cfg.output_dir, command="python -m testbed.warm_start"):
        return main(cfg)


if __name__ == "__main__":
    sys.exit(run_cli(cli, prog="python -m testbed.warm_start"))
