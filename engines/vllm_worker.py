"""Methods added to every vLLM GPU worker (vLLM's `worker_extension_cls` hook).

`VLLMEngine` starts vLLM with `worker_extension_cls="engines.vllm_worker.WeightSync"`;
vLLM mixes this class into its Worker in each worker process (one per tensor-parallel
rank), and `LLM.collective_rpc("sweet_load_weights", args=(path,))` runs the method in all
of them. Only a file path crosses the process boundary, so nothing needs pickling
(vLLM's multiprocess engine refuses to ship functions such as a lambda).

Each worker reads the full tensors of one safetensors shard and hands them to its model
runner's `reload_weights(weights_iterator=..., is_checkpoint_format=True)`, vLLM's own
in-place reload: the model's `load_weights` maps HF parameter names onto vLLM's fused
layers (qkv_proj, gate_up_proj) and keeps this rank's slice under tensor parallelism, and
the reload then re-runs each layer's post-load processing once all its weights arrived
(vLLM's CPU linear layers repack their weights there: loading into the repacked
parameters directly fails with `Attempted to load weight ... into parameter
(torch.Size([0]))`). A layer must therefore arrive whole in one shard
(`engines.vllm_engine.write_weight_shards` splits on layer boundaries): a layer loaded
in part is processed with the rest missing. A model runner without `reload_weights`
(older vLLM) gets the model's `load_weights`.

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

        runner = self.model_runner  # type: ignore[attr-defined]  # vLLM's Worker has a model_runner
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
            weights = ((name, f.get_tensor(name)) for name in names)
            if hasattr(runner, "reload_weights"):
                runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            else:
                runner.get_model().load_weights(weights)
        return len(names)
