"""scripts/setup.sh: it checks the free disk before it installs (a short disk stops it with one
line naming the need and what is free, instead of pip's "[Errno 28]" half-way through torch),
and its installs go through uv with pip's find-links."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _need_gb(gb: int) -> subprocess.CompletedProcess:
    # The function as the script defines it, run against this repo's real disk.
    script = (ROOT / "scripts/setup.sh").read_text()
    start = script.index("need_gb() {")
    body = script[start:script.index("\n}\n", start) + 3]
    return subprocess.run(["bash", "-c", f'ROOT="{ROOT}"\n{body}\nneed_gb {gb} "the package and torch"\necho fits'],
                          capture_output=True, text=True)


def test_a_disk_too_small_stops_setup_with_one_line():
    run = _need_gb(10**9)  # no disk here has an exabyte free
    assert run.returncode == 1 and "fits" not in run.stdout
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("scripts/setup.sh: installing the package and torch needs about 1000000000 GB free under ")
    assert "GB (df -h" in line


def test_enough_disk_goes_on():
    run = _need_gb(0)
    assert run.returncode == 0 and run.stdout.strip() == "fits", run.stderr



# ---- installs: uv first, pip when uv cannot or SWEET_PIP=pip ------------------------------------

def _wheel(folder: Path) -> None:
    """A one-module wheel, `sweetprobe` 0.1, with a valid RECORD."""
    import base64
    import hashlib
    import zipfile

    files = {"sweetprobe/__init__.py": b"VALUE = 7\n",
             "sweetprobe-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sweetprobe\nVersion: 0.1\n",
             "sweetprobe-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda b: "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data in files.items())
    record += "sweetprobe-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(folder / "sweetprobe-0.1-py3-none-any.whl", "w") as z:
        for name, data in {**files, "sweetprobe-0.1.dist-info/RECORD": record.encode()}.items():
            z.writestr(name, data)


@pytest.mark.skipif(not (ROOT / ".venv/bin/uv").exists(), reason="scripts/setup.sh installs uv into .venv")
def test_uv_installs_from_pips_find_links(tmp_path):
    # The function as the script defines it, in a fresh venv (no pip: uv alone) given this repo's
    # uv, with the wheel only in PIP_FIND_LINKS and no index.
    import os
    import shutil
    import sys

    script = (ROOT / "scripts/setup.sh").read_text()
    start = script.index("pip_install() {")
    body = script[start:script.index("\n}\n", start) + 3]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True)
    shutil.copy(ROOT / ".venv/bin/uv", tmp_path / ".venv/bin/uv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env.update(PIP_FIND_LINKS=str(wheels), UV_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("SWEET_PIP", None)
    run = subprocess.run(["bash", "-c", f"set -euo pipefail\n{body}\npip_install --offline --no-index sweetprobe"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "pip tries" not in run.stderr, run.stderr
    probe = subprocess.run([str(tmp_path / ".venv/bin/python"), "-c", "import sweetprobe; print(sweetprobe.VALUE)"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "7", probe.stderr
