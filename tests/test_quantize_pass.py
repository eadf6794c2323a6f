"""The Quantize pass and calibration on a small conv graph built in the IR."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.errors import UsageError
from workloads.graph.builder import GraphBuilder
from workloads.graph.executor import execute, random_inputs
from workloads.graph.passes.quantize import quantize_graph
from tuner.quant.calibrate import (Calibration, calibrate, kl_threshold, random_samples,
                                   Samples)
from tuner.quant.flow import canonical
from workloads.graph.quant_params import activation_params, default_reduce_range
from tuner.quant.report import compare


def conv_net() -> "Graph":
    """conv+bias+relu, grouped conv, max pool, two branches concatenated, a residual add,
    global pool, a dense head and a softmax: every quantized kind and two FP32 ones."""
    rng = np.random.default_rng(0)

    def w(*shape, scale=None):
        fan_in = int(np.prod(shape[1:]))
        return b.const((rng.standard_normal(shape) * (scale or np.sqrt(2.0 / fan_in))).astype(np.float32))

    b = GraphBuilder("convnet")
    x = b.input("x", (1, 3, 12, 12))
    c1 = b.op("relu", b.op("add", b.op("conv2d", x, w(8, 3, 3, 3), padding=[1] * 4), w(8, 1, 1, scale=0.1)))
    g = b.op("relu", b.op("conv2d", c1, w(8, 2, 3, 3), padding=[1] * 4, groups=4))
    p = b.op("max_pool2d", g, pool_size=[2, 2], strides=[2, 2])
    left = b.op("relu", b.op("conv2d", p, w(4, 8, 1, 1)))
    right = b.op("relu", b.op("conv2d", p, w(4, 8, 3, 3), padding=[1] * 4))
    cat = b.op("concatenate", left, right, axis=1)
    res = b.op("relu", b.op("add", b.op("conv2d", cat, w(8, 8, 3, 3), padding=[1] * 4), p))
    gap = b.op("global_avg_pool2d", res)
    logits = b.op("add", b.op("dense", b.op("flatten", gap), w(10, 8, scale=1.0)), w(10, scale=0.1))
    return b.build(b.op("softmax", logits))


@pytest.fixture(scope="module")
def quantized():
    fp = canonical(conv_net())
    calib = calibrate(fp, random_samples(fp, 16), "minmax")
    return fp, calib, quantize_graph(fp, calib.ranges, reduce_range=True)


def test_coverage_counts_and_reasons(quantized):
    fp, _, q = quantized
    cov = q.coverage.to_dict()
    assert cov["quantized_by_op"] == {"add": 3, "concatenate": 1, "conv2d": 5, "dense": 1,
                                      "max_pool2d": 1, "relu": 5}
    assert cov["fp32_by_op"] == {"flatten": 1, "global_avg_pool2d": 1, "softmax": 1}
    reasons = " | ".join(cov["fp32_reasons"].values())
    assert "no int8 form for global_avg_pool2d" in reasons and "no int8 form for softmax" in reasons
    # quantize at the input and after the (FP32) global pool + flatten, one dequantize before
    # the global pool; the dense output is requantized straight to float32 for the softmax
    assert (cov["quantize_ops"], cov["dequantize_ops"]) == (2, 1)


def test_intermediates_stay_8_bit_between_quantized_ops(quantized):
    _, _, q = quantized
    g = q.graph
    ops = [n.op for n in g.nodes if n.is_compute]
    assert ops.count("qconv2d") == 5 and ops.count("qdense") == 1 and ops.count("qadd") == 1
    for n in g.nodes:
        if n.op in ("qconv2d", "qdense"):
            assert g.type_of(n.inputs[0]).dtype == "uint8" and g.type_of(n.inputs[1]).dtype == "int8"
            assert n.type.dtype == "int32"
        if n.op in ("max_pool2d", "concatenate", "qadd"):
            assert all(g.type_of(i).dtype == "uint8" for i in n.inputs)


def test_concatenated_tensors_share_one_scale(quantized):
    fp, calib, q = quantized
    cat = next(n for n in fp.nodes if n.op == "concatenate")
    ps = {q.params[i] for i in (*cat.inputs, cat.name)}
    assert len(ps) == 1
    lo = min(calib.ranges[i][0] for i in cat.inputs)
    hi = max(calib.ranges[i][1] for i in cat.inputs)
    assert ps.pop() == activation_params(lo, hi)


def test_weights_per_channel_reduce_range(quantized):
    fp, calib, q7 = quantized
    q8 = quantize_graph(fp, calib.ranges, reduce_range=False)
    w7 = [n.value.array for n in q7.graph.nodes if n.is_const and n.type.dtype == "int8"]
    w8 = [n.value.array for n in q8.graph.nodes if n.is_const and n.type.dtype == "int8"]
    assert max(int(np.abs(a).max()) for a in w7) == 64
    assert max(int(np.abs(a).max()) for a in w8) == 127
    for a in w7:   # per output channel: every channel reaches the limit
        assert (np.abs(a.reshape(a.shape[0], -1)).max(axis=1) == 64).all()
    assert default_reduce_range(("avx2", "fma")) is True
    assert default_reduce_range(("avx2", "avx512f", "avx512vnni")) is False


def test_int8_graph_tracks_fp32_on_held_out_inputs(quantized):
    fp, _, q = quantized
    held_out = random_samples(fp, 12, first_seed=500)
    rep = compare(fp, q, held_out)
    e = rep["end_to_end"]
    assert e["top1_agreement"] >= 0.9 and e["top5_agreement"] == 1.0
    assert e["sqnr_db"] > 20
    for row in rep["ops"]:
        assert row["sqnr_db"] > 20 and row["cosine"] > 0.99, row
        assert 0.0 <= row["saturation"] < 0.05
    # and it is exactly what the executor computes on the 8-bit graph
    x = held_out.inputs[0]
    y = execute(q.graph, x)[0]
    assert y.dtype == np.float32 and y.shape == (1, 10)


def test_saturation_counts_values_outside_the_calibrated_range():
    fp = canonical(conv_net())
    calib = calibrate(fp, random_samples(fp, 4), "minmax")
    narrowed = {k: (lo / 4, hi / 4) for k, (lo, hi) in calib.ranges.items()}
    q = quantize_graph(fp, narrowed, reduce_range=True)
    rep = compare(fp, q, random_samples(fp, 2, first_seed=900))
    assert max(r["saturation"] for r in rep["ops"]) > 0.01


def test_calibration_methods():
    b = GraphBuilder("one")
    x = b.input("x", (1, 4096))
    g = canonical(b.build(b.op("relu", b.op("dense", x, b.const(np.eye(8, 4096, dtype=np.float32))))))
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((1, 4096)).astype(np.float32) for _ in range(4)]
    rows[0][0, 0] = 60.0   # one outlier
    s = Samples("test", [[r] for r in rows])
    mm = calibrate(g, s, "minmax").ranges["x"]
    pc = calibrate(g, s, "percentile", percentile=99.9).ranges["x"]
    en = calibrate(g, s, "entropy").ranges["x"]
    assert mm[1] == 60.0
    assert 2.5 < pc[1] < 5.0 and -5.0 < pc[0] < -2.5
    assert en[1] < 20.0 and en[0] > -20.0           # the outlier does not set the range
    hist = np.ones(2048)                             # a uniform distribution keeps its range
    assert kl_threshold(hist, 255) >= 1900


def test_clipping_methods_leave_the_output_head_its_observed_range():
    """percentile/entropy clip intermediate tensors, never the tensors between the last
    conv/dense and the output: clipped logits saturate the top classes to one value."""
    from tuner.quant.calibrate import output_head

    fp = canonical(conv_net())
    head = output_head(fp)
    ops = {n.name: n.op for n in fp.nodes}
    assert set(fp.outputs) <= head
    assert any(ops[h] == "dense" for h in head)            # the logits' producer ...
    assert not any(ops[h] in ("conv2d", "max_pool2d", "concatenate") for h in head)  # ... nothing before it
    s = random_samples(fp, 8)
    for method in ("percentile", "entropy"):
        calib = calibrate(fp, s, method, percentile=99.0)
        for name in head:
            assert calib.ranges[name] == calib.observed[name], (method, name)
        clipped = [n for n in calib.ranges if n not in head and calib.ranges[n] != calib.observed[n]]
        assert clipped, method                               # the method still clips elsewhere


def test_nothing_to_quantize_is_a_usage_error():
    b = GraphBuilder("plain")
    x = b.input("x", (1, 8))
    g = canonical(b.build(b.op("softmax", b.op("relu", x))))
    with pytest.raises(UsageError, match="nothing to quantize"):
        quantize_graph(g, {}, reduce_range=True)


def test_matmul_by_a_constant_becomes_qdense():
    b = GraphBuilder("mm")
    x = b.input("x", (2, 16))
    wt = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)
    g = canonical(b.build(b.op("matmul", x, b.const(wt))))
    calib = calibrate(g, random_samples(g, 4), "minmax")
    q = quantize_graph(g, calib.ranges, reduce_range=False)
    assert [n.op for n in q.graph.nodes if n.is_compute] == ["quantize", "qdense", "requantize"]
    xs = random_inputs(g, seed=77)
    ref, got = execute(g, xs)[0], execute(q.graph, xs)[0]
    assert np.abs(ref - got).max() < 0.05 * np.abs(ref).max()


def test_calibration_of_another_graph_is_reported():
    fp = canonical(conv_net())
    with pytest.raises(UsageError, match="no range for"):
        quantize_graph(fp, {"x": (0.0, 1.0)}, reduce_range=True)


def test_standalone_relu_and_fused_clip():
    """relu after a max pool runs on uint8 as a clamp of levels; relu6 (clip 0..6) after a
    conv becomes requantize's qmin/qmax; flatten passes uint8 through to the dense head."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("relu6")
    x = b.input("x", (1, 2, 8, 8))
    c = b.op("conv2d", x, b.const(rng.standard_normal((4, 2, 3, 3)).astype(np.float32)))
    r = b.op("relu", b.op("max_pool2d", c, pool_size=[2, 2], strides=[2, 2]))
    c2 = b.op("clip", b.op("conv2d", r, b.const(rng.standard_normal((4, 4, 1, 1)).astype(np.float32))),
              a_min=0.0, a_max=6.0)
    g = canonical(b.build(b.op("dense", b.op("flatten", c2), b.const(rng.standard_normal((3, 36)).astype(np.float32)))))
    calib = calibrate(g, random_samples(g, 8), "minmax")
    q = quantize_graph(g, calib.ranges, reduce_range=True)
    qg = q.graph
    ops = [n.op for n in qg.nodes if n.is_compute]
    assert ops == ["quantize", "qconv2d", "requantize", "max_pool2d", "clip", "qconv2d",
                   "requantize", "flatten", "qdense", "requantize"]
    clip = next(n for n in qg.nodes if n.op == "clip")
    assert clip.type.dtype == "uint8" and clip.attrs["a_min"] == q.params[r.name].zero_point
    rq = [n for n in qg.nodes if n.op == "requantize"][1]
    p = q.params[c2.name]
    assert rq.attrs["qmin"] == p.zero_point and rq.attrs["qmax"] == p.level(6.0)
    assert q.coverage.to_dict()["ops_fp32"] == 0
    rep = compare(g, q, random_samples(g, 4, first_seed=300))
    assert min(r["cosine"] for r in rep["ops"]) > 0.99


def test_two_bias_adds_fold_into_one_requantize():
    """conv -> add(bias) -> add(batch norm shift) -> relu (ShuffleNet's first layer): the
    canonical graph has one add (FoldScaleAxis sums the two constants); given both adds
    (the pass disabled), the quantizer sums them into the requantize's bias. Either way the
    relu is its clamp and nothing of the chain stays in FP32 (it once ran as a float epilogue
    in the NumPy reference)."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("twoadds")
    x = b.input("x", (1, 3, 8, 8))
    c = b.op("conv2d", x, b.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32)), padding=[1] * 4)
    a = b.op("add", b.op("add", c, b.const(rng.standard_normal((4, 1, 1)).astype(np.float32))),
             b.const(rng.standard_normal((4, 1, 1)).astype(np.float32)))
    fp = b.build(b.op("max_pool2d", b.op("relu", a), pool_size=[2, 2], strides=[2, 2]))
    unfolded = canonical(fp, disabled=frozenset({"FoldScaleAxis"}))
    for g, adds in ((canonical(fp), 1), (unfolded, 2)):
        q = quantize_graph(g, calibrate(g, random_samples(g, 8), "minmax").ranges, reduce_range=True)
        cov = q.coverage.to_dict()
        assert cov["quantized_by_op"] == {"add": adds, "conv2d": 1, "max_pool2d": 1, "relu": 1}
        assert cov["fp32_by_op"] == {}
        ops = [n.op for n in q.graph.nodes if n.is_compute]
        assert ops == ["quantize", "qconv2d", "requantize", "max_pool2d", "dequantize"]
        xs = random_inputs(g, seed=11)
        ref, got = execute(g, xs)[0], execute(q.graph, xs)[0]
        assert np.abs(ref - got).max() < 0.05 * np.abs(ref).max()
