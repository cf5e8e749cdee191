"""The one JSONL record file: rows appended as work finishes, read back on resume.

Every resumable JSONL output (episodes, stage-2 candidates) is written and read here:

- `read_rows(path, parse)`: each non-empty line through `parse(dict)`; a line that does
  not parse raises ValueError naming file:line, except an unfinished LAST line (a crash
  or kill mid-write), which is skipped with a warning and, with `repair=True`, cut from
  the file so that the next append starts on a fresh line.
- `Appender(path)`: appends rows, written to the OS after every batch (a killed process
  loses at most the batch being written: its torn line is what `read_rows` repairs) and
  fsynced after it too, or at `sync()` when the caller batches the disk writes
  (`fsync=False`). A batch the disk has no room for is cut off again (the file ends with
  the last whole batch) and raises `colbench.io.DiskFull` naming the file.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from colbench.io import DiskFull, full_disk_guard, is_disk_full

T = TypeVar("T")


def read_rows(path: str | Path, parse: Callable[[dict[str, Any]], T], *, what: str = "valid record",
              repair: bool = False, numbered: bool = False) -> list[T]:
    """The file's rows, each through `parse` (see the module docstring); with `numbered`,
    (line number, row) pairs. A missing file is empty."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows: list[T] = []
    offset = 0
    for lineno, raw in enumerate(lines, 1):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
            if not isinstance(row, dict):
                raise TypeError(f"a JSON {type(row).__name__}, not an object")
            rows.append((lineno, parse(row)) if numbered else parse(row))
        except (json.JSONDecodeError, TypeError, KeyError, ValueError, UnicodeDecodeError) as e:
            is_last = all(not rest.strip() for rest in lines[lineno:])
            torn = is_last and not data.endswith(b"\n")
            if not torn:
                raise ValueError(f"{path}:{lineno}: not a {what} ({e})") from None
            warnings.warn(f"{path}:{lineno}: ignoring a truncated last line (an interrupted write)", stacklevel=2)
            if repair:
                with path.open("r+b") as f:
                    f.truncate(start)
    return rows


def cut_torn_tail(path: str | Path) -> None:
    """Drop an unfinished last line, so that appends start on a fresh line."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


class Appender:
    """Appends JSON rows to `path` (created with its folder), written to the OS at each
    `write` and fsynced after it (`fsync`) or at `sync()`/`close()`."""

    def __init__(self, path: str | Path, *, fsync: bool = True):
        self.path = Path(path)
        with full_disk_guard(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cut_torn_tail(self.path)
            # unbuffered: a failed write leaves nothing in a buffer for close() to retry
            self.f = self.path.open("ab", buffering=0)
        self.fsync = fsync

    def write(self, rows: Iterable[dict[str, Any] | str]) -> None:
        """Append rows (dicts, or lines already serialised): all of them or, on a full
        disk, none (DiskFull)."""
        data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode("utf-8")
        if not data:
            return
        start = self.f.seek(0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[self.f.write(view):]
            if self.fsync:
                os.fsync(self.f.fileno())
        except OSError as e:
            if not is_disk_full(e):
                raise
            os.ftruncate(self.f.fileno(), start)  # the rows before stay whole; frees the partial batch
            raise DiskFull(self.path) from e

    def sync(self) -> None:
        with full_disk_guard(self.path):
            os.fsync(self.f.fileno())

    def close(self) -> None:
        if self.f.closed:
            return
        try:
            self.sync()
        finally:
            self.f.close()

    def __enter__(self) -> "Appender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
