"""The 8-bit ops: exact integer references, shape rules, text form and fusion."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.graph.builder import GraphBuilder
from workloads.graph.graph_errors import GraphError
from workloads.graph.executor import execute
from workloads.graph.ops import get_op
from workloads.graph.passes import fuse_ops
from workloads.graph.text import parse, to_text


def _run(op, *args, **attrs):
    b = GraphBuilder("t")
    refs = [b.const(np.asarray(a), f"a{i}") for i, a in enumerate(args)]
    return execute(b.build(b.op(op, *refs, **attrs)), [])[0]


def test_quantize_rounds_half_to_even_and_clamps():
    x = np.array([0.5, 1.5, 2.5, -0.5, 300.0, -300.0, 0.24], np.float32)
    q = _run("quantize", x, scale=1.0, zero_point=10)
    assert q.dtype == np.uint8
    assert q.tolist() == [10, 12, 12, 10, 255, 0, 10]
    s = _run("quantize", x, scale=1.0, zero_point=0, dtype="int8")
    assert s.dtype == np.int8 and s.tolist() == [0, 2, 2, 0, 127, -128, 0]
    back = _run("dequantize", q, scale=0.5, zero_point=10)
    assert back.dtype == np.float32 and back.tolist() == [0.0, 1.0, 1.0, 0.0, 122.5, -5.0, 0.0]


@pytest.mark.parametrize("groups,stride,pad,zp", [(1, 1, 1, 0), (1, 2, 0, 128), (2, 1, 1, 37), (4, 2, 1, 255)])
def test_qconv2d_is_exact_integer_convolution(groups, stride, pad, zp):
    rng = np.random.default_rng(groups * 10 + stride)
    x = rng.integers(0, 256, (2, 4, 7, 6)).astype(np.uint8)
    w = rng.integers(-128, 128, (8, 4 // groups, 3, 3)).astype(np.int8)
    attrs = dict(strides=[stride, stride], padding=[pad] * 4, groups=groups)
    acc = _run("qconv2d", x, w, x_zero_point=zp, **attrs)
    assert acc.dtype == np.int32
    # the float64 convolution of the integer values is exact at these magnitudes
    ref = _run("conv2d", x.astype(np.float64) - zp, w.astype(np.float64), **attrs)
    np.testing.assert_array_equal(acc, ref.astype(np.int64))
    # what a u8 x s8 kernel computes: sum(x * w) - zp * sum(w) (padding with the zero point)
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=zp)
    raw = _run("conv2d", xp.astype(np.float64), w.astype(np.float64), strides=[stride] * 2, groups=groups)
    corr = _run("conv2d", np.full(xp.shape, float(zp)), w.astype(np.float64), strides=[stride] * 2, groups=groups)
    np.testing.assert_array_equal(acc, (raw - corr).astype(np.int64))


def test_qdense_and_requantize_follow_the_documented_formula():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (3, 20)).astype(np.uint8)
    w = rng.integers(-64, 65, (5, 20)).astype(np.int8)
    acc = _run("qdense", x, w, x_zero_point=100)
    np.testing.assert_array_equal(acc, (x.astype(np.int64) - 100) @ w.astype(np.int64).T)
    bias = rng.integers(-500, 500, 5).astype(np.int32)
    scale = rng.uniform(1e-4, 1e-2, 5).astype(np.float32)
    y = _run("requantize", acc, bias, scale, axis=1, zero_point=20, qmin=20)
    expect = np.clip(np.rint((acc + bias).astype(np.float32) * scale) + 20, 20, 255)
    np.testing.assert_array_equal(y, expect.astype(np.uint8))
    f = _run("requantize", acc, bias, scale, axis=-1, dtype="float32")
    np.testing.assert_array_equal(f, (acc + bias).astype(np.float32) * scale)


def test_qadd_rescales_both_operands():
    a = np.array([0, 10, 200, 255], np.uint8)
    b = np.array([128, 0, 255, 5], np.uint8)
    y = _run("qadd", a, b, a_zero_point=10, a_mul=0.5, b_zero_point=128, b_mul=0.25, zero_point=50)
    fa = (a.astype(np.int32) - 10).astype(np.float32) * np.float32(0.5)
    fb = (b.astype(np.int32) - 128).astype(np.float32) * np.float32(0.25)
    np.testing.assert_array_equal(y, np.clip(np.rint(fa + fb) + 50, 0, 255).astype(np.uint8))


@pytest.mark.parametrize("op,args,attrs,msg", [
    ("qconv2d", [np.zeros((1, 2, 3, 3), np.float32), np.zeros((1, 2, 1, 1), np.int8)], {}, "uint8"),
    ("qdense", [np.zeros((1, 4), np.uint8), np.zeros((2, 3), np.int8)], {}, "do not match"),
    ("requantize", [np.zeros((1, 4), np.int32), np.zeros(3, np.int32), np.ones(4, np.float32)],
     {"axis": 1}, "bias must be"),
    ("quantize", [np.zeros(3, np.float32)], {"scale": 1.0, "zero_point": 300}, "zero_point"),
    ("quantize", [np.zeros(3, np.float32)], {"scale": 0.0}, "scale"),
    ("requantize", [np.zeros(2, np.int32), np.zeros(2, np.int32), np.ones(2, np.float32)],
     {"axis": 0, "qmin": 200, "qmax": 100}, "clamp"),
])
def test_shape_rules_reject_bad_operands(op, args, attrs, msg):
    with pytest.raises(GraphError, match=msg):
        _run(op, *args, **attrs)


def test_requantize_overflow_is_an_error_not_a_wrap():
    acc = np.array([2**31 - 10], np.int32)
    with pytest.raises(GraphError, match="overflows int32"):
        _run("requantize", acc, np.array([100], np.int32), np.ones(1, np.float32), axis=0)


def _small_quantized_graph():
    b = GraphBuilder("qblock")
    x = b.input("x", (1, 3, 6, 6))
    q = b.op("quantize", x, scale=0.05, zero_point=128)
    w = b.const(np.random.default_rng(0).integers(-64, 65, (4, 3, 3, 3)).astype(np.int8), "w")
    acc = b.op("qconv2d", q, w, padding=[1, 1, 1, 1], x_zero_point=128)
    r = b.op("requantize", acc, b.const(np.arange(4, dtype=np.int32), "bias"),
             b.const(np.full(4, 0.01, np.float32), "s"), zero_point=0, qmin=0)
    p = b.op("max_pool2d", r, pool_size=[2, 2], strides=[2, 2])
    s = b.op("qadd", p, p, a_mul=0.5, b_mul=0.5, zero_point=0)
    return b.build(b.op("dequantize", s, scale=0.1))


def test_text_form_round_trips_and_requantize_fuses_into_the_anchor():
    g = _small_quantized_graph()
    text = to_text(g)
    for op in ("quantize(", "qconv2d(", "requantize(", "qadd(", "dequantize(", "uint8[", "int8["):
        assert op in text
    g2 = parse(text)
    assert g2 == g
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(execute(g, [x])[0], execute(g2, [x])[0])
    fused = fuse_ops(g)
    bodies = [n.body.name for n in fused.nodes if n.is_fused]
    assert "fused_qconv2d_requantize" in bodies
    np.testing.assert_array_equal(execute(fused, [x])[0], execute(g, [x])[0])


def test_fusion_kinds_are_registered():
    from workloads.graph.ops import OpPattern
    assert get_op("qconv2d").pattern == OpPattern.ANCHOR
    assert get_op("qdense").pattern == OpPattern.ANCHOR
    assert get_op("requantize").pattern == OpPattern.BROADCAST
    assert get_op("quantize").pattern == OpPattern.ELEMWISE
