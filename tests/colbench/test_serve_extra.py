"""The `serve` extra (OpenEnv) installs beside the base package and beside `vllm`.

Fast: the extra names the OpenEnv that TRL documents, and admits the installed one.
Slow (needs PyPI): scripts/check_serve.sh, the real resolution of '.[serve]', and of
the documented vLLM + OpenEnv install ('.[serve,vllm]' itself cannot resolve today:
OpenEnv's gradio and fastmcp pins clash with vLLM 0.33's pillow and mcp; see the script).
"""

from __future__ import annotations

import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _serve_requirements() -> dict[str, Requirement]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {r.name: r for r in map(Requirement, extras["serve"])}


def test_serve_extra_pins_openenv_and_admits_the_installed_one():
    reqs = _serve_requirements()
    assert set(reqs) == {"openenv"}
    assert "0.10.0" in reqs["openenv"].specifier  # the release colbench.serve/client are written against
    try:
        installed = metadata.version("openenv")
    except metadata.PackageNotFoundError:
        pytest.skip("the `serve` extra is not installed (pip install -e '.[serve]')")
    assert installed in reqs["openenv"].specifier, f"installed openenv {installed} outside {reqs['openenv']}"


@pytest.mark.slow
def test_serve_extra_resolves_with_pip_and_the_vllm_install_is_documented():
    res = subprocess.run(["bash", "scripts/check_serve.sh"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert ".[serve] resolves: openenv==0.10" in res.stdout
    # '.[serve,vllm]' cannot resolve today (gradio's pillow<13, fastmcp 3's mcp<2 vs vLLM 0.33); the
    # two-step install of docs/interop.md must, and the script says when the extra starts to resolve.
    assert ".[vllm]+fastmcp4 resolves:" in res.stdout and "vllm==0.33" in res.stdout
    assert ".[serve,vllm] does not resolve (known" in res.stdout or "now resolves" in res.stdout
