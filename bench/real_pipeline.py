"""SWEET-RL and its baselines trained on a real model, end to end on the published backend
tasks, on CPU: SmolLM2-135M-Instruct (`--model smollm2`) with LoRA.

    python bench/real_pipeline.py --smoke                      # every step at toy sizes on --pool ours
    python bench/real_pipeline.py --output_dir runs/real   # the full size, about 2 h (docs/results/)
    python bench/real_pipeline.py --model hf:/path/to/hf-folder --smoke

Data: the published backend test rows (`--data`, default ../shared/data/colbench-test/backend_test.jsonl).
Rows 200-999 are the training pool (the default size collects on its first 48 rows), rows
200-299 of it the validation tasks for choosing settings (OUT/tasks/val.jsonl; no step
selects on them yet), rows 0-199 the held-out tasks every figure is measured on. `--pool ours` runs the
same pipeline on the project's own backend tasks (tasks/backend: train 44, held-out 20), an
easier second pool reported separately.

Steps (each writes its own folder under --output_dir and is skipped when finished, so a
killed run resumes where it stopped; the steps are testbed/pipeline.py's, the calls the
main job makes, with the real model's settings):
  1. collect K episodes per training task with the model as the agent (`--temperature`, 0.7)
     against `--simulator` (default scripted:backend: a smollm2 human echoes the agent and
     leaks code, colbench measurements of issue 47);
  2. the critic: LoRA on the model, c = the reference code (Bradley-Terry on trajectory pairs,
     `eval_fraction` of the paired tasks held out for its agreement);
  3. SWEET-RL stage 2: 16 candidates per state of the first `stage2_episodes` episodes,
     ranked by the critic, per-turn DPO with LoRA;
  4. RFT and multi-turn DPO from the same episodes (LoRA);
  5. evaluate zero-shot, SWEET-RL, RFT and MT-DPO on the held-out tasks (greedy, one
     episode per task: the same tasks and the same human for every agent), with each
     method's paired difference against zero-shot (95% bootstrap over tasks);
  6. the per-turn credit inspector (sweet.critic.inspect) on the training dialogues.

Reward: `--reward tests` (default) forms pairs from the fraction of tests passed (the
paper's other metric: a task pairs when its best episode passes at least
`--min_tests` of them); `--reward success` only from all tests passing (the paper's rule).
Every figure printed names the metric it is.

Writes OUT/summary.json (pairs, states, critic agreement, per-method figures, dialogue
changes, timings, load average) and OUT/leaderboard/.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from colbench.episodes import load_episodes  # noqa: E402
from colbench.protocols import ANSWER_MARKER  # noqa: E402
from colbench.stats import behaviour_stats, bootstrap_ci, by_task  # noqa: E402
from sweet.core.config import parse_configs  # noqa: E402
from sweet.core.records import make_trajectory_pairs  # noqa: E402
from sweet.core.runs import run_cli, trainer_run  # noqa: E402
from testbed.pipeline import TestbedSetup, collect_episodes, evaluate, timed, train_critic, train_policy  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO.parent / "shared" / "data" / "colbench-test" / "backend_test.jsonl"
METHODS = ("sweet_rl", "rft", "mtdpo")
CRITIC_HELD_OUT = 0.25  # the fraction of paired training tasks the critic never trains on (its agreement)


@dataclass
class RealConfig:
    output_dir: str = field(default="runs/real_pipeline", metadata={"help": "everything goes here (resumable)"})
    model: str = field(default="smollm2", metadata={"help": "the policy, critic and zero-shot model (a model spec)"})
    simulator: str = field(default="scripted:backend", metadata={"help": "the simulated human"})
    pool: str = field(default="published", metadata={"help": "published (rows of --data) or ours (tasks/backend)"})
    data: str = field(default=str(PUBLISHED), metadata={"help": "the published backend rows (JSONL)"})
    train_rows: str = field(default="200:1000", metadata={"help": "the training pool's rows of --data"})
    val_rows: str = field(default="200:300", metadata={"help": "validation rows (settings are chosen on them)"})
    heldout_rows: str = field(default="0:200", metadata={"help": "held-out rows (every figure)"})
    train_limit: int | None = field(default=48, metadata={"help": "collect on the first N training tasks (0: all)"})
    heldout_limit: int | None = field(default=40, metadata={"help": "evaluate on the first N held-out tasks (0: all)"})
    episodes_per_task: int = field(default=4, metadata={"help": "K: episodes per training task (at --temperature)"})
    max_turns: int = field(default=3, metadata={"help": "agent turns per episode"})
    max_new_tokens: int = field(default=192, metadata={"help": "agent tokens per turn"})
    temperature: float = field(default=0.7, metadata={"help": "collection's sampling temperature (the paper's 1.0 "
                                                             "makes SmolLM2 write no parsable code)"})
    max_length: int = field(default=2048, metadata={"help": "training context + action tokens (cut in the middle)"})
    candidates: int = field(default=16, metadata={"help": "stage 2: candidates per state (paper: 16)"})
    stage2_episodes: int = field(default=4, metadata={"help": "stage 2: states of the first N episodes"})
    inspect_episodes: int = field(default=20, metadata={"help": "episodes on the credit inspector's page"})
    reward: str = field(default="tests", metadata={"help": "tests (pairs from tests passed) or success"})
    min_tests: float = field(default=0.1, metadata={"help": "--reward tests: a task pairs when its best episode "
                                                            "passes at least this fraction of its tests"})
    critic_epochs: int = field(default=2, metadata={"help": "critic passes over its pairs"})
    critic_lr: float = field(default=1e-3, metadata={"help": "critic LoRA learning rate (chosen on the validation rows: "
                                                          "docs/results/2026-12-05-real-pipeline-full.md)"})
    policy_lr: float = field(default=1e-4, metadata={"help": "stage 2 / RFT / MT-DPO LoRA learning rate"})
    policy_epochs: int = field(default=1, metadata={"help": "passes of each policy trainer"})
    dtype: str = field(default="bfloat16", metadata={"help": "every model's dtype (bf16: a LoRA step is 1.7x "
                                                             "cheaper than float32 on this CPU)"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    smoke: bool = field(default=False, metadata={"help": "toy sizes: every step in <= 10 minutes on an idle machine"})

    def __post_init__(self) -> None:
        self.train_limit, self.heldout_limit = self.train_limit or None, self.heldout_limit or None
        if self.pool not in ("published", "ours"):
            raise ValueError(f"RealConfig.pool must be published or ours, got {self.pool!r}")
        if self.reward not in ("tests", "success"):
            raise ValueError(f"RealConfig.reward must be tests or success, got {self.reward!r}")
        for name in ("train_rows", "val_rows", "heldout_rows"):
            rows(getattr(self, name), f"RealConfig.{name}")
        if self.smoke:  # toy sizes on the easier pool, where toy sizes still form pairs
            self.pool = "ours"
            self.train_limit, self.heldout_limit = 4, 4
            self.episodes_per_task, self.max_turns, self.max_new_tokens = 4, 2, 128
            self.stage2_episodes, self.critic_epochs, self.max_length, self.inspect_episodes = 1, 1, 1536, 8


def rows(spec: str, where: str) -> tuple[int, int]:
    """'A:B' -> (A, B), 0 <= A < B."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", spec)
    if not m or int(m[1]) >= int(m[2]):
        raise ValueError(f"{where} must be 'A:B' with 0 <= A < B, got {spec!r}")
    return int(m[1]), int(m[2])


def task_files(cfg: RealConfig, out: Path) -> dict[str, str]:
    """The train / val / held-out task files: slices of --data written once into OUT/tasks
    (published pool), or tasks/backend (ours; its val = the first 10 training tasks)."""
    if cfg.pool == "ours":
        return {"train": str(REPO / "tasks/backend/train.jsonl"), "val": str(REPO / "tasks/backend/train.jsonl"),
                "heldout": str(REPO / "tasks/backend/test.jsonl")}
    source = Path(cfg.data)
    if not source.is_file():
        raise ValueError(f"--data {source}: no such file (the published backend test rows)")
    lines = source.read_text().splitlines()
    files = {}
    for name in ("train", "val", "heldout"):
        a, b = rows(getattr(cfg, f"{name}_rows"), f"--{name}_rows")
        path = out / "tasks" / f"{name}.jsonl"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(line + "\n" for line in lines[a:b]))
        files[name] = str(path)
    return files


def setup_of(cfg: RealConfig, tasks: dict[str, str]) -> TestbedSetup:
    return TestbedSetup(env="backend", simulator=cfg.simulator, train_tasks=tasks["train"], test_tasks=tasks["heldout"],
                        val_tasks=tasks["val"], episodes_per_task=cfg.episodes_per_task, max_turns=cfg.max_turns,
                        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, eval_seeds=1,
                        eval_temperature=0.0,
                        candidates=cfg.candidates, stage2_episodes=cfg.stage2_episodes, train_limit=cfg.train_limit,
                        test_limit=cfg.heldout_limit, dtype=cfg.dtype)


def threshold(cfg: RealConfig) -> float:
    return cfg.min_tests if cfg.reward == "tests" else 1.0


def common(cfg: RealConfig) -> dict:
    """The real model's trainer settings: LoRA on every linear layer, the dtype, the
    context length (the test bed's 512 cuts a real dialogue's code)."""
    return {"lora": True, "dtype": cfg.dtype, "max_length": cfg.max_length, "keep_head": 1024, "report_to": "none"}


def answer_format(episodes) -> dict:
    """How the final answers look: the marker used, a ```python fence, parses as Python."""
    n = max(1, len(episodes))

    def parses(code: str) -> bool:
        try:
            ast.parse(code)
            return bool(code.strip())
        except (SyntaxError, ValueError):
            return False

    return {"marker": sum(ANSWER_MARKER in (ep.agent_turns[-1].content if ep.agent_turns else "") for ep in episodes) / n,
            "fenced": sum("```" in (ep.agent_turns[-1].content if ep.agent_turns else "") for ep in episodes) / n,
            "answer_parses": sum(parses(ep.answer) for ep in episodes) / n}


def paired(a: dict[str, list[float]], b: dict[str, list[float]]):
    """Mean of a - b over the tasks both have, with its 95% bootstrap over tasks."""
    shared = [t for t in a if t in b]
    return bootstrap_ci([[sum(a[t]) / len(a[t]) - sum(b[t]) / len(b[t])] for t in shared])


def main(cfg: RealConfig) -> dict:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = task_files(cfg, out)
    setup = setup_of(cfg, tasks)
    thr = threshold(cfg)
    summary: dict = {"config": asdict(cfg), "tasks": tasks, "load_at_start": os.getloadavg()}
    say = lambda s: print(f"\n=== {s} === (load {os.getloadavg()[0]:.1f}; resident after each step, GB: "  # noqa: E731
                          f"{ {k: round(v, 1) for k, v in setup.memory_gb.items()} })", flush=True)

    say("1/6 collect episodes")
    with timed(setup, "collect"):
        episodes = collect_episodes(cfg.model, setup, out / "episodes" / "train.jsonl", seed=cfg.seed)
    eps = load_episodes(episodes, env="backend")
    pairs = make_trajectory_pairs(eps, thr, 0.0)
    summary["collected"] = {"episodes": len(eps), "tasks": len({e.task_id for e in eps}),
                            "tests_passed": sum(e.reward for e in eps) / max(1, len(eps)),
                            "success": sum(e.success for e in eps) / max(1, len(eps)),
                            "pairs": len(pairs), "paired_tasks": len({p.task_id for p in pairs})}
    print(f"collected: {summary['collected']}")
    if not pairs:
        raise SystemExit(f"no trajectory pairs at --reward {cfg.reward} (threshold {thr}): {episodes}; "
                         "more tasks or episodes per task, --reward tests, or --pool ours")

    say("2/6 critic (LoRA, c = the reference)")
    with timed(setup, "critic"):
        critic = train_critic(episodes, cfg.model, setup, out / "critic", seed=cfg.seed, extra={
            **common(cfg), "learning_rate": cfg.critic_lr, "num_epochs": cfg.critic_epochs, "batch_size": 8,
            "micro_batch_size": 1, "success_threshold": thr, "min_reward_gap": 0.0, "eval_fraction": CRITIC_HELD_OUT,
            "eval_batch_size": 4})
    summary["critic"] = json.loads((critic / "final_metrics.json").read_text())

    say(f"3/6 SWEET-RL stage 2 ({cfg.candidates} candidates per state)")
    policies = {}
    dpo = {"learning_rate": cfg.policy_lr, "num_epochs": cfg.policy_epochs, "batch_size": 8, "micro_batch_size": 2,
           "nll_coef": 0.01, "beta": 0.1}
    with timed(setup, "sweet"):
        policies["sweet_rl"] = train_policy("sweet", episodes, cfg.model, setup, out / "sweet", critic=critic,
                                            seed=cfg.seed, extra={**common(cfg), **dpo, "sample_batch_size": 1,
                                                                  "sampler_batch_size": cfg.candidates})
    say("4/6 RFT and multi-turn DPO")
    with timed(setup, "rft"):
        policies["rft"] = train_policy("rft", episodes, cfg.model, setup, out / "rft", seed=cfg.seed, extra={
            **common(cfg), "learning_rate": cfg.policy_lr, "num_epochs": cfg.policy_epochs, "batch_size": 8,
            "micro_batch_size": 2, "success_threshold": thr})
    with timed(setup, "mtdpo"):
        policies["mtdpo"] = train_policy("mtdpo", episodes, cfg.model, setup, out / "mtdpo", seed=cfg.seed, extra={
            **common(cfg), **dpo, "micro_batch_size": 1, "success_threshold": thr, "min_reward_gap": 0.0})
    summary["training_data"] = training_data(out)

    say("5/6 evaluate on the held-out tasks")
    with timed(setup, "evaluate"):
        rows_ = evaluate({"zero_shot": cfg.model, **{m: str(p) for m, p in policies.items()}}, setup, out / "leaderboard")
    summary["heldout"] = heldout_figures(rows_, out / "leaderboard" / "episodes")

    say("6/6 per-turn credit inspector")
    from sweet.critic import inspect as inspect_critic

    with timed(setup, "inspect"):
        page = inspect_critic.main(inspect_critic.InspectConfig(
            critic=str(critic), episodes=str(episodes), output=str(out / "inspect"),
            candidates=str(out / "sweet" / "candidates.jsonl"), tasks=tasks["train"],
            max_episodes=cfg.inspect_episodes))
    credit = out / "inspect" / "credit_split.json"
    summary["critic_credit"] = json.loads(credit.read_text()) if credit.exists() else None
    summary["timings_s"] = setup.timings
    summary["memory_gb"] = setup.memory_gb
    summary["load_at_end"] = os.getloadavg()
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    report(summary, cfg, page)
    return summary


def training_data(out: Path) -> dict:
    """Pairs and states each method trained on, read from its metrics."""
    def first(path: Path) -> dict:
        if not path.exists():
            return {}
        for line in path.read_text().splitlines():
            return json.loads(line)
        return {}

    s, r, m = (first(out / name / "metrics.jsonl") for name in ("sweet", "rft", "mtdpo"))
    return {"sweet_rl": {"states": s.get("sweet/states"), "pairs": s.get("sweet/pairs"),
                         "tied_states": s.get("sweet/tied_states")},
            "rft": {"episodes": r.get("data/kept_episodes"), "turns": r.get("data/turns")},
            "mtdpo": {"pairs": m.get("data/pairs"), "episodes": m.get("data/episodes")}}


def heldout_figures(rows_: list[dict], episodes_dir: Path) -> dict:
    eps = {r["agent"]: load_episodes(episodes_dir / f"{r['agent']}.jsonl", env="backend") for r in rows_}
    tests = {a: by_task(e, lambda ep: ep.reward) for a, e in eps.items()}
    success = {a: by_task(e, lambda ep: float(ep.success)) for a, e in eps.items()}
    figures = {}
    for r in rows_:
        a, m = r["agent"], r["metrics"]
        stats = behaviour_stats(eps[a])
        figures[a] = {"tests_passed": m["tests_passed"], "success_rate": m["success_rate"],
                      "dialogue": {k: stats.get(k) for k in ("mean_turns", "mean_questions", "asked_before_answering",
                                                             "mean_agent_reply_chars")} | answer_format(eps[a])}
        if a != "zero_shot":
            figures[a]["minus_zero_shot"] = {"tests_passed": paired(tests[a], tests["zero_shot"]).to_json(),
                                             "success_rate": paired(success[a], success["zero_shot"]).to_json()}
    return figures


def report(summary: dict, cfg: RealConfig, page) -> None:
    c = summary["collected"]
    print(f"\n=== results: {cfg.model}, human {cfg.simulator}, pool {cfg.pool} ===")
    print(f"training episodes: {c['episodes']} on {c['tasks']} tasks, tests passed {c['tests_passed']:.3f}, "
          f"success {c['success']:.3f}; reward for pairs: {cfg.reward} (threshold {threshold(cfg)})")
    td = summary["training_data"]
    print(f"SWEET-RL: {td['sweet_rl']['states']} states, {td['sweet_rl']['pairs']} pairs; RFT: {td['rft']['episodes']} "
          f"episodes, {td['rft']['turns']} turns; MT-DPO: {td['mtdpo']['pairs']} pairs")
    crit = summary["critic"]
    if "critic/pair_accuracy" in crit:
        print(f"critic agreement on held-out pairs: {crit['critic/pair_accuracy']:.3f} "
              f"(margin {crit.get('critic/margin', float('nan')):+.3f})")
    else:
        print(f"critic agreement on held-out pairs: none measured ({summary['collected']['paired_tasks']} paired "
              f"task(s), {100 * CRITIC_HELD_OUT:.0f}% of them held out)")
    print("held-out (greedy, 1 episode per task): tests passed [95%], success [95%]; minus zero-shot paired [95%]")
    for a, f in summary["heldout"].items():
        t, s = f["tests_passed"], f["success_rate"]
        line = (f"{a:>10}: tests {t['value']:.3f} [{t['ci95'][0]:.3f}, {t['ci95'][1]:.3f}]  "
                f"success {s['value']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]")
        if "minus_zero_shot" in f:
            d = f["minus_zero_shot"]["tests_passed"]
            line += f"  tests - zero_shot {d['value']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        d = f["dialogue"]
        line += (f"  | turns {d['mean_turns']:.2f}, questions {d['mean_questions']:.2f}, marker {d['marker']:.2f}, "
                 f"parses {d['answer_parses']:.2f}")
        print(line)
    print("wall time per step (s): " + ", ".join(f"{k} {v:.0f}" for k, v in summary["timings_s"].items())
          + f"; load average {summary['load_at_start'][0]:.1f} at start, {summary['load_at_end'][0]:.1f} at end")
    print(f"summary: {Path(cfg.output_dir) / 'summary.json'}; per-turn credit inspector: {page}")


def cli(argv: list[str] | None = None):
    (cfg,) = parse_configs([RealConfig], argv, description=__doc__.split("\n\n")[0])
    started = time.time()
    with trainer_run(cfg.output_dir, command="python bench/real_pipeline.py"):
        main(cfg)
    print(f"total {time.time() - started:.0f} s")


if __name__ == "__main__":
    sys.exit(run_cli(cli, prog="python bench/real_pipeline.py"))
