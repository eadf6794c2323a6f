"""8-bit max pooling in vector form (``fixed_vector.pool8_nchw_vector``): exact against the
NumPy reference for uint8 and int8 over the whole range, stride 1 and 2, padding (read as the
lowest level), ceil mode, rows narrower and wider than a vector, a trailing dequantize, and
the planes split across 2 threads."""
from __future__ import annotations

import numpy as np
import pytest

from search_spaces import get_template, isa
from search_spaces.space import Config
from tuner.dispatch import load_kernel
from workloads.graph import GraphBuilder
from workloads.graph.fusion import fused_groups
from workloads.graph.passes import optimize
from workloads.fused import workload_for_group


def _workload(dtype, shape, k, s, p, ceil=False, dequantize=False):
    b = GraphBuilder("g")
    y = b.op("max_pool2d", b.input("x", (1,) + shape, dtype), pool_size=[k, k], strides=[s, s],
             padding=[p] * 4, ceil_mode=ceil)
    if dequantize:
        y = b.op("dequantize", y, scale=0.05, zero_point=3 if dtype == "uint8" else -2)
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(b.build(y), opt_level=2))]
    return w


# (dtype, (C, H, W), window, stride, padding, ceil mode, dequantize after, threads); one
# compile each (0.7-1.6 s at load ~1, up to 10-17 s on the loaded 2-core machine): output
# rows wider than 32 lanes with a partial last vector (35, 40, 20 outputs per row) and
# narrower (13); one 2-thread case in the default run, the other slow.
CASES = [("uint8", (3, 20, 70), 3, 2, 1, False, False, 1),
         ("int8", (2, 9, 13), 3, 1, 1, True, True, 1),
         ("uint8", (2, 12, 40), 3, 1, 1, False, False, 2),
         pytest.param("int8", (3, 11, 41), 2, 2, 0, False, True, 2, marks=pytest.mark.slow)]


@pytest.mark.parametrize("dtype,shape,k,s,p,ceil,deq,threads", CASES)
def test_8bit_max_pool_vector_is_exact(dtype, shape, k, s, p, ceil, deq, threads):
    w = _workload(dtype, shape, k, s, p, ceil, deq)
    t = get_template("fixed")
    cfg = Config({"threads": threads})
    src = t.codegen(w, cfg)
    assert "vmax(acc, " in src and "if xv > v" not in src          # the vector form, no branches
    assert f"VEC, NC = {isa.current().vector_bits // 8}," in src    # 8-bit lanes (32 on AVX2)
    assert ("vload_even(P" in src) == (s == 2) and ("prange" in src) == (threads > 1)
    assert t.space(w, 2).knob("threads").values == (1, 2)
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    x = [rng.integers(info.min, int(info.max) + 1, (1,) + shape).astype(dtype)]
    x[0][0, 0, :3, :3] = info.min    # a window of lowest values next to the padding
    (out,) = w.make_outputs()   # 8-bit outputs filled with 0xA5 / -0x5B (NaN for float32)
    load_kernel(w, t, cfg)(*x, out)
    (ref,) = w.reference(x)
    assert out.dtype == ref.dtype and np.array_equal(out, ref)
    assert w.check(x, [out], [ref]) is None


def test_float_max_pool_then_quantize_is_vector_and_exact():
    """An FP32 max pool feeding a quantized op: float vectors pooled, each output quantized
    (round half to even, clamp) as it is stored; negative inputs, so padding read as 0
    instead of -inf would show."""
    b = GraphBuilder("g")
    y = b.op("max_pool2d", b.input("x", (1, 3, 10, 37)), pool_size=[3, 3], strides=[2, 2],
             padding=[1] * 4)
    (w,) = [workload_for_group(n) for n in fused_groups(optimize(
        b.build(b.op("quantize", y, scale=0.02, zero_point=200, dtype="uint8")), opt_level=2))]
    assert w.dtype == "uint8"
    t = get_template("fixed")
    cfg = Config({"threads": 1})
    src = t.codegen(w, cfg)
    assert "vmax(acc, vload_s2(P" in src and "np.rint" in src and "if xv > v" not in src
    x = [np.random.default_rng(2).uniform(-4.5, 0.5, (1, 3, 10, 37)).astype(np.float32)]
    x[0][0, 0, 0, :6] = [-4.0, -3.99, -1.01, -1.0, -0.99, 0.01]   # levels and half-levels
    (out,) = w.make_outputs()
    load_kernel(w, t, cfg)(*x, out)
    (ref,) = w.reference(x)
    assert np.array_equal(out, ref)


def test_8bit_max_pool_falls_back_to_scalar_for_other_strides():
    """Horizontal stride 3 keeps the scalar form (and one thread)."""
    w = _workload("uint8", (2, 9, 9), 3, 3, 0)
    t = get_template("fixed")
    assert "if xv > v" in t.codegen(w, t.default_config(w, max_threads=2))
    assert t.space(w, 2).knob("threads").values == (1,)


def test_resnet50_pool_defaults_to_every_thread():
    w = _workload("uint8", (64, 112, 112), 3, 2, 1)
    t = get_template("fixed")
    assert t.default_config(w, max_threads=2)["threads"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("dtype,instr", [("uint8", "vpmaxub"), ("int8", "vpmaxsb")])
def test_8bit_max_pool_compiles_to_byte_max_on_ymm(tmp_path, dtype, instr):
    """The max is one unsigned/signed byte max per 32 lanes (AVX2), not a branch per element
    (slow: compiles without the cache to read the assembly)."""
    import importlib.util
    import re

    if isa.current().vector_bits != 256:
        pytest.skip("checks the AVX2 form (256-bit vectors)")
    w = _workload(dtype, (2, 9, 40), 3, 2, 1)
    t = get_template("fixed")
    path = tmp_path / f"pool8_{dtype}.py"
    path.write_text(t.codegen(w, Config({"threads": 1})).replace("cache=True", "cache=False"))
    spec = importlib.util.spec_from_file_location(f"pool8_{dtype}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = np.zeros((1, 2, 9, 40), dtype)
    mod.kernel(x, np.empty(w.out_shape, dtype))
    asm = "\n".join(mod.kernel.inspect_asm().values())
    assert re.search(rf"{instr}\s+[^\n]*%ymm", asm), f"no {instr} on ymm registers"
