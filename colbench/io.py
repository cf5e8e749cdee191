"""Writing files: whole or not at all, and a full disk as one line.

Every output the project writes (episodes, leaderboards and reports, trainers' records,
checkpoints and final weights, caches) goes through one of these:

- `atomic_write(path, content)`: a file replaced whole. The content goes to a temporary
  file beside `path` (same folder, so the rename cannot cross filesystems), is fsynced
  and renamed over `path`: a reader, a crash or a full disk leaves the old file or the
  new one, never half of either. `content` is text, bytes, or a callable that writes the
  temporary path itself (`torch.save`, `safetensors`).
- `atomic_folder(path)`: the same for a folder (a saved model): written as `path.tmp`,
  then swapped in for `path`.
- `full_disk_guard(path)`: for writes that cannot be atomic (an append, a library's
  multi-file save): a disk-full error raised inside becomes `DiskFull(path)`.

A full disk is `DiskFull`, a `UserError`: the entry points (colbench.cli.run_main) print
its one line and exit with status 2, no traceback. The line names the path, says the disk
is full and how much was free, and that what was written before is kept:

    {path}: the disk is full (No space left on device; 12.0 KiB free on /mnt/out): what
    was written before is kept; free some space and rerun the same command to resume

`is_disk_full(exc)` recognises the error however a library wraps it: an OSError with
ENOSPC or EDQUOT anywhere in the exception's chain, or the OS's message inside another
library's error (safetensors raises `SafetensorError: ... No space left on device`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from pathlib import Path
from typing import Callable, Iterator, Union

from colbench.cli import UserError

Content = Union[str, bytes, Callable[[Path], None]]
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_MESSAGES = ("No space left on device", "Disk quota exceeded")
LOW_SPACE = 1 << 20  # below 1 MiB free, a writer's unexplained I/O error is taken as the full disk


class DiskFull(UserError):
    """The disk under `path` filled up while writing it (one line, exit status 2)."""

    def __init__(self, path: str | Path, cause: str = "No space left on device"):
        self.path = Path(path)
        super().__init__(f"{self.path}: the disk is full ({cause}; {free_space(self.path)}): what was written "
                         "before is kept; free some space and rerun the same command to resume")


def is_disk_full(exc: BaseException | None, path: str | Path | None = None) -> bool:
    """Whether `exc` (or an exception it was raised from) says the disk or quota is full;
    with `path`, also an I/O error of a writer that does not say why (torch.save's zip
    writer raises `RuntimeError: basic_ios::clear: iostream error`) while the disk under
    `path` has less than LOW_SPACE left."""
    if path is not None and isinstance(exc, (OSError, RuntimeError)) and free_bytes(path) < LOW_SPACE:
        return True
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return True
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        if any(m in str(exc) for m in FULL_MESSAGES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def full_disk_line(exc: BaseException) -> str | None:
    """The one line for a disk-full error that reached an entry point unconverted (the
    path from the OSError when it has one), or None when `exc` is no such error."""
    if not is_disk_full(exc):
        return None
    if isinstance(exc, DiskFull):
        return str(exc)
    err = exc
    while err is not None and not (isinstance(err, OSError) and err.filename):
        err = err.__cause__ or err.__context__
    if err is not None:
        return str(DiskFull(err.filename))
    return (f"the disk is full (No space left on device; under the working folder: {free_space(os.getcwd())}): "
            "what was written before is kept; free some space and rerun the same command to resume")


def free_space(path: str | Path) -> str:
    """'{n} free on {mount point}' for the filesystem holding `path` (or its nearest
    existing parent)."""
    p = _existing(path)
    free = free_bytes(p)
    if free < 0:
        return "free space unknown"
    mount = p
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return f"{human_bytes(free)} free on {mount}"


def free_bytes(path: str | Path) -> int:
    """Bytes free to this user on the filesystem holding `path` (-1 when unknown)."""
    try:
        return shutil.disk_usage(_existing(path)).free
    except OSError:
        return -1


def _existing(path: str | Path) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@contextlib.contextmanager
def full_disk_guard(path: str | Path) -> Iterator[None]:
    """Raise a disk-full error from the block as `DiskFull(path)`; anything else as it is."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if is_disk_full(e, path):
            raise DiskFull(path) from e
        raise


def atomic_write(path: str | Path, content: Content, *, fsync: bool = True) -> Path:
    """Replace `path` whole with `content` (module docstring); its folder is created.
    A failure leaves the old file (or none) and no temporary file; a full disk raises
    `DiskFull(path)`."""
    path = Path(path)
    with full_disk_guard(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, fd = _new_temp(path)
        try:
            if callable(content):
                os.close(fd)
                content(tmp)
                if fsync:
                    _fsync_file(tmp)
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(content.encode("utf-8") if isinstance(content, str) else content)
                    f.flush()
                    if fsync:
                        os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path


@contextlib.contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield `path.tmp` (emptied) to write a folder into; on success swap it in for `path`.
    A failure removes `path.tmp` (freeing what it took) and leaves `path` as it was; a
    full disk raises `DiskFull(path)`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with full_disk_guard(path):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)


def remove_stale(folder: str | Path, pattern: str = "*.tmp") -> list[Path]:
    """Remove what interrupted writes left in `folder` (`atomic_folder`'s `*.tmp` folders
    and `atomic_write`'s `.*.tmp` files); returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = sorted(set(folder.glob(pattern)) | set(folder.glob(f".{pattern}")))
    for p in gone:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return gone


def _new_temp(path: Path) -> tuple[Path, int]:
    """A new file beside `path`, open for writing, with the mode a plain open would give
    (0666 less the umask: tempfile.mkstemp's 0600 would change who can read the outputs)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
