"""Dump the full gradient of every parameter at each optimiser step of `sweet.train_critic`,
to compare one process with a distributed run tensor by tensor (docs/distributed.md).

    GRAD_DUMP=/tmp/g/one python scripts/probe_gradients.py ARGS...
    GRAD_DUMP=/tmp/g/z3 accelerate launch --config_file sweet/configs/deepspeed_zero3_cpu_2proc.yaml \\
        scripts/probe_gradients.py ARGS...

writes $GRAD_DUMP-step<k>.pt ({name: gradient}, from the main process) just before each
optimiser step: under DeepSpeed the reduced gradient gathered whole (safe_get_full_grad),
otherwise each parameter's .grad."""

import os
import runpy
import sys

import torch

PREFIX = os.environ["GRAD_DUMP"]
_steps = [0]


def _dump(named) -> None:
    _steps[0] += 1
    grads = {name: g.detach().clone() for name, g in named if g is not None}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(grads, f"{PREFIX}-step{_steps[0]}.pt")


if int(os.environ.get("WORLD_SIZE", "1")) == 1:
    import accelerate

    _model = {}
    _prepare = accelerate.Accelerator.prepare

    def prepare(self, *args, **kwargs):
        out = _prepare(self, *args, **kwargs)
        _model.update({"m": o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.nn.Module)})
        return out

    _adamw_step = torch.optim.AdamW.step

    def adamw_step(self, *args, **kwargs):
        _dump((n, p.grad) for n, p in _model["m"].named_parameters())
        return _adamw_step(self, *args, **kwargs)

    accelerate.Accelerator.prepare, torch.optim.AdamW.step = prepare, adamw_step
else:
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils import safe_get_full_grad

    _engine_step = DeepSpeedEngine.step

    def engine_step(self, *args, **kwargs):
        if self.is_gradient_accumulation_boundary():  # every rank joins each gather
            _dump([(n, safe_get_full_grad(p)) for n, p in self.module.named_parameters()])
        return _engine_step(self, *args, **kwargs)

    DeepSpeedEngine.step = engine_step

if __name__ == "__main__":
    sys.argv = ["sweet.train_critic", *sys.argv[1:]]
    runpy.run_module("sweet.train_critic", run_name="__main__")
