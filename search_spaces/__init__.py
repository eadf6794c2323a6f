"""Search spaces: HOW a workload may be computed.

Layout: ``space`` and ``template`` are the vocabulary (knobs, constraints, configs, the
``Template`` interface); ``templates/`` the built-in template families; ``gemm_engine/`` the
blocked-GEMM engine the GEMM, dense and conv2d templates generate kernels with; ``runtime/``
what generated kernels import when they run (LLVM-vector intrinsics); ``epilogue`` the fused
epilogue code generator the model templates share.

Registry: template name -> "module:Class" (imported lazily) or an instance registered at run
time. ``templates_for(kind)`` orders a kind's templates by priority (higher first), so a user's
template registered with ``priority=1`` is chosen over the built-in one (priority 0).
"""
from __future__ import annotations

import importlib

from workloads.errors import UsageError

REGISTRY: dict[str, str] = {
    "gemm": "search_spaces.templates.gemm:GemmTemplate",
    "gemm_int8": "search_spaces.templates.gemm_int8:GemmInt8Template",
    "conv2d": "search_spaces.templates.conv2d:Conv2dTemplate",
    "depthwise_conv2d": "search_spaces.templates.depthwise_conv2d:DepthwiseConv2dTemplate",
    "dense": "search_spaces.templates.dense:DenseTemplate",
    "injective": "search_spaces.templates.injective:InjectiveTemplate",
    "fixed": "search_spaces.templates.fixed:FixedTemplate",
    "qdense": "search_spaces.templates.quant_anchor:QDenseTemplate",
    "qconv2d": "search_spaces.templates.quant_anchor:QConv2dTemplate",
    "qconv2d_grouped": "search_spaces.templates.quant_anchor:QGroupedConv2dTemplate",
    "qdepthwise_conv2d": "search_spaces.templates.quant_depthwise:QDepthwiseConv2dTemplate",
}
_INSTANCES: dict[str, object] = {}
_PRIORITY: dict[str, int] = {}
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


def register_template(name: str, template, priority: int = -1) -> None:
    """Register an instance at run time under ``name``. ``priority`` orders the templates of
    one workload kind for ``templates_for`` (built-ins have 0; the default -1 keeps a
    registered template an explicit choice, ``priority=1`` makes it the kind's first)."""
    from search_spaces.template import Template

    if not isinstance(template, Template):
        raise UsageError(f"register_template needs a Template instance, got {type(template).__name__}")
    REGISTRY[name] = f"<instance {type(template).__name__}>"
    _INSTANCES[name] = template
    _PRIORITY[name] = priority


def templates_for(kind: str) -> list[str]:
    """Template names for a workload kind, highest priority first: the kind's built-in
    template (registered under the kind's name, priority 0) and templates registered at run
    time for that kind. Built-ins of other kinds are not imported, so a template that fails to
    import cannot break tuning of other kinds."""
    names = [kind] if kind in REGISTRY else []
    names += [n for n, t in _INSTANCES.items() if n != kind and t.workload_kind == kind]
    return sorted(names, key=lambda n: -_PRIORITY.get(n, 0))  # stable: ties keep this order


def template_for(workload, name: str | None = None):
    """The template that computes ``workload``: ``name`` when given, else the one registered
    for its (kind, dtype) in ``DTYPE_TEMPLATES``, else the kind's first (highest priority). A
    template of another kind, or whose ``dtypes`` do not include the workload's dtype, is a
    ``UsageError`` (one line, exit 2)."""
    dtype = getattr(workload, "dtype", None)
    if name is None:
        names = templates_for(workload.kind)
        name = DTYPE_TEMPLATES.get((workload.kind, dtype)) or (names[0] if names else None)
        if name is None:
            raise UsageError(f"no template is registered for workload kind {workload.kind!r}")
    tpl = get_template(name)
    if tpl.workload_kind != workload.kind:
        raise UsageError(f"template {name!r} computes {tpl.workload_kind!r} workloads, not {workload.kind!r}")
    allowed = getattr(tpl, "dtypes", None)
    if dtype is not None and allowed is not None and dtype not in allowed:
        other = DTYPE_TEMPLATES.get((workload.kind, dtype))
        raise UsageError(f"template {name!r} has no {dtype} form (it computes {', '.join(allowed)})"
                         + (f"; use --template {other}" if other else ""))
    return tpl
