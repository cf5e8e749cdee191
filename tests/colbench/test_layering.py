"""Dependencies run one way: colbench (the episode runner, environments, scoring) never
imports the simulated humans (`simulators`), the trainers (`sweet`) or the lab (`testbed`,
named by registry strings only); only the evaluate CLI wires simulators in."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIRING = {"colbench/evaluate.py", "colbench/serve.py"}  # the CLIs that wire packages together
# Modules of the optional `serve` extra (OpenEnv): importable only where it is installed.
NEEDS_SERVE = {"colbench.client", "colbench.serve"}


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` statement in the file names, at any depth (function-level too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_colbench_module_imports_simulators_sweet_or_testbed():
    files = sorted(ROOT.glob("colbench/**/*.py"))
    assert len(files) > 15
    bad = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        forbidden = ("sweet", "testbed") if rel in WIRING else ("sweet", "simulators", "testbed")
        hits = sorted(m for m in imported_modules(path) if m.split(".")[0] in forbidden)
        if hits:
            bad[rel] = hits
    assert bad == {}


def test_importing_every_colbench_module_loads_no_simulators_sweet_or_testbed():
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in ROOT.glob("colbench/**/*.py"))
    modules = [m.removesuffix(".__init__") for m in modules]
    if importlib.util.find_spec("openenv") is None:
        modules = [m for m in modules if m not in NEEDS_SERVE]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n    importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('simulators', 'sweet', 'testbed')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_simulators_implement_colbench_protocol():
    from colbench.protocols import Simulator
    from simulators.scripted import ScriptedBackendSimulator
    from testbed.human import TestbedSimulator

    assert isinstance(ScriptedBackendSimulator(), Simulator) and isinstance(TestbedSimulator(), Simulator)
