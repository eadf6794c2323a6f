"""tuner: an autotuning search framework for CPU tensor kernels.

The Python API (``tuner.api``; imported lazily so ``import tuner`` stays cheap)::

    tuner.tune(workload_or_spec, ...)  -> TuneResult   search, record, return the best
    tuner.tune_model(graph_or_path, ...) -> dict       tune every task of a model
    tuner.build(graph_or_path, ...)       -> Module       a model with the best records applied
                                                        (int8=True or tuner.Int8Options(...))
    tuner.gemm(A, B)                   -> C            dispatch: best record or loud fallback
    tuner.kernel(workload_or_spec)     -> Kernel       any workload's kernel, dispatched the same way
    tuner.open_db(url)                 -> Records      query the records
    tuner.register_workload(cls), tuner.register_template(template, priority=1)
    tuner.Workload, tuner.Template, tuner.Config, tuner.Knob, tuner.ConfigSpace, tuner.workload(spec)
"""
from __future__ import annotations

__version__ = "0.1.0"

_API = {
    "tune": "tuner.api", "tune_model": "tuner.api", "build": "tuner.api", "open_db": "tuner.api",
    "register_workload": "tuner.api", "register_template": "tuner.api", "workload": "tuner.api",
    "TuneResult": "tuner.api", "gemm": "tuner.dispatch", "kernel": "tuner.dispatch", "Knob": "search_spaces.space",
    "ConfigSpace": "search_spaces.space", "Constraint": "search_spaces.space", "Workload": "workloads.workload",
    "Template": "search_spaces.template", "Config": "search_spaces.space",
    "TunerError": "workloads.errors", "UsageError": "workloads.errors",
    "Int8Options": "tuner.quant.flow",
}


def __getattr__(name: str):
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value   # later lookups skip this hook (tuner.gemm is called per product)
        return value
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_API))
