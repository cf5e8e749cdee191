"""Methods added to every vLLM GPU worker (vLLM's `worker_extension_cls` hook).

`VLLMEngine` starts vLLM with `worker_extension_cls="engines.vllm_worker.WeightSync"`;
vLLM mixes this class into its Worker in each worker process (one per tensor-parallel
rank), and `LLM.collective_rpc("sweet_load_weights", args=(path,))` runs the method in all
of them. Only a file path crosses the process boundary, so nothing needs pickling
(vLLM's multiprocess engine refuses to ship functions such as a lambda).

Each worker reads the full tensors of one safetensors shard and hands them to the vLLM
model's own `load_weights`, which maps HF parameter names onto vLLM's fused layers
(qkv_proj, gate_up_proj) and keeps this rank's slice under tensor parallelism.

This module must import without vLLM or a GPU (the conformance test checks it on CPU).
"""

from __future__ import annotations

# Method names are prefixed so they cannot shadow a Worker method (vLLM refuses clashes).
LOAD_METHOD = "sweet_load_weights"
WORKER_EXTENSION = "engines.vllm_worker.WeightSync"


class WeightSync:
    """Mixed into vLLM's Worker: `self.model_runner` is that worker's model runner."""

    def sweet_load_weights(self, path: str) -> int:
        """Load every tensor of the safetensors file at `path` into this worker's model;
        returns how many tensors were read (the same on every rank)."""
        from safetensors import safe_open

        model = self.model_runner.get_model()  # type: ignore[attr-defined]  # vLLM's Worker has a model_runner
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
            model.load_weights((name, f.get_tensor(name)) for name in names)
        return len(names)
