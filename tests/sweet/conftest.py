"""Synthetic critic data built with the tiny model's tokenizer.

Each task hides a secret word w (its training-time information c = "def f(): return
'<w>'"). Every episode asks one question and then answers; the successful episode
names w, the failed one names the other word. With `secrets=("apple",)` (default)
every task's secret is "apple": a pattern a ~2M-parameter model learns in a few
steps. With `secrets=("apple", "river")` only a critic that reads c can tell chosen
from rejected (copying from c: too slow to learn for a unit test, used where values,
not learning, are checked).
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from colbench.types import Episode, Score, Task, Turn

WORDS = ("apple", "river")
SYSTEM = "Ask the human about f, then write I WANT TO ANSWER: and the code."
DESCRIPTION = "I need a function f that returns a word."


def _agent_turn(tokenizer, prompt: list[dict], text: str) -> Turn:
    from sweet.core.tokens import template_ids

    return Turn(role="agent", content=text, prompt=[dict(m) for m in prompt],
                prompt_token_ids=template_ids(tokenizer, prompt),
                token_ids=tokenizer(text, add_special_tokens=False)["input_ids"])


def make_episode(tokenizer, task: Task, word: str, seed: int, reward: float) -> Episode:
    """Two agent turns: a question naming `word`, then an answer returning it."""
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.description}]
    turns = []
    question = f"Is the word {word}?"
    turns.append(_agent_turn(tokenizer, prompt, question))
    reply = "I don't know."
    turns.append(Turn(role="human", content=reply))
    prompt = prompt + [{"role": "assistant", "content": question}, {"role": "user", "content": reply}]
    turns.append(_agent_turn(tokenizer, prompt, f"I WANT TO ANSWER:\ndef f():\n    return '{word}'"))
    return Episode(task_id=task.task_id, env="backend", agent="synthetic", seed=seed, turns=turns,
                   answer=f"def f():\n    return '{word}'", score=Score(reward=reward, success=reward >= 1.0),
                   stop_reason="answered")


def make_synthetic(tokenizer, n_tasks: int, seed: int = 0, secrets: tuple[str, ...] = ("apple",)
                   ) -> tuple[list[Task], list[Episode]]:
    """n_tasks tasks, each with one success (names the secret) and one failure."""
    rng = random.Random(seed)
    tasks, episodes = [], []
    for k in range(n_tasks):
        secret = secrets[k % len(secrets)]
        other = next(w for w in WORDS if w != secret)
        task = Task(task_id=f"syn-{k:03d}", env="backend", description=DESCRIPTION,
                    hidden=f"def f():\n    return '{secret}'")
        tasks.append(task)
        eps = [make_episode(tokenizer, task, secret, 0, 1.0), make_episode(tokenizer, task, other, 1, 0.0)]
        rng.shuffle(eps)
        episodes.extend(eps)
    return tasks, episodes


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


@pytest.fixture(name="make_synthetic")
def make_synthetic_fixture():
    """The builder itself, for tests that need variations."""
    return make_synthetic


@pytest.fixture(scope="session")
def synthetic_files(tmp_path_factory, tiny_tokenizer):
    """(episodes.jsonl, tasks.jsonl) for 40 tasks (80 episodes, 40 pairs)."""
    d = tmp_path_factory.mktemp("critic_data")
    tasks, episodes = make_synthetic(tiny_tokenizer, 40)
    return write_jsonl(d / "episodes.jsonl", episodes), write_jsonl(d / "tasks.jsonl", tasks)


@pytest.fixture
def fresh_accelerate():
    """Accelerate keeps process-wide singletons; reset them around in-process runs."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def checkpoint_layout(checkpoint: Path) -> tuple[int, bool]:
    """(processes, sharded) of a checkpoint-<step>/ folder: every process saves its RNGs
    (random_states_<rank>.pkl); sharded when each process also wrote its own part of the
    model or optimiser: under FSDP with SHARDED_STATE_DICT a model shard
    (pytorch_model_fsdp_0/__<rank>_0.distcp), under DeepSpeed ZeRO its optimiser partition
    (pytorch_model/[bf16_]zero_pp_rank_<rank>_mp_rank_00_optim_states.pt: accelerate's
    save_state calls engine.save_checkpoint(checkpoint, "pytorch_model")). DDP (and FSDP's
    FULL_STATE_DICT) write one model file from the main process.
    Shows that the processes formed one group and that FSDP/ZeRO really sharded."""
    import re

    ranks = len(list(checkpoint.glob("random_states_*.pkl")))
    expected = set(range(ranks))
    fsdp = {p.name for p in (checkpoint / "pytorch_model_fsdp_0").glob("*.distcp")}
    zero = {int(m.group(1)) for p in (checkpoint / "pytorch_model").glob("*_optim_states.pt")
            if (m := re.fullmatch(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt", p.name))}
    return ranks, ranks > 1 and (fsdp == {f"__{r}_0.distcp" for r in expected} or zero == expected)


@pytest.fixture(name="checkpoint_layout")
def checkpoint_layout_fixture():
    return checkpoint_layout


def kill_tree(proc) -> None:
    """SIGKILL a launcher (a subprocess.Popen) and every process it started: torchrun starts
    each worker in its own session, so killing the launcher's process group leaves them running."""
    import psutil  # a dependency of accelerate

    parent = psutil.Process(proc.pid)
    for p in [*parent.children(recursive=True), parent]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


@pytest.fixture(name="kill_tree")
def kill_tree_fixture():
    return kill_tree


# ---- the 2-process tests' launch configs ----------------------------------------------------

CONFIGS = Path(__file__).resolve().parents[2] / "sweet" / "configs"
CPU_DIST_CONFIGS = ("ddp_cpu_2proc.yaml", "fsdp_cpu_2proc.yaml", "deepspeed_zero2_cpu_2proc.yaml",
                    "deepspeed_zero3_cpu_2proc.yaml")


def dist_config_names() -> list[str]:
    """The launch configs (names in sweet/configs) the 2-process tests run under: the CPU
    ones (DDP, FSDP2, DeepSpeed ZeRO-2 and ZeRO-3), plus those listed in $SWEET_DIST_CONFIGS (comma-separated, e.g.
    "multi_gpu.yaml,fsdp.yaml,deepspeed_zero2.yaml,deepspeed_zero3.yaml": scripts/gpu_check.sh
    sets it on a machine with GPUs)."""
    extra = [c.strip() for c in os.environ.get("SWEET_DIST_CONFIGS", "").split(",") if c.strip()]
    return [*CPU_DIST_CONFIGS, *dict.fromkeys(c for c in extra if c not in CPU_DIST_CONFIGS)]


@dataclass(frozen=True)
class DistConfig:
    """One launch config as a 2-process test uses it."""

    name: str
    kind: str  # the distributed type the trainer reports: MULTI_CPU, MULTI_GPU, FSDP or DEEPSPEED
    sharded: bool  # each process saves its own part of the model/optimiser (checkpoint_layout)
    port_offset: int  # added to the test's port: every config gets ports of its own

    def launch(self, port: int) -> list[str]:
        """`accelerate launch` up to the script: 2 processes whatever the config's count,
        full precision (the weights are compared with a float32 run on one process: bf16
        autocast alone would differ by more than the tolerances) and a port of its own."""
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / self.name),
                "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(port + self.port_offset)]


def dist_config(name: str) -> DistConfig:
    """The config `name`, or pytest.skip when this machine cannot run it: a GPU config needs
    2 visible CUDA devices, a DeepSpeed one an importable deepspeed."""
    import importlib.util

    import yaml  # a dependency of accelerate

    cfg = yaml.safe_load((CONFIGS / name).read_text())
    kind = cfg["distributed_type"]
    if cfg.get("use_cpu"):
        # the CPU configs launch through torchrun (ddp_cpu_2proc.yaml explains why): DDP then
        # runs as MULTI_CPU; FSDP and DeepSpeed stay what they are (sweet.core.trainer.make_accelerator)
        kind = kind if kind in ("FSDP", "DEEPSPEED") else "MULTI_CPU"
    else:
        import torch

        if torch.cuda.device_count() < 2:
            pytest.skip(f"{name} needs 2 CUDA devices, {torch.cuda.device_count()} visible")
    if kind == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"{name} needs deepspeed (not importable: pip install -e '.[deepspeed]')")
    fsdp_sharded = cfg.get("fsdp_config", {}).get("fsdp_state_dict_type") == "SHARDED_STATE_DICT"
    sharded = kind == "DEEPSPEED" or (kind == "FSDP" and fsdp_sharded)
    return DistConfig(name, kind, sharded, port_offset=100 * dist_config_names().index(name))


def pytest_generate_tests(metafunc):
    """A test that asks for `dist` runs once per launch config of dist_config_names()."""
    if "dist" in metafunc.fixturenames:
        metafunc.parametrize("dist", dist_config_names(), indirect=True)


@pytest.fixture
def dist(request) -> DistConfig:
    return dist_config(request.param)


@pytest.fixture(scope="session")
def frontend_files(tmp_path_factory, tiny_tokenizer):
    """(episodes.jsonl, tasks.jsonl) for 8 frontend tasks (16 episodes, 8 pairs): frontend_fixtures.py."""
    from frontend_fixtures import make_frontend_synthetic

    d = tmp_path_factory.mktemp("frontend_critic_data")
    tasks, episodes = make_frontend_synthetic(tiny_tokenizer, 8)
    return write_jsonl(d / "episodes.jsonl", episodes), write_jsonl(d / "tasks.jsonl", tasks)
