"""The project's own limits on what a reader meets first: the README's length and the
length of every entry point's `main`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("colbench", "sweet", "simulators", "engines", "testbed")
MAIN_LINES = 60
README_LINES = 250


def _mains() -> list[tuple[str, int]]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "vendor" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.FunctionDef) and node.name == "main":
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.end_lineno - node.lineno + 1))
    return found


def test_every_main_is_at_most_60_lines():
    mains = _mains()
    assert len(mains) > 10  # the walk really found the entry points
    assert "testbed/demo.py" in {where.split(":")[0] for where, _ in mains}
    assert [(where, n) for where, n in mains if n > MAIN_LINES] == []


def test_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_LINES
