"""The op registry (``OPS``) and the ops it holds; see ``registry`` for the vocabulary."""
from __future__ import annotations

from workloads.graph.ops.registry import (OPS, REQUIRED, AttrSpec, OpDef, OpPattern, get_op,
                                      register_op)
from workloads.graph.ops import elementwise, nn, quant, transform  # noqa: F401  (registers the ops)
from workloads.graph.ops.transform import layout_perm

__all__ = ["OPS", "REQUIRED", "AttrSpec", "OpDef", "OpPattern", "get_op", "register_op",
           "layout_perm"]
