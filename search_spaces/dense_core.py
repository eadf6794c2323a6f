"""The blocked GEMM core shared by the conv2d and dense templates, with a fused epilogue.

``C[M, N] = A[M, K] @ B[K, N]`` for one batch index, every operand a flat C-contiguous array
(with a base offset), written into the output's flat array at ``cbase + row * N + col``.
Where A and B come from is a *source* (chosen by the template):

- A: ``direct`` (a row-major [M, K] matrix, e.g. OIHW weights or NHWC pixels of a 1x1 conv),
  ``pack`` (the same, copied into MR-row panels), ``im2col_nhwc`` (implicit im2col of an
  NHWC image, packed into MR-row panels);
- B: ``direct`` (row-major [K, N], e.g. HWIO weights), ``pack`` (copied into NR-column
  panels), ``pack_t`` (panels of W^T from a row-major [N, K] dense weight), ``im2col_nchw``
  (implicit im2col of one NCHW image, packed into NR-column panels).

The micro-kernel is the GEMM template's formulation (``search_spaces.simd``: MR x NR/VEC
vector accumulators, vector loads of B, broadcasts of A, ``llvm.fma``), generated here so it
can read unpacked operands with literal strides. Each MR x NR tile lands in a small scratch
array; ``store_tile`` adds it to the output (K blocks after the first) and, at the last K
block, applies the epilogue to the tile while it is in L1 — no second pass over the output.
Partial tiles of unpacked operands go to a bounded scalar edge kernel.
"""
from __future__ import annotations

from search_spaces.epilogue import DTYPE_SRC, VECTOR_IMPORTS, Epilogue
from search_spaces.gemm_codegen import emit_block_loops

A_SOURCES = ("direct", "pack", "im2col_nhwc")
B_SOURCES = ("direct", "pack", "pack_t", "im2col_nchw")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _jit(parallel: bool = False, fastmath: bool = False) -> str:
    extra = (", parallel=True" if parallel else "") + (", fastmath=True" if fastmath else "")
    return f"@numba.njit(cache=True{extra})"


def constants(M: int, N: int, K: int, dtype: str, c: dict) -> list[str]:
    tm, tn, tk = min(c["tile_m"], M), min(c["tile_n"], N), min(c["tile_k"], K)
    return [
        f"M, N, K = {M}, {N}, {K}   # GEMM of one batch index",
        f"DTYPE = {DTYPE_SRC[dtype]}",
        "ZERO = DTYPE(0)",
        f"TILE_M, TILE_N, TILE_K = {tm}, {tn}, {tk}   # cache blocks (clipped to the shape)",
        f"MR, NR, VEC = {c['mr']}, {c['nr']}, {c['vec']}   # register micro-tile, vector lanes",
        f"A_PANELS = {_ceil(tm, c['mr'])}",
        f"B_PANELS = {_ceil(tn, c['nr'])}",
        f"M_BLOCKS, N_BLOCKS = {_ceil(M, tm)}, {_ceil(N, tn)}",
    ]


# -- packing -------------------------------------------------------------------------------------
def pack_a_source(src: str) -> list[str]:
    head = [_jit(), "def pack_a(A, a_base, i0, p0, mc, kc, Ap):",
            '    """Ap[q*kc*MR + p*MR + r] = A[i0 + q*MR + r, p0 + p]; rows past mc are zero."""']
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


def pack_b_source(src: str, sw: int = 1, nr: int = 16, vec: int = 16) -> list[str]:
    head = [_jit(), "def pack_b(B, b_base, p0, j0, kc, nc, Bp):",
            '    """Bp[q*kc*NR + p*NR + c] = B[p0 + p, j0 + q*NR + c]; columns past nc are zero."""']
    if src == "pack":
        return head + [
            "    for p in range(kc):",
            "        row = b_base + (p0 + p) * N + j0",
            "        for q in range((nc + NR - 1) // NR):",
            "            dst = q * kc * NR + p * NR",
            "            j = q * NR",
            "            if j + NR <= nc:",
            "                for c in range(NR):",
            "                    Bp[dst + c] = B[row + j + c]",
            "            else:",
            "                for c in range(NR):",
            "                    Bp[dst + c] = B[row + j + c] if j + c < nc else ZERO",
        ]
    if src == "pack_t":
        return head + [
            "    # B = W^T of a row-major [N, K] weight: each panel column is a contiguous W row.",
            "    for q in range((nc + NR - 1) // NR):",
            "        base = q * kc * NR",
            "        for c in range(NR):",
            "            j = q * NR + c",
            "            if j < nc:",
            "                src = b_base + (j0 + j) * K + p0",
            "                for p in range(kc):",
            "                    Bp[base + p * NR + c] = B[src + p]",
            "            else:",
            "                for p in range(kc):",
            "                    Bp[base + p * NR + c] = ZERO",
        ]
    assert src == "im2col_nchw"
    return head + [
        "    # B is the implicit im2col matrix of one NCHW image: row = (ci, kh, kw), column =",
        "    # output pixel (oh, ow). Each of the kc rows is built in ROW, one output-image row",
        "    # segment at a time: zeros where the window is in the padding, a branch-free copy",
        "    # (vectors when SW == 1) over the interior; then ROW goes to the panels NR at a time.",
        "    nq = (nc + NR - 1) // NR",
        "    ROW = np.zeros(nq * NR, DTYPE)   # columns past nc stay zero",
        "    oh_first = j0 // OW",
        "    ow_first = j0 - oh_first * OW",
        "    for p in range(kc):",
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
        "            for u in range(ow, a):",
        "                ROW[d + u] = ZERO",
        "            src = plane + ih * W + off",
    ] + ([
        "            u = a",
        "            while u + VEC <= b:",
        "                vstore(ROW, d + u, vload(B, src + u, VEC))",
        "                u += VEC",
        "            for x in range(u, b):   # tail",
        "                ROW[d + x] = B[src + x]",
    ] if sw == 1 else [
        "            for u in range(a, b):",
        "                ROW[d + u] = B[src + u * SW]",
    ]) + [
        "            for u in range(b, end):",
        "                ROW[d + u] = ZERO",
        "            t += seg",
        "            oh += 1",
        "            ow = 0",
        "        for q in range(nq):",
        "            dst = q * kc * NR + p * NR",
    ] + [f"            vstore(Bp, dst + {v}, vload(ROW, q * NR + {v}, VEC))" for v in range(0, nr, vec)]


# -- micro-kernels -------------------------------------------------------------------------------
def _strides(a_src: str, b_src: str) -> tuple[str, str, str]:
    """(A row stride, A step stride, B step stride) as source literals."""
    a_rs, a_ps = ("1", "MR") if a_src != "direct" else ("K", "1")
    b_ps = "NR" if b_src != "direct" else "N"
    return a_rs, a_ps, b_ps


def micro_source(mr: int, nr: int, vec: int, a_src: str, b_src: str) -> list[str]:
    nv = nr // vec
    a_rs, a_ps, b_ps = _strides(a_src, b_src)
    acc = [[f"c_{r}_{v}" for v in range(nv)] for r in range(mr)]
    lines = [_jit(), "def micro_kernel(AA, a, BB, b, kc, T):",
             f'    """T = A tile ({mr} rows) @ B tile ({nr} columns) over kc steps, in {mr * nv} vector',
             f"    registers of {vec} lanes. A(r, p) = AA[a + r*{a_rs} + p*{a_ps}], "
             f"B(p, c) = BB[b + p*{b_ps} + c].",
             '    """']
    for r in range(mr):
        lines.append("    " + " = ".join(acc[r]) + f" = vsplat(ZERO, {vec})")
    lines += ["    for p in range(kc):",
              f"        pa = a + p * {a_ps}",
              f"        pb = b + p * {b_ps}"]
    lines += [f"        b_{v} = vload(BB, pb + {v * vec}, {vec})" for v in range(nv)]
    for r in range(mr):
        off = f" + {r} * {a_rs}" if r else ""
        lines.append(f"        a_{r} = vbroadcast(AA, pa{off}, {vec})")
        lines += [f"        {acc[r][v]} = vfma(a_{r}, b_{v}, {acc[r][v]})" for v in range(nv)]
    for r in range(mr):
        lines += [f"    vstore(T, {r * nr + v * vec}, {acc[r][v]})" for v in range(nv)]
    return lines


def edge_source(a_src: str, b_src: str) -> list[str]:
    a_rs, a_ps, b_ps = _strides(a_src, b_src)
    return [
        _jit(fastmath=True),
        "def edge_kernel(AA, a, BB, b, kc, T, mlen, nlen):",
        '    """Partial tile of an unpacked operand (bounded loops, never reads past the edge)."""',
        "    for r in range(MR * NR):",
        "        T[r] = ZERO",
        "    for p in range(kc):",
        "        for r in range(mlen):",
        f"            av = AA[a + r * {a_rs} + p * {a_ps}]",
        "            for c in range(nlen):",
        f"                T[r * NR + c] += av * BB[b + p * {b_ps} + c]",
    ]


def store_source(epi: Epilogue, single_block: bool, mr: int, nr: int, vec: int) -> list[str]:
    """store_tile(T, Cf, cbase, ci, cj, mlen, nlen, mode, e...): mode 0 first K block (store),
    1 middle (add), 2 last (add, epilogue), 3 only block (epilogue). A full MR x NR tile is
    stored with vector loads/stores (and the epilogue's vector form, when it has one); a
    partial tile, or an epilogue with no vector form, goes through the scalar loops."""
    args = epi.args()
    lines = [_jit(fastmath=True), f"def store_tile(T, Cf, cbase, ci, cj, mlen, nlen, mode, {args}):",
             f'    """Tile T into C (flat, row stride N) at (ci, cj); epilogue: {epi.describe()}."""']

    def loop(body_first: list[str], epilogue: bool) -> list[str]:
        out = ["for r in range(mlen):",
               "    row = ci + r",
               "    o = cbase + row * N + cj",
               "    for c in range(nlen):"]
        inner = list(body_first)
        if epilogue:
            inner += epi.apply("v", "row", "cj + c", "o + c")
        inner.append("Cf[o + c] = v")
        return out + ["        " + ln for ln in inner]

    def vloop(add: bool, epilogue: bool) -> list[str]:
        out = [f"for r in range({mr}):",
               "    row = ci + r",
               "    o = cbase + row * N + cj"]
        if epilogue:
            out += ["    " + ln for ln in epi.vec_operands("row", vec)]
        for v in range(0, nr, vec):
            out.append(f"    v = vload(T, r * {nr} + {v}, {vec})")
            if add:
                out.append(f"    v = vadd(vload(Cf, o + {v}, {vec}), v)")
            if epilogue:
                out += ["    " + ln for ln in epi.apply_vec("v", f"cj + {v}", f"o + {v}", vec)]
            out.append(f"    vstore(Cf, o + {v}, v)")
        return out

    body = []
    vector = epi.vectorizable()
    modes = [(3, "", False, True)] if single_block else [
        (0, "if mode == 0:", False, False), (1, "elif mode == 1:", True, False),
        (2, "else:", True, True)]
    if vector:
        body.append("if mlen == MR and nlen == NR:   # full tile: vectors")
        if single_block:
            body += ["    " + ln for ln in vloop(False, True)]
        else:
            for _m, cond, add, ep in modes:
                body += ["    " + cond] + ["        " + ln for ln in vloop(add, ep)]
        body.append("    return")
    elif not single_block:
        # Only the epilogue lacks a vector form: vector stores for the first/middle blocks.
        body.append("if mlen == MR and nlen == NR and mode < 2:   # full tile: vectors")
        body += ["    if mode == 0:"] + ["        " + ln for ln in vloop(False, False)]
        body += ["    else:"] + ["        " + ln for ln in vloop(True, False)]
        body.append("    return")
    if single_block:
        body += loop(["v = T[r * NR + c]"], True)
    else:
        body += ["if mode == 0:"] + ["    " + ln for ln in loop(["v = T[r * NR + c]"], False)]
        body += ["elif mode == 1:"] + ["    " + ln for ln in loop(["v = Cf[o + c] + T[r * NR + c]"], False)]
        body += ["else:"] + ["    " + ln for ln in loop(["v = Cf[o + c] + T[r * NR + c]"], True)]
    return lines + ["    " + ln for ln in body]


# -- the blocked loops ---------------------------------------------------------------------------
def core_source(c: dict, a_src: str, b_src: str, epi: Epilogue, K: int) -> list[str]:
    """gemm_core(A, a_base, B, b_base, Cf, cbase, e...): the block loops of one batch index."""
    order, par = c["loop_order"], c["parallel"]
    pack_a, pack_b = a_src != "direct", b_src != "direct"
    single = c["tile_k"] >= K
    level_a = max(order.index("m"), order.index("k"))
    level_b = max(order.index("k"), order.index("n"))
    level_par = order.index(par) if par != "none" else -1
    alloc_a = "Ap = np.empty(A_PANELS * TILE_K * MR, DTYPE)   # packed A block"
    alloc_b = "Bp = np.empty(B_PANELS * TILE_K * NR, DTYPE)   # packed B block"
    alloc_t = "T = np.empty(MR * NR, DTYPE)   # one register tile"
    args = epi.args()
    lines = [_jit(parallel=par != "none"), f"def gemm_core(A, a_base, B, b_base, Cf, cbase, {args}):",
             '    """C[M, N] (flat at cbase) = epilogue(A @ B) with blocked, packed loops."""']
    body: list[str] = []
    if level_par < 0:
        body.append(alloc_t)
    if pack_a and level_a < level_par:
        body.append(alloc_a)
    if pack_b and level_b < level_par:
        body.append(alloc_b)
    if level_par < 0:
        if pack_a:
            body.append(alloc_a)
        if pack_b:
            body.append(alloc_b)
    at_parallel = [alloc_t + " (private)"] \
        + ([alloc_a + " (private)"] if pack_a and level_a >= level_par else []) \
        + ([alloc_b + " (private)"] if pack_b and level_b >= level_par else [])
    packs = ([(level_a, "pack_a(A, a_base, i0, p0, mc, kc, Ap)")] if pack_a else []) \
        + ([(level_b, "pack_b(B, b_base, p0, j0, kc, nc, Bp)")] if pack_b else [])
    ind = emit_block_loops(body, order, par, at_parallel, packs)
    if single:
        body.append(f"{ind}mode = 3   # K fits one block: store with the epilogue")
    else:
        body.append(f"{ind}mode = 0 if p0 == 0 else (2 if p0 + kc >= K else 1)")
    a_arg = ("Ap", "(ir // MR) * kc * MR") if pack_a else ("A", "a_base + (i0 + ir) * K + p0")
    b_arg = ("Bp", "(jr // NR) * kc * NR") if pack_b else ("B", "b_base + p0 * N + j0 + jr")
    call = f"{a_arg[0]}, {a_arg[1]}, {b_arg[0]}, {b_arg[1]}, kc, T"
    body += [f"{ind}for jr in range(0, nc, NR):",
             f"{ind}    nlen = min(NR, nc - jr)",
             f"{ind}    for ir in range(0, mc, MR):",
             f"{ind}        mlen = min(MR, mc - ir)"]
    edge = " or ".join(x for x in (("mlen < MR" if not pack_a else ""),
                                   ("nlen < NR" if not pack_b else "")) if x)
    if edge:
        body += [f"{ind}        if {edge}:",
                 f"{ind}            edge_kernel({call}, mlen, nlen)",
                 f"{ind}        else:",
                 f"{ind}            micro_kernel({call})"]
    else:
        body.append(f"{ind}        micro_kernel({call})")
    body.append(f"{ind}        store_tile(T, Cf, cbase, i0 + ir, j0 + jr, mlen, nlen, mode, {args})")
    return lines + ["    " + ln for ln in body]


def module_parts(M: int, N: int, K: int, dtype: str, c: dict, a_src: str, b_src: str,
                 epi: Epilogue, sw: int = 1) -> list[list[str]]:
    """Constants and functions of a GEMM-core module (the caller adds header and kernel);
    ``sw``: the conv's horizontal stride (contiguous im2col copies when 1)."""
    parts = [constants(M, N, K, dtype, c)]
    if a_src != "direct":
        parts.append(pack_a_source(a_src))
    if b_src != "direct":
        parts.append(pack_b_source(b_src, sw, c["nr"], c["vec"]))
    parts.append(micro_source(c["mr"], c["nr"], c["vec"], a_src, b_src))
    if a_src == "direct" or b_src == "direct":
        parts.append(edge_source(a_src, b_src))
    parts.append(store_source(epi, c["tile_k"] >= K, c["mr"], c["nr"], c["vec"]))
    parts.append(core_source(c, a_src, b_src, epi, K))
    return parts


IMPORTS = ["import numba", "import numpy as np", "from numba import prange",
           "from search_spaces.simd import vadd, vbroadcast, vfma, vload, vsplat, vstore",
           VECTOR_IMPORTS]
