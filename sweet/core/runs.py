"""One trainer run from the command line: its output folder locked, its errors one line.

Every sweet entry point (`python -m sweet.train_critic`, `sweet.train_policy`, `testbed.demo`,
the warm start, the inspector) runs through `run_cli`:

- a user error (a bad flag or file, a config's own check, a missing model folder) ends in
  one line naming the field or file and exit code 2, no traceback (`--debug` or
  SWEET_DEBUG=1 shows it: colbench.cli.run_main);
- `trainer_run(output_dir)` holds the folder's lock (colbench.outdir: a second writer
  stops at once naming the holder; a dead one's lock is taken over), on the launch's first
  process only, and turns Ctrl-C into one line saying what was kept and how to resume
  (exit code 130).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from colbench.cli import Interrupted, run_main
from colbench.outdir import OutputLock

# what a trainer raises for input the user can fix: config checks and data errors are
# ValueError naming the field or file:line; a missing file is FileNotFoundError
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError,
                                                IsADirectoryError, PermissionError)


def first_process() -> bool:
    """Whether this is the launch's first process (RANK, as accelerate/torchrun set it)."""
    return os.environ.get("RANK", "0") == "0"


def kept(output_dir: str | Path) -> str:
    """What a stopped run in `output_dir` leaves to resume from, in words."""
    out = Path(output_dir)
    ckpts = sorted(out.glob("checkpoint-*[0-9]"), key=lambda p: int(p.name.rsplit("-", 1)[1])) if out.exists() else []
    if ckpts:
        return f"{ckpts[-1]} is kept"
    return f"nothing was checkpointed yet in {out} (what it wrote so far is kept)"


@contextmanager
def trainer_run(output_dir: str | Path, command: str) -> Iterator[None]:
    """The run's lock on `output_dir` (first process), and Ctrl-C as `Interrupted`."""
    lock = OutputLock(output_dir, command=command) if first_process() else None
    if lock is not None:
        lock.acquire()
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(f"{kept(output_dir)}; rerun the same command to resume") from None
    finally:
        if lock is not None:
            lock.release()


def run_cli(cli: Callable[[Sequence[str]], Any], *, prog: str, argv: Sequence[str] | None = None) -> int:
    """`cli(argv)` with user errors as one line (exit 2) and Ctrl-C as one line (exit 130)."""
    return run_main(cli, argv, prog=prog, user_errors=USER_ERRORS)
