"""Random well-typed graphs for property tests (Hypothesis), and result comparison.

``graphs()`` is a Hypothesis strategy: a 4-D input in NCHW or NHWC, then a random sequence
of steps drawn from ``STEPS`` (conv2d, batch_norm, bias_add, per-channel scales, binary ops
between values, activations, pools, softmax/lrn, concatenate, layout round trips, duplicates
for CSE, probes, a dense head, constant_of_shape chains ...), some of whose values end up
unused (dead code). Values stay numerically tame (no division by values near zero) so a
rewrite that preserves semantics agrees with the original to float tolerance.

Importing this module needs ``hypothesis`` (a test dependency).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from hypothesis import strategies as st

from workloads.graph.builder import GraphBuilder
from workloads.graph.executor import execute
from workloads.graph.ir import Graph, Node

Draw = Callable


class _State:
    def __init__(self, b: GraphBuilder, layout: str, dtype: str, rng: np.random.Generator) -> None:
        self.b, self.layout, self.dtype, self.rng = b, layout, dtype, rng
        self.v4: list[Node] = []   # rank-4 values in `layout`
        self.v2: list[Node] = []   # rank-2 values [N, F]
        self.k = 0

    def const(self, shape, scale=0.5, low=None):
        self.k += 1
        if low is not None:
            a = self.rng.uniform(low, low + 1.0, size=shape)
        else:
            a = self.rng.standard_normal(shape) * scale
        return self.b.const(a.astype(self.dtype), f"c{self.k}")

    @property
    def caxis(self) -> int:
        return self.layout.index("C")

    def chan_shape(self, c: int) -> tuple:
        """A per-channel constant shape for this layout ([C, 1, 1] or [C])."""
        return (c, 1, 1) if self.layout == "NCHW" else (c,)

    def dims(self, v: Node) -> dict:
        return dict(zip(self.layout, v.type.shape))

    def shape(self, **d) -> tuple:
        return tuple(d[ch] for ch in self.layout)


def _conv(s: _State, draw: Draw) -> Node | None:
    x = draw(st.sampled_from(s.v4))
    d = s.dims(x)
    k = draw(st.integers(1, 3))
    stride, dil, pad = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(0, 1))
    groups = draw(st.sampled_from([1, d["C"]]))
    o = groups * draw(st.integers(1, 2)) if groups > 1 else draw(st.integers(1, 4))
    if min(d["H"], d["W"]) + 2 * pad < dil * (k - 1) + 1:
        return None
    kshape = (o, d["C"] // groups, k, k) if s.layout == "NCHW" else (k, k, d["C"] // groups, o)
    return s.b.op("conv2d", x, s.const(kshape), strides=[stride, stride], dilation=[dil, dil],
                  padding=[pad] * 4, groups=groups, data_layout=s.layout)


def _conv_epilogue(s: _State, draw: Draw) -> Node | None:
    """conv2d or dense followed by per-channel scale/shift ops (what FoldScaleAxis folds)."""
    if s.v2 and draw(st.booleans()):
        y = draw(st.sampled_from(s.v2))
        units = y.type.shape[1]
        y = s.b.op("dense", y, s.const((units, units), scale=0.3))
        y = s.b.op("multiply", y, s.const((units,)))
        s.v2.append(y)
        return y
    y = _conv(s, draw)
    if y is None:
        return None
    c = s.dims(y)["C"]
    if draw(st.booleans()):
        y = s.b.op("add", y, s.const(s.chan_shape(c)))
    y = s.b.op("multiply", *((y, s.const(s.chan_shape(c))) if draw(st.booleans())
                             else (s.const((1,) * 4), y)))
    return s.b.op("relu", y) if draw(st.booleans()) else y


def _batch_norm(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    c = s.dims(x)["C"]
    var = s.const((c,), low=0.5)
    if draw(st.booleans()):  # gamma built at run time, as ONNX exports without weights do
        gamma = s.b.op("multiply", s.b.op("constant_of_shape", shape=[c], value=1.5, dtype=s.dtype),
                       s.const((c,)))
    else:
        gamma = s.const((c,))
    return s.b.op("batch_norm", x, gamma, s.const((c,)), s.const((c,)), var, axis=s.caxis,
                  epsilon=1e-3)


def _bias_add(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    return s.b.op("bias_add", x, s.const((s.dims(x)["C"],)), axis=s.caxis)


def _channel_op(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    op = draw(st.sampled_from(["multiply", "add", "subtract", "divide"]))
    c = s.const(s.chan_shape(s.dims(x)["C"]), low=0.5 if op == "divide" else None)
    return s.b.op(op, *((x, c) if op == "divide" or draw(st.booleans()) else (c, x)))


def _binary(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    same = [v for v in s.v4 if v.type == x.type]
    y = draw(st.sampled_from(same))
    return s.b.op(draw(st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"])), x, y)


def _unary(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    op = draw(st.sampled_from(["relu", "sigmoid", "tanh", "clip", "dropout", "negative"]))
    if op == "clip":
        return s.b.op("clip", x, a_min=-0.5, a_max=0.75)
    return s.b.op(op, x)


def _pool(s: _State, draw: Draw) -> Node | None:
    x = draw(st.sampled_from(s.v4))
    d = s.dims(x)
    op = draw(st.sampled_from(["max_pool2d", "avg_pool2d", "global_avg_pool2d"]))
    if op == "global_avg_pool2d":
        return s.b.op(op, x, layout=s.layout)
    k = draw(st.integers(1, min(3, d["H"], d["W"])))
    pad = draw(st.integers(0, k // 2)) if k > 1 else 0
    extra = {"count_include_pad": draw(st.booleans())} if op == "avg_pool2d" else {}
    return s.b.op(op, x, pool_size=[k, k], strides=[draw(st.integers(1, 2))] * 2, padding=[pad] * 4,
                  ceil_mode=draw(st.booleans()), layout=s.layout, **extra)


def _normalize(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    if draw(st.booleans()):
        return s.b.op("softmax", x, axis=s.caxis)
    return s.b.op("lrn", x, size=draw(st.integers(1, 3)), alpha=0.01, axis=s.caxis)


def _concat(s: _State, draw: Draw) -> Node | None:
    x = draw(st.sampled_from(s.v4))
    d = s.dims(x)
    fits = [v for v in s.v4 if all(s.dims(v)[ch] == d[ch] for ch in "NHW")]
    others = draw(st.lists(st.sampled_from(fits), min_size=1, max_size=2))
    return s.b.op("concatenate", x, *others, axis=s.caxis)


def _layout_round_trip(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    other = "NHWC" if s.layout == "NCHW" else "NCHW"
    t = s.b.op("layout_transform", x, src_layout=s.layout, dst_layout=other)
    if draw(st.booleans()):
        t = s.b.op("relu", t)
    return s.b.op("layout_transform", t, src_layout=other, dst_layout=s.layout)


def _reshape_round_trip(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    e = s.b.op("expand_dims", x, axis=0)
    return s.b.op("reshape", s.b.op("squeeze", e, axes=[0]), newshape=list(x.type.shape))


def _duplicate(s: _State, draw: Draw) -> Node | None:
    ops = [n for n in s.v4 if n.is_compute and n.op != "probe"]
    if not ops:
        return None
    n = draw(st.sampled_from(ops))
    return s.b.op(n.op, *n.inputs, **n.attrs)


def _probe(s: _State, draw: Draw) -> Node | None:
    s.k += 1
    if draw(st.integers(0, 3)) == 0:  # a side effect on constants must not be folded away
        c = s.b.op("multiply", s.const((2, 3)), s.const((3,)))
        s.b.op("probe", c, tag=f"probe{s.k}")
        return None
    return s.b.op("probe", draw(st.sampled_from(s.v4)), tag=f"probe{s.k}")


def _dense_head(s: _State, draw: Draw) -> Node:
    x = draw(st.sampled_from(s.v4))
    flat = s.b.op("flatten", x)
    units = draw(st.integers(1, 6))
    y = s.b.op("dense", flat, s.const((units, flat.type.shape[1]), scale=0.2))
    if draw(st.booleans()):
        y = s.b.op("multiply", y, s.const((units,)))
    if draw(st.booleans()):
        y = s.b.op("relu", s.b.op("bias_add", y, s.const((units,))))
    s.v2.append(y)
    return y


STEPS = [_conv, _conv_epilogue, _batch_norm, _bias_add, _channel_op, _channel_op, _binary, _unary,
         _unary, _pool, _normalize, _concat, _layout_round_trip, _reshape_round_trip,
         _duplicate, _probe, _dense_head]


@st.composite
def graphs(draw: Draw, max_steps: int = 10, dtypes: tuple[str, ...] = ("float32", "float64"),
           layouts: tuple[str, ...] = ("NCHW", "NHWC")) -> Graph:
    dtype = draw(st.sampled_from(dtypes))
    layout = draw(st.sampled_from(layouts))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = GraphBuilder("random")
    s = _State(b, layout, dtype, rng)
    dims = {"N": draw(st.integers(1, 2)), "C": draw(st.integers(1, 4)),
            "H": draw(st.integers(2, 6)), "W": draw(st.integers(2, 6))}
    s.v4.append(b.input("x", s.shape(**dims), dtype))
    for _ in range(draw(st.integers(1, max_steps))):
        step = draw(st.sampled_from(STEPS))
        node = step(s, draw)
        if node is not None and node.type.rank == 4:
            s.v4.append(node)
    candidates = s.v4[1:] + s.v2
    if not candidates:
        return b.build(b.op("relu", s.v4[0]))
    outs = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3, unique_by=lambda n: n.name))
    last = candidates[-1]
    return b.build(*([last] + [o for o in outs if o is not last]))


def run(graph: Graph, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Outputs and the probe trace (tag -> value) of one execution."""
    trace: list = []
    outs = execute(graph, inputs, trace=trace)
    return outs, dict(trace)


def assert_same_results(before: tuple, after: tuple, dtype: str, what: str = "") -> None:
    """Compare two ``run`` results within a tolerance for ``dtype``."""
    (outs_a, trace_a), (outs_b, trace_b) = before, after
    assert len(outs_a) == len(outs_b), f"{what}: {len(outs_a)} outputs became {len(outs_b)}"
    assert trace_a.keys() == trace_b.keys(), f"{what}: probes {sorted(trace_a)} became {sorted(trace_b)}"
    rtol = 2e-4 if dtype == "float32" else 1e-9
    pairs = list(zip(outs_a, outs_b)) + [(trace_a[k], trace_b[k]) for k in trace_a]
    for k, (a, b) in enumerate(pairs):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: result {k} {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        scale = max(1.0, float(np.abs(a).max(initial=0.0)))
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * scale, err_msg=f"{what}: result {k}")
