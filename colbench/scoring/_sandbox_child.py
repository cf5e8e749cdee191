"""Child side of the sandbox (see colbench/scoring/sandbox.py for the threat model).

Run as `python -s -S -P _sandbox_child.py RESULT_FD CONFIG_JSON` (one sandbox), or as
`... zygote CTRL_FD` (a pre-started process forking one sandbox per request), with
SANDBOX_ENV as its whole environment; stdlib only (no site, no repo on sys.path; the
folder of allowed libraries, CONFIG_JSON's "site", is appended to sys.path). The parent
writes one JSON job {"source", "calls"} on stdin (the sandbox's fd 0) and closes it;
results come back as JSON lines on RESULT_FD:

    {"event": "ready", "isolation": {...}}        (sent before any untrusted code runs)
    {"event": "module", "ok": bool, "error": str|null}
    {"i": k, "ok": bool, "value": <plain-data encoding>|null, "error": str|null}

Process tree when namespaces are available (we run as root):

    A  (this script, root, own session)   unshare(NEWNS|NEWPID|NEWNET|NEWIPC), fork
    `- B  (root, pid 1 of the new PID ns)  private mounts, fork, reap, exit with C's status
       `- C  (unique unprivileged uid)     rlimits, no_new_privs, runs the untrusted code

The parent kills A's process group on timeout; B dies with it, and when a PID
namespace's init dies the kernel SIGKILLs every process in it, including anything C
forked or moved to another session. C cannot signal A or B (root, other uid).
Not root: A first enters a new user namespace (uid 0 there), and C drops every
capability instead of switching uid. Each step that the kernel refuses is recorded in
the isolation report and skipped.
"""

import ctypes
import json
import math
import os
import resource
import signal
import sys
import time
import types

# Linux constants (not all exposed by the Python 3.11 stdlib).
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x20000000, 0x40000000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_RELATIME = 4096  # statvfs flag; the others share their MS_ values
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT = 4, 38, 24, 28, 47
# SECBIT_NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE (+ their locks) and KEEP_CAPS_LOCKED:
# uid 0 inside a user namespace never (re)gains capabilities, not even by exec.
LOCKED_SECUREBITS = 0b11101111
UID_BASE = 1_000_000  # sandbox uid = UID_BASE + pid of A: unique among live sandboxes
# World-writable places that get a private, size-capped tmpfs (gone when the ns dies).
PRIVATE_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
MAX_DEPTH = 100  # nesting depth of encoded values
SEED = 0  # random's and numpy's global RNGs, before the module body and before each call
HASH_SEED = "0"  # PYTHONHASHSEED: str hashes, hence set and dict-of-str orders, alike in every sandbox
# Native thread pools of the allowed libraries (OpenBLAS, OpenMP, MKL, ...) run one thread:
# the sandbox's caps (RLIMIT_NPROC, RLIMIT_AS, its CPU time) hold whatever the core count.
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS", "GOTO_NUM_THREADS", "RAYON_NUM_THREADS")
# The whole environment of the sandbox interpreter (the parent passes nothing of its own).
# PYTHONHASHSEED is the one PYTHON* variable: the interpreter runs without -E/-I to honour
# it, and -s -S -P keep user site, site and the script's folder off sys.path instead.
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": HASH_SEED,
               **{name: "1" for name in THREAD_VARS}}
INTERPRETER_FLAGS = ("-s", "-S", "-P")

_libc = ctypes.CDLL(None, use_errno=True)
LINUX = sys.platform.startswith("linux")  # elsewhere: process, rlimits, timers only (warned)
if LINUX:
    _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


# ---------------------------------------------------------------- isolation setup


_NAMESPACES = {"net_namespace": CLONE_NEWNET, "pid_namespace": CLONE_NEWPID, "mount_namespace": CLONE_NEWNS,
               "ipc_namespace": CLONE_NEWIPC}


def _unshare(iso: dict) -> None:
    """New network ns (stops: any network, loopback included), PID ns (stops: seeing or
    signalling the evaluator and other sandboxes; guarantees cleanup of grandchildren),
    mount ns (stops: reading/writing outside the minimal root), IPC ns (stops: SysV/POSIX
    shared memory and message queues of the host). No UTS ns: changing the hostname
    needs capabilities the sandbox no longer has, and each namespace costs ~1 ms."""
    if _libc.unshare(sum(_NAMESPACES.values())) == 0:
        iso.update({k: True for k in _NAMESPACES})
        return
    for key, flag in _NAMESPACES.items():  # partial permissions: take what we can get
        iso[key] = _libc.unshare(flag) == 0


def _unshare_as_user(iso: dict) -> None:
    """Not root: the same namespaces inside a new user namespace, where we are uid 0 with
    capabilities that count only there (enough to mount and chroot). The code under test
    later loses every capability (_drop_capabilities); the read-only minimal root, not a
    uid, then protects the files of the user running the evaluator. Each step may be
    refused (user namespaces disabled, or allowed without capabilities as under Ubuntu's
    AppArmor policy): we keep whatever worked."""
    uid, gid = os.getuid(), os.getgid()
    iso["user_namespace"] = _libc.unshare(CLONE_NEWUSER) == 0
    if not iso["user_namespace"]:
        return
    try:  # without a mapping we stay an unmapped (nobody-like) user: still fine
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                           ("/proc/self/gid_map", f"0 {gid} 1")):
            with open(path, "w") as fh:
                fh.write(text)
    except OSError:
        pass
    _unshare(iso)


def _setup_mounts(iso: dict, tmpfs_mb: int, minimal: bool = True, site: str | None = None) -> None:
    """In the private mount ns (run in B, pid 1 of the new PID ns). Preferred: a minimal,
    read-only root holding only /usr, /etc, the stdlib dirs and a few /dev nodes, plus a
    private scratch tmpfs and a fresh /proc, entered with chroot (stops: reading the repo,
    task files with reference solutions, /work, /home, other users' files; writing
    anything that outlives the sandbox). Fallback: the host root remounted read-only with
    private tmpfs over the world-writable dirs. `site` (on sys.path): the allowed libraries'
    folder, grafted read-only at SITE_IN_ROOT in the minimal root (no host path shows)."""
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # our mounts never propagate to the host
    except OSError:
        iso["mount_namespace"] = False  # unusable: mounting would leak to the host, so do not
        return
    pinned = _pin_import_dirs()
    try:
        _mount_roots(iso, tmpfs_mb, minimal, pinned, site)
    finally:
        for fd in pinned.values():
            os.close(fd)


def _mount_roots(iso: dict, tmpfs_mb: int, minimal: bool, pinned: dict[str, int], site: str | None) -> None:
    try:
        if not minimal:
            raise OSError("minimal root disabled (SWEET_SANDBOX_NO_MINIMAL_ROOT)")
        _minimal_root("/tmp", tmpfs_mb, iso, pinned, site)  # staged on a fresh tmpfs over /tmp (private)
        iso["minimal_root"] = iso["private_tmp"] = iso["readonly_root"] = True
        return
    except OSError as e:
        iso["minimal_root"] = False
        iso["minimal_root_error"] = str(e)[:200]
    try:
        if iso.get("pid_namespace"):
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            iso["private_proc"] = True
    except OSError:
        iso["private_proc"] = False
    try:
        for d in PRIVATE_TMP_DIRS:
            if os.path.isdir(d):
                _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=1777")
        iso["private_tmp"] = True
        _expose_import_path(pinned)
        _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        iso["readonly_root"] = True
    except OSError:
        pass  # whatever is missing shows in the isolation report and the warning


def _pin_import_dirs() -> dict[str, int]:
    """{dir: O_PATH fd} of sys.path's directories (the stdlib's, the allowed libraries'),
    opened before our tmpfs mounts may hide them (a library folder under /tmp, say)."""
    return {d: os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for d in dict.fromkeys(sys.path)
            if os.path.isdir(d) and not os.path.islink(d)}


def _expose_import_path(pinned: dict[str, int]) -> None:
    """Fallback only. Make the stdlib importable after dropping privileges even when the
    interpreter lives in a directory the sandbox uid cannot traverse (pyenv under /root,
    mode 700): bind each sys.path dir read-only under the private /tmp and point sys.path
    there. /root itself stays closed."""
    base = "/tmp/.sandbox-python"
    os.mkdir(base, 0o755)
    new_path = []
    for i, p in enumerate(sys.path):
        if p in pinned or os.path.isdir(p):
            target = f"{base}/{i}"
            os.mkdir(target, 0o755)
            _mount(f"/proc/self/fd/{pinned[p]}" if p in pinned else p, target, None, MS_BIND | MS_REC)
            _remount_readonly(target)
            p = target
        new_path.append(p)
    sys.path[:] = new_path
    sys.path_importer_cache.clear()


ROOT_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc")
DEV_NODES = ("null", "zero", "random", "urandom", "full")
SITE_IN_ROOT = "/sandbox-site"  # where the allowed libraries' folder appears in the minimal root


def _graft(src: str, root: str, fd: int | None = None) -> None:
    """Make `src` appear, read-only, at the same path inside `root` (symlinks copied).
    `fd`: src opened before any mount (see _pin_import_dirs), bound from there."""
    dst = root + src
    if fd is None and os.path.islink(src):
        os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
        os.symlink(os.readlink(src), dst)
    elif fd is not None or os.path.isdir(src):
        os.makedirs(dst, 0o755, exist_ok=True)
        _mount(src if fd is None else f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
        _remount_readonly(dst)


def _remount_readonly(path: str) -> None:
    """Read-only bind remount keeping the mount's other flags (in a user namespace the
    kernel refuses to clear flags such as noexec or the atime mode)."""
    f = os.statvfs(path).f_flag
    keep = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    keep |= MS_RELATIME if f & ST_RELATIME else 0
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def _minimal_root(root: str, tmpfs_mb: int, iso: dict, pinned: dict[str, int], site: str | None = None) -> None:
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for d in ("/tmp", "/dev/shm"):  # the only writable places: size-capped, gone with the ns;
        os.makedirs(root + d, 0o755, exist_ok=True)  # mounted first: a graft may lie under them
        _mount("tmpfs", root + d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=1777")
    grafted: list[str] = []
    for d in ROOT_DIRS + tuple(p for p in sys.path if p != site and (p in pinned or os.path.lexists(p))):
        real = d if os.path.islink(d) else os.path.realpath(d)
        if any(real == g or real.startswith(g + "/") for g in grafted):
            continue  # already inside a grafted tree (stdlib under /usr)
        if d in pinned or os.path.lexists(d):
            _graft(d, root, pinned.get(d))
            grafted.append(real)
    if site in pinned:
        _graft(SITE_IN_ROOT, root, pinned[site])
    os.makedirs(root + "/dev", 0o755, exist_ok=True)
    for name in DEV_NODES:
        if os.path.exists("/dev/" + name):
            open(f"{root}/dev/{name}", "w").close()
            _mount("/dev/" + name, f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/proc", 0o755)
    if iso.get("pid_namespace"):
        try:  # a user namespace may not mount proc (masked host /proc): then there is none
            _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            iso["private_proc"] = True
        except OSError:
            iso["private_proc"] = False
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    if site in pinned:  # (only now: a failure above falls back to the host's paths)
        sys.path[sys.path.index(site)] = SITE_IN_ROOT
    os.chroot(root)  # C has no CAP_SYS_CHROOT after setuid: it cannot climb out
    os.chdir("/")


COMMON_MODULES = ("math", "cmath", "collections", "itertools", "functools", "operator", "re", "string", "datetime",
                  "time", "calendar", "heapq", "bisect", "random", "statistics", "decimal", "fractions", "json",
                  "typing", "dataclasses", "copy", "enum", "hashlib", "textwrap", "unicodedata", "array", "io",
                  "struct", "base64", "csv", "pathlib", "urllib.parse", "ast", "pprint", "zlib", "subprocess",
                  "socket", "glob", "shutil", "tempfile")


def _preimport() -> None:
    """Without the minimal root (fallback), the interpreter's stdlib may be unreadable once we
    drop to the sandbox uid (pyenv under /root): import the usual suspects while still root."""
    for name in COMMON_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass


def _set_rlimits(cfg: dict, n_calls: int, iso: dict) -> None:
    """Kernel-enforced caps on C and everything it forks."""
    cpu = int(math.ceil(cfg["cpu_seconds_per_call"] * (n_calls + 1))) + 1
    mb = 1024 * 1024
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # CPU spin that ignores our timers: SIGXCPU, then SIGKILL
        resource.RLIMIT_AS: (cfg["memory_mb"] * mb,) * 2,  # memory bomb -> MemoryError
        resource.RLIMIT_FSIZE: (cfg["file_size_mb"] * mb,) * 2,  # disk filling
        resource.RLIMIT_NPROC: (cfg["max_processes"],) * 2,  # fork bomb (binds: we are not root)
        resource.RLIMIT_CORE: (0, 0),  # no core dumps
        resource.RLIMIT_NOFILE: (64, 64),  # fd exhaustion
    }
    for res, val in limits.items():
        try:
            resource.setrlimit(res, val)
        except (ValueError, OSError):  # e.g. RLIMIT_AS on macOS
            iso["rlimits"] = False


def _drop_privileges(iso: dict, scratch: str) -> None:
    """Unprivileged, unique uid/gid: file permissions protect the repo and the parent;
    RLIMIT_NPROC applies; no capabilities left. no_new_privs: setuid binaries (su,
    mount) cannot give root back. Non-dumpable: other processes cannot ptrace us."""
    if os.geteuid() == 0:
        uid = UID_BASE + int(os.environ["_SANDBOX_A_PID"]) % 3_000_000  # A's pid, as the host sees it
        os.makedirs(scratch, exist_ok=True)
        if not iso.get("private_tmp"):  # fallback: scratch under the parent's 0700 tempdir
            os.chmod(os.path.dirname(scratch), 0o711)
        os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)
        os.setgroups([])
        if hasattr(os, "setresuid"):
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        else:  # macOS: setuid as root sets real, effective and saved ids
            os.setgid(uid)
            os.setuid(uid)
        iso["drop_privileges"] = True
    else:
        os.makedirs(scratch, exist_ok=True)
        iso["drop_privileges"] = False
    if LINUX:
        iso["no_new_privs"] = _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(iso: dict, scratch: str) -> None:
    """In a user namespace (not root): lose every capability for good (securebits locked,
    bounding and ambient sets cleared, capset to zero), so uid 0 of the namespace cannot
    unmount, remount, chroot or ptrace. no_new_privs and non-dumpable as for root."""
    os.makedirs(scratch, exist_ok=True)
    ok = _libc.prctl(PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0) == 0
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the last capability
    _libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    ok &= _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()) == 0  # version 3
    iso["drop_privileges"] = ok
    iso["no_new_privs"] = _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


# Syscalls the code under test never needs and that are the usual kernel attack surface or
# inspection tools; they fail with EPERM. A deny list, not an allow list: Python and
# subprocesses need many syscalls, and the namespaces/uid already do the confining.
SECCOMP_DENY = (
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "mount", "umount2", "pivot_root", "unshare", "setns", "open_by_handle_at", "name_to_handle_at",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "swapon", "swapoff",
    "reboot", "acct", "quotactl", "syslog", "fsopen", "fsmount", "fspick", "open_tree", "move_mount",
)


def _seccomp(iso: dict) -> None:
    """Install the deny-list filter (libseccomp via ctypes); optional: skipped if absent."""
    iso["seccomp"] = False
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(0x7FFF0000)  # SCMP_ACT_ALLOW by default
    if not ctx:
        return
    try:
        for name in SECCOMP_DENY:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr >= 0:
                lib.seccomp_rule_add(ctx, 0x00050000 | 1, nr, 0)  # SCMP_ACT_ERRNO(EPERM)
        iso["seccomp"] = lib.seccomp_load(ctx) == 0
    finally:
        lib.seccomp_release(ctx)


# ---------------------------------------------------------------- value encoding
#
# Format (what colbench.scoring.backend compares): every value is a JSON object whose
# "type" says how to compare it; "class" is the qualified name (module.qualname) of the
# value's type wherever it is not the plain builtin the tag names.
#
#   none | bool value | int value (or hex) | float value ("nan"/"inf"/"-inf" as strings)
#   complex real imag | str value | bytes hex | list/tuple/set items | dict items [[k, v]]
#   decimal value (str) | fraction numerator denominator (int encodings)
#   datetime/date/time value [fields as ints] utcoffset (microseconds or null)
#   timedelta value [days, seconds, microseconds]
#   class name                    a type object, by its qualified name
#   enum class name value
#   record class kind fields [[name, v]]   kind: namedtuple | dataclass | namespace | instance
#   sequence class items          collections.deque, array.array, range
#   ndarray class dtype shape items        dtype: numpy dtype kind ("i", "u", "f", ...)
#   series class dtype name index items    dataframe class index columns [[name, dtype, items]]
#   object class repr             anything else: never equal to anything (the fallback)
#
# Subclasses of the builtins (bool, int, float, complex, str, bytes, list, tuple, set,
# dict) encode as their base type, with "class" noted; enums and namedtuples are the
# exceptions. Type checks walk the real type's __mro__ (never isinstance, which consults
# a user-defined __class__), so a class that only borrows a name (module "datetime",
# qualname "datetime") is not a datetime. numpy and pandas are never imported here: their
# values are recognised only when the code under test has imported them.

MAX_ITEMS = 100_000  # elements of one numpy array / pandas object
_TYPE_MRO = type.__dict__["__mro__"].__get__  # captured before untrusted code runs
_TYPE_MODULE = type.__dict__["__module__"].__get__
_TYPE_QUALNAME = type.__dict__["__qualname__"].__get__
_BUILTIN_TAGS = ((bool, "bool"), (int, "int"), (float, "float"), (complex, "complex"), (str, "str"),
                 (bytes, "bytes"), (bytearray, "bytes"), (dict, "dict"), (list, "list"), (tuple, "tuple"),
                 (set, "set"), (frozenset, "set"))
# Bases that hold no state of their own: a class from the code under test may mix them in
# and still be compared by its fields.
_STATELESS_BASES = {"builtins.object", "abc.ABC", "typing.Generic", "typing.Protocol"}
USER_MODULE = "solution"  # the module the code under test runs as (run_job)


def qualified_name(cls) -> str:
    """module.qualname of a class, read with type's own descriptors (no user code runs)."""
    try:
        mod, qual = _TYPE_MODULE(cls), _TYPE_QUALNAME(cls)
    except Exception:  # noqa: BLE001
        return "?"
    return f"{mod if type(mod) is str else '?'}.{qual if type(qual) is str else '?'}"[:300]


def _module_class(modname: str, clsname: str):
    """A class of an already-imported module (None if the module is not loaded)."""
    mod = sys.modules.get(modname)
    cls = getattr(mod, clsname, None) if mod is not None else None
    return cls if type(cls) is type or isinstance(cls, type) else None


class EncodeLimit(ValueError):
    """A value too deep or too large to encode: the call fails (never the fallback)."""


_CONTAINERS = {list: "list", tuple: "tuple", dict: "dict", set: "set", frozenset: "set"}
_ATOMS = {type(None): lambda x: {"type": "none"}, bool: lambda x: {"type": "bool", "value": x},
          str: lambda x: {"type": "str", "value": x}}


def encode(x, depth: int = 0, seen: frozenset = frozenset()):
    """Python value -> plain-data, type-tagged JSON (format above). Runs here, in the
    sandbox: the parent never sees a live object, so a rigged __eq__ cannot fool the
    comparison. Raises EncodeLimit (a ValueError) past MAX_DEPTH levels or MAX_ITEMS
    array elements; anything else that goes wrong while reading a value (a raising
    property, __iter__, tzinfo, ...) makes that value the never-equal {"type": "object"};
    our own timeout still fails the call."""
    if depth > MAX_DEPTH:
        raise EncodeLimit("value nested too deeply")
    cls = type(x)
    atom = _ATOMS.get(cls)
    if atom is not None:
        return atom(x)
    if cls is int:
        return {"type": "int", "value": x} if x.bit_length() <= 10_000 else {"type": "int", "hex": hex(x)}
    if cls is float:
        return {"type": "float", "value": x if x - x == 0 else _enc_float(x)}  # x - x: nan for nan and inf
    if id(x) in seen:
        return {"type": "object", "class": qualified_name(cls), "repr": "<cycle>"}
    tag = _CONTAINERS.get(cls)
    if tag is not None:  # exact builtin containers: the common case, no user code to guard
        seen = seen | {id(x)}
        return _encode_builtin(x, cls, tag, lambda v: encode(v, depth + 1, seen))
    try:
        mro = _TYPE_MRO(cls)
        enc = _encode_known(x, cls, mro, depth, seen | {id(x)})
    except EncodeLimit:
        raise
    except Exception:  # noqa: BLE001 - hostile properties, __iter__, ...: fall back
        enc = None
    return enc if enc is not None else _fallback(x, cls)


def _fallback(x, cls) -> dict:
    """The one fallback: never equal to anything; the repr (capped) is only for reports."""
    try:
        r = repr(x)
    except Exception as e:  # noqa: BLE001 - untrusted __repr__
        r = f"<unrepresentable {type(e).__name__}>"
    return {"type": "object", "class": qualified_name(cls), "repr": str.__str__(r)[:1000]}


def _tagged(enc: dict, cls, builtin) -> dict:
    if cls is not builtin:
        enc["class"] = qualified_name(cls)
    return enc


def _encode_known(x, cls, mro, depth, seen):
    sub = lambda v: encode(v, depth + 1, seen)  # noqa: E731
    name = qualified_name(cls)
    enum_base = _module_class("enum", "Enum")
    if enum_base is not None and enum_base in mro:
        return {"type": "enum", "class": name, "name": str(x._name_), "value": sub(x._value_)}
    if tuple in mro and cls is not tuple:
        fields = getattr(cls, "_fields", None)
        if type(fields) is tuple and all(type(f) is str for f in fields):
            items = list(tuple.__iter__(x))
            if len(items) == len(fields):
                return {"type": "record", "class": name, "kind": "namedtuple",
                        "fields": [[f, sub(v)] for f, v in zip(fields, items)]}
    if type in mro:
        return {"type": "class", "name": qualified_name(x)}
    for base, tag in _BUILTIN_TAGS:
        if base in mro:
            return _tagged(_encode_builtin(x, base, tag, sub), cls, base)
    kind = _stdlib_kind(mro)
    if kind is not None:
        return _encode_stdlib(x, kind, name, sub)
    np_kind = _numpy_kind(mro)
    if np_kind == "scalar":
        v = x.item()
        if type(v) is cls:  # e.g. longdouble: item() gives the same type back
            v = complex(x) if x.dtype.kind == "c" else float(x)
        enc = sub(v)
        enc["class"] = name
        return enc
    if np_kind == "ndarray":
        return _encode_ndarray(x, name, sub)
    pd_kind = _pandas_kind(mro)
    if pd_kind is not None:
        return _encode_pandas(x, pd_kind, name, sub)
    fields = _record_fields(x, cls, mro)
    if fields is not None:
        kind, items = fields
        return {"type": "record", "class": name, "kind": kind, "fields": [[f, sub(v)] for f, v in items]}
    return None


def _encode_builtin(x, base, tag, sub) -> dict:
    if tag == "bool":  # bool cannot be subclassed
        return {"type": "bool", "value": x is True}
    if tag == "int":
        v = int.__int__(x)
        return {"type": "int", "hex": hex(v)} if v.bit_length() > 10_000 else {"type": "int", "value": v}
    if tag == "float":
        return {"type": "float", "value": _enc_float(float.__float__(x))}
    if tag == "complex":
        return {"type": "complex", "real": _enc_float(complex.__dict__["real"].__get__(x)),
                "imag": _enc_float(complex.__dict__["imag"].__get__(x))}
    if tag == "str":
        return {"type": "str", "value": str.__str__(x)}
    if tag == "bytes":
        return {"type": "bytes", "hex": base.hex(x)}
    if tag == "dict":
        return {"type": "dict", "items": [[sub(k), sub(v)] for k, v in list(dict.items(x))]}
    items = [sub(v) for v in list(base.__iter__(x))]
    if tag == "set":
        items.sort(key=lambda e: json.dumps(e, sort_keys=True))
    return {"type": tag, "items": items}


_STDLIB = (("datetime", "datetime", "datetime"), ("datetime", "date", "date"), ("datetime", "time", "time"),
           ("datetime", "timedelta", "timedelta"), ("decimal", "Decimal", "decimal"),
           ("fractions", "Fraction", "fraction"), ("collections", "deque", "sequence"),
           ("array", "array", "sequence"), ("builtins", "range", "sequence"),
           ("types", "SimpleNamespace", "namespace"))


def _stdlib_kind(mro):
    for mod, clsname, kind in _STDLIB:  # datetime before date: datetime is a date subclass
        c = _module_class(mod, clsname)
        if c is not None and c in mro:
            return kind
    return None


def _encode_stdlib(x, kind, name, sub) -> dict:
    if kind in _DATETIME_FIELDS:
        base = _module_class("datetime", kind)
        enc = {"type": kind, "class": name,
               "value": [int.__int__(getattr(base, f).__get__(x, base)) for f in _DATETIME_FIELDS[kind]]}
        if kind in ("datetime", "time"):
            enc["utcoffset"] = _timedelta_us(base.utcoffset(x))
        return enc
    if kind == "decimal":
        return {"type": "decimal", "class": name, "value": _module_class("decimal", "Decimal").__str__(x)}
    if kind == "fraction":
        return {"type": "fraction", "class": name, "numerator": sub(int.__int__(x.numerator)),
                "denominator": sub(int.__int__(x.denominator))}
    if kind == "sequence":
        _check_size(len(x))
        return {"type": "sequence", "class": name, "items": [sub(v) for v in list(x)]}
    # namespace: a SimpleNamespace is its attributes
    d = object.__getattribute__(x, "__dict__")
    return {"type": "record", "class": name, "kind": "namespace",
            "fields": [[str(k), sub(v)] for k, v in dict.items(d)]}


_DATETIME_FIELDS = {"datetime": ("year", "month", "day", "hour", "minute", "second", "microsecond"),
                    "date": ("year", "month", "day"), "time": ("hour", "minute", "second", "microsecond"),
                    "timedelta": ("days", "seconds", "microseconds")}


def _timedelta_us(td):
    """A timedelta (a utcoffset) in microseconds; None stays None (naive)."""
    if td is None:
        return None
    base = _module_class("datetime", "timedelta")
    days, secs, us = (int.__int__(getattr(base, f).__get__(td, base)) for f in _DATETIME_FIELDS["timedelta"])
    return (days * 86_400 + secs) * 1_000_000 + us


def _numpy_kind(mro):
    if sys.modules.get("numpy") is None:
        return None
    for c in mro:
        n = qualified_name(c)
        if n == "numpy.ndarray":
            return "ndarray"
        if n == "numpy.generic":
            return "scalar"
    return None


def _check_size(n) -> None:
    if int(n) > MAX_ITEMS:
        raise EncodeLimit(f"value too large (more than {MAX_ITEMS} elements)")


def _encode_ndarray(x, name, sub) -> dict:
    _check_size(x.size)
    shape = [int(d) for d in x.shape]
    return {"type": "ndarray", "class": name, "dtype": str(x.dtype.kind), "shape": shape,
            "items": [sub(v) for v in x.ravel().tolist()]}


def _pandas_kind(mro):
    if sys.modules.get("pandas") is None:
        return None
    for c in mro:
        n = qualified_name(c)
        if n.startswith("pandas.") and n.endswith((".Series", ".DataFrame")):
            return n.rpartition(".")[2].lower()
    return None


def _encode_pandas(x, kind, name, sub) -> dict:
    _check_size(x.size)
    index = sub(x.index.tolist())
    if kind == "series":
        return {"type": "series", "class": name, "dtype": str(x.dtype.kind), "name": sub(x.name), "index": index,
                "items": [sub(v) for v in x.tolist()]}
    columns = []
    for j, col in enumerate(x.columns.tolist()):
        s = x.iloc[:, j]
        columns.append([sub(col), str(s.dtype.kind), [sub(v) for v in s.tolist()]])
    return {"type": "dataframe", "class": name, "index": index, "columns": columns}


def _record_fields(x, cls, mro):
    """(kind, [(name, value)]) for dataclasses and for instances of classes defined by the
    code under test (module USER_MODULE, stateless mixins allowed): their state is their
    fields. None for anything else (the fallback)."""
    dc_fields = getattr(cls, "__dataclass_fields__", None)
    dataclasses = sys.modules.get("dataclasses")
    if type(dc_fields) is dict and dataclasses is not None:
        return "dataclass", [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x) if f.compare]
    for c in mro:
        n = qualified_name(c)
        if not (n.startswith(USER_MODULE + ".") or n in _STATELESS_BASES):
            return None
    items = []
    try:
        d = object.__getattribute__(x, "__dict__")
    except AttributeError:
        d = {}
    if type(d) is not dict:
        return None
    items.extend((str(k), v) for k, v in dict.items(d))
    for c in mro:
        cdict = type.__dict__["__dict__"].__get__(c)
        slots = cdict.get("__slots__", ())
        for slot in (slots,) if type(slots) is str else slots:
            if type(slot) is not str or slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):  # name mangling
                slot = "_" + _TYPE_QUALNAME(c).rpartition(".")[2].lstrip("_") + slot
            descr = cdict.get(slot)
            try:
                items.append((str(slot), descr.__get__(x, cls)))
            except AttributeError:  # slot never set
                pass
    return "instance", items


def _enc_float(f: float):
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f


# ---------------------------------------------------------------- running code


TIMER_REFIRE_S = 0.05  # a fired timer re-fires this often: code that swallows the exception is interrupted again
WAIT_RECHECK_S = 0.25  # a call past its wall limit that waited for a CPU looks again this often
SCHEDSTAT = "/proc/self/schedstat"  # "<ns on a CPU> <ns runnable but waiting for a CPU> <timeslices>"
# Captured before untrusted code runs: the wall budget must not be fooled by a patched module attribute.
_monotonic, _os_open, _os_read, _os_close = time.monotonic, os.open, os.read, os.close
_listdir, _setitimer = os.listdir, signal.setitimer
CLK_TCK = os.sysconf("SC_CLK_TCK")  # /proc/<pid>/stat's unit


def _read_proc(path: str) -> str | None:
    try:
        fd = _os_open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # gone (a process that exited), no /proc, or every fd in use (RLIMIT_NOFILE)
        return None
    try:
        return _os_read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        _os_close(fd)


def cpu_wait() -> tuple[float, float] | None:
    """(seconds this process's main thread has spent runnable but waiting for a CPU, seconds
    of CPU the sandbox's other processes and threads have used), both so far; None where they
    cannot be read (no /proc).

    The first is the scheduler's run delay (/proc/self/schedstat). The second is the CPU time
    of every process of the sandbox's PID namespace (their reaped children included) less this
    thread's own: a wait behind the sandbox's own processes (a fork bomb, a busy thread) is the
    call's own doing, not the machine's."""
    sched = _read_proc(SCHEDSTAT)
    if sched is None:
        return None
    try:
        names = _listdir("/proc")
    except OSError:
        return None
    ticks = 0
    for name in names:
        if not name.isdigit():
            continue
        stat = _read_proc(f"/proc/{name}/stat")
        if stat is None:
            continue  # it exited meanwhile: its time is in its reaper's cutime
        try:  # after "pid (comm) ": state ppid ... utime stime cutime cstime (stat fields 14-17)
            ticks += sum(int(v) for v in stat[stat.rfind(")") + 2:].split()[11:15])
        except ValueError:
            return None
    try:
        on_cpu, waiting = (int(v) / 1e9 for v in sched.split()[:2])
    except ValueError:
        return None
    return waiting, ticks / CLK_TCK - on_cpu


class _WallBudget:
    """The running call's wall-clock limit, which does not count the time the call waited
    for a CPU held by other work: on a busy machine a call gets `limit` seconds of its own
    time (computing, sleeping, blocked on I/O, or waiting behind its own processes and
    threads), however long the machine's other processes hold the cores. The parent's
    deadline for the call moves by the same waits, read from the kernel's figures for this
    process (sandbox.RunDelay); the answer's total wall-clock budget is the bound that
    counts everything. Without a PID namespace of its own (where /proc would show the host's
    processes) the limit is plain wall-clock time."""

    def __init__(self, limit: float, own_pids: bool):
        self.limit = limit
        self.start, self.wait0 = _monotonic(), cpu_wait() if own_pids else None
        self.waited = 0.0

    def left(self) -> float:
        """Seconds of the call's own time still allowed."""
        now = cpu_wait() if self.wait0 is not None else None
        if now is not None:  # the wait, less the part the sandbox's own processes can explain
            delay, others = now[0] - self.wait0[0], now[1] - self.wait0[1]
            self.waited = max(self.waited, delay - max(0.0, others))
        return self.limit - (_monotonic() - self.start - self.waited)


_budget: _WallBudget | None = None  # the running call's; None between calls (a late signal is then ignored)
_own_pids = False  # the sandbox has a PID namespace (and a /proc) of its own (run_job sets it)


class SandboxTimeout(BaseException):
    """Raised by our timers; BaseException so `except Exception` in user code misses it."""


def _on_cpu_timer(signum, frame):
    if _budget is not None:  # None: tripped as the call ended, handled after it (not an overrun)
        raise SandboxTimeout()


def _on_wall_timer(signum, frame):
    budget = _budget
    if budget is None:  # tripped as the call ended, handled after it (not an overrun)
        return
    left = budget.left()
    if left <= 0:
        raise SandboxTimeout()  # the interval timer set before keeps re-firing (TIMER_REFIRE_S)
    # Not yet: the call waited for a CPU. Look again when its own time may be spent.
    _setitimer(signal.ITIMER_REAL, max(0.001, min(left, WAIT_RECHECK_S)), TIMER_REFIRE_S)


def _arm(cfg: dict) -> None:
    # Per-call wall and CPU timers; the parent's own deadline is the last resort.
    global _budget
    signal.signal(signal.SIGALRM, _on_wall_timer)
    signal.signal(signal.SIGPROF, _on_cpu_timer)
    _budget = _WallBudget(cfg["wall_seconds_per_call"], _own_pids)
    _setitimer(signal.ITIMER_REAL, cfg["wall_seconds_per_call"], TIMER_REFIRE_S)
    _setitimer(signal.ITIMER_PROF, cfg["cpu_seconds_per_call"], TIMER_REFIRE_S)


def _disarm() -> None:
    _setitimer(signal.ITIMER_REAL, 0)
    _setitimer(signal.ITIMER_PROF, 0)


def _error_text(e: BaseException) -> str:
    if isinstance(e, SandboxTimeout):
        return "TimeoutError"
    if isinstance(e, MemoryError):
        return "MemoryError"
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    try:
        return f"{type(e).__name__}: {e}"[:500]
    except BaseException:  # noqa: BLE001
        return type(e).__name__


def _send(fd: int, record: dict, max_bytes: int) -> None:
    data = json.dumps(record, allow_nan=False)
    if len(data) > max_bytes:
        data = json.dumps({**record, "ok": False, "value": None, "error": f"output too large (> {max_bytes} bytes)"})
    buf = (data + "\n").encode()
    while buf:
        buf = buf[os.write(fd, buf):]


def _guarded(fn, cfg):
    """Run fn() under the timers; return (ok, result_or_error_text). A timer signal
    handled after fn() has returned or raised is ignored: `_budget = None` comes first on
    both paths, before any call at which Python runs signal handlers, so no SandboxTimeout
    escapes into run_job (that would kill the sandbox and fail the call as a crash)."""
    global _budget
    try:
        _arm(cfg)
        ok, res = True, fn()
    except BaseException as e:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from user code fail the call
        _budget = None
        ok, res = False, e
    _budget = None
    _disarm()
    return (True, res) if ok else (False, _error_text(res))


# ---------------------------------------------------------------- seeds

# Modules holding a global RNG -> the name of their seeding function. Seeded only when
# imported (no sandbox pays for importing numpy): right after their import, and again
# before the module body and before each call, so a call never depends on earlier ones.
SEEDED_MODULES = {"random": "seed", "numpy.random.mtrand": "seed"}  # np.random.seed is mtrand.seed


def seed_rngs() -> None:
    """Reset every imported global RNG of SEEDED_MODULES to SEED."""
    for name, fn in SEEDED_MODULES.items():
        mod = sys.modules.get(name)
        if mod is not None:
            getattr(mod, fn)(SEED)


class _SeedingLoader:
    """Wraps a SEEDED_MODULES module's loader: the module's RNG is seeded once it has loaded."""

    def __init__(self, loader, name: str):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        getattr(module, SEEDED_MODULES[self._name])(SEED)

    def __getattr__(self, attr):  # get_source, is_package, ... of the real loader
        return getattr(self._loader, attr)


class SeedOnImport:
    """Meta-path finder: the modules of SEEDED_MODULES load through a _SeedingLoader."""

    def find_spec(self, name, path=None, target=None):
        if name not in SEEDED_MODULES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _SeedingLoader(spec.loader, name)
                return spec
        return None


def run_job(fd: int, job: dict, cfg: dict, iso: dict) -> None:
    """Execute the source as a module, then each call; stream one result line each.
    random's and numpy's global RNGs start from SEED for the body and for each call."""
    global _own_pids
    _send(fd, {"event": "ready", "isolation": iso}, cfg["max_output_bytes"])
    _own_pids = bool(iso.get("pid_namespace"))
    sys.meta_path.insert(0, SeedOnImport())
    mod = types.ModuleType("solution")  # __name__ != "__main__": `if __name__ == ...` blocks stay off
    sys.modules["solution"] = mod  # dataclasses, pickle and friends look the module up
    seed_rngs()
    ok, err = _guarded(lambda: exec(compile(job["source"], "<solution>", "exec"), mod.__dict__), cfg)
    _send(fd, {"event": "module", "ok": ok, "error": None if ok else err}, cfg["max_output_bytes"])
    for i, call in enumerate(job["calls"]):
        if not ok:
            break
        seed_rngs()
        good, res = _guarded(lambda c=call: encode(eval(compile(c, "<test>", "eval"), mod.__dict__)), cfg)
        rec = {"i": i, "ok": good, "value": res if good else None, "error": None if good else res}
        _send(fd, rec, cfg["max_output_bytes"])


def _reap_until(child: int) -> int:
    """As pid 1 of the namespace: reap orphans until `child` exits; return its exit code."""
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)


def _shell_code(code: int) -> int:
    """Exit code as a shell reports it: 128 + signal number when killed by a signal."""
    return 128 - code if code < 0 else code & 0xFF


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _isolated_interpreter() -> bool:
    """Started as INTERPRETER_FLAGS say, with SANDBOX_ENV's one PYTHON* variable and hash seed."""
    f = sys.flags
    return bool(f.no_user_site and f.no_site and f.safe_path and not f.ignore_environment
                and f.hash_randomization == 0 and os.environ.get("PYTHONHASHSEED") == HASH_SEED
                and not [k for k in os.environ if k.startswith("PYTHON") and k != "PYTHONHASHSEED"])


def sandbox(fd: int, cfg: dict) -> None:
    """Process A (see the module docstring): job on fd 0, results on `fd`. Never returns."""
    job = json.loads(_read_all(0))  # read the source before anything else; then close stdin
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    iso = {"process": True, "isolated_interpreter": _isolated_interpreter(), "rlimits": True}
    os.environ.clear()
    os.environ.update({**SANDBOX_ENV, "_SANDBOX_A_PID": str(os.getpid())})
    site = cfg.get("site") if cfg.get("site") and os.path.isdir(cfg["site"]) else None
    if site:
        sys.path.append(site)  # before the mounts: they graft or expose every sys.path dir
    root = os.geteuid() == 0
    if cfg.get("namespaces", True) and LINUX:
        _unshare(iso) if root else _unshare_as_user(iso)
    scratch = cfg["scratch_dir"]
    if iso.get("pid_namespace"):
        b = os.fork()
        if b:  # A: wait for B, exit with its code
            os.close(fd)
            _, status = os.waitpid(b, 0)
            os._exit(_shell_code(os.waitstatus_to_exitcode(status)))
        # B: pid 1. Mount, then fork C and reap.
        if iso.get("mount_namespace"):
            _setup_mounts(iso, max(16, 4 * cfg["file_size_mb"]), cfg.get("minimal_root", True), site)
        c = os.fork()
        if c:
            os.close(fd)
            os._exit(_shell_code(_reap_until(c)))
    elif iso.get("mount_namespace"):
        _setup_mounts(iso, max(16, 4 * cfg["file_size_mb"]), cfg.get("minimal_root", True), site)
    # C: the untrusted code's process.
    if iso.get("private_tmp"):
        scratch = "/tmp/work"  # on the private tmpfs; else the parent's host-side scratch dir
    if root and not iso.get("minimal_root"):
        _preimport()  # fallback: the stdlib may sit where the sandbox uid cannot read it
    _set_rlimits(cfg, len(job["calls"]), iso)
    if iso.get("user_namespace"):
        _drop_capabilities(iso, scratch)
    else:
        _drop_privileges(iso, scratch)
    del os.environ["_SANDBOX_A_PID"]
    os.environ.update({"HOME": scratch, "TMPDIR": scratch})
    os.chdir(scratch)
    if LINUX:
        _seccomp(iso)
    run_job(fd, job, cfg, iso)
    os._exit(0)


def zygote(ctrl_fd: int) -> None:
    """Pre-started process that forks one A per job (saves the interpreter start).

    Requests arrive on a SOCK_SEQPACKET socket: {"cmd": "fork", "cfg"} with two fds
    (job read end, result write end), answered {"pid"}; {"cmd": "reap", "pid", "block"},
    answered {"code"} (null while still running). The zygote never sees a job's source:
    the forked A reads it from its own pipe. It reaps only on request, so a pid the
    parent may still killpg is never reused. It exits when the parent closes the socket.
    """
    import socket

    sock = socket.socket(fileno=ctrl_fd)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        except OSError:
            break
        if not msg:
            break
        req = json.loads(msg)
        if req["cmd"] == "fork":
            pid = os.fork()
            if pid == 0:  # A: must never return into this loop
                try:
                    sock.close()  # the sandbox must not talk to the zygote
                    os.setsid()  # own session and process group: the parent killpg's it
                    os.dup2(fds[0], 0)
                    os.close(fds[0])
                    sandbox(fds[1], req["cfg"])
                finally:
                    os._exit(70)
            for f in fds:
                os.close(f)
            sock.send(json.dumps({"pid": pid}).encode())
        elif req["cmd"] == "reap":
            try:
                pid, status = os.waitpid(req["pid"], 0 if req.get("block") else os.WNOHANG)
                code = os.waitstatus_to_exitcode(status) if pid else None
            except ChildProcessError:
                code = -1
            sock.send(json.dumps({"code": code}).encode())
    os._exit(0)


def main() -> None:
    if sys.argv[1] == "zygote":
        zygote(int(sys.argv[2]))
    sandbox(int(sys.argv[1]), json.loads(sys.argv[2]))


if __name__ == "__main__":
    main()
