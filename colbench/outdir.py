"""One writer per output folder.

    from colbench.outdir import OutputLock
    with OutputLock(out_dir, command="python -m colbench.evaluate"):
        ...   # write episodes, checkpoints, reports

The lock is `DIR/.lock`, held with `flock` and holding who holds it (pid, host, start
time, command). A second writer stops at once with `FolderLocked` (a UserError: one
line, exit code 2) naming the holder. The kernel drops a flock when its process dies,
even by SIGKILL, so a dead writer never blocks the folder: the next one takes the lock
over and warns (`StaleLockWarning`) naming the dead holder. The file is removed on a
clean release.

Where the filesystem refuses flock (some network mounts), the recorded pid decides:
on the same host, a live pid holds the folder and a dead one is taken over; a holder
recorded on another host is trusted to be alive (remove DIR/.lock by hand if it is not).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from colbench.cli import UserError
from colbench.io import full_disk_guard

LOCK_NAME = ".lock"


class FolderLocked(UserError):
    """Another live process writes into this folder."""


class StaleLockWarning(UserWarning):
    """A lock left by a process that is gone was taken over."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a folder's lock."""

    pid: int
    host: str
    started: str  # UTC, ISO 8601
    command: str = ""

    def describe(self) -> str:
        what = f" ({self.command})" if self.command else ""
        return f"pid {self.pid} on {self.host}, started {self.started}{what}"

    @classmethod
    def me(cls, command: str) -> "Holder":
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        return cls(os.getpid(), socket.gethostname(), started, command)


def _read_holder(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 16)
    try:
        d = json.loads(raw)
        return Holder(int(d["pid"]), str(d["host"]), str(d["started"]), str(d.get("command", "")))
    except (ValueError, KeyError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


class OutputLock:
    """The lock of one output folder (created if missing); a context manager."""

    def __init__(self, folder: str | Path, *, command: str | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.command = command if command is not None else " ".join(Path(a).name if i == 0 else a
                                                                   for i, a in enumerate(sys.argv))[:300]
        self._fd: int | None = None

    def acquire(self) -> "OutputLock":
        """Take the lock, or raise FolderLocked naming the live holder (UserError when the
        folder cannot be created or written)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"output folder {self.folder}: cannot create it ({e.strerror or e})") from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise UserError(f"output folder {self.folder}: cannot write in it ({e.strerror or e})") from None
            try:
                locked = self._flock(fd)
                if not self._same_file(fd):
                    continue  # the holder removed the file as we opened it: try the new one
                old = _read_holder(fd)
                if not locked and old is not None and old.pid != os.getpid() and self._held_by(old):
                    raise FolderLocked(self._message(old))
                if old is not None and old.pid != os.getpid():
                    gone = "that process is gone" if old.host == socket.gethostname() else "its lock was released"
                    warnings.warn(f"{self.folder}: took over the stale lock of {old.describe()}: {gone}",
                                  StaleLockWarning, stacklevel=2)
                with full_disk_guard(self.path):
                    self._write(fd, Holder.me(self.command))
                self._fd, fd = fd, -1
                return self
            finally:
                if fd != -1:
                    os.close(fd)

    def _flock(self, fd: int) -> bool:
        """True when flock holds the folder; False where the filesystem has no flock.
        FolderLocked when another process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            raise FolderLocked(self._message(_read_holder(fd))) from None
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return False
            raise

    def _same_file(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    @staticmethod
    def _held_by(holder: Holder) -> bool:
        """Without flock: whether the recorded holder still runs (other hosts: assumed)."""
        return holder.host != socket.gethostname() or pid_alive(holder.pid)

    def _message(self, holder: Holder | None) -> str:
        who = holder.describe() if holder else "another process (its lock file is being written)"
        return (f"output folder {self.folder} is in use by {who}; wait for it to finish or use another folder "
                f"(if that process is gone, remove {self.path})")

    @staticmethod
    def _write(fd: int, holder: Holder) -> None:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(asdict(holder)) + "\n").encode())
        os.fsync(fd)

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        try:
            if self._same_file(self._fd):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
