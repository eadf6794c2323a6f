"""depthwise_conv2d template: the direct vector kernel against the group reference (strides
1 and 2, channel multiplier, padding, edges of the row/column blocks, epilogues with per-channel,
full and non-vector operands), invalid configs refused, sources printable."""
from __future__ import annotations

import numpy as np
import pytest

from search_spaces import get_template, isa
from search_spaces.templates.features import feature_function
from tuner.dispatch import load_kernel
from workloads.errors import InstantiationError
from workloads.fused import workload_for_group
from workloads.graph import GraphBuilder
from workloads.graph.fusion import fused_groups
from workloads.graph.passes import optimize


def dw_workload(C, H, W, mult=1, k=3, s=1, pad=1, epilogue="residual", level=2, dil=1):
    b = GraphBuilder("g")
    x = b.input("x", (1, C, H, W))
    rng = np.random.default_rng(3)
    w = b.const(rng.standard_normal((C * mult, 1, k, k)).astype(np.float32))
    bias = b.const(rng.standard_normal((C * mult, 1, 1)).astype(np.float32))
    y = b.op("add", b.op("conv2d", x, w, strides=[s, s], padding=[pad, pad], groups=C,
                         dilation=[dil, dil]), bias)
    if epilogue == "residual":
        y = b.op("relu", b.op("add", y, b.input("r", b.type_of(y).shape)))
    elif epilogue == "sigmoid":
        y = b.op("sigmoid", y)
    g = optimize(b.build(y), opt_level=level)
    (w,) = [w for w in map(workload_for_group, fused_groups(g)) if w.anchor == "conv2d"]
    return w


def check(w, cfg):
    fn = load_kernel(w, get_template("depthwise_conv2d"), cfg)
    x, out = w.make_inputs(), w.make_outputs()
    out[0][...] = np.nan   # every element must be written
    fn(*x, *out)
    return w.check(x, out, w.reference(x))


CASES = {
    "shufflenet-like": (8, 9, 11, 1, 3, 1, 1, "residual"),   # partial last vector
    "stride2": (6, 14, 14, 1, 3, 2, 1, "bias"),              # masked vector edge stores
    "multiplier": (5, 7, 7, 2, 3, 1, 1, "residual"),         # 2 outputs per plane, 7-wide rows
    "5x5-sigmoid": (4, 12, 21, 1, 5, 2, 2, "sigmoid"),       # no vector form of the epilogue
    "unpadded": (3, 8, 9, 1, 3, 1, 0, "bias"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_default_and_one_other_config(case):
    """The default and a config with other vectors, rows and threads (each compile is slow:
    the sweep over the space is the slow test below)."""
    t = get_template("depthwise_conv2d")
    w = dw_workload(*CASES[case])
    assert w.kind == "depthwise_conv2d"
    sp = t.space(w, 2)
    d = t.default_config(w, 2)
    assert sp.is_valid(d)
    assert check(w, d) is None
    other = d.replace(vec=sp.knob("vec").values[0], unroll=1, rows=3,
                      threads=1 if d["threads"] == 2 else 2)
    assert sp.is_valid(other), sp.violation(other)
    assert check(w, other) is None, other


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_config_sweep(case):
    t = get_template("depthwise_conv2d")
    w = dw_workload(*CASES[case])
    sp = t.space(w, 2)
    d = t.default_config(w, 2)
    tried = 0
    for vec in sp.knob("vec").values:
        for unroll in (1, 2, 3):
            for rows in (1, 2, 4):
                cfg = d.replace(vec=vec, unroll=unroll, rows=rows, threads=1 + (rows == 4))
                if sp.is_valid(cfg):
                    tried += 1
                    assert check(w, cfg) is None, cfg
    assert tried >= 3


def test_dilated_depthwise_conv():
    w = dw_workload(4, 11, 13, k=3, pad=2, dil=2)
    t = get_template("depthwise_conv2d")
    assert check(w, t.default_config(w, 1)) is None


def test_invalid_configs_are_refused():
    t = get_template("depthwise_conv2d")
    w = dw_workload(4, 7, 7)
    sp = t.space(w, 2)
    L = isa.current().fp32_lanes
    assert sp.violation({"vec": L, "unroll": 2, "rows": 1, "threads": 1}).startswith("covers")
    assert sp.violation({"vec": L // 2, "unroll": 1, "rows": 1, "threads": 2}) is None
    big = {"vec": L // 2, "unroll": 4, "rows": 4, "threads": 1}
    w2 = dw_workload(4, 40, 40)
    if 16 + 2 > isa.current().registers:
        assert t.space(w2, 1).violation(big).startswith("registers")
    with pytest.raises(Exception):
        t.codegen(w, t.default_config(w, 1).replace(rows=99))


def test_source_is_printable_and_vectorised():
    t = get_template("depthwise_conv2d")
    w = dw_workload(8, 9, 11)
    cfg = t.default_config(w, 2).replace(threads=2)
    src = t.codegen(w, cfg)
    compile(src, "<depthwise>", "exec")
    assert "vfma(wv, vload(P," in src and "prange(THREADS)" in src
    assert "relu" in src and "vstore(Cf" in src
    s2 = t.codegen(dw_workload(8, 9, 11, s=2), t.default_config(dw_workload(8, 9, 11, s=2), 1))
    assert "vload_s2(P," in s2 and "prange(" not in s2


def test_default_threads_only_for_large_convs():
    t = get_template("depthwise_conv2d")
    assert t.default_config(dw_workload(8, 9, 11), 2)["threads"] == 1
    assert t.default_config(dw_workload(64, 64, 64), 2)["threads"] == 2
    assert t.default_config(dw_workload(64, 64, 64), 1)["threads"] == 1


def test_unsupported_depthwise_shapes_raise():
    t = get_template("depthwise_conv2d")
    w = dw_workload(4, 10, 10, k=1, s=3, pad=0)
    with pytest.raises(InstantiationError, match="stride 3"):
        t.space(w, 1)
    nhwc = dw_workload(4, 9, 9, level=3)
    if nhwc.geometry["data_layout"] != "NCHW":
        with pytest.raises(InstantiationError, match="NCHW/OIHW"):
            t.space(nhwc, 1)


def test_wrong_kernel_is_caught():
    """The check is not vacuous: a kernel that drops the residual fails it."""
    t = get_template("depthwise_conv2d")
    w = dw_workload(4, 8, 9)
    x, out = w.make_inputs(), w.make_outputs()
    x[-1][...] = 0
    load_kernel(w, t, t.default_config(w, 1))(*x, *out)
    xs = w.make_inputs()
    assert w.check(xs, out, w.reference(xs)) is not None


def test_domain_features():
    t = get_template("depthwise_conv2d")
    w = dw_workload(8, 14, 14)
    fn = feature_function("depthwise_conv2d")
    f = fn(w.params(), dict(t.default_config(w, 2).replace(threads=2)))
    assert f["dw_window"] == 9 and 0 < f["dw_col_efficiency"] <= 1 and f["dw_threads"] == 2


def test_show_prints_a_fused_groups_source_from_its_key():
    import subprocess
    import sys
    from pathlib import Path

    w = dw_workload(8, 9, 11)
    root = Path(__file__).resolve().parent.parent

    def show(*args):
        return subprocess.run([sys.executable, "-m", "tuner", "show", *args], capture_output=True,
                              text=True, cwd=root, timeout=300)
    r = show(w.key, "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "def plane(" in r.stdout and r.stdout.startswith("# default config:")
    r = show(w.key, "--space")
    assert r.returncode == 0 and "unroll" in r.stdout and "constraint: registers" in r.stdout
    bad = show("depthwise_conv2d:{\"bad")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr
    assert show(w.key, "--shape", "1x2x3").returncode == 2
