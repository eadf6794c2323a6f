"""The default pipelines, one explicit list per opt_level (read top to bottom).

- O0: type, expand inference-only ops, one op per group (no fusion).
- O1: + canonical ops, dead code removal, fusion.
- O2: + constant folding (weights built by constant_of_shape, batch_norm parameters),
      scale folding into conv/dense weights, common subexpressions.
- O3: + NHWC layout for conv2d/pools (transforms at the boundaries, folded into weights).
"""
from __future__ import annotations

from workloads.errors import UsageError
from workloads.graph.ir import Graph
from workloads.graph.passes.cleanup import DeadCodeElimination, EliminateCommonSubexpr
from workloads.graph.passes.convert_layout import ConvertLayout
from workloads.graph.passes.fold_constant import FoldConstant
from workloads.graph.passes.fold_scale_axis import FoldScaleAxis
from workloads.graph.passes.fuse_ops import FuseOps
from workloads.graph.passes.infer_type import InferType
from workloads.graph.passes.infra import Pass, PassContext, Sequential
from workloads.graph.passes.simplify import CanonicalizeOps, SimplifyInference

DEFAULT_MAX_GROUP_SIZE = 16


def pipeline_passes(opt_level: int, *, layout: str = "NHWC",
                    max_group_size: int = DEFAULT_MAX_GROUP_SIZE, prologue: bool = True) -> list[Pass]:
    """``prologue=False``: FuseOps leaves conv prologues out (for comparisons)."""
    fuse = FuseOps(max_group_size=max_group_size, **({} if prologue else {"prologue": False}))
    if opt_level == 0:
        return [InferType(), SimplifyInference(), FuseOps(max_group_size=1)]
    if opt_level == 1:
        return [InferType(), SimplifyInference(), CanonicalizeOps(), DeadCodeElimination(), fuse]
    if opt_level == 2:
        return [InferType(), SimplifyInference(), CanonicalizeOps(),
                FoldConstant(), FoldScaleAxis(), FoldConstant(),
                EliminateCommonSubexpr(), DeadCodeElimination(), fuse]
    if opt_level == 3:
        return [InferType(), SimplifyInference(), CanonicalizeOps(),
                FoldConstant(), FoldScaleAxis(), FoldConstant(),
                EliminateCommonSubexpr(),
                ConvertLayout(desired=layout), FoldConstant(),  # fold weight transforms
                DeadCodeElimination(), fuse]
    raise UsageError(f"opt_level must be 0..3, got {opt_level}")


def default_pipeline(opt_level: int = 2, **kw) -> Sequential:
    return Sequential(pipeline_passes(opt_level, **kw), name=f"O{opt_level}")


def optimize(graph: Graph, opt_level: int = 2, ctx: PassContext | None = None, **kw) -> Graph:
    """Run the default pipeline of ``opt_level`` (under ``ctx``, default: that opt_level)."""
    return default_pipeline(opt_level, **kw)(graph, ctx or PassContext(opt_level=opt_level))
