"""The sandbox's allowed libraries, its interpreter flags and environment, and its seeds.

Real sandboxes throughout. Tests of the installed libraries skip when scripts/setup.sh has
not installed them (`sandbox_site()` absent); the published rows' test is slow-marked and
skips without ../shared/data/colbench-test/.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

import colbench.scoring.sandbox as sandbox
from colbench.scoring import _sandbox_child as child
from colbench.scoring.backend import ReferenceCache, score_backend, values_equal
from colbench.scoring.sandbox import SandboxLimits, SandboxPool, run_calls, sandbox_libraries, sandbox_site
from colbench.types import Task

REPO = Path(__file__).resolve().parents[2]
PINS = REPO / "scripts" / "sandbox-libraries.txt"
PUBLISHED = REPO.parent / "shared" / "data" / "colbench-test" / "backend_test.jsonl"
DEFAULT = SandboxLimits()  # the libraries must work under the default memory cap
FULL = sandbox.isolation_report()
needs_isolation = pytest.mark.skipif(not all(FULL.values()), reason=f"full isolation unavailable here: {FULL}")
needs_libraries = pytest.mark.skipif(
    not {"numpy", "beautifulsoup4"} <= set(sandbox_libraries()),
    reason=f"no sandbox libraries at {sandbox_site()} (scripts/setup.sh installs them)")


def value(outcome):
    """The plain Python value of a CallOutcome holding str/int/float/bool/list/tuple/dict."""
    assert outcome.ok, outcome
    return _plain(outcome.value)


def _plain(v):
    if v["type"] in ("list", "tuple", "set"):
        return [_plain(x) for x in v["items"]]
    if v["type"] == "dict":
        return {_plain(k): _plain(x) for k, x in v["items"]}
    if v["type"] == "none":
        return None
    return v["value"]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=DEFAULT) as p:
        yield p


@pytest.fixture(params=["exec", "zygote"])
def runner(request, pool):
    """Both ways a sandbox starts: a fresh interpreter (run_calls) or forked by the pool's zygote."""
    if request.param == "exec":
        return lambda source, calls: run_calls(source, calls, DEFAULT)
    return lambda source, calls: pool.run_many([(source, calls)])[0]


@pytest.fixture
def fake_site(monkeypatch):
    """A library folder of our own under /tmp (where the sandbox mounts its scratch), as
    $SWEET_SANDBOX_SITE: one module that reports where it was loaded from."""
    site = Path(tempfile.mkdtemp(prefix="sweet-test-site-", dir="/tmp"))
    (site / "sweet_fake_lib.py").write_text("import os\n\nWHERE = os.path.dirname(__file__)\n")
    site.chmod(0o755)
    (site / "sweet_fake_lib.py").chmod(0o644)
    monkeypatch.setenv(sandbox.SANDBOX_SITE_ENV, str(site))
    yield site
    shutil.rmtree(site, ignore_errors=True)


# ---------------------------------------------------------------- the interpreter and its environment


def test_interpreter_flags_and_an_environment_built_from_scratch(monkeypatch):
    """No -I/-E (PYTHONHASHSEED must count), yet no site, no user site, no script dir on
    sys.path, and nothing of our environment: PYTHON* variables of ours are ignored."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("PYTHONSTARTUP", str(REPO / "sweet_startup.py"))
    monkeypatch.setenv("PYTHONHASHSEED", "12345")
    monkeypatch.setenv("SWEET_SECRET_TOKEN", "do-not-leak")
    source = ("import os, sys\n\ndef flags():\n    f = sys.flags\n    return [f.isolated, f.ignore_environment, "
              "f.no_user_site, f.no_site, f.safe_path, f.hash_randomization]\n")
    calls = ["flags()", "dict(os.environ)", "[p for p in sys.path if 'python3' not in p and not p.endswith('.zip')]"]
    with SandboxPool(workers=1, limits=DEFAULT) as fresh_pool:  # a zygote started under this environment
        for outs in (run_calls(source, calls, DEFAULT), fresh_pool.run_many([(source, calls)])[0]):
            assert value(outs[0]) == [0, 0, 1, 1, True, 0]
            env = value(outs[1])
            assert env == {**child.SANDBOX_ENV, "HOME": "/tmp/work", "TMPDIR": "/tmp/work"}
            assert [k for k in env if k.startswith("PYTHON")] == ["PYTHONHASHSEED"]
            assert value(outs[2]) == (["/sandbox-site"] if sandbox_site().is_dir() else [])
    assert sandbox.isolation_report()["isolated_interpreter"]


@needs_libraries
def test_torch_and_the_project_stay_invisible(runner):
    source = ("import importlib\n\ndef importable(name):\n    try:\n        importlib.import_module(name)\n"
              "        return True\n    except ImportError:\n        return False\n")
    names = ["torch", "colbench", "sweet", "transformers", "pytest", "numpy", "bs4"]
    outs = runner(source, [f"importable({n!r})" for n in names])
    assert dict(zip(names, map(value, outs))) == {n: n in ("numpy", "bs4") for n in names}


# ---------------------------------------------------------------- the libraries


@needs_libraries
def test_numpy_and_bs4_work_under_the_default_memory_cap(runner):
    source = (
        "import numpy as np\nfrom bs4 import BeautifulSoup\n\n"
        "def solve():\n    a = np.array([[3.0, 1.0], [1.0, 2.0]])\n"
        "    return np.linalg.solve(a, np.array([9.0, 8.0])).tolist()\n\n"
        "def corr():\n    return np.corrcoef([0.1, 0.2, 0.3], [0.2, 0.4, 0.7])[0, 1]\n\n"
        "def scripts(html):\n    return [s.get('src') for s in BeautifulSoup(html, 'html.parser').find_all('script')]\n"
    )
    outs = runner(source, ["solve()", "corr()", "scripts('<script src=\"a.js\"></script><p><script src=\"b.js\">')"])
    assert value(outs[0]) == pytest.approx([2.0, 3.0])
    assert value(outs[1]) == pytest.approx(0.9933992677987828)
    assert value(outs[2]) == ["a.js", "b.js"]


@needs_libraries
def test_native_thread_pools_run_one_thread(runner):
    """OpenBLAS would start a thread per core at import; pinned, the process keeps one."""
    source = ("import os\nimport numpy as np\n\n"
              "def threads():\n    a = np.ones((300, 300))\n    (a @ a).sum()\n"
              "    return [l.split()[1] for l in open('/proc/self/status') if l.startswith('Threads')][0]\n")
    outs = runner(source, ["threads()", "[os.environ[v] for v in " + repr(list(child.THREAD_VARS)) + "]"])
    assert value(outs[0]) == "1"
    assert set(value(outs[1])) == {"1"}


@needs_libraries
@needs_isolation
def test_the_library_folder_is_read_only_and_hides_its_host_path(runner):
    source = ("import os, numpy\n\ndef write():\n    for d in (os.path.dirname(numpy.__file__), '/sandbox-site'):\n"
              "        try:\n            open(d + '/sweet_pwned', 'w').close()\n            return d\n"
              "        except OSError:\n            pass\n    return None\n")
    outs = runner(source, ["write()", "numpy.__file__", f"os.path.exists({str(REPO.parent)!r})"])
    assert value(outs[0]) is None
    assert value(outs[1]) == "/sandbox-site/numpy/__init__.py"
    assert value(outs[2]) is False
    assert not list(sandbox_site().rglob("sweet_pwned"))


@needs_libraries
def test_the_installed_libraries_are_the_pinned_ones():
    pins = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    assert {k.replace("_", "-"): v for k, v in sandbox_libraries().items()} == pins


@pytest.mark.parametrize("fallback", ["", "SWEET_SANDBOX_NO_MINIMAL_ROOT", "SWEET_SANDBOX_NO_NAMESPACES"])
def test_a_library_folder_anywhere_is_importable_in_every_mode(fallback, fake_site, monkeypatch):
    """The folder is on sys.path with the minimal root, without it and without namespaces,
    even under /tmp, where the sandbox mounts its private scratch."""
    if fallback:
        monkeypatch.setenv(fallback, "1")
        monkeypatch.setattr(sandbox, "_warned", True)  # the fallback's warning is not under test here
    outs = run_calls("import sweet_fake_lib\n", ["sweet_fake_lib.WHERE"], DEFAULT)
    where = value(outs[0])
    if not fallback and FULL["minimal_root"]:
        assert where == "/sandbox-site"
    else:
        assert where.endswith(fake_site.name) or where.startswith("/tmp/.sandbox-python/"), where


# ---------------------------------------------------------------- seeds


SEEDED = (
    "import random\n\nAT_IMPORT = random.random()\n\n"
    "def draw():\n    return [random.random(), random.randint(1, 10 ** 9), random.choice('abcdefgh')]\n\n"
    "def np_draw():\n    import numpy as np\n    return [np.random.random(), int(np.random.randint(10 ** 9))]\n"
)


def test_hash_seed_is_the_same_in_every_sandbox(pool):
    source = "WORDS = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta', 'theta']\n"
    calls = ["hash('abc')", "list(set(WORDS))", "list({w: 1 for w in set(WORDS)})"]
    runs = [run_calls(source, calls, DEFAULT), run_calls(source, calls, DEFAULT), pool.run_many([(source, calls)])[0],
            pool.run_many([(source, calls)])[0]]
    first = [value(o) for o in runs[0]]
    assert all([value(o) for o in r] == first for r in runs[1:])
    assert first[1] != sorted(first[1])  # a real hash order, not sorted by chance (the same in every run)


def test_random_is_seeded_before_the_body_and_each_call(runner):
    outs = runner(SEEDED, ["AT_IMPORT", "draw()", "draw()", "AT_IMPORT"])
    import random

    rng = random.Random(child.SEED)
    assert value(outs[0]) == rng.random()
    assert value(outs[1]) == value(outs[2])  # each call starts from the same seed
    rng.seed(child.SEED)
    assert value(outs[1]) == [rng.random(), rng.randint(1, 10 ** 9), rng.choice("abcdefgh")]


@needs_libraries
def test_numpy_is_seeded_when_imported_inside_a_call(runner):
    outs = runner(SEEDED, ["np_draw()", "np_draw()", "draw()"])
    assert value(outs[0]) == value(outs[1])
    assert value(outs[0])[0] == 0.5488135039273248  # numpy's first draw after seed(0)
    # numpy imported at module level, drawn in the body and in calls: the same numbers
    outs = runner("import numpy as np\n\nX = np.random.random()\n", ["X", "np.random.random()", "np.random.random()"])
    assert [value(o) for o in outs] == [0.5488135039273248] * 3


def test_numpy_is_not_imported_by_the_seeding(runner):
    outs = runner("import sys\n", ["'numpy' in sys.modules", "'random' in sys.modules"])
    assert [value(o) for o in outs] == [False, False]


def test_a_reference_drawing_random_numbers_passes_against_the_same_answer(pool):
    """The reference and the answer run in separate sandboxes with the same seeds."""
    hidden = SEEDED + "\ndef f(n):\n    return [random.randint(1, 6) for _ in range(n)]\n"
    task = Task(task_id="dice", env="backend", description="", hidden=hidden, tests=("f(5)", "f(20)", "draw()"))
    same = "import random\n\ndef f(n):\n    return [random.randint(1, 6) for _ in range(n)]\n\ndef draw():\n" \
           "    return [random.random(), random.randint(1, 10 ** 9), random.choice('abcdefgh')]\n"
    other = same.replace("random.randint(1, 6)", "int(random.random() * 6) + 1")
    scores = score_backend([task, task], [same, other], pool, cache=ReferenceCache())
    assert scores[0].reward == 1.0 and scores[0].success
    assert scores[1].reward < 1.0  # drawing differently still differs


# ---------------------------------------------------------------- the published rows


PUBLISHED_ROWS = (119, 215, 265, 742, 840)  # numpy, bs4, unseeded random, numpy, numpy (1-based lines)


@pytest.mark.slow
@needs_libraries
@pytest.mark.skipif(not PUBLISHED.exists(), reason=f"{PUBLISHED} absent")
def test_published_references_that_need_libraries_or_seeds_run_twice_alike():
    lines = PUBLISHED.read_text().splitlines()
    for row in PUBLISHED_ROWS:
        rec = json.loads(lines[row - 1])
        calls = list(rec["test_cases"].values())
        first, second = (run_calls(rec["ground_truth"], calls) for _ in range(2))
        assert all(o.ok for o in first + second), (row, [o.error for o in first + second if not o.ok])
        assert all(values_equal(a.value, b.value, rel_tol=0.0, abs_tol=0.0) for a, b in zip(first, second)), row


def test_the_loader_accepts_a_reference_that_draws_random_numbers(tmp_path):
    """Run twice by the loader's check, a seeded draw gives the same values (it used to be
    rejected as nondeterministic)."""
    from colbench.tasks import load_tasks

    source = "import random\n\ndef dice(n):\n    return [random.randint(1, 10 ** 9) for _ in range(n)]\n"
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"problem_description": "Roll. The signature of the function is: def dice(n)",
                                "ground_truth": source, "test_cases": {"test1": "dice(3)", "test2": "dice(4)"}}) + "\n")
    assert [t.tests for t in load_tasks(str(rows))] == [("dice(3)", "dice(4)")]
