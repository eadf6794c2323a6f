"""Workloads: WHAT is tuned. A registry maps kind name -> "module:Class" (imported lazily).

``register_workload(cls)`` adds a kind at run time (``tuner.register_workload``). A kind made
from fused groups of a model says which groups it takes with ``Workload.claims_group``; the
first registered kind that claims a group wins, by ``priority`` (higher first) then order, and
``fixed`` takes whatever no other kind claims.
"""
from __future__ import annotations

import importlib
import json
from typing import Any

from workloads.errors import UsageError
from workloads.workload import Workload

REGISTRY: dict[str, str] = {
    "gemm": "workloads.gemm:Gemm",
    "conv2d": "workloads.fused:Conv2dGroup",
    "depthwise_conv2d": "workloads.fused:DepthwiseConv2dGroup",
    "dense": "workloads.fused:DenseGroup",
    "injective": "workloads.fused:InjectiveGroup",
    "fixed": "workloads.fused:FixedGroup",
    "qdense": "workloads.quant_fused:QDenseGroup",
    "qconv2d": "workloads.quant_fused:QConv2dGroup",
    "qconv2d_grouped": "workloads.quant_fused:QGroupedConv2dGroup",
    "qdepthwise_conv2d": "workloads.quant_fused:QDepthwiseConv2dGroup",
}
# kinds made from fused groups, in the order kind_of asks them; (priority, kind)
_GROUP_KINDS: list[tuple[int, str]] = [(0, "conv2d"), (0, "depthwise_conv2d"), (0, "dense"),
                                       (0, "qdense"), (0, "qconv2d"), (0, "qdepthwise_conv2d"),
                                       (0, "qconv2d_grouped"),
                                       (0, "injective"),
                                       (-100, "fixed")]
_CLASSES: dict[str, type[Workload]] = {}


def workload_class(kind: str) -> type[Workload]:
    if kind in _CLASSES:
        return _CLASSES[kind]
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise UsageError(f"unknown workload kind {kind!r}; known: {', '.join(sorted(REGISTRY))}") from None
    module, _, attr = target.partition(":")
    cls = _CLASSES[kind] = getattr(importlib.import_module(module), attr)
    return cls


def register_workload(cls: type[Workload], *, priority: int = 0) -> type[Workload]:
    """Register a workload class under ``cls.kind`` (usable as a decorator). If the class
    overrides ``claims_group``, model builds offer it the fused groups it claims, before the
    built-in kinds of lower priority."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind or not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise UsageError("register_workload needs a Workload subclass with a 'kind' name")
    REGISTRY[kind] = f"{cls.__module__}:{cls.__qualname__}"
    _CLASSES[kind] = cls
    _GROUP_KINDS[:] = [(p, k) for p, k in _GROUP_KINDS if k != kind]
    if cls.claims_group.__func__ is not Workload.claims_group.__func__:
        _GROUP_KINDS.append((priority, kind))
    return cls


def group_kinds() -> list[type[Workload]]:
    """The classes of group-made kinds, in the order ``kind_of`` asks them."""
    order = sorted(range(len(_GROUP_KINDS)), key=lambda i: (-_GROUP_KINDS[i][0], i))
    return [workload_class(_GROUP_KINDS[i][1]) for i in order]


def from_params(kind: str, params: dict[str, Any]) -> Workload:
    return workload_class(kind).from_params(params)


def from_key(key: str) -> Workload:
    """Inverse of ``Workload.key``."""
    kind, sep, rest = key.partition(":")
    if not sep:
        raise UsageError(f"not a workload key: {key!r} (expected 'kind:{{json}}')")
    try:
        params = json.loads(rest)
    except json.JSONDecodeError as exc:
        raise UsageError(f"workload key {key!r} has bad JSON: {exc}") from None
    return from_params(kind, params)


def from_spec(spec: str | Workload) -> Workload:
    """A workload object, a key (``kind:{json}``) or a short spec (``gemm:1024x1024x1024``)."""
    if isinstance(spec, Workload):
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"a workload is a Workload object or a spec string, not {type(spec).__name__}")
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise UsageError(f"not a workload spec: {spec!r} (e.g. 'gemm:1024x1024x1024')")
    if rest.startswith("{"):
        return from_key(spec)
    return workload_class(kind).parse_spec(rest)


__all__ = ["Workload", "REGISTRY", "workload_class", "register_workload", "group_kinds",
           "from_params", "from_key", "from_spec"]
