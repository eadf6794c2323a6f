"""Buffer placement: arrays at chosen offsets from a cache line, and a run worker that times
every candidate over several of them and scores it by the slowest."""
from __future__ import annotations

import numpy as np
import pytest

from search_spaces.space import Config
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.measure.placement import LINE, PLACEMENTS, empty_at, offset_of, placed_copies, rotation, spread
from tuner.measure.result import Status
from workloads.gemm import Gemm


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_empty_at_places_the_first_element(dtype):
    for off in range(0, LINE, 16):
        a = empty_at((5, 7), dtype, off)
        assert offset_of(a) == off and a.shape == (5, 7) and a.flags.c_contiguous
    with pytest.raises(ValueError):
        empty_at((3,), "float64", 4)     # not a multiple of the itemsize


def test_placed_copies_keep_values_and_rotation_differs():
    src = [np.arange(12, dtype=np.float32).reshape(3, 4), np.ones((4, 2), np.float64)]
    out = placed_copies(src, (32, 16))
    assert [offset_of(a) for a in out] == [32, 16]
    assert all(np.array_equal(a, b) for a, b in zip(out, src))
    assert placed_copies([src[0], 3.5], (16, 16))[1] == 3.5       # scalars pass through
    rot = rotation(4, 3)
    assert len(set(rot)) == 4 and rot[0] == (0, 0, 0) and rotation(2, 5)[1] == (16,) * 5
    assert spread([1.0, 1.1, 1.25]) == pytest.approx(0.25)


def test_run_worker_scores_the_slowest_placement(templates):
    w = Gemm.parse("24x16x8")
    with Measurer(MeasureOptions(threads=1, repeat=3, min_repeat_ms=2, max_time_s=1,
                                 build_workers=1, placements=3)) as m:
        (r,) = m.measure(w, templates["naive"], [Config({"unroll": 1})])
        base = m.baseline(w)
    assert r.ok, r.error
    places = r.info["placements"]
    assert [tuple(p["offsets"]) for p in places] == list(rotation(3, 3))
    assert r.median == pytest.approx(max(p["median"] for p in places))
    assert r.info["placement_rule"] == "slowest"
    assert r.info["placement_spread"] == pytest.approx(spread([p["median"] for p in places]))
    assert base.ok and len(base.info["placements"]) == 3
    assert len(r.info["cpu_samples"]) == len(r.samples) and r.info["cpu_placement_spread"] >= 0


def test_a_kernel_wrong_on_one_placement_is_caught(templates):
    from fault_templates import FaultGemm

    w = Gemm.parse("24x16x8")
    assert PLACEMENTS[4] == (48, 16, 0)
    with Measurer(MeasureOptions(threads=1, repeat=3, min_repeat_ms=2, max_time_s=1,
                                 build_workers=1, placements=5)) as m:
        (r,) = m.measure(w, FaultGemm(["misplaced"]), [Config({"fault": "misplaced"})])
    assert r.status is Status.WRONG_ANSWER
    assert "placement (48, 16, 0)" in r.error
