"""Environment registry: the one seam where users plug in their own benchmarks.

    from colbench.envs import make_env, register_env
    env = make_env("backend")                       # bundled
    register_env("mybench", "mypkg.envs:MyEnv")     # yours: any class with the Environment contract

Entries are "module:Class" strings imported on use (colbench.registry); the test bed's
class is the lab's (testbed/env.py), which colbench does not import.
"""

from __future__ import annotations

from typing import Any

from colbench.envs.base import PAIRING_RULES, TrainingDefaults
from colbench.protocols import ANSWER_MARKER, Environment
from colbench.registry import load_target

_REGISTRY: dict[str, str] = {
    "appworld": "colbench.envs.appworld:AppWorldEnv",
    "backend": "colbench.envs.backend:BackendEnv",
    "frontend": "colbench.envs.frontend:FrontendEnv",
    "testbed": "testbed.env:TestbedEnv",
}

__all__ = ["ANSWER_MARKER", "PAIRING_RULES", "Environment", "TrainingDefaults", "defaults_help", "env_class",
           "env_names", "make_env", "register_env", "reply_cap", "training_defaults"]

DEFAULT_REPLY_CHARS = 400  # the reply cap of an environment class without a `max_reply_chars` attribute


def register_env(name: str, target: str) -> None:
    """Register an environment class under `name`; target is "module:Class"."""
    if ":" not in target:
        raise ValueError(f"register_env({name!r}, {target!r}): target must be 'module:Class'")
    _REGISTRY[name] = target


def env_names() -> list[str]:
    return sorted(_REGISTRY)


def env_class(name: str) -> type:
    """The class registered under `name` (imported, not instantiated)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(env_names())}")
    return load_target(_REGISTRY[name])


def make_env(name: str, **kwargs: Any) -> Environment:
    """Instantiate a registered environment with keyword options."""
    return env_class(name)(**kwargs)


def training_defaults(name: str) -> TrainingDefaults:
    """The trainers' pairing and filtering defaults for environment `name`: its class
    attribute `training_defaults`; the paper's rule (TrainingDefaults()) without one."""
    return getattr(env_class(name), "training_defaults", None) or TrainingDefaults()


def reply_cap(env: Any, override: int | None = None) -> int:
    """The simulated human's reply cap in characters: `override` (--max_reply_chars) when
    given, else the environment's `max_reply_chars` (an instance, a class or a registered
    name; published: frontend 1,000, backend 400), else DEFAULT_REPLY_CHARS."""
    if override is not None:
        return int(override)
    if isinstance(env, str):
        env = env_class(env) if env in _REGISTRY else None
    return int(getattr(env, "max_reply_chars", DEFAULT_REPLY_CHARS))


def defaults_help(field: str) -> str:
    """'backend 1.0, frontend 0.0, ...': a TrainingDefaults field per bundled environment, for --help."""
    def show(value) -> str:
        return value if isinstance(value, str) else f"{value:g}"

    return ", ".join(f"{name} {show(getattr(training_defaults(name), field))}" for name in env_names())
