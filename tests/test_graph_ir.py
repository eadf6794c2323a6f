"""The IR itself: builder, op registry, text form, verifier and the reference executor."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from workloads.errors import TunerError, UsageError
from workloads.graph import (OPS, GraphBuilder, GraphError, OpPattern, ParseError, TensorType,
                         execute, load, parse, random_inputs, to_text, verify)
from workloads.graph.ir import Attrs, ConstValue, Graph, Node

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "workloads" / "graphs").glob("*.txt"))
DATA = sorted((ROOT / "tests" / "data" / "graphs").glob("*.txt"))


# ---- registry -------------------------------------------------------------------------

REQUIRED_OPS = {
    "dense": OpPattern.ANCHOR, "matmul": OpPattern.ANCHOR, "batch_matmul": OpPattern.ANCHOR,
    "conv2d": OpPattern.ANCHOR, "batch_norm": OpPattern.BROADCAST, "bias_add": OpPattern.BROADCAST,
    "add": OpPattern.BROADCAST, "subtract": OpPattern.BROADCAST, "multiply": OpPattern.BROADCAST,
    "divide": OpPattern.BROADCAST, "relu": OpPattern.ELEMWISE, "clip": OpPattern.ELEMWISE,
    "sigmoid": OpPattern.ELEMWISE, "tanh": OpPattern.ELEMWISE,
    "max_pool2d": OpPattern.REDUCTION, "avg_pool2d": OpPattern.REDUCTION,
    "global_avg_pool2d": OpPattern.REDUCTION, "softmax": OpPattern.OPAQUE,
    "concatenate": OpPattern.INJECTIVE, "reshape": OpPattern.INJECTIVE,
    "flatten": OpPattern.INJECTIVE, "transpose": OpPattern.INJECTIVE,
    "layout_transform": OpPattern.INJECTIVE, "dropout": OpPattern.ELEMWISE,
    "lrn": OpPattern.OPAQUE, "constant_of_shape": OpPattern.INJECTIVE,
    "expand_dims": OpPattern.INJECTIVE, "squeeze": OpPattern.INJECTIVE,
}


def test_registry_has_every_required_op_with_its_fusion_kind():
    for name, pattern in REQUIRED_OPS.items():
        assert OPS[name].pattern is pattern, name
    assert OPS["probe"].side_effect and not OPS["relu"].side_effect
    assert OPS["add"].commutative and not OPS["subtract"].commutative


def test_attrs_are_checked_and_completed_with_defaults():
    b = GraphBuilder()
    x = b.input("x", (1, 3, 8, 8))
    w = b.const(np.ones((4, 3, 3, 3), np.float32))
    c = b.op("conv2d", x, w, padding=[1, 1])
    assert c.attrs["padding"] == (1, 1, 1, 1) and c.attrs["kernel_layout"] == "OIHW"
    assert c.attrs["groups"] == 1 and c.type == TensorType((1, 4, 8, 8))
    with pytest.raises(GraphError, match="unknown attribute 'pad'"):
        b.op("conv2d", x, w, pad=[1, 1])
    with pytest.raises(GraphError, match="must be an integer"):
        b.op("conv2d", x, w, groups=1.5)
    with pytest.raises(GraphError, match="required"):
        b.op("clip", x, a_min=0.0)
    with pytest.raises(GraphError, match="unknown op 'conv3d'"):
        b.op("conv3d", x, w)
    assert Attrs({"a": 1}) != Attrs({"a": True}) and Attrs({"a": [1, 2]}) == Attrs({"a": (1, 2)})


@pytest.mark.parametrize("op, shapes, attrs, message", [
    ("add", [(2, 3), (4, 3)], {}, "do not broadcast"),
    ("dense", [(2, 3), (4, 5)], {}, "do not match"),
    ("conv2d", [(1, 3, 8, 8), (4, 2, 3, 3)], {}, "input channels"),
    ("conv2d", [(1, 4, 8, 8), (4, 2, 3, 3)], {"groups": 3}, "groups=3"),
    ("conv2d", [(1, 3, 2, 2), (4, 3, 5, 5)], {}, "larger than padded input"),
    ("reshape", [(2, 3)], {"newshape": [4, -1]}, "cannot reshape"),
    ("concatenate", [(2, 3), (2, 4)], {"axis": 0}, "does not match"),
    ("batch_norm", [(1, 3, 4, 4), (3,), (3,), (3,), (4,)], {}, "var must be"),
    ("max_pool2d", [(1, 3, 4, 4)], {"pool_size": [2, 2], "padding": [2, 2]}, "smaller than the window"),
    ("layout_transform", [(1, 3, 4)], {"src_layout": "NCHW", "dst_layout": "NHWC"}, "does not fit"),
])
def test_shape_rules_reject_ill_typed_ops(op, shapes, attrs, message):
    b = GraphBuilder()
    ins = [b.input(f"x{k}", s) for k, s in enumerate(shapes)]
    with pytest.raises(GraphError, match=message):
        b.op(op, *ins, **attrs)


@pytest.mark.parametrize("op, shapes, attrs, out", [
    ("conv2d", [(2, 8, 9, 9), (6, 4, 3, 3)], {"groups": 2, "strides": [2, 2], "dilation": [2, 1], "padding": [1, 0, 1, 2]}, (2, 6, 4, 5)),
    ("conv2d", [(1, 9, 9, 8), (3, 3, 8, 5)], {"data_layout": "NHWC"}, (1, 7, 7, 5)),
    ("max_pool2d", [(1, 2, 5, 5)], {"pool_size": [2, 2], "strides": [2, 2], "ceil_mode": True}, (1, 2, 3, 3)),
    ("max_pool2d", [(1, 2, 5, 5)], {"pool_size": [2, 2], "strides": [2, 2]}, (1, 2, 2, 2)),
    ("global_avg_pool2d", [(1, 4, 5, 6)], {}, (1, 4, 1, 1)),
    ("matmul", [(5, 2, 3), (3, 4)], {}, (5, 2, 4)),
    ("batch_matmul", [(2, 3, 4), (2, 5, 4)], {"transpose_b": True}, (2, 3, 5)),
    ("flatten", [(2, 3, 4, 5)], {"axis": 2}, (6, 20)),
    ("transpose", [(2, 3, 4)], {}, (4, 3, 2)),
    ("squeeze", [(1, 3, 1)], {}, (3,)),
    ("expand_dims", [(3,)], {"axis": 1, "num_newaxis": 2}, (3, 1, 1)),
    ("layout_transform", [(1, 3, 4, 5)], {"src_layout": "NCHW", "dst_layout": "NHWC"}, (1, 4, 5, 3)),
    ("constant_of_shape", [], {"shape": [2, 3]}, (2, 3)),
])
def test_shape_rules(op, shapes, attrs, out):
    b = GraphBuilder()
    ins = [b.input(f"x{k}", s) for k, s in enumerate(shapes)]
    node = b.op(op, *ins, **attrs)
    assert node.type.shape == out
    g = b.build(node)
    (res,) = execute(g, random_inputs(g))
    assert res.shape == out


# ---- reference implementations against naive loops -----------------------------------

def _naive_conv(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, i, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    opg = o // groups
    for b_, oc, y, z in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // opg
        for ic, a, bb in itertools.product(range(i), range(kh), range(kw)):
            out[b_, oc, y, z] += xp[b_, g * i + ic, y * stride[0] + a * dil[0], z * stride[1] + bb * dil[1]] * w[oc, ic, a, bb]
    return out


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride, pad, dil, groups", [
    ((1, 1), (0, 0, 0, 0), (1, 1), 1), ((2, 1), (1, 0, 2, 1), (1, 2), 1),
    ((1, 2), (1, 1, 1, 1), (2, 1), 2), ((1, 1), (1, 1, 1, 1), (1, 1), 4)])
def test_conv2d_reference_matches_naive_loops(layout, stride, pad, dil, groups):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((4, 4 // groups, 3, 2))
    expect = _naive_conv(x, w, stride, pad, dil, groups)
    b = GraphBuilder()
    if layout == "NCHW":
        xi, wc = b.input("x", x.shape, "float64"), b.const(w)
    else:
        xi, wc = b.input("x", x.transpose(0, 2, 3, 1).shape, "float64"), b.const(w.transpose(2, 3, 1, 0))
    y = b.op("conv2d", xi, wc, strides=stride, padding=pad, dilation=dil, groups=groups, data_layout=layout)
    (got,) = execute(b.build(y), [x if layout == "NCHW" else x.transpose(0, 2, 3, 1)])
    if layout == "NHWC":
        got = got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op, k, s, pad, ceil, include", [
    ("max_pool2d", 3, 2, 1, False, False), ("max_pool2d", 2, 2, 0, True, False),
    ("avg_pool2d", 3, 2, 1, False, False), ("avg_pool2d", 3, 2, 1, False, True),
    ("avg_pool2d", 2, 2, 1, True, True), ("avg_pool2d", 3, 3, 0, True, False)])
def test_pool_reference_matches_naive_loops(op, k, s, pad, ceil, include):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 7, 8))
    b = GraphBuilder()
    xi = b.input("x", x.shape, "float64")
    extra = {"count_include_pad": include} if op == "avg_pool2d" else {}
    y = b.op(op, xi, pool_size=[k, k], strides=[s, s], padding=[pad] * 4, ceil_mode=ceil, **extra)
    (got,) = execute(b.build(y), [x])
    oh, ow = y.type.shape[2:]
    for c, i, j in itertools.product(range(2), range(oh), range(ow)):
        r0, c0 = i * s - pad, j * s - pad
        rows = [r for r in range(r0, r0 + k) if 0 <= r < 7]
        cols = [q for q in range(c0, c0 + k) if 0 <= q < 8]
        win = x[0, c][np.ix_(rows, cols)]
        if op == "max_pool2d":
            expect = win.max()
        else:
            rmax, cmax = min(r0 + k, 7 + pad), min(c0 + k, 8 + pad)
            count = (rmax - r0) * (cmax - c0) if include else win.size
            expect = win.sum() / count
        assert got[0, c, i, j] == pytest.approx(expect), (c, i, j)


def test_lrn_softmax_batch_norm_references():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 5, 2, 2))
    b = GraphBuilder()
    xi = b.input("x", x.shape, "float64")
    lrn = b.op("lrn", xi, size=3, alpha=0.5, beta=0.75, bias=2.0)
    sm = b.op("softmax", xi, axis=1)
    p = [b.const(rng.uniform(0.5, 1.5, 5)) for _ in range(4)]
    bn = b.op("batch_norm", xi, *p, epsilon=0.01)
    got_lrn, got_sm, got_bn = execute(b.build(lrn, sm, bn), [x])
    for c in range(5):
        sq = sum(x[0, j] ** 2 for j in range(max(0, c - 1), min(5, c + 2)))
        np.testing.assert_allclose(got_lrn[0, c], x[0, c] / (2.0 + 0.5 / 3 * sq) ** 0.75)
    np.testing.assert_allclose(got_sm.sum(axis=1), 1.0)
    g, be, m, v = (a.value.array for a in p)
    expect = (x - m[:, None, None]) / np.sqrt(v[:, None, None] + 0.01) * g[:, None, None] + be[:, None, None]
    np.testing.assert_allclose(got_bn, expect)


def test_executor_checks_inputs_and_records_probes():
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    b.op("probe", b.op("relu", x), tag="r")
    g = b.build(b.op("tanh", x))
    trace = []
    execute(g, {"x": np.ones((2, 3), np.float32)}, trace=trace)
    assert [t for t, _ in trace] == ["r"]
    with pytest.raises(UsageError, match="must be float32"):
        execute(g, [np.ones((2, 4), np.float32)])
    with pytest.raises(UsageError, match="missing"):
        execute(g, {"y": np.ones((2, 3), np.float32)})


def test_integer_divide_truncates_toward_zero():
    b = GraphBuilder()
    a, d = b.input("a", (4,), "int32"), b.input("d", (4,), "int32")
    (q,) = execute(b.build(b.op("divide", a, d)), [np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)])
    assert q.tolist() == [3, -3, -3, 3]


# ---- text form ------------------------------------------------------------------------

@pytest.mark.parametrize("path", EXAMPLES + DATA, ids=lambda p: p.name)
def test_example_graphs_parse_verify_and_round_trip(path):
    g = load(str(path))
    verify(g)
    text = to_text(g)
    assert parse(text) == g
    assert to_text(parse(text)) == text
    execute(g, random_inputs(g))


def test_constant_forms_round_trip_exactly():
    b = GraphBuilder("consts")
    rng = np.random.default_rng(3)
    x = b.input("x", (2, 40))
    c_big = b.const(rng.standard_normal((2, 40)).astype(np.float32), "big")
    c_fill = b.const(np.full((2, 40), -0.0, np.float32), "fill")
    c_small = b.const(np.array([[1.5, -2.25e-7], [3.0, np.inf]], np.float64), "small")
    c_int = b.const(np.arange(6, dtype=np.int64).reshape(2, 3), "ints")
    c_rec = b.const_init("rec", (3, 4), init="normal", seed=7, scale=0.5)
    c_scalar = b.const(np.float32(0.1), "scalar")
    y = b.op("add", b.op("add", x, c_big), b.op("multiply", c_fill, c_scalar))
    g = b.build(y, c_small, c_int, c_rec, b.op("reshape", x, name="weird name/0", newshape=[80]))
    text = to_text(g)
    assert 'const(init="normal", scale=0.5, seed=7)' in text and "fill=-0.0" in text
    assert "b64=" in text and '%"weird name/0"' in text and "data=[1.5, -2.25e-07, 3.0, inf]" in text
    g2 = parse(text)
    assert g2 == g
    for n in g.nodes:
        if n.is_const:
            assert g2.node(n.name).value.array.tobytes() == n.value.array.tobytes()
    elided = to_text(g, elide=True)
    assert "elided=80" in elided
    with pytest.raises(ParseError, match="elided"):
        parse(elided)


def test_fused_graphs_round_trip():
    from workloads.graph.passes import optimize
    g = optimize(load(str(ROOT / "workloads" / "graphs" / "conv_block.txt")), 3)
    assert any(n.is_fused for n in g.nodes)
    assert parse(to_text(g)) == g


def test_text_may_be_out_of_order_and_types_are_optional():
    g = parse("""
        graph g(%x: float32[2, 3]) {
          %b = relu(%a)
          %a = tanh(%x) : float32[2, 3]
          return %b
        }""")
    assert [n.name for n in g.nodes] == ["x", "a", "b"] and g.node("b").type == TensorType((2, 3))


@pytest.mark.parametrize("text, message", [
    ("graph g(%x: float32[2]) {\n  %y = frob(%x)\n  return %y\n}", "line 2: unknown op 'frob'"),
    ("graph g(%x: float32[2]) {\n  %y = relu(%z)\n  return %y\n}", "line 2: %y uses undefined value %z"),
    ("graph g(%x: float32[2]) {\n  %y = relu(%x)\n  %y = tanh(%x)\n  return %y\n}", "line 3: %y is defined twice"),
    ("graph g(%x: float32[2]) {\n  %a = add(%x, %b)\n  %b = relu(%a)\n  return %b\n}", "line 2: cycle: %a -> %b -> %a"),
    ("graph g(%x: float32[2]) {\n  %y = relu(%x) : float32[3]\n  return %y\n}", "line 2: %y: annotated type float32\\[3\\]"),
    ("graph g(%x: float32[2]) {\n  %y = relu(%x %x)\n  return %y\n}", "line 2: expected ','"),
    ("graph g(%x: float16[2]) {\n  return %x\n}", "line 1: unknown dtype 'float16'"),
    ("graph g(%x: float32[2]) {\n\n  %y = add(%x, %x, %x)\n  return %y\n}", "line 3: .*takes 2 input"),
    ("graph g(%x: float32[2]) {\n  %c = const(fill=1.0)\n  return %c\n}", "line 2: constant %c needs a type"),
    ("graph g(%x: float32[2]) {\n  %c = const(data=[1.0]) : float32[2]\n  return %c\n}", "line 2: constant %c: 1 values"),
    ("graph g(%x: float32[2]) {\n  %y = clip(%x, a_min=0.0)\n  return %y\n}", "line 2: clip: attribute 'a_max' is required"),
    ("graph g(%x: float32[2]) {\n  return %x\n} trailing", "line 3: expected end of input"),
    ("graph g(%x: float32[2]) {\n  %y = relu(%x) @\n}", "line 2: unexpected character '@'"),
])
def test_parse_errors_have_line_numbers(text, message):
    with pytest.raises(ParseError, match=message) as info:
        parse(text)
    assert isinstance(info.value, UsageError)


# ---- verifier -------------------------------------------------------------------------

def _typed(name, op, inputs=(), t=(2,), **attrs):
    from workloads.graph.ops import get_op
    return Node(name, op, tuple(inputs), get_op(op).make_attrs(attrs) if op in OPS else Attrs(attrs),
                TensorType(t))


@pytest.mark.parametrize("nodes, outputs, message", [
    ([Node("x", "input", type=TensorType((2,))), _typed("y", "relu", ["x"]), _typed("y", "tanh", ["x"])],
     ["y"], "%y is defined 2 times"),
    ([Node("x", "input", type=TensorType((2,))), _typed("a", "add", ["x", "b"]), _typed("b", "relu", ["a"])],
     ["b"], "cycle: %a -> %b -> %a"),
    ([Node("x", "input", type=TensorType((2,))), _typed("y", "relu", ["q"])], ["y"], "undefined value %q"),
    ([Node("x", "input", type=TensorType((2,))), Node("y", "frob", ("x",), type=TensorType((2,)))], ["y"],
     "unknown op 'frob'"),
    ([Node("x", "input", type=TensorType((2,))), _typed("y", "relu", ["x"], t=(3,))], ["y"],
     "type float32\\[3\\] but relu computes float32\\[2\\]"),
    ([Node("x", "input", type=TensorType((2,))), Node("y", "relu", ("x",))], ["y"], "has no type"),
    ([Node("x", "input", type=TensorType((2,))), Node("y", "clip", ("x",), Attrs({"a_min": 0.0}), TensorType((2,)))],
     ["y"], "a_max' is required"),
    ([Node("x", "input", type=TensorType((2,)))], ["z"], "returns undefined value %z"),
])
def test_verifier_reports_problems(nodes, outputs, message):
    with pytest.raises(GraphError, match=message) as info:
        verify(Graph("g", tuple(nodes), tuple(outputs)))
    assert isinstance(info.value, TunerError)


def test_verifier_checks_fused_bodies():
    from workloads.graph.passes import FuseOps
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    g = FuseOps()(b.build(b.op("relu", b.op("tanh", x))))
    verify(g)
    f = next(n for n in g.nodes if n.is_fused)
    bad_body = f.body.replace(nodes=f.body.nodes[:1] + (f.body.nodes[1].replace(type=TensorType((3, 2))),) + f.body.nodes[2:])
    with pytest.raises(GraphError, match="computes"):
        verify(g.replace(nodes=tuple(f.replace(body=bad_body) if n is f else n for n in g.nodes)))


def test_const_values_are_immutable_and_compared_by_bytes():
    a = np.arange(4, dtype=np.float32)
    cv = ConstValue(a)
    a[0] = 99  # the IR holds its own copy
    assert cv.array[0] == 0 and not cv.array.flags.writeable
    assert cv == ConstValue(np.arange(4, dtype=np.float32)) and hash(cv) == hash(ConstValue(cv.array))
    assert cv != ConstValue(np.arange(4, dtype=np.float64))
    with pytest.raises(GraphError, match="dtype"):
        ConstValue(np.ones(2, dtype=np.float16))
