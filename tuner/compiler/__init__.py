"""Model build and runtime: ``build(graph) -> Module`` (see ``builder``), the memory planner
(``planner``) and the runtime ``Module`` with timing helpers (``module``)."""
from __future__ import annotations

from tuner.compiler.compile_model import build
from tuner.compiler.module import Module, Step, Summary, Timing, time_fn
from tuner.compiler.planner import Plan, plan_memory

__all__ = ["build", "Module", "Step", "Summary", "Timing", "time_fn", "Plan", "plan_memory"]

