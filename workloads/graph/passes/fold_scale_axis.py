"""FoldScaleAxis: fold a per-channel scale that follows conv2d/dense/matmul into the weights.

    multiply(conv2d(x, W), S)            ->  conv2d(x, W * s)
    multiply(add(conv2d(x, W), B), S)    ->  add(conv2d(x, W * s), B * S)

when W, S (and B) are constants, S (and B) vary only along the output-channel axis, and the
anchor's value (and the add's) has no other consumer. This is what removes the multiply left
by SimplifyInference's batch_norm expansion after FoldConstant. The same holds for
``dense(x, W[N, K])`` (scale rows of W) and ``matmul(x, W[K, N])`` (scale columns).
Repeated scales cascade (the rewrite runs to a fixpoint). Two constant adds in a row become
one (``add(add(x, B1), B2) -> add(x, B1 + B2)``): the conv's bias and the batch norm's
shift that the scale leaves behind.
"""
from __future__ import annotations

import numpy as np

from workloads.graph.ir import Graph, Node
from workloads.graph.passes.infra import graph_pass
from workloads.graph.passes.rewrite import Rewriter, rewrite


def _channel_axis(anchor: Node, rw: Rewriter) -> int | None:
    rank = anchor.type.rank
    if anchor.op == "conv2d":
        return anchor.attrs["data_layout"].index("C")
    if anchor.op in ("dense", "matmul") and rank >= 1:
        if anchor.op == "matmul" and (rw.type(anchor.inputs[1]).rank != 2 or rank < 2):
            return None
        return rank - 1
    return None


def _per_channel(arr: np.ndarray, out_shape: tuple, axis: int) -> np.ndarray | None:
    """The length-C vector that ``arr`` broadcasts to along ``axis``, or None."""
    rank = len(out_shape)
    if arr.ndim > rank:
        return None
    shape = (1,) * (rank - arr.ndim) + arr.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, out_shape[axis]):
        return None
    return np.broadcast_to(arr.reshape(shape[axis]), (out_shape[axis],))


def _scaled_weight(anchor: Node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    if anchor.op == "conv2d":
        o_axis = anchor.attrs["kernel_layout"].index("O")
        shape = [1] * w.ndim
        shape[o_axis] = s.size
        return (w * s.reshape(shape)).astype(w.dtype)
    if anchor.op == "dense":       # W[N, K]
        return (w * s[:, None]).astype(w.dtype)
    return (w * s[None, :]).astype(w.dtype)  # matmul W[K, N]


def _split(node: Node, rw: Rewriter) -> tuple[str, np.ndarray] | None:
    """For a binary op with exactly one constant operand: (the other operand, the constant)."""
    a, b = node.inputs
    ca, cb = rw.const(a), rw.const(b)
    if (ca is None) == (cb is None):
        return None
    return (b, ca) if ca is not None else (a, cb)


def _fold_multiply(node: Node, rw: Rewriter) -> Node | None:
    split = _split(node, rw)
    if split is None:
        return None
    value, scale = split
    producer = rw.node(value)
    if not rw.single_use(value) or node.type != producer.type:
        return None
    bias_node, bias = None, None
    if producer.op == "add":
        inner = _split(producer, rw)
        if inner is None or not rw.single_use(inner[0]) or rw.node(inner[0]).type != producer.type:
            return None
        bias_node, (value, bias) = producer, inner
        producer = rw.node(value)
    if producer.op not in ("conv2d", "dense", "matmul"):
        return None
    weight = rw.const(producer.inputs[1])
    axis = _channel_axis(producer, rw)
    if weight is None or axis is None:
        return None
    s = _per_channel(scale, producer.type.shape, axis)
    if s is None or (bias is not None and _per_channel(bias, producer.type.shape, axis) is None):
        return None
    new_w = rw.new_const(_scaled_weight(producer, weight, s), base=f"{producer.inputs[1]}.scaled")
    anchor = rw.op(producer.op, producer.inputs[0], new_w, name=rw.fresh(f"{producer.name}.scaled"),
                   **producer.attrs)
    if bias_node is None:
        return anchor
    new_b = rw.new_const((bias * scale).astype(bias.dtype), base=f"{node.name}.bias")
    operands = (anchor, new_b) if bias_node.inputs[0] == value else (new_b, anchor)
    return rw.op("add", *operands, name=node.name)


def _fold_add(node: Node, rw: Rewriter) -> Node | None:
    """add(add(x, B1), B2) -> add(x, B1 + B2) for float constants B1, B2 (broadcasting is
    associative: same shape). The conv's bias and a batch norm's shift once the scale is
    folded: one operand in the anchor's epilogue instead of two, as ONNX Runtime folds a
    batch norm into the conv's bias. Rounds once where the two adds rounded twice."""
    outer = _split(node, rw)
    if outer is None:
        return None
    value, b2 = outer
    producer = rw.node(value)
    if (producer.op != "add" or not rw.single_use(value)
            or np.dtype(node.type.dtype).kind != "f"):
        return None
    inner = _split(producer, rw)
    if inner is None:
        return None
    x, b1 = inner
    b = rw.new_const((b1 + b2).astype(node.type.dtype), base=f"{node.name}.bias")
    return rw.op("add", x, b, name=node.name)


FOLD_SCALE_RULES = {"multiply": _fold_multiply, "add": _fold_add}


@graph_pass("FoldScaleAxis", opt_level=2, required=("InferType",))
def FoldScaleAxis(graph: Graph) -> Graph:
    """Fold per-channel scales after conv2d/dense/matmul into their constant weights, and
    two constant adds in a row into one."""
    return rewrite(graph, FOLD_SCALE_RULES, fixpoint=True)
