"""Resume that cannot mix runs (sweet/core/fingerprint.py) and failure-safe checkpoints
(sweet/core/trainer.py): the fingerprint's fields, the refusal naming what differs, a
fresh start moving an earlier run aside, damaged checkpoints and caches skipped with a
warning, and (slow) real `python -m sweet.train_policy --algorithm rft` processes
SIGKILLed, rerun with other settings, with damaged checkpoints and with --resume false.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from policy_fixtures import FAST, cached_tiny_episodes, read_metrics

from sweet.core.config import ModelConfig, TrainConfig, save_resolved_config
from sweet.core.fingerprint import FINGERPRINT_FILE, RunMismatch, begin_run, differences, run_fingerprint
from sweet.core.trainer import checkpoint_problem, trim_metrics

REPO = Path(__file__).resolve().parents[2]


def _configs(tmp_path: Path, episodes: Path, **train):
    from sweet.algorithms.rft import RFTConfig

    return {"model": ModelConfig(model="tiny"), "train": TrainConfig(output_dir=str(tmp_path / "run"), **train),
            "rft": RFTConfig(episodes=str(episodes), env="testbed")}


# ---- the fingerprint -----------------------------------------------------------------------


def test_fingerprint_keeps_what_changes_the_result_and_hashes_the_data(tmp_path):
    episodes = tmp_path / "eps.jsonl"
    episodes.write_text('{"a": 1}\n')
    fp = run_fingerprint(_configs(tmp_path, episodes))
    for bookkeeping in ("output_dir", "logging_steps", "report_to", "resume", "micro_batch_size"):
        assert f"train.{bookkeeping}" not in fp
    assert fp["train.learning_rate"] == 1e-5 and fp["train.batch_size"] == 8 and fp["rft.env"] == "testbed"
    assert fp["rft.episodes"]["path"] == str(episodes.resolve()) and len(fp["rft.episodes"]["sha256"]) == 64
    assert "sha256" in fp["model.model"]  # the tiny model's config.json
    # the same content elsewhere is the same data; other content is not
    copy = tmp_path / "copy.jsonl"
    copy.write_text(episodes.read_text())
    assert differences(fp, run_fingerprint(_configs(tmp_path, copy))) == []
    copy.write_text('{"a": 2}\n')
    assert differences(fp, run_fingerprint(_configs(tmp_path, copy, micro_batch_size=1))) == [
        f"rft.episodes: {episodes.resolve()} (sha256 {fp['rft.episodes']['sha256'][:12]}) -> "
        f"{copy.resolve()} (sha256 {run_fingerprint(_configs(tmp_path, copy))['rft.episodes']['sha256'][:12]})"]
    assert differences(fp, run_fingerprint(_configs(tmp_path, episodes, learning_rate=0.01))) == [
        "train.learning_rate: 1e-05 -> 0.01"]


def test_resume_with_other_settings_is_refused_and_a_fresh_start_moves_the_old_run_aside(tmp_path):
    episodes = tmp_path / "eps.jsonl"
    episodes.write_text('{"a": 1}\n')
    out = tmp_path / "run"
    configs = _configs(tmp_path, episodes)
    assert begin_run(out, configs, resume=True) is None and (out / FINGERPRINT_FILE).exists()
    (out / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n')
    (out / "checkpoint-1").mkdir()
    (out / "finished.json").write_text("{}")
    assert begin_run(out, configs, resume=True) == {}  # the same run, finished: nothing to do
    changed = _configs(tmp_path, episodes, learning_rate=0.01, batch_size=4)
    with pytest.raises(RunMismatch, match=r"holds another run \(train.batch_size: 8 -> 4; "
                                          r"train.learning_rate: 1e-05 -> 0.01\).*--output_dir or --resume false"):
        begin_run(out, changed, resume=True)
    assert (out / "metrics.jsonl").read_text() == '{"step": 0, "x": 1}\n'  # untouched
    # bookkeeping may change on a resume
    assert begin_run(out, _configs(tmp_path, episodes, logging_steps=5, report_to="none"), resume=True) == {}
    # --resume false: everything of the old run moves to previous-<timestamp>/, nothing is lost
    before = {p.relative_to(out): p.read_bytes() if p.is_file() else None for p in out.rglob("*")}
    assert begin_run(out, changed, resume=False) is None
    (previous,) = out.glob("previous-*")
    assert {p.relative_to(previous): p.read_bytes() if p.is_file() else None for p in previous.rglob("*")} == before
    assert sorted(p.name for p in out.iterdir()) == [FINGERPRINT_FILE, previous.name]
    assert json.loads((out / FINGERPRINT_FILE).read_text())["train.learning_rate"] == 0.01
    # a second fresh start keeps the first previous-* and adds another
    (out / "config.json").write_text("{}")
    begin_run(out, configs, resume=False)
    assert len(list(out.glob("previous-*"))) == 2 and previous.exists()


def test_a_run_recorded_under_a_fields_earlier_name_resumes(tmp_path):
    """A field renamed since (`--num_candidates` -> `--candidates_per_state`, kept as an
    alias) is compared under its new name: the same setting resumes, another is named."""
    from sweet.algorithms.sweet_candidates import CandidateConfig

    out = tmp_path / "run"
    configs = lambda k: {"model": ModelConfig(model="tiny"), "train": TrainConfig(output_dir=str(out)),  # noqa: E731
                         "cand": CandidateConfig(candidates_per_state=k)}
    begin_run(out, configs(4), resume=True)
    fp = json.loads((out / FINGERPRINT_FILE).read_text())
    fp["cand.num_candidates"] = fp.pop("cand.candidates_per_state")  # as a run before the rename recorded it
    (out / FINGERPRINT_FILE).write_text(json.dumps(fp))
    (out / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n')  # work done: a mismatch would be refused
    assert begin_run(out, configs(4), resume=True) is None
    with pytest.raises(RunMismatch, match=r"holds another run \(cand.candidates_per_state: 4 -> 5\)"):
        begin_run(out, configs(5), resume=True)


def test_a_run_recorded_before_a_field_was_added_resumes_at_its_default(tmp_path):
    """A field added since (`adam_epsilon`) is the default for a run that predates it: the
    run resumes with the field at its default, and another value is named."""
    out = tmp_path / "run"
    configs = lambda **t: {"model": ModelConfig(model="tiny"), "train": TrainConfig(output_dir=str(out), **t)}  # noqa: E731
    begin_run(out, configs(), resume=True)
    fp = json.loads((out / FINGERPRINT_FILE).read_text())
    assert fp["train.adam_epsilon"] == 1e-8
    for name in ("train.adam_beta1", "train.adam_beta2", "train.adam_epsilon"):
        del fp[name]  # as a run before these fields recorded it
    (out / FINGERPRINT_FILE).write_text(json.dumps(fp))
    (out / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n')  # work done: a mismatch would be refused
    assert begin_run(out, configs(), resume=True) is None
    with pytest.raises(RunMismatch, match=r"holds another run \(train.adam_epsilon: 1e-08 -> 1e-06\)"):
        begin_run(out, configs(adam_epsilon=1e-6), resume=True)


def test_a_folder_without_fingerprint_keeps_the_inputs_it_holds(tmp_path):
    """An earlier run of unknown settings is moved aside, but not the data this run reads
    from inside the folder (the warm start writes its episodes there)."""
    out = tmp_path / "run"
    out.mkdir()
    episodes = out / "scripted_episodes.jsonl"
    episodes.write_text('{"a": 1}\n')
    (out / "config.json").write_text('{"old": true}')
    begin_run(out, _configs(tmp_path, episodes), resume=True)
    (previous,) = out.glob("previous-*")
    assert (previous / "config.json").exists() and episodes.exists()
    # only inputs, no earlier run: nothing moves
    other = tmp_path / "other"
    other.mkdir()
    (other / "eps.jsonl").write_text('{"a": 1}\n')
    begin_run(other, _configs(tmp_path, other / "eps.jsonl"), resume=True)
    assert not list(other.glob("previous-*"))


def test_saved_config_stores_local_paths_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("eps.jsonl").write_text("")
    Path("model").mkdir()
    from sweet.algorithms.rft import RFTConfig

    data = save_resolved_config("out", model=ModelConfig(model="hf:model"), train=TrainConfig(),
                                rft=RFTConfig(episodes="eps.jsonl,missing.jsonl"))
    assert data["model"]["model"] == f"hf:{tmp_path / 'model'}"
    assert data["rft"]["episodes"] == f"{tmp_path / 'eps.jsonl'},missing.jsonl"
    assert json.loads(Path("out/config.json").read_text())["model"]["model"] == f"hf:{tmp_path / 'model'}"
    assert save_resolved_config("out", model=ModelConfig(model="tiny"))["model"]["model"] == "tiny"


# ---- damaged checkpoints, metrics and caches -------------------------------------------------


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_checkpoint_problem_names_the_damaged_file(tmp_path):
    from safetensors.torch import save_file

    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    save_file({"w": torch.ones(64, 64)}, str(ckpt / "model.safetensors"))
    torch.save({"state": torch.ones(64, 64)}, ckpt / "optimizer.bin")
    (ckpt / "state.json").write_text('{"step": 3}')
    assert checkpoint_problem(ckpt) is None
    for name in ("model.safetensors", "optimizer.bin", "state.json"):
        good = (ckpt / name).read_bytes()
        _truncate(ckpt / name)
        assert name in checkpoint_problem(ckpt)
        (ckpt / name).write_bytes(good)


def test_torn_metrics_line_is_cut(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a"')
    with pytest.warns(UserWarning, match="truncated last line"):
        trim_metrics(path, 5)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1]


def test_trainer_resumes_from_the_newest_checkpoint_that_loads(tmp_path, tiny_tokenizer, one_torch_thread, capsys):
    """fit() saving every step; the last checkpoint's optimiser state torn: the rerun warns,
    resumes from the one before, and ends on the uninterrupted run's weights."""
    import random
    import shutil

    from accelerate.state import AcceleratorState, GradientState

    from sweet.algorithms.policy_trainer import sft_loss_fn
    from sweet.core.tokens import Segment
    from sweet.core.trainer import Trainer

    rng = random.Random(0)
    segs = [Segment(tuple(rng.randrange(5, 250) for _ in range(6)), tuple(rng.randrange(5, 250) for _ in range(3)))
            for _ in range(8)]
    model = ModelConfig(model="tiny", dtype="float32", max_length=128, keep_head=16)
    train = TrainConfig(output_dir=str(tmp_path / "run"), batch_size=2, micro_batch_size=2, learning_rate=1e-3,
                        report_to="none")

    def run():
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        trainer = Trainer(model, train, tiny_tokenizer)
        trainer.prepare(trainer.steps_per_epoch(len(segs)))
        final = trainer.fit(list(range(len(segs))), sft_loss_fn(segs, model, int(tiny_tokenizer.pad_token_id)), save_steps=1)
        return {k: v.clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}, final

    first, final = run()
    assert sorted(p.name for p in final.parent.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    shutil.rmtree(final)
    _truncate(final.parent / "checkpoint-3" / "optimizer.bin")
    capsys.readouterr()
    again, _ = run()
    out = capsys.readouterr().out
    assert "WARNING: skipping" in out and "checkpoint-3: optimizer.bin is damaged" in out
    assert "resuming from" in out and "checkpoint-2 (step 2)" in out
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_damaged_reference_cache_is_recomputed(tmp_path, tiny_tokenizer, one_torch_thread, capsys):
    from accelerate.state import AcceleratorState, GradientState

    from sweet.algorithms.policy_trainer import REF_CACHE, reference_logps
    from sweet.core.records import Pair
    from sweet.core.tokens import Segment
    from sweet.core.trainer import Trainer

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    model = ModelConfig(model="tiny", dtype="float32", max_length=128, keep_head=16)
    trainer = Trainer(model, TrainConfig(output_dir=str(tmp_path), report_to="none", micro_batch_size=1),
                      tiny_tokenizer)
    pairs = [Pair((Segment((5, 6, 7), (8, 9)),), (Segment((5, 6, 7), (10,)),), "a")]
    path = tmp_path / REF_CACHE
    want = reference_logps(trainer, pairs, path)
    _truncate(path)
    got = reference_logps(trainer, pairs, path)
    assert "does not load" in capsys.readouterr().out and torch.equal(got, want)
    assert torch.equal(torch.load(path, weights_only=False)["values"], want)  # rewritten whole


# ---- real processes: kill, rerun with other settings, damaged checkpoint, --resume false -----


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(2)
    return cached_tiny_episodes(tmp_path_factory.getbasetemp())


def _cmd(episodes: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sweet.train_policy", "--algorithm", "rft", "--episodes", str(episodes),
            "--output_dir", str(out), *FAST, "--batch_size", "1", "--micro_batch_size", "1", "--num_epochs", "3",
            "--save_steps", "1", "--learning_rate", "1e-3", *extra]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_killed_rft_run_cannot_be_mixed_falls_back_and_is_never_destroyed(data, tmp_path, kill_tree):
    episodes = data[0]
    out = tmp_path / "rft"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(_cmd(episodes, out), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (out / "checkpoint-2" / "state.json").exists():
        assert proc.poll() is None and time.time() < deadline, "no second checkpoint before the run ended"
        time.sleep(0.05)
    kill_tree(proc)  # SIGKILL after its second checkpoint
    assert not (out / "finished.json").exists()

    # other settings: refused in one line naming the field, the folder untouched (but for the
    # killed run's stale lock file, which the refused run takes over and releases)
    before = sorted(p.name for p in out.iterdir() if p.name != ".lock")
    bad = _run(_cmd(episodes, out, "--learning_rate", "2e-3"))
    assert bad.returncode != 0
    last = bad.stderr.strip().splitlines()[-1]
    assert "holds another run (train.learning_rate: 0.001 -> 0.002)" in last and "--resume false" in last
    assert bad.returncode == 2 and "Traceback" not in bad.stderr  # one line (sweet.core.runs)
    assert sorted(p.name for p in out.iterdir()) == before

    # the newest checkpoint damaged (a torn weights file): the older one is used, with a warning
    newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    older = int(newest.name.split("-")[1]) - 1
    assert (out / f"checkpoint-{older}" / "state.json").exists()
    _truncate(newest / "model.safetensors")
    good = _run(_cmd(episodes, out))
    assert good.returncode == 0, good.stderr[-3000:]
    assert f"skipping {newest}: model.safetensors is damaged" in good.stdout
    assert f"resuming from {out / f'checkpoint-{older}'} (step {older})" in good.stdout
    steps = [r["step"] for r in read_metrics(out) if "loss/nll" in r]
    assert steps == list(range(1, steps[-1] + 1))  # every step logged once, none lost or doubled
    assert (out / "finished.json").exists()

    # --resume false in the finished folder: the old run moves aside whole, a new one is trained
    # (the folder's lock stays where it is: the running trainer holds it)
    old = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    fresh = _run(_cmd(episodes, out, "--resume", "false"))
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    (previous,) = out.glob("previous-*")
    assert f"moved it to {previous}" in fresh.stdout
    assert {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()} == old
    assert (out / "finished.json").exists() and (out / "final" / "model.safetensors").exists()
    assert [r["step"] for r in read_metrics(out) if "loss/nll" in r] == steps  # a whole new run's rows


def test_critic_stores_its_reference_model_resolved_and_recomputes_a_damaged_cache(
        tmp_path, synthetic_files, fresh_accelerate, one_torch_thread, monkeypatch, capsys):
    """Run from the model's folder with a relative --model: critic_config.json names it
    absolutely (stage 2 runs elsewhere). A torn ref_logprobs.pt is recomputed, same result."""
    import shutil

    from accelerate.state import AcceleratorState, GradientState

    from engines.tiny import tiny_model_path
    from sweet.critic.train import cli

    model_dir = Path(tiny_model_path())
    monkeypatch.chdir(model_dir.parent)
    episodes, tasks = synthetic_files
    out = tmp_path / "critic"
    args = ["--model", model_dir.name, "--episodes", str(episodes), "--tasks", str(tasks), "--output_dir", str(out),
            "--num_epochs", "1", "--batch_size", "4", "--micro_batch_size", "4", "--learning_rate", "2e-3",
            "--max_pairs", "4", "--max_length", "512", "--report_to", "none"]
    first = cli(args)
    spec = json.loads((out / "critic_config.json").read_text())
    assert spec["reference_model"] == str(model_dir)
    assert json.loads((out / "config.json").read_text())["model"]["model"] == str(model_dir)
    for name in ("final", "final_metrics.json", "critic_config.json", "finished.json"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    _truncate(out / "ref_logprobs.pt")
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    capsys.readouterr()
    again = cli(args)
    assert "ref_logprobs.pt does not load" in capsys.readouterr().out
    assert again == pytest.approx(first, abs=1e-6)
    torch.load(out / "ref_logprobs.pt", weights_only=False)["values"]  # rewritten whole
