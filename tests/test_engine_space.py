"""The engine's knobs, constraints and repair (search_spaces/gemm_engine/space.py): one rule
for the gemm, dense and conv2d templates; no kernel is compiled."""
from __future__ import annotations

import pytest

from search_spaces import get_template, isa
from search_spaces.gemm_engine import space as es
from search_spaces.space import ConfigSpace, Knob
from workloads.errors import InstantiationError
from workloads.gemm import Gemm


def _core_space(M, N, K, target):
    return ConfigSpace(es.core_knobs(M, N, K, 2, (False, True), (True,), target=target),
                       es.core_constraints(M, N, target))


@pytest.mark.parametrize("target", [isa.AVX2, isa.AVX512], ids=lambda t: t.name)
def test_value_lists_and_register_budget_follow_the_isa(target):
    L = target.lanes("float32")
    sp = _core_space(300, 500, 700, target)
    assert sp.knob("nr").values == (L, 2 * L, 3 * L)
    assert sp.knob("vec").values == (L // 2, L)
    micro = sp.constraints[0].check
    for mr in es.CORE_MR_VALUES:
        for nr in sp.knob("nr").values:
            c = {"mr": mr, "nr": nr, "vec": L}
            spills = mr * (nr // L) + nr // L + 1 > target.registers
            assert (micro(c) is not None) == spills, c
    assert "multiple of vec" in micro({"mr": 4, "nr": L, "vec": L // 2 * 3})
    with isa.using(target):
        g = get_template("gemm").space(Gemm(64, 64, 64), 1)
        assert g.knob("vec").values == es.vec_values(L)
        assert set(es.nr_values(L)) <= set(g.knob("nr").values)


def test_tiles_fit_micro_multiple_and_at_least():
    multiple = es.tiles_fit_micro(100, 100, multiple=True).check
    at_least = es.tiles_fit_micro(100, 100, multiple=False).check
    c = {"tile_m": 64, "mr": 6, "tile_n": 32, "nr": 16}
    assert "not a multiple of mr=6" in multiple(c)
    assert at_least(c) is None
    assert "smaller than nr=48" in at_least({**c, "nr": 48})
    covers = {"tile_m": 128, "mr": 6, "tile_n": 128, "nr": 48}   # blocks covering the dims
    assert multiple(covers) is None and at_least(covers) is None


def test_one_repair_rule_moves_tiles_to_whole_micro_tiles():
    sp = _core_space(300, 1000, 700, isa.AVX2)
    cfg = {"tile_m": 64, "tile_n": 256, "tile_k": 256, "mr": 6, "nr": 16, "vec": 8,
           "loop_order": "nkm", "pack_a": False, "pack_b": True, "parallel": "none", "threads": 1}
    assert es.repair(sp, cfg)["tile_m"] == 48   # multiples of 6: 48 and 96, the nearer
    assert es.repair(sp, {**cfg, "mr": 4, "nr": 24})["tile_n"] == 192   # of 24: 192, 384
    # a spilling micro-tile loses rows until it fits (AVX2: 8 x 3 and 6 x 3 vectors spill)
    fixed = es.repair(sp, {**cfg, "tile_m": 48, "tile_n": 192, "mr": 8, "nr": 24})
    assert (fixed["mr"], fixed["nr"], fixed["vec"]) == (4, 24, 8)
    # the GEMM template's space allows any block >= the micro-tile; the repair still takes a
    # multiple where it has to move a block
    g = get_template("gemm")
    with isa.using(isa.AVX2):
        w = Gemm(200, 100, 64)
        gs = g.space(w, 1)
        hand = {**dict(g.default_config(w, 1)), "tile_n": 16, "mr": 4, "nr": 24}
        assert gs.violation(hand).startswith("tiles_fit_micro")
        assert gs.knob("tile_n").values[:3] == (16, 32, 48)
        assert gs.is_valid({**hand, "tile_n": 32})   # allowed, but pads every block
        assert es.repair(gs, hand)["tile_n"] == 48


def test_repair_names_what_it_cannot_fix():
    sp = ConfigSpace([Knob("threads", (1, 2), True), Knob("parallel", ("none", "m"), False)],
                     [es.threads_match_parallel()])
    with pytest.raises(InstantiationError, match="threads > 1 exactly when"):
        es.repair(sp, {"threads": 2, "parallel": "none"})


def test_a_large_activation_moves_the_parallel_split_to_m():
    """ResNet-50's 28 x 28 x 512 -> 128 1 x 1 at 2 threads: split over N its 2 blocks are 100%
    even, but each thread would read the whole 1.6 MB image; charged for it, the split goes to
    M. A 400 KB image (the 3 x 3 layers) keeps N, and without ``a_bytes`` nothing moves."""
    import numpy as np

    from workloads.fused import workload_for_group
    from workloads.graph import GraphBuilder
    from workloads.graph.fusion import fused_groups
    from workloads.graph.passes import optimize

    def conv(C, O, k):   # 28 x 28 x C -> O, ResNet-50's second stage, NHWC after -O 3
        b = GraphBuilder("g")
        x = b.input("x", (1, C, 28, 28))
        w = b.const(np.ones((O, C, k, k), np.float32))
        g = optimize(b.build(b.op("relu", b.op("conv2d", x, w, strides=[1, 1], padding=[k // 2] * 2))),
                     opt_level=3)
        (wl,) = [workload_for_group(n) for n in fused_groups(g) if workload_for_group(n).kind == "conv2d"]
        return wl

    if isa.current().registers < 32:
        pytest.skip("the NHWC default's 6 x 64 tile is the 32-register ISAs' (AVX2 uses 6 x 16)")
    t = get_template("conv2d")
    pointwise, window = conv(512, 128, 1), conv(128, 128, 3)
    assert t.default_config(pointwise, 2)["parallel"] == "m"

    def split(w, charged):
        pl = t.plan(w)
        c = es.default_core_config(t.space(w, 2), pl["M"], pl["N"], pl["K"], 2, False, True,
                                   nr=64, mr=6, a_bytes=pl["image"] * 4 if charged else None)
        return c["parallel"], c["tile_m"], c["tile_n"]

    assert split(pointwise, False)[0] == "n"
    axis, tile_m, _ = split(pointwise, True)
    assert axis == "m" and tile_m % 6 == 0
    assert split(window, True) == split(window, False)   # 400 KB: the balance decides


def test_even_split_blocks_keep_both_threads_busy():
    """196 rows (a 14 x 14 image) in 96-row blocks give one of 2 threads 192 rows, in 16-row
    blocks 112 of them (Inception v2's 196 x 160 layers; N in 32-column tiles splits no
    better): the space also holds the blocks that cut a dimension into near-equal
    runs of whole micro-tiles (102 rows for 6-row tiles: 102 and 94; 104 for 8-row ones), and
    the default split takes them; one thread gets none (a 1-thread space is unchanged)."""
    from search_spaces.templates.features import split_efficiency

    assert es.with_splits((16, 256), 196, 2, (4, 6, 8), 1) == (16, 100, 102, 104, 256)
    assert es.with_splits((16, 256), 196, 1, (4, 6, 8), 1) == (16, 256)
    assert es.with_splits((16, 256), 196, 2) == (16, 112, 256)   # the GEMM templates': 16s
    space = _core_space(196, 192, 1152, isa.AVX512)
    assert {100, 102, 104} <= set(space.knob("tile_m").values)
    one = ConfigSpace(es.core_knobs(196, 192, 1152, 1, (False, True), (True,), target=isa.AVX512),
                      es.core_constraints(196, 192, isa.AVX512))
    assert 102 not in one.knob("tile_m").values
    c = es.default_core_config(space, 196, 160, 1152, 2, False, True, nr=32, mr=8)
    assert c["parallel"] == "m" and c["tile_m"] == 104
    assert split_efficiency(196, 104, 2) > 0.9 > split_efficiency(196, 16, 2) > split_efficiency(196, 96, 2)
