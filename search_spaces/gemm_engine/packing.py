"""Packing functions of the engine: copies of an operand block into the micro-kernel's panels
(the GEMM template's and the dense/conv2d core's, ``search_spaces.gemm_engine.core``), the
implicit im2col of an image, and the aligned packing buffers.

A panels: ``Ap[q*kc*MR + p*MR + r] = A[i0 + q*MR + r, p0 + p]`` (MR rows interleaved);
B panels: ``Bp[q*kc*NR + p*NR + c] = B[p0 + p, j0 + q*NR + c]`` (NR columns per step), with
rows/columns past the block's edge zero, so the micro-kernel always computes a full tile.
Copies are spelled with ``search_spaces.runtime.simd`` vectors where the layout allows (the loop
vectoriser cannot prove the source and the panel buffer apart, and leaves scalar copies).
"""
from __future__ import annotations


# What every generated function but the module's entry is compiled with: it is only ever
# called from the module's compiled code (linked into its caller), so it needs neither the
# Python and C wrappers Numba builds for a function called from Python nor an entry of its
# own in Numba's on-disk cache (the entry's cached machine code holds it). ResNet-50's
# 2-thread conv modules, in-process compile, CPU time, load ~8 (indicative): 7.5-8.2 s ->
# 6.3-7.1 s per module (docs/compile-once.md).
HELPER_JIT = "no_cpython_wrapper=True, no_cfunc_wrapper=True"


def _jit() -> str:
    return f"@numba.njit({HELPER_JIT})"


def _geo(dims) -> str:
    """The ``geo`` parameter, when the module has argument dimensions (``core.Dims``)."""
    return ", geo" if dims.runtime else ""


def empty_aligned_source() -> list[str]:
    """empty_aligned(size): a packing buffer starting on a 64-byte boundary (whole-line vector
    loads of the panels; its placement is then the kernel's, not the allocator's)."""
    return [
        _jit(),
        "def empty_aligned(size):",
        '    """np.empty(size, DTYPE) starting on a 64-byte boundary."""',
        "    per_line = 64 // ITEMSIZE",
        "    buf = np.empty(size + per_line, DTYPE)",
        "    off = (per_line - (buf.ctypes.data // ITEMSIZE) % per_line) % per_line",
        "    return buf[off:off + size]",
    ]


def prologue_tail(pro) -> str:
    """``, name, ...`` of a conv prologue's operands (empty without one): the tail of
    ``pack_b``'s parameters and of every call to it."""
    return "".join(", " + n for n in pro.arg_names()) if pro is not None else ""


def pack_a_source(src: str, dims, running_index: bool = False) -> list[str]:
    """``dims``: the module's ``core.Dims`` (the function unpacks the argument dimensions).
    ``running_index``: the 'pack' copy steps a panel index by MR instead of computing
    ``base + p*MR + r`` per element: 25% less time (4096 x 1024 A packed in 96 x 512 blocks,
    MR = 6, Zen 3, 1 thread, load ~15: 3.9 vs 5.2 ms; the GEMM template's v9 3-D panels 4.6 ms).
    The GEMM template uses it; the dense/conv2d core keeps the indexed form until its
    templates' versions are bumped (their recorded configs would be dropped)."""
    head = [_jit(), f"def pack_a(A, a_base, i0, p0, mc, kc, Ap{_geo(dims)}):",
            '    """Ap[q*kc*MR + p*MR + r] = A[i0 + q*MR + r, p0 + p]; rows past mc are zero."""']
    head += ["    " + ln for ln in dims.unpack()]
    if src == "pack" and running_index:
        return head + [
            "    for q in range((mc + MR - 1) // MR):",
            "        base = q * kc * MR",
            "        for r in range(MR):",
            "            i = q * MR + r",
            "            d = base + r   # this row's first element in the panel, then every MR",
            "            if i < mc:",
            "                src = a_base + (i0 + i) * K + p0",
            "                for p in range(kc):",
            "                    Ap[d] = A[src + p]",
            "                    d += MR",
            "            else:",
            "                for p in range(kc):",
            "                    Ap[d] = ZERO",
            "                    d += MR",
        ]
    if src == "pack":
        return head + [
            "    for q in range((mc + MR - 1) // MR):",
            "        base = q * kc * MR",
            "        for r in range(MR):",
            "            i = q * MR + r",
            "            if i < mc:",
            "                src = a_base + (i0 + i) * K + p0",
            "                for p in range(kc):",
            "                    Ap[base + p * MR + r] = A[src + p]",
            "            else:",
            "                for p in range(kc):",
            "                    Ap[base + p * MR + r] = ZERO",
        ]
    assert src == "im2col_nhwc"
    return head + [
        "    # A is the implicit im2col matrix of an NHWC image: row = output pixel (n, oh, ow),",
        "    # column = (kh, kw, ci); runs of consecutive ci are contiguous in the image.",
        "    for q in range((mc + MR - 1) // MR):",
        "        base = q * kc * MR",
        "        for r in range(MR):",
        "            i = q * MR + r",
        "            if i >= mc:",
        "                for p in range(kc):",
        "                    Ap[base + p * MR + r] = ZERO",
        "                continue",
        "            pix = i0 + i",
        "            n = pix // (OH * OW)",
        "            rem = pix - n * (OH * OW)",
        "            oh = rem // OW",
        "            ow = rem - oh * OW",
        "            ih0 = oh * SH - PT",
        "            iw0 = ow * SW - PL",
        "            kk = p0",
        "            while kk < p0 + kc:",
        "                kh = kk // (KW * CI)",
        "                rem2 = kk - kh * (KW * CI)",
        "                kw = rem2 // CI",
        "                ci = rem2 - kw * CI",
        "                run = min(CI - ci, p0 + kc - kk)",
        "                ih = ih0 + kh * DH",
        "                iw = iw0 + kw * DW",
        "                dst = base + (kk - p0) * MR + r",
        "                if 0 <= ih < H and 0 <= iw < W:",
        "                    src = ((n * H + ih) * W + iw) * CI + ci",
        "                    for t in range(run):",
        "                        Ap[dst + t * MR] = A[src + t]",
        "                else:",
        "                    for t in range(run):",
        "                        Ap[dst + t * MR] = ZERO",
        "                kk += run",
    ]


def pack_b_source(src: str, dims, sw: int = 1, nr: int = 16, vec: int = 16, pro=None) -> list[str]:
    """``sw``: the stride class of the im2col copies (1, 2, other); SW itself is a dimension.
    ``pro``: an ``Epilogue`` of per-row (or scalar) operands applied to every element copied
    (``pack`` only), e.g. a pre-activation batch norm + relu on a 1x1 conv's image."""
    extra = prologue_tail(pro)
    head = [_jit(), f"def pack_b(B, b_base, p0, j0, kc, nc, Bp{_geo(dims)}, pa, pb{extra}):",
            '    """Bp[q*kc*NR + p*NR + c] = B[p0 + p, j0 + q*NR + c] for the block\'s rows pa <= p < pb',
            '    (all of them: 0, kc); columns past nc are zero."""']
    head += ["    " + ln for ln in dims.unpack()]
    if pro is not None:
        if src != "pack" or set(pro.operands.values()) - {"row", "scalar"} or not pro.vectorizable():
            raise ValueError("a pack_b prologue needs B 'pack' and per-row vector operands")
        # B row p0 + p is one input channel: its operands are hoisted into vectors per row.
        # Columns past nc get the prologue of zero (finite; their outputs are never stored).
        def copy(load: str, v: int) -> list[str]:
            return ([f"                x = {load}"] + ["                " + ln for ln in pro.apply_vec("x", "0", "0", vec)]
                    + [f"                vstore(Bp, dst + {v}, x)"])
        return head + [
            "    # Vector copies with the prologue applied (one pass over the image instead of two).",
            "    for p in range(pa, pb):",
            "        row = b_base + (p0 + p) * N + j0",
        ] + ["        " + ln for ln in pro.vec_operands("p0 + p", vec)] + [
            "        for q in range((nc + NR - 1) // NR):",
            "            dst = q * kc * NR + p * NR",
            "            j = q * NR",
            "            if j + NR <= nc:",
        ] + [ln for v in range(0, nr, vec) for ln in copy(f"vload(B, row + j + {v}, VEC)", v)] + [
            "            else:",
        ] + [ln for v in range(0, nr, vec) for ln in copy(f"vload_n(B, row + j + {v}, nc - j - {v}, VEC)", v)]
    if src == "pack":
        return head + [
            "    # Vector copies (the loop vectoriser cannot prove B and Bp apart); the last panel's",
            "    # columns past nc are masked loads that read nothing and give zeros.",
            "    for p in range(pa, pb):",
            "        row = b_base + (p0 + p) * N + j0",
            "        for q in range((nc + NR - 1) // NR):",
            "            dst = q * kc * NR + p * NR",
            "            j = q * NR",
            "            if j + NR <= nc:",
        ] + [f"                vstore(Bp, dst + {v}, vload(B, row + j + {v}, VEC))" for v in range(0, nr, vec)] + [
            "            else:",
        ] + [f"                vstore(Bp, dst + {v}, vload_n(B, row + j + {v}, nc - j - {v}, VEC))"
             for v in range(0, nr, vec)]
    if src == "pack_t":
        return head + [
            "    # B = W^T of a row-major [N, K] weight: each panel column is a contiguous W row.",
            "    for q in range((nc + NR - 1) // NR):",
            "        base = q * kc * NR",
            "        for c in range(NR):",
            "            j = q * NR + c",
            "            if j < nc:",
            "                src = b_base + (j0 + j) * K + p0",
            "                for p in range(pa, pb):",
            "                    Bp[base + p * NR + c] = B[src + p]",
            "            else:",
            "                for p in range(pa, pb):",
            "                    Bp[base + p * NR + c] = ZERO",
        ]
    assert src == "im2col_nchw"
    return head + [
        "    # B is the implicit im2col matrix of one NCHW image: row = (ci, kh, kw), column =",
        "    # output pixel (oh, ow). Each of the kc rows is built in ROW, one output-image row",
        "    # segment at a time, in whole vectors: zeros where the window is in the padding, masked",
        "    # vector loads over the interior (even lanes of two loads when SW == 2); a vector that",
        "    # runs past its segment spills zeros the next segment overwrites (ROW has VEC slack).",
        "    # Then ROW goes to the panels NR at a time.",
        "    nq = (nc + NR - 1) // NR",
        "    ROW = np.zeros(nq * NR + VEC, DTYPE)   # columns past nc stay zero",
        "    zero = vsplat(ZERO, VEC)",
        "    oh_first = j0 // OW",
        "    ow_first = j0 - oh_first * OW",
        "    for p in range(pa, pb):",
        "        kk = p0 + p",
        "        ci = kk // (KH * KW)",
        "        rem = kk - ci * (KH * KW)",
        "        kh = rem // KW",
        "        kw = rem - kh * KW",
        "        plane = b_base + ci * (H * W)",
        "        off = kw * DW - PL   # input column of output column ow: ow * SW + off",
        "        lo = max(0, (SW - 1 - off) // SW)   # first ow with ow * SW + off >= 0",
        "        hi = min(OW, (W - off + SW - 1) // SW)   # first ow with ow * SW + off >= W",
        "        t = 0",
        "        oh, ow = oh_first, ow_first",
        "        while t < nc:",
        "            seg = min(OW - ow, nc - t)   # columns of this output row in the block",
        "            end = ow + seg",
        "            ih = oh * SH - PT + kh * DH",
        "            a, b = ow, ow   # interior [a, b): padding before and after",
        "            if 0 <= ih < H:",
        "                a = min(max(lo, ow), end)",
        "                b = max(min(hi, end), a)",
        "            d = t - ow   # ROW index of output column u is d + u",
        "            u = ow",
        "            while u < a:",
        "                vstore(ROW, d + u, zero)",
        "                u += VEC",
        "            src = plane + ih * W + off",
        "            u = a",
    ] + ([
        "            while u < b:",
        "                vstore(ROW, d + u, vload_n(B, src + u, b - u, VEC))",
        "                u += VEC",
    ] if sw == 1 else [
        "            while u < b:",
        "                vstore(ROW, d + u, vload_s2(B, src + u * 2, b - u, VEC))",
        "                u += VEC",
    ] if sw == 2 else [
        "            for x in range(a, b):",
        "                ROW[d + x] = B[src + x * SW]",
    ]) + [
        "            u = b",
        "            while u < end:",
        "                vstore(ROW, d + u, zero)",
        "                u += VEC",
        "            t += seg",
        "            oh += 1",
        "            ow = 0",
        "        for q in range(nq):",
        "            dst = q * kc * NR + p * NR",
    ] + [f"            vstore(Bp, dst + {v}, vload(ROW, q * NR + {v}, VEC))" for v in range(0, nr, vec)]


# Smallest B block (kc x nc elements) whose packing is split across the threads when the
# threads share it (``pack_b_split_lines``). Below it, one parallel region (~3.5 us on two
# Zen 3 cores, OpenMP layer, threads hot) costs about what the split saves.
SPLIT_PACK_MIN = 32768
# Row chunks of a split block (numba.get_num_threads() in the function would keep Numba from
# caching it): prange deals them to the threads in contiguous runs.
SPLIT_PACK_CHUNKS = 16


def pack_b_split_lines(pro=None) -> list[str]:
    """The statements, in the parallel ``gemm_core`` above its parallel block loop, that pack
    a B block every thread reads (e.g. the image of an NCHW conv whose output rows are split)
    with its rows shared out over the threads in one parallel region. Without it one thread
    packs while the others wait: DenseNet-121's 3x3 convs (M = 32, K = 1152) spend 36-50% of
    their one-thread time in the im2col packing, serial at two threads. (A parallel function
    of its own, ``pack_b_split``, cost every such module ~0.9 s more compile CPU than this
    prange in the function that already is parallel.)"""
    extra = prologue_tail(pro)
    return [
        f"if kc * nc < {SPLIT_PACK_MIN}:   # small block: packed by one thread",
        f"    pack_b(B, b_base, p0, j0, kc, nc, Bp, geo, 0, kc{extra})",
        "else:   # its kc rows split across the threads",
        f"    step = (kc + {SPLIT_PACK_CHUNKS - 1}) // {SPLIT_PACK_CHUNKS}   # rows per chunk; prange deals the chunks out",
        "    for chunk in prange((kc + step - 1) // step):",
        f"        pack_b(B, b_base, p0, j0, kc, nc, Bp, geo, chunk * step, min(kc, (chunk + 1) * step){extra})",
    ]
