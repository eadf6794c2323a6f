"""Fused-group workloads: keys from descriptions, round trips, references, tolerances, kinds;
and the injective and fixed templates against the group reference."""
from __future__ import annotations

import numpy as np
import pytest

import workloads
from search_spaces import get_template, templates_for
from search_spaces.space import Config
from tuner.dispatch import load_kernel
from workloads.errors import InstantiationError, UsageError
from workloads.graph import GraphBuilder, load, parse
from workloads.graph.fusion import describe, fused_groups
from workloads.graph.passes import optimize
from workloads.fused import workload_for_group

GRAPHS = ["workloads/graphs/conv_block.txt", "workloads/graphs/inception_block.txt",
          "workloads/graphs/mlp.txt"]


def groups(path, level):
    return fused_groups(optimize(load(path), opt_level=level))


def run_kernel(w, template, config):
    fn = load_kernel(w, template, config)
    x, out = w.make_inputs(), w.make_outputs()
    fn(*x, *out)
    return w.check(x, out, w.reference(x))


@pytest.mark.parametrize("level", [2, 3])
@pytest.mark.parametrize("path", GRAPHS)
def test_node_and_description_give_one_key_and_it_round_trips(path, level):
    for node in groups(path, level):
        w = workload_for_group(node)
        assert workload_for_group(describe(node)).key == w.key
        again = workloads.from_key(w.key)
        assert again.key == w.key and type(again) is type(w)
        assert w.output_specs() == [(tuple(node.type.shape), node.type.dtype)]
        assert [s for s, _ in w.input_specs()] == [tuple(p.type.shape) for p in node.body.inputs]
        assert w.flops() > 0
        assert templates_for(w.kind), w.kind


def test_kinds_of_the_example_groups():
    kinds = [workload_for_group(n).kind for n in groups(GRAPHS[0], 2)]
    assert kinds == ["conv2d", "conv2d", "fixed", "fixed", "injective", "dense", "fixed"]


def test_key_ignores_weight_values_but_not_shapes():
    def key(seed, out_ch=8):
        b = GraphBuilder("g")
        x = b.input("x", (1, 3, 8, 8))
        w = b.const(np.random.default_rng(seed).random((out_ch, 3, 3, 3), dtype=np.float32))
        g = optimize(b.build(b.op("relu", b.op("conv2d", x, w, padding=[1, 1]))), opt_level=2)
        return workload_for_group(fused_groups(g)[0]).key
    assert key(1) == key(2)
    assert key(1) != key(1, out_ch=4)


DAG = """
graph dag(%a: float32[2, 3, 4], %b: float32[2, 3, 4], %c: float32[4]) {
  %ra = relu(%a)
  %sb = sigmoid(%b)
  %m = multiply(%ra, %sb)
  %s = add(%m, %c)
  %t = tanh(%s)
  return %t
}
"""


def dag_node():
    (node,) = fused_groups(optimize(parse(DAG), opt_level=2))
    return node


def test_dag_group_carries_its_body_and_needs_the_node():
    node = dag_node()
    w = workload_for_group(node)
    assert w.kind == "injective" and "body" in w.params()
    x = w.make_inputs()
    from workloads.graph import execute
    np.testing.assert_array_equal(w.reference(x)[0], execute(node.body, x)[0])
    with pytest.raises(UsageError, match="not a chain"):
        workload_for_group(describe(node))


def test_check_catches_wrong_and_unwritten_elements():
    (node, *_) = groups(GRAPHS[0], 2)
    w = workload_for_group(node)
    x = w.make_inputs()
    ref = w.reference(x)
    assert w.check(x, ref, ref) is None
    bad = ref[0].copy()
    bad[0, 3, 5, 7] += 1e-2 * (1 + abs(bad[0, 3, 5, 7]))
    assert "outside tolerance" in w.check(x, [bad], ref)
    bad = ref[0].copy()
    bad[0, 1, 2, 3] = np.nan
    assert "NaN" in w.check(x, [bad], ref)
    # Float32 rounding of a correct summation order passes.
    noisy = (ref[0].astype(np.float64) * (1 + 2e-7)).astype(np.float32)
    assert w.check(x, [noisy], ref) is None


def test_groups_that_are_not_conv_or_dense_become_fixed():
    """Grouped convs are conv2d (more than one input channel per group) or depthwise_conv2d
    (one); what no kind claims (batch_matmul) is fixed, and its template refuses it."""
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 6, 6))
    w = b.const(np.ones((4, 2, 3, 3), np.float32))
    dw = b.const(np.ones((8, 1, 3, 3), np.float32))
    y = b.input("y", (2, 3, 5))
    z = b.input("z", (2, 5, 4))
    g = optimize(b.build(b.op("conv2d", x, w, groups=2), b.op("conv2d", x, dw, groups=4),
                         b.op("batch_matmul", y, z)), opt_level=2)
    kinds = [workload_for_group(n).kind for n in fused_groups(g)]
    assert kinds == ["conv2d", "depthwise_conv2d", "fixed"]
    with pytest.raises(InstantiationError):
        get_template("fixed").codegen(workload_for_group(fused_groups(g)[2]), Config({"threads": 1}))


def test_bad_input_is_a_usage_error():
    with pytest.raises(UsageError):
        workload_for_group(42)
    with pytest.raises(UsageError):
        workloads.from_params("conv2d", {"anchor": "conv2d"})
    node = groups(GRAPHS[0], 2)[2]  # max_pool2d
    with pytest.raises(UsageError):
        workloads.from_params("conv2d", workload_for_group(node).params())


def test_injective_template_both_formulations_on_a_dag_and_a_concat():
    t = get_template("injective")
    w = workload_for_group(dag_node())
    assert t.space(w, 2).knob("formulation").values == ("loops", "numpy")
    for cfg in (t.default_config(w), Config({"formulation": "numpy", "threads": 1}),
                Config({"formulation": "loops", "threads": 2})):
        assert run_kernel(w, t, cfg) is None, cfg
    concat = [workload_for_group(n) for n in groups(GRAPHS[1], 3) if "concatenate" in n.body.name][0]
    # an NHWC channel concatenation: rows of segments (gather), or NumPy array code
    assert t.space(concat).knob("formulation").values == ("gather", "numpy")
    for cfg in (t.default_config(concat), Config({"formulation": "numpy", "threads": 1})):
        assert run_kernel(concat, t, cfg) is None, cfg


def test_fixed_template_pools_softmax_lrn():
    t = get_template("fixed")
    ws = [workload_for_group(n) for n in groups(GRAPHS[1], 2)]
    fixed = {w.key: w for w in ws if w.kind == "fixed"}
    assert {w.summary() for w in fixed.values()} >= {"max_pool2d", "lrn", "avg_pool2d", "softmax"}
    for w in fixed.values():
        assert run_kernel(w, t, t.default_config(w)) is None, w.summary()


@pytest.mark.parametrize("shape,k,s,p,ceil", [
    ((2, 9, 10), 3, 2, 1, True), ((2, 7, 33), 3, 1, 1, False), ((3, 8, 8), 2, 2, 0, True),
    ((2, 9, 9), 3, 3, 0, False), ((2, 20, 37), 3, 2, 1, False)])
def test_max_pool_vector_rows_with_padding_and_ceil_mode(shape, k, s, p, ceil):
    """NCHW max pooling (vector rows for stride 1/2, scalar for 3) on negative inputs, so
    padding read as 0 instead of -inf would show."""
    b = GraphBuilder("g")
    y = b.op("max_pool2d", b.input("x", (1,) + shape), pool_size=[k, k], strides=[s, s],
             padding=[p, p, p, p], ceil_mode=ceil)
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    t = get_template("fixed")
    assert ("vstore_n" in t.codegen(w, t.default_config(w))) == (s in (1, 2))
    x, out = w.make_inputs(), w.make_outputs()
    x[0][...] = -np.abs(x[0]) - 1
    load_kernel(w, t, t.default_config(w))(*x, *out)
    assert w.check(x, out, w.reference(x)) is None


@pytest.mark.parametrize("op,shape,k,s,p,extra,threads", [
    ("avg_pool2d", (3, 9, 10), 3, 2, 1, {"count_include_pad": False}, 2),
    ("avg_pool2d", (3, 9, 10), 3, 2, 1, {"count_include_pad": True, "ceil_mode": True}, 1),
    ("avg_pool2d", (2, 7, 33), 3, 1, 1, {}, 1),
    ("avg_pool2d", (5, 7, 7), 7, 1, 0, {}, 2),            # one window per plane: a global average
    ("max_pool2d", (4, 20, 37), 3, 2, 1, {}, 2),
    ("global_avg_pool2d", (6, 5, 11), 0, 0, 0, {}, 1),
    ("global_avg_pool2d", (3, 4, 4), 0, 0, 0, {}, 2)])
def test_vector_pools_split_planes_across_threads(op, shape, k, s, p, extra, threads):
    """Vector pools (average and max, windowed and global) on 1 and 2 threads against the
    reference; the default config takes every thread only for large inputs."""
    b = GraphBuilder("g")
    x = b.input("x", (1,) + shape)
    attrs = {} if op == "global_avg_pool2d" else dict(pool_size=[k, k], strides=[s, s],
                                                     padding=[p, p, p, p], **extra)
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(b.op(op, x, **attrs)),
                                                                  opt_level=2))]
    t = get_template("fixed")
    cfg = Config({"threads": threads})
    src = t.codegen(w, cfg)
    assert "vadd(" in src or "vmax(" in src
    assert ("prange" in src) == (threads > 1)
    assert run_kernel(w, t, cfg) is None
    assert t.default_config(w, max_threads=2)["threads"] == 1   # small: one thread
    with pytest.raises(Exception, match="threads"):
        t.space(w, 2).validate(Config({"threads": 3}))


def test_large_pool_defaults_to_every_thread():
    b = GraphBuilder("g")
    x = b.input("x", (1, 24, 56, 56))
    y = b.op("avg_pool2d", x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    t = get_template("fixed")
    assert t.default_config(w, max_threads=2)["threads"] == 2
    assert t.default_config(w, max_threads=1)["threads"] == 1


@pytest.mark.parametrize("size,beta", [(5, 0.75), (4, 0.5), (3, 1.0), (5, 0.6)])
def test_lrn_vector_and_scalar_forms(size, beta):
    """LRN across channels: vector form for beta 0.5/0.75/1 (inner block of 7 x 9, not a
    multiple of the vector width), scalar pow for other betas; both against the reference."""
    b = GraphBuilder("g")
    y = b.op("lrn", b.input("x", (1, 11, 7, 9)), size=size, alpha=0.3, beta=beta, bias=1.5)
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    t = get_template("fixed")
    assert ("vstore_n" in t.codegen(w, t.default_config(w))) == (beta in (0.5, 0.75, 1.0))
    assert run_kernel(w, t, t.default_config(w)) is None


@pytest.mark.parametrize("op,shape,k,s,p,extra", [
    ("max_pool2d", (9, 10, 19), 3, 2, 1, {}),
    ("max_pool2d", (7, 7, 5), 2, 2, 0, {"ceil_mode": True}),
    ("avg_pool2d", (9, 10, 19), 3, 2, 1, {"count_include_pad": False}),
    ("avg_pool2d", (8, 9, 3), 3, 1, 1, {"count_include_pad": True, "ceil_mode": True}),
    ("avg_pool2d", (7, 7, 33), 7, 1, 0, {})])
def test_nhwc_pools_in_vectors_of_channels(op, shape, k, s, p, extra):
    """NHWC pooling (the O3 layout): per output pixel the window's bounds once, then vectors
    of channels (the last one masked: 19, 5, 3, 33 channels) folded over the taps, with
    padding, ceil mode and both average counts, output rows split across 2 threads; with a
    relu after it the scalar per-channel form (an epilogue per element). Negative inputs, so
    a 0 padding of the max would show."""
    t = get_template("fixed")
    for relu in (False, True):
        b = GraphBuilder("g")
        y = b.op(op, b.input("x", (1,) + shape), pool_size=[k, k], strides=[s, s],
                 padding=[p, p, p, p], layout="NHWC", **extra)
        y = b.op("relu", y) if relu else y
        (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
        src = t.codegen(w, t.default_config(w))
        assert ("vload_n(Xf" in src) != relu and "for c" in src
        x = w.make_inputs()
        x[0][...] = -np.abs(x[0]) - 1
        two = t.space(w, 2).knob("threads").values[-1] == 2   # not for one output row
        assert two == (not relu and shape[0] > k)
        for cfg in [t.default_config(w)] + ([Config({"threads": 2})] if two else []):
            out = w.make_outputs()
            load_kernel(w, t, cfg)(*x, *out)
            assert w.check(x, out, w.reference(x)) is None, (relu, cfg)


@pytest.mark.parametrize("op,shape,k,s,p,extra", [
    ("max_pool2d", (9, 10, 192), 3, 2, 1, {}),
    ("max_pool2d", (7, 7, 48), 3, 1, 1, {"ceil_mode": True}),
    ("avg_pool2d", (9, 10, 96), 3, 2, 1, {"count_include_pad": False}),
    ("avg_pool2d", (6, 6, 16), 2, 2, 0, {"count_include_pad": True})])
def test_nhwc_pools_fold_several_channel_vectors(op, shape, k, s, p, extra):
    """Channels a multiple of the vector width: several accumulators side by side (as many
    of ``CHANNEL_VECTORS`` as divide the channels), plain loads and stores, no masks; exact
    against the reference on 1 and 2 threads, padding and ceil mode included."""
    from search_spaces.templates.fixed_vector import CHANNEL_VECTORS

    t = get_template("fixed")
    b = GraphBuilder("g")
    y = b.op(op, b.input("x", (1,) + shape), pool_size=[k, k], strides=[s, s],
             padding=[p, p, p, p], layout="NHWC", **extra)
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    src = t.codegen(w, t.default_config(w))
    vec = int(src.split("VEC = ")[1].split()[0])
    u = next(u for u in CHANNEL_VECTORS if shape[2] % (u * vec) == 0)
    assert "vload_n(Xf" not in src and "vstore_n(Cf" not in src
    assert f"acc{u - 1} = " in src and f"acc{u} = " not in src
    x = w.make_inputs()
    x[0][...] = -np.abs(x[0]) - 1
    for cfg in [t.default_config(w), Config({"threads": 2})]:
        if cfg["threads"] not in t.space(w, 2).knob("threads").values:
            continue
        out = w.make_outputs()
        load_kernel(w, t, cfg)(*x, *out)
        assert w.check(x, out, w.reference(x)) is None, cfg


def test_nhwc_global_average_pool_sums_rows_of_channels():
    """NHWC global average pooling: rows of channels summed into float64 accumulators (no
    transpose to planes), 2 images; the same sums in the same order as the reference."""
    b = GraphBuilder("g")
    y = b.op("global_avg_pool2d", b.input("x", (2, 5, 6, 19)), layout="NHWC")
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    t = get_template("fixed")
    src = t.codegen(w, t.default_config(w))
    assert "np.transpose" not in src and "acc[c] += Xf[xb + c]" in src
    assert run_kernel(w, t, t.default_config(w)) is None


@pytest.mark.parametrize("size,beta", [(5, 0.75), (4, 0.5), (3, 1.0), (5, 0.6)])
def test_lrn_over_the_last_axis_by_shifted_rows(size, beta):
    """LRN across the contiguous last axis (NHWC channels, 11 of them: windows clipped at
    both ends of every row): squares into a zero-bordered row, window sums as shifted vector
    reads, powers by square roots (the scalar form with pow for other betas), rows split
    across 2 threads; against the reference."""
    b = GraphBuilder("g")
    y = b.op("lrn", b.input("x", (1, 7, 9, 11)), size=size, alpha=0.3, beta=beta, bias=1.5, axis=3)
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    t = get_template("fixed")
    src = t.codegen(w, t.default_config(w))
    assert "sq = np.zeros(" in src and ("**" in src) == (beta == 0.6)
    assert ("vload(sq, t + 0, VEC)" in src) == (beta != 0.6)   # vectors of channels
    assert run_kernel(w, t, t.default_config(w)) is None
    assert t.space(w, 2).knob("threads").values == (1, 2)   # rows split across threads
    assert run_kernel(w, t, Config({"threads": 2})) is None


@pytest.mark.parametrize("shape,threads", [((1, 5, 6, 37), 1), ((1, 5, 6, 37), 2), ((3, 37), 1),
                                           ((3, 37), 2), ((37,), 1), ((37,), 2)])
def test_injective_loops_read_rows(shape, threads):
    """The loop nest of an elementwise group reads each operand's row as a 1-D slice from 0
    (broadcast along the row: one value taken before the loop), so the inner loop vectorises;
    exact against the reference for per-channel, per-row and full operands, any rank."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("g")
    x = b.input("x", shape)
    y = b.input("y", shape)
    ch = b.const(rng.standard_normal(shape[-1:]).astype(np.float32))            # along the row
    col = b.const(rng.standard_normal(shape[:-1] + (1,)).astype(np.float32))    # one per row
    out = b.op("relu", b.op("add", b.op("multiply", b.op("add", x, ch), col), y))
    (node,) = fused_groups(optimize(b.build(out), opt_level=2))
    w = workload_for_group(node)
    t = get_template("injective")
    cfg = t.default_config(w, threads).replace(threads=threads)
    assert cfg["formulation"] == "loops"
    src = t.codegen(w, cfg)
    # rows, except where the parallel loop is the whole nest (rank <= 2 over two threads)
    assert ("ro = Cf[" in src) == (len(shape) > 2 or threads == 1)
    fn = load_kernel(w, t, cfg)
    ins, outs = w.make_inputs(), w.make_outputs()
    fn(*ins, *outs)
    assert w.check(ins, outs, w.reference(ins)) is None
