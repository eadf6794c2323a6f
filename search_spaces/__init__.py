"""Search spaces: HOW a workload may be computed. Registry name -> "module:Class" (lazy)."""
from __future__ import annotations

import importlib

from tuner.errors import UsageError

REGISTRY: dict[str, str] = {
    "gemm": "search_spaces.gemm:GemmTemplate",
}
_INSTANCES: dict[str, object] = {}


def get_template(name: str):
    """The template instance registered as ``name``; unknown names list the valid ones."""
    if name in _INSTANCES:
        return _INSTANCES[name]
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown template {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
    module, _, attr = target.partition(":")
    inst = getattr(importlib.import_module(module), attr)()
    _INSTANCES[name] = inst
    return inst


def register_template(name: str, template) -> None:
    """Register an instance at run time (tests use this to inject faulty templates)."""
    REGISTRY[name] = f"<instance {type(template).__name__}>"
    _INSTANCES[name] = template


def templates_for(kind: str) -> list[str]:
    return [n for n in REGISTRY if get_template(n).workload_kind == kind]
