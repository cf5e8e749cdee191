"""Run untrusted Python (agent answers, and reference solutions) outside our process.

    from colbench.scoring.sandbox import SandboxPool, run_calls
    outs = run_calls("def f(x):\\n    return x * 2", ["f(2)", "f('a')"])
    # [CallOutcome(ok=True, value={'type': 'int', 'value': 4}), CallOutcome(ok=True, value={'type': 'str', ...})]
    with SandboxPool(workers=4) as pool:
        results = pool.run_many([(source, calls), ...])   # one list of CallOutcome per job

The source runs as a module (module-level imports, helpers and recursion work); each
call expression is evaluated in that module's namespace; its value is converted to a
plain-data, type-tagged JSON encoding inside the sandbox, so this process only ever
parses JSON (a rigged `__eq__` never runs here). Failures are data, never exceptions:
a timeout, crash, kill or garbage output gives failed CallOutcomes.

Libraries: the stdlib, plus the third-party libraries in `sandbox_site()` (pinned in
scripts/sandbox-libraries.txt, installed there by scripts/setup.sh: numpy, pandas, scipy,
beautifulsoup4, ...), which the sandbox sees read-only at /sandbox-site (on sys.path in
every fallback mode too). Their native thread pools (OpenBLAS, OpenMP, MKL, ...) run one
thread, so a sandbox stays within its process and memory caps on any core count.

Seeds: every sandbox runs with PYTHONHASHSEED=0 (str hashes, so set orders, are the same
in every sandbox), and `random`'s and numpy's global RNGs are seeded (0) right after
their import and again before the module body and before each call: a reference that
draws random numbers is deterministic, an answer drawing the same numbers the same way
gets the same values, and a call's result never depends on the calls before it. numpy
is imported only by code that asks for it. Not seeded: `random.SystemRandom`,
`os.urandom`, `numpy.random.default_rng()` without a seed, clocks.

Threat model and the mechanism that stops each threat (child side in _sandbox_child.py):

| threat                                    | mechanism                                              |
|-------------------------------------------|--------------------------------------------------------|
| crash/corrupt the evaluator's interpreter | separate process, `python -s -S -P` with an environment |
|                                           | built from scratch (no env vars of ours, no site, no    |
|                                           | repo or venv on sys.path); results only as JSON on a pipe|
| importing the project, torch, the venv    | sys.path = the stdlib + the allowed libraries' folder   |
|                                           | (above), grafted read-only at /sandbox-site            |
| infinite loop, signal-handler tricks      | per-call itimers in the child + parent deadline per    |
|                                           | call and per answer; RLIMIT_CPU (SIGXCPU then SIGKILL) |
| fork bomb, leftover processes             | RLIMIT_NPROC under a unique unprivileged uid; PID ns   |
|                                           | whose init dies with the group the parent kills, so the |
|                                           | kernel kills every process in it (even after setsid)   |
| memory bomb, disk filling, fd exhaustion  | RLIMIT_AS, RLIMIT_FSIZE + size-capped tmpfs, NOFILE    |
| killing the evaluator / other sandboxes   | PID ns (cannot name them) + other uid (EPERM)          |
| reading files (repo, task files holding   | mount ns + chroot into a minimal read-only root: /usr, |
| reference solutions, /work, /home)        | /etc, the stdlib dirs, /sandbox-site, 5 /dev nodes,    |
|                                           | fresh /proc                                            |
| writing files (repo, /tmp), leaving junk  | that root is read-only; scratch = private size-capped  |
|                                           | tmpfs (/tmp, /dev/shm) that dies with the namespace    |
| network (exfiltration, local services)    | new network ns: no interfaces up, not even loopback    |
| reading the reference solution            | reference and answer run in separate sandboxes; source |
|                                           | goes through stdin (never a file); fresh /proc; other  |
|                                           | uid + non-dumpable (no ptrace, no /proc/<pid>/mem)     |
| regaining root (setuid binaries, user ns, | PR_SET_NO_NEW_PRIVS; all capabilities dropped (setuid,|
| chroot escape)                            | or capset + locked securebits); no user ns in a chroot |
| kernel attack surface, inspection tools   | seccomp deny list (ptrace, bpf, io_uring, keyctl,      |
|                                           | userfaultfd, mount, unshare, ...) -> EPERM; optional   |
| secrets in the environment                | minimal environment (PATH, LANG, HOME, TMPDIR, the     |
|                                           | hash seed, one-thread settings of native thread pools) |
| flooding our memory with output           | stdout/stderr to /dev/null; result lines size-capped   |

Load: a call's wall-clock limit (`wall_seconds_per_call`) does not count the time the
sandbox was runnable but waiting for a CPU that other work held (the scheduler's run delay,
/proc/self/schedstat, less the CPU time of the sandbox's own other processes and threads, so
a fork bomb waiting behind itself is not excused): on a busy machine a correct answer would
otherwise time out in a module body that needs ~10 ms of CPU and spent its whole second in
the run queue. The parent moves its own per-call deadline by the run delay of the code's
process, read from the host's /proc (RunDelay: the kernel's figure, which starved or hostile
code can neither hold back nor forge), up to the answer's total (`wall_seconds_total`, plain
wall-clock time). Without a PID namespace and /proc of its own the per-call limit is plain
wall-clock time.

Speed: SandboxPool forks each sandbox from a pre-started "zygote" interpreter (it never
holds a job's source; every sandbox still gets fresh namespaces, uid and limits), which
skips the ~30-60 ms interpreter start; run_calls starts a fresh interpreter. The zygote
imports no library: importing numpy costs a sandbox ~0.2-0.3 s, but pre-importing it
would add ~13-15 ms to every sandbox's fork and teardown, a loss unless over ~6% of the
jobs import numpy (0.3% of the published references do; docs/benchmarks.md). Killed
sandboxes are reaped in the background. Not done: cgroups (memory is capped per
process by RLIMIT_AS, not per sandbox); seccomp is a deny list, not an allow list.

Not root: the same namespaces and minimal root are set up inside an unprivileged user
namespace, and the code under test then loses every capability (instead of switching
uid); where user namespaces are disabled, the fallback has rlimits and a process group.

Set SWEET_SANDBOX_DEBUG=1 to see the sandbox processes' stderr (setup failures), and
SWEET_SANDBOX_NO_NAMESPACES=1 to run without namespaces, SWEET_SANDBOX_NO_MINIMAL_ROOT=1
without the chroot (host root read-only instead); both weaker, both warn.

Where a mechanism is unavailable (not root, namespaces refused), one warning is logged
per process naming what is missing and the strongest remaining set is used;
`isolation_report()` says what is active. A forged result line (user code writing to
the result pipe) can only claim values; the parent compares them with the reference's,
so forging is no easier than computing the answer.
"""

from __future__ import annotations

import json
import logging
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from colbench.scoring import _sandbox_child as _child  # its constants only (stdlib, as this module)

logger = logging.getLogger(__name__)

CHILD_SCRIPT = str(Path(__file__).with_name("_sandbox_child.py"))
SANDBOX_UID_BASE = 1_000_000  # sandboxes run as uid SANDBOX_UID_BASE + n (see _sandbox_child.py)
STARTUP_GRACE_S = 10.0  # interpreter start + namespace setup, on a loaded machine (first line only)
TOTAL_SLACK_S = 3.0  # added to wall_seconds_total for starting the sandbox(es)
# Where host-side scratch dirs go (None: the system temp dir). Only the no-namespace
# fallback uses them; with namespaces the scratch is a private tmpfs.
SCRATCH_BASE: str | None = os.environ.get("SWEET_SANDBOX_SCRATCH") or None
LINE_GRACE_S = 1.0  # the child's own timer fires first; this covers reporting it
# Mechanisms whose absence is worth a warning (the rest are always on).
STRONG_MECHANISMS = ("drop_privileges", "net_namespace", "pid_namespace", "mount_namespace", "minimal_root",
                     "private_tmp", "readonly_root", "no_new_privs")


SANDBOX_SITE_ENV = "SWEET_SANDBOX_SITE"


def sandbox_site() -> Path:
    """The read-only folder of third-party libraries that sandboxed code may import
    (never the project's own site-packages): $SWEET_SANDBOX_SITE, else <sys.prefix>/sandbox-site."""
    return Path(os.environ.get(SANDBOX_SITE_ENV) or Path(sys.prefix) / "sandbox-site")


def sandbox_libraries() -> dict[str, str]:
    """{distribution name: version} of the libraries in `sandbox_site()` ({} when it is absent)."""
    out: dict[str, str] = {}
    site = sandbox_site()
    if not site.is_dir():
        return out
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        name = version = None
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.partition(":")[2].strip()
            elif line.startswith("Version:"):
                version = line.partition(":")[2].strip()
            elif not line:
                break
        if name and version:
            out[name.lower()] = version
    return out


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed answer (all its calls)."""

    cpu_seconds_per_call: float = 2.0  # CPU time per call (and the module body)
    # wall-clock time per call (and the module body), not counting time spent waiting for a CPU
    # (the module docstring, "Load"): computing, sleeping and blocking count
    wall_seconds_per_call: float = 4.0
    # wall-clock time for the whole answer, restarts included, waits for a CPU included: the
    # one limit a busy machine can exhaust; it bounds how long one answer can hold a worker
    wall_seconds_total: float = 20.0
    memory_mb: int = 512  # address space of each sandbox process
    file_size_mb: int = 8  # largest file it may write (scratch tmpfs is 4x this)
    max_processes: int = 32  # processes of the sandbox uid
    max_output_bytes: int = 1_000_000  # encoded size of one call's value

    def __post_init__(self) -> None:
        for name in ("cpu_seconds_per_call", "wall_seconds_per_call", "wall_seconds_total"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxLimits.memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}")
        for name in ("file_size_mb", "max_processes", "max_output_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class CallOutcome:
    """One call's result as plain data.

    ok:    the call returned normally.
    value: the returned value in the plain-data encoding (see colbench.scoring.backend.values_equal).
    error: "TimeoutError", "MemoryError", "SyntaxError: ...", "<ExcType>: <message>",
           "sandbox crashed: ...", or "output too large ...".
    """

    ok: bool
    value: Any = None
    error: str | None = None


def _failed(n: int, error: str) -> list[CallOutcome]:
    return [CallOutcome(ok=False, error=error) for _ in range(n)]


def run_calls(source: str, calls: Sequence[str], limits: SandboxLimits | None = None) -> list[CallOutcome]:
    """Run `source` as a module in a fresh sandbox and evaluate each call expression.

    Returns one CallOutcome per call, never raises for anything the code does. When the
    sandbox dies in the middle of call k (os._exit, a kill, a timeout it dodged), call k
    fails and the remaining calls run in a fresh sandbox, within `wall_seconds_total`.
    """
    return _run_calls(source, calls, limits or SandboxLimits(), _ExecProc)


def _run_calls(source: str, calls: Sequence[str], limits: SandboxLimits, spawner) -> list[CallOutcome]:
    calls = list(calls)
    out: list[CallOutcome] = []
    deadline = time.monotonic() + limits.wall_seconds_total + TOTAL_SLACK_S
    while len(out) < len(calls):
        if time.monotonic() >= deadline:
            out += _failed(len(calls) - len(out), "TimeoutError (answer's total time budget spent)")
            break
        got, restartable = _run_once(source, calls[len(out):], limits, deadline, spawner)
        out += got
        if not restartable:
            out += _failed(len(calls) - len(out), got[-1].error if got else "sandbox crashed")
            break
    return out


class _Channel:
    """Reads the child's JSON lines with per-line and total deadlines and a size cap."""

    def __init__(self, fd: int, max_bytes: int):
        self.fd, self.max_bytes, self.buf, self.total, self.eof = fd, max_bytes, b"", 0, False
        self.sel = selectors.DefaultSelector()
        self.sel.register(fd, selectors.EVENT_READ)

    def next_line(self, deadline: float) -> tuple[dict | None, str | None]:
        """(record, None) or (None, reason) with reason "timeout", "eof", "overflow", "garbage"."""
        while b"\n" not in self.buf:
            if self.eof:
                return None, "eof"
            # select(0) past the deadline: a line that came in time counts, however late a busy
            # machine lets us look at it
            if not self.sel.select(max(0.0, deadline - time.monotonic())):
                return None, "timeout"
            chunk = os.read(self.fd, 1 << 16)
            self.eof = not chunk
            self.buf += chunk
            self.total += len(chunk)
            if self.total > self.max_bytes:
                return None, "overflow"
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            return None, "garbage"
        return (rec, None) if isinstance(rec, dict) else (None, "garbage")

    def close(self) -> None:
        self.sel.close()
        os.close(self.fd)


SCRATCH_PREFIX = "sweet-sandbox-"
_OWNED_SCRATCH = re.compile(rf"^{SCRATCH_PREFIX}(\d+)-")
_swept = False
_sweep_lock = threading.Lock()


def new_scratch_dir() -> str:
    """A host-side scratch dir named after this process (sweet-sandbox-<pid>-*), so the
    next run can tell a dead owner's leftovers; the first call sweeps those."""
    global _swept
    with _sweep_lock:
        if not _swept:
            _swept = True
            sweep_stale_scratch()
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=SCRATCH_BASE)


def sweep_stale_scratch(base: str | None = None) -> list[str]:
    """Remove the scratch dirs a killed run left (SIGKILL skips every cleanup): ours
    (same uid) whose owner pid is gone. Live owners' dirs and others' stay."""
    base = base or SCRATCH_BASE or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = _OWNED_SCRATCH.match(entry.name)
        try:
            if not match or not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    if removed:
        logger.info("removed %d sandbox scratch dirs left by dead runs in %s", len(removed), base)
    return removed


def _pid_alive(pid: int) -> bool:
    # as colbench.outdir.pid_alive; this module imports nothing else from the project (stdlib only)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _child_config(limits: SandboxLimits, scratch: str) -> dict:
    # SWEET_SANDBOX_NO_NAMESPACES=1: skip namespaces (kernels or container runtimes that
    # misbehave with them; also how the tests exercise the fallback).
    return {**asdict(limits), "scratch_dir": os.path.join(scratch, "work"),
            "namespaces": os.environ.get("SWEET_SANDBOX_NO_NAMESPACES") != "1",
            "minimal_root": os.environ.get("SWEET_SANDBOX_NO_MINIMAL_ROOT") != "1",
            "site": os.path.realpath(sandbox_site()) if sandbox_site().is_dir() else None}


def _child_env() -> dict[str, str]:
    return dict(_child.SANDBOX_ENV)  # built from scratch: nothing from our environment


def _child_argv(*args: str) -> list[str]:
    return [sys.executable, *_child.INTERPRETER_FLAGS, CHILD_SCRIPT, *args]


def _child_stderr():
    return None if os.environ.get("SWEET_SANDBOX_DEBUG") == "1" else subprocess.DEVNULL


class _ExecProc:
    """One sandbox as a fresh interpreter (run_calls, and the pool's fallback)."""

    def __init__(self, cfg: dict, job: bytes):
        r, w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                _child_argv(str(w), json.dumps(cfg)),
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=_child_stderr(),
                pass_fds=(w,), start_new_session=True,  # own process group: killpg reaches all of it
                env=_child_env(), cwd="/",
            )
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self.pid, self.result_fd = self.proc.pid, r
        _write_job(self.proc.stdin.fileno(), job)
        self.proc.stdin.close()

    def exit_code(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.returncode is None:  # not reaped yet, so its pid (= pgid) cannot have been reused
            _killpg(self.pid)

    def release(self) -> None:
        self.proc.wait()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)  # A and B die; B was the PID ns init: the whole ns dies
    except (ProcessLookupError, PermissionError):
        pass


def _write_job(fd: int, job: bytes) -> None:
    """The source goes through a pipe: it is never written to a file anyone can read."""
    try:
        while job:
            job = job[os.write(fd, job):]
    except OSError:
        pass  # the child died at start; reading the channel reports it


def _run_once(source: str, calls: list[str], limits: SandboxLimits, deadline: float,
              spawner) -> tuple[list[CallOutcome], bool]:
    """One sandbox process. Returns the outcomes it could establish (a prefix of `calls`,
    the last one failed if the sandbox died in it) and whether a restart makes sense."""
    scratch = new_scratch_dir()  # used only without a private tmpfs
    cfg = _child_config(limits, scratch)
    start = time.monotonic()
    try:
        proc = spawner(cfg, json.dumps({"source": source, "calls": calls}).encode())
    except OSError as e:
        shutil.rmtree(scratch, ignore_errors=True)
        return _failed(len(calls), f"sandbox crashed: could not start ({e})"), False
    chan = _Channel(proc.result_fd, (len(calls) + 1) * (limits.max_output_bytes + 4096))
    out: list[CallOutcome] = []
    iso: dict = {}
    try:
        rec, why = chan.next_line(min(start + STARTUP_GRACE_S, deadline))
        if rec is None or rec.get("event") != "ready":
            return _failed(len(calls), _why_text(why or "garbage", proc)), False
        iso = rec.get("isolation") if isinstance(rec.get("isolation"), dict) else {}
        run_delay = RunDelay(proc.pid, iso)
        rec, why = _next_result(chan, limits, deadline, run_delay)
        if rec is None or rec.get("event") != "module":
            return _failed(len(calls), _why_text(why or "garbage", proc)), False
        if not rec.get("ok"):
            return _failed(len(calls), str(rec.get("error"))[:500]), False
        for i in range(len(calls)):
            rec, why = _next_result(chan, limits, deadline, run_delay)
            outcome = _parse_call(rec, i) if rec is not None else None
            if outcome is None:
                out.append(CallOutcome(ok=False, error=_why_text(why or "garbage", proc)))
                return out, why not in ("overflow",)
            out.append(outcome)
        return out, True
    finally:
        _cleanup(proc, chan, scratch, iso)
        _warn_missing(iso)


class RunDelay:
    """Seconds the untrusted code's process (C in _sandbox_child's process tree) has spent
    runnable but waiting for a CPU, from the host's /proc/<pid>/schedstat: the kernel's
    figure, which the code can neither forge nor hold back, and which grows while the
    process is starved (when it could not report anything itself). Always 0 where C or its
    schedstat cannot be found (no /proc, hidepid): the deadline is then plain wall-clock time."""

    def __init__(self, pid_a: int, iso: dict):
        pid = pid_a  # without a PID namespace the code runs in A itself; with one, in A's grandchild
        for _ in range(2 if iso.get("pid_namespace") else 0):
            kids = _read_text(f"/proc/{pid}/task/{pid}/children").split()
            if len(kids) != 1:  # (when "ready" arrives, A has one child B and B one child C)
                pid = None
                break
            pid = int(kids[0])
        self.path = f"/proc/{pid}/schedstat" if pid is not None else None

    def __call__(self) -> float:
        try:
            return int(_read_text(self.path).split()[1]) / 1e9 if self.path else 0.0
        except (IndexError, ValueError):  # gone (it exited): no wait since
            return 0.0


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _next_result(chan: _Channel, limits: SandboxLimits, deadline: float,
                 run_delay: RunDelay) -> tuple[dict | None, str | None]:
    """The next module or call record, as _Channel.next_line. Its deadline is the call's
    wall limit + LINE_GRACE_S from now, moved later by as long as the code's process has
    waited for a CPU meanwhile (the child's own wall limit does not count that time either:
    _sandbox_child._WallBudget). Never later than `deadline`, the answer's total budget,
    which counts everything."""
    start, waited0 = time.monotonic(), run_delay()
    while True:
        mine = start + limits.wall_seconds_per_call + LINE_GRACE_S
        rec, why = chan.next_line(min(mine + run_delay() - waited0, deadline))
        if why != "timeout" or time.monotonic() >= min(mine + run_delay() - waited0, deadline):
            return rec, why


def _parse_call(rec: dict, i: int) -> CallOutcome | None:
    """A call record from the child, validated; None when malformed."""
    if rec.get("i") != i or not isinstance(rec.get("ok"), bool):
        return None
    if not rec["ok"]:
        return CallOutcome(ok=False, error=str(rec.get("error"))[:500])
    value = rec.get("value")
    return CallOutcome(ok=True, value=value) if _valid_value(value) else None


def _is_float(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or x in ("nan", "inf", "-inf")


def _valid_scalar(v: dict) -> bool:
    t = v["type"]
    if t == "none":
        return True
    if t == "bool":
        return isinstance(v.get("value"), bool)
    if t == "int":
        return _is_int(v)
    if t == "float":
        return _is_float(v.get("value"))
    if t == "complex":
        return _is_float(v.get("real")) and _is_float(v.get("imag"))
    if t in ("str", "decimal"):
        return isinstance(v.get("value"), str)
    if t == "bytes":
        return isinstance(v.get("hex"), str)
    if t in _FIELD_COUNTS:
        f = v.get("value")
        return (isinstance(f, list) and len(f) == _FIELD_COUNTS[t] and all(_is_plain_int(x) for x in f)
                and (t not in ("datetime", "time") or v.get("utcoffset") is None or _is_plain_int(v["utcoffset"])))
    if t == "class":
        return isinstance(v.get("name"), str)
    return t == "object"


_FIELD_COUNTS = {"datetime": 7, "date": 3, "time": 4, "timedelta": 3}


def _is_plain_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_int(v: Any) -> bool:
    if not isinstance(v, dict) or v.get("type") != "int":
        return False
    x = v.get("value", v.get("hex"))
    return _is_plain_int(x) or (isinstance(x, str) and "hex" in v)


def _valid_items(items: Any, depth: int) -> bool:
    return isinstance(items, list) and all(_valid_value(x, depth + 1) for x in items)


def _valid_value(v: Any, depth: int = 0) -> bool:
    """Whether v is a well-formed encoding (format: _sandbox_child.py, above `encode`); it
    came from an untrusted process."""
    if depth > 200 or not isinstance(v, dict) or not isinstance(v.get("type"), str):
        return False
    if "class" in v and not isinstance(v["class"], str):
        return False
    t = v["type"]
    if t in ("list", "tuple", "set", "sequence"):
        return _valid_items(v.get("items"), depth)
    if t == "dict":
        items = v.get("items")
        return isinstance(items, list) and all(
            isinstance(kv, list) and len(kv) == 2 and _valid_value(kv[0], depth + 1) and _valid_value(kv[1], depth + 1)
            for kv in items
        )
    if t == "fraction":
        return _is_int(v.get("numerator")) and _is_int(v.get("denominator"))
    if t == "enum":
        return isinstance(v.get("name"), str) and _valid_value(v.get("value"), depth + 1)
    if t == "record":
        fields = v.get("fields")
        return isinstance(v.get("kind"), str) and isinstance(fields, list) and all(
            isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and _valid_value(f[1], depth + 1)
            for f in fields
        )
    if t == "ndarray":
        shape = v.get("shape")
        return (isinstance(v.get("dtype"), str) and isinstance(shape, list) and all(_is_plain_int(d) for d in shape)
                and _valid_items(v.get("items"), depth))
    if t == "series":
        return (isinstance(v.get("dtype"), str) and _valid_value(v.get("name"), depth + 1)
                and _valid_value(v.get("index"), depth + 1) and _valid_items(v.get("items"), depth))
    if t == "dataframe":
        cols = v.get("columns")
        return _valid_value(v.get("index"), depth + 1) and isinstance(cols, list) and all(
            isinstance(c, list) and len(c) == 3 and _valid_value(c[0], depth + 1) and isinstance(c[1], str)
            and _valid_items(c[2], depth) for c in cols
        )
    return _valid_scalar(v)


def _why_text(why: str, proc) -> str:
    if why == "timeout":
        return "TimeoutError"
    if why == "overflow":
        return "output too large"
    if why == "garbage":
        return "sandbox crashed: malformed result line"
    rc = proc.exit_code(timeout=1.0)
    if rc is None:
        return "sandbox crashed: result channel closed"
    if rc == 137:
        return "sandbox crashed: killed (SIGKILL; memory or CPU limit?)"
    return f"sandbox crashed: exit code {rc}"


def _cleanup(proc, chan: _Channel, scratch: str, iso: dict) -> None:
    """Kill the whole sandbox, whatever state it is in, and remove its scratch dir."""
    proc.kill()
    proc.release()
    chan.close()
    if iso and not iso.get("pid_namespace") and iso.get("drop_privileges"):
        _kill_uid(SANDBOX_UID_BASE + proc.pid % 3_000_000)  # no PID ns: escapees via setsid
    shutil.rmtree(scratch, ignore_errors=True)


def _kill_uid(uid: int) -> None:
    """Fallback cleanup without a PID namespace: SIGKILL every process of the sandbox uid."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


_warned = False
_warn_lock = threading.Lock()


def _warn_missing(iso: dict) -> None:
    global _warned
    missing = [m for m in ("rlimits", *STRONG_MECHANISMS) if iso and not iso.get(m)]
    if missing and not _warned:
        with _warn_lock:
            if not _warned:
                _warned = True
                logger.warning("SANDBOX IS WEAKER THAN INTENDED: %s unavailable on this machine (full isolation needs "
                               "root or unprivileged user namespaces); using the strongest fallback.",
                               ", ".join(missing))


_report: dict[str, bool] | None = None


def isolation_report() -> dict[str, bool]:
    """Which isolation mechanisms are active on this machine (probed once, by a real sandbox)."""
    global _report
    if _report is None:
        scratch = new_scratch_dir()
        cfg = _child_config(SandboxLimits(), scratch)
        proc = _ExecProc(cfg, json.dumps({"source": "", "calls": []}).encode())
        chan = _Channel(proc.result_fd, 1 << 20)
        rec, _ = chan.next_line(time.monotonic() + STARTUP_GRACE_S + 5)
        iso = rec.get("isolation", {}) if rec else {}
        _cleanup(proc, chan, scratch, iso)
        keys = ("process", "isolated_interpreter", "rlimits", *STRONG_MECHANISMS, "ipc_namespace", "private_proc",
                "seccomp")
        _report = {k: bool(iso.get(k)) for k in keys}
    return dict(_report)


class _Zygote:
    """Parent side of the pre-started zygote (see _sandbox_child.zygote): it forks one
    sandbox per job, skipping the interpreter start. Same isolation as a fresh exec: the
    forked process runs the same setup, and the zygote never holds a job's source."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        # Killed sandboxes are reaped in the background (namespace teardown takes ms);
        # until then their pids stay taken, so no killpg can hit a reused pid.
        self._to_reap: list[int] = []
        self._reap_cv = threading.Condition()
        self._reaper: threading.Thread | None = None

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                _child_argv("zygote", str(theirs.fileno())),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=_child_stderr(),
                pass_fds=(theirs.fileno(),), start_new_session=True, env=_child_env(), cwd="/",
            )
        finally:
            theirs.close()
        self._sock = ours

    def request(self, req: dict, fds: Sequence[int] = ()) -> dict:
        """One request/reply; restarts a dead zygote once before giving up (OSError)."""
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._start()
                try:
                    socket.send_fds(self._sock, [json.dumps(req).encode()], list(fds))
                    reply = self._sock.recv(1 << 16)
                    if reply:
                        return json.loads(reply)
                except OSError:
                    if attempt:
                        raise
                if attempt:
                    raise OSError("sandbox zygote died")
                self._stop()
        raise AssertionError("unreachable")

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote exits on EOF
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def reap_later(self, pid: int) -> None:
        with self._reap_cv:
            self._to_reap.append(pid)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_loop, name="sandbox-reaper", daemon=True)
                self._reaper.start()
            self._reap_cv.notify()

    def _reap_loop(self) -> None:
        while True:
            with self._reap_cv:
                while not self._to_reap:
                    self._reap_cv.wait()
                pids = list(self._to_reap)
            for pid in pids:
                try:
                    done = self.request({"cmd": "reap", "pid": pid, "block": False})["code"] is not None
                except OSError:
                    done = True  # zygote gone: init reaped its children
                if done:
                    with self._reap_cv:
                        self._to_reap.remove(pid)
                        self._reap_cv.notify_all()
            time.sleep(0.002)

    def close(self) -> None:
        deadline = time.monotonic() + 10
        with self._reap_cv:  # let the reaper finish (all were SIGKILLed: quick)
            while self._to_reap and time.monotonic() < deadline:
                self._reap_cv.wait(timeout=0.1)
        with self._lock:
            self._stop()

    def spawn(self, cfg: dict, job: bytes) -> "_ZygoteProc":
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            pid = self.request({"cmd": "fork", "cfg": cfg}, [job_r, res_w])["pid"]
        except BaseException:
            os.close(job_w)
            os.close(res_r)
            raise
        finally:
            os.close(job_r)
            os.close(res_w)
        _write_job(job_w, job)
        os.close(job_w)
        return _ZygoteProc(self, pid, res_r)


class _ZygoteProc:
    """A sandbox forked by the zygote. The zygote reaps it only when asked, so until
    `release` its pid (= its process group id) cannot be reused and killpg is safe."""

    def __init__(self, zygote: _Zygote, pid: int, result_fd: int):
        self.zygote, self.pid, self.result_fd = zygote, pid, result_fd
        self.code: int | None = None
        self.reaped = False

    def _reap(self, block: bool) -> None:
        try:
            code = self.zygote.request({"cmd": "reap", "pid": self.pid, "block": block})["code"]
        except OSError:
            code = -1  # zygote gone: its children were reparented and reaped by init
        if code is not None:
            self.code, self.reaped = (128 - code if code < 0 else code), True

    def exit_code(self, timeout: float) -> int | None:
        end = time.monotonic() + timeout
        while not self.reaped and time.monotonic() < end:
            self._reap(block=False)
            time.sleep(0.005)
        return self.code

    def kill(self) -> None:
        if not self.reaped:
            _killpg(self.pid)

    def release(self) -> None:
        if not self.reaped:
            self.zygote.reap_later(self.pid)


class SandboxPool:
    """Runs many sandboxed jobs in parallel (one sandbox per job, `workers` at a time).

    zygote: fork each sandbox from a pre-started interpreter (about 2-3x faster than a
            fresh interpreter per answer, same isolation); falls back to fresh
            interpreters if the zygote cannot run.

    A crashed, hung or killed sandbox gives failed outcomes for its job; `run_many` never
    raises for anything the code under test does.
    """

    def __init__(self, workers: int | None = None, limits: SandboxLimits | None = None, zygote: bool = True):
        if workers is not None and workers < 1:
            raise ValueError(f"SandboxPool.workers must be >= 1, got {workers}")
        self.workers = workers or os.cpu_count() or 1
        self.limits = limits or SandboxLimits()
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox")
        self._zygote = _Zygote() if zygote else None

    def _spawn(self, cfg: dict, job: bytes):
        if self._zygote is not None:
            try:
                return self._zygote.spawn(cfg, job)
            except OSError as e:
                logger.warning("sandbox zygote unavailable (%s); starting a fresh interpreter per answer", e)
                self._zygote = None
        return _ExecProc(cfg, job)

    def _run_safe(self, job: tuple[str, Sequence[str]]) -> list[CallOutcome]:
        source, calls = job
        try:
            return _run_calls(source, calls, self.limits, self._spawn)
        except Exception as e:  # noqa: BLE001 - our own bug or the OS refusing; never kill the run
            logger.exception("sandbox job failed")
            return _failed(len(calls), f"sandbox crashed: {type(e).__name__}: {e}")

    def run_many(self, jobs: Sequence[tuple[str, Sequence[str]]]) -> list[list[CallOutcome]]:
        """Run each (source, calls) job in its own sandbox; results in job order."""
        return list(self._executor.map(self._run_safe, jobs))

    def submit(self, job: tuple[str, Sequence[str]]) -> Future:
        """Run one (source, calls) job in its own sandbox; a Future of its CallOutcomes
        (jobs start in submission order; the future never raises for the code's doing)."""
        return self._executor.submit(self._run_safe, job)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._zygote is not None:
            self._zygote.close()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
