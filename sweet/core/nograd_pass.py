"""The one sharded no-grad pass over items (π_ref, π_old, values, held-out scores), and the one
content-keyed reference cache.

`sharded_scores` scores items 0..n-1 without gradients, dealt over the launch's processes,
and gives every process all n values in item order. It is what the critic's π_ref and
held-out passes, the policy trainers' π_ref pass and LOOP's π_old / π_ref / value pass run.
Every process makes the same number of model calls (FSDP and ZeRO-3 gather weights inside
each call: a process with nothing left scores a dummy item and drops it).

`ReferenceCache` keeps π_ref values that a run computes once, before training, in its
output folder (`ref_logprobs.pt`) under a key of what was scored (content hash, model,
truncation): a rerun with the same key reads them back, another key or a file that does
not load (a torn write) recomputes them with a one-line note. Written beside its place and
renamed into it, so a kill never leaves half a cache.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

from colbench.io import atomic_write

REFERENCE_CACHE = "ref_logprobs.pt"


def sharded_scores(accelerator, model, n: int, score: Callable[[list[int]], Sequence[Any]], *, micro: int,
                   order: Sequence[int] | None = None, desc: str = "") -> list[Any]:
    """`score(indices)` (one value per index) for items 0..n-1, model in eval mode and no
    grad: `order` cut into calls of `micro` items, call c on process c % world (items next to
    one another in `order` share a call: the turns of one trajectory can pack into one row);
    returns all n values on every process."""
    import torch
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    if n == 0:
        return []
    order = list(range(n)) if order is None else list(order)
    world, rank = accelerator.num_processes, accelerator.process_index
    calls = [order[i:i + micro] for i in range(0, n, micro)]
    mine = calls[rank::world]
    n_calls = math.ceil(len(calls) / world)
    was_training = model.training
    model.eval()
    local: list[tuple[int, Any]] = []
    try:
        with torch.no_grad():
            for c in tqdm(range(n_calls), desc=desc, disable=not accelerator.is_main_process or not desc):
                chunk = mine[c] if c < len(mine) else []
                values = score(chunk or [order[0]])  # the dummy call keeps the processes in step
                local += list(zip(chunk, values))
    finally:
        model.train(was_training)
    gathered = gather_object(local) if world > 1 else local
    out: list[Any] = [None] * n
    for i, value in gathered:
        out[i] = value
    return out


class ReferenceCache:
    """π_ref values of one run, in `path` under `key` (see the module docstring)."""

    def __init__(self, path: str | Path, key: Any):
        self.path, self.key = Path(path), key

    def load(self, n: int, say: Callable[[str], None] = print):
        """The cached tensor of `n` rows, or None (missing, other key, does not load)."""
        import torch

        if not self.path.exists():
            return None
        try:
            blob = torch.load(self.path, weights_only=False)
            if blob["key"] == self.key and len(blob["values"]) == n:
                return blob["values"]
            say(f"{self.path} was computed for other inputs or settings; recomputing")
        except Exception as e:  # noqa: BLE001 - torn or foreign (any unpickling error): a cache, recomputed
            say(f"WARNING: {self.path} does not load ({type(e).__name__}: {e}); recomputing")
        return None

    def save(self, values) -> None:
        """Write `values` (main process only), renamed into place."""
        import torch

        blob = {"key": self.key, "values": values.detach().cpu()}
        atomic_write(self.path, lambda tmp: torch.save(blob, tmp))
