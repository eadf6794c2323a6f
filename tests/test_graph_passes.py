"""Each pass on IR text (input -> expected output), and the pass infrastructure."""
from __future__ import annotations

import io

import pytest

from workloads.errors import UsageError
from workloads.graph import GraphError, PassError, parse, random_inputs, to_text, verify
from workloads.graph.passes import (CanonicalizeOps, ConvertLayout, DeadCodeElimination, DumpIR,
                                EliminateCommonSubexpr, FoldConstant, FoldScaleAxis, FuseOps,
                                InferType, PassContext, PassRecorder, PassTiming, Sequential,
                                SimplifyInference, graph_pass, pipeline_passes)
from workloads.graph.testing import assert_same_results, run


def check(p, src: str, expected: str, *, infer_input: bool = True):
    """``p(parse(src))`` prints exactly as ``expected`` and computes the same results."""
    g = parse(src, infer=infer_input)
    out = verify(p(g))
    assert to_text(out) == to_text(parse(expected)), to_text(out)
    if infer_input:
        x = random_inputs(g, seed=3)
        assert_same_results(run(g, x), run(out, x), g.inputs[0].type.dtype, p.name)
        assert to_text(p(out)) == to_text(out), "not idempotent"
    return out


def test_infer_type_fills_in_types():
    out = check(InferType(), """
        graph g(%x: float32[2, 3, 8, 8]) {
          %w = const(fill=1.0) : float32[4, 3, 3, 3]
          %c = conv2d(%x, %w, strides=[2, 2], padding=[1, 1])
          %f = flatten(%c)
          return %f
        }""", """
        graph g(%x: float32[2, 3, 8, 8]) {
          %w = const(fill=1.0) : float32[4, 3, 3, 3]
          %c = conv2d(%x, %w, strides=[2, 2], padding=[1, 1, 1, 1]) : float32[2, 4, 4, 4]
          %f = flatten(%c) : float32[2, 64]
          return %f
        }""", infer_input=False)
    assert out.node("f").type.shape == (2, 64)


def test_infer_type_reports_the_ill_typed_node():
    g = parse("graph g(%x: float32[2, 3], %y: float32[3, 2]) {\n %z = add(%x, %y)\n return %z\n}", infer=False)
    with pytest.raises(GraphError, match=r"%z = add\(%x: float32\[2, 3\], %y: float32\[3, 2\]\): .*do not broadcast"):
        InferType()(g)


BN_SRC = """
graph g(%x: float32[1, 2, 3, 3]) {
  %g = const(data=[1.0, 2.0]) : float32[2]
  %b = const(data=[0.5, -0.5]) : float32[2]
  %m = const(data=[0.0, 1.0]) : float32[2]
  %v = const(data=[1.0, 4.0]) : float32[2]
  %bn = batch_norm(%x, %g, %b, %m, %v, epsilon=0.0)
  %d = dropout(%bn)
  %r = relu(%d)
  return %r
}"""

BN_SIMPLIFIED = """
graph g(%x: float32[1, 2, 3, 3]) {
  %g = const(data=[1.0, 2.0]) : float32[2]
  %b = const(data=[0.5, -0.5]) : float32[2]
  %m = const(data=[0.0, 1.0]) : float32[2]
  %v = const(data=[1.0, 4.0]) : float32[2]
  %bn.eps = const(fill=0.0) : float32[]
  %bn.var_eps = add(%v, %bn.eps)
  %bn.std = sqrt(%bn.var_eps)
  %bn.scale = divide(%g, %bn.std)
  %bn.mean_scale = multiply(%m, %bn.scale)
  %bn.shift = subtract(%b, %bn.mean_scale)
  %bn.scale_b = expand_dims(%bn.scale, axis=1, num_newaxis=2)
  %bn.mul = multiply(%x, %bn.scale_b)
  %bn.shift_b = expand_dims(%bn.shift, axis=1, num_newaxis=2)
  %bn = add(%bn.mul, %bn.shift_b)
  %r = relu(%bn)
  return %r
}"""


def test_simplify_inference_expands_batch_norm_and_drops_dropout():
    check(SimplifyInference(), BN_SRC, BN_SIMPLIFIED)


def test_fold_constant_folds_the_batch_norm_parameters():
    check(FoldConstant(), BN_SIMPLIFIED, """
        graph g(%x: float32[1, 2, 3, 3]) {
          %bn.scale_b = const(fill=1.0) : float32[2, 1, 1]
          %bn.mul = multiply(%x, %bn.scale_b)
          %bn.shift_b = const(data=[0.5, -1.5]) : float32[2, 1, 1]
          %bn = add(%bn.mul, %bn.shift_b)
          %r = relu(%bn)
          return %r
        }""")


def test_fold_constant_cascades_and_keeps_side_effects():
    check(FoldConstant(), """
        graph g(%x: float32[2, 3]) {
          %a = constant_of_shape(shape=[3], value=2.0)
          %b = const(data=[1.0, 2.0, 3.0]) : float32[3]
          %c = multiply(%a, %b)
          %d = expand_dims(%c, axis=0)
          %p = probe(%d, tag="side")
          %y = add(%x, %d)
          return %y
        }""", """
        graph g(%x: float32[2, 3]) {
          %d = const(data=[2.0, 4.0, 6.0]) : float32[1, 3]
          %p = probe(%d, tag="side")
          %y = add(%x, %d)
          return %y
        }""")


def test_fold_scale_axis_folds_scale_through_bias_into_conv_weights():
    check(FoldScaleAxis(), """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w = const(fill=1.0) : float32[3, 2, 1, 1]
          %s = const(data=[1.0, 2.0, 3.0]) : float32[3, 1, 1]
          %b = const(data=[0.5, 0.25, 1.0]) : float32[3, 1, 1]
          %c = conv2d(%x, %w)
          %a = add(%c, %b)
          %m = multiply(%s, %a)
          %r = relu(%m)
          return %r
        }""", """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w.scaled = const(data=[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]) : float32[3, 2, 1, 1]
          %c.scaled = conv2d(%x, %w.scaled)
          %m.bias = const(data=[0.5, 0.5, 3.0]) : float32[3, 1, 1]
          %m = add(%c.scaled, %m.bias)
          %r = relu(%m)
          return %r
        }""")


def test_fold_scale_axis_dense_nhwc_and_chains():
    check(FoldScaleAxis(), """
        graph g(%x: float32[2, 3], %y: float32[1, 4, 4, 2]) {
          %w = const(fill=1.0) : float32[2, 3]
          %d = dense(%x, %w)
          %d2 = multiply(%d, %s)
          %s = const(data=[2.0, 3.0]) : float32[2]
          %k = const(fill=1.0) : float32[1, 1, 2, 2]
          %c = conv2d(%y, %k, data_layout="NHWC")
          %m1 = multiply(%c, %s)
          %m2 = multiply(%m1, %s)
          return %d2, %m2
        }""", """
        graph g(%x: float32[2, 3], %y: float32[1, 4, 4, 2]) {
          %w.scaled = const(data=[2.0, 2.0, 2.0, 3.0, 3.0, 3.0]) : float32[2, 3]
          %d.scaled = dense(%x, %w.scaled)
          %k.scaled.scaled = const(data=[4.0, 9.0, 4.0, 9.0]) : float32[1, 1, 2, 2]
          %c.scaled.scaled = conv2d(%y, %k.scaled.scaled, data_layout="NHWC")
          return %d.scaled, %c.scaled.scaled
        }""")


def test_fold_scale_axis_sums_two_constant_adds():
    """conv -> add(bias) -> multiply(scale) -> add(shift) (a conv and its batch norm): the
    scale folds into the weights and the bias, then the two constant adds become one; an
    add whose first sum has another reader stays."""
    check(FoldScaleAxis(), """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w = const(fill=1.0) : float32[3, 2, 1, 1]
          %s = const(data=[1.0, 2.0, 3.0]) : float32[3, 1, 1]
          %b = const(data=[0.5, 0.25, 1.0]) : float32[3, 1, 1]
          %t = const(data=[1.0, 1.0, 1.0]) : float32[3, 1, 1]
          %c = conv2d(%x, %w)
          %a = add(%c, %b)
          %m = multiply(%a, %s)
          %y = add(%m, %t)
          %r = relu(%y)
          return %r
        }""", """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w.scaled = const(data=[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]) : float32[3, 2, 1, 1]
          %c.scaled = conv2d(%x, %w.scaled)
          %y.bias = const(data=[1.5, 1.5, 4.0]) : float32[3, 1, 1]
          %y = add(%c.scaled, %y.bias)
          %r = relu(%y)
          return %r
        }""")
    src = """
        graph g(%x: float32[1, 3, 4, 4]) {
          %b = const(data=[0.5, 0.25, 1.0]) : float32[3, 1, 1]
          %a = add(%x, %b)
          %y = add(%a, %b)
          return %y, %a
        }"""
    check(FoldScaleAxis(), src, src)


def test_fold_scale_axis_leaves_shared_or_non_channel_scales_alone():
    src = """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w = const(fill=1.0) : float32[3, 2, 1, 1]
          %s = const(data=[1.0, 2.0, 3.0, 4.0]) : float32[4]
          %t = const(data=[1.0, 2.0, 3.0]) : float32[3, 1, 1]
          %c = conv2d(%x, %w)
          %m1 = multiply(%c, %s)
          %c2 = conv2d(%x, %w)
          %m2 = multiply(%c2, %t)
          %sum = add(%m2, %c2)
          return %m1, %sum
        }"""
    check(FoldScaleAxis(), src, src)  # %s scales the W axis; %c2 has two consumers


def test_eliminate_common_subexpr_merges_equal_values_but_not_side_effects():
    check(EliminateCommonSubexpr(), """
        graph g(%x: float32[2, 3]) {
          %c1 = const(data=[1.0, 2.0, 3.0]) : float32[3]
          %c2 = const(data=[1.0, 2.0, 3.0]) : float32[3]
          %a = add(%x, %c1)
          %b = add(%c2, %x)
          %r1 = relu(%a)
          %r2 = relu(%b)
          %p1 = probe(%r1, tag="t")
          %p2 = probe(%r1, tag="t")
          %n = subtract(%r2, %r1)
          %q = subtract(%r1, %r2)
          return %n, %q
        }""", """
        graph g(%x: float32[2, 3]) {
          %c1 = const(data=[1.0, 2.0, 3.0]) : float32[3]
          %a = add(%x, %c1)
          %r1 = relu(%a)
          %p1 = probe(%r1, tag="t")
          %p2 = probe(%r1, tag="t")
          %n = subtract(%r1, %r1)
          return %n, %n
        }""")


def test_dead_code_elimination_keeps_outputs_inputs_and_side_effects():
    check(DeadCodeElimination(), """
        graph g(%x: float32[2], %unused: float32[3]) {
          %a = relu(%x)
          %dead1 = tanh(%x)
          %dead2 = sigmoid(%dead1)
          %k = exp(%x)
          %p = probe(%k, tag="k")
          return %a
        }""", """
        graph g(%x: float32[2], %unused: float32[3]) {
          %a = relu(%x)
          %k = exp(%x)
          %p = probe(%k, tag="k")
          return %a
        }""")


def test_canonicalize_ops_turns_bias_add_into_broadcast_add():
    check(CanonicalizeOps(), """
        graph g(%x: float32[1, 3, 2, 2], %y: float32[4, 3]) {
          %b = const(data=[1.0, 2.0, 3.0]) : float32[3]
          %z = bias_add(%x, %b)
          %w = bias_add(%y, %b, axis=-1)
          return %z, %w
        }""", """
        graph g(%x: float32[1, 3, 2, 2], %y: float32[4, 3]) {
          %b = const(data=[1.0, 2.0, 3.0]) : float32[3]
          %z.bias = expand_dims(%b, axis=1, num_newaxis=2)
          %z = add(%x, %z.bias)
          %w = add(%y, %b)
          return %z, %w
        }""")


def test_convert_layout_puts_transforms_only_at_the_boundaries():
    check(ConvertLayout(desired="NHWC"), """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w = const(fill=0.5) : float32[3, 2, 3, 3]
          %s = const(data=[1.0, 2.0, 3.0]) : float32[3, 1, 1]
          %c = conv2d(%x, %w, padding=[1, 1, 1, 1])
          %a = add(%c, %s)
          %r = relu(%a)
          %sm = softmax(%r, axis=1)
          %p = max_pool2d(%sm, pool_size=[2, 2], strides=[2, 2])
          %f = flatten(%p)
          return %f
        }""", """
        graph g(%x: float32[1, 2, 4, 4]) {
          %w = const(fill=0.5) : float32[3, 2, 3, 3]
          %s = const(data=[1.0, 2.0, 3.0]) : float32[3, 1, 1]
          %x.nhwc = layout_transform(%x, src_layout="NCHW", dst_layout="NHWC")
          %w.hwio = layout_transform(%w, src_layout="OIHW", dst_layout="HWIO")
          %c = conv2d(%x.nhwc, %w.hwio, padding=[1, 1, 1, 1], data_layout="NHWC")
          %s.4d = expand_dims(%s, axis=0)
          %s.4d.nhwc = layout_transform(%s.4d, src_layout="NCHW", dst_layout="NHWC")
          %a = add(%c, %s.4d.nhwc)
          %r = relu(%a)
          %sm = softmax(%r, axis=3)
          %p = max_pool2d(%sm, pool_size=[2, 2], strides=[2, 2], layout="NHWC")
          %p.nchw = layout_transform(%p, src_layout="NHWC", dst_layout="NCHW")
          %f = flatten(%p.nchw)
          return %f
        }""")


def test_convert_layout_keeps_graphs_with_grouped_convs_in_nchw():
    """Grouped (and depthwise) convs have kernels for NCHW/OIHW only: a graph that has one is
    not converted to NHWC at all (no conv between two transforms), while the same graph
    without it is."""
    src = """
        graph g(%x: float32[1, 4, 4, 4]) {{
          %w = const(fill=0.5) : float32[4, 4, 1, 1]
          %wg = const(fill=0.5) : float32[4, {ci}, 3, 3]
          %c = conv2d(%x, %w)
          %d = conv2d(%c, %wg, padding=[1, 1, 1, 1], groups={groups})
          return %d
        }}"""
    check(ConvertLayout(desired="NHWC"), src.format(ci=2, groups=2), src.format(ci=2, groups=2))
    g = ConvertLayout(desired="NHWC")(parse(src.format(ci=4, groups=1)))
    assert [n.attrs["data_layout"] for n in g.nodes if n.op == "conv2d"] == ["NHWC", "NHWC"]


def test_convert_layout_cancels_back_to_back_transforms():
    check(ConvertLayout(), """
        graph g(%x: float32[1, 2, 3, 3]) {
          %t1 = layout_transform(%x, src_layout="NCHW", dst_layout="NHWC")
          %t2 = layout_transform(%t1, src_layout="NHWC", dst_layout="NCHW")
          %r = relu(%t2)
          return %r
        }""", """
        graph g(%x: float32[1, 2, 3, 3]) {
          %r = relu(%x)
          return %r
        }""")


def test_convert_layout_back_to_nchw():
    check(ConvertLayout(desired="NCHW"), """
        graph g(%x: float32[1, 4, 4, 2]) {
          %w = const(fill=0.5) : float32[1, 1, 2, 3]
          %c = conv2d(%x, %w, data_layout="NHWC")
          %g = global_avg_pool2d(%c, layout="NHWC")
          return %g
        }""", """
        graph g(%x: float32[1, 4, 4, 2]) {
          %w = const(fill=0.5) : float32[1, 1, 2, 3]
          %x.nchw = layout_transform(%x, src_layout="NHWC", dst_layout="NCHW")
          %w.oihw = layout_transform(%w, src_layout="HWIO", dst_layout="OIHW")
          %c = conv2d(%x.nchw, %w.oihw)
          %g = global_avg_pool2d(%c)
          %g.nhwc = layout_transform(%g, src_layout="NCHW", dst_layout="NHWC")
          return %g.nhwc
        }""")


# ---- infrastructure -------------------------------------------------------------------

MLP = """
graph mlp(%x: float32[4, 8]) {
  %w = const(init="normal", seed=1) : float32[6, 8]
  %b = const(fill=0.5) : float32[6]
  %d = dense(%x, %w)
  %y = bias_add(%d, %b, axis=1)
  %r = relu(%y)
  return %r
}"""


def test_sequential_respects_opt_level_and_disabled_passes():
    rec = PassRecorder()
    seq = Sequential([InferType(), CanonicalizeOps(), FoldConstant(), DeadCodeElimination()])
    seq(parse(MLP), PassContext(opt_level=1, disabled={"DeadCodeElimination"}, instruments=[rec]))
    assert [p.name for p, _, _ in rec.runs] == ["InferType", "CanonicalizeOps"]
    assert [(p.name, r) for p, r in rec.skips] == [("FoldConstant", "opt_level 2 > 1"),
                                                   ("DeadCodeElimination", "disabled")]
    with pytest.raises(UsageError, match="unknown pass 'Nope'"):
        PassContext(disabled={"Nope"})


def test_required_passes_run_first():
    seq = Sequential([FuseOps()])
    seq(parse(MLP, infer=False))
    assert seq.ran == ["InferType", "FuseOps"]


def test_instruments_time_and_dump():
    timing, stream = PassTiming(), io.StringIO()
    Sequential([InferType(), CanonicalizeOps()])(
        parse(MLP), PassContext(instruments=[timing, DumpIR(before=True, stream=stream)]))
    assert [n for n, _ in timing.times] == ["InferType", "CanonicalizeOps"]
    assert "total" in timing.render()
    text = stream.getvalue()
    assert "# ---- IR before InferType" in text and "# ---- IR after InferType: unchanged" in text
    assert "# ---- IR after CanonicalizeOps" in text and "%y = add(%d, %b)" in text


@graph_pass("TestBoom", opt_level=0)
def TestBoom(graph):
    raise ValueError("kaboom")


@graph_pass("TestBreaksTypes", opt_level=0)
def TestBreaksTypes(graph):
    return graph.replace(outputs=("nowhere",))


def test_failing_pass_is_reported_with_the_passes_before_it():
    with pytest.raises(PassError, match=r"pass TestBoom failed \(after InferType, CanonicalizeOps\): "
                                        r"ValueError: kaboom") as info:
        Sequential([InferType(), CanonicalizeOps(), TestBoom()])(parse(MLP))
    assert info.value.pass_name == "TestBoom" and info.value.ran == ("InferType", "CanonicalizeOps")
    with pytest.raises(PassError, match=r"pass TestBreaksTypes produced an invalid graph \(after InferType\): "
                                        r".*undefined value %nowhere"):
        Sequential([InferType(), TestBreaksTypes()])(parse(MLP))


def test_default_pipelines_are_explicit_lists():
    names = {lvl: [p.name for p in pipeline_passes(lvl)] for lvl in range(4)}
    assert names[0] == ["InferType", "SimplifyInference", "FuseOps"]
    assert names[1] == ["InferType", "SimplifyInference", "CanonicalizeOps", "DeadCodeElimination", "FuseOps"]
    assert names[2] == ["InferType", "SimplifyInference", "CanonicalizeOps", "FoldConstant", "FoldScaleAxis",
                        "FoldConstant", "EliminateCommonSubexpr", "DeadCodeElimination", "FuseOps"]
    assert names[3][-4:] == ["ConvertLayout", "FoldConstant", "DeadCodeElimination", "FuseOps"]
    assert dict(pipeline_passes(0)[-1].options) == {"max_group_size": 1}
    for lvl in range(4):
        assert all(p.info.opt_level <= lvl for p in pipeline_passes(lvl))
    with pytest.raises(UsageError):
        pipeline_passes(4)


def test_convert_layout_rejects_unknown_layouts():
    with pytest.raises(UsageError, match="desired layout must be one of NCHW, NHWC"):
        ConvertLayout(desired="CHWN")(parse(MLP))
