"""FuseOps on IR text, the layout/fusion ordering hazard, group descriptions and traffic."""
from __future__ import annotations

from pathlib import Path

import pytest

from workloads.graph import GraphBuilder, GraphError, load, parse, random_inputs, to_text, verify
from workloads.graph.analysis import graph_stats
from workloads.graph.fusion import describe, fused_groups
from workloads.graph.passes import (ConvertLayout, FoldConstant, FuseOps, PassContext, Sequential,
                                optimize, partition)
from workloads.graph.testing import assert_same_results, run

ROOT = Path(__file__).resolve().parents[1]
CONV_BLOCK = str(ROOT / "workloads" / "graphs" / "conv_block.txt")


def fuse_check(src: str, expected: str, **kw):
    g = parse(src)
    out = verify(FuseOps(**kw)(g))
    assert to_text(out) == to_text(parse(expected)), to_text(out)
    x = random_inputs(g)
    assert_same_results(run(g, x), run(out, x), "float32", "FuseOps")
    assert FuseOps(**kw)(out) == out
    return out


def ops_of_groups(g):
    return [[m.op for m in n.body.nodes if m.is_compute] for n in fused_groups(g)]


EPILOGUE_SRC = """
graph g(%x: float32[1, 2, 4, 4]) {
  %w = const(fill=0.5) : float32[3, 2, 1, 1]
  %b = const(data=[1.0, 2.0, 3.0]) : float32[3, 1, 1]
  %c = conv2d(%x, %w)
  %a = add(%c, %b)
  %r = relu(%a)
  %t = tanh(%r)
  %s = sigmoid(%r)
  %m = multiply(%t, %s)
  return %m
}"""


def test_anchor_takes_its_epilogue_and_shared_values_end_a_group():
    fuse_check(EPILOGUE_SRC, """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w = const(fill=0.5) : float32[3, 2, 1, 1]
          %b = const(data=[1.0, 2.0, 3.0]) : float32[3, 1, 1]
          %r = fused(%x, %w, %b) : float32[1, 3, 4, 4] graph fused_conv2d_add_relu(
              %p0: float32[1, 2, 4, 4], %p1: float32[3, 2, 1, 1], %p2: float32[3, 1, 1]) {
            %c = conv2d(%p0, %p1)
            %a = add(%c, %p2)
            %r = relu(%a)
            return %r
          }
          %m = fused(%r) : float32[1, 3, 4, 4] graph fused_tanh_sigmoid_multiply(%p0: float32[1, 3, 4, 4]) {
            %t = tanh(%p0)
            %s = sigmoid(%p0)
            %m = multiply(%t, %s)
            return %m
          }
          return %m
        }""")


def test_max_group_size_and_graph_outputs_limit_groups():
    g = parse(EPILOGUE_SRC)
    assert ops_of_groups(FuseOps(max_group_size=2)(g)) == [["conv2d", "add"], ["relu"], ["sigmoid"], ["tanh", "multiply"]]
    assert ops_of_groups(FuseOps(max_group_size=1)(g)) == [["conv2d"], ["add"], ["relu"], ["tanh"], ["sigmoid"], ["multiply"]]
    # %a is also an output: it must be materialized, so relu cannot absorb it.
    g2 = g.replace(outputs=("m", "a"))
    assert ops_of_groups(FuseOps()(g2)) == [["conv2d", "add"], ["relu"], ["tanh", "sigmoid", "multiply"]]
    with pytest.raises(GraphError, match="max_group_size"):
        FuseOps(max_group_size=0)(g)


def test_injective_chains_fuse_but_never_into_an_anchor_and_opaque_ops_stay_alone():
    out = FuseOps()(parse("""
        graph g(%x: float32[2, 3, 2, 2], %y: float32[2, 12]) {
          %w = const(fill=0.1) : float32[5, 12]
          %f = flatten(%x)
          %a = add(%f, %y)
          %d = dense(%a, %w)
          %e = reshape(%d, newshape=[10])
          %n = negative(%e)
          %s = softmax(%n)
          %s2 = relu(%s)
          %big = add(%d, %d2)
          %d2 = const(fill=1.0) : float32[2, 5]
          %t = transpose(%big)
          return %s2, %t
        }"""))
    assert ops_of_groups(out) == [["flatten", "add"], ["dense"], ["reshape", "negative"], ["softmax"],
                                  ["relu"], ["add", "transpose"]]
    # %d has two consumers (reshape, add): no group may absorb it.


def test_epilogue_must_keep_the_anchor_shape():
    b = GraphBuilder()
    x = b.input("x", (1, 4))
    big = b.input("big", (3, 4))
    d = b.op("dense", x, b.const([[1.0] * 4] * 4, dtype="float32"))
    g = b.build(b.op("add", d, big))  # broadcasts [1, 4] up to [3, 4]: not an epilogue
    assert ops_of_groups(FuseOps()(g)) == [["dense"], ["add"]]


HAZARD = """
graph g(%x: float32[1, 2, 4, 4]) {
  %w = const(fill=0.5) : float32[3, 2, 1, 1]
  %c = conv2d(%x, %w)
  %t = layout_transform(%c, src_layout="NCHW", dst_layout="NHWC")
  %r = relu(%t)
  %back = layout_transform(%r, src_layout="NHWC", dst_layout="NCHW")
  return %back
}"""


def test_layout_transform_blocks_fusion_until_convert_layout_moves_it():
    g = parse(HAZARD)
    # A transform between conv2d and relu: the injective op cannot join the anchor's group.
    assert ops_of_groups(FuseOps()(g)) == [["conv2d"], ["layout_transform", "relu", "layout_transform"]]
    # ConvertLayout first: conv2d runs in NHWC, the transform pair around it cancels, relu
    # follows the converted value, and conv2d + relu fuse.
    out = Sequential([ConvertLayout(desired="NHWC"), FoldConstant(), FuseOps()])(g, PassContext(opt_level=3))
    assert ops_of_groups(out) == [["layout_transform"], ["conv2d", "relu"], ["layout_transform"]]
    x = random_inputs(g)
    assert_same_results(run(g, x), run(out, x), "float32", "hazard")


def test_convert_layout_after_fusion_is_too_late():
    """The order matters: fused groups are opaque to ConvertLayout, so it must run before
    FuseOps (and FoldConstant after it, to fold the weight transforms it inserts)."""
    g = load(CONV_BLOCK)
    fused_first = optimize(g, 2)  # ends with FuseOps
    assert ConvertLayout()(fused_first) == fused_first
    o3 = optimize(g, 3)
    convs = [n for n in fused_groups(o3) if describe(n).anchor == "conv2d"]
    assert len(convs) == 2
    for n in convs:
        d = describe(n)
        assert d.anchor_attrs["data_layout"] == "NHWC" and [e.op for e in d.epilogue][-1] == "relu"
    consts = {n.name for n in o3.nodes if n.is_const}
    for n in fused_groups(o3):  # no weight transform is left to run at inference time
        assert not (describe(n).ops[0] == "layout_transform" and n.inputs[0] in consts)


def test_describe_gives_anchor_attrs_inputs_and_ordered_epilogue():
    g = optimize(load(CONV_BLOCK), 2)
    d = describe(g.node("relu2"))
    assert d.anchor == "conv2d" and d.kind.name == "ANCHOR"
    assert d.anchor_attrs["padding"] == (1, 1, 1, 1) and d.anchor_inputs == (0, 1)
    assert [(e.op, e.operand) for e in d.epilogue] == [("add", 0), ("add", 0), ("relu", 0)]
    assert [k for k, _ in d.epilogue[1].others] == [0]  # the residual reads the block input
    assert [list(t.shape) for t in d.inputs] == [[1, 16, 32, 32], [16, 16, 3, 3], [16, 1, 1]]
    assert d.output.shape == (1, 16, 32, 32) and d.ops == ("conv2d", "add", "add", "relu")
    assert '"anchor":"conv2d"' in d.key and "relu2" not in d.key
    flat = describe(g.node("flat"))
    assert flat.anchor is None and flat.kind.name == "INJECTIVE" and [e.op for e in flat.epilogue] == ["flatten"]
    with pytest.raises(GraphError, match="not a fused group"):
        describe(g.node("data"))


def _conv_relu(name: str, padding: int):
    b = GraphBuilder(name)
    x = b.input(f"{name}_in", (1, 3, 8, 8))
    w = b.const_init(f"{name}_w", (4, 3, 3, 3), init="normal", seed=len(name))
    y = b.op("relu", b.op("conv2d", x, w, padding=[padding] * 4, name=f"{name}_c"), name=f"{name}_r")
    return FuseOps()(b.build(y))


def test_group_keys_identify_the_computation_not_the_names():
    (a,), (b,), (c,) = (fused_groups(_conv_relu(n, p)) for n, p in (("first", 1), ("second", 1), ("third", 0)))
    assert describe(a).key == describe(b).key != describe(c).key


def test_traffic_counts_what_fusion_saves():
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    g = b.build(b.op("tanh", b.op("relu", x)))
    before, after = graph_stats(g), graph_stats(FuseOps()(g))
    assert (before.written, before.read) == (48, 24)  # two float32[2, 3] written, one read back
    assert (after.written, after.read, after.fused) == (24, 0, 1)
    assert after.op_counts == {"relu": 1, "tanh": 1}


def test_partition_of_a_real_block():
    g = optimize(load(CONV_BLOCK), 2)
    assert len(partition(g)) == 0  # already fused: groups are opaque, nothing to regroup
    groups = ops_of_groups(g)
    assert groups[:2] == [["conv2d", "add", "relu"], ["conv2d", "add", "add", "relu"]]
    assert ["dense", "add"] in groups and ["softmax"] in groups
