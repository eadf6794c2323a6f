"""int8 templates of the quantized anchors (``qdense``, ``qconv2d`` + requantize/qadd): the
groups the Quantize pass makes are claimed by these kinds, and generated kernels are exact
(integers element by element, float32 bit for bit) against the NumPy reference, for default
and sampled configs, odd shapes, both layouts, implicit im2col and 1x1 plain GEMMs."""
from __future__ import annotations

import random

import numpy as np
import pytest

from search_spaces import get_template
from tuner.dispatch import load_kernel
from workloads.fused import workload_for_group
from workloads.graph import GraphBuilder
from workloads.graph.fusion import fused_groups
from workloads.graph.passes import optimize

pytestmark = pytest.mark.skipif(
    "avx2" not in __import__("search_spaces.isa", fromlist=["x"]).compile_features(),
    reason="the int8 engine needs AVX2")


def _group(build):
    b = GraphBuilder("g")
    y = build(b)
    groups = [n for n in fused_groups(optimize(b.build(y), opt_level=2))
              if n.body is not None and any(m.op in ("qdense", "qconv2d") for m in n.body.nodes)]
    (node,) = groups
    return workload_for_group(node)


def _requant(b, acc, c, out="uint8", zp=17, qmin=None, axis=1, per_channel=True):
    n = c if per_channel else 1
    bias = b.const(np.zeros(n, np.int32))
    scale = b.const(np.ones(n, np.float32))
    if out == "float32":
        return b.op("requantize", acc, bias, scale, axis=axis, dtype="float32")
    return b.op("requantize", acc, bias, scale, axis=axis, zero_point=zp, qmin=qmin)


def qdense(M, K, N, *, w_max=64, zp=100, out="uint8", rank3=False, per_channel=True):
    def build(b):
        x = b.input("x", (2, M // 2, K) if rank3 else (M, K), "uint8")
        w = b.const(np.zeros((N, K), np.int8))
        acc = b.op("qdense", x, w, x_zero_point=zp, w_max=w_max)
        if out == "int32":
            return acc
        return _requant(b, acc, N, out, axis=-1, per_channel=per_channel)
    return _group(build)


def qconv(layout="NCHW", *, batch=1, C=5, HW=(9, 7), O=6, k=3, stride=1, pad=1, dil=1,
          w_max=64, zp=31, residual=False, out="uint8", dequantize=False, groups=1,
          per_channel=True):
    kl = "OIHW" if layout == "NCHW" else "HWIO"

    def build(b):
        shape = (batch, C, *HW) if layout == "NCHW" else (batch, *HW, C)
        x = b.input("x", shape, "uint8")
        wshape = (O, C // groups, k, k) if kl == "OIHW" else (k, k, C // groups, O)
        w = b.const(np.zeros(wshape, np.int8))
        acc = b.op("qconv2d", x, w, x_zero_point=zp, w_max=w_max, strides=(stride, stride),
                   padding=(pad,) * 4, dilation=(dil, dil), data_layout=layout, kernel_layout=kl,
                   groups=groups)
        y = _requant(b, acc, O, out, axis=layout.index("C"), per_channel=per_channel)
        if residual:
            other = b.input("r", tuple(y.type.shape) if y.type else None, "uint8")
            y = b.op("qadd", y, other, a_zero_point=17, a_mul=0.75, b_zero_point=90, b_mul=1.3,
                     zero_point=5, qmin=5)
        if dequantize:
            y = b.op("dequantize", y, scale=0.037, zero_point=9)
        return y
    return _group(build)


def check(w, cfg, seed=0):
    t = get_template(w.kind)
    fn = load_kernel(w, t, cfg)
    x, out = w.make_inputs(seed), w.make_outputs()
    fn(*x, *out)
    return w.check(x, out, w.reference(x))


CASES = {
    "dense 7-bit": lambda: qdense(13, 37, 21),
    "dense full range": lambda: qdense(5, 64, 40, w_max=127, zp=0),
    "dense float32 out": lambda: qdense(4, 70, 10, out="float32"),
    "dense int32 out": lambda: qdense(3, 9, 33, out="int32"),
    "dense rank 3, one scale": lambda: qdense(6, 20, 8, rank3=True, per_channel=False),
    "conv NCHW 3x3 pad": lambda: qconv(),
    "conv NCHW stride 2 dilated batch 2": lambda: qconv(batch=2, stride=2, dil=2, pad=2, HW=(11, 10)),
    "conv NHWC 3x3 full range": lambda: qconv("NHWC", w_max=127),
    "conv NCHW 1x1 (plain GEMM, transposed A)": lambda: qconv(k=1, pad=0, C=19, O=23),
    "conv NHWC 1x1 (plain GEMM)": lambda: qconv("NHWC", k=1, pad=0, batch=2),
    "conv NCHW 1x1 batch 2 (im2col)": lambda: qconv(k=1, pad=0, batch=2),
    "conv residual qadd": lambda: qconv(residual=True),
    "conv NHWC 5x5 stride 2 residual": lambda: qconv("NHWC", k=5, stride=2, pad=2, HW=(12, 12), residual=True),
    "conv float32 out": lambda: qconv(out="float32"),
    "conv requantize -> dequantize": lambda: qconv(dequantize=True),
    "conv residual -> dequantize": lambda: qconv("NHWC", residual=True, dequantize=True),
}


# default run: one case per code path kind (each compiles a kernel: seconds); the rest slow
# (a residual qadd in the default run: tests/test_quant_register_requantize.py)
FAST = ("dense 7-bit", "conv NCHW 3x3 pad", "conv NCHW 1x1 (plain GEMM, transposed A)",
        "conv requantize -> dequantize")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CASES])
def test_default_config_is_exact(name):
    w = CASES[name]()
    assert w.kind in ("qdense", "qconv2d")
    cfg = get_template(w.kind).default_config(w, 1)
    if w.w_max <= 64:
        assert cfg["dot"] in ("maddubs", "vnni")
    else:
        assert cfg["dot"] != "maddubs"
    assert check(w, cfg) is None
    assert check(w, cfg, seed=5) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dense 7-bit", "conv NCHW stride 2 dilated batch 2",
                                  "conv NHWC 5x5 stride 2 residual"])
def test_sampled_configs_are_exact(name):
    w = CASES[name]()
    t = get_template(w.kind)
    sp = t.space(w, 2)
    rng = random.Random(1)
    for _ in range(3):
        cfg = sp.sample(rng)
        assert check(w, cfg) is None, cfg


def test_saturating_form_refused_for_full_range_weights():
    w = qdense(8, 32, 16, w_max=127)
    t = get_template("qdense")
    cfg = t.default_config(w, 1)
    bad = cfg.replace(dot="maddubs")
    assert "saturates" in t.space(w, 1).violation(bad)


def test_check_catches_a_wrong_zero_point():
    """The check is exact: a kernel generated for another data zero point fails it."""
    w = qdense(6, 24, 16, zp=100)
    other = qdense(6, 24, 16, zp=101)
    t = get_template("qdense")
    fn = load_kernel(other, t, t.default_config(other, 1))
    x, out = w.make_inputs(), w.make_outputs()
    fn(*x, *out)
    assert "differ" in w.check(x, out, w.reference(x))


def test_unclaimed_epilogue_stays_fixed():
    """A grouped quantized conv at batch 2 (a group's channels are no contiguous run of the
    data) is claimed by no int8 kind: the NumPy reference runs it."""
    def build(b):
        x = b.input("x", (2, 4, 6, 6), "uint8")
        w = b.const(np.zeros((4, 2, 3, 3), np.int8))
        acc = b.op("qconv2d", x, w, groups=2, padding=(1,) * 4)
        return _requant(b, acc, 4)
    assert _group(build).kind == "fixed"


GROUPED = {
    "grouped 1x1 residual": (lambda: qconv(C=12, O=6, groups=3, k=1, pad=0, residual=True), "qconv2d_grouped"),
    "depthwise 3x3": (lambda: qconv(C=8, O=8, groups=8, HW=(9, 19)), "qdepthwise_conv2d"),
    "grouped 3x3 stride 2": (lambda: qconv(C=6, O=9, groups=3, stride=2, HW=(9, 8)), "qconv2d_grouped"),
    "depthwise 3x3 stride 2, 2 outputs per plane": (lambda: qconv(C=5, O=10, groups=5, stride=2), "qdepthwise_conv2d"),
    "depthwise dilated, residual, one scale": (
        lambda: qconv(C=5, O=5, groups=5, HW=(7, 19), dil=2, pad=2, residual=True, per_channel=False),
        "qdepthwise_conv2d"),
    "depthwise 5x5 float32 out": (lambda: qconv(C=3, O=3, groups=3, k=5, pad=2, out="float32"), "qdepthwise_conv2d"),
}


@pytest.mark.parametrize("name", [n if n in ("grouped 1x1 residual", "depthwise 3x3")
                                  else pytest.param(n, marks=pytest.mark.slow) for n in GROUPED])
def test_grouped_and_depthwise_are_exact(name):
    """Grouped convs (one GEMM per group on its channels) and depthwise ones (a direct kernel)
    are generated, exact for the default config and a sampled two-thread one."""
    make, kind = GROUPED[name]
    w = make()
    assert w.kind == kind
    t = get_template(kind)
    assert check(w, t.default_config(w, 1)) is None
    cfg = t.space(w, 2).sample(random.Random(2))
    assert check(w, cfg, seed=3) is None, cfg
    if kind == "qconv2d_grouped":   # two threads take whole groups, each GEMM serial
        g2 = t.default_config(w, 1).replace(parallel="g", threads=2)
        assert t.space(w, 2).is_valid(g2), t.space(w, 2).violation(g2)
        assert "prange(GROUPS)" in t.codegen(w, g2)
        assert check(w, g2, seed=4) is None


def test_grouped_default_splits_groups_over_threads():
    """With threads, a grouped conv's default gives each thread whole groups once the work
    over all groups passes the int8 GEMM's parallel threshold; a small one stays serial."""
    t = get_template("qconv2d_grouped")
    big = qconv(C=240, O=240, groups=4, k=1, pad=0, HW=(28, 28))
    assert big.kind == "qconv2d_grouped"
    d = t.default_config(big, 2)
    assert (d["parallel"], d["threads"]) == ("g", 2), d
    assert t.default_config(big, 1)["threads"] == 1
    small = qconv(C=12, O=6, groups=3, k=1, pad=0)
    assert t.default_config(small, 2)["parallel"] == "none"


@pytest.mark.parametrize("name,par", [("conv NCHW 3x3 pad", "m"),
                                      pytest.param("dense 7-bit", "n", marks=pytest.mark.slow)])
def test_parallel_configs_are_exact(name, par):
    """Two threads: the block loop and the epilogue rows in prange (a private row buffer)."""
    w = CASES[name]()
    t = get_template(w.kind)
    sp = t.space(w, 2)
    cfg = t.default_config(w, 1).replace(parallel=par, threads=2)
    cfg = cfg.replace(**{"tile_m" if par == "m" else "tile_n": min(
        v for v in sp.knob("tile_m" if par == "m" else "tile_n").values
        if v >= (cfg["mr"] if par == "m" else cfg["nr"]))})
    assert sp.is_valid(cfg), sp.violation(cfg)
    assert "prange" in t.codegen(w, cfg)
    assert check(w, cfg) is None


@pytest.mark.parametrize("hw,dil", [pytest.param((6, 12), 1, marks=pytest.mark.slow), ((9, 10), 2)])
def test_nchw_im2col_groups_copied_as_transposes_are_exact(hw, dil):
    """NCHW, 4-row panels of 4-byte groups, stride 1: a panel whose 4 pixels lie in one image
    row copies each K group as one 16-byte transpose, one that wraps to the next row element
    by element (OUT_W 12: every panel in a row; 10: some wrap), dilated taps too."""
    w = qconv(HW=hw, dil=dil, pad=dil, C=7)
    t = get_template(w.kind)
    cfg = t.default_config(w, 1)
    assert cfg["mr"] == 4 and cfg["dot"] in ("maddubs", "vnni")
    assert "vinterleave4(vconcat(lo, hi))" in t.codegen(w, cfg)
    assert check(w, cfg) is None
    assert check(w, cfg, seed=3) is None
    stride2 = qconv(HW=hw, stride=2)
    assert "vinterleave4" not in get_template(stride2.kind).codegen(stride2, t.default_config(stride2, 1))


@pytest.mark.parametrize("hw", [pytest.param((6, 10), marks=pytest.mark.slow), (5, 5)])
def test_nchw_1x1_a_transposed_in_groups_is_exact(hw):
    """A 1x1 NCHW conv's A is the image [C, H*W] transposed: full 4-row panels copy each
    group as one 16-byte transpose; the last partial panel and group (C = 19) by bytes."""
    w = qconv(k=1, pad=0, C=19, O=23, HW=hw)
    t = get_template(w.kind)
    cfg = t.default_config(w, 1)
    assert "vinterleave4(vconcat(lo, hi))" in t.codegen(w, cfg)
    assert check(w, cfg) is None
    assert check(w, cfg, seed=3) is None
