"""The policy copy that samples, following a trainer's weights, and the collector that plays
each iteration's episodes with it (online trainers: LOOP; any trainer that samples from the
policy it trains).

    sampler = Sampler(trainer, model_cfg, tokenizer, backend="vllm")   # before trainer.prepare
    collector = Collector(trainer, sampler, env, simulator, draw=lambda: rng.sample(tasks, 8),
                          iterations=10, sampling=SamplingParams(temperature=1.0), k=6, lag=None)
    collector.start(first)              # every process
    episodes = collector.episodes(it)   # every process, at iteration it's start
    ...train...
    collector.wait()                    # before the checkpoint: the background rollout is on disk

`Sampler.sync(version)` gives the engine policy version `version` (the weights after that
many updates): the live model, a model copy, or a vLLM engine that loads each new LoRA
adapter or the full weights. `Collector` plays iteration j's episodes with seeds from
`iteration_seed` and records the version that played each (meta[POLICY_VERSION]); with a
lag s (async rollouts) it plays iteration j+s's in a background thread while the trainer
trains on iteration j's, which version max(j − s, 0) played.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Callable, Sequence

from colbench.agents import ModelAgent
from colbench.episodes import write_episodes
from colbench.rollout import episode_seeds, rollout
from colbench.types import Episode
from engines.base import SamplingParams
from engines.hf import HFEngine
from engines.vllm_engine import COLOCATED_GPU_MEMORY_UTILIZATION, cpu_share
from sweet.core.config import ModelConfig
from sweet.core.models import resolve_model_path
from sweet.core.policy_turns import TRAINER_LOGPROBS, sampled_turns, score_rows

POLICY_VERSION = "policy_version"  # Episode.meta: the policy version (updates before it) that played it
BACKENDS = ("", "vllm")  # '' = transformers (the live model or a copy); 'vllm' = a vLLM engine


def episodes_path(out: str | Path, j: int) -> Path:
    """Where iteration j's episodes are recorded under a run's output folder."""
    return Path(out) / "episodes" / f"iter-{j:04d}.jsonl"


def iteration_seed(train_seed: int, it: int) -> int:
    """Iteration `it`'s seed: its episodes' sampling seeds and its minibatch order."""
    return train_seed * 100_003 + it


def episode_metrics(episodes: Sequence[Episode], it: int) -> dict[str, float]:
    """Iteration `it`'s env/* metrics and the policy lag its episodes were played at."""
    n = len(episodes)
    return {"env/reward": sum(e.reward for e in episodes) / n,
            "env/success_rate": sum(e.success for e in episodes) / n,
            "env/turns": sum(len(e.agent_turns) for e in episodes) / n,
            "loop/episodes_total": float(n),
            "loop/policy_lag": sum(it - e.meta.get(POLICY_VERSION, it) for e in episodes) / n}


class Sampler:
    """The engine that plays the episodes, following the trained weights. Every process
    builds one (before `trainer.prepare`) and calls `sync(version)` at each iteration's
    start; only the main process holds an engine. A version's weights reach it once.

    backend '' (transformers): the live policy in memory. Under FSDP or ZeRO-3 the trained
    weights are sharded (a forward on the main process alone would wait for the others'
    shards), and with `keep_copy` (async rollouts) the trainer changes them while the
    sampler plays, so in both cases the main process plays with its own copy of the model,
    given the (gathered) weights at each `sync` (FSDP/ZeRO-3: a collective) and the memory
    of one more model there (`copy_bytes`). (ZeRO-3 is tested with 2 CPU processes over
    gloo, docs/distributed.md.)
    backend 'vllm': a vLLM engine started from the initial model; each `sync` loads the new
    LoRA adapter (saved to output_dir/sampler-adapter) or copies the full weights in, and
    the sampler/trainer log-prob gap measures any drift.
    `with_value`: the trained model is a value-head wrapper (`sweet.core.value_head`).
    """

    def __init__(self, trainer, model_cfg: ModelConfig, tokenizer, *, backend: str = "", keep_copy: bool = False,
                 with_value: bool = False, gpu_memory_utilization: float = COLOCATED_GPU_MEMORY_UTILIZATION):
        from accelerate.utils import DistributedType

        if backend not in BACKENDS:
            raise ValueError(f"sampler backend must be '' (transformers) or 'vllm', got {backend!r}")
        acc = self.acc = trainer.accelerator
        self.trainer, self.model_cfg, self.tokenizer, self.backend = trainer, model_cfg, tokenizer, backend
        self.with_value, self.gpu_memory_utilization = with_value, gpu_memory_utilization
        zero3 = acc.distributed_type == DistributedType.DEEPSPEED and acc.state.deepspeed_plugin.zero_stage == 3
        self.mirrored = (acc.distributed_type == DistributedType.FSDP or zero3) and not backend
        own = (self.mirrored or keep_copy) and acc.is_main_process
        self.copy = copy.deepcopy(trainer.model).requires_grad_(False).eval() if own else None
        if keep_copy:  # the sampler's thread must not share the trainer's (stateful) tokenizer
            self.tokenizer = copy.deepcopy(tokenizer)
            if model_cfg.gradient_checkpointing:  # the thread samples from torch's RNG: the recomputation must not
                # reset it (nothing to replay without dropout)
                lm = getattr(trainer.model, "lm", trainer.model)  # ppo: the LM inside the value-head wrapper
                lm.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": True, "preserve_rng_state": False})
        self.engine, self.version = None, None

    @property
    def copy_bytes(self) -> int:
        """The memory of the sampler's own model copy (0 without one)."""
        if self.copy is None:
            return 0
        return sum(t.numel() * t.element_size() for t in [*self.copy.parameters(), *self.copy.buffers()])

    def sync(self, version: int) -> None:
        """Give the engine policy version `version`, the trained weights now (the first call
        starts it; a version already held is not sent again). Every process."""
        if version == self.version:
            return
        self.version = version
        weights = self.acc.get_state_dict(self.trainer.model) if self.mirrored else None  # a collective
        if not self.acc.is_main_process:
            return
        if self.copy is not None:
            self.copy.load_state_dict(weights if weights is not None else
                                      self.acc.unwrap_model(self.trainer.model).state_dict())
        if self.engine is None:
            self.engine = self._start()
        elif self.backend == "vllm":
            self._load_vllm()

    def recompute(self, episodes: Sequence[Episode]) -> None:
        """Async rollouts: record on each episode the trainer's log-probs of its generated
        turns at the copy's weights (meta[TRAINER_LOGPROBS], [A] per turn with ids): the
        trainer's own forward (`score_rows`), the gap guard's reference."""
        import torch

        turns, micro = sampled_turns(episodes, self.tokenizer), self.trainer.train.micro_batch_size
        with torch.no_grad():
            rows = [r[0].tolist() for i in range(0, len(turns), micro)
                    for r in score_rows(self.copy, turns[i: i + micro], self.tokenizer.pad_token_id, self.model_cfg,
                                        self.with_value)]
        for g, ep in enumerate(episodes):
            ep.meta[TRAINER_LOGPROBS] = [r for t, r in zip(turns, rows) if t.trajectory == g]

    def _start(self):
        from sweet.core.value_head import ValueHeadModel

        if self.backend != "vllm":
            unwrapped = self.copy if self.copy is not None else self.acc.unwrap_model(self.trainer.model)
            policy = unwrapped.lm if isinstance(unwrapped, ValueHeadModel) else unwrapped
            return HFEngine.from_model(policy, self.tokenizer, spec="hf:loop-policy")
        from engines.base import EngineOptions
        from engines.vllm_engine import VLLMEngine

        path, lora = resolve_model_path(self.model_cfg.model), self.model_cfg.lora
        # the sampler shares the GPU with the policy being trained (arithmetic in engines.vllm_engine);
        # on vLLM's CPU build, while it samples during training (keep_copy: async) it takes the second
        # half of the cores and the trainer's threads the first (sync: they take turns, each with all)
        options = EngineOptions(enable_lora=lora, gpu_memory_utilization=self.gpu_memory_utilization,
                                max_lora_rank=self._policy().peft_config["default"].r if lora else None,
                                dtype=self.model_cfg.dtype, extra={"cpu_share": (1, 2)} if self.copy is not None else {})
        if self.copy is not None and self.acc.device.type == "cpu":
            import torch

            torch.set_num_threads(len(cpu_share(0, 2)))
        self.engine = VLLMEngine(path, options, spec=f"vllm:{path}")
        self._load_vllm()  # a resumed policy differs from the initial weights
        return self.engine

    def _policy(self):
        from sweet.core.value_head import ValueHeadModel

        unwrapped = self.acc.unwrap_model(self.trainer.model)
        return unwrapped.lm if isinstance(unwrapped, ValueHeadModel) else unwrapped

    def _load_vllm(self) -> None:
        if self.model_cfg.lora:
            path = self.trainer.out / "sampler-adapter"
            self._policy().save_pretrained(path)
            self.engine.load_lora(str(path))
        else:
            self.engine.update_weights(self._policy().state_dict().items())

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class Collector:
    """The episodes iteration `it` trains on, played by the sampler on the main process,
    scored by the environment, and sent to every process. Iteration j's tasks are the j-th
    `draw()` and its episode seeds come from `iteration_seed`, so what is played never
    depends on timing. Each played episode records meta[POLICY_VERSION].

    Synchronous (`lag` None): iteration i's episodes are played by version i (the weights
    after i iterations), then trained on.
    Asynchronous, `lag` = s >= 0: iteration i trains on episodes played by version
    max(i − s, 0). At iteration i's start the sampler takes version i and a background
    thread plays iteration i+s's episodes while the trainer trains on iteration i's (the
    first s iterations' are played by the initial policy before the loop). The thread ends
    before the iteration's checkpoint (`wait`), so a checkpoint's episodes/iter-*.jsonl hold
    every episode sampled so far and a resumed run reads them back. The episodes also
    record the trainer's log-probs at their version (`Sampler.recompute`), computed before
    the copy moves on.
    """

    def __init__(self, trainer, sampler: Sampler, env, simulator, *, draw: Callable[[], Sequence], iterations: int,
                 sampling: SamplingParams, k: int, lag: int | None = None):
        self.trainer, self.sampler, self.env, self.simulator = trainer, sampler, env, simulator
        self.draw, self.iterations, self.sampling, self.k = draw, iterations, sampling, k
        self.asynchronous, self.lag = lag is not None, lag or 0
        self.ready: dict[int, list[Episode]] = {}
        self.thread, self.error = None, None

    def start(self, first: int) -> None:
        """Before iteration `first` (every process): the sampler takes the weights; async:
        iterations first..first+s−1's episodes (a resumed run's are read back)."""
        self.sampler.sync(first)
        if self.asynchronous and self.trainer.is_main:
            for j in range(first, min(first + self.lag, self.iterations)):
                self.ready[j] = self.play(j, self.draw(), max(j - self.lag, 0))

    def episodes(self, it: int) -> list[Episode]:
        """Iteration `it`'s episodes, on every process (all call it at the iteration's start)."""
        self.sampler.sync(it)
        if not self.asynchronous:
            return self.trainer.from_main(lambda: self.play(it, self.draw(), it))
        return self.trainer.from_main(lambda: self._launch_and_take(it))

    def _launch_and_take(self, it: int) -> list[Episode]:
        if it + self.lag < self.iterations:
            self.thread = threading.Thread(target=self._background, args=(it + self.lag, self.draw(), it), daemon=True)
            self.thread.start()
        if it not in self.ready:  # lag 0: nothing to overlap
            self.wait()
        return self.ready.pop(it)

    def _background(self, j: int, tasks, version: int) -> None:
        try:
            self.ready[j] = self.play(j, tasks, version)
        except BaseException as e:  # re-raised on the training thread by `wait`
            self.error = e

    def wait(self) -> None:
        """Block until the background rollout has ended; re-raise its error."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            raise RuntimeError(f"async rollout failed: {self.error}") from self.error

    def play(self, j: int, tasks, version: int) -> list[Episode]:
        """Iteration j's episodes (K per task) played by the sampler's current weights
        (`version`), scored by the environment and recorded in output_dir/episodes/iter-j.jsonl
        (episodes already there are read back, not played again)."""
        path = episodes_path(self.trainer.out, j)
        agent = ModelAgent(self.sampler.engine, self.sampling, name="policy")
        episodes = rollout(self.env, tasks, agent, self.simulator, out_path=path,
                           seeds=episode_seeds(iteration_seed(self.trainer.train.seed, j), self.k))
        fresh = [ep for ep in episodes if POLICY_VERSION not in ep.meta]  # read-back episodes keep theirs
        for ep in fresh:
            ep.meta[POLICY_VERSION] = version
        if fresh and self.asynchronous:
            self.sampler.recompute(fresh)
        if fresh:
            write_episodes(path, episodes)
        return episodes
