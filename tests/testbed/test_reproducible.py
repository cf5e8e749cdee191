"""Same seed, same figures: the main job at toy sizes, run twice in fresh processes with the
main job's own thread settings (torch's default, not the test workers' OMP_NUM_THREADS=1),
writes the same weights and the same figures bit for bit (one machine type)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# printed lines that hold no figure of the run: paths and wall times
UNCOMPARED = re.compile(r"^(wall time per step|summary:|leaderboard:|report with plots:|per-turn credit inspector:|"
                        r"critic metrics:)")


def _run(out: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    res = subprocess.run([sys.executable, "-m", "testbed.demo", "--smoke", "true", "--output_dir", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    results = res.stdout[res.stdout.index("=== results"):]
    return "\n".join(line for line in results.splitlines() if not UNCOMPARED.match(line))


@pytest.mark.slow
@pytest.mark.reproducible
@pytest.mark.timeout(1500)  # two toy-size main jobs: 72 s on the idle 2-core machine, minutes beside CI's other slow tests
def test_main_job_twice_in_fresh_processes_gives_the_same_weights_and_figures(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    printed = [_run(a), _run(b)]
    assert "warm_start: success" in printed[0] and "sweet_rl: success" in printed[0]
    assert printed[0] == printed[1]
    for record in ("summary.json", "episodes/train.jsonl", "leaderboard/leaderboard.json"):
        # the records name the run's own folder (the agents' model paths): compared without it
        texts = [(out / record).read_text().replace(str(out), "OUT") for out in (a, b)]
        assert texts[0] == texts[1], record
    weights = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    # the warm start, the critic, stage 2's snapshots and final policy
    assert any(p.parts[0] == "warm_start" for p in weights) and any(p.parts[0] == "critic" for p in weights)
    assert any(p.parts[0] == "sweet" for p in weights)
    assert weights == sorted(p.relative_to(b) for p in b.rglob("*.safetensors"))
    differ = [str(p) for p in weights if (a / p).read_bytes() != (b / p).read_bytes()]
    assert not differ, f"weights differ between two runs of the same seed: {differ}"
