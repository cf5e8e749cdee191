"""The lab (testbed/) stands above sweet: engines, colbench, simulators and sweet import
nothing from it (at any depth, function-level too) and keep no shims of its modules; they
name its classes only by "module:Name" strings in their registries (colbench.registry),
and every such string resolves."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BELOW = ("engines", "colbench", "simulators", "sweet")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_package_below_the_lab_imports_it():
    files = sorted(p for pkg in BELOW for p in ROOT.glob(f"{pkg}/**/*.py"))
    assert len(files) > 60
    bad = {p.relative_to(ROOT).as_posix(): sorted(m for m in imported_modules(p) if m.split(".")[0] == "testbed")
           for p in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_checker_catches_a_function_level_import(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from testbed import mdp\n    import testbed.bed\n")
    assert imported_modules(fake) == {"testbed", "testbed.bed"}


def test_no_shims_of_the_moved_modules_are_left():
    old = ["colbench/envs/testbed.py", "colbench/envs/testbed_bed.py", "colbench/envs/testbed_exact.py",
           "colbench/envs/testbed_agreement.py", "colbench/envs/testbed_policy_class.py",
           "colbench/envs/testbed_profile.py", "simulators/testbed.py", "sweet/critic/oracle.py", "sweet/demo.py",
           "sweet/workflows/demo.py", "sweet/workflows/pipeline.py", "sweet/workflows/warm_start.py",
           "bench/learning.py", "bench/frontier.py", "bench/critic_check.py"]
    assert [p for p in old if (ROOT / p).exists()] == []


def test_importing_colbench_and_simulators_loads_no_lab_module():
    """The registries load the lab on use only. (sweet's critic, rft and mtdpo read every
    registered environment's training defaults for their --help, through the registry: that
    loads testbed.env as it loads colbench.envs.backend.)"""
    code = ("import importlib, sys\n"
            "for m in ('colbench.agents', 'colbench.tasks', 'colbench.envs', 'colbench.evaluate', 'colbench.serve',\n"
            "          'simulators', 'sweet.algorithms.sweet_rl', 'sweet.algorithms.loop', 'sweet.train_policy'):\n"
            "    try:\n        importlib.import_module(m)\n"
            "    except ImportError as e:\n        assert m == 'colbench.serve', e  # the optional serve extra\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'testbed'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_every_registry_string_naming_the_lab_resolves():
    import colbench.envs as envs
    import simulators
    from colbench.agents import SCRIPTED_AGENTS
    from colbench.registry import load_target
    from colbench.tasks import GENERATED_SOURCES
    from sweet.algorithms.sweet_rl import ORACLE_RANKER, ORACLE_TASK_DESIGN
    from testbed.agents import ScriptedTestbedAgent
    from testbed.env import TestbedEnv, builtin_tasks
    from testbed.human import TestbedSimulator
    from testbed.oracle import OracleCritic
    from testbed.bed import task_design

    assert envs.env_class("testbed") is TestbedEnv
    assert load_target(simulators._REGISTRY["testbed"]) is TestbedSimulator
    assert {load_target(t) for t in SCRIPTED_AGENTS.values()} == {ScriptedTestbedAgent}
    assert load_target(GENERATED_SOURCES["testbed"]) is builtin_tasks
    assert load_target(ORACLE_RANKER) is OracleCritic and load_target(ORACLE_TASK_DESIGN) is task_design
    with pytest.raises(ValueError, match="module:Name"):
        load_target("testbed.env.TestbedEnv")


def test_the_lab_is_reached_through_the_registries():
    from colbench.agents import load_agent
    from colbench.envs import make_env
    from colbench.tasks import load_tasks
    from engines.base import SamplingParams, SpecError
    from simulators import load_simulator
    from testbed.agents import ScriptedTestbedAgent
    from testbed.human import TestbedSimulator

    tasks = load_tasks("builtin:default/test", env="testbed", limit=3)
    assert len(tasks) == 3 and all(t.meta["bed"] == "default" for t in tasks)
    env = make_env("testbed")
    agent = load_agent("opt=optimal", env, sampling=SamplingParams())
    assert isinstance(agent, ScriptedTestbedAgent) and agent.kind == "optimal" and agent.name == "opt"
    assert isinstance(load_simulator("scripted:testbed", env), TestbedSimulator)
    with pytest.raises(SpecError, match="plays the test bed only"):
        load_agent("explorer", make_env("backend"), sampling=SamplingParams())
    with pytest.raises(ValueError, match="unknown bed"):
        load_tasks("builtin:nope/train", env="testbed")


def test_every_lab_help_answers_without_importing_torch():
    """`--help` of the lab's entry points prints at once: no torch or vLLM."""
    code = ("import runpy, sys\n"
            "sys.argv = [sys.argv[1], '--help']\n"
            "try:\n    runpy.run_module(sys.argv[0], run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'vllm') if m in sys.modules))\n")
    for entry in ("testbed.demo", "testbed.warm_start"):
        r = subprocess.run([sys.executable, "-c", code, entry], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert "usage" in r.stdout.lower(), (entry, r.stdout[-500:], r.stderr[-2000:])
        assert "HEAVY []" in r.stdout, (entry, r.stdout.splitlines()[-1])
