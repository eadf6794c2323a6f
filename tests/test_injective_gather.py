"""The injective template's gather formulation: channel shuffles, concatenations with a
unary chain, permutations through reshapes, against the group reference; groups it cannot
express stay with the other formulations."""
from __future__ import annotations

import math

import numpy as np
import pytest

from search_spaces import get_template
from search_spaces.space import Config
from search_spaces.templates.injective_gather import _affine, gather_ok, gather_plan
from tuner.dispatch import load_kernel
from workloads.fused import workload_for_group
from workloads.graph import GraphBuilder
from workloads.graph.fusion import fused_groups
from workloads.graph.passes import optimize


def group_of(build, level=2):
    b = GraphBuilder("g")
    y = build(b)
    ws = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=level))]
    (w,) = [w for w in ws if w.kind == "injective"]
    return w


def shuffle(N, C, H, W, groups):
    def build(b):
        x = b.input("x", (N, C, H, W))
        y = b.op("reshape", x, newshape=[N, groups, C // groups, H, W])
        y = b.op("transpose", y, axes=[0, 2, 1, 3, 4])
        return b.op("reshape", y, newshape=[N, C, H, W])
    return build


def check(w, cfg):
    fn = load_kernel(w, get_template("injective"), cfg)
    x, out = w.make_inputs(), w.make_outputs()
    out[0][...] = np.nan
    fn(*x, *out)
    return w.check(x, out, w.reference(x))


def movement_groups():
    def concat_relu(b):
        a, c = b.input("a", (1, 6, 5, 7)), b.input("c", (1, 4, 5, 7))
        return b.op("relu", b.op("concatenate", a, c, axis=1))

    def concat_batch(b):   # concatenation inside each image: 2 x 2 segments
        a, c = b.input("a", (2, 3, 4)), b.input("c", (2, 5, 4))
        return b.op("clip", b.op("concatenate", a, c, axis=1), a_min=0.5, a_max=2.0)

    def transpose_3d(b):
        x = b.op("transpose", b.input("x", (3, 4, 5)), axes=[2, 0, 1])
        return b.op("sigmoid", b.op("tanh", x))
    return {"shuffle": shuffle(1, 12, 5, 6, 3), "shuffle_batch2": shuffle(2, 8, 3, 3, 4),
            "concat_relu": concat_relu, "concat_batch": concat_batch, "transpose_3d": transpose_3d}


@pytest.mark.parametrize("name", list(movement_groups()))
def test_gather_matches_the_reference(name):
    w = group_of(movement_groups()[name])
    t = get_template("injective")
    sp = t.space(w, 2)
    assert sp.knob("formulation").values == ("gather", "numpy"), [n.op for n in w.body.nodes]
    assert t.default_config(w, 2)["formulation"] == "gather"
    cfgs = [Config({"formulation": "gather", "threads": 1})]
    if name == "shuffle":   # parallel loops, and the array-code formulation agrees
        cfgs += [Config({"formulation": "gather", "threads": 2}),
                 Config({"formulation": "numpy", "threads": 1})]
    for cfg in cfgs:
        assert sp.is_valid(cfg)
        assert check(w, cfg) is None, cfg
    src = t.codegen(w, Config({"formulation": "gather", "threads": 1}))
    compile(src, "<gather>", "exec")
    assert "np.transpose" not in src and "np.concatenate" not in src


def test_channel_shuffle_is_a_plane_copy_per_channel():
    """4 x 3 channels of 5 x 6: one segment, inner loop a contiguous 30-element plane."""
    w = group_of(shuffle(1, 12, 5, 6, 3))
    (seg,) = gather_plan(w)["segments"]
    k, start, base, dims = seg
    assert (start, base) == (0, 0)
    assert dims == [(30, 1), (3, 4 * 30), (4, 30)]


def test_affine_compression():
    assert _affine(np.arange(12)) == [(12, 1)]
    assert _affine(np.arange(12).reshape(3, 4).T.reshape(-1)) == [(3, 4), (4, 1)]
    assert _affine(np.array([0, 2, 1, 3, 5, 4])) is None


def test_elementwise_ops_before_the_movement_are_not_gathered():
    """Only elementwise ops after the movement are fused into the copy loops; this group is
    left to the numpy formulation (and a build names it as array code)."""
    def build(b):
        y = b.op("transpose", b.op("exp", b.input("x", (2, 3))), axes=[1, 0])
        return b.op("add", y, b.input("r", (3, 2)))
    w = group_of(build)
    assert not gather_ok(w)
    assert "gather" not in get_template("injective").space(w).knob("formulation").values


def test_gather_with_broadcast_operands_after_the_movement():
    """DenseNet's concatenate -> per-channel scale -> shift -> relu, and a full residual."""
    def build(b):
        a, c = b.input("a", (1, 5, 3, 4)), b.input("c", (1, 3, 3, 4))
        y = b.op("multiply", b.op("concatenate", a, c, axis=1), b.input("s", (8, 1, 1)))
        y = b.op("add", b.input("t", (8, 1, 1)), y)
        y = b.op("subtract", y, b.input("r", (1, 8, 3, 4)))
        return b.op("relu", b.op("add", y, b.input("u", (4,))))
    w = group_of(build)
    t = get_template("injective")
    assert t.space(w).knob("formulation").values == ("gather", "numpy")
    src = t.codegen(w, t.default_config(w))
    assert "// 12) % 8]" not in src and "(o // 12)]" in src   # per-channel: one division
    assert check(w, t.default_config(w)) is None


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_large_groups_run_on_every_thread_small_ones_on_one(compiled):
    """The default threads of the loops formulation: every thread from
    ``PARALLEL_MIN_ELEMENTS`` output elements, one below. A batch-1 NCHW batch-norm + relu
    splits its channels (the two outer dimensions are one parallel loop; the batch alone
    would give one thread all of it). The gather formulation defaults to one thread (measured
    slower in parallel); with more, a segment runs in parallel from ``PARALLEL_MIN_SEGMENT``
    elements. ``compiled`` (slow: two parallel modules, ~45 s under
    load): both exact against the reference at 2 threads."""
    from search_spaces.templates.injective import PARALLEL_MIN_ELEMENTS
    from search_spaces.templates.injective_gather import PARALLEL_MIN_SEGMENT

    t = get_template("injective")

    def bn_relu(c, h):
        def build(b):
            x = b.input("x", (1, c, h, h))
            s = b.const(np.linspace(0.5, 1.5, c, dtype=np.float32).reshape(c, 1, 1))
            return b.op("relu", b.op("multiply", x, s))   # exact: one rounding
        return build

    big = group_of(bn_relu(32, 32))            # 32768 elements
    small = group_of(bn_relu(8, 8))
    assert math.prod(big.out_shape) >= PARALLEL_MIN_ELEMENTS > math.prod(small.out_shape)
    cfg = t.default_config(big, 2)
    assert dict(cfg) == {"formulation": "loops", "threads": 2}
    assert t.default_config(small, 2)["threads"] == 1 and t.default_config(big, 1)["threads"] == 1
    assert "for f01 in prange(S0 * S1):" in t.codegen(big, cfg)
    assert not compiled or check(big, cfg) is None

    def concat_relu(b):
        x1, x2 = b.input("x1", (1, 32, 32, 32)), b.input("x2", (1, 2, 32, 32))
        return b.op("relu", b.op("concatenate", x1, x2, axis=1))

    cat = group_of(concat_relu)
    assert dict(t.default_config(cat, 2)) == {"formulation": "gather", "threads": 1}
    cfg = Config({"formulation": "gather", "threads": 2})   # tunable: slower by default
    src = t.codegen(cat, cfg)
    assert 32 * 1024 >= PARALLEL_MIN_SEGMENT > 2 * 1024
    assert "for j0 in prange(32768):" in src and "for j0 in range(2048):" in src
    assert not compiled or check(cat, cfg) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_nhwc_channel_concat_is_rows_of_segments(threads):
    """A concatenation along NHWC channels (the O3 layout) is 5 x 6 rows of three runs, far
    more than MAX_SEGMENTS segments: gathered as one loop over rows, each row the same three
    copies (and a relu on the way), parallel over rows at 2 threads."""
    def build(b):
        xs = [b.input(n, (1, 5, 6 * 128, c)) for n, c in (("a", 3), ("c", 5), ("d", 2))]
        return b.op("relu", b.op("concatenate", *xs, axis=3))
    w = group_of(build)
    plan = gather_plan(w)
    assert plan["rows"] == (5 * 6 * 128, 10, [3, 5, 2])   # row period, each segment's row step
    assert [(k, start, base) for k, start, base, _ in plan["segments"]] == [(0, 0, 0), (1, 3, 0), (2, 8, 0)]
    t = get_template("injective")
    assert t.default_config(w)["formulation"] == "gather"
    cfg = Config({"formulation": "gather", "threads": threads})
    assert ("prange(3840)" in t.codegen(w, cfg)) == (threads == 2)
    assert check(w, cfg) is None


def test_plain_copies_run_as_vectors():
    """With no elementwise chain, each segment's contiguous innermost run is copied as vectors
    (the last one masked: 5 and 3 channels), an NHWC concat's rows split across the threads by
    default; a channel shuffle's planes too. Exact against the reference at 1 and 2 threads."""
    def concat(b):
        xs = [b.input(n, (1, 9, 8 * 64, c)) for n, c in (("a", 21), ("c", 5), ("d", 3))]
        return b.op("concatenate", *xs, axis=3)
    t = get_template("injective")
    for build, rows in ((concat, True), (shuffle(1, 12, 5, 6, 3), False)):
        w = group_of(build)
        assert (gather_plan(w)["rows"] is not None) == rows
        d = t.default_config(w, 2)
        assert d["formulation"] == "gather" and d["threads"] == (2 if rows else 1)
        for threads in (1, 2):
            cfg = Config({"formulation": "gather", "threads": threads})
            src = t.codegen(w, cfg)
            assert "vstore_n(Cf, o + jv, vload_n(" in src
            assert check(w, cfg) is None, (build, threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_transposes_are_copied_in_cache_line_tiles(threads):
    """A layout transform whose row-order copy reads one element per cache line along a long
    run (NHWC -> NCHW, 45 x 50 pixels of 130 channels: runs of 2,250) is copied in 16 x 16
    tiles (by default on every thread); partial tiles at both ends, a relu on the way, 1 and 2
    threads, exact. A small transpose (runs that fit L1) keeps the row order."""
    from search_spaces.templates.injective_gather import transpose_tile

    def nhwc_to_nchw(b):
        x = b.input("x", (1, 45, 50, 130))
        return b.op("relu", b.op("transpose", x, axes=[0, 3, 1, 2]))
    w = group_of(nhwc_to_nchw)
    (seg,) = gather_plan(w)["segments"]
    assert seg[3] == [(45 * 50, 130), (130, 1)] and transpose_tile(seg[3], 4) == 1
    cfg = Config({"formulation": "gather", "threads": threads})
    src = get_template("injective").codegen(w, cfg)
    assert "tiles of 16 x 16" in src and ("prange(9)" in src) == (threads == 2)
    assert get_template("injective").default_config(w, 2)["threads"] == 2   # tiles split well
    assert check(w, cfg) is None
    assert transpose_tile([(64, 3136), (3136, 1)], 4) is None   # 64x56x56 NCHW -> NHWC
    assert transpose_tile([(256, 3136), (3136, 1)], 4) == 1
