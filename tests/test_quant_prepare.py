"""Constant operands prepared once (``prepare`` / ``kernel_prepared``, search_spaces/template.py)
for the int8 anchors: the prepared form is exact and never reads the raw weight again; a built
model binds it for constant weights and keeps the per-call entry for a weight that is a graph
input; the measuring worker times the prepared form; ``show`` names it."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from search_spaces import get_template
from search_spaces.template import prepare_kernel
from tuner.measure.kernel_key import import_kernel_module
from tuner.measure.measurer import write_source
from workloads.graph import GraphBuilder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_quant_anchor_templates import qconv, qdense  # noqa: E402

pytestmark = pytest.mark.skipif(
    "avx2" not in __import__("search_spaces.isa", fromlist=["x"]).compile_features(),
    reason="the int8 engine needs AVX2")


def _module(w, cfg=None):
    t = get_template(w.kind)
    cfg = cfg or t.default_config(w)
    return t, cfg, import_kernel_module(write_source(t.codegen(w, cfg), template=t))


@pytest.mark.parametrize("make", [lambda: qconv("NCHW", C=6, HW=(9, 8), O=20, stride=2),
                                  lambda: qdense(21, 37, 19)], ids=["qconv2d", "qdense"])
def test_prepared_kernel_is_exact_and_never_reads_the_weight(make):
    w = make()
    t, cfg, mod = _module(w)
    idx = t.prepared_inputs(w, cfg)
    w_i = w.p["anchor_inputs"][1]
    assert w_i in idx
    x = w.make_inputs(4)
    expected = w.reference(x)
    pk = prepare_kernel(mod, idx, x)
    bp, corr = pk.prepared
    # the folded correction: bias - x_zero_point * sum_k w[c, k] (the bias is all zero here)
    wt = x[w_i].astype(np.int64)
    o_axis = w.weight_out_axis() if w.kind == "qconv2d" else 0
    wsum = np.moveaxis(wt, o_axis, 0).reshape(wt.shape[o_axis], -1).sum(1)
    bias = x[idx[1]].astype(np.int64).reshape(-1)
    np.testing.assert_array_equal(corr, bias - w.x_zero_point * wsum)
    assert bp.dtype == np.int8 and bp.ndim == 6
    # the raw weight is no longer read: zeroing it changes nothing once prepared
    x[w_i][...] = 0
    out = w.make_outputs()
    pk(*x, *out)
    assert w.check(x, out, expected) is None
    # the per-call entry does read it (so the test above can fail)
    out2 = w.make_outputs()
    mod.kernel(*x, *out2)
    assert w.check(x, out2, expected) is not None


def test_im2col_from_the_padded_image_with_batch_and_dilation():
    """Padding on every side, dilation, stride, batch 2, a partial last panel and group."""
    # C = 8 in NHWC: each K group one contiguous span of channels (the span copy)
    for layout, C in (("NCHW", 7), ("NHWC", 7), ("NHWC", 8)):
        w = qconv(layout, batch=2, C=C, HW=(11, 10), O=9, k=3, stride=2, pad=2, dil=2)
        t, cfg, mod = _module(w)
        x = w.make_inputs(1)
        out = w.make_outputs()
        mod.kernel(*x, *out)
        assert w.check(x, out, w.reference(x)) is None, (layout, C)
        src = t.codegen(w, cfg)
        assert "def pad_input(" in src
        assert ("contiguous span of G channels" in src) == (layout == "NHWC" and C == 8)


def _weight_input_graph():
    """A quantized conv whose weight is a graph input (not a constant), requantized to uint8."""
    b = GraphBuilder("qconv_weight_input")
    x = b.input("x", (1, 4, 7, 7), "uint8")
    wt = b.input("w", (6, 4, 3, 3), "int8")
    acc = b.op("qconv2d", x, wt, x_zero_point=11, w_max=64, strides=(1, 1), padding=(1,) * 4,
               dilation=(1, 1), data_layout="NCHW", kernel_layout="OIHW")
    y = b.op("requantize", acc, b.const(np.arange(6, dtype=np.int32) * 50),
             b.const(np.full(6, 0.01, np.float32)), axis=1, zero_point=3)
    return b.build(y)


def _conv_steps(module):
    return [s for s in module.steps if s.kind == "qconv2d"]


def test_build_prepares_constant_weights_once_and_keeps_per_call_packing_for_inputs(db_url):
    from tuner.compiler.compile_model import build
    from workloads.graph.executor import execute
    from test_build_int8 import tiny_conv_graph

    # constant weights (an --int8 build): every qconv2d/qdense step calls kernel_prepared on
    # the packed weight and correction, bound at build time
    m = build(tiny_conv_graph("NCHW"), db=db_url, int8=True, tuned=False, jobs=1)
    anchors = [s for s in m.steps if s.kind in ("qconv2d", "qdense")]
    assert len(anchors) == 4
    for s in anchors:
        assert s.fn.py_func.__name__ == "kernel_prepared", s.label
        assert any(a.ndim == 6 and a.dtype == np.int8 for a in s.args)   # B packed ahead
    # a weight given as a graph input: the entry, packing on every call, still exact
    g = _weight_input_graph()
    m2 = build(g, db=db_url, tuned=False, jobs=1)
    (s,) = _conv_steps(m2)
    assert s.source != "numpy" and s.fn.py_func.__name__ == "kernel"
    rng = np.random.default_rng(0)
    for seed in range(2):   # new weights each run: nothing was packed ahead
        xs = [rng.integers(0, 256, (1, 4, 7, 7), dtype=np.uint8),
              rng.integers(-64, 65, (6, 4, 3, 3), dtype=np.int8)]
        got = m2.run(xs)
        np.testing.assert_array_equal(got[0], execute(g, xs)[0])


def test_worker_times_the_prepared_form():
    from tuner.measure.measurer import MeasureOptions, Measurer

    w = qconv("NCHW", C=8, HW=(10, 10), O=16)
    t = get_template(w.kind)
    with Measurer(MeasureOptions(repeat=3, min_repeat_ms=1.0, max_time_s=5.0)) as m:
        (res,) = m.measure(w, t, [t.default_config(w)])
    assert res.ok, res.error
    assert res.info.get("prepared") == list(t.prepared_inputs(w, t.default_config(w)))


def test_show_names_the_prepared_form(capsys):
    from tuner.cli import main

    w = qdense(8, 16, 8)
    assert main(["show", w.key, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "def prepare(p1, p2):" in out and "def kernel_prepared(p0, p3, BP, corr, out):" in out
    assert "# prepared once: prepare(x1, x2)" in out and "kernel_prepared(x0, x3, *prepared, out)" in out


@pytest.mark.slow
@pytest.mark.parametrize("layout,form", [("NCHW", "pass"), ("NHWC", "pass"),
                                         ("NCHW", "registers"), ("NHWC", "registers")])
def test_requantize_epilogue_is_vectorized(layout, form, tmp_path):
    """The requantize compiles to 8-lane AVX2 code: round half to even (``vroundps $4``: the
    MXCSR default, as ``np.rint``) and float -> int32 conversion on ymm registers; in the
    separate pass (``kernel_prepared``'s loop over channels) and in the micro-kernel's tile
    store (``gemm``, with the saturating packs to bytes). Compiled without Numba's cache (a
    cached function has no assembly to show)."""
    import importlib.util
    import re

    w = qconv(layout, C=16, O=32)
    t = get_template(w.kind)
    cfg = t.default_config(w).replace(requantize=form)
    src = t.codegen(w, cfg).replace("cache=True", "cache=False")
    path = tmp_path / "k_asm.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"k_asm_{layout}_{form}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = w.make_inputs(0)
    pk = prepare_kernel(mod, t.prepared_inputs(w, cfg), x)
    out = w.make_outputs()
    pk(*x, *out)
    assert w.check(x, out, w.reference(x)) is None
    fn = mod.kernel_prepared if form == "pass" else mod.gemm
    asm = "\n".join(fn.inspect_asm().values())
    assert re.search(r"vroundps\s+\$4, %ymm", asm), "requantize rounding is not vectorized"
    assert re.search(r"vcvttps2dq\s+%ymm", asm), "the conversion to integers is not vectorized"
    if form == "registers":
        assert re.search(r"vpackssdw\s+%ymm", asm) and re.search(r"vpackuswb\s+%[xy]mm", asm)
