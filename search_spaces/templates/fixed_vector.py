"""Vector forms of fixed-template kernels (no epilogue): pooling and LRN.

**Pooling** (NCHW; max and average with horizontal stride 1 or 2, global average): the
(n, c) planes split into contiguous ranges across the kernel's threads (``prange``), each
with its own scratch plane. Max/average: each plane is first copied into a scratch plane
bordered with -inf (max) or 0 (average), as large as every window needs, so the window loops
have no bounds tests; then each output row is computed VEC outputs at a time (``pool_nchw_vector``).
The scalar forms of ``search_spaces.templates.fixed`` did one compare-and-branch per window
element (~36 cycles per output on ResNet-50's 3x3/2 pool); ShuffleNet's 3x3/2 average pools
and its 7x7 global one took 0.6 ms of a 6.7 ms model (Zen 3, 1 thread) before the vector form.

**8-bit max pooling** (uint8/int8, NCHW, horizontal stride 1 or 2; also followed by a
dequantize): the same plane split and bordered scratch plane, ``vector_bits / 8`` lanes (32
on AVX2) per ``vmax`` (``vpmaxub``/``vpmaxsb``), whole-vector loads and stores only (AVX2 has
no masked byte load: LLVM would scalarize ``vload_n``) — ``pool8_nchw_vector``. The scalar form
was the largest kernel of ResNet-50 INT8 at 2 threads (~6%; 2.8 ms CPU for its 64 x 112 x 112
3x3/2 pool, 0.07 ms in vector form).

**LRN** across the channels of a contiguous inner block (NCHW, axis 1), with beta 0.5, 0.75
or 1 (powers made of ``vsqrt``; other betas stay scalar): VEC positions at a time, the
window's sum of squares by FMAs, one division. The scalar form summed in float64 and called
``pow`` per element (Inception v1's two LRNs: 15.6 ms of 48 ms).
"""
from __future__ import annotations

import math

VEC_NAMES = ("vadd", "vfma", "vload", "vload_even", "vload_n", "vload_s2", "vsplat", "vsqrt",
             "vstore", "vstore_n")


def pool_vector(op: str, a: dict) -> bool:
    """Whether the vector form applies: NCHW, horizontal stride 1 or 2, no dilation (max and
    average pooling), or a global average pool of NCHW planes."""
    if op == "global_avg_pool2d":
        return a["layout"] == "NCHW"
    return (a["layout"] == "NCHW" and a["strides"][1] in (1, 2)
            and tuple(a.get("dilation", (1, 1))) == (1, 1))


def max_pool_vector(a: dict) -> bool:
    return pool_vector("max_pool2d", a)


def pool_nhwc_vector_applies(op: str, a: dict) -> bool:
    """NHWC max and average pooling (any stride, no dilation): ``pool_nhwc_vector``."""
    return (op in ("max_pool2d", "avg_pool2d") and a["layout"] == "NHWC"
            and tuple(a.get("dilation", (1, 1))) == (1, 1))


def pool_nhwc_vector(op: str, a: dict, xs: tuple, os: tuple, vec: int, threads: int = 1) -> list[str]:
    """NHWC max and average pooling, VEC channels at a time, the output rows split across
    ``threads`` (``prange``).

    Per output pixel the window's bounds once (padding: the rows and columns inside the
    image); per VEC channels one accumulator folded over the window's taps, each tap one
    contiguous load of channels and one ``vmax`` (x > acc ? x : acc, the reference's
    compare) or ``vadd``. Channels a multiple of VEC: up to ``CHANNEL_VECTORS`` accumulators
    side by side, plain loads; otherwise one, the last, partial vector masked (``vload_n``).
    An average divides by the window's count (``count_include_pad`` or the taps inside the
    image). LLVM's own vectorization of the scalar loops was fragile: SqueezeNet's 111 x 111 x 64 3x3/2 max pool
    took 0.06 ms, ShuffleNet's 112 x 112 x 24 padded one 0.58-0.82 ms (no ``vmaxps``)."""
    n_, h, w, c_ = xs
    oh_, ow_ = os[1], os[2]
    (kh, kw), (sh, sw) = a["pool_size"], a["strides"]
    pt, pl = a["padding"][:2]
    is_max = op == "max_pool2d"
    fill, combine = ("-np.inf", "vmax") if is_max else ("0", "vadd")
    lines = [f"VEC = {vec}", "Xf = X.reshape(-1)",
             f"for r in {'prange' if threads > 1 else 'range'}({n_ * oh_}):",
             f"    n = r // {oh_}",
             f"    oh = r - n * {oh_}",
             f"    h0 = oh * {sh} - {pt}",
             f"    ha, h1 = max(h0, 0), min(h0 + {kh}, {h})",
             f"    for ow in range({ow_}):",
             f"        w0 = ow * {sw} - {pl}",
             f"        wa, w1 = max(w0, 0), min(w0 + {kw}, {w})"]
    if not is_max:
        lines.append(f"        div = vsplat(DTYPE({window_count(a, h, w)}), VEC)")
    lines.append(f"        ob = (r * {ow_} + ow) * {c_}")
    u = next((u for u in CHANNEL_VECTORS if c_ % (u * vec) == 0), 0)
    accs = [f"acc{i}" for i in range(max(u, 1))]
    if u:   # whole vectors: u accumulators side by side, plain loads and stores
        mask, load = [], [f"vload(Xf, q + {i * vec}, VEC)" for i in range(u)]
        store = [f"vstore(Cf, ob + c0 + {i * vec}, {a})" for i, a in enumerate(accs)]
    else:   # one accumulator, the last, partial vector of channels masked
        mask, load = [f"            m = min(VEC, {c_} - c0)"], ["vload_n(Xf, q, m, VEC)"]
        store = ["vstore_n(Cf, ob + c0, acc0, m)"]
    lines += [f"        for c0 in range(0, {c_}, {len(accs) * vec}):", *mask,
              *(f"            {a} = vsplat(DTYPE({fill}), VEC)" for a in accs),
              "            for ih in range(ha, h1):",
              "                for iw in range(wa, w1):",
              f"                    q = ((n * {h} + ih) * {w} + iw) * {c_} + c0",
              *(f"                    {a} = {combine}({x}, {a})" for a, x in zip(accs, load))]
    if not is_max:
        lines += [f"            {a} = vdiv({a}, div)" for a in accs]
    lines += [f"            {st}" for st in store]
    return lines


# Channel vectors one NHWC pool step folds side by side when they divide the channels: one
# accumulator per 16 channels left each window's taps a chain of dependent max/adds and
# masked loads (Inception v2's 56 x 56 x 192 3x3/2 max pool: 0.068 ms, 0.056 with four).
CHANNEL_VECTORS = (4, 2, 1)


def split_loop(threads: int, scratch: list[str], total: str = "NC", var: str = "nc",
               thread: str = "t") -> list[str]:
    """The loop ``for var in range(total)`` (default: the (n, c) planes), split into
    ``threads`` contiguous ranges (``prange`` over ``thread``); ``scratch`` lines allocate
    each range's private buffers. The body goes 8 spaces in."""
    return [f"THREADS = {threads}",
            f"per = ({total} + THREADS - 1) // THREADS",
            f"for {thread} in {'prange' if threads > 1 else 'range'}(THREADS):",
            *("    " + ln for ln in scratch),
            f"    for {var} in range({thread} * per, min({total}, ({thread} + 1) * per)):"]


def window_count(a: dict, h: int, w: int) -> str:
    """An average pool's divisor for output pixel (oh, ow) whose window starts at (h0, w0)
    (negative: padding), at least 1: every tap inside the padded image
    (``count_include_pad``) or the taps inside the h x w image."""
    (kh, kw), (_, _, pb, pr) = a["pool_size"], a["padding"]
    if a["count_include_pad"]:
        cnt = f"(min(h0 + {kh}, {h + pb}) - h0) * (min(w0 + {kw}, {w + pr}) - w0)"
    else:
        cnt = f"(min(h0 + {kh}, {h}) - max(h0, 0)) * (min(w0 + {kw}, {w}) - max(w0, 0))"
    return f"max({cnt}, 1)"


def _whole_plane(op: str, a: dict, xs: tuple, os: tuple) -> bool:
    """An average pool whose one window is the whole unpadded plane (a global average)."""
    if op == "global_avg_pool2d":
        return True
    return (op == "avg_pool2d" and tuple(os[2:]) == (1, 1) and tuple(a["pool_size"]) == tuple(xs[2:])
            and not any(a["padding"]))


def pool_nchw_vector(op: str, a: dict, xs: tuple, os: tuple, vec: int, threads: int = 1,
                     convert: str | None = None) -> list[str]:
    """NCHW pooling, VEC outputs at a time, the planes split across ``threads``.

    Max and average pooling: each plane is copied into a scratch plane bordered with -inf
    (max) or 0 (average), as large as every window needs (padding and ceil mode included), so
    the window loops have no bounds tests; each output row is then VEC outputs at a time: per
    window offset one vector of inputs (``vload_n`` for stride 1, the even lanes of two loads,
    ``vload_s2``, for stride 2) and one ``vmax`` / ``vadd``; an average divides by the window's
    count (``count_include_pad`` or the taps inside the image), computed once per call into a
    plane of counts. A global average sums each contiguous plane VEC lanes at a time.

    ``convert`` (max pooling only): the scalar expression of ``T[i]`` storing a pooled value
    (a quantize to 8 bits); the plane and vectors are then ``IN_DTYPE`` (the input's float
    type), each output vector goes through the buffer ``T`` and is converted element by
    element."""
    n_, c_, h, w = xs
    if _whole_plane(op, a, xs, os):
        hw = h * w
        return [f"VEC, NC, HW = {vec}, {n_ * c_}, {hw}",
                "Xf = X.reshape(-1)"] + split_loop(threads, ["T = np.empty(VEC, DTYPE)"]) + [
            "        base = nc * HW",
            "        acc = vsplat(ZERO, VEC)",
            "        u = 0",
            "        while u + VEC <= HW:",
            "            acc = vadd(acc, vload(Xf, base + u, VEC))",
            "            u += VEC",
            "        vstore(T, 0, acc)",
            "        s = ZERO",
            "        for i in range(VEC):",
            "            s += T[i]",
            "        for i in range(u, HW):",
            "            s += Xf[base + i]",
            "        Cf[nc] = DTYPE(s / HW)"]
    oh_, ow_ = os[2], os[3]
    (kh, kw), (sh, sw) = a["pool_size"], a["strides"]
    pt, pl, pb, pr = a["padding"]
    ph = max(h + pt + pb, (oh_ - 1) * sh + kh)   # padded plane, every window inside it
    pw = max(w + pl + pr, (ow_ - 1) * sw + kw)
    load = "vload_n(P, r + {kw}, cnt, VEC)" if sw == 1 else "vload_s2(P, r + {kw}, cnt, VEC)"
    is_max = op == "max_pool2d"
    fill, combine = ("-np.inf", "vmax") if is_max else ("0", "vadd")
    lines = [f"VEC, NC = {vec}, {n_ * c_}", "Xf = X.reshape(-1)"]
    if not is_max:
        lines += [f"CNT = np.empty({oh_ * ow_}, DTYPE)   # the count each window divides by",
                  f"for oh in range({oh_}):",
                  f"    h0 = oh * {sh} - {pt}",
                  f"    for ow in range({ow_}):",
                  f"        w0 = ow * {sw} - {pl}",
                  f"        CNT[oh * {ow_} + ow] = DTYPE({window_count(a, h, w)})"]
    ty = "DTYPE"
    scratch = [f"P = np.full({ph * pw}, {fill}, DTYPE)   # one plane, {fill} around the image"]
    if convert is not None:
        if not is_max:
            raise ValueError("a converted vector pool is generated for max pooling only")
        ty = "IN_DTYPE"
        scratch = [scratch[0].replace("DTYPE)", "IN_DTYPE)"), "T = np.empty(VEC, IN_DTYPE)"]
    lines += split_loop(threads, scratch)
    body = [
        f"src = nc * {h * w}",
        f"for ih in range({h}):",
        f"    dst = (ih + {pt}) * {pw} + {pl}",
        "    u = 0",
        f"    while u < {w}:",
        f"        vstore_n(P, dst + u, vload_n(Xf, src + ih * {w} + u, {w} - u, VEC), {w} - u)",
        "        u += VEC",
        f"obase = nc * {oh_ * ow_}",
        f"for oh in range({oh_}):",
        f"    for ow0 in range(0, {ow_}, VEC):",
        f"        cnt = min(VEC, {ow_} - ow0)",
        f"        acc = vsplat({ty}({fill}), VEC)",
        f"        for kh in range({kh}):",
        f"            r = (oh * {sh} + kh) * {pw} + ow0 * {sw}",
    ] + [f"            acc = {combine}(acc, {load.format(kw=k)})" for k in range(kw)]
    if not is_max:
        body.append(f"        acc = vdiv(acc, vload_n(CNT, oh * {ow_} + ow0, cnt, VEC))")
    if convert is None:
        body.append(f"        vstore_n(Cf, obase + oh * {ow_} + ow0, acc, cnt)")
    else:
        body += ["        vstore(T, 0, acc)",
                 "        for i in range(cnt):",
                 f"            Cf[obase + oh * {ow_} + ow0 + i] = {convert}"]
    return lines + ["        " + ln for ln in body]


def pool8_nchw_vector(a: dict, xs: tuple, os: tuple, vec: int, threads: int = 1,
                      convert: str | None = None) -> list[str]:
    """NCHW max pooling of 8-bit values (uint8 or int8, the kernel's ``LOWEST`` and
    ``IN_DTYPE``), ``vec`` lanes (32 on AVX2) per instruction, the planes split across
    ``threads`` as in ``pool_nchw_vector``.

    AVX2 has no masked load or store of bytes (LLVM would scalarize ``vload_n``), so every
    load and store here is a whole vector: the scratch plane, bordered with LOWEST (the
    reference's padding), carries ``2 * vec + kw`` elements of slack after its last row, so a
    vector read past a row's end stays inside it (those lanes are never stored); the input
    rows are copied in whole vectors, the last one ending at the row's end (overlapping the
    one before); each output row is computed ``vec`` outputs at a time, the last vector
    ending at the row's end (max is idempotent: overlapping outputs are computed twice,
    equal). Per window offset one ``vload`` (stride 1) or ``vload_even`` (stride 2) and one
    ``vmax`` (``vpmaxub``/``vpmaxsb``). Rows narrower than ``vec``, and a following
    dequantize (``convert``: the scalar expression of ``T[i]``), go through a ``vec``-element
    buffer ``T``."""
    n_, c_, h, w = xs
    oh_, ow_ = os[2], os[3]
    (kh, kw), (sh, sw) = a["pool_size"], a["strides"]
    pt, pl, pb, pr = a["padding"]
    ph = max(h + pt + pb, (oh_ - 1) * sh + kh)
    pw = max(w + pl + pr, (ow_ - 1) * sw + kw)
    load = "vload(P, r + {k}, VEC)" if sw == 1 else "vload_even(P, r + {k}, VEC)"
    via_t = convert is not None or ow_ < vec
    scratch = [f"P = np.full({ph * pw + 2 * vec + kw}, LOWEST, IN_DTYPE)   # one plane, LOWEST "
               "around the image, slack after it"]
    if via_t:
        scratch.append("T = np.empty(VEC, IN_DTYPE)")
    lines = [f"VEC, NC = {vec}, {n_ * c_}", "Xf = X.reshape(-1)"] + split_loop(threads, scratch)
    body = [f"src = nc * {h * w}",
            f"for ih in range({h}):",
            f"    dst = (ih + {pt}) * {pw} + {pl}",
            f"    s0 = src + ih * {w}"]
    if w >= vec:
        body += [f"    for u in range(0, {w - vec + 1}, VEC):",
                 "        vstore(P, dst + u, vload(Xf, s0 + u, VEC))"]
        if w % vec:
            body.append(f"    vstore(P, dst + {w - vec}, vload(Xf, s0 + {w - vec}, VEC))   # the row's end")
    else:
        body += [f"    for u in range({w}):",
                 "        P[dst + u] = Xf[s0 + u]"]
    body += [f"obase = nc * {oh_ * ow_}",
             f"for oh in range({oh_}):",
             f"    for jv in range({-(-ow_ // vec)}):",
             f"        ow0 = min(jv * VEC, {max(ow_ - vec, 0)})   # the last vector ends at the row's end",
             "        acc = vsplat(LOWEST, VEC)",
             f"        for kh in range({kh}):",
             f"            r = (oh * {sh} + kh) * {pw} + ow0 * {sw}"]
    body += [f"            acc = vmax(acc, {load.format(k=k)})" for k in range(kw)]
    o = f"obase + oh * {ow_} + ow0"
    if via_t:
        body += ["        vstore(T, 0, acc)",
                 f"        for i in range(min(VEC, {ow_} - ow0)):",
                 f"            Cf[{o} + i] = {convert or 'T[i]'}"]
    else:
        body.append(f"        vstore(Cf, {o}, acc)")
    return lines + ["        " + ln for ln in body]


LRN_POWERS = {0.5: "vsqrt(d)", 0.75: "vmul(vsqrt(d), vsqrt(vsqrt(d)))", 1.0: "d"}


def lrn_vector(a: dict, xs: tuple) -> bool:
    """The vector LRN applies: beta 0.5, 0.75 or 1, across axis 1 (NCHW channels) or across
    the last axis (NHWC channels)."""
    return float(a["beta"]) in LRN_POWERS and len(xs) >= 2 and a["axis"] % len(xs) in (1, len(xs) - 1)


def lrn_last_axis_vector_source(a: dict, xs: tuple, vec: int, threads: int = 1) -> list[str]:
    """LRN across the contiguous last axis (NHWC channels), VEC channels at a time, the rows
    split across ``threads`` (each with its own row of squares): per row the squares into a
    zero-bordered row (``lo`` zeros before, ``size + VEC`` after, so every window read is a
    whole vector), then per VEC channels the window's sum as ``size`` shifted loads, one FMA
    for bias + alpha/size * sum, the power by square roots and one division. The scalar form
    (``FixedTemplate._lrn_last_axis``, kept for epilogues and other betas) took 3.8 ms for
    ZFNet-512's first LRN (110 x 110 x 96) at 1 thread against 0.84 ms for the NCHW vector
    form."""
    outer, L = math.prod(xs[:-1]), xs[-1]
    size = a["size"]
    lo = (size - 1) // 2
    window = "vadd(" * (size - 1) + "vload(sq, t + 0, VEC)" + "".join(
        f", vload(sq, t + {j}, VEC))" for j in range(1, size))
    return [
        f"VEC = {vec}",
        "Xf = X.reshape(-1)",
        f"scale = vsplat(DTYPE({a['alpha'] / size!r}), VEC)",
        f"bias = vsplat(DTYPE({a['bias']!r}), VEC)",
    ] + split_loop(threads, [f"sq = np.zeros({L + size + vec}, DTYPE)   # squares of one row, zero past its ends"],
                   str(outer), "o", "th") + [
        f"        base = o * {L}",
        f"        for t in range(0, {L}, VEC):",
        f"            x = vload_n(Xf, base + t, {L} - t, VEC)",
        f"            vstore_n(sq, t + {lo}, vmul(x, x), {L} - t)",
        f"        for t in range(0, {L}, VEC):",
        f"            cnt = min(VEC, {L} - t)",
        f"            d = vfma({window}, scale, bias)",
        f"            vstore_n(Cf, base + t, vdiv(vload_n(Xf, base + t, cnt, VEC), {LRN_POWERS[float(a['beta'])]}), cnt)",
    ]


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
