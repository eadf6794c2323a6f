"""The cache_flush measurement: operands evicted before each timed call, one call per sample."""
import numpy as np
import pytest

from tuner.measure.cache_flush import evict, flushed_operands
from tuner.measure.worker import time_callable


def test_evict_keeps_every_value():
    """clflush writes dirty lines back before it drops them: the data survive, for arrays of
    any element size, starting on or off a line, of any shape."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(1000).astype(np.float32)[3:],      # off a 64-byte line
              rng.integers(-128, 127, (7, 33), dtype=np.int8),
              rng.standard_normal((5, 9)),                         # float64, 2-D
              np.zeros(0, np.float32),
              rng.standard_normal((8, 8)).astype(np.float32)[:, ::2]]   # not contiguous: skipped
    copies = [a.copy() for a in arrays]
    for a in arrays:
        a[...] = a * 1   # dirty lines
    evict(arrays)
    for a, c in zip(arrays, copies):
        assert np.array_equal(a, c)


def test_flushed_operands_are_the_prepared_and_inputs_but_the_first():
    x, w, b = np.ones(4), np.ones(5), np.ones(6)
    packed = np.ones(7)
    got = flushed_operands([x, w, b], (packed,))
    assert [id(a) for a in got] == [id(packed), id(w), id(b)]


def test_each_flushed_sample_is_one_call_after_its_eviction():
    events = []
    samples, info = time_callable(lambda: events.append("call"), warmup=2, repeat=5,
                                  min_repeat_ms=5.0, max_time_s=1.0,
                                  before=lambda: events.append("flush"))
    assert info["number"] == 1 and info["cache_flush"] and len(samples) == 5
    assert events[:2] == ["flush", "call"]                 # the probe is flushed too
    assert events[-10:] == ["flush", "call"] * 5           # every timed call right after one
    warm = events[2:-10]
    assert warm and set(warm) == {"call"}                  # warm-up calls are not flushed


def test_without_flush_samples_batch_calls():
    samples, info = time_callable(lambda: None, warmup=1, repeat=3, min_repeat_ms=2.0, max_time_s=1.0)
    assert info["number"] > 1 and "cache_flush" not in info


@pytest.mark.parametrize("threads", [1, 2])
def test_a_prepared_conv_is_measured_flushed(threads):
    """A direct NHWC conv (weights prepared once per worker, as a build does) measured with
    cache_flush: OK on every placement, one call per sample, the flag in its info."""
    from test_conv2d_template import conv_workload

    from search_spaces import get_template
    from tuner.measure.measurer import MeasureOptions, Measurer

    w = conv_workload(16, 8, 32, 3, 1, 3)
    t = get_template("conv2d")
    opts = MeasureOptions(threads=threads, repeat=3, min_repeat_ms=2, max_time_s=1,
                          placements=2, cache_flush=True)
    with Measurer(opts) as m:
        (r,) = m.measure(w, t, [t.default_config(w, threads)])
    assert r.ok, r.error
    assert r.info["cache_flush"] and r.info["number"] == 1 and r.info["prepared"]
    assert all(p["number"] == 1 for p in r.info["placements"])
