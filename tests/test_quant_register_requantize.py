"""The int8 anchors' requantize in the micro-kernel's registers (``quant_anchor`` knob
``requantize="registers"``): exact against the integer reference for row-major (NHWC, dense)
and NCHW outputs, full tiles and partial ones (channel and pixel edges, NCHW tiles across two
images), a residual qadd, int8 outputs and one scale per tensor; where it does not apply the
space says why and the default keeps the separate pass."""
from __future__ import annotations

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


def conv(layout="NHWC", *, batch=1, C=8, HW=(5, 6), O=20, k=1, pad=0, stride=1, residual=False,
         out="uint8", per_channel=True, dequantize=False):
    """qconv2d -> requantize (random per-channel scales near the levels' step) [-> qadd]."""
    kl = "OIHW" if layout == "NCHW" else "HWIO"
    rng = np.random.default_rng(3)
    b = GraphBuilder("g")
    x = b.input("x", (batch, C, *HW) if layout == "NCHW" else (batch, *HW, C), "uint8")
    w = b.const(rng.integers(-64, 65, (O, C, k, k) if kl == "OIHW" else (k, k, C, O)).astype(np.int8))
    acc = b.op("qconv2d", x, w, x_zero_point=7, w_max=64, padding=(pad,) * 4,
               strides=(stride, stride), data_layout=layout, kernel_layout=kl)
    n = O if per_channel else 1
    bias = b.const(rng.integers(-3000, 3000, n).astype(np.int32))
    scale = b.const((rng.random(n) * 0.004 + 0.001).astype(np.float32))
    zp = -5 if out == "int8" else 60
    y = b.op("requantize", acc, bias, scale, axis=layout.index("C"), zero_point=zp, dtype=out)
    if residual:
        other = b.input("r", tuple(y.type.shape), out)
        y = b.op("qadd", y, other, a_zero_point=zp, a_mul=0.8, b_zero_point=3, b_mul=0.6,
                 zero_point=-2 if out == "int8" else 9, dtype=out)
    if dequantize:
        y = b.op("dequantize", y, scale=0.02, zero_point=zp)
    (node,) = [m for m in fused_groups(optimize(b.build(y), opt_level=2))
               if m.body is not None and any(o.op == "qconv2d" for o in m.body.nodes)]
    return workload_for_group(node)


def dense(M=9, K=40, N=48):
    rng = np.random.default_rng(4)
    b = GraphBuilder("g")
    x = b.input("x", (M, K), "uint8")
    w = b.const(rng.integers(-64, 65, (N, K)).astype(np.int8))
    acc = b.op("qdense", x, w, x_zero_point=100, w_max=64)
    y = b.op("requantize", acc, b.const(np.zeros(N, np.int32)),
             b.const(np.full(N, 0.003, np.float32)), axis=-1, zero_point=128)
    (node,) = [m for m in fused_groups(optimize(b.build(y), opt_level=2))
               if m.body is not None and any(o.op == "qdense" for o in m.body.nodes)]
    return workload_for_group(node)


def exact(w, cfg):
    fn = load_kernel(w, get_template(w.kind), cfg)
    for seed in (0, 9):
        x, out = w.make_inputs(seed), w.make_outputs()
        fn(*x, *out)
        err = w.check(x, out, w.reference(x))
        if err is not None:
            return err
    return None


CASES = {
    # full 4 x 16 tiles and both edges (20 channels: one full panel and 4; 30 pixels: 7 full
    # tiles and 2 rows), the residual operand read 16 bytes per row, int8 levels
    "NHWC residual int8": lambda: conv("NHWC", residual=True, out="int8"),
    # NCHW: 4 pixels x 16 channels stored transposed; 2 images of 30 pixels, so tiles cross
    # from one image to the next (the lane-by-lane path) and the residual is read transposed
    "NCHW 3x3 residual batch 2": lambda: conv("NCHW", batch=2, k=3, pad=1, residual=True),
    "NCHW 1x1 one scale": lambda: conv("NCHW", HW=(4, 8), per_channel=False, O=32),
    "NHWC 3x3 stride 2": lambda: conv("NHWC", k=3, pad=1, stride=2, HW=(9, 9), C=12),
    "dense": dense,
}
FAST = ("NHWC residual int8", "NCHW 3x3 residual batch 2")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CASES])
def test_registers_form_is_exact(name):
    w = CASES[name]()
    t = get_template(w.kind)
    cfg = t.default_config(w, 1)
    assert cfg["requantize"] == "registers", t.space(w, 1).violation(cfg.replace(requantize="registers"))
    src = t.codegen(w, cfg)
    assert "np.empty((M, N), np.int32)" not in src and "vpack_" in src
    assert ("vstore_t4(C" in src) == (w.geometry.get("data_layout") == "NCHW")
    assert exact(w, cfg) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["NHWC residual int8", "NCHW 3x3 residual batch 2"])
def test_separate_pass_is_exact_too(name):
    w = CASES[name]()
    cfg = get_template(w.kind).default_config(w, 1).replace(requantize="pass")
    assert exact(w, cfg) is None


@pytest.mark.slow
def test_registers_form_with_two_threads_and_a_wide_tile():
    """NCHW with the block loop over M on two threads; NHWC with 2 x 32 tiles (two byte
    vectors per row)."""
    w = conv("NCHW", batch=2, HW=(6, 6), O=40, residual=True)
    t = get_template(w.kind)
    sp = t.space(w, 2)
    cfg = t.default_config(w, 1).replace(parallel="m", threads=2, tile_m=16)
    assert sp.is_valid(cfg), sp.violation(cfg)
    assert cfg["requantize"] == "registers" and "prange" in t.codegen(w, cfg)
    assert exact(w, cfg) is None
    w = conv("NHWC", HW=(3, 5), O=40, residual=True)
    cfg = t.default_config(w, 1).replace(nr=32, mr=2)
    assert t.space(w, 1).is_valid(cfg), t.space(w, 1).violation(cfg)
    assert cfg["requantize"] == "registers"
    assert exact(w, cfg) is None


def test_where_it_does_not_apply_the_space_says_why():
    t = get_template("qconv2d")
    # a trailing dequantize: the separate pass
    w = conv("NHWC", dequantize=True)
    cfg = t.default_config(w, 1)
    assert cfg["requantize"] == "pass"
    assert "dequantize" in t.space(w, 1).violation(cfg.replace(requantize="registers"))
    # more than one K block: partial sums go through memory
    w = conv("NHWC", C=64, k=3, pad=1)
    cfg = t.default_config(w, 1).replace(tile_k=64)
    assert "one K block" in t.space(w, 1).violation(cfg.replace(requantize="registers"))
    assert t.space(w, 1).violation(cfg.replace(requantize="pass")) is None
    # NCHW with 6-row tiles
    w = conv("NCHW")
    cfg = t.default_config(w, 1).replace(mr=6, dot="madd16")
    assert "mr a multiple of 4" in t.space(w, 1).violation(cfg.replace(requantize="registers"))
