"""The whole pipeline as plain function calls: warm start → collect → train → evaluate.

Each step builds the typed configs of an entry point and calls its `main(*configs)`, so
the demo (`python -m testbed.demo`) and the learning benchmark (`testbed/learning.py`) run
exactly the code paths of the README's commands; a misspelt setting fails before any
step runs work (`colbench.cli.make_configs`). Every step writes into its own
folder and is skipped when its output exists, so a crashed run resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from colbench import evaluate as ev
from colbench.cli import make_configs
from colbench.io import atomic_write
from colbench.jsonl import read_rows
from colbench.rollout import episode_seeds
from colbench.tasks import load_tasks, usable_tasks
from engines import EngineOptions, SamplingParams
from engines.memory import release_memory, resident_bytes
from sweet.algorithms import load_algorithm
from sweet.core.records import read_candidates
from sweet.core.rollouts import policy_episodes
from sweet.core.trainer import finished
from sweet.critic import train as critic_train
from sweet.critic.baseline import SAMPLES_FILE as BASELINE_SAMPLES
from sweet.critic.baseline import BaselineRow
from testbed import bed as testbed_bed
from testbed.bed import DEFAULT_BED

WORKERS = 2  # the CPU's cores: forked generating processes (TestbedSetup.workers, the warm start's copy check)


@dataclass
class TestbedSetup:
    """The CPU test bed's sizes; the defaults are the `default` preset's
    (`for_bed(DEFAULT_BED)`, whose sources name it) and fit the main job. Settings that
    differ from the papers' (the CLI defaults stay the papers'): 8 stage-2 candidates
    (16) on the first 112 of the sorted episodes (the first 10%), critic lr 1e-3 on
    pairs whose best reward >= 0.5 (1.0), DPO lr 3e-5 and NLL 0.1 (0.01; higher lrs
    collapsed the tiny policy to 0% success); evaluation at temperature 1.0 (the legacy
    bed: 0.7, 8 episodes per test task)."""

    __test__ = False  # not a pytest class

    env: str = "testbed"
    simulator: str = "scripted:testbed"
    train_tasks: str = "builtin:train"
    test_tasks: str = "builtin:test"
    episodes_per_task: int = 8  # K rollouts per train task for the offline algorithms
    max_turns: int = 3
    max_new_tokens: int = 64
    temperature: float = 1.0  # collection (exploration)
    eval_seeds: int = 2  # sampled evaluation episodes per test task
    eval_temperature: float = 1.0
    candidates: int = 8  # SWEET stage 2: K candidates per state (paper: 16)
    stage2_episodes: int = 112  # SWEET stage 2 uses the first N episodes' states (paper: the first 10%)
    train_limit: int | None = None  # collect on the first N train tasks only (smoke runs)
    test_limit: int | None = None  # evaluate on the first N test tasks only (smoke runs)
    val_limit: int | None = None  # validate on the first N validation tasks only (smoke runs)
    timings: dict[str, float] = field(default_factory=dict)
    memory_gb: dict[str, float] = field(default_factory=dict)  # the process's resident set after each step
    bed: str = DEFAULT_BED  # the test-bed preset (testbed/bed.py) the task sources name
    val_tasks: str | None = "builtin:val"  # validation tasks, drawn from the train split (None: legacy)
    dtype: str = "auto"  # the sampling engines' dtype (collection, evaluation): auto = bf16 on GPUs, else fp32
    # forked processes that generate on the CPU, where the tiny model's decoding keeps one core busy:
    # evaluation and validation roll agents out in them (colbench.evaluate --workers), collection and
    # stage 2's candidates decode their batches in them (EngineOptions.workers); the same samples as one
    workers: int = WORKERS

    @classmethod
    def for_bed(cls, name: str, **sizes: Any) -> "TestbedSetup":
        """The setup of a test-bed preset: its train, validation and test tasks and its turn
        limit. A non-legacy bed is evaluated at temperature 1.0, the policy itself, so
        that its success is the quantity the exact solver predicts (testbed.predict),
        with 2 episodes on each of its many test tasks: most of the variance is between
        draws of c (measured on 64 tasks x 8: between-task variance 0.145, within 0.10),
        so 256 tasks x 2 halve the interval of 64 x 8 at the same cost."""
        s = testbed_bed.design(name)
        if s.legacy:
            return cls(**{"train_tasks": "builtin:legacy/train", "test_tasks": "builtin:legacy/test", "val_tasks": None,
                          "max_turns": s.turns, "eval_temperature": 0.7, "eval_seeds": 8, "bed": s.name, **sizes})
        return cls(**{"train_tasks": f"builtin:{s.name}/train", "test_tasks": f"builtin:{s.name}/test",
                      "val_tasks": f"builtin:{s.name}/val", "max_turns": s.turns, "eval_temperature": 1.0,
                      "eval_seeds": 2,
                      "bed": s.name, **sizes})

    @property
    def n_train(self) -> int:
        """Train tasks episodes are collected on (the interactive budget is n_train x K)."""
        n = testbed_bed.design(self.bed).n_train if self.env == "testbed" else 56
        return min(n, self.train_limit) if self.train_limit else n


def warm_start(out: Path, seed: int = 0, smoke: bool = False, bed: str = DEFAULT_BED,
               teacher: str | None = None) -> Path:
    """The shared warm start (testbed/warm_start.py) on the train tasks of test-bed
    preset `bed`, in two phases on the scripted explorer's dialogues (testbed/human.py),
    the explorer being `teacher` (testbed_bed.TEACHERS; None: "reads" on a non-legacy bed, the
    explorer that reads its dialogue, "blind" on the legacy bed; the solver's π0 is
    `testbed_bed.teacher_design(bed, teacher)`):

    1. copy:   an explorer that asks on every turn before the last (p_ask 1.0), so most
               answers use a constant the human stated: the tiny model learns to
               copy it (measured on the legacy bed: one mixed phase at p_ask 0.6 left
               the warm start copying almost never, success 1.7% even after asking both
               questions);
    2. behave: from phase 1's model, the explorer at the bed's p_ask (legacy 0.6,
               default 0.75), which sets the per-turn question/answer choices that RL
               then has to improve (`behave_size` dialogues and epochs per pass).
    Each phase is checked on held-out dialogues and trained on until it answers as the
    explorer would (`checked_phase`); a teacher that reads its dialogue must also be read
    back from the behave phase's own dialogues on the validation tasks (`reads_gate`). The
    behaviour phase's last pass is the policy every algorithm starts from (OUT/behave/final,
    or OUT/behave-2/final, ...)."""
    from testbed.warm_start import WarmStartConfig
    from testbed.warm_start import main as run

    if smoke:  # toy sizes: one short phase
        return run(WarmStartConfig(output_dir=str(out / "behave"), seed=seed, n_dialogues=160, epochs=1, bed=bed,
                                   teacher=teacher))
    copy = checked_phase(out, "copy", "tiny", COPY_PASS, seed=seed, learning_rates=(2e-3, 1e-3), p_ask=1.0,
                         n_dialogues=1600, bed=bed, teacher=teacher)
    n_dialogues, epochs = behave_size(bed, teacher)
    reads = testbed_bed.teacher_design(bed, teacher).p_other > 0 and not testbed_bed.design(bed).legacy
    return checked_phase(out, "behave", str(copy), BEHAVE_PASS, seed=seed + 1, learning_rates=(1e-3,),
                         epochs=epochs, retry_epochs=1, reads=reads, p_ask=testbed_bed.design(bed).p_ask,
                         n_dialogues=n_dialogues, bed=bed, teacher=teacher)


def behave_size(bed: str, teacher: str | None) -> tuple[int, int]:
    """The behave phase's (dialogues, epochs): 600 x 1 for the blind teacher (bit for bit as
    before), 1,800 x 3 for a teacher that reads its dialogue: the smallest size tried at which
    the warm start learnt the teacher's reading on the validation tasks
    (testbed/results/2026-12-04-reading-teacher-main-job.md)."""
    return (600, 1) if testbed_bed.teacher_design(bed, teacher).p_other == 0.0 else (1800, 3)


# The phases' bars: the held-out share of told constants written right when answering on
# the last turn after three questions (testbed.warm_start.copy_accuracy). Phase 1 only has
# to have learnt to copy; the warm start itself must also answer there, and copy nearly
# always. Builds of the same code differ by float noise alone: on the turns-left test bed
# of 142564f, one build's unchecked behaviour phase copied at 0.82 (SWEET-RL then fell
# from 0.039 to 0.008 success) and another's asked instead of answering on its last turn
# (0.00: caught by this check, its second pass 1.00; README, "The CPU test bed").
COPY_PASS = 0.9
BEHAVE_PASS = 0.97
PHASE_ROUNDS = 4  # at most this many passes of one phase (fresh dialogues each) before giving up


def reads_gate(model: str, out: Path, bed: str, teacher: str | None) -> dict:
    """Does a warm start read its dialogue as its teacher does? Its dialogues on the bed's
    validation tasks (2 episodes each, the evaluation temperature, round 0; never the test
    tasks) against the teacher's exact profile (testbed.profile.reads_check): over the cells
    where the teacher and the blind explorer differ, it passes when no 95% interval holds
    the blind explorer's value and at most one misses the teacher's (a perfect imitator
    misses two or more of five about 2% of the time). The reading emerges abruptly with
    the behave phase's steps, at a number that varies with the seed
    (testbed/results/2026-12-05-main-job-seeds.md). Episodes in `out`."""
    from colbench.episodes import read_episodes
    from testbed import profile as testbed_profile

    setup = TestbedSetup.for_bed(bed)
    val = replace(setup, test_tasks=setup.val_tasks)
    evaluate({"warm_start": model}, val, out)
    check = testbed_profile.reads_check(bed, teacher, read_episodes(out / "episodes" / "warm_start.jsonl"))
    cells, teacher_within, blind_within = check.telling()
    return {"cells": cells, "teacher_within": teacher_within, "blind_within": blind_within,
            "passed": blind_within == 0 and teacher_within >= cells - 1}


def checked_phase(out: Path, phase: str, model: str, bar: float, seed: int, learning_rates: Sequence[float],
                  epochs: int = 1, retry_epochs: int | None = None, reads: bool = False, **explorer) -> Path:
    """One warm-start phase, checked: imitate the explorer (`explorer`: WarmStartConfig
    fields such as p_ask, n_dialogues; `epochs` on the first pass, `retry_epochs` (default
    `epochs`) on later ones), measure held-out copy accuracy
    (testbed.warm_start.copy_accuracy: greedy answers after the always-asking explorer's
    questions on the validation tasks, the legacy bed's test tasks) and, below `bar`, train
    another pass from the last one on fresh dialogues (pass k at learning_rates[k], the
    last rate repeating): copying emerges abruptly,
    after a number of steps that varies with the seed, the prompt's wording and, on the
    tiny model, float noise (two runs of the same 10 steps differ by 1e-7 in the weights;
    after one 400-step copy pass, two builds scored 0.92 and 0.76). Each pass is its
    own folder (copy, copy-2, ...) with its accuracy in OUT/<phase>_check.json, so a
    rerun resumes. Raises if no pass of PHASE_ROUNDS copies: every algorithm would start
    from a policy that cannot use what the human said. With `reads`, a pass that copies
    must also pass `reads_gate` (its record beside the accuracy); when none of
    PHASE_ROUNDS does, the last pass that copies is kept and a warning says it does not
    read."""
    from testbed.warm_start import WarmStartConfig, copy_accuracy
    from testbed.warm_start import main as run

    record = out / f"{phase}_check.json"
    checks = json.loads(record.read_text()) if record.exists() else []
    bed = explorer.get("bed", DEFAULT_BED)
    copies = None  # the last pass that copies
    for k in range(PHASE_ROUNDS):
        folder = out / (phase if k == 0 else f"{phase}-{k + 1}")
        model = str(run(WarmStartConfig(output_dir=str(folder), model=model, seed=seed + 100 * k,
                                        epochs=epochs if k == 0 or retry_epochs is None else retry_epochs,
                                        batch_size=16, learning_rate=learning_rates[min(k, len(learning_rates) - 1)],
                                        **explorer)))
        if k >= len(checks):
            checks.append({"model": model, "copy_accuracy": copy_accuracy(model, seed=seed, workers=WORKERS, bed=bed)})
            atomic_write(record, json.dumps(checks, indent=2))
        print(f"warm start: {phase} pass {k + 1}: held-out copy accuracy {checks[k]['copy_accuracy']:.2f} "
              f"(bar {bar})", flush=True)
        if checks[k]["copy_accuracy"] < bar:
            continue
        copies = model
        if not reads:
            return Path(model)
        if "reads" not in checks[k]:
            checks[k]["reads"] = reads_gate(model, out / f"{folder.name}-reads", bed, explorer.get("teacher"))
            atomic_write(record, json.dumps(checks, indent=2))
        r = checks[k]["reads"]
        print(f"warm start: {phase} pass {k + 1}: reads its dialogue on the validation tasks: "
              f"{'yes' if r['passed'] else 'no'} ({r['teacher_within']} of {r['cells']} telling intervals hold the "
              f"teacher's value, {r['blind_within']} the blind explorer's)", flush=True)
        if r["passed"]:
            return Path(model)
    if copies is not None:
        print(f"warning: warm start: no {phase} pass of {PHASE_ROUNDS} reads its dialogue as its teacher does "
              f"({record}); the last one that copies is kept", flush=True)
        return Path(copies)
    raise RuntimeError(f"warm start: the {phase} phase did not reach {bar} held-out copy accuracy in "
                       f"{PHASE_ROUNDS} passes ({record}); the policy cannot use what the human said")


def compare(rows: list[dict], base: str, new: str) -> str:
    """One line: `new`'s success rate as a multiple of `base`'s, and whether their
    95% intervals are disjoint."""
    m = {r["agent"]: r["metrics"]["success_rate"] for r in rows}
    b, n = m[base], m[new]
    ratio = n["value"] / b["value"] if b["value"] > 0 else float("inf") if n["value"] > 0 else 1.0
    disjoint = n["ci95"][0] > b["ci95"][1] or n["ci95"][1] < b["ci95"][0]
    return (f"{new} success / {base} success = {ratio:.2f}x; 95% intervals "
            f"{'disjoint' if disjoint else 'overlap'}")


def timed(setup: TestbedSetup, name: str):
    """Context manager adding the step's wall time to setup.timings[name]; after the step it
    gives back the memory the step freed (engines.memory.release_memory: the steps share one
    process) and records the resident set left (GB; Linux only) in setup.memory_gb[name]."""

    class _T:
        def __enter__(self):
            self.t = time.perf_counter()

        def __exit__(self, *exc):
            setup.timings[name] = setup.timings.get(name, 0.0) + time.perf_counter() - self.t
            release_memory()
            resident = resident_bytes()
            if resident is not None:
                setup.memory_gb[name] = resident / 1e9

    return _T()


def collect_episodes(model: str, setup: TestbedSetup, out_path: Path, seed: int = 0) -> Path:
    """K sampled episodes per train task with the model (resumable JSONL)."""
    tasks = usable_tasks(load_tasks(setup.train_tasks, env=setup.env, limit=setup.train_limit),
                         source=setup.train_tasks)
    policy_episodes(f"hf:{model}", tasks, env=setup.env, simulator=setup.simulator,
                    sampling=SamplingParams(temperature=setup.temperature, max_new_tokens=setup.max_new_tokens),
                    seeds=episode_seeds(seed, setup.episodes_per_task), max_turns=setup.max_turns, out_path=out_path,
                    engine_options=EngineOptions(dtype=setup.dtype, workers=setup.workers))
    sort_episodes(out_path)
    return out_path


def sort_episodes(path: Path) -> None:
    """Rewrite an episodes file in (task, seed) order. The batched runner writes episodes
    as they finish, so short dialogues come first; anything that reads "the first N
    episodes" (SWEET-RL stage 2's --max_episodes) would otherwise see only episodes that
    answered at once (measured: all 112 stage-2 states were first turns)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: (r["task_id"], r["seed"]))
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))


def train_critic(episodes: Path, base_model: str, setup: TestbedSetup, out: Path, seed: int = 0,
                 extra: dict[str, Any] | None = None) -> Path:
    """SWEET-RL stage 1 on `episodes`; `extra` overrides critic settings (the ablations)."""
    if finished(out) is None:
        configs = make_configs(critic_train.CONFIGS, {
            "episodes": str(episodes), "tasks": setup.train_tasks, "env": setup.env, "model": base_model,
            "output_dir": str(out), "num_epochs": 4, "learning_rate": 1e-3, "batch_size": 8,
            "micro_batch_size": 4, "success_threshold": 0.5, "report_to": "none", "seed": seed,
            # the held-out 10% of tasks the recorded benchmark numbers were measured with (the
            # paper, and the default since, train on all pairs)
            "eval_fraction": 0.1, "max_length": 512, "keep_head": 64, **(extra or {})})
        critic_train.main(*configs)
    return out


def count_samples(algorithm: str, episodes: Path, out: Path, critic: Path | None = None) -> dict[str, int]:
    """What a trained policy consumed, counted from the files: episodes it learned
    from (offline: the collected file; LOOP: the episodes it generated) and the actions
    sampled from the policy without the human: SWEET-RL's stage-2 candidates, plus a
    centred critic's baseline samples (`critic`/baseline_samples.jsonl)."""
    def lines(path: Path) -> int:
        return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0

    if algorithm == "loop":
        return {"episodes": sum(lines(p) for p in sorted((out / "episodes").glob("*.jsonl"))), "candidates": 0}
    candidates = 0
    if algorithm == "sweet":
        candidates = sum(len(row.candidates) for row in read_candidates(out / "candidates.jsonl").values())
        if critic is not None and (critic / BASELINE_SAMPLES).exists():
            candidates += sum(len(r.actions) for r in read_rows(critic / BASELINE_SAMPLES, BaselineRow.from_json))
    return {"episodes": lines(episodes), "candidates": candidates}


def train_policy(algorithm: str, episodes: Path, base_model: str, setup: TestbedSetup, out: Path,
                 critic: Path | None = None, seed: int = 0, extra: dict[str, Any] | None = None,
                 lr_scale: float = 1.0) -> Path:
    """One of sweet / rft / mtdpo (offline, from `episodes`) or loop (online). `lr_scale`
    multiplies the algorithm's learning rate below (testbed/learning.py's one search rule).

    The DPO runs use a larger NLL weight than the paper (0.1 vs 0.01) and a small
    learning rate: on the 2M-parameter model, the paper's NLL weight let DPO push the
    chosen actions' log-probs down until the policy produced garbage (measured: test-bed
    success 4.7% -> 0%, chosen log-prob per token -0.95 -> -3.6 over 70 steps)."""
    if finished(out) is not None:
        return out / "final"
    common = {"model": base_model, "output_dir": str(out), "report_to": "none", "seed": seed,
              "max_length": 512, "keep_head": 64}
    if algorithm == "rft":
        args = {"episodes": str(episodes), "success_threshold": 1.0, "learning_rate": 3e-4,
                "num_epochs": 2, "batch_size": 16, "micro_batch_size": 16}
    elif algorithm == "mtdpo":
        args = {"episodes": str(episodes), "learning_rate": 3e-5, "beta": 0.1, "nll_coef": 0.1,
                "num_epochs": 2, "batch_size": 8, "micro_batch_size": 8, "success_threshold": 1.0}
    elif algorithm == "sweet":
        args = {"episodes": str(episodes), "tasks": setup.train_tasks, "env": setup.env, "critic": str(critic),
                "candidates_per_state": setup.candidates, "max_new_tokens": setup.max_new_tokens,
                "learning_rate": 3e-5, "beta": 0.1, "nll_coef": 0.1, "num_epochs": 1,
                "batch_size": 16, "micro_batch_size": 16, "pairs_per_state": 4,
                "max_episodes": setup.stage2_episodes, "episode_fraction": 1.0, "sampler_workers": setup.workers}
    elif algorithm == "loop":
        n_tasks = 8
        budget = setup.n_train * setup.episodes_per_task  # as many episodes as the offline algorithms
        args = {"env": setup.env, "simulator": setup.simulator, "tasks": setup.train_tasks,
                "iterations": max(1, budget // (n_tasks * 6)), "tasks_per_iteration": n_tasks,
                "episodes_per_task": 6, "max_turns": setup.max_turns, "max_new_tokens": setup.max_new_tokens,
                "learning_rate": 1e-4, "micro_batch_size": 16}
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    args["learning_rate"] *= lr_scale
    module = load_algorithm(algorithm)
    module.main(*make_configs(module.CONFIGS, {**common, **args, **(extra or {})}))
    return out / "final"


def select_on_validation(run: Path, setup: TestbedSetup, out: Path) -> tuple[Path, dict]:
    """The point of a training path to report: of the run's snapshots (run/path/step-N, the
    last one the final policy) the one with the highest success on the setup's validation
    tasks (one episode each; ties go to the earlier step), never the test tasks. Early
    stopping by a validation set, the one rule for every seed: per-turn DPO on the tiny model
    can fall off a cliff within one epoch (measured on the default bed at the same settings:
    seed 0's policy at 0.26 nats gained +0.08 validation success, seed 1's lost every answer
    to a broken `return` line). Without validation tasks (the legacy bed) or snapshots: the
    final model. Returns (model, record); the record is kept in out/selected.json."""
    from sweet.core.trainer import SNAPSHOT_DIR

    record_path = out / "selected.json"
    if record_path.exists():
        record = json.loads(record_path.read_text())
        return Path(record["model"]), record
    snaps = sorted(((int(p.name.split("-")[1]), p) for p in (run / SNAPSHOT_DIR).glob("step-*")
                    if p.is_dir() and not p.name.endswith(".tmp")), key=lambda sp: sp[0])
    if not setup.val_tasks or not snaps:
        return run / "final", {"model": str(run / "final"), "rule": "final model (no validation tasks)"}
    val = replace(setup, test_tasks=setup.val_tasks, eval_seeds=1, test_limit=setup.val_limit)
    rows = evaluate({f"step-{step}": str(path) for step, path in snaps}, val, out / "validation")
    success = {r["agent"]: r["metrics"]["success_rate"]["value"] for r in rows}
    best_step, best = max(snaps, key=lambda sp: (success[f"step-{sp[0]}"], -sp[0]))
    record = {"model": str(best), "step": best_step, "rule": "highest validation success, ties to the earlier step",
              "validation_tasks": setup.val_tasks, "validation_limit": setup.val_limit, "validation_success": success}
    atomic_write(record_path, json.dumps(record, indent=2))
    return best, record


def evaluate(agents: dict[str, str], setup: TestbedSetup, out: Path, seed_round: int = 0) -> list[dict]:
    """Leaderboard rows of `name=hf:<path>` agents on the held-out test tasks, sampled
    with the episode seeds of `seed_round` (colbench.rollout.episode_seeds)."""
    ev.evaluate(ev.EvalConfig(
        output=str(out), env=setup.env, simulator=setup.simulator, tasks=setup.test_tasks,
        agent=[f"{name}=hf:{model}" for name, model in agents.items()], limit=setup.test_limit or None,
        episodes_per_task=setup.eval_seeds, seed_round=seed_round, temperature=setup.eval_temperature,
        max_turns=setup.max_turns, max_new_tokens=setup.max_new_tokens, dtype=setup.dtype, progress=False,
        workers=setup.workers))
    return json.loads((out / "leaderboard.json").read_text())
