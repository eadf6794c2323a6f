"""Quantize: rewrite a calibrated FP32 graph into 8-bit ops (``workloads.graph.ops.quant``).

Input: a typed, canonical graph (the O2 passes before FuseOps: batch_norm folded into the
weights, biases as ``add`` of a constant) and a range per float tensor (``tuner.quant.
calibrate``). What becomes 8-bit, read top to bottom in ``_plan``:

- an *anchor chain*: ``conv2d`` (grouped too) / ``dense`` / ``matmul`` by a constant [K, N]
  with a constant weight, then optionally ``add``s of per-channel constants (the bias; a
  conv's own bias and a folded batch norm's shift are two, summed into one) and a
  ``relu``/``clip``, each the only user of the previous value. It becomes
  ``qconv2d``/``qdense`` (int32 accumulator) and one ``requantize`` (bias, per-channel
  scale, the activation as a clamp) so the anchor's output is 8-bit straight away;
  FuseOps then puts the ``requantize`` into the anchor's epilogue. When no quantized op
  reads the chain's output (the logits before a softmax or a graph output) and it has no
  activation, the ``requantize`` outputs float32 instead (no 8-bit round trip, no
  ``dequantize``);
- a *residual add* of two activations of one shape (optionally + relu/clip): ``qadd``;
- ``max_pool2d``, ``concatenate``, ``relu``/``clip`` and data movement (reshape, flatten,
  transpose, squeeze, expand_dims, layout_transform) whose inputs are already 8-bit: the same
  op on uint8, exact when input and output share one scale and zero point (their tensors
  are *tied*: one range, the union of theirs — so a concatenation has one scale);
- anything else stays FP32 with the reason recorded; ``quantize``/``dequantize`` are inserted
  where an 8-bit value meets an FP32 op (each counted as a conversion). Graph outputs are
  dequantized and keep their names.

Activations are uint8 asymmetric, weights int8 symmetric per output channel (7-bit with
``reduce_range``); see ``workloads.graph.quant_params`` for why.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from workloads.errors import UsageError
from workloads.graph.builder import GraphBuilder, const_array
from workloads.graph.ir import Graph, Node
from workloads.graph.passes.infra import graph_pass
from workloads.graph.quant_params import QParams, activation_params, quantize_weight, weight_qmax

ANCHORS = ("conv2d", "dense", "matmul")
ACTIVATIONS = ("relu", "clip")
MOVEMENT = ("reshape", "flatten", "transpose", "squeeze", "expand_dims", "layout_transform")
PASS_THROUGH = ("max_pool2d", "concatenate", *ACTIVATIONS, *MOVEMENT)


@dataclass(frozen=True)
class Chain:
    """Original nodes rewritten as one quantized op: anchor [+ bias adds] [+ activation]."""

    kind: str              # "anchor" | "qadd" | "pass"
    nodes: tuple[str, ...]
    bias: tuple[str, ...] = ()   # the adds of per-channel constants, summed into one bias
    act: str | None = None

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def out(self) -> str:
        return self.nodes[-1]


@dataclass
class Coverage:
    """What was quantized: op counts both ways, why each FP32 op stayed, conversions."""

    quantized: Counter = field(default_factory=Counter)
    fp32: Counter = field(default_factory=Counter)
    reasons: dict[str, str] = field(default_factory=dict)   # node -> why it stayed FP32
    quantize_ops: int = 0
    dequantize_ops: int = 0

    @property
    def conversions(self) -> int:
        return self.quantize_ops + self.dequantize_ops

    def to_dict(self) -> dict:
        q, f = sum(self.quantized.values()), sum(self.fp32.values())
        return {"ops_quantized": q, "ops_fp32": f,
                "share_quantized": q / (q + f) if q + f else 0.0,
                "quantized_by_op": dict(sorted(self.quantized.items())),
                "fp32_by_op": dict(sorted(self.fp32.items())),
                "fp32_reasons": dict(self.reasons),
                "quantize_ops": self.quantize_ops, "dequantize_ops": self.dequantize_ops,
                "conversions": self.conversions}


@dataclass
class QuantizedGraph:
    graph: Graph
    coverage: Coverage
    params: dict[str, QParams]          # float tensor name -> params of its 8-bit version
    qnames: dict[str, str]              # float tensor name -> its 8-bit value in ``graph``
                                        # (or itself: an anchor output left in float32)
    chains: list[Chain]
    reduce_range: bool


# ---- planning -------------------------------------------------------------------------

def _only_user(g: Graph, name: str, op: tuple[str, ...]) -> Node | None:
    users = g.users.get(name, ())
    if len(users) != 1 or name in g.output_set:
        return None
    u = g.node(users[0])
    return u if u.op in op else None


def _channel_axis(g: Graph, n: Node) -> int:
    if n.op == "conv2d":
        return n.attrs["data_layout"].index("C")
    return g.type_of(n.name).rank - 1


def _bias_vector(g: Graph, anchor: Node, add: Node) -> np.ndarray | None:
    """The per-channel [C] vector when ``add`` adds a constant along the anchor's channel axis
    to the anchor's output or to an earlier such add's."""
    src = next((i for i in add.inputs if not g.node(i).is_const), None)
    other = add.inputs[1] if add.inputs[0] == src else add.inputs[0]
    b = const_array(g, other)
    out = g.type_of(anchor.name)
    if src is None or b is None or add.inputs.count(src) != 1 or g.type_of(add.name).shape != out.shape:
        return None
    ax = _channel_axis(g, anchor)
    if b.ndim > out.rank:
        return None
    full = (1,) * (out.rank - b.ndim) + b.shape
    if any(d != 1 for i, d in enumerate(full) if i != ax) or full[ax] not in (1, out.shape[ax]):
        return None
    return np.broadcast_to(b.reshape(-1), (out.shape[ax],)).astype(np.float64)


def _anchor_reason(g: Graph, n: Node) -> str | None:
    """Why this anchor cannot be quantized, or None."""
    x, w = (g.node(i) for i in n.inputs)
    if not x.type.is_float:
        return f"data is {x.type.dtype}"
    if not w.is_const:
        return "weight is not a constant"
    if n.op == "matmul" and w.type.rank != 2:
        return "matmul weight is not 2-D"
    if n.op == "matmul" and x.type.rank < 1:
        return "matmul data has rank 0"
    return None


def _extend(g: Graph, last: Node, anchor: Node | None) -> tuple[list[str], tuple[str, ...], str | None]:
    nodes, bias, act = [], [], None
    while anchor is not None:
        add = _only_user(g, last.name, ("add",))
        if add is None or _bias_vector(g, anchor, add) is None:
            break
        nodes.append(add.name)
        bias.append(add.name)
        last = add
    a = _only_user(g, last.name, ACTIVATIONS)
    if a is not None:
        nodes.append(a.name)
        act = a.name
    return nodes, tuple(bias), act


def _plan(g: Graph) -> tuple[list[Chain], dict[str, str]]:
    """Chains in topological order, and the reason each op left in FP32 stays there."""
    chains: list[Chain] = []
    absorbed: set[str] = set()
    eight_bit: set[str] = set()     # values that will exist as uint8
    reasons: dict[str, str] = {}
    for n in g.nodes:
        if not n.is_compute or n.name in absorbed:
            continue
        float_out = n.type is not None and n.type.is_float
        chain = None
        if n.op in ANCHORS and float_out:
            why = _anchor_reason(g, n)
            if why is None:
                more, bias, act = _extend(g, n, n)
                chain = Chain("anchor", (n.name, *more), bias, act)
            else:
                reasons[n.name] = why
        elif n.op == "add" and float_out:
            a, b = (g.node(i) for i in n.inputs)
            if a.is_const or b.is_const or a.type.shape != b.type.shape \
                    or a.type.shape != n.type.shape or not a.type.is_float:
                reasons[n.name] = "add of a constant or of a broadcast (not a residual add)"
            else:
                more, _, act = _extend(g, n, None)
                chain = Chain("qadd", (n.name, *more), None, act)
        elif n.op in PASS_THROUGH and float_out:
            if all(i in eight_bit for i in n.inputs):
                chain = Chain("pass", (n.name,))
            else:
                reasons[n.name] = "input is FP32 (its producer is not quantized)"
        else:
            reasons[n.name] = f"no int8 form for {n.op}" if float_out else f"{n.type.dtype} output"
        if chain is not None:
            chains.append(chain)
            absorbed.update(chain.nodes)
            eight_bit.add(chain.out)
    return chains, reasons


# ---- tied ranges ----------------------------------------------------------------------

class _Ties:
    """Union-find over tensor names: tied tensors share one range and one QParams."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def _params(g: Graph, chains: list[Chain], ranges: Mapping[str, tuple[float, float]]) -> dict[str, QParams]:
    ties = _Ties()
    for c in chains:
        if c.kind == "pass":
            node = g.node(c.head)
            for i in node.inputs:
                ties.union(i, c.out)
    needed = set()
    for c in chains:
        needed.add(c.out)
        needed.update(i for i in g.node(c.head).inputs if not g.node(i).is_const)
    groups: dict[str, tuple[float, float]] = {}
    for name in needed:
        if name not in ranges:
            raise UsageError(f"calibration has no range for %{name} (calibrated on another graph?)")
        lo, hi = ranges[name]
        root = ties.find(name)
        glo, ghi = groups.get(root, (np.inf, -np.inf))
        groups[root] = (min(glo, lo), max(ghi, hi))
    return {name: activation_params(*groups[ties.find(name)]) for name in needed}


# ---- emission -------------------------------------------------------------------------

class _Emitter:
    def __init__(self, g: Graph, params: dict[str, QParams], cov: Coverage) -> None:
        self.g, self.params, self.cov = g, params, cov
        self.b = GraphBuilder(g.name, reserved=[n.name for n in g.nodes])
        self.q: dict[str, str] = {}   # float name -> uint8 value
        self.f: dict[str, str] = {}   # float name -> float value

    def quantized(self, name: str) -> str:
        if name not in self.q:
            p = self.params[name]
            node = self.b.op("quantize", self.floating(name), name=self.b.fresh(f"{name}.q"),
                             scale=p.scale, zero_point=p.zero_point)
            self.cov.quantize_ops += 1
            self.q[name] = node.name
        return self.q[name]

    def floating(self, name: str) -> str:
        if name not in self.f:
            p = self.params[name]
            self.b.op("dequantize", self.q[name], name=name, scale=p.scale, zero_point=p.zero_point)
            self.cov.dequantize_ops += 1
            self.f[name] = name
        return self.f[name]

    def clamp(self, act: str | None, p: QParams) -> dict:
        if act is None:
            return {}
        a = self.g.node(act)
        if a.op == "relu":
            return {"qmin": p.zero_point}
        return {"qmin": p.level(a.attrs["a_min"]), "qmax": p.level(a.attrs["a_max"])}

    def anchor(self, c: Chain, qmax_w: int, float_out: bool = False) -> None:
        g, b = self.g, self.b
        n = g.node(c.head)
        x, w = n.inputs
        px = self.params[x]
        py = QParams(1.0, 0) if float_out else self.params[c.out]
        warr = const_array(g, w)
        if n.op == "conv2d":
            axis = n.attrs["kernel_layout"].index("O")
        else:
            if n.op == "matmul":   # x @ W[K, N] is dense(x, W^T)
                warr = warr.T
            axis = 0
        wq, ws = quantize_weight(warr, axis, qmax_w)
        channels = wq.shape[axis]
        acc_scale = np.float64(px.scale) * ws.astype(np.float64)
        bias = sum((_bias_vector(g, n, g.node(a)) for a in c.bias), np.zeros(channels))
        bq = np.clip(np.rint(bias / acc_scale), np.iinfo(np.int32).min // 2,
                     np.iinfo(np.int32).max // 2).astype(np.int32)
        rq_scale = (acc_scale / np.float64(py.scale)).astype(np.float32)
        wname = b.const(wq, b.fresh(f"{w}.q"))
        qx = self.quantized(x)
        if n.op == "conv2d":
            acc = b.op("qconv2d", qx, wname, name=b.fresh(f"{n.name}.acc"),
                       x_zero_point=px.zero_point, w_max=qmax_w, **dict(n.attrs))
        else:
            acc = b.op("qdense", qx, wname, name=b.fresh(f"{n.name}.acc"), x_zero_point=px.zero_point,
                       w_max=qmax_w)
        out_attrs = {"dtype": "float32"} if float_out else \
            {"zero_point": py.zero_point, **self.clamp(c.act, py)}
        out = b.op("requantize", acc, b.const(bq, b.fresh(f"{c.out}.bias")),
                   b.const(rq_scale, b.fresh(f"{c.out}.rq_scale")),
                   name=c.out if float_out else b.fresh(f"{c.out}.q"),
                   axis=_channel_axis(g, n), **out_attrs)
        (self.f if float_out else self.q)[c.out] = out.name

    def qadd(self, c: Chain) -> None:
        n = self.g.node(c.head)
        a, bb = n.inputs
        pa, pb, py = self.params[a], self.params[bb], self.params[c.out]
        qa, qb = self.quantized(a), self.quantized(bb)
        out = self.b.op("qadd", qa, qb, name=self.b.fresh(f"{c.out}.q"),
                        a_zero_point=pa.zero_point, a_mul=pa.scale / py.scale,
                        b_zero_point=pb.zero_point, b_mul=pb.scale / py.scale,
                        zero_point=py.zero_point, **self.clamp(c.act, py))
        self.q[c.out] = out.name

    def pass_through(self, c: Chain) -> None:
        n = self.g.node(c.head)
        p = self.params[c.out]
        ins = [self.quantized(i) for i in n.inputs]
        if n.op in ACTIVATIONS:   # on uint8 with the input's params: a clamp of levels
            lo, hi = (p.zero_point, 255) if n.op == "relu" else \
                (p.level(n.attrs["a_min"]), p.level(n.attrs["a_max"]))
            out = self.b.op("clip", *ins, name=self.b.fresh(f"{c.out}.q"), a_min=lo, a_max=hi)
        else:
            out = self.b.op(n.op, *ins, name=self.b.fresh(f"{c.out}.q"), **dict(n.attrs))
        self.q[c.out] = out.name

    def copy(self, n: Node) -> None:
        if n.is_input or n.is_const:
            self.b.add(n)
        else:
            self.b.add(n.replace(inputs=tuple(self.floating(i) for i in n.inputs)))
        self.f[n.name] = n.name


def check_quantizable(graph: Graph) -> None:
    """UsageError when no op of ``graph`` would be quantized (before calibrating it)."""
    chains, _ = _plan(graph)
    if not any(c.kind in ("anchor", "qadd") for c in chains):
        ops = sorted({n.op for n in graph.nodes if n.is_compute})
        raise UsageError(f"graph {graph.name}: nothing to quantize (no conv2d/dense/matmul with a "
                         f"constant weight and no residual add; ops: {', '.join(ops) or 'none'})")


def quantize_graph(graph: Graph, ranges: Mapping[str, tuple[float, float]], *,
                   reduce_range: bool) -> QuantizedGraph:
    """The 8-bit graph of ``graph`` given calibrated ``ranges`` (see the module docstring)."""
    check_quantizable(graph)
    chains, reasons = _plan(graph)
    params = _params(graph, chains, ranges)
    cov = Coverage()
    em = _Emitter(graph, params, cov)
    by_head = {c.head: c for c in chains}
    in_chain = {name for c in chains for name in c.nodes}
    qmax_w = weight_qmax(reduce_range)
    float_out = {c.out for c in chains if c.kind == "anchor" and c.act is None
                 and not any(u in by_head for u in graph.users.get(c.out, ()))}
    for n in graph.nodes:
        if n.name in by_head:
            c = by_head[n.name]
            {"anchor": lambda: em.anchor(c, qmax_w, c.out in float_out), "qadd": lambda: em.qadd(c),
             "pass": lambda: em.pass_through(c)}[c.kind]()
            for m in c.nodes:
                cov.quantized[graph.node(m).op] += 1
        elif n.name not in in_chain:
            em.copy(n)
            if n.is_compute:
                cov.fp32[n.op] += 1
                cov.reasons[n.name] = f"{n.op}: {reasons.get(n.name, 'not quantized')}"
    outs = [em.floating(o) for o in graph.outputs]
    from workloads.graph.passes.cleanup import dead_code_elimination
    qgraph = dead_code_elimination(em.b.build(*outs))
    qnames = {**dict(em.q), **{o: o for o in float_out}}
    return QuantizedGraph(qgraph, cov, params, qnames, chains, reduce_range)


@graph_pass("Quantize", opt_level=4)
def Quantize(graph: Graph, ranges: Mapping[str, tuple[float, float]] | None = None,
             reduce_range: bool = True) -> Graph:
    """8-bit ops from calibrated ranges (``tuner.quant``); not in the default pipelines."""
    if ranges is None:
        raise UsageError("Quantize needs calibrated ranges (python -m tuner quantize)")
    return quantize_graph(graph, ranges, reduce_range=reduce_range).graph
