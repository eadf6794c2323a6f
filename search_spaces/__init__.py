"""Search spaces: HOW a workload may be computed. Registry name -> "module:Class" (lazy)."""
from __future__ import annotations

import importlib

from tuner.errors import UsageError

REGISTRY: dict[str, str] = {
    "gemm": "search_spaces.gemm:GemmTemplate",
    "gemm_int8": "search_spaces.gemm_int8:GemmInt8Template",
    "conv2d": "search_spaces.conv2d:Conv2dTemplate", "dense": "search_spaces.dense:DenseTemplate", "injective": "search_spaces.injective:InjectiveTemplate", "fixed": "search_spaces.fixed:FixedTemplate",
}
_INSTANCES: dict[str, object] = {}
# (kind, dtype) -> the template that computes that dtype, where it is not the kind's own
DTYPE_TEMPLATES: dict[tuple[str, str], str] = {
    ("gemm", "int8"): "gemm_int8", ("gemm", "int8w7"): "gemm_int8",
}


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
    """Template names for a workload kind: the kind's own template (registered under the
    kind's name) first, then templates registered at run time for that kind. Nothing else is
    imported, so a template that fails to import cannot break tuning of other kinds."""
    names = [kind] if kind in REGISTRY else []
    names += [n for n, t in _INSTANCES.items() if n != kind and t.workload_kind == kind]
    return names


def template_for(workload, name: str | None = None):
    """The template that computes ``workload``: ``name`` when given, else the one registered
    for its (kind, dtype) in ``DTYPE_TEMPLATES``, else the kind's own. A template whose
    ``dtypes`` do not include the workload's dtype is a UsageError (one line, exit 2)."""
    dtype = getattr(workload, "dtype", None)
    name = name or DTYPE_TEMPLATES.get((workload.kind, dtype)) or (templates_for(workload.kind) or [workload.kind])[0]
    template = get_template(name)
    allowed = getattr(template, "dtypes", None)
    if dtype is not None and allowed is not None and dtype not in allowed:
        other = DTYPE_TEMPLATES.get((workload.kind, dtype))
        raise UsageError(f"template {name!r} has no {dtype} form (it computes {', '.join(allowed)})"
                         + (f"; use --template {other}" if other else ""))
    return template
