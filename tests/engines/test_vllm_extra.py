"""The `vllm` extra installs beside the base package.

Fast: the base torch/torchvision ranges admit both what scripts/setup.sh installs and what
the pinned vLLM release pins exactly (vLLM 0.33.0: torch==2.14.0, torchvision==0.29.0, as
pip resolved it). Slow (needs PyPI): scripts/check_vllm.sh --resolve-only, the real check.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
VLLM_PINS = {"torch": "2.14.0", "torchvision": "0.29.0"}  # vLLM 0.33.x's exact requirements


def _base_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {r.name: r for r in reqs} | {"vllm": Requirement(project["optional-dependencies"]["vllm"][0])}


def test_base_pins_admit_setup_and_vllm_torch():
    reqs = _base_requirements()
    setup = dict(re.findall(r'"(torch|torchvision)==([\d.]+)"', (ROOT / "scripts/setup.sh").read_text()))
    assert set(setup) == {"torch", "torchvision"}
    for name in ("torch", "torchvision"):
        assert setup[name] in reqs[name].specifier, f"setup.sh installs {name} {setup[name]} outside {reqs[name]}"
        assert VLLM_PINS[name] in reqs[name].specifier, f"vLLM pins {name}=={VLLM_PINS[name]} outside {reqs[name]}"
    assert "0.33.0" in reqs["vllm"].specifier  # the release VLLM_PINS and tests/engines/test_vllm_api.py describe


@pytest.mark.slow
def test_vllm_extra_resolves_with_pip():
    res = subprocess.run(["bash", "scripts/check_vllm.sh", "--resolve-only"], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "resolves: vllm==0.33" in res.stdout and "torch==2.14.0" in res.stdout
