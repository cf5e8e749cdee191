"""Registry entries as "module:Name" strings, imported on use (as skyrl-gym registers its
environments).

The registries (environments, simulators, scripted agents, generated task sources, the
trainers' oracle critic) name what they load by such a string, so a package can register
classes of a package above it, the test bed's (testbed/), without importing it: the
module loads only when its entry is used.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_target(target: str) -> Any:
    """The object a "module:Name" string names (Name may be dotted: "module:Class.method")."""
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"registry target {target!r}: expected 'module:Name'")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj
