"""conv2d template: every formulation (NCHW/NHWC, pointwise/im2col, packed or in-place
operands, K blocking, parallel) against the group reference, with a bias/residual/relu epilogue."""
from __future__ import annotations

import numpy as np
import pytest

from search_spaces import get_template
from tuner.dispatch import load_kernel
from workloads.graph import GraphBuilder
from workloads.graph.fusion import fused_groups
from workloads.graph.passes import optimize
from workloads.fused import workload_for_group


def conv_workload(C, H, O, k, s, level, residual=True, pad=None, batch=1, dilation=1):
    b = GraphBuilder("g")
    x = b.input("x", (batch, C, H, H + 1))
    rng = np.random.default_rng(0)
    w = b.const(rng.standard_normal((O, C, k, k)).astype(np.float32))
    bias = b.const(rng.standard_normal((O, 1, 1)).astype(np.float32))
    p = k // 2 if pad is None else pad
    attrs = {"dilation": [dilation, dilation]} if dilation > 1 else {}
    y = b.op("add", b.op("conv2d", x, w, strides=[s, s], padding=[p, p], **attrs), bias)
    if residual:
        r = b.input("r", b.type_of(y).shape)
        y = b.op("add", y, r)
    g = optimize(b.build(b.op("relu", y)), opt_level=level)
    (w,) = [workload_for_group(n) for n in fused_groups(g) if workload_for_group(n).kind == "conv2d"]
    return w


def check(w, cfg):
    fn = load_kernel(w, get_template("conv2d"), cfg)
    x, out = w.make_inputs(), w.make_outputs()
    fn(*x, *out)
    return w.check(x, out, w.reference(x))


@pytest.mark.parametrize("level,layout", [(2, "NCHW"), (3, "NHWC")])
def test_im2col_conv_default_and_blocked_configs(level, layout):
    t = get_template("conv2d")
    w = conv_workload(5, 9, 20, 3, 2, level)
    assert w.geometry["data_layout"] == layout
    d = t.default_config(w, 1)
    sp = t.space(w, 2)
    assert sp.is_valid(d)
    assert check(w, d) is None
    # Small tiles: several K blocks (first/middle/last store modes), M and N edges.
    blocked = d.replace(tile_k=16, tile_m=16, tile_n=16, mr=4, nr=16, vec=8, loop_order="kmn",
                        pack_b=True, parallel="n", threads=2)
    assert sp.is_valid(blocked), sp.violation(blocked)
    assert check(w, blocked) is None


@pytest.mark.parametrize("k,s,pad", [(3, 1, 1), (3, 2, 1), (1, 2, 0), (7, 2, 3), (5, 3, 2), (3, 1, 0)])
def test_nchw_im2col_rows_every_stride(k, s, pad):
    """The NCHW im2col packing (masked vector rows for stride 1, even lanes for stride 2,
    scalar otherwise) with output rows split across column blocks and partial panels."""
    t = get_template("conv2d")
    w = conv_workload(3, 23, 10, k, s, 2, pad=pad)
    assert t.plan(w)["b"] == ("direct" if k == 1 and s == 1 else "im2col_nchw")
    assert check(w, t.default_config(w, 1)) is None
    sp = t.space(w, 1)
    for nr in sp.knob("nr").values:   # 1, 2 and 3 vectors of the ISA (AVX-512: 16, 32, 48)
        tn = min(v for v in sp.knob("tile_n").values if v % nr == 0)
        cfg = t.default_config(w, 1).replace(tile_n=tn, nr=nr, mr=4, tile_k=16, tile_m=16)
        assert sp.is_valid(cfg), sp.violation(cfg)
        # A last panel at most half a vector wide gets the half-width micro-kernel (an
        # argument: the module carries it whenever the half vector has 4 lanes or more).
        narrow = 0 < t.plan(w)["N"] % nr <= cfg["vec"] // 2
        named = dict(zip(t.runtime_arg_names(w, cfg), t.runtime_args(w, cfg)))
        assert (named["narrow"] > 0) == narrow
        assert ("micro_kernel_narrow" in t.codegen(w, cfg)) == (cfg["vec"] // 2 >= 4)
        assert check(w, cfg) is None, cfg


@pytest.mark.parametrize("level", [2, 3])
def test_pointwise_conv_reads_operands_in_place(level):
    t = get_template("conv2d")
    # NHWC: B (the weights) in place needs NR to divide N (window_edge): 32 output channels
    w = conv_workload(8, 6, 24 if level == 2 else 32, 1, 1, level, pad=0)
    assert t.plan(w)["pointwise"]
    sp = t.space(w, 1)
    assert sp.knob("pack_a").values == (False, True) and sp.knob("pack_b").values == (False, True)
    d = t.default_config(w, 1)
    cfg = d.replace(pack_a=False, pack_b=False, mr=6, nr=16, vec=sp.knob("vec").values[-1],
                    tile_m=sp.knob("tile_m").values[-1],
                    tile_n=sp.knob("tile_n").values[-1], tile_k=16, loop_order="mnk")
    assert sp.is_valid(cfg), sp.violation(cfg)
    assert check(w, cfg) is None
    # Packed copies of the operands, with a partial last panel (N = 42 columns, NR = 16).
    packed = cfg.replace(pack_a=True, pack_b=True, tile_n=sp.knob("tile_n").values[0])
    assert sp.is_valid(packed), sp.violation(packed)
    assert check(w, packed) is None


def test_edge_kernel_only_where_a_tile_can_be_partial():
    """The scalar edge kernel is generated only when an operand read in place can leave a
    partial tile (MR does not divide M, or NR does not divide N): the default NCHW configs
    read the weights in place only where MR divides M, so their modules have none (a
    function less to compile); where rows are partial it is there (checked compiled by the
    slow test below)."""
    t = get_template("conv2d")
    w = conv_workload(8, 6, 24, 3, 1, 2)           # M = 24, weights read in place
    d = t.default_config(w, 1)
    assert not d["pack_a"] and 24 % d["mr"] == 0
    src = t.codegen(w, d)
    assert "def edge_kernel" not in src and "edge_kernel(" not in src
    _, w10, cfg = partial_rows_conv()
    assert t.space(w10, 1).is_valid(cfg)
    src = t.codegen(w10, cfg)
    assert "def edge_kernel" in src and "if mlen < MR:" in src and "nlen < NR" not in src


def partial_rows_conv():
    t = get_template("conv2d")
    w = conv_workload(8, 6, 10, 1, 1, 2, residual=False, pad=0)    # M = 10: rows 8, 9 partial
    return t, w, t.default_config(w, 1).replace(pack_a=False, mr=4)


@pytest.mark.slow   # compiles a module of its own: ~30 s under load, more than the default run's share
def test_partial_rows_read_in_place_are_exact():
    t, w, cfg = partial_rows_conv()
    assert check(w, cfg) is None


def test_wrong_kernel_is_caught():
    """The check is not vacuous: a kernel that drops the epilogue's residual fails it."""
    t = get_template("conv2d")
    w = conv_workload(4, 5, 8, 3, 1, 2)
    src = t.codegen(w, t.default_config(w, 1))
    assert "# add" in src and "relu" in src
    x, out = w.make_inputs(), w.make_outputs()
    x[-1][...] = 0  # what a kernel ignoring the residual would compute
    fn = load_kernel(w, t, t.default_config(w, 1))
    fn(*x, *out)
    assert w.check(w.make_inputs(), out, w.reference(w.make_inputs())) is not None


def grouped_workload(C, H, O, k, s, groups, level=2):
    """conv2d(groups) + per-channel bias + residual + relu, as the builder fuses it."""
    b = GraphBuilder("g")
    x = b.input("x", (1, C, H, H + 1))
    rng = np.random.default_rng(1)
    w = b.const(rng.standard_normal((O, C // groups, k, k)).astype(np.float32))
    bias = b.const(rng.standard_normal((O, 1, 1)).astype(np.float32))
    y = b.op("add", b.op("conv2d", x, w, strides=[s, s], padding=[k // 2, k // 2],
                         groups=groups), bias)
    y = b.op("add", y, b.input("r", b.type_of(y).shape))
    g = optimize(b.build(b.op("relu", y)), opt_level=level)
    (w,) = [w for w in map(workload_for_group, fused_groups(g)) if w.anchor == "conv2d"]
    return w


@pytest.mark.parametrize("C,O,k,s,groups", [(8, 12, 3, 1, 2), (12, 8, 3, 2, 4), (24, 28, 1, 1, 4),
                                            (6, 9, 5, 1, 3)])
def test_grouped_conv_is_one_gemm_per_group(C, O, k, s, groups):
    """Grouped convs are the conv2d kind (one GEMM per group on the shared core, per-group
    offsets into weights, image channels, output channels and per-channel operands): the
    default and blocked / packed / parallel configs match the reference."""
    t = get_template("conv2d")
    w = grouped_workload(C, 9, O, k, s, groups)
    assert w.kind == "conv2d" and w.geometry["groups"] == groups
    pl = t.plan(w)
    assert (pl["M"], pl["K"], pl["groups"]) == (O // groups, C // groups * k * k, groups)
    src = t.codegen(w, t.default_config(w, 1))
    assert "for grp in range(GROUPS):" in src and "[grp * M:]" in src   # bias sliced per group
    named = dict(zip(t.runtime_arg_names(w, t.default_config(w, 1)),
                     t.runtime_args(w, t.default_config(w, 1))))
    assert (named["groups"], named["cg"]) == (groups, C // groups)
    assert check(w, t.default_config(w, 1)) is None
    sp = t.space(w, 2)
    for cfg in (t.default_config(w, 2),
                t.default_config(w, 1).replace(tile_k=16, tile_m=16, tile_n=16, mr=4, nr=16,
                                               vec=8, pack_a=True, loop_order="kmn",
                                               parallel="n", threads=2)):
        assert sp.is_valid(cfg), sp.violation(cfg)
        assert check(w, cfg) is None, cfg


def test_grouped_conv_wrong_group_offset_is_caught():
    """The check sees a kernel that gives every group the first group's bias."""
    t = get_template("conv2d")
    w = grouped_workload(8, 7, 12, 3, 1, 2)
    src = t.codegen(w, t.default_config(w, 1))
    assert check(w, t.default_config(w, 1)) is None
    x, out = w.make_inputs(), w.make_outputs()
    fn = load_kernel(w, t, t.default_config(w, 1))
    bias = next(i for i, a in enumerate(x) if a.shape == (12, 1, 1))
    x[bias][6:] = x[bias][:6]   # what slicing without the group offset would read
    fn(*x, *out)
    xs = w.make_inputs()
    assert "e" in src and w.check(xs, out, w.reference(xs)) is not None


def test_depthwise_and_nhwc_grouped_convs_are_not_conv2d_gemms():
    """groups == channels is the depthwise kind; NHWC grouped convs are not generated by
    this template (the builder would run them with NumPy and count them)."""
    from workloads.errors import InstantiationError

    from tuner.bench.hotspots import gemm_equivalent

    assert grouped_workload(8, 7, 8, 3, 1, 8).kind == "depthwise_conv2d"
    # the O3 pipeline's ConvertLayout leaves grouped convs in NCHW, where they are generated
    w = grouped_workload(8, 7, 12, 3, 1, 2, level=3)
    assert w.kind == "conv2d" and w.geometry["data_layout"] == "NCHW"
    b = GraphBuilder("g")   # an NHWC grouped conv written so (no pass converts it)
    x = b.input("x", (1, 7, 7, 8))
    wt = b.const(np.ones((3, 3, 4, 12), np.float32))
    y = b.op("conv2d", x, wt, padding=[1, 1], groups=2, data_layout="NHWC", kernel_layout="HWIO")
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    assert w.kind == "conv2d" and w.geometry["data_layout"] == "NHWC"
    with pytest.raises(InstantiationError, match="NCHW/OIHW only"):
        get_template("conv2d").codegen(w, get_template("conv2d").default_config(w, 1))
    # bench model's "where the time goes" has no GEMM to compare it with: none, no error
    assert gemm_equivalent(w.key) is None


def test_grouped_conv_features():
    from search_spaces.templates.features import bind

    t = get_template("conv2d")
    w = grouped_workload(8, 9, 12, 1, 1, 4)
    f = bind("conv2d", w.params())(t.default_config(w, 1))
    assert f["conv_groups"] == 2.0 and f["conv_pointwise"] == 1.0
    assert abs(f["conv_im2col_expansion"]) < 1e-9   # a pointwise group's B is its channels in place


def test_default_parallel_split_keeps_every_thread_busy():
    """At 2 threads the default cuts the parallel axis into blocks that split evenly
    (ResNet-50's M = 256, N = 196 3x3 conv: 2 blocks of 128 rows, not 3 of 96), and the
    efficiency bound is what ``split_efficiency`` says; 1 thread is not split."""
    from search_spaces.templates.conv2d import split_efficiency

    assert split_efficiency(256, 96, 2) == pytest.approx(128 / 192)
    assert split_efficiency(256, 128, 2) == 1.0
    t = get_template("conv2d")
    w = conv_workload(256, 14, 256, 3, 1, 2, residual=False)   # M 256, N 14 x 15, K 2304
    cfg = t.default_config(w, max_threads=2)
    axis, tile = cfg["parallel"], cfg["tile_m" if cfg["parallel"] == "m" else "tile_n"]
    dim = 256 if axis == "m" else 14 * 15
    assert split_efficiency(dim, tile, 2) >= 0.97, dict(cfg)
    assert t.default_config(w, max_threads=1)["parallel"] == "none"


def test_layers_of_one_variant_share_one_module():
    """Shape-generic modules: two convs of different image sizes and channel counts with
    one window and one config share byte-identical source (one content address, one
    compile), and that one module computes both (the shapes are arguments, not literals);
    a different window (padding) is another module (the window stays literal)."""
    t = get_template("conv2d")
    w1 = conv_workload(5, 9, 20, 3, 1, 2, residual=False)
    w2 = conv_workload(7, 12, 28, 3, 1, 2, residual=False)
    w3 = conv_workload(7, 12, 28, 3, 1, 2, residual=False, pad=0)
    cfg = t.default_config(w1, 1).replace(tile_m=16, tile_n=16, tile_k=16, mr=4, nr=16,
                                          vec=8, loop_order="nkm", parallel="none", threads=1)
    assert t.space(w1, 1).is_valid(cfg) and t.space(w2, 1).is_valid(cfg)
    assert t.codegen(w1, cfg) == t.codegen(w2, cfg) != t.codegen(w3, cfg)
    assert t.runtime_args(w1, cfg) != t.runtime_args(w2, cfg)
    f1, f2 = load_kernel(w1, t, cfg), load_kernel(w2, t, cfg)
    assert f1.kernel is f2.kernel
    for w, fn in ((w1, f1), (w2, f2)):
        x, out = w.make_inputs(), w.make_outputs()
        fn(*x, *out)
        assert w.check(x, out, w.reference(x)) is None


def test_grouped_conv_runs_its_groups_in_parallel():
    """A grouped conv whose groups split evenly over the threads runs them in one parallel
    region (``parallel='g'``, each group's GEMM serial), exact against the reference; the
    other parallel axes stay valid choices."""
    from search_spaces.space import Config

    b = GraphBuilder("g")
    x = b.input("x", (1, 16, 7, 9))
    rng = np.random.default_rng(0)
    wt = b.const(rng.standard_normal((12, 4, 1, 1)).astype(np.float32))
    g = optimize(b.build(b.op("relu", b.op("conv2d", x, wt, groups=4))), opt_level=2)
    (w,) = [workload_for_group(n) for n in fused_groups(g) if workload_for_group(n).kind == "conv2d"]
    t = get_template("conv2d")
    assert "g" in t.space(w, 2).knob("parallel").values
    cfg = t.default_config(w, max_threads=2)
    assert cfg["parallel"] == "g" and cfg["threads"] == 2
    src = t.codegen(w, cfg)
    assert "for grp in prange(GROUPS)" in src and "parallel=True" in src
    assert check(w, cfg) is None
    assert check(w, Config(dict(cfg, parallel="n"))) is None
    assert t.default_config(w, max_threads=1)["parallel"] == "none"
    conv = conv_workload(8, 6, 8, 3, 1, 2)          # not grouped: no 'g'
    assert "g" not in t.space(conv, 2).knob("parallel").values


def shared_image_conv():
    t = get_template("conv2d")
    w = conv_workload(16, 16, 32, 3, 1, 2)        # M 32, N 16 x 17, K 144: one K block
    return t, w, t.default_config(w, max_threads=2)


def test_shared_image_block_is_packed_by_every_thread():
    """At 2 threads a conv whose output rows are split (``parallel='m'``, M = 32 as
    DenseNet-121's 3x3 convs) packs its im2col block, which every thread reads, with the rows
    shared out in a parallel region (``pack_b_split_lines``, a prange in the parallel core:
    one thread packed it before, 36-50% of those convs' time). Split on N, each thread packs
    its own block and nothing is shared. (Source only; the compiled kernel is checked by the
    slow test below.)"""
    from search_spaces.gemm_engine.core import splits_pack_b
    from search_spaces.gemm_engine.packing import SPLIT_PACK_MIN

    t, w, cfg = shared_image_conv()
    assert cfg["parallel"] == "m" and splits_pack_b(cfg, "im2col_nchw")
    assert 144 * 16 * 17 >= SPLIT_PACK_MIN        # large enough to split at run time
    src = t.codegen(w, cfg)
    split = "for chunk in prange((kc + step - 1) // step):"
    core = src.split("def gemm_core")[1]
    assert split in core and core.index(split) < core.index("for blk in prange(")
    assert src.count("parallel=True") == 1        # the core only: no parallel function of its own
    by_n = cfg.replace(parallel="n", tile_n=96)
    assert not splits_pack_b(by_n, "im2col_nchw") and split not in t.codegen(w, by_n)
    assert split not in t.codegen(w, t.default_config(w, max_threads=1))


@pytest.mark.slow   # compiles a parallel module: ~65 s under load, more than the default run's share
def test_shared_image_block_packed_by_every_thread_is_exact():
    t, w, cfg = shared_image_conv()
    assert check(w, cfg) is None


# -- NHWC: direct convolution (the image read through its windows, weights packed once) -------
def prepared_check(w, cfg):
    """The form a built model runs: the weight packed once by ``prepare``, then
    ``kernel_prepared`` (search_spaces/template.py), against the reference."""
    from search_spaces.template import prepare_kernel
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.measurer import write_source

    t = get_template("conv2d")
    idx = t.prepared_inputs(w, cfg)
    assert idx == (w.p["anchor_inputs"][1],)
    mod = import_kernel_module(write_source(t.codegen(w, cfg), template=t))
    x, out = w.make_inputs(), w.make_outputs()
    pk = prepare_kernel(mod, idx, x, t.runtime_args(w, cfg))
    pk(*x, *out)
    return w.check(x, out, w.reference(x))


SLOW = pytest.mark.slow   # each case compiles three modules of its own


@pytest.mark.parametrize("k,s,pad,dil,batch", [
    (3, 1, 1, 1, 1), (3, 2, 1, 1, 2), (3, 1, 2, 2, 1), (1, 1, 0, 1, 2),
    pytest.param(1, 2, 0, 1, 1, marks=SLOW), pytest.param(7, 2, 3, 1, 1, marks=SLOW),
    pytest.param(5, 3, 2, 1, 1, marks=SLOW), pytest.param(3, 1, 0, 1, 2, marks=SLOW)])
def test_nhwc_window_conv_every_geometry(k, s, pad, dil, batch):
    """The default NHWC conv is direct: A is the (zero-padded) image read in place through
    each output pixel's window (``window_nhwc``: no im2col copy), B the weights packed once
    into whole-K panels (``prepacked``). Strides, padding, dilation, two images (pixel tiles
    crossing from one image into the next), a partial last pixel tile, K blocks that end
    inside a window position, and the im2col-packed form it replaced, all exact."""
    t = get_template("conv2d")
    w = conv_workload(5, 11, 20, k, s, 3, pad=pad, batch=batch, dilation=dil)
    assert w.geometry["data_layout"] == "NHWC"
    d = t.default_config(w, 1)
    assert not d["pack_a"] and d["pack_b"]
    assert t.a_source(t.plan(w), d) == "window_nhwc"
    assert t.b_source(t.plan(w), d) == "prepacked"
    src = t.codegen(w, d)
    assert "def pack_a" not in src and "def prepare(" in src and "def kernel_prepared(" in src
    assert ("Xp = pad_image(X, geo)" in src) == (pad > 0)
    # a pointwise conv (1 x 1, stride 1, no padding) reads pixel q's row q: no division per
    # tile; every other window takes its tile's offsets from a table filled once per M block
    window = (k, s, pad) != (1, 1, 0)
    assert ("def pixel_rows(" in src) == window
    assert ("pixel_rows(PX, i0, (mc + MR - 1) // MR * MR" in src) == window
    assert ("o_0 = a_base + PX[ir + 0]" in src) == window
    # each tile prefetches its share of the next prepacked B block, a line per K step
    assert "pf, pf_hi = next_b_share(B, " in src and "prefetch_l2(BB, pf)" in src
    assert check(w, d) is None                # the entry: prepare + kernel_prepared per call
    assert prepared_check(w, d) is None       # what a build binds
    sp = t.space(w, 2)
    # K blocks of 16 steps: windows of 5 channels split mid-position; several store modes
    blocked = d.replace(tile_k=16, tile_m=16, tile_n=16, mr=4, nr=16, vec=8, loop_order="kmn",
                        parallel="m", threads=2)
    assert sp.is_valid(blocked), sp.violation(blocked)
    assert prepared_check(w, blocked) is None
    packed = d.replace(pack_a=True)           # implicit im2col, packed per call
    assert sp.is_valid(packed) and prepared_check(w, packed) is None


def test_nhwc_pointwise_conv_with_k_blocks():
    """The pointwise form over K blocks (40 channels in blocks of 16: 16, 16, 8), two images
    and a partial last pixel tile (2 x 5 x 6 pixels, 4-pixel tiles), 1 and 2 threads."""
    t = get_template("conv2d")
    w = conv_workload(40, 5, 20, 1, 1, 3, pad=0, batch=2)
    d = t.default_config(w, 2)
    # tile_m set with mr: the default's block may be an even split in 6- or 8-row tiles
    for cfg in (d.replace(tile_k=16, mr=4, tile_m=32),
                d.replace(tile_k=16, mr=4, tile_m=16, parallel="m", threads=2)):
        assert t.space(w, 2).is_valid(cfg), t.space(w, 2).violation(cfg)
        assert "min(q0 + 3, M - 1) * CI + p0" in t.codegen(w, cfg)
        assert prepared_check(w, cfg) is None


def test_nhwc_window_with_weights_in_place_needs_whole_panels():
    """B read in place has no edge kernel for a window A: NR must divide N."""
    t = get_template("conv2d")
    w = conv_workload(4, 6, 20, 3, 1, 3)
    sp = t.space(w, 1)
    d = t.default_config(w, 1)
    bad = d.replace(pack_b=False, nr=16, tile_n=16)
    assert not sp.is_valid(bad) and "window_edge" in sp.violation(bad)
    w32 = conv_workload(4, 6, 32, 3, 1, 3)
    ok = t.default_config(w32, 1).replace(pack_b=False, nr=16, tile_n=16)
    assert t.space(w32, 1).is_valid(ok)
    assert t.prepared_inputs(w32, ok) == () and check(w32, ok) is None


@pytest.mark.parametrize("O,tile", [(64, (6, 64)), (96, (8, 48)), (48, (8, 48)), (40, (8, 32)),
                                    (16, (8, 16))])
def test_nhwc_default_tile_follows_the_channels_and_isa(O, tile):
    """The NHWC default micro-tile on 32 registers: 6 pixels x 4 vectors where 4 vectors
    divide the output channels, 8 x 3 where 3 do, 8 x 2 or one vector otherwise; on 16
    registers (AVX2) 6 x 2 vectors whatever the channels. Every one of them exact."""
    from search_spaces import isa

    t = get_template("conv2d")
    w = conv_workload(5, 5, O, 3, 1, 3)    # 5 x 6 pixels: 6 rows pad none, 7 more than 8
    with isa.using(isa.AVX512):
        d = t.default_config(w, 1)
        assert (d["mr"], d["nr"]) == tile and t.space(w, 1).is_valid(d)
    with isa.using(isa.AVX2):
        d2 = t.default_config(w, 1)
        assert (d2["mr"], d2["nr"]) == ((6, 8) if O <= 8 else (6, 16))
    native = t.default_config(w, 1)    # the ISA compiled for (TUNER_CPU=haswell: AVX2)
    assert check(w, native) is None


def test_nhwc_default_gives_each_thread_one_even_block():
    """A direct conv (A, the image, read in place) splits its pixels over 2 threads in one
    even block each when no block of the ladder up to twice the default splits them as
    evenly: 23 x 24 = 552 pixels in 6-row tiles, 96% busy at best in blocks up to 192 rows,
    100% in two blocks of 276 (the packed formulations keep the cap). Exact at 2 threads.
    And where M splits so evenly, it is the axis taken when N costs about the same."""
    from search_spaces import isa
    from search_spaces.gemm_engine.space import balanced_split
    from search_spaces.templates.features import split_efficiency

    t = get_template("conv2d")
    w = conv_workload(16, 23, 64, 3, 1, 3)
    M = 23 * 24
    with isa.using(isa.AVX512):
        d = t.default_config(w, 2)
        assert (d["parallel"], d["mr"], d["tile_m"]) == ("m", 6, 276), dict(d)
        assert split_efficiency(M, d["tile_m"], 2) == 1.0
        capped = balanced_split(t.space(w, 2), d.replace(tile_m=96), M, 64)
        assert capped["tile_m"] <= 192 and split_efficiency(M, capped["tile_m"], 2) < 0.97
    native = t.default_config(w, 2)
    assert split_efficiency(M, native["tile_m"], 2) >= 0.99, dict(native)
    assert check(w, native) is None
    # a 1 x 1 expansion with a residual (ResNet-50's M784 N512 K128 kind): its costs over M
    # and N are within the slack and M splits evenly, so M (over N every thread would read
    # the whole image and write half of every output row)
    e = conv_workload(128, 28, 512, 1, 1, 3)
    with isa.using(isa.AVX512):
        d = t.default_config(e, 2)
        assert (d["parallel"], d["tile_m"]) == ("m", 408), dict(d)


@pytest.mark.parametrize("C,k_blocks_avx2,k_blocks_avx512", [(128, 1, 1), (256, 1, 5), (512, 1, 9)])
def test_nhwc_default_runs_one_k_block_while_the_weight_panel_fits(C, k_blocks_avx2, k_blocks_avx512):
    """An NHWC conv's default takes all of K in one block up to K = 1536, and on AVX2 while
    a whole-K panel of 16-wide weights is at most ``ONE_K_PANEL_BYTES`` (3x3 over 256 and 512
    channels: K = 2304, 4608); AVX-512's 64-wide panels keep the 1536 limit."""
    from search_spaces import isa
    from search_spaces.templates.conv2d import ONE_K_PANEL_BYTES

    t = get_template("conv2d")
    w = conv_workload(C, 6, 64, 3, 1, 3)
    K = 9 * C
    for which, blocks in ((isa.AVX2, k_blocks_avx2), (isa.AVX512, k_blocks_avx512)):
        with isa.using(which):
            d = t.default_config(w, 1)
            assert -(-K // int(d["tile_k"])) == blocks, (which, K, dict(d))
            if blocks == 1 and K > 1536:
                assert K * int(d["nr"]) * 4 <= ONE_K_PANEL_BYTES
    assert check(w, t.default_config(w, 1)) is None


def test_prepacked_weights_start_on_a_cache_line():
    """``prepare``'s weight panels start on a 64-byte boundary whatever the allocator gives
    (Numba's np.empty aligns to 32 bytes: a 512-bit B load of a panel at a 32-byte offset
    straddles two lines, and a 3 x 3 layer of Inception v2 ran 12-14% slower in the processes
    whose panels landed there, Intel Xeon, 2026-12-03)."""
    from search_spaces.template import prepared_inputs
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.measurer import write_source

    t = get_template("conv2d")
    w = conv_workload(5, 7, 20, 3, 1, 3)
    d = t.default_config(w, 1)
    (idx,) = prepared_inputs(t, w, d)
    mod = import_kernel_module(write_source(t.codegen(w, d), template=t))
    weight = w.make_inputs()[idx]
    panels = [mod.prepare(weight)[0] for _ in range(8)]   # kept alive: 8 distinct allocations
    assert all(p.ctypes.data % 64 == 0 for p in panels)
    assert all(np.array_equal(p, panels[0]) for p in panels)
    assert "T = empty_aligned(MR * NR)" in t.codegen(w, d)


def test_parallel_axes_share_one_grid_module():
    """With neither operand packed per call (an NHWC window, prepacked weights) the parallel
    split is a runtime grid of BLOCK_M x BLOCK_N blocks of C: 'm' (blocks of pixels, every
    channel) and 'n' (blocks of channels, every pixel) generate the same source and differ
    in the arguments only. Each exact at 2 threads, with several column blocks and three K
    blocks inside an 'm' block, and partial blocks at the ends (49 pixels, 96 channels).
    The micro-tile is three vectors wide on the running ISA (8x48 or 4x24)."""
    from search_spaces.template import kernel_source

    t = get_template("conv2d")
    w = conv_workload(40, 7, 96, 3, 1, 3)
    lanes = t.default_config(w, 2)["vec"]
    nr, mr = 3 * lanes, (8 if lanes == 16 else 4)   # within 32 or 16 vector registers
    assert nr in t.space(w, 2).knob("nr").values
    d = t.default_config(w, 2).replace(mr=mr, nr=nr, tile_n=nr, tile_k=128, threads=2)
    cfgs = [d.replace(parallel="m", tile_m=16), d.replace(parallel="n", tile_m=16)]
    for cfg in cfgs:
        assert t.space(w, 2).is_valid(cfg), t.space(w, 2).violation(cfg)
        assert prepared_check(w, cfg) is None, cfg
    m_src, n_src = (kernel_source(t, w, c) for c in cfgs)
    assert m_src == n_src and "prange(GRID)" in m_src
    names = t.runtime_arg_names(w, cfgs[0])
    blocks = [dict(zip(names, t.runtime_args(w, c))) for c in cfgs]
    assert (blocks[0]["block_m"], blocks[0]["block_n"]) == (16, 96)   # rows split
    assert (blocks[1]["block_m"], blocks[1]["block_n"]) == (blocks[1]["m"], nr)   # channels


def test_window_tiles_request_their_output_lines_paced_over_k():
    """An output larger than L2 keeps (PREFETCH) has each window tile of 64 columns request
    its own rows' lines and the residual's, one line of each per K step from the first (a
    burst before the K loop held up the tile's first loads: docs/isa.md, "Output lines paced
    over the K loop"); AVX2's 16-column tiles keep the burst (``prefetch_tile``). The answer
    is exact either way, 1 and 2 threads."""
    from search_spaces.gemm_engine.core import paces_output

    t = get_template("conv2d")
    w = conv_workload(8, 64, 64, 3, 1, 3)          # 64 x 65 x 64 float32 output: > 1 MiB
    d = t.default_config(w, 2)
    names = t.runtime_arg_names(w, d)
    assert dict(zip(names, t.runtime_args(w, d)))["prefetch"] == 1
    src = t.codegen(w, d)
    start = src.index("def micro_kernel(")
    micro = src[start:src.index("\ndef ", start)]
    paced = paces_output("window_nhwc", d["nr"], 4)
    assert paced == (d["nr"] >= 64)
    assert ("Cf, QX, qx, qc, qo, plim" in micro
            and "prefetch_w(Cf, qc + QX[qx + qr] + qs)" in micro) == paced
    assert ("prefetch(e" in micro) == paced        # the residual's lines too
    assert ("def prefetch_tile" in src) != paced
    assert ("plim = MR * 5 if PREFETCH else 0" in src) == paced
    assert prepared_check(w, d) is None
    one = d.replace(threads=1, parallel="none", tile_m=t.default_config(w, 1)["tile_m"])
    assert prepared_check(w, one) is None      # (the 2-thread block may be an even split)


def test_paced_prefetch_counts_the_residual_with_the_output():
    """Where tiles pace their output requests, PREFETCH is on once the output and the
    epilogue's full operands (a residual) reach ``PACED_PREFETCH_BYTES`` together: a 420 KB
    output with a 420 KB residual prefetches, without it it does not (docs/isa.md, "Which
    layers prefetch"). Burst tiles (AVX2's 16 columns) keep the 1 MiB output rule."""
    from search_spaces.gemm_engine.core import PACED_PREFETCH_BYTES, paces_output

    t = get_template("conv2d")
    answers = {}
    for residual in (False, True):
        w = conv_workload(16, 40, 64, 1, 1, 3, residual=residual)   # 40 x 41 x 64 float32 out
        d = t.default_config(w, 1)
        answers[residual] = dict(zip(t.runtime_arg_names(w, d), t.runtime_args(w, d)))["prefetch"]
        assert prepared_check(w, d) is None
    out_bytes = 40 * 41 * 64 * 4
    assert out_bytes < PACED_PREFETCH_BYTES <= 2 * out_bytes
    paced = paces_output("window_nhwc", d["nr"], 4)
    assert answers == ({False: 0, True: 1} if paced else {False: 0, True: 0})


def test_seven_by_seven_outputs_take_seven_row_tiles():
    """A 7 x 7 output (M = 49) in 6-row tiles computes 54 rows: on 32-register ISAs the NHWC
    default takes 7 rows of 2 vectors there (``pad_rows`` >= ROW_PADDING and 7 rows pad
    less; docs/isa.md, "Seven-row tiles for 7 x 7 outputs"), 16-register ISAs keep 6 rows;
    14 x 14 (196 rows, 6 pad 1%) keeps its tile. Exact at 1 and 2 threads."""
    from search_spaces import isa
    from search_spaces.templates.conv2d import ROW_PADDING, pad_rows

    assert pad_rows(49, 6) >= ROW_PADDING and pad_rows(49, 8) >= ROW_PADDING
    assert pad_rows(49, 7) == 0 and pad_rows(196, 6) < ROW_PADDING
    t = get_template("conv2d")
    w = conv_workload(16, 13, 64, 3, 2, 3)           # 13 x 14 image, stride 2: 7 x 7 x 64
    assert t.plan(w)["M"] == 49
    big, vec = isa.current().registers >= 32, isa.current().fp32_lanes
    for threads in (1, 2):
        d = t.default_config(w, threads)
        assert (d["mr"], d["nr"]) == ((7, 2 * vec) if big else (6, d["nr"]))
        assert prepared_check(w, d) is None
    wide = conv_workload(16, 27, 64, 3, 2, 3)        # 14 x 14 x 64
    assert t.plan(wide)["M"] == 196 and t.default_config(wide, 1)["mr"] != 7


def test_threads_splitting_n_take_panels_that_even_their_columns():
    """Where the threads split N, 3-vector panels give way to 2-vector ones when those even the
    threads' columns (``BALANCED_PANELS``): N = 1000 on 2 threads, 21 panels of 48 (528
    columns on one thread) -> 32 of 32 (512); at 1 thread, and where 48-wide panels split
    evenly (N = 96, 144), the 3-vector tile stays. Exact."""
    from search_spaces import isa
    from search_spaces.templates.conv2d import _widest_share

    if isa.current().registers < 32:
        pytest.skip("3-vector NHWC tiles are the 32-register ISAs' (AVX2 takes 6 x 2 vectors)")
    vec = isa.current().fp32_lanes
    assert _widest_share(1000, 48, 2) == 528 and _widest_share(1000, 32, 2) == 512
    t = get_template("conv2d")
    w = conv_workload(512, 13, 1000, 1, 1, 3, residual=False)
    one, two = t.default_config(w, 1), t.default_config(w, 2)
    assert one["nr"] == 3 * vec and (two["parallel"], two["nr"], two["mr"]) == ("n", 2 * vec, 8)
    assert prepared_check(w, two) is None
    for n in (96, 144):
        assert t.default_config(conv_workload(64, 13, n, 1, 1, 3, residual=False), 2)["nr"] == 3 * vec


def test_window_convs_of_stride_1_and_2_share_a_module():
    """A direct NHWC conv reads its stride once per M block (``pixel_rows``), so the stride
    is an argument there, not a module constant: 3 x 3 layers of stride 1 and 2 with the
    same config compile one module (docs/compile-once.md, "Strides as arguments of direct
    convolutions"); each exact."""
    t = get_template("conv2d")
    one = conv_workload(16, 14, 64, 3, 1, 3)        # 14 x 15 output pixels
    two = conv_workload(16, 28, 64, 3, 2, 3)        # 28 x 29 image, stride 2: 14 x 15
    c1, c2 = t.default_config(one, 1), t.default_config(two, 1)
    assert c1 == c2 and t.codegen(one, c1) == t.codegen(two, c2)
    assert dict(zip(t.runtime_arg_names(two, c2), t.runtime_args(two, c2)))["sh"] == 2
    assert prepared_check(one, c1) is None and prepared_check(two, c2) is None


def _call_with(w, cfg, inputs, out, **dims):
    """The kernel of ``cfg`` called with some runtime dimensions replaced (by name)."""
    t = get_template("conv2d")
    fn = load_kernel(w, t, cfg)
    args = dict(zip(t.runtime_arg_names(w, cfg), t.runtime_args(w, cfg)))
    assert set(dims) <= set(args), sorted(args)
    args.update(dims)
    fn.kernel(*inputs, out, *args.values())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k,residual", [(1, True), (3, False)])
def test_direct_conv_writes_and_reads_a_padded_image_in_place(k, residual, threads):
    """A build hands a direct conv's output to a padded consumer without a copy
    (``tuner.compiler.handoff``): the producer stores into the interior of the consumer's
    zero-bordered input (``core.out_rows``: OPT, OPL, OHP, OWP), the consumer skips its
    ``pad_image`` (PREPAD). Two images (tiles crossing rows and images), a non-square image,
    a residual operand still read at its own rows: the interior is bit-identical to the
    plain output, the border never written; the consumer's output bit-identical too."""
    t = get_template("conv2d")
    prod = conv_workload(16, 9, 32, k, 1, 3, residual=residual, batch=2)
    cfg = t.default_config(prod, threads)
    assert t.a_source(t.plan(prod), cfg) == "window_nhwc"
    x = prod.make_inputs()
    (plain,) = prod.make_outputs()
    _call_with(prod, cfg, x, plain)
    assert prod.check(x, [plain], prod.reference(x)) is None
    n, oh, ow, c = plain.shape
    big = np.full((n, oh + 3, ow + 2, c), np.nan, np.float32)   # border 1 above, 2 below, 1 each side
    _call_with(prod, cfg, x, big, opt=1, opl=1, ohp=oh + 3, owp=ow + 2)
    assert np.array_equal(big[:, 1:1 + oh, 1:1 + ow], plain)
    inner = np.zeros(big.shape, bool)
    inner[:, 1:1 + oh, 1:1 + ow] = True
    assert np.isnan(big[~inner]).all()            # the border: never written

    cons = conv_workload(16, 9, 32, 3, 1, 3, residual=False, batch=2)   # 3 x 3, padding 1
    ccfg = t.default_config(cons, threads)
    geo = dict(zip(t.runtime_arg_names(cons, ccfg), t.runtime_args(cons, ccfg)))
    hp, wp = geo["hp"], geo["wp"]
    xs = cons.make_inputs()
    (ref,) = cons.make_outputs()
    _call_with(cons, ccfg, xs, ref)
    assert cons.check(xs, [ref], cons.reference(xs)) is None
    img = xs[0]
    padded = np.zeros((img.shape[0], hp, wp, img.shape[3]), np.float32)
    padded[:, 1:1 + img.shape[1], 1:1 + img.shape[2]] = img
    (got,) = cons.make_outputs()
    _call_with(cons, ccfg, [padded, *xs[1:]], got, prepad=1)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("cpu,blocks", [("znver4", 2), ("icelake-server", 5), ("znver5", 5)])
def test_long_k_runs_in_longer_blocks_where_measured(cpu, blocks, monkeypatch):
    """On the CPUs of ``isa.LONG_K_BLOCK`` (Zen 4: 1 MB of L2 per core) a direct conv whose K
    exceeds one block (3x3 over 256 channels: K = 2304) runs K in blocks of 1536 (two)
    instead of the core's 512 (five); other AVX-512 CPUs keep 512. Generation only: the
    kernel is compiled and checked for the running machine below."""
    from numba.core import config

    from search_spaces import isa

    t = get_template("conv2d")
    w = conv_workload(256, 6, 64, 3, 1, 3)
    monkeypatch.setattr(config, "CPU_NAME", cpu)
    assert isa.current().registers == 32
    d = t.default_config(w, 1)
    assert -(-2304 // int(d["tile_k"])) == blocks, dict(d)
    monkeypatch.undo()
    assert check(w, t.default_config(w, 1)) is None
