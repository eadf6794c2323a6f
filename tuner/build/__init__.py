"""Model build and runtime: ``build(graph) -> Module`` (see ``builder``), the memory planner
(``planner``) and the runtime ``Module`` with timing helpers (``module``)."""
from __future__ import annotations

from tuner.build.builder import build
from tuner.build.module import Module, Step, Summary, Timing, time_fn
from tuner.build.planner import Plan, plan_memory

__all__ = ["build", "Module", "Step", "Summary", "Timing", "time_fn", "Plan", "plan_memory"]


class _CallableModule(type(__import__("sys"))):
    """``tuner.build`` is this package once imported, so the package itself is callable:
    ``tuner.build(graph, ...)`` is ``tuner.build.build(graph, ...)``."""

    def __call__(self, graph, **kwargs) -> Module:
        return build(graph, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
