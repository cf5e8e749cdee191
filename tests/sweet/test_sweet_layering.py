"""sweet/ is layered: each folder imports only the folders below it, never one above, and
no module imports itself back through another (no circles, function-level imports too).

    core  <  critic  <  algorithms  <  workflows  <  the entry modules (sweet/*.py)

The packages below sweet (engines, colbench, simulators) are outside this order; their
own direction is tests/colbench/test_layering.py's. The lab above it (testbed/) is
tests/testbed/test_testbed_layering.py's: sweet imports nothing from it."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["core", "critic", "algorithms", "workflows", "entry"]


def layer_of(module: str) -> int:
    parts = module.split(".")
    if parts[1] in LAYERS:  # sweet.core, sweet.core.trainer, ...
        return LAYERS.index(parts[1])
    return LAYERS.index("entry")  # sweet.train_policy, sweet.train_critic


def sweet_modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.glob("sweet/**/*.py"):
        mod = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if mod != "sweet":
            out[mod] = p
    return out


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The sweet modules a file imports, at any depth (`from sweet.x import y` names
    sweet.x.y when that is a module, else sweet.x)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("sweet.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "sweet":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                names.add(full if full in known else node.module)
    return {n for n in names if n in known}


def test_every_sweet_module_sits_in_a_layer():
    mods = sweet_modules()
    assert len(mods) > 20
    for mod in mods:
        parts = mod.split(".")
        assert parts[1] in LAYERS or len(parts) == 2, f"{mod}: not in one of the layers {LAYERS}"


def test_no_upward_import_inside_sweet():
    mods = sweet_modules()
    bad = []
    for mod, path in sorted(mods.items()):
        for dep in sorted(imports_of(path, set(mods))):
            if layer_of(dep) > layer_of(mod):
                bad.append(f"{mod} imports {dep} (a layer above)")
            if layer_of(mod) == LAYERS.index("entry") and layer_of(dep) == LAYERS.index("entry") and dep != mod:
                bad.append(f"{mod} imports another entry module {dep}")
    assert bad == []


def test_no_import_cycle_inside_sweet():
    mods = sweet_modules()
    graph = {m: imports_of(p, set(mods)) - {m} for m, p in mods.items()}
    # a package's __init__ is imported by its own submodules' import machinery; ignore that edge
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for dep in sorted(graph[node]):
            visit(dep)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert cycles == []


def test_layering_test_catches_an_upward_import(tmp_path):
    # the checker itself: a core module that imports a workflow is reported
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from sweet.workflows import rounds\n")
    mods = sweet_modules()
    deps = imports_of(fake, set(mods))
    assert deps == {"sweet.workflows.rounds"}
    assert layer_of("sweet.workflows.rounds") > layer_of("sweet.core.trainer")


def test_every_help_answers_without_importing_torch():
    """`--help` of every entry point prints at once: no torch or vLLM (the parser is transformers')."""
    code = ("import runpy, sys\n"
            "sys.argv = [sys.argv[1], '--help'] + sys.argv[2:]\n"
            "try:\n    runpy.run_module(sys.argv[0], run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'vllm') if m in sys.modules)\n"
            "print('HEAVY', heavy)\n")
    entries = [["sweet.train_critic"], ["sweet.train_policy"], ["sweet.critic.inspect"], ["colbench.evaluate"]]
    entries += [["sweet.train_policy", "--algorithm", a] for a in ("sweet", "rft", "mtdpo", "loop")]
    for entry in entries:
        r = subprocess.run([sys.executable, "-c", code, *entry], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert "usage" in r.stdout.lower(), (entry, r.stdout[-500:], r.stderr[-2000:])
        assert "HEAVY []" in r.stdout, (entry, r.stdout.splitlines()[-1])
