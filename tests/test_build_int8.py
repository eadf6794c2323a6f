"""``build --int8``: calibration, quantization and a compiled module of the quantized graph,
checked kernel by kernel against the NumPy executor of that graph (integers exactly), the
coverage in the summary line, and bad input (one line, exit 2)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tuner.cli import main
from workloads.graph.builder import GraphBuilder

MODELS = Path(__file__).resolve().parent.parent / "workloads" / "models"
DIGITS = str(MODELS / "digits_mlp.onnx")
CALIB = str(MODELS / "digits_calib.npz")
TEST = str(MODELS / "digits_test.npz")


def tiny_conv_graph(layout: str = "NCHW"):
    """conv(3x3, pad 1) + bias + relu -> max pool -> conv 1x1 + bias -> residual add with
    another 1x1 conv -> relu -> flatten -> dense + bias -> softmax: every quantized op kind."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("tiny_conv")
    shape = (1, 5, 9, 9) if layout == "NCHW" else (1, 9, 9, 5)
    x = b.input("x", shape)
    kl = "OIHW" if layout == "NCHW" else "HWIO"
    cax = 1 if layout == "NCHW" else 3

    def conv(v, cin, cout, k, pad, name):
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.3
        if kl == "HWIO":
            w = w.transpose(2, 3, 1, 0).copy()
        c = b.op("conv2d", v, b.const(w, f"{name}_w"), padding=(pad,) * 4, data_layout=layout,
                 kernel_layout=kl, name=name)
        bias_shape = [1, 1, 1, 1]
        bias_shape[cax] = cout
        return b.op("add", c, b.const(rng.standard_normal(bias_shape).astype(np.float32) * 0.1,
                                      f"{name}_b"), name=f"{name}_add")

    h = b.op("relu", conv(x, 5, 8, 3, 1, "c1"), name="r1")
    h = b.op("max_pool2d", h, pool_size=(2, 2), strides=(2, 2), layout=layout, name="pool")
    a = conv(h, 8, 8, 1, 0, "c2")
    c = conv(h, 8, 8, 1, 0, "c3")
    h = b.op("relu", b.op("add", a, c, name="res"), name="r2")
    f = b.op("flatten", h, name="flat")
    d = b.op("dense", f, b.const(rng.standard_normal((6, 128)).astype(np.float32) * 0.1, "fc_w"),
             name="fc")
    d = b.op("add", d, b.const(rng.standard_normal((6,)).astype(np.float32), "fc_b"), name="fc_add")
    return b.build(b.op("softmax", d, axis=1, name="prob"))


def test_build_int8_digits_summary_and_exact_check(capsys, db_url):
    assert main(["verify", DIGITS, "--int8", "--calibration", CALIB, "--db", db_url]) == 0
    out = capsys.readouterr().out
    line = out.splitlines()[0]
    assert line.startswith("built digits_mlp INT8:"), line
    assert "int8: 5 ops quantized, 1 left in FP32 (softmax x1), 1 conversions (1 quantize + 0 dequantize)" in line
    assert "PASS" in out


def test_build_int8_says_what_int8_arithmetic_gains_here(capsys, db_url):
    """After the summary, ``build --int8`` prints this core's measured int8 ceiling against
    its fp32 peak (a warning where INT8 cannot win in arithmetic, e.g. AMD Zen 2)."""
    from tuner.bench.peak import INT8_ARITHMETIC_GAIN, stored_core_peaks

    assert main(["build", DIGITS, "--int8", "--calibration", CALIB, "--db", db_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("built digits_mlp INT8:"), lines
    peaks = stored_core_peaks()
    best = max(v for d, v in peaks.items() if d != "fp32_fma_gflops") / peaks["fp32_fma_gflops"]
    assert lines[1].startswith("note: " if best < INT8_ARITHMETIC_GAIN else "int8 arithmetic"), lines
    assert f"= {best:.2f}x the fp32 FMA peak" in lines[1], lines


@pytest.mark.parametrize("layout", ["NCHW", pytest.param("NHWC", marks=pytest.mark.slow)])
def test_build_int8_tiny_conv_exact_kernel_by_kernel(db_url, layout):
    """Every group generated (quantize, qconv2d 3x3 and 1x1, uint8 max pool, conv + residual
    qadd, qdense to float32) and each kernel's output equal to the reference's."""
    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import verify_int8

    g = tiny_conv_graph(layout)
    module = build(g, db=db_url, int8=True, tuned=False, jobs=1)
    res = verify_int8(g, module=module)
    assert res.ok, [s for s in res.steps if s.mismatches]
    ints = [s for s in res.steps if s.dtype == "uint8"]
    assert len(ints) == 5                     # 8-bit values between quantized kernels
    assert module.summary.counts["numpy"] == 0
    q = module.summary.quant
    assert q["quantized_numpy"] == 0 and q["quantized_kernels"] == 6
    assert {s.kind for s in module.steps} >= {"qconv2d", "qdense", "injective", "fixed"}
    assert "0 of 6 quantized kernels numpy" in res.summary


def grouped_conv_graph():
    """ShuffleNet's int8 shapes in small: conv 3x3 stride 2 with a bias and a folded batch
    norm's shift (two constant adds) -> relu -> grouped 1x1 (2 groups) + bias -> relu ->
    depthwise 3x3 (groups = channels) + bias -> residual add with a grouped 1x1 -> relu."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("grouped_conv")
    x = b.input("x", (1, 4, 12, 12))

    def const(shape, name, scale=0.3):
        return b.const(rng.standard_normal(shape).astype(np.float32) * scale, name)

    def conv(v, cin, cout, k, name, groups=1, stride=1, pad=0):
        c = b.op("conv2d", v, const((cout, cin // groups, k, k), f"{name}_w"), padding=(pad,) * 4,
                 strides=(stride, stride), groups=groups, data_layout="NCHW", kernel_layout="OIHW",
                 name=name)
        return b.op("add", c, const((1, cout, 1, 1), f"{name}_b", 0.1), name=f"{name}_add")

    h = b.op("add", conv(x, 4, 8, 3, "stem", stride=2, pad=1), const((1, 8, 1, 1), "bn_shift", 0.1),
             name="bn_add")
    h = b.op("relu", h, name="r0")
    g = b.op("relu", conv(h, 8, 8, 1, "g1", groups=2), name="r1")
    d = conv(g, 8, 8, 3, "dw", groups=8, pad=1)
    r = b.op("add", d, conv(h, 8, 8, 1, "g2", groups=4), name="res")
    return b.build(b.op("relu", r, name="r2"))


def test_build_int8_grouped_and_depthwise_generated_exact(db_url):
    """Grouped and depthwise qconv2d are generated kernels (no NumPy group), the two bias adds
    after the stem fold into one requantize, and every 8-bit output equals the reference's."""
    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import verify_int8

    g = grouped_conv_graph()
    module = build(g, db=db_url, int8=True, tuned=False, jobs=1)
    res = verify_int8(g, module=module)
    assert res.ok, [s for s in res.steps if s.mismatches]
    assert module.summary.counts["numpy"] == 0 and module.summary.quant["quantized_numpy"] == 0
    assert {s.kind for s in module.steps} >= {"qconv2d", "qconv2d_grouped", "qdepthwise_conv2d"}


def test_build_int8_check_catches_a_wrong_kernel(db_url):
    """The step-by-step check is exact: one flipped output level of a uint8 kernel fails it."""
    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import verify_int8

    g = tiny_conv_graph()
    module = build(g, db=db_url, int8=True, tuned=False, jobs=1)
    step = next(s for s in module.steps if s.args and s.args[-1].dtype == np.uint8)
    fn = step.fn

    def off_by_one(*args):
        fn(*args)
        out = args[-1].reshape(-1)
        out[0] = out[0] + 1 if out[0] < 255 else 254
    step.fn = off_by_one
    res = verify_int8(g, module=module)
    assert not res.ok
    bad = [s for s in res.steps if s.mismatches]
    assert bad[0].name == step.name and bad[0].mismatches == 1


def test_build_int8_api_options_and_coverage(db_url):
    import tuner
    from tuner.quant.flow import Int8Options

    g = tiny_conv_graph()
    m = tuner.build(g, db=db_url, tuned=False, jobs=1,
                    int8=Int8Options(calibration=4, method="percentile", reduce_range=False))
    q = m.summary.quant
    assert q["method"] == "percentile" and q["reduce_range"] is False
    assert q["calibration"].startswith("random:4")
    assert q["quantized_by_op"]["conv2d"] == 3 and q["quantized_by_op"]["dense"] == 1
    assert q["fp32_by_op"] == {"softmax": 1}
    x = np.random.default_rng(0).standard_normal((1, 5, 9, 9)).astype(np.float32)
    p = m.run([x])[0]
    assert p.shape == (1, 6) and abs(float(p.sum()) - 1) < 1e-5


# ---- bad input: one line, exit 2 ------------------------------------------------------

def assert_usage_error(capsys, args, match: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and match in err[0], err


def test_build_int8_bad_input(capsys, tmp_path, db_url):
    # nothing to quantize
    ir = tmp_path / "nothing.ir"
    b = GraphBuilder("nothing")
    x = b.input("x", (1, 8))
    from workloads.graph.text import to_text
    ir.write_text(to_text(b.build(b.op("softmax", b.op("relu", x), axis=1))))
    assert_usage_error(capsys, ["build", str(ir), "--int8", "--db", db_url], "nothing to quantize")
    # calibration file of the wrong shape, the wrong dtype, with NaN; an empty set
    bad_shape = tmp_path / "shape.npy"
    np.save(bad_shape, np.zeros((4, 63), np.float32))
    assert_usage_error(capsys, ["build", DIGITS, "--int8", "--calibration", str(bad_shape),
                                "--db", db_url], "shape")
    bad_dtype = tmp_path / "dtype.npy"
    np.save(bad_dtype, np.zeros((4, 64), np.int32))
    assert_usage_error(capsys, ["build", DIGITS, "--int8", "--calibration", str(bad_dtype),
                                "--db", db_url], "floating point")
    nan = tmp_path / "nan.npz"
    x = np.ones((4, 64), np.float32)
    x[2, 5] = np.nan
    np.savez(nan, x=x)
    assert_usage_error(capsys, ["build", DIGITS, "--int8", "--calibration", str(nan),
                                "--db", db_url], "NaN")
    assert_usage_error(capsys, ["build", DIGITS, "--int8", "--calibration", "0", "--db", db_url],
                       "empty")
    # INT8 options without --int8
    assert_usage_error(capsys, ["build", DIGITS, "--calibration", CALIB], "only applies with --int8")
    # nothing was recorded
    cal = Path(db_url.replace("sqlite:///", "")).parent / "calibration"
    assert not cal.exists() or not list(cal.iterdir())


def test_digits_accuracy_through_the_built_int8_module(db_url):
    """FP32 vs INT8 test accuracy of the digits model through the built modules (360 test
    images, calibration on the shipped training images): the INT8 module's predictions are
    the quantized graph's, every dense layer a generated kernel, accuracy within 0.6 points
    (7-bit weights with minmax lose 2 images, docs/quantization.md)."""
    import tuner
    from tuner.frontend import load_model
    from tuner.quant.flow import Int8Options
    from workloads.graph.executor import execute

    graph = load_model(DIGITS)
    data = np.load(TEST)
    x, y = data["x"].astype(np.float32), data["y"]
    fp = tuner.build(graph, db=db_url, tuned=False, jobs=1)
    q = tuner.build(graph, db=db_url, tuned=False, jobs=1,
                    int8=Int8Options(calibration=CALIB, reduce_range=True))
    assert q.summary.counts["numpy"] == 0
    assert [s.kind for s in q.steps if s.kind == "qdense"] == ["qdense", "qdense"]
    p_fp = np.array([fp.run([row[None]])[0].argmax() for row in x])
    p_q = np.array([q.run([row[None]])[0].argmax() for row in x])
    qgraph = q.quantized.quantized.graph
    p_ref = np.array([execute(qgraph, [row[None]])[0].argmax() for row in x])
    np.testing.assert_array_equal(p_q, p_ref)
    acc_fp, acc_q = float(np.mean(p_fp == y)), float(np.mean(p_q == y))
    assert abs(acc_fp - 349 / 360) < 1e-9          # 96.94%, scikit-learn's score
    assert acc_fp - acc_q <= 0.006, (acc_fp, acc_q)


def test_quantize_after_data_movement_is_generated(db_url):
    """A quantize fused after a reshape (ResNet-50's head) is generated by the injective
    template's array form, exactly."""
    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import verify_int8

    rng = np.random.default_rng(0)
    b = GraphBuilder("head")
    x = b.input("x", (1, 8, 2, 2))
    f = b.op("reshape", b.op("negative", x), newshape=(1, 32))
    d = b.op("dense", f, b.const(rng.standard_normal((5, 32)).astype(np.float32), "w"))
    g = b.build(b.op("softmax", d, axis=1))
    module = build(g, db=db_url, int8=True, tuned=False, jobs=1)
    res = verify_int8(g, module=module)
    assert res.ok, res.steps
    quant = [s for s in module.steps if "quantize" in s.label]
    assert quant and all(s.source != "numpy" for s in quant), [(s.label, s.note) for s in module.steps]


def test_max_pool_between_int8_and_fp32_is_generated(db_url):
    """max pooling fused with the dequantize (8-bit pool feeding an FP32 op) or with the
    quantize (an FP32 pool feeding a quantized conv) is generated, exactly (Inception's LRN
    neighbours)."""
    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import verify_int8

    rng = np.random.default_rng(1)
    b = GraphBuilder("pools")
    x = b.input("x", (1, 3, 9, 9))
    w1 = b.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    h = b.op("relu", b.op("conv2d", x, w1, padding=(1,) * 4), name="r1")
    p = b.op("max_pool2d", h, pool_size=(3, 3), strides=(2, 2), padding=(1,) * 4, name="p1")
    n = b.op("lrn", p, size=3, name="norm")                  # FP32: dequantize before it
    p2 = b.op("max_pool2d", n, pool_size=(2, 2), strides=(1, 1), name="p2")   # then quantize
    w2 = b.const(rng.standard_normal((5, 4, 1, 1)).astype(np.float32) * 0.3, "w2")
    y = b.op("conv2d", p2, w2, name="c2")
    g = b.build(b.op("softmax", b.op("flatten", y), axis=1))
    module = build(g, db=db_url, int8=True, tuned=False, jobs=1)
    res = verify_int8(g, module=module)
    assert res.ok, [s for s in res.steps if s.mismatches]
    labels = {s.label: s.source for s in module.steps}
    pools = {k: v for k, v in labels.items() if k.startswith("max_pool2d")}
    assert any("dequantize" in k for k in pools) and any("quantize" in k and "de" not in k
                                                         for k in pools), labels
    assert "numpy" not in pools.values(), [(s.label, s.note) for s in module.steps]
