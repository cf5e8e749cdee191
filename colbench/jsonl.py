"""The one JSONL record file: rows appended as work finishes, read back on resume.

Every resumable JSONL output (episodes, stage-2 candidates) is written and read here:

- `read_rows(path, parse)`: each non-empty line through `parse(dict)`; a line that does
  not parse raises ValueError naming file:line, except an unfinished LAST line (a crash
  or kill mid-write), which is skipped with a warning and, with `repair=True`, cut from
  the file so that the next append starts on a fresh line.
- `Appender(path)`: appends rows, flushed after every batch (a killed process loses at
  most the batch being written: its torn line is what `read_rows` repairs) and fsynced
  after it too, or at `sync()` when the caller batches the disk writes (`fsync=False`).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

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
    """Appends JSON rows to `path` (created with its folder), flushed after each `write`
    and fsynced after it (`fsync`) or at `sync()`/`close()`."""

    def __init__(self, path: str | Path, *, fsync: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut_torn_tail(self.path)
        self.fsync = fsync
        self.f = self.path.open("a", encoding="utf-8")

    def write(self, rows: Iterable[dict[str, Any] | str]) -> None:
        """Append rows (dicts, or lines already serialised) and flush them."""
        text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
        if text:
            self.f.write(text)
            self.f.flush()
            if self.fsync:
                os.fsync(self.f.fileno())

    def sync(self) -> None:
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.sync()
        self.f.close()

    def __enter__(self) -> "Appender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
