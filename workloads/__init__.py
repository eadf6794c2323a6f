"""Workloads: WHAT is tuned. A registry maps kind name -> "module:Class" (imported lazily)."""
from __future__ import annotations

import importlib
import json
from typing import Any

from tuner.errors import UsageError
from workloads.base import Workload

REGISTRY: dict[str, str] = {
    "gemm": "workloads.gemm:Gemm",
    "conv2d": "workloads.fused:Conv2dGroup", "dense": "workloads.fused:DenseGroup", "injective": "workloads.fused:InjectiveGroup", "fixed": "workloads.fused:FixedGroup",
}


def workload_class(kind: str) -> type[Workload]:
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise UsageError(f"unknown workload kind {kind!r}; known: {', '.join(sorted(REGISTRY))}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


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


__all__ = ["Workload", "REGISTRY", "workload_class", "from_params", "from_key"]
