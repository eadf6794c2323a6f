"""Property tests on random well-typed graphs: every pass (and every pipeline) preserves the
NumPy reference results and probe side effects, keeps the graph valid and round-trippable,
and is idempotent."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from workloads.graph import execute, parse, random_inputs, to_text, verify
from workloads.graph.passes import (CanonicalizeOps, ConvertLayout, DeadCodeElimination,
                                EliminateCommonSubexpr, FoldConstant, FoldScaleAxis, FuseOps,
                                InferType, SimplifyInference, optimize)
from workloads.graph.testing import assert_same_results, graphs, run

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PASSES = {
    "InferType": InferType(),
    "SimplifyInference": SimplifyInference(),
    "CanonicalizeOps": CanonicalizeOps(),
    "FoldConstant": FoldConstant(),
    "FoldScaleAxis": FoldScaleAxis(),
    "EliminateCommonSubexpr": EliminateCommonSubexpr(),
    "DeadCodeElimination": DeadCodeElimination(),
    "ConvertLayout(NHWC)": ConvertLayout(desired="NHWC"),
    "ConvertLayout(NCHW)": ConvertLayout(desired="NCHW"),
    "FuseOps": FuseOps(),
    "FuseOps(max=3)": FuseOps(max_group_size=3),
}


def _dtype(g):
    return g.inputs[0].type.dtype


@SETTINGS
@given(graphs())
def test_random_graphs_are_valid_and_round_trip(g):
    verify(g)
    assert parse(to_text(g)) == g


def _prepared(g):
    """What later passes usually see: inference ops expanded, canonical, constants folded."""
    return FoldConstant()(CanonicalizeOps()(SimplifyInference()(g)))


@pytest.mark.parametrize("stage", ["raw", "prepared"])
@pytest.mark.parametrize("name", list(PASSES))
@SETTINGS
@given(g=graphs())
def test_pass_preserves_results_and_is_idempotent(name, stage, g):
    p = PASSES[name]
    if stage == "prepared":
        g = _prepared(g)
    x = random_inputs(g, seed=1)
    before = run(g, x)
    once = verify(p(g))
    assert_same_results(before, run(once, x), _dtype(g), name)
    twice = p(once)
    assert to_text(twice) == to_text(once), f"{name} is not idempotent"
    assert parse(to_text(once)) == once


@pytest.mark.parametrize("level", [0, 1, 2, 3])
@SETTINGS
@given(g=graphs())
def test_pipeline_preserves_results(level, g):
    x = random_inputs(g, seed=2)
    out = optimize(g, level)
    assert_same_results(run(g, x), run(out, x), _dtype(g), f"O{level}")
    # After the pipeline every op sits in a fused group.
    assert all(not n.is_compute or n.is_fused for n in out.nodes)
    if level == 0:
        assert all(len([m for m in n.body.nodes if m.is_compute]) == 1 for n in out.nodes if n.is_fused)


@SETTINGS
@given(g=graphs())
def test_optimized_graphs_keep_no_foldable_work(g):
    """At O2+ no fused group computes only from constants, and no batch_norm/dropout/bias_add
    is left anywhere."""
    out = optimize(g, 2)
    consts = {n.name for n in out.nodes if n.is_const}
    for n in out.nodes:
        if n.is_fused:
            assert not n.inputs or not all(i in consts for i in n.inputs) or n.body.nodes[-1].op == "probe"
            assert not {m.op for m in n.body.nodes} & {"batch_norm", "dropout", "bias_add"}
    execute(out, random_inputs(out))
