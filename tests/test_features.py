"""Cost-model domain features: what the knobs mean for the workload (GEMM and conv2d)."""
from __future__ import annotations

import math
import random

from search_spaces import get_template
from search_spaces.templates.conv2d import conv2d_features
from search_spaces.templates.features import bind, feature_function, gemm_features
from test_conv2d_template import conv_workload
from workloads.gemm import Gemm


def test_gemm_features_see_the_shape_behind_a_tile():
    # the same 256-wide tile is the whole matrix for 256^3 and one cache block for 1024^3
    cfg = dict(get_template("gemm").default_config(Gemm.parse("1024x1024x1024"), 1))
    cfg["tile_n"] = 256
    small = gemm_features({"M": 256, "N": 256, "K": 256}, cfg)
    big = gemm_features({"M": 1024, "N": 1024, "K": 1024}, cfg)
    assert small["tile_n_frac"] == 1.0 and big["tile_n_frac"] == 0.25
    assert small["w_log_flops"] < big["w_log_flops"]


def test_conv2d_features_are_those_of_its_implicit_gemm_plus_the_window():
    t = get_template("conv2d")
    assert feature_function("conv2d") == t.domain_features    # the template names its features
    assert feature_function("injective") is None              # knob encoding only
    w3 = conv_workload(16, 14, 32, 3, 2, 2)        # 3x3 stride 2, NCHW: B is im2col(x)
    w1 = conv_workload(16, 14, 32, 1, 1, 2, pad=0)  # pointwise: the image is B in place
    for w, window, pointwise in ((w3, 9.0, 0.0), (w1, 1.0, 1.0)):
        plan = t.plan(w)
        feats = bind("conv2d", w.params())
        cfgs = [t.default_config(w, 2)] + [t.space(w, 2).sample(random.Random(s)) for s in range(20)]
        rows = [feats(c) for c in cfgs]
        assert all(len(r) == len(rows[0]) and all(math.isfinite(v) for v in r.values()) for r in rows)
        f = rows[0]
        assert f["conv_window"] == window and f["conv_pointwise"] == pointwise
        assert f["w_log_m"] == math.log2(plan["M"]) and f["w_log_k"] == math.log2(plan["K"])
        # configs differ in their features, not only in their knob values
        assert len({tuple(sorted(r.items())) for r in rows}) > 10
    assert bind("conv2d", w3.params())(t.default_config(w3, 1))["conv_im2col_expansion"] > 0
