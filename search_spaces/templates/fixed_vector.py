"""Vector forms of fixed-template kernels (no epilogue): max pooling and LRN.

**Max pooling** (NCHW, horizontal stride 1 or 2).

Each (n, c) plane is first copied into a scratch plane bordered with -inf, as large as every
window needs (padding and ceil mode included), so the window loops have no bounds tests;
then each output row is computed VEC outputs at a time: for every window offset (kh, kw) one
vector of inputs (``vload_n`` for stride 1, the even lanes of two loads, ``vload_s2``, for
stride 2) and one ``vmax``; ``vstore_n`` writes the row's last, partial vector. The scalar
form of ``search_spaces.templates.fixed`` did one compare-and-branch per window element (~36 cycles
per output on ResNet-50's 3x3/2 pool).

**LRN** across the channels of a contiguous inner block (NCHW, axis 1), with beta 0.5, 0.75
or 1 (powers made of ``vsqrt``; other betas stay scalar): VEC positions at a time, the
window's sum of squares by FMAs, one division. The scalar form summed in float64 and called
``pow`` per element (Inception v1's two LRNs: 15.6 ms of 48 ms).
"""
from __future__ import annotations

import math

VEC_NAMES = ("vfma", "vload_n", "vload_s2", "vsplat", "vsqrt", "vstore_n")


def max_pool_vector(a: dict) -> bool:
    """Whether the vector form applies: NCHW, horizontal stride 1 or 2, no dilation."""
    return (a["layout"] == "NCHW" and a["strides"][1] in (1, 2)
            and tuple(a.get("dilation", (1, 1))) == (1, 1))


def max_pool_nchw_vector(a: dict, xs: tuple, os: tuple, vec: int) -> list[str]:
    n_, c_, h, w = xs
    oh_, ow_ = os[2], os[3]
    (kh, kw), (sh, sw) = a["pool_size"], a["strides"]
    pt, pl, pb, pr = a["padding"]
    ph = max(h + pt + pb, (oh_ - 1) * sh + kh)   # padded plane, every window inside it
    pw = max(w + pl + pr, (ow_ - 1) * sw + kw)
    load = "vload_n(P, r + {kw}, cnt, VEC)" if sw == 1 else "vload_s2(P, r + {kw}, cnt, VEC)"
    return [
        f"VEC = {vec}",
        "Xf = X.reshape(-1)",
        f"P = np.full({ph * pw}, -np.inf, DTYPE)   # one plane, -inf around the image",
        f"for nc in range({n_ * c_}):",
        f"    src = nc * {h * w}",
        f"    for ih in range({h}):",
        f"        dst = (ih + {pt}) * {pw} + {pl}",
        "        u = 0",
        f"        while u < {w}:",
        f"            vstore_n(P, dst + u, vload_n(Xf, src + ih * {w} + u, {w} - u, VEC), {w} - u)",
        "            u += VEC",
        f"    obase = nc * {oh_ * ow_}",
        f"    for oh in range({oh_}):",
        f"        for ow0 in range(0, {ow_}, VEC):",
        f"            cnt = min(VEC, {ow_} - ow0)",
        "            acc = vsplat(DTYPE(-np.inf), VEC)",
        f"            for kh in range({kh}):",
        f"                r = (oh * {sh} + kh) * {pw} + ow0 * {sw}",
    ] + [f"                acc = vmax(acc, {load.format(kw=k)})" for k in range(kw)] + [
        f"            vstore_n(Cf, obase + oh * {ow_} + ow0, acc, cnt)",
    ]


LRN_POWERS = {0.5: "vsqrt(d)", 0.75: "vmul(vsqrt(d), vsqrt(vsqrt(d)))", 1.0: "d"}


def lrn_vector(a: dict, xs: tuple) -> bool:
    return float(a["beta"]) in LRN_POWERS and len(xs) >= 2 and a["axis"] % len(xs) == 1


def lrn_vector_source(a: dict, xs: tuple, vec: int) -> list[str]:
    ax = a["axis"] % len(xs)
    outer, L, inner = math.prod(xs[:ax]), xs[ax], math.prod(xs[ax + 1:])
    size = a["size"]
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    return [
        f"VEC = {vec}",
        "Xf = X.reshape(-1)",
        f"scale = vsplat(DTYPE({a['alpha'] / size!r}), VEC)",
        f"bias = vsplat(DTYPE({a['bias']!r}), VEC)",
        f"for o in range({outer}):",
        f"    base = o * {L * inner}",
        f"    for t in range({L}):",
        f"        for i in range(0, {inner}, VEC):",
        f"            cnt = min(VEC, {inner} - i)",
        "            s = vsplat(ZERO, VEC)",
        f"            for u in range(max(0, t - {lo}), min({L}, t + {hi} + 1)):",
        f"                xv = vload_n(Xf, base + u * {inner} + i, cnt, VEC)",
        "                s = vfma(xv, xv, s)",
        "            d = vfma(s, scale, bias)",
        f"            f = base + t * {inner} + i",
        f"            vstore_n(Cf, f, vdiv(vload_n(Xf, f, cnt, VEC), {LRN_POWERS[float(a['beta'])]}), cnt)",
    ]
