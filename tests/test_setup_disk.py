"""scripts/setup.sh checks the free disk before it installs: a short disk stops it with one line
naming the need and what is free, instead of pip's "[Errno 28]" half-way through torch."""

import subprocess
from pathlib import Path

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

