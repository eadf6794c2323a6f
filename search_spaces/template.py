"""What a template is: a search space over a workload plus a code generator.

A template never times anything. ``codegen`` returns the full source of a Python module that
defines ``ENTRY`` (default ``kernel``): a function taking the workload's input arrays then its
output arrays (``kernel(A, B, C)`` for GEMM), writing the outputs in place. The source has the
knobs baked in as literals (constant trip counts for LLVM) and is compiled by Numba with
``cache=True`` from a content-addressed file, so a run worker loads what a build worker built.

Compile once, measure many: the knobs a template lists in ``runtime_knobs`` are not in the
source but arguments appended after the arrays (``kernel(A, B, C, tile_m, tile_n, tile_k)``),
their values given by ``runtime_args``. Configs that differ only in those knobs generate the
same source, so they share one content address and one compiled module (docs/compile-once.md).
Whoever calls a kernel binds its runtime arguments with ``bind_runtime_args``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Mapping

from search_spaces.space import Config, ConfigSpace
from workloads.workload import Workload


class Template(ABC):
    name: ClassVar[str]           # registry name, e.g. "gemm"
    version: ClassVar[int]        # bump when generated code changes meaning or speed
    workload_kind: ClassVar[str]  # the workload kind it computes
    entry: ClassVar[str] = "kernel"
    tunable: ClassVar[bool] = True   # False: one point, never searched (builds use the default)
    # workload dtypes the template computes (None: whatever its workload kind allows)
    dtypes: ClassVar[tuple[str, ...] | None] = None
    # knobs passed to the entry as arguments (after the arrays, in this order), not baked in
    runtime_knobs: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def space(self, workload: Workload, max_threads: int = 1) -> ConfigSpace:
        """The knobs for this workload. Knob ``threads`` (if any) must stay <= max_threads."""

    @abstractmethod
    def default_config(self, workload: Workload, max_threads: int = 1) -> Config:
        """A valid, reasonable config used as the fallback when nothing is tuned."""

    @abstractmethod
    def codegen(self, workload: Workload, config: Config) -> str:
        """Readable module source defining ``self.entry``. Raises InstantiationError."""

    def runtime_args(self, workload: Workload, config: Config) -> tuple:
        """The values of ``runtime_knobs`` the entry is called with, after the arrays (integers:
        every config of a variant shares one compiled signature). Templates that clip or derive
        them override this."""
        return tuple(int(config[k]) for k in self.runtime_knobs)

    def runtime_arg_names(self, workload: Workload, config: Config) -> tuple[str, ...]:
        """Names of the ``runtime_args`` values (for ``show``'s ``# called as:`` line):
        ``runtime_knobs``, unless the template passes more (a shape-generic kernel's shape)."""
        return tuple(self.runtime_knobs)

    def transfer_hazard(self, workload: Workload, config: Config) -> str | None:
        """Why ``config``, tuned for a similar workload, may be slow on ``workload`` (None when
        nothing in the config depends on the exact shape). The similar-workload fallback skips
        hazardous configs."""
        return None

    def domain_features(self, params: Mapping, config: Mapping,
                        caches: Mapping | None = None) -> dict | None:
        """Named floats saying what ``config`` means for the workload with ``params`` (working
        sets against the caches, register tile, intensity, ...) for the cost model; None: the
        model uses the generic knob encoding only. Must accept configs with extra knobs."""
        return None

    def threads(self, config: Config) -> int:
        """Threads the generated kernel uses (the run worker sets Numba's pool to this)."""
        return int(config.get("threads", 1))


def bind_runtime_args(fn: Callable, args: tuple) -> Callable:
    """``fn`` called as ``fn(*arrays)``: with runtime arguments, a callable appending them."""
    if not args:
        return fn
    args = tuple(args)

    def bound(*arrays: Any):
        return fn(*arrays, *args)

    bound.kernel = fn            # the compiled dispatcher (stats, signatures)
    bound.runtime_args = args
    return bound
