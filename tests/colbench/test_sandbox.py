"""The sandbox against hostile code: every attack is contained, fails its call, leaves no
process or file behind, and the evaluator (this pytest process) is unharmed.

Real sandboxes throughout (no mocks). Hostile tests need the full isolation this machine
offers (root, namespaces); where it is missing they are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

import colbench.scoring.sandbox as sandbox
from colbench.scoring.sandbox import CallOutcome, SandboxLimits, SandboxPool, isolation_report, run_calls

REPO = Path(__file__).resolve().parents[2]
FAST = SandboxLimits(cpu_seconds_per_call=1.0, wall_seconds_per_call=1.5, wall_seconds_total=8.0, memory_mb=256,
                     file_size_mb=2, max_processes=16, max_output_bytes=100_000)
PRELUDE = ("import os, sys, signal, time, socket, subprocess\n\ndef uid():\n    return os.getuid()\n\n"
           "def ident():\n    return os.getuid(), os.readlink('/proc/self/ns/pid')\n\n")

FULL = isolation_report()
needs_isolation = pytest.mark.skipif(not all(FULL.values()), reason=f"full isolation unavailable here: {FULL}")


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount", "true"], timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(autouse=True)
def scratch_root(monkeypatch):
    """Point the sandbox's host-side scratch dirs at a fresh dir; it must be empty after.
    (Traversable by the sandbox uid, as /tmp is, for the no-namespace fallback.)"""
    root = Path(tempfile.mkdtemp(prefix="sweet-test-scratch-", dir="/tmp"))
    root.chmod(0o711)
    monkeypatch.setattr(sandbox, "SCRATCH_BASE", str(root))
    yield root
    left = list(root.iterdir())
    shutil.rmtree(root, ignore_errors=True)
    assert left == [], "sandbox scratch dirs left behind"


def _procs_of(ident: tuple[int, str]) -> list[int]:
    """Host processes left from the sandbox identified by (uid, pid-ns link) as seen inside."""
    uid, ns = ident
    if os.geteuid() == 0 and uid != 0:  # root: every sandbox has its own uid
        return [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    if ns == os.readlink("/proc/self/ns/pid"):
        return []  # not root and no PID namespace: nothing to tell the sandbox's processes by
    out = []  # not root: the sandbox runs under our uid, in a user ns; find its PID ns members
    for p in psutil.process_iter():
        try:
            if os.readlink(f"/proc/{p.pid}/ns/pid") == ns:
                out.append(p.pid)
        except OSError:  # non-dumpable sandbox process: nested pids (NSpid) give it away
            try:
                with open(f"/proc/{p.pid}/status") as fh:
                    nspid = next(line for line in fh if line.startswith("NSpid")).split()[1:]
                if len(nspid) > 1 and p.uids().real == os.getuid():
                    out.append(p.pid)
            except (OSError, StopIteration, psutil.Error):
                pass
    return out


def assert_no_processes(ident: tuple[int, str]) -> None:
    deadline = time.monotonic() + 5.0  # the kernel tears a dead namespace down asynchronously
    while _procs_of(ident):
        assert time.monotonic() < deadline, f"processes of sandbox {ident} left behind: {_procs_of(ident)}"
        time.sleep(0.05)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another uid needs root")
def test_leftover_detector_sees_a_live_process():
    """Control for assert_no_processes: it does find a process of a given uid."""
    proc = subprocess.Popen(["sleep", "30"], user=sandbox.SANDBOX_UID_BASE - 7, group=sandbox.SANDBOX_UID_BASE - 7)
    try:
        assert proc.pid in _procs_of((sandbox.SANDBOX_UID_BASE - 7, "pid:[0]"))
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def zygote_pool():
    with SandboxPool(workers=2, limits=FAST) as pool:
        yield pool


@pytest.fixture(params=["exec", "zygote"])
def runner(request, zygote_pool):
    """Both ways a sandbox starts: a fresh interpreter (run_calls) or forked by the pool's zygote."""
    if request.param == "exec":
        return lambda source, calls: run_calls(source, calls, FAST)
    return lambda source, calls: zygote_pool.run_many([(source, calls)])[0]


def run_hostile(runner, body: str, calls: list[str]) -> tuple[tuple[int, str], list[CallOutcome]]:
    """Run PRELUDE + body; call 0 identifies the sandbox (uid, PID ns), then `calls`.
    Returns (identity, outcomes of `calls`)."""
    outs = runner(PRELUDE + body, ["ident()", *calls])
    assert outs[0].ok, outs[0]
    uid, ns = (item["value"] for item in outs[0].value["items"])
    return (uid, ns), outs[1:]


def assert_contained(uid: tuple[int, str], outs: list[CallOutcome], after_ok: bool = True) -> None:
    """The hostile call failed, the following uid() call ran, nothing is left behind."""
    assert not outs[0].ok, outs[0]
    if after_ok:
        assert outs[-1].ok and outs[-1].value["type"] == "int", outs[-1]
    assert_no_processes(uid)
    assert run_calls("def g():\n    return 41 + 1", ["g()"], FAST)[0].value == {"type": "int", "value": 42}


# ---------------------------------------------------------------- what is active here


def test_isolation_report_lists_mechanisms():
    report = isolation_report()
    for key in ("process", "isolated_interpreter", "rlimits", "drop_privileges", "net_namespace", "pid_namespace",
                "mount_namespace", "minimal_root", "no_new_privs"):
        assert key in report
    assert report["process"] and report["rlimits"]
    if os.geteuid() == 0 and _can_unshare():  # this machine can do it all: then we must
        assert all(report.values()), report


# ---------------------------------------------------------------- positive behaviour


def test_module_imports_helpers_recursion_and_print():
    source = (
        "import math\nfrom functools import lru_cache\n\nSCALE = 2\n\n"
        "def helper(x):\n    return x * SCALE\n\n"
        "@lru_cache(None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
        "def f(xs):\n    print('debug output', xs)\n    return [helper(x) for x in xs], math.sqrt(16)\n\n"
        "if __name__ == '__main__':\n    raise SystemExit('must not run')\n"
    )
    outs = run_calls(source, ["fib(30)", "f([1, 2])", "__name__ != '__main__'"], FAST)
    assert outs[0] == CallOutcome(ok=True, value={"type": "int", "value": 832040})
    assert outs[1].value == {"type": "tuple", "items": [
        {"type": "list", "items": [{"type": "int", "value": 2}, {"type": "int", "value": 4}]},
        {"type": "float", "value": 4.0}]}
    assert outs[2].value == {"type": "bool", "value": True}


def test_plain_data_encoding():
    source = "class C:\n    def __repr__(self):\n        return 'C()'\n\ncyc = []\ncyc.append(cyc)\n"
    calls = ["float('nan')", "-float('inf')", "{3, 1, 2}", "frozenset({'b', 'a'})", "{(1, 2): None}", "b'\\x00a'",
             "2 ** 40000", "1j", "C()", "cyc", "True", "len"]
    v = [o.value for o in run_calls(source, calls, FAST)]
    assert v[0] == {"type": "float", "value": "nan"} and v[1] == {"type": "float", "value": "-inf"}
    assert v[2] == {"type": "set", "items": [{"type": "int", "value": i} for i in (1, 2, 3)]}
    assert [x["value"] for x in v[3]["items"]] == ["a", "b"]
    assert v[4]["items"][0][0]["type"] == "tuple" and v[4]["items"][0][1] == {"type": "none"}
    assert v[5] == {"type": "bytes", "hex": "0061"}
    assert int(v[6]["hex"], 16) == 2 ** 40000
    assert v[7] == {"type": "complex", "real": 0.0, "imag": 1.0}
    assert v[8] == {"type": "record", "class": "solution.C", "kind": "instance", "fields": []}  # the code's own class
    assert v[9]["items"][0] == {"type": "object", "class": "builtins.list", "repr": "<cycle>"}
    assert v[10] == {"type": "bool", "value": True}
    assert v[11] == {"type": "object", "class": "builtins.builtin_function_or_method",
                     "repr": "<built-in function len>"}


def test_errors_are_reported_per_call():
    outs = run_calls("def f(x):\n    return 10 // x\n", ["f(2)", "f(0)", "g()"], FAST)
    assert outs[0].value == {"type": "int", "value": 5}
    assert outs[1].error.startswith("ZeroDivisionError")
    assert outs[2].error.startswith("NameError")
    syntax = run_calls("def f(:\n    pass\n", ["f()", "f()"], FAST)
    assert all(o.error.startswith("SyntaxError") for o in syntax)


def test_pool_runs_jobs_in_order_and_isolates_failures():
    jobs = [("def f():\n    return %d" % i, ["f()"]) for i in range(4)]
    jobs.insert(2, ("def f():\n    while True:\n        pass", ["f()"]))
    with SandboxPool(workers=2, limits=FAST) as pool:
        results = pool.run_many(jobs)
    assert [r[0].value["value"] for i, r in enumerate(results) if i != 2] == [0, 1, 2, 3]
    assert results[2][0].error == "TimeoutError"


def test_limits_validate():
    with pytest.raises(ValueError, match="wall_seconds_per_call"):
        SandboxLimits(wall_seconds_per_call=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=1)


# ---------------------------------------------------------------- hostile code

TIMER_TRICKS = {
    "busy_loop": "def f():\n    while True:\n        pass\n",
    "ignore_signals": (
        "def f():\n    for s in (signal.SIGALRM, signal.SIGPROF, signal.SIGXCPU, signal.SIGTERM):\n"
        "        signal.signal(s, signal.SIG_IGN)\n    while True:\n        pass\n"
    ),
    "swallow_timeouts": (
        "def f():\n    while True:\n        try:\n            while True:\n                pass\n"
        "        except BaseException:\n            pass\n"
    ),
    "disarm_timers_and_sleep": (
        "def f():\n    signal.setitimer(signal.ITIMER_REAL, 0)\n    signal.setitimer(signal.ITIMER_PROF, 0)\n"
        "    time.sleep(1000)\n"
    ),
}


@needs_isolation
@pytest.mark.parametrize("trick", sorted(TIMER_TRICKS))
def test_timeouts_cannot_be_dodged(trick, runner):
    uid, outs = run_hostile(runner, TIMER_TRICKS[trick], ["f()", "uid()"])
    assert outs[0].error.startswith(("TimeoutError", "sandbox crashed")), outs[0]
    assert_contained(uid, outs)


FORKS = {
    "fork_bomb": "def f():\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n",
    "setsid_escapees": (
        "def f():\n    for _ in range(4):\n        if os.fork() == 0:\n            os.setsid()\n"
        "            time.sleep(1000)\n            os._exit(0)\n    raise RuntimeError('forked')\n"
    ),
    "subprocess_background": (
        "def f():\n    subprocess.run(['sh', '-c', 'sleep 1000 & sleep 1000 &'])\n    raise RuntimeError('spawned')\n"
    ),
}


@needs_isolation
@pytest.mark.parametrize("kind", sorted(FORKS))
def test_processes_are_contained_and_reaped(kind, runner):
    uid, outs = run_hostile(runner, FORKS[kind], ["f()", "uid()"])
    assert_contained(uid, outs)


@needs_isolation
@pytest.mark.parametrize("bomb", [
    "def f():\n    return len(bytearray(10 ** 10))\n",
    "def f():\n    x = []\n    while True:\n        x.append(bytearray(10 ** 7))\n",
    "def f():\n    return len(' ' * 10 ** 10)\n",
])
def test_memory_bombs(bomb, runner):
    uid, outs = run_hostile(runner, bomb, ["f()", "uid()"])
    assert "MemoryError" in outs[0].error or outs[0].error.startswith(("sandbox crashed", "TimeoutError")), outs[0]
    assert_contained(uid, outs)


@needs_isolation
def test_files_cannot_be_written_outside_scratch(tmp_path, runner):
    tag = uuid.uuid4().hex
    targets = [f"/tmp/sweet_pwned_{tag}", f"/var/tmp/sweet_pwned_{tag}", f"/dev/shm/sweet_pwned_{tag}",
               str(REPO / f"sweet_pwned_{tag}"), str(tmp_path / f"sweet_pwned_{tag}"), f"/sweet_pwned_{tag}"]
    body = (
        f"TARGETS = {targets!r}\n\n"
        "def f():\n    for t in TARGETS:\n        try:\n            with open(t, 'w') as fh:\n"
        "                fh.write('pwned')\n        except OSError:\n            pass\n"
        "    subprocess.run(['sh', '-c', ' '.join('touch ' + t + ';' for t in TARGETS)])\n"
        "    open('scratch_file', 'w').write('fine')\n    raise RuntimeError('tried')\n"
    )
    uid, outs = run_hostile(runner, body, ["f()", "uid()"])
    for t in targets:
        assert not os.path.exists(t), f"sandbox wrote {t}"
    assert_contained(uid, outs)


@needs_isolation
def test_no_network_even_to_a_local_server(runner):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port, accepted, stop = server.getsockname()[1], [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        body = (f"def f():\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "    s.sendall(b'exfiltrated')\n    return 'connected'\n")
        uid, outs = run_hostile(runner, body, ["f()", "uid()"])
        assert outs[0].error.startswith(("OSError", "ConnectionRefusedError", "TimeoutError")), outs[0]
        time.sleep(0.3)
        assert accepted == [], "the sandbox reached a server on the host's loopback"
        assert_contained(uid, outs)
        # Control: the server really was reachable from outside the sandbox.
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        time.sleep(0.3)
        assert len(accepted) == 1
    finally:
        stop.set()
        thread.join()
        server.close()


@needs_isolation
@pytest.mark.parametrize("attack", [
    "os.kill(os.getppid(), signal.SIGKILL)",
    "os.killpg(0, signal.SIGKILL)",
    "os.killpg(os.getpgrp(), signal.SIGKILL)",
    "os.kill(1, signal.SIGKILL)",
    "os.kill(-1, signal.SIGKILL)",
    "os.kill(EVALUATOR, signal.SIGKILL)",
    "os.kill(SENTINEL, signal.SIGKILL)",
    "kill_every_pid()",
])
def test_cannot_kill_the_evaluator_or_other_processes(attack, runner):
    sentinel = subprocess.Popen(["sleep", "60"])
    try:
        body = (f"EVALUATOR, SENTINEL = {os.getpid()}, {sentinel.pid}\n\n"
                "def kill_every_pid():\n    for p in range(1, 4096):\n        if p != os.getpid():\n"
                "            try:\n                os.kill(p, signal.SIGKILL)\n            except OSError:\n"
                "                pass\n\n"
                f"def f():\n    try:\n        {attack}\n    except OSError:\n        pass\n    raise RuntimeError('tried')\n")
        uid, outs = run_hostile(runner, body, ["f()", "uid()"])
        assert sentinel.poll() is None, "the sandbox killed a host process"
        assert_contained(uid, outs)
    finally:
        sentinel.kill()
        sentinel.wait()


ESCALATIONS = {
    # A new user namespace would give capabilities back (and with them a chroot escape);
    # the kernel refuses it inside a chroot.
    "user_namespace": "libc.unshare(0x10000000) == 0",
    "chroot": "os.chroot('/tmp') is None",
    "setuid_root": "os.setuid(0) is None",
    "ptrace_init": "libc.ptrace(16, 1, 0, 0) == 0",
    "init_root_fs": "len(os.listdir('/proc/1/root')) > 0",
    "mount_tmpfs": "libc.mount(b'none', b'/tmp/work', b'tmpfs', 0, None) == 0",
    "su_binary": "subprocess.run(['su', '-c', 'id -u'], capture_output=True, timeout=5).stdout.strip() == b'0'",
}


@needs_isolation
def test_seccomp_denies_dangerous_syscalls(runner):
    # Both calls succeed for any unprivileged process without the filter.
    body = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\n"
            "def f():\n    out = []\n    for call in (lambda: libc.unshare(0), lambda: libc.ptrace(0, 0, 0, 0)):\n"
            "        ctypes.set_errno(0)\n        out.append((call(), ctypes.get_errno()))\n    return out\n")
    uid, outs = run_hostile(runner, body, ["f()"])
    pairs = [[x["value"] for x in t["items"]] for t in outs[0].value["items"]]
    assert pairs == [[-1, 1], [-1, 1]]  # EPERM from the filter


@needs_isolation
def test_privilege_escalation_fails(runner):
    checks = "".join(
        f"    try:\n        if {expr}:\n            won.append({name!r})\n    except Exception:\n        pass\n"
        for name, expr in ESCALATIONS.items()
    )
    body = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\ndef f():\n    won = []\n" + checks + "    return won\n"
    uid, outs = run_hostile(runner, body, ["f()"])
    assert outs[0] == CallOutcome(ok=True, value={"type": "list", "items": []}), outs[0]
    assert_no_processes(uid)


@pytest.mark.parametrize("exit_stmt", ["sys.exit(0)", "os._exit(0)", "raise SystemExit(0)", "raise KeyboardInterrupt",
                                       "os.close(int(sys.argv[1]))"])
def test_exiting_fails_only_that_call(exit_stmt, runner):
    body = f"def f():\n    {exit_stmt}\n    return 1\n\ndef g():\n    return 2\n"
    outs = runner(PRELUDE + body, ["g()", "f()", "g()"])
    assert outs[0].value == {"type": "int", "value": 2}
    assert not outs[1].ok, outs[1]
    assert outs[2].value == {"type": "int", "value": 2}


def test_huge_output_is_contained(runner):
    body = ("def noisy():\n    for _ in range(100):\n        print('x' * 100_000)\n        sys.stderr.write('y' * 100_000)\n"
            "    return 7\n\ndef huge():\n    return 'x' * 1_000_000\n")
    outs = runner(PRELUDE + body, ["noisy()", "huge()", "noisy()"])
    assert outs[0].value == {"type": "int", "value": 7}
    assert not outs[1].ok and "output too large" in outs[1].error
    assert outs[2].value == {"type": "int", "value": 7}


@needs_isolation
def test_cannot_read_the_reference_source(runner):
    secret = f"SWEET_SECRET_{uuid.uuid4().hex}"
    reference = f"import time\n\nSECRET = {secret!r}\n\ndef f():\n    time.sleep(3)\n    return SECRET\n"
    spy = (
        "import gc, glob\n\nNEEDLE = " + repr(secret[:12]) + " + " + repr(secret[12:]) + "\n\n"
        "def scan():\n    hits = []\n\n    def check(where, data):\n"
        "        if isinstance(data, bytes):\n            data = data.decode('latin-1')\n"
        "        if NEEDLE in data:\n            hits.append(where)\n\n"
        "    for path in glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ') + glob.glob('/proc/*/fd/*') \\\n"
        "            + glob.glob('/tmp/**', recursive=True) + glob.glob('/dev/shm/**', recursive=True) \\\n"
        "            + [REPO + '/colbench/scoring/sandbox.py', REPO + '/tasks/backend/test.jsonl', '/proc/1/mem']:\n"
        "        try:\n            with open(path, 'rb') as fh:\n                check(path, fh.read(1 << 20))\n"
        "        except OSError:\n            pass\n"
        "    check('stdin', sys.stdin.read() if not sys.stdin.closed else '')\n"
        "    check('environ', repr(dict(os.environ)))\n"
        "    check('memory', ' '.join(o for o in gc.get_objects() if isinstance(o, str)))\n"
        "    hits += [p for p in (REPO, '/work') if os.path.exists(p)]\n"
        "    return hits, sorted(os.listdir('/proc'))[:3]\n"
    ).replace("REPO", repr(str(REPO)))
    with SandboxPool(workers=1, limits=SandboxLimits(wall_seconds_per_call=5, wall_seconds_total=10)) as pool:
        ref_job = threading.Thread(target=lambda: ref_outs.extend(pool.run_many([(reference, ["f()"])])[0]))
        ref_outs: list[CallOutcome] = []
        ref_job.start()
        time.sleep(1.0)  # the reference is running, its source in its sandbox's memory
        spy_out = runner(PRELUDE + spy, ["scan()"])[0]
        ref_job.join()
        ref_out = ref_outs[0]
    assert ref_out.value == {"type": "str", "value": secret}
    assert spy_out.ok, spy_out
    hits = [x["value"] for x in spy_out.value["items"][0]["items"]]
    assert hits == [], f"the answer found the reference (or the repo) at {hits}"


def test_result_channel_garbage_fails_the_call(runner):
    body = ("def forge():\n    os.write(int(sys.argv[1]), b'{\"i\": 99, \"ok\": true}\\n')\n    return 1\n\n"
            "def deep():\n    os.write(int(sys.argv[1]), b'{\"i\": 1, \"ok\": true, \"value\": ' + b'[' * 100000 + b'\\n')\n    return 1\n")
    outs = runner(PRELUDE + body, ["forge()", "uid()"])
    assert not outs[0].ok and outs[1].ok
    outs = runner(PRELUDE + body, ["uid()", "deep()"])
    assert not outs[1].ok


# ---------------------------------------------------------------- the zygote


def _memory_contains(pid: int, needle: bytes) -> bool:
    """Scan a process's readable memory (we are root) for `needle`."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms or "[vvar" in line or "[vsyscall" in line:
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            try:
                mem.seek(lo)
                if needle in mem.read(hi - lo):
                    return True
            except (OSError, ValueError, OverflowError):
                pass
    return False


@pytest.mark.skipif(os.geteuid() != 0, reason="reading another process's memory needs root")
def test_zygote_never_holds_the_source(zygote_pool):
    secret = f"SWEET_ZYGOTE_SECRET_{uuid.uuid4().hex}"
    out = zygote_pool.run_many([(f"S = {secret!r}\n", ["S"])])[0][0]
    assert out.value == {"type": "str", "value": secret}  # it did run through the zygote
    zpid = zygote_pool._zygote._proc.pid
    assert _memory_contains(zpid, b"import")  # control: the scan sees the zygote's heap
    assert not _memory_contains(zpid, secret.encode())


def test_pool_survives_its_zygote_dying():
    with SandboxPool(workers=1, limits=FAST) as pool:
        assert pool.run_many([("x = 1", ["x"])])[0][0].ok
        pool._zygote._proc.kill()
        pool._zygote._proc.wait()
        assert pool.run_many([("x = 2", ["x"])])[0][0].value == {"type": "int", "value": 2}
        assert pool._zygote is not None  # restarted, not dropped


# ---------------------------------------------------------------- the fallback


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback's cleanup by uid needs root")
def test_fallback_without_namespaces_warns_once_and_still_contains(monkeypatch, caplog):
    monkeypatch.setenv("SWEET_SANDBOX_NO_NAMESPACES", "1")
    monkeypatch.setattr(sandbox, "_warned", False)
    body = ("import math\n\ndef f():\n    for _ in range(3):\n        if os.fork() == 0:\n            os.setsid()\n"
            "            time.sleep(1000)\n    return math.sqrt(16)\n")
    with caplog.at_level("WARNING", logger="colbench.scoring.sandbox"):
        uid, outs = run_hostile(lambda src, calls: run_calls(src, calls, FAST), body, ["f()"])
        run_calls("x = 1", ["x"], FAST)
    assert outs[0].value == {"type": "float", "value": 4.0}
    warnings = [r.getMessage() for r in caplog.records if "WEAKER" in r.getMessage()]
    assert len(warnings) == 1 and "net_namespace" in warnings[0]
    assert_no_processes(uid)  # escapees found by uid and killed


@needs_isolation
def test_fallback_without_minimal_root_still_protects_files(monkeypatch):
    monkeypatch.setenv("SWEET_SANDBOX_NO_MINIMAL_ROOT", "1")
    monkeypatch.setattr(sandbox, "_warned", True)  # this fallback's warning is not under test here
    tag = uuid.uuid4().hex
    targets = [f"/tmp/sweet_pwned_{tag}", str(REPO / f"sweet_pwned_{tag}"), f"/var/tmp/sweet_pwned_{tag}"]
    body = (f"import datetime\nTARGETS = {targets!r}\n\ndef f():\n    for t in TARGETS:\n        try:\n"
            "            open(t, 'w').close()\n        except OSError:\n            pass\n"
            "    return str(datetime.date(2020, 1, 2))\n")
    uid, outs = run_hostile(lambda src, calls: run_calls(src, calls, FAST), body, ["f()"])
    assert outs[0].value == {"type": "str", "value": "2020-01-02"}  # stdlib importable after the uid drop
    assert not any(os.path.exists(t) for t in targets)
    assert_no_processes(uid)


# ---------------------------------------------------------------- not root


NON_ROOT_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import colbench.scoring.sandbox as sb
src = '''import os, ctypes
libc = ctypes.CDLL(None, use_errno=True)
def cap_eff():
    return [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
def escapes():
    won = []
    for name, fn in (("chroot", lambda: os.chroot("/tmp")), ("umount", lambda: libc.umount2(b"/tmp", 2) == 0 or 1 / 0),
                     ("user_ns", lambda: libc.unshare(0x10000000) == 0 or 1 / 0),
                     ("mount", lambda: libc.mount(b"none", b"/tmp/work", b"tmpfs", 0, None) == 0 or 1 / 0),
                     ("read_repo", lambda: open(REPO + "/colbench/scoring/sandbox.py").read(1)),
                     ("write_repo", lambda: open(REPO + "/sweet_pwned_nonroot", "w").close())):
        try:
            fn()
            won.append(name)
        except Exception:
            pass
    return won
'''.replace("REPO", repr(sys.argv[1]))
with sb.SandboxPool(workers=1) as pool:
    outs = pool.run_many([(src, ["cap_eff()", "escapes()"])])[0]
print(json.dumps({"report": sb.isolation_report(), "outs": [o.value for o in outs]}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to become another user), setpriv and a system python3")
def copy_sandbox_package(dest: Path) -> Path:
    """The sandbox's files (stdlib only) in a fresh folder every user may read and write:
    the checkout itself may sit in a private (0700) folder another user cannot enter,
    and a writable folder makes the sandbox, not file permissions, stop the writes."""
    import colbench.scoring.sandbox as sb

    pkg = dest / "colbench" / "scoring"
    pkg.mkdir(parents=True)
    (dest / "colbench" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name in ("sandbox.py", "_sandbox_child.py"):
        shutil.copy(Path(sb.__file__).with_name(name), pkg / name)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o644)
    return dest


def test_non_root_user_gets_full_isolation_through_a_user_namespace():
    import json
    import tempfile

    root = copy_sandbox_package(Path(tempfile.mkdtemp(prefix="sweet-nonroot-", dir="/tmp")))
    try:
        proc = subprocess.run(
            ["setpriv", "--reuid=4321", "--regid=4321", "--clear-groups", "/usr/bin/python3", "-c", NON_ROOT_SCRIPT,
             str(root)], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            cwd="/")
        if proc.returncode != 0 and "user" in proc.stderr.lower() and "namespace" in proc.stderr.lower():
            pytest.skip("unprivileged user namespaces are disabled here")
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if not result["report"]["net_namespace"]:
            pytest.skip(f"unprivileged user namespaces unavailable: {result['report']}")
        assert all(result["report"].values()), result["report"]
        assert result["outs"][0] == {"type": "str", "value": "0000000000000000"}  # no capabilities at all
        # every escape failed, reading and writing the world-readable, world-writable copy included
        assert result["outs"][1] == {"type": "list", "items": []}
        assert not (root / "sweet_pwned_nonroot").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_sweep_removes_only_dead_owners_scratch_dirs(tmp_path):
    """What a SIGKILLed evaluator leaves (sweet-sandbox-<pid>-*) goes at the next start; the
    dirs of live owners, of this process and of other names stay."""
    from colbench.scoring.sandbox import sweep_stale_scratch

    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process (until reused, which the sweep then respects)
    alive = subprocess.Popen(["sleep", "60"])
    try:
        names = [f"sweet-sandbox-{dead.pid}-abc", f"sweet-sandbox-{alive.pid}-abc", f"sweet-sandbox-{os.getpid()}-abc",
                 "sweet-sandbox-old", "other-dir"]
        for name in names:
            (tmp_path / name).mkdir()
            (tmp_path / name / "work").mkdir()
        removed = sweep_stale_scratch(str(tmp_path))
    finally:
        alive.kill()
        alive.wait()
    assert removed == [str(tmp_path / names[0])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
