"""SimplifyInference and CanonicalizeOps: op-by-op expansions written as rule tables."""
from __future__ import annotations

from workloads.graph.ir import Graph, Node
from workloads.graph.passes.infra import graph_pass
from workloads.graph.passes.rewrite import Rewriter, rewrite


def _along_axis(rw: Rewriter, vec: Node | str, axis: int, rank: int, name: str) -> Node | str:
    """Reshape a per-channel vector [C] so it broadcasts along ``axis`` of a rank-``rank`` value."""
    trailing = rank - 1 - axis
    if trailing == 0:
        return vec
    return rw.op("expand_dims", vec, axis=1, num_newaxis=trailing, name=rw.fresh(name))


def _batch_norm(node: Node, rw: Rewriter) -> Node:
    """(x - mean) / sqrt(var + eps) * gamma + beta  ->  x * scale + shift, where
    scale = gamma / sqrt(var + eps) and shift = beta - mean * scale (FoldConstant folds these
    when the parameters are constants, leaving one multiply and one add)."""
    x, gamma, beta, mean, var = node.inputs
    t = rw.type(x)
    axis = node.attrs["axis"] % t.rank
    base = node.name
    eps = rw.builder.const(node.attrs["epsilon"], rw.fresh(f"{base}.eps"), dtype=t.dtype)
    std = rw.op("sqrt", rw.op("add", var, eps, name=rw.fresh(f"{base}.var_eps")), name=rw.fresh(f"{base}.std"))
    scale = rw.op("divide", gamma, std, name=rw.fresh(f"{base}.scale"))
    shift = rw.op("subtract", beta, rw.op("multiply", mean, scale, name=rw.fresh(f"{base}.mean_scale")),
                  name=rw.fresh(f"{base}.shift"))
    scaled = rw.op("multiply", x, _along_axis(rw, scale, axis, t.rank, f"{base}.scale_b"),
                   name=rw.fresh(f"{base}.mul"))
    return rw.op("add", scaled, _along_axis(rw, shift, axis, t.rank, f"{base}.shift_b"), name=base)


def _dropout(node: Node, rw: Rewriter) -> str:
    return node.inputs[0]  # identity at inference


SIMPLIFY_INFERENCE_RULES = {
    "batch_norm": _batch_norm,
    "dropout": _dropout,
}


@graph_pass("SimplifyInference", opt_level=0)
def SimplifyInference(graph: Graph) -> Graph:
    """batch_norm -> multiply/add with per-channel scale and shift; dropout -> identity."""
    return rewrite(graph, SIMPLIFY_INFERENCE_RULES)


def _bias_add(node: Node, rw: Rewriter) -> Node:
    x, bias = node.inputs
    t = rw.type(x)
    b = _along_axis(rw, bias, node.attrs["axis"] % t.rank, t.rank, f"{node.name}.bias")
    return rw.op("add", x, b, name=node.name)


CANONICALIZE_RULES = {
    "bias_add": _bias_add,
}


@graph_pass("CanonicalizeOps", opt_level=1)
def CanonicalizeOps(graph: Graph) -> Graph:
    """bias_add(x, b, axis) -> add(x, expand_dims(b)) (a plain broadcast add)."""
    return rewrite(graph, CANONICALIZE_RULES)
