"""conv2d prologue: a per-channel scale/shift/relu chain in front of a pointwise NCHW conv
(DenseNet's pre-activation batch norm + relu) joins the conv's group and is applied while the
conv packs its image (``FuseOps``' ``prologue_ok``; ``Conv2dTemplate.prologue``)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from search_spaces import get_template, isa
from tuner.dispatch import load_kernel
from workloads import from_key
from workloads.errors import InstantiationError
from workloads.graph import GraphBuilder, execute, random_inputs
from workloads.graph.fusion import describe, fused_groups
from workloads.graph.passes import optimize
from workloads.fused import workload_for_group


def pre_activation(C=24, H=7, W=9, O=40, k=1, shared=False, full_shift=False):
    """x -> multiply(scale) -> add(shift) -> relu -> conv2d(k x k) -> relu: the batch norm +
    relu of a DenseNet layer (``shared``: the relu output also feeds a second op;
    ``full_shift``: the shift is a whole tensor, not a per-channel value)."""
    b = GraphBuilder("g")
    x = b.input("x", (1, C, H, W))
    s = b.const_init("s", (C, 1, 1), init="normal", seed=1)
    t = b.input("t", (1, C, H, W)) if full_shift else b.const_init("t", (C, 1, 1), init="normal", seed=2)
    w = b.const_init("w", (O, C, k, k), init="normal", seed=3, scale=0.2)
    y = b.op("relu", b.op("add", b.op("multiply", x, s), t))
    z = b.op("relu", b.op("conv2d", y, w, strides=[1, 1], padding=[k // 2] * 4))
    if shared:
        return b.build(z, b.op("negative", y))
    return b.build(z)


def groups(g):
    return [describe(n) for n in fused_groups(optimize(g, opt_level=2))]


def test_batch_norm_relu_before_a_pointwise_conv_is_its_prologue():
    (d,) = groups(pre_activation())
    assert d.anchor == "conv2d" and [e.op for e in d.prologue] == ["multiply", "add", "relu"]
    assert [e.op for e in d.epilogue] == ["relu"]
    assert d.summary() == "[multiply -> add -> relu] -> conv2d + [relu]"
    p = json.loads(d.key)
    assert d.inputs[p["anchor_inputs"][0]].shape == (1, 24, 7, 9)   # the raw image
    # FuseOps(prologue=False) (build(prologue=False)): the chain is its own group again
    from workloads.graph.passes import FuseOps, InferType

    apart = [describe(n) for n in fused_groups(FuseOps(prologue=False)(InferType()(pre_activation())))]
    assert [d.summary() for d in apart] == ["broadcast + [multiply -> add -> relu]", "conv2d + [relu]"]
    # a group without a prologue keeps its key unchanged (no "prologue" field)
    (plain,) = [x for x in groups(pre_activation(k=3)) if x.anchor == "conv2d"]
    assert "prologue" not in json.loads(plain.key)


@pytest.mark.parametrize("case", [dict(k=3), dict(shared=True), dict(full_shift=True)])
def test_no_prologue_where_the_packing_cannot_apply_it(case):
    """A 3x3 conv (its padding must stay zero), a chain whose result is also used elsewhere,
    and a shift that varies per pixel stay separate groups."""
    ds = groups(pre_activation(**case))
    assert all(not d.prologue for d in ds)
    assert any(d.anchor is None and "relu" in d.ops for d in ds)


def test_prologue_workload_round_trips_and_its_reference_is_the_graph():
    g = pre_activation()
    (n,) = fused_groups(optimize(g, opt_level=2))
    w = workload_for_group(n)
    assert w.kind == "conv2d" and w.prologue and from_key(w.key) == w
    assert w.summary() == "[multiply -> add -> relu] -> conv2d + [relu]"
    xs = w.make_inputs(seed=3)
    (ref,) = w.reference(xs)
    x, s, t, wt = (xs[i] for i in (0, 1, 2, 3))
    y = np.maximum(x.astype(np.float64) * s + t, 0)
    want = np.maximum(np.einsum("ok,kp->op", wt.reshape(40, 24), y.reshape(24, -1)), 0)
    np.testing.assert_allclose(ref.reshape(40, -1), want, rtol=1e-5, atol=1e-5)
    assert w.flops() > 2 * 40 * 24 * 63   # the prologue's ops are counted too


def prologue_workload():
    (n,) = fused_groups(optimize(pre_activation(), opt_level=2))
    return workload_for_group(n)


@pytest.mark.parametrize("target", [isa.AVX2, isa.AVX512], ids=lambda i: i.name)
def test_prologue_is_applied_in_the_image_packing(target):
    """(Source only, for either ISA: the compiled kernel is checked by the slow tests below.)"""
    with isa.using(target):
        _check_prologue_source(target.fp32_lanes)


def _check_prologue_source(lanes: int):
    w = prologue_workload()
    t = get_template("conv2d")
    cfg = t.default_config(w, 1)
    assert cfg["pack_b"] is True and not t.space(w, 1).is_valid(cfg.replace(pack_b=False))
    src = t.codegen(w, cfg)
    assert "Prologue on each image row" in src
    assert "def pack_b(B, b_base, p0, j0, kc, nc, Bp, geo, pa, pb, q1, q2):" in src
    assert f"qv1 = vsplat(q1[p0 + p], {lanes})" in src and f"vmax(x, vsplat(ZERO, {lanes}))" in src
    assert "pack_b(B, b_base, p0, j0, kc, nc, Bp, geo, 0, kc, q1, q2)" in src
    # the same conv without a prologue generates what it did before (no q operands)
    plain = t.codegen(from_key(w.key.replace(',"prologue":' + json.dumps(w.prologue, separators=(",", ":")), "")
                               .replace('"ops":["multiply","add","relu","conv2d"', '"ops":["conv2d"')), cfg)
    assert "q1" not in plain and "def pack_b(B, b_base, p0, j0, kc, nc, Bp, geo, pa, pb):" in plain


@pytest.mark.slow   # compiles a conv module (15-50 s on 2 shared cores)
def test_prologue_kernel_is_exact_and_wrong_prologue_is_caught():
    import tuner

    w = prologue_workload()
    t = get_template("conv2d")
    fn = load_kernel(w, t, t.default_config(w, 1))
    xs, out = w.make_inputs(), w.make_outputs()
    fn(*xs, *out)
    assert w.check(xs, out, w.reference(xs)) is None
    xs[1] = -np.abs(xs[1])              # most scaled values negative: the relu matters
    fn(*xs, *out)
    assert w.check(xs, out, w.reference(xs)) is None
    out[0][:] = execute_without_prologue_relu(w, xs)   # a kernel that skipped the relu
    assert w.check(xs, out, w.reference(xs)) is not None
    # the model: one kernel (the same module), as the graph computes
    g = pre_activation()
    m = tuner.build(g, threads=1)
    assert m.summary.kernels == 1
    xs = random_inputs(g, seed=1)
    np.testing.assert_allclose(m.run(xs)[0], execute(g, xs)[0], rtol=1e-4, atol=1e-4)


def execute_without_prologue_relu(w, xs):
    x, s, t, wt = (xs[i].astype(np.float64) for i in (0, 1, 2, 3))
    y = x * s + t
    return np.maximum(np.einsum("ok,kp->op", wt.reshape(40, 24), y.reshape(24, -1)), 0).reshape(1, 40, 7, 9)


def test_prologue_outside_a_pointwise_nchw_conv_is_refused():
    g = pre_activation()
    (n,) = fused_groups(optimize(g, opt_level=2))
    p = json.loads(workload_for_group(n).key.split(":", 1)[1])
    p["prologue"][0]["others"][0][1] = [1, 24, 7, 9]   # a per-pixel operand: no row form
    p["inputs"][1][0] = [1, 24, 7, 9]
    w = from_key("conv2d:" + json.dumps(p, sort_keys=True, separators=(",", ":")))
    with pytest.raises(InstantiationError, match="per-channel"):
        get_template("conv2d").codegen(w, get_template("conv2d").default_config(w, 1))
    # no other kind takes a prologue (its template would ignore it)
    from workloads.errors import UsageError
    from workloads.fused import FixedGroup

    with pytest.raises(UsageError, match="no prologue"):
        FixedGroup.from_params(p)


@pytest.mark.slow   # compiles a parallel module (about a minute under load)
def test_prologue_in_a_block_packed_by_every_thread():
    """Split on M at 2 threads, the image block every thread reads is packed by all of them
    (``pack_b_split_lines``: a prange in the parallel core), each applying the prologue to its rows."""
    from search_spaces.gemm_engine.packing import SPLIT_PACK_MIN

    g = pre_activation(C=64, H=24, W=24, O=32)
    (n,) = fused_groups(optimize(g, opt_level=2))
    w = workload_for_group(n)
    t = get_template("conv2d")
    cfg = t.default_config(w, 2).replace(parallel="m", tile_m=16, tile_n=768, threads=2)
    assert t.space(w, 2).is_valid(cfg) and 64 * 576 >= SPLIT_PACK_MIN
    src = t.codegen(w, cfg)
    assert "for chunk in prange(" in src
    assert "pack_b(B, b_base, p0, j0, kc, nc, Bp, geo, chunk * step, min(kc, (chunk + 1) * step), q1, q2)" in src
    fn = load_kernel(w, t, cfg)
    xs, out = w.make_inputs(), w.make_outputs()
    fn(*xs, *out)
    assert w.check(xs, out, w.reference(xs)) is None
