"""Graph passes: each a named pure function Graph -> Graph with PassInfo metadata.

``InferType()``, ``FuseOps(max_group_size=8)``, ... construct ``Pass`` objects; run them
with ``Sequential([...])(graph, PassContext(opt_level=2))`` or use ``default_pipeline``.
"""
from __future__ import annotations

from workloads.graph.passes.infra import (PASS_REGISTRY, DumpIR, Pass, PassContext, PassInfo,
                                      PassInstrument, PassRecorder, PassTiming, Sequential,
                                      graph_pass, pass_names, run_passes)
from workloads.graph.passes.infer_type import InferType, infer_types
from workloads.graph.passes.simplify import CanonicalizeOps, SimplifyInference
from workloads.graph.passes.fold_constant import FoldConstant, fold_constants
from workloads.graph.passes.cleanup import (DeadCodeElimination, EliminateCommonSubexpr,
                                        dead_code_elimination, eliminate_common_subexpr)
from workloads.graph.passes.fold_scale_axis import FoldScaleAxis
from workloads.graph.passes.convert_layout import ConvertLayout, convert_layout
from workloads.graph.passes.fuse_ops import FuseOps, fuse_ops, partition
from workloads.graph.passes.pipeline import default_pipeline, optimize, pipeline_passes

__all__ = [
    "PASS_REGISTRY", "DumpIR", "Pass", "PassContext", "PassInfo", "PassInstrument",
    "PassRecorder", "PassTiming", "Sequential", "graph_pass", "pass_names", "run_passes",
    "InferType", "infer_types", "SimplifyInference", "CanonicalizeOps", "FoldConstant",
    "fold_constants", "DeadCodeElimination", "EliminateCommonSubexpr",
    "dead_code_elimination", "eliminate_common_subexpr", "FoldScaleAxis", "ConvertLayout",
    "convert_layout", "FuseOps", "fuse_ops", "partition", "default_pipeline", "optimize",
    "pipeline_passes",
]
