"""The one training skeleton: every trainer here is a loss hook + its data on top of it.

    trainer = Trainer(model_cfg, train_cfg, tokenizer)   # accelerate, seed, initial model
    trainer.prepare(total_steps)                         # AdamW (or optimizer=) + linear schedule, prepare
    ...                                                  # reference log-probs etc. with trainer.model
    final = trainer.fit(items, loss_fn, count_fn)        # epochs, checkpoints, resume, metrics, final/

or, for a loop that makes its own data (LOOP):

    state = trainer.restore()                            # None, or the dict given to save_checkpoint
    start = trainer.resume_iterations(replay)            # or: restore() + the loop's seeded draws replayed
    data = trainer.from_main(make_data)                  # made on the main process, broadcast
    metrics = trainer.optimizer_step(step_items, loss_fn, count_fn)
    trainer.advance_schedule(position)                   # the schedule moved without an optimiser step
    trainer.log(metrics); trainer.save_checkpoint({"iteration": it}); trainer.save_final()

The loss hook (one contract for every algorithm):

    loss_fn(model, micro_items) -> (loss_sum, metric_sums)
    count_fn(item) -> float                              # default: 1 per item

`loss_sum` is the SUM over the micro-batch's units (pairs, examples, tokens: whatever
the algorithm averages over) of the per-unit loss, as a scalar tensor with a graph;
`count_fn(item)` is the number of those units an item holds (1 for a pair; its action
tokens when the loss is a token mean). The trainer divides by the whole optimiser step's
count N = Σ count_fn over the step's items (all micro-batches, all processes), so

    gradient of one optimiser step = ∇ (1/N) Σ_{units of the step} loss

whatever `micro_batch_size` and the number of processes: the update is the same
(tests/sweet/test_trainer.py, test_policy_invariance.py compare the weights). Scaling, why: accelerate's
`backward` divides by the accumulation steps (DeepSpeed's engine by the ones it was
configured with) and DDP/FSDP/DeepSpeed average the gradients over processes, so each
micro-batch's `loss_sum` is multiplied by world·accum/N (`optimizer_step`). `metric_sums`
are sums over the same units (floats); the trainer logs Σ/N per key (so a hook returns
`mean * batch` for a per-pair mean).

Batches: an optimiser step takes `batch_size` items (the last step of an epoch what is
left) from a seeded per-epoch permutation; item j of the step goes to micro-batch slot
j // micro, slot s to process s % world, accumulation round s // world. Every process
runs the same number of forward/backward passes (`accum`, from batch/(micro·world),
more for a larger step given to `optimizer_step`): an empty slot re-runs the step's
first item with weight 0 (FSDP and DeepSpeed need equal collective counts; DDP needs
the last backward on every rank).

Checkpoints: `accelerator.save_state`/`load_state` (model, optimiser, scheduler, the
RNGs of every process, any backend), called by EVERY process, into
output_dir/checkpoint-<step>/ plus state.json (the step and the caller's state); the last
`keep` are kept. With frozen weights (LoRA; not under FSDP/DeepSpeed) only the trainable
ones are saved. Resuming: the model is built with its initial weights and prepared
(anything computed from the initial model, like DPO reference log-probs, is computed
then), then `restore()` loads the newest checkpoint that loads (a damaged newer one, e.g. a
file torn by a kill or a full disk, is skipped with a warning: `checkpoint_problem`) and
cuts metrics.jsonl back to its step (a fresh start empties it; a torn last row is cut).
That the folder holds THIS run is checked before, by every trainer's `begin_run`
(sweet/core/fingerprint.py), which also moves an earlier run aside on a fresh start. The final model goes to output_dir/final in HF format
(a LoRA run also writes final-adapter/ and merges a copy: training can go on).

Snapshots (`train.snapshot_steps` N > 0): every N optimiser steps and at the end, the model
alone, in the final model's format, into output_dir/path/step-<step>/ (`snapshot`, the
same writer as `save_final`), so a benchmark can evaluate points along the training path.
They are written before that step's checkpoint, kept (never rotated), and a resume leaves
the existing ones as they are (a resumed run reproduces the same weights).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from colbench.io import DiskFull, atomic_folder, atomic_write, full_disk_guard, remove_stale
from colbench.jsonl import read_rows
from engines.memory import HeapTrimmer, release_memory
from sweet.core.config import ModelConfig, TrainConfig, resolve_learning_rate
from sweet.core.metrics import MetricsLogger, trackers
from sweet.core.models import load_model, make_optimizer, set_seed

LossFn = Callable[[Any, Sequence[Any]], tuple[Any, dict[str, float]]]
CountFn = Callable[[Any], float]
STATE_FILE = "state.json"
FINISHED_FILE = "finished.json"  # the one "this stage is done" marker, written last
SNAPSHOT_DIR = "path"  # output_dir/path/step-<N>/: the training path's model-only snapshots


def accumulation_steps(batch_size: int, micro_batch_size: int, world: int) -> int:
    """Micro-batches per process per optimiser step so that one step holds `batch_size` items."""
    return max(1, math.ceil(batch_size / (micro_batch_size * world)))


def process_state():
    """accelerate's PartialState for this launch, the one to use before (or instead of) a
    Trainer: without CUDA it must be created with cpu=True, or torchrun-launched CPU
    processes (sweet/configs/*_cpu_2proc.yaml) skip the process group and each run alone."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def make_accelerator(train: TrainConfig):
    """An Accelerator whose gradient accumulation turns micro-batches into `batch_size`,
    with the trackers of `train.report_to` (TensorBoard in output_dir/tensorboard);
    DeepSpeed's batch, accumulation and clipping taken from `train` (`configure_deepspeed`);
    real FSDP2 or DeepSpeed ZeRO on CPU processes when the launch config asks for it."""
    import os

    import torch
    from accelerate import Accelerator
    from accelerate.utils import (DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin,
                                  ProjectConfiguration)

    cpu = not torch.cuda.is_available()
    world = process_state().num_processes
    launched = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's
    if world == 1 and launched > 1:  # PartialState is a process-wide singleton: the first one created wins
        raise RuntimeError(f"{launched} processes were launched but accelerate sees {world}: a PartialState() was "
                           "created before the trainer without cpu=True; use sweet.core.trainer.process_state()")
    accum = accumulation_steps(train.batch_size, train.micro_batch_size, world)
    out = Path(train.output_dir)
    log_with = trackers(train.report_to)
    common = {"gradient_accumulation_steps": accum, "cpu": cpu, "log_with": log_with or None,
              "project_config": ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "tensorboard"))}
    asked = lambda name: os.environ.get(f"ACCELERATE_USE_{name}", "false").lower() == "true"  # noqa: E731
    # A launch config asking for FSDP or DeepSpeed on CPU processes (sweet/configs/*_cpu_2proc.yaml,
    # gloo). accelerate 1.16 sets DistributedType.FSDP/DEEPSPEED only for GPU-type process
    # groups (AcceleratorState.__init__), so on CPU it would silently run plain DDP (MULTI_CPU).
    # FSDP2 shards over a CPU device mesh with gloo, and DeepSpeed's CPU accelerator runs its
    # collectives over gloo (it wraps the process group accelerate made); accelerate's paths for
    # both (prepare, backward, save_state/load_state, get_state_dict) work there, so we switch
    # the type ourselves: checked with accelerate 1.16 / torch 2.14 / deepspeed 0.19, the weights
    # match one process and resumes are exact (tests/sweet, -m slow). An accelerate that sets
    # these on CPU itself makes this a no-op; one that changes these internals needs it looked at again.
    if cpu and asked("FSDP"):
        plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables
        acc = _checked_accumulation(Accelerator(**common, fsdp_plugin=plugin), accum)
        if acc.distributed_type == DistributedType.MULTI_CPU:
            acc.state.fsdp_plugin = plugin
            _switch_type(acc, DistributedType.FSDP)
        return acc
    if cpu and asked("DEEPSPEED"):
        plugin = DeepSpeedPlugin()  # from the launcher's ACCELERATE_DEEPSPEED_* variables
        acc = _checked_accumulation(Accelerator(**common, deepspeed_plugin=plugin), accum)
        if acc.distributed_type == DistributedType.MULTI_CPU:
            # what AcceleratorState.__init__ does for a DeepSpeed launch on GPUs; full precision
            # (DeepSpeed's bf16/fp16 are GPU paths here)
            plugin.set_mixed_precision("no")
            plugin.select(_from_accelerator_state=True)
            acc.state.deepspeed_plugins = plugin
            _switch_type(acc, DistributedType.DEEPSPEED)
    else:
        acc = _checked_accumulation(Accelerator(**common), accum)
    if acc.state.deepspeed_plugin is not None:
        configure_deepspeed(acc.state.deepspeed_plugin.deepspeed_config, train, accum, world,
                            declared=declared_deepspeed_config())
    return acc


def _switch_type(acc, distributed_type) -> None:
    """Make `acc` (and every later AcceleratorState, which copies PartialState's type over
    its own) run as `distributed_type`."""
    from accelerate import PartialState

    acc.state.distributed_type = distributed_type
    PartialState._shared_state["distributed_type"] = distributed_type


def _checked_accumulation(acc, accum: int):
    """Refuse a launch config whose gradient_accumulation_steps (ACCELERATE_GRADIENT_ACCUMULATION_STEPS,
    which accelerate lets win over the argument) differs from the trainer's."""
    if acc.gradient_accumulation_steps != accum:
        raise ValueError(f"the accelerate launch config sets gradient_accumulation_steps="
                         f"{acc.gradient_accumulation_steps}, the trainer needs {accum} (--batch_size / "
                         "(--micro_batch_size x processes)): remove it from the launch config")
    return acc


def declared_deepspeed_config() -> dict[str, Any] | None:
    """The DeepSpeed JSON file the launch config names (`deepspeed_config_file`), as its
    author wrote it, or None (the launch config's own deepspeed_config fields). accelerate
    fills a missing gradient_accumulation_steps of a file with 1, so a mismatch must be
    judged on the file itself."""
    import os

    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if path == "none":
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"DeepSpeed config file {path}: {e}") from None


def configure_deepspeed(ds_config: dict[str, Any], train: TrainConfig, accum: int, world: int,
                        declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """Make DeepSpeed's batch arithmetic and clipping ours, in place: each of
    train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping and
    train_batch_size that the config leaves unset or "auto" is set from `train`; one it
    sets to another value is refused (accelerate would otherwise silently let DeepSpeed's
    accumulation win at `prepare`, and DeepSpeed would clip at its own norm). `declared`:
    the values as the user wrote them, when `ds_config` holds fills of accelerate's."""
    want = {"train_micro_batch_size_per_gpu": train.micro_batch_size, "gradient_accumulation_steps": accum,
            "gradient_clipping": train.max_grad_norm,
            "train_batch_size": train.micro_batch_size * accum * world}
    source = {"train_micro_batch_size_per_gpu": "--micro_batch_size", "gradient_accumulation_steps":
              "--batch_size / (--micro_batch_size x processes)", "gradient_clipping": "--max_grad_norm",
              "train_batch_size": "--micro_batch_size x accumulation x processes"}
    for key, value in want.items():
        have = (ds_config if declared is None else declared).get(key, "auto")
        if have in ("auto", None):
            ds_config[key] = value
        elif float(have) != float(value):
            raise ValueError(f"DeepSpeed config {key}={have} differs from the trainer's {value} ({source[key]}): "
                             f"remove it from the DeepSpeed config (sweet sets it) or change the flag")
    return ds_config


def schedule_offset(step: int, steps: int, planned: int) -> int:
    """Where step `step` of a round that takes `steps` optimiser steps sits in its
    `planned` steps of the learning-rate schedule: evenly spread, so a round that takes
    fewer steps than planned still walks its whole share of the decay."""
    return (step * planned) // max(steps, 1)


def advance_schedule(scheduler, position: int) -> None:
    """Step `scheduler` (without an optimiser step) up to `position`."""
    import warnings

    with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": intended here
        warnings.simplefilter("ignore", UserWarning)
        while scheduler.last_epoch < position:
            scheduler.step()


def epoch_order(n_items: int, epoch: int, seed: int) -> list[int]:
    """The seeded permutation of one epoch (the same on every process)."""
    import random

    order = list(range(n_items))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def deal(step_items: Sequence[Any], *, rank: int, world: int, micro: int, accum: int) -> list[tuple[list[Any], float]]:
    """This process's `accum` micro-batches of one step, as (items, weight): weight 1, or
    0 for a padding micro-batch (the step's first item, run only to keep collectives even)."""
    if not step_items:
        raise ValueError("an optimiser step needs at least one item")
    if len(step_items) > micro * world * accum:
        raise ValueError(f"{len(step_items)} items do not fit one step of {accum} x {world} x {micro}")
    out = []
    for k in range(accum):
        slot = k * world + rank
        mine = list(step_items[slot * micro : (slot + 1) * micro])
        out.append((mine, 1.0) if mine else ([step_items[0]], 0.0))
    return out


class Trainer:
    """Accelerate setup, optimiser and schedule, micro-batch loop, checkpoints, metrics.

    `model`: a ready torch module to train instead of loading `model_cfg` (its initial
    weights must be reproducible: a resume rebuilds it the same way, then loads the state).
    `name`: the progress-bar label.
    """

    def __init__(self, model_cfg: ModelConfig, train: TrainConfig, tokenizer, *, model=None,
                 run_config: dict[str, Any] | None = None, name: str = "train"):
        self.model_cfg, self.train, self.tokenizer, self.name = model_cfg, train, tokenizer, name
        resolve_learning_rate(model_cfg, train)  # configs built in code (parse_configs resolved the CLI's)
        self.out = Path(train.output_dir)
        self.accelerator = make_accelerator(train)
        set_seed(train.seed)  # LoRA's initial adapters come from the seeded RNG
        self.model = (model if model is not None else load_model(model_cfg)).to(self.accelerator.device)
        self.model.train()
        self.optimizer = self.scheduler = None
        self.base_accum = self.accelerator.gradient_accumulation_steps
        self.step = 0
        self.logger = MetricsLogger(self.out, self.accelerator, run_config)
        self.trim_heap = HeapTrimmer()  # after each micro-batch: a real model's leave GBs freed but mapped

    # ---- setup ---------------------------------------------------------------------------

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    @property
    def accum(self) -> int:
        return self.accelerator.gradient_accumulation_steps

    @property
    def _deepspeed(self) -> bool:
        from accelerate.utils import DistributedType

        return self.accelerator.distributed_type == DistributedType.DEEPSPEED

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def prepare(self, total_steps: int, optimizer=None) -> None:
        """AdamW (or `optimizer`, e.g. with parameter groups) and the linear warm-up/decay
        schedule over `total_steps`; accelerator.prepare.

        The scheduler is not handed to `prepare` (a prepared scheduler steps once per
        process, which would tie the schedule to the process count); it is registered for
        checkpointing instead and stepped once per optimiser step."""
        self.optimizer, self.scheduler = make_optimizer(self.model, self.train, total_steps, optimizer)
        self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        self.accelerator.register_for_checkpointing(self.scheduler)
        if self._trainable_only:
            self.accelerator.register_save_state_pre_hook(_keep_trainable)

    @property
    def _trainable_only(self) -> bool:
        """LoRA (frozen weights) outside FSDP/DeepSpeed: checkpoints hold the trainable
        weights only; the frozen ones are rebuilt from the model spec on resume."""
        from accelerate.utils import DistributedType

        frozen = any(not p.requires_grad for p in self.model.parameters())
        return frozen and self.accelerator.distributed_type not in (DistributedType.FSDP, DistributedType.DEEPSPEED)

    def restore(self) -> dict[str, Any] | None:
        """Load the newest checkpoint of output_dir that loads (when `train.resume`;
        a damaged newer one is skipped with a warning); returns its state (with "step"),
        or None on a fresh start. Cuts metrics.jsonl to match."""
        ckpt = None
        if self.is_main:  # what a kill or a full disk left half-written (checkpoint-N.tmp, final.tmp, ...)
            for stale in remove_stale(self.out) + remove_stale(self.out / SNAPSHOT_DIR):
                print(f"removed {stale}: an interrupted write")
        self.accelerator.wait_for_everyone()
        if self.train.resume:
            for candidate in sorted(checkpoints(self.out), key=_ckpt_step, reverse=True):
                problem = checkpoint_problem(candidate)
                if problem is None:
                    ckpt = candidate
                    break
                self.accelerator.print(f"WARNING: skipping {candidate}: {problem}")
        if ckpt is None:
            if self.is_main:
                trim_metrics(self.out / "metrics.jsonl", -1)  # no rows from an earlier attempt
            self.accelerator.wait_for_everyone()
            return None
        # trainable-only checkpoints (LoRA) leave the frozen weights as built
        self.accelerator.load_state(str(ckpt), **({"strict": False} if self._trainable_only else {}))
        state = json.loads((ckpt / STATE_FILE).read_text())
        self.step = int(state["step"])
        if self.is_main:
            trim_metrics(self.out / "metrics.jsonl", self.step)
        self.accelerator.print(f"resuming from {ckpt} (step {self.step})")
        self.accelerator.wait_for_everyone()
        return state

    def resume_iterations(self, replay: Callable[[], Any] | None = None) -> int:
        """`restore()` for a loop counted in iterations (its checkpoints' state holds
        "iteration"): returns the first iteration to run (0 on a fresh start), having called
        `replay()` once per finished iteration, so a seeded draw of the loop's own (e.g. the
        tasks it samples) is where the uninterrupted run had it."""
        state = self.restore()
        start = state["iteration"] + 1 if state else 0
        for _ in range(start if replay is not None else 0):
            replay()
        return start

    def from_main(self, make: Callable[[], Any]) -> Any:
        """`make()` run on the main process alone, its result sent to every process (e.g.
        rollouts played by one engine). Every process must call it."""
        from accelerate.utils import broadcast_object_list

        box = [make() if self.is_main else None]
        if self.world > 1:
            broadcast_object_list(box, from_process=0)
        return box[0]

    def advance_schedule(self, position: int) -> None:
        """Step the learning-rate schedule, without an optimiser step, up to `position`
        (a loop whose steps per iteration vary keeps each iteration's planned share)."""
        advance_schedule(self.scheduler, position)

    # ---- one optimiser step ----------------------------------------------------------------

    def optimizer_step(self, step_items: Sequence[Any], loss_fn: LossFn, count_fn: CountFn | None = None
                       ) -> dict[str, float]:
        """One optimiser step on `step_items` (the WHOLE step's items, the same list on
        every process; more than `batch_size` items take more accumulation rounds);
        returns the step's metrics (Σ/N over all processes, grad norm, lr)."""
        import torch

        acc, model = self.accelerator, self.model
        self._fit_accumulation(len(step_items))
        total = float(sum(count_fn(it) for it in step_items)) if count_fn else float(len(step_items))
        if total <= 0:
            raise ValueError(f"optimiser step {self.step + 1}: the items hold no loss units (count {total})")
        sums: dict[str, float] = {}
        grad_norm = None
        # what backward divides by: accelerate's accumulation steps, or those DeepSpeed's
        # engine was configured with (it divides itself, whatever this step's rounds)
        divisor = model.gradient_accumulation_steps() if self._deepspeed else self.accum
        for items, weight in deal(step_items, rank=acc.process_index, world=self.world,
                                  micro=self.train.micro_batch_size, accum=self.accum):
            with acc.accumulate(model):
                loss_sum, metric_sums = loss_fn(model, items)
                # backward divides by `divisor`, the backends average over processes: undo both,
                # so the step's gradient is that of Σ loss / N over the whole step
                acc.backward(loss_sum * (weight * self.world * divisor / total))
                if acc.sync_gradients:
                    grad_norm = acc.clip_grad_norm_(model.parameters(), self.train.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            for key, value in metric_sums.items():
                sums[key] = sums.get(key, 0.0) + weight * float(value)
            self.trim_heap()  # the micro-batch's activations are freed: give their pages back past 1 GB
        self.scheduler.step()
        self.step += 1
        keys = sorted(sums)
        values = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=acc.device)
        if self.world > 1 and keys:
            values = acc.reduce(values, reduction="sum")
        metrics = {k: v / total for k, v in zip(keys, values.tolist())}
        metrics["train/grad_norm"] = float("nan") if grad_norm is None else float(grad_norm)
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _fit_accumulation(self, n_items: int) -> None:
        """Accumulation rounds for a step of `n_items`: the configured ones, or more when a
        step holds more items than `batch_size` (LOOP: a step is whole trajectories, a
        variable number of turns). Under DeepSpeed too: accelerate tells its engine where each
        step ends (`set_gradient_accumulation_boundary`)."""
        per_round = self.train.micro_batch_size * self.world
        need = max(self.base_accum, math.ceil(n_items / per_round))
        if need != self.accum:
            self.accelerator.gradient_accumulation_steps = need
        self.accelerator.step = 0  # accumulate() counts micro-batches from the start of this step

    # ---- the epoch loop --------------------------------------------------------------------

    def steps_per_epoch(self, n_items: int) -> int:
        return math.ceil(n_items / self.train.batch_size)

    def fit(self, items: Sequence[Any], loss_fn: LossFn, count_fn: CountFn | None = None, *,
            save_steps: int = 0, save_every_epoch: bool = False, first_metrics: dict[str, float] | None = None,
            on_epoch_end: Callable[[int], dict[str, float]] | None = None) -> Path:
        """`train.num_epochs` passes over `items` in seeded order, from the restored step;
        checkpoint every `save_steps` steps and/or at each epoch end; `first_metrics` are
        logged at step 0 of a fresh run; `on_epoch_end(epoch)` (every process) returns
        metrics logged at that step. Saves and returns output_dir/final.
        Call `prepare` first; `fit` calls `restore` itself."""
        from tqdm.auto import tqdm

        if self.optimizer is None:
            raise RuntimeError("Trainer.prepare(total_steps) must run before fit")
        if not items:
            raise ValueError(f"no training examples for {self.out}: check the data and filters (see the log above)")
        per_epoch = self.steps_per_epoch(len(items))
        total = per_epoch * self.train.num_epochs
        if self.restore() is None and first_metrics:
            self.log(first_metrics)
        bar = tqdm(total=total, initial=self.step, desc=self.name, disable=not self.is_main)
        drawn, order = None, []  # the epoch whose order is drawn (once per epoch), and that order
        while self.step < total:
            epoch, k = divmod(self.step, per_epoch)
            if epoch != drawn:
                drawn, order = epoch, epoch_order(len(items), epoch, self.train.seed)
            batch = self.train.batch_size
            metrics = self.optimizer_step([items[i] for i in order[k * batch : (k + 1) * batch]], loss_fn, count_fn)
            bar.update(1)
            end_of_epoch = self.step % per_epoch == 0
            if self.step % self.train.logging_steps == 0 or self.step == total:
                self.log({**metrics, "train/epoch": self.step / per_epoch})
            if end_of_epoch and on_epoch_end is not None:
                self.log({**on_epoch_end(epoch), "train/epoch": self.step / per_epoch})
            if self.snapshot_due(self.step):
                self.snapshot()
            if self.step < total and ((save_steps and self.step % save_steps == 0) or (save_every_epoch and end_of_epoch)):
                self.save_checkpoint()
        bar.close()
        if self.train.snapshot_steps:
            self.snapshot()  # the end of the path (a no-op when the cadence just wrote it)
        return self.save_final()

    # ---- bookkeeping ---------------------------------------------------------------------

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logger.log(metrics, self.step if step is None else step)

    def save_checkpoint(self, state: dict[str, Any] | None = None, keep: int = 2) -> Path:
        """accelerator.save_state (every process) + state.json into checkpoint-<step>.tmp,
        renamed into place once every process wrote its part; keeps the last `keep`. A full
        disk on any process removes the partial folder and raises DiskFull on every process
        (none is left waiting for the others); the checkpoints before stay as they were."""
        acc = self.accelerator
        out = self.out / f"checkpoint-{self.step}"
        tmp = out.with_name(out.name + ".tmp")
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        error = None
        try:
            with full_disk_guard(out):
                acc.save_state(str(tmp))
                if self.is_main:
                    (tmp / STATE_FILE).write_text(json.dumps({"step": self.step, **(state or {})}, indent=2))
        except DiskFull as e:
            error = e
        if not self.everyone_ok(error is None):
            if self.is_main:
                shutil.rmtree(tmp, ignore_errors=True)  # gives back the space the partial copy took
            raise error or DiskFull(out)
        if self.is_main:
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            for old in sorted(checkpoints(self.out), key=_ckpt_step)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()
        return out

    def everyone_ok(self, ok: bool) -> bool:
        """Whether `ok` holds on every process (a collective: every process must call it).
        How a failure that only the main process meets (its writes) reaches the others,
        so that all stop together instead of waiting for it at the next barrier."""
        if self.world == 1:
            return ok
        import torch

        failed = torch.tensor([0.0 if ok else 1.0], device=self.accelerator.device)
        return float(self.accelerator.reduce(failed, reduction="sum").item()) == 0.0

    def snapshot_due(self, step: int) -> bool:
        """Whether `step` is on the snapshot cadence (train.snapshot_steps; 0: never)."""
        return bool(self.train.snapshot_steps) and step > 0 and step % self.train.snapshot_steps == 0

    def snapshot(self, step: int | None = None) -> Path:
        """The model alone at `step` (default: the current step) in output_dir/path/step-<step>/,
        written as the final model is (`save_model`: atomic, HF format, no optimiser). One
        that exists is kept as it is (a resumed run reaches the same weights). Every
        process must call it."""
        out = self.out / SNAPSHOT_DIR / f"step-{self.step if step is None else step}"
        exists = out.exists()  # complete if there: written beside its place and renamed
        self.accelerator.wait_for_everyone()
        if not exists:
            import torch

            # a LoRA merge builds a model: whatever it draws must not move the training's RNGs
            devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                self.save_model(out)
        return out

    def save_final(self, name: str = "final") -> Path:
        """The trained model in HF format (`hf:<path>`, `vllm:<path>`) in output_dir/<name>
        (`save_model`), and the memory training freed given back (`release_memory`). Every
        process must call it."""
        out = self.save_model(self.out / name)
        self.logger.close()
        release_memory()
        self.accelerator.print(f"saved {out} (use it as hf:{out})")
        return out

    def save_model(self, out: Path) -> Path:
        """The model (no optimiser) in HF format in `out`; for LoRA the adapter in
        <out>-adapter/ and a merged copy in <out>/. Every process must call it. Each
        folder is written beside its place (`<out>.tmp`) and renamed into it, so a kill
        mid-save never leaves a half-written model where a finished one is expected."""
        acc = self.accelerator
        state_dict = acc.get_state_dict(self.model)  # a collective under FSDP / ZeRO-3
        error = None
        if self.is_main:
            try:
                self._write_model(acc.unwrap_model(self.model), state_dict, out)
            except DiskFull as e:
                error = e
        if not self.everyone_ok(error is None):  # a full disk stops every process, none waits
            raise error or DiskFull(out)
        return out

    def _write_model(self, unwrapped, state_dict, out: Path) -> None:
        if hasattr(unwrapped, "peft_config"):
            adapter = out.with_name(out.name + "-adapter")
            with atomic_folder(adapter) as tmp:
                unwrapped.save_pretrained(tmp, state_dict=state_dict)
                self.tokenizer.save_pretrained(tmp)
            merged = load_model(replace(self.model_cfg, lora=False, gradient_checkpointing=False),
                                trainable=False, adapter=str(adapter)).merge_and_unload()
            with atomic_folder(out) as tmp:
                merged.save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
        else:
            with atomic_folder(out) as tmp:
                unwrapped.save_pretrained(tmp, state_dict=state_dict)
                self.tokenizer.save_pretrained(tmp)


def finished(output_dir: str | Path) -> dict[str, Any] | None:
    """What a finished stage recorded in `output_dir` (its FINISHED_FILE), or None: the one
    "already finished" check of every stage (critic, policy algorithms, LOOP, warm start).
    The marker is written last, after all the outputs; a marker whose final model (its
    "final" folder) is missing or would not load counts as unfinished, with one warning, so
    the stage runs again (resuming from its checkpoints) instead of handing on no weights."""
    path = Path(output_dir) / FINISHED_FILE
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(info, dict) and info.get("final"):
        problem = model_problem(Path(output_dir) / info["final"])
        if problem:
            print(f"warning: {path} says finished, but {problem}: running the stage again")
            return None
    return info


def model_problem(folder: Path) -> str | None:
    """Why the model in `folder` would not load, or None: a config (config.json, or a PEFT
    adapter_config.json), at least one weights file, and every weights file whole."""
    if not folder.is_dir():
        return f"{folder} does not exist"
    if not ((folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()):
        return f"{folder} has no config.json"
    weights = sorted(f for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern))
    if not weights:
        return f"{folder} has no weights (*.safetensors / *.bin)"
    for f in weights:
        problem = _file_problem(f)
        if problem:
            return f"{f} {problem}"
    return None


def _file_problem(f: Path) -> str | None:
    """Why one weights or state file is damaged (truncated, torn), or None."""
    import zipfile

    try:
        if f.suffix == ".safetensors":
            _check_safetensors(f)
        elif f.suffix in (".bin", ".pt", ".pkl", ".pth"):
            with zipfile.ZipFile(f) as z:
                z.infolist()
    except Exception as e:  # any library's error for a damaged file means: it does not load
        return f"is damaged ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def mark_finished(output_dir: str | Path, **info: Any) -> None:
    """Write the finished marker (atomically: a torn marker would read as unfinished)."""
    atomic_write(Path(output_dir) / FINISHED_FILE, json.dumps(info, indent=2))


def _keep_trainable(models, weights, output_dir) -> None:
    """save_state pre-hook: drop frozen weights from the saved state dicts (an 8B LoRA run
    would otherwise write the 16 GB base model into every checkpoint)."""
    for model, state in zip(models, weights):
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        for key in [k for k in state if k not in trainable]:
            del state[key]


# ---- checkpoint folders and metrics --------------------------------------------------------


def checkpoints(output_dir: str | Path) -> list[Path]:
    d = Path(output_dir)
    return [p for p in d.glob("checkpoint-*") if p.is_dir() and not p.name.endswith(".tmp")] if d.exists() else []


def _ckpt_step(p: Path) -> int:
    return int(p.name.split("-")[-1])


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` would not load (a kill or a full disk mid-write), or None. Cheap checks
    that catch truncation: state.json parses, every safetensors file's header matches its
    size, every torch.save file (optimizer.bin, scheduler.bin, RNG states) is a whole zip."""
    try:
        state = json.loads((ckpt / STATE_FILE).read_text())
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{STATE_FILE} unreadable ({type(e).__name__}: {e})"
    for f in sorted(ckpt.rglob("*")):
        if f.is_file() and (problem := _file_problem(f)):
            return f"{f.name} {problem}"
    return None


def _check_safetensors(path: Path) -> None:
    """The header parses and the data it describes fits the file (a truncated file fails)."""
    import struct

    size = path.stat().st_size
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if 8 + n > size:
            raise ValueError(f"header of {n} bytes does not fit {size} bytes")
        header = json.loads(f.read(n))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise ValueError(f"holds {size} bytes, its header describes {8 + n + end}")


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop rows logged after the checkpoint we resume from (they are logged again), and
    a torn last line (a kill mid-write), as colbench/jsonl.py cuts a torn episode line."""

    if path.exists():
        rows = read_rows(path, lambda row: row, what="metrics row")
        atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= last_step))
