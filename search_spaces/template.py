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

Prepared operands (pack constant operands once): a template whose ``prepared_inputs`` names
some of the workload's inputs (weights, bias: operands a model holds as constants) generates
two more functions in the module:

- ``prepare(*those inputs)`` returns a tuple of arrays, the operands in the form the kernel
  reads (e.g. B packed in the blocks and K groups the dot-product instructions want, a
  correction vector folded from the weights and the bias);
- ``kernel_prepared(*the other inputs, *prepare's arrays, *outputs, *runtime args)``, the
  kernel on them.

``ENTRY`` keeps the workload's signature (``prepare`` then ``kernel_prepared`` on every call),
so every caller that does not prepare stays correct. ``prepare_kernel`` binds the prepared
form: a built model calls it once when it binds its constant initializers (a weight that is a
graph input keeps ``ENTRY``), the measuring worker calls it outside the timed region (what a
built model pays per call is what is timed). ``prepare`` must depend on nothing but its
arguments and the module's constants; ``kernel_prepared`` must not write to its arrays.
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

    def seed_configs(self, workload: Workload, max_threads: int = 1) -> list[Config]:
        """Configs a tuning run measures in its first batch, the default first: a template may
        add the defaults it has on other CPUs of the ISA, so a short search starts from each
        known-good formulation instead of finding it by chance."""
        return [self.default_config(workload, max_threads)]

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

    def prepared_inputs(self, workload: Workload, config: Config) -> tuple[int, ...]:
        """Indices of the workload inputs the generated ``prepare`` takes (see the module
        docstring); () when the module has no ``prepare`` (every input read per call)."""
        return ()

    def threads(self, config: Config) -> int:
        """Threads the generated kernel uses (the run worker sets Numba's pool to this)."""
        return int(config.get("threads", 1))


def kernel_source(template: Template, workload: Workload, config: Config) -> str:
    """The module compiled for ``config``: the template's ``codegen`` with each parallel loop
    body that inlines a micro-kernel outlined into a serial function
    (``search_spaces.parallel_outline``: a parallel kernel compiles in less time, runs the
    same). Everything that writes, compiles or shows a kernel takes its source from here."""
    from search_spaces.parallel_outline import outline_parallel_loops

    return outline_parallel_loops(template.codegen(workload, config))


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


class PreparedKernel:
    """A module's ``kernel_prepared`` with its prepared arrays: ``args(inputs, outputs)`` is
    the argument tuple to call ``fn`` with (the inputs not prepared, the prepared arrays, the
    outputs; runtime arguments are bound into ``fn``)."""

    def __init__(self, fn: Callable, n_inputs: int, kept: tuple[int, ...], prepared: tuple):
        self.fn, self.n_inputs, self.kept, self.prepared = fn, n_inputs, kept, prepared

    def args(self, inputs, outputs) -> tuple:
        return tuple(inputs[i] for i in self.kept) + self.prepared + tuple(outputs)

    def __call__(self, *arrays: Any):
        """Called with the workload's arrays (inputs, outputs); the prepared inputs among
        them are not read (their prepared form is)."""
        return self.fn(*self.args(arrays[:self.n_inputs], arrays[self.n_inputs:]))


def prepared_inputs(template, workload, config) -> tuple[int, ...]:
    """``template.prepared_inputs`` (() for a template object without it)."""
    fn = getattr(template, "prepared_inputs", None)
    return tuple(fn(workload, config)) if fn is not None else ()


def prepare_kernel(module, indices: tuple[int, ...], inputs, runtime_args: tuple = ()) -> PreparedKernel:
    """Run ``module.prepare`` on ``inputs[i]`` for ``i`` in ``indices`` (the template's
    ``prepared_inputs``) and bind ``module.kernel_prepared`` to its result."""
    prepared = tuple(module.prepare(*(inputs[i] for i in indices)))
    kept = tuple(i for i in range(len(inputs)) if i not in indices)
    return PreparedKernel(bind_runtime_args(module.kernel_prepared, runtime_args), len(inputs),
                          kept, prepared)
