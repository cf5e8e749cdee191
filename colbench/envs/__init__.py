"""Environment registry: the one seam where users plug in their own benchmarks.

    from colbench.envs import make_env, register_env
    env = make_env("backend")                       # bundled
    register_env("mybench", "mypkg.envs:MyEnv")     # yours: any class with the Environment contract
"""

from __future__ import annotations

import importlib
from typing import Any

from colbench.protocols import ANSWER_MARKER, Environment

_REGISTRY: dict[str, str] = {
    "backend": "colbench.envs.backend:BackendEnv",
    "frontend": "colbench.envs.frontend:FrontendEnv",
    "testbed": "colbench.envs.testbed:TestbedEnv",
}

__all__ = ["ANSWER_MARKER", "Environment", "env_names", "make_env", "register_env"]


def register_env(name: str, target: str) -> None:
    """Register an environment class under `name`; target is "module:Class"."""
    if ":" not in target:
        raise ValueError(f"register_env({name!r}, {target!r}): target must be 'module:Class'")
    _REGISTRY[name] = target


def env_names() -> list[str]:
    return sorted(_REGISTRY)


def make_env(name: str, **kwargs: Any) -> Environment:
    """Instantiate a registered environment with keyword options."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(env_names())}")
    module, _, cls = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)
