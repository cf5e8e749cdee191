"""The process's memory: give back what it no longer uses.

glibc's allocator keeps the pages of freed blocks below its mmap threshold (which rises to
32 MiB as large blocks are freed) for later reuse, so after a real model's long sequences
the process holds what its tensors held at their peak, with nothing alive in them, and
sequences of varying length fragment it further. On the 2-core machine, the critic's LoRA
training on SmolLM2 (1,536-token contexts, one step of 8 micro-batches) left 8.6 GB resident
with no live tensor, and `malloc_trim(0)` brought it to 1.0 GB; at 2,048 tokens, trimmed only
between optimiser steps, the resident set still reached 17.4 GB within one step. Trimming
changes no number a model computes, only which pages are mapped; it costs the page faults
that map them again, so it is done where the freed memory is large.

`release_memory()`: everything at once (Python's cycles, CUDA's cached blocks, the C
heap's free pages), for the end of a phase: an engine closed, a trainer done.
`HeapTrimmer`: the C heap alone, between the iterations of a loop (the trainer's
micro-batches), only when the resident set has grown by more than `slack` bytes since the
last trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from functools import lru_cache

SLACK_BYTES = 1 << 30  # HeapTrimmer's default: a tiny model's steps never trim, a real model's do


@lru_cache(maxsize=1)
def _libc():
    """glibc, when the process runs on it (malloc_trim is glibc's own); else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def resident_bytes() -> int | None:
    """The process's resident set in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc); False where there is no glibc."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def release_memory() -> None:
    """Collect Python's reference cycles, empty CUDA's cache (when torch and a GPU are there)
    and trim the C heap. Call it once the objects to free are no longer referenced."""
    gc.collect()
    import sys

    torch = sys.modules.get("torch")  # never imports torch for this
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()


class HeapTrimmer:
    """Call it after each iteration of a loop. It trims the C heap when the resident set is
    more than `slack` bytes above the loop's working level: the resident set at construction,
    then the one measured one iteration after each trim (the pages one iteration maps again),
    so that growth from fragmentation is given back and the working set is not refaulted
    after every iteration."""

    def __init__(self, slack: int = SLACK_BYTES):
        self.slack = slack
        self.level = resident_bytes()
        self.trims = 0
        self._remeasure = False

    def __call__(self) -> bool:
        now = resident_bytes()
        if now is None or self.level is None:
            return False
        if self._remeasure:
            self.level, self._remeasure = now, False
            return False
        if now - self.level <= self.slack or not trim_heap():
            return False
        self.trims += 1
        self._remeasure = True
        return True
