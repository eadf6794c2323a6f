"""Source generators for the int8 GEMM (``search_spaces/templates/gemm_int8.py``): packing in K groups,
the integer dot-product micro-kernel, and the module around them.

The packed layouts are the ones the dot-product instructions want (TVM's ``dense_vnni``,
MLAS's): K in groups of ``G`` consecutive elements (4 bytes for ``maddubs``/``vnni``, 2 int16
for ``madd16``), so one 32-bit lane holds one column's group::

    Ap[panel, g, r, t] = A[i0 + panel*MR + r, p0 + g*G + t]   (MR rows, G-element groups)
    Bp[panel, g, c, t] = B[p0 + g*G + t, j0 + panel*NR + c]   (NR columns, i.e. [N/NR][K/G][NR][G])

Rows, columns and K steps past the block are zero, so the micro-kernel always computes a full
MR x NR tile over whole groups and stores only what fits (zeros add nothing to a dot product).

The micro-kernel has the float GEMM's signature (``gemm_microkernels``)::

    micro_kernel(AA, ai, BB, bj, p0, kc, C, ci, cj, mlen, nlen, first)

a register tile of MR x NR/LANES int32 accumulators over a K block of packed panels; what is
element-type specific is only the group size, the broadcast of one A group
(``vbroadcast_group``) and the dot-product step (``vdot_<formulation>``), which is what a
unified GEMM engine would take as parameters.
"""
from __future__ import annotations

import json

from search_spaces.gemm_engine.blocked import (_AXIS, emit_block_loops, emit_packed_block_loops, kernel_params,
                                               tile_section)
from search_spaces.gemm_engine.microkernels import (indent, k_loop, register_tile_step, row_line_columns,
                                                    vector_tile_store_lines)
from search_spaces.runtime.simd_int8 import OPERANDS

GROUP_NOTE = "# K-group loop unrolled by {steps}, then the remainder one group at a time"
_NP = {"uint8": "np.uint8", "int8": "np.int8", "int16": "np.int16"}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def empty_aligned_source(name: str, dtype: str) -> list[str]:
    dtype_const, itemsize = _NP[dtype], 2 if dtype == "int16" else 1
    return [
        "@numba.njit(cache=True)",
        f"def {name}(n0, n1, n2, n3):",
        f'    """np.empty((n0, n1, n2, n3), {dtype_const}) starting on a 64-byte boundary."""',
        "    size = n0 * n1 * n2 * n3",
        f"    per_line = {64 // itemsize}   # elements per cache line",
        f"    buf = np.empty(size + per_line, {dtype_const})",
        f"    off = (per_line - (buf.ctypes.data // {itemsize}) % per_line) % per_line",
        "    return buf[off:off + size].reshape((n0, n1, n2, n3))",
    ]


def interleave4_store(src: str, starts: tuple[str, str, str, str], lanes: int, dst: str,
                      at: str) -> list[str]:
    """Source storing 4 rows of ``lanes`` bytes (``src`` from each of ``starts``) as K
    groups of 4: lane 4c + r of the 4 * ``lanes`` bytes stored at ``dst[at]`` is row r's byte
    c (``vinterleave4``, one shuffle). B's panels (rows = 4 K steps of NR columns) and the
    A^T / im2col groups (rows = 4 taps of 4 adjacent pixels) are both this copy."""
    a, b, c, d = starts
    return [f"lo = vconcat(vload({src}, {a}, {lanes}), vload({src}, {b}, {lanes}))",
            f"hi = vconcat(vload({src}, {c}, {lanes}), vload({src}, {d}, {lanes}))",
            f"vstore({dst}, {at}, vinterleave4(vconcat(lo, hi)))"]


def pack_a_source(a_layout: str = "MK", vector_groups: bool = False) -> list[str]:
    """``a_layout`` "MK": A is [M, K] row-major; "KM": A is given as its transpose [K, M] (a
    batch-1 NCHW image [C, H*W] as the A of a 1x1 convolution), read ``A[k, i]``.
    ``vector_groups`` (KM, MR = G = 4): a full panel's group is 4 rows of A^T holding 4
    adjacent bytes each, copied as one 16-byte [t][r] block transposed by one shuffle
    (``vinterleave4``) instead of 16 byte copies."""
    lines = [
        "@numba.njit(cache=True)",
        "def pack_a(A, i0, p0, mc, kc, Ap):",
        '    """A[i0:i0+mc, p0:p0+kc] into MR-row panels of G-element K groups:',
        "    Ap[q, g, r, t] = A[i0 + q*MR + r, p0 + g*G + t]; zeros past mc rows and kc steps.",
        "",
        "    Written in Ap's order (whole groups of full panels first: no per-element bounds test).",
        '    """',
        "    full = kc // G",
        "    for q in range((mc + MR - 1) // MR):",
        "        h = min(MR, mc - q * MR)",
        "        i = i0 + q * MR",
        "        for g in range(full):",
        "            k = p0 + g * G",
        "            for r in range(MR):",
        "                for t in range(G):",
        "                    Ap[q, g, r, t] = A[i + r, k + t] if r < h else 0",
        "        if full * G < kc:   # the last, partial group",
        "            for r in range(MR):",
        "                for t in range(G):",
        "                    Ap[q, full, r, t] = A[i + r, p0 + full * G + t] if (r < h and full * G + t < kc) else 0",
    ]
    if a_layout == "KM" and vector_groups:   # the byte loop of full groups becomes the else
        at = lines.index("        for g in range(full):")
        end = lines.index("        if full * G < kc:   # the last, partial group")
        vector = ["        if h == MR:   # 4 adjacent bytes per row of A^T: one 16-byte transpose per group",
                  "            Aq = Ap[q].reshape(-1)",
                  "            for g in range(full):",
                  "                r0 = (p0 + g * G) * S + i",
                  *("                " + ln for ln in interleave4_store(
                      "Af", ("r0", "r0 + S", "r0 + 2 * S", "r0 + 3 * S"), 4, "Aq", "g * (MR * G)")),
                  "        else:"]
        lines[at:end] = vector + ["    " + ln for ln in lines[at:end]]
        top = lines.index("    full = kc // G")
        lines[top:top] = ["    Af = A.reshape(-1)", "    S = A.shape[1]   # A^T's row stride"]
    if a_layout == "KM":
        lines = [ln.replace("A[i + r, k + t]", "A[k + t, i + r]")
                 .replace("A[i + r, p0 + full * G + t]", "A[p0 + full * G + t, i + r]")
                 .replace("A[i0:i0+mc, p0:p0+kc] into", "A^T[i0:i0+mc, p0:p0+kc] (A given as [K, M]) into")
                 .replace("Ap[q, g, r, t] = A[i0 + q*MR + r, p0 + g*G + t]",
                          "Ap[q, g, r, t] = A[p0 + g*G + t, i0 + q*MR + r]")
                 for ln in lines]
    return lines


def pack_b_source(b_layout: str = "KN", vector_nr: int | None = None) -> list[str]:
    """``b_layout`` "KN": B is [K, N] row-major; "NK": B is given as its transpose [N, K] (a
    dense layer's or a 1x1/OIHW convolution's weight rows), read ``B[j, k]``.
    ``vector_nr`` (KN, groups of 4 bytes, B C-contiguous: the GEMM template's argument):
    full panels as vectors, four rows of NR bytes loaded, interleaved by one shuffle
    (``vinterleave4``) and stored as one panel row of groups. AMD Zen 5, 1024 x 1024 int8, NR
    = 64: 0.046 ms against 0.28-0.31 ms for the byte loops (which LLVM left scalar), a
    twelfth of the 1024^3 GEMM's time."""
    doc = ["    Written in Bp's order, G rows of B at a time (3x faster than row by row, which",
           "    scatters every byte G bytes apart); full panels without a bounds test."]
    head: list[str] = []
    full_panel = ["            for g in range(full):",
                  "                k = p0 + g * G",
                  "                for c in range(NR):",
                  "                    for t in range(G):",
                  "                        Bp[q, g, c, t] = B[k + t, j + c]"]
    if vector_nr is not None and b_layout == "KN":
        nr = vector_nr
        doc = ["    Full panels: per group of 4 rows, 4 row vectors of NR bytes interleaved by one",
               "    shuffle into the panel's row of groups; the last partial panel and group by bytes."]
        head = ["    Bf = B.reshape(-1)", "    NB = B.shape[1]   # B's row stride"]
        full_panel = [
            "            Bq = Bp[q].reshape(-1)",
            "            for g in range(full):",
            "                r = (p0 + g * G) * NB + j",
            *("                " + ln for ln in interleave4_store(
                "Bf", ("r", "r + NB", "r + 2 * NB", "r + 3 * NB"), nr, "Bq", f"g * {4 * nr}"))]
    lines = [
        "@numba.njit(cache=True)",
        "def pack_b(B, p0, j0, kc, nc, Bp):",
        '    """B[p0:p0+kc, j0:j0+nc] into NR-column panels of G-element K groups:',
        "    Bp[q, g, c, t] = B[p0 + g*G + t, j0 + q*NR + c]; zeros past nc columns and kc steps.",
        "",
        *doc,
        '    """',
        *head,
        "    full = kc // G",
        "    for q in range((nc + NR - 1) // NR):",
        "        j = j0 + q * NR",
        "        w = min(NR, nc - q * NR)",
        "        if w == NR:",
        *full_panel,
        "        else:",
        "            for g in range(full):",
        "                k = p0 + g * G",
        "                for c in range(NR):",
        "                    for t in range(G):",
        "                        Bp[q, g, c, t] = B[k + t, j + c] if c < w else 0",
        "        if full * G < kc:   # the last, partial group",
        "            for c in range(NR):",
        "                for t in range(G):",
        "                    Bp[q, full, c, t] = B[p0 + full * G + t, j + c] if (c < w and full * G + t < kc) else 0",
    ]
    if b_layout == "NK":
        lines = [ln.replace("B[k + t, j + c]", "B[j + c, k + t]")
                 .replace("B[p0 + full * G + t, j + c]", "B[j + c, p0 + full * G + t]")
                 .replace("B[p0:p0+kc, j0:j0+nc] into", "B^T[p0:p0+kc, j0:j0+nc] (B given as [N, K]) into")
                 .replace("Bp[q, g, c, t] = B[p0 + g*G + t, j0 + q*NR + c]",
                          "Bp[q, g, c, t] = B[j0 + q*NR + c, p0 + g*G + t]")
                 for ln in lines]
    return lines


def pack_b_all_source() -> list[str]:
    """``pack_b_all(B)``: every (TILE_N, TILE_K) block of B packed as ``pack_b`` packs it,
    ``BP[jb, kb] = `` the block at ``j0 = jb * TILE_N``, ``p0 = kb * TILE_K``: what a kernel
    taking ``BP`` (``kernel_source(b_packed=True)``) reads instead of packing B itself, so B
    constant across calls is packed once."""
    return [
        "@numba.njit(cache=True)",
        "def pack_b_all(B):",
        '    """All of B in the blocks the kernel reads: BP[jb, kb] = pack_b of block (jb, kb)."""',
        "    nb = (N + TILE_N - 1) // TILE_N",
        "    kb_n = (K + TILE_K - 1) // TILE_K",
        "    BP = empty_b(nb * kb_n * B_PANELS, KG, NR, G).reshape((nb, kb_n, B_PANELS, KG, NR, G))",
        "    for jb in range(nb):",
        "        j0 = jb * TILE_N",
        "        for kb in range(kb_n):",
        "            p0 = kb * TILE_K",
        "            pack_b(B, p0, j0, min(TILE_K, K - p0), min(TILE_N, N - j0), BP[jb, kb])",
        "    return BP",
    ]


def micro_kernel_source(mr: int, nr: int, lanes: int, group: int, dot: str, unroll: int,
                        panel_depth: str | None = "KG", tile_store=None,
                        extra: tuple[str, ...] = (), inline: bool = True,
                        a_in_place: bool = False, prefetch_c: bool = False) -> list[str]:
    """MR x NR int32 tile as MR x NR/LANES vector accumulators; per K group: NR/LANES loads of
    the B panel, MR broadcasts of an A group, MR x NR/LANES ``vdot_<dot>`` steps.
    ``panel_depth``: K groups of a packed panel, a module constant; None when the cache block
    is a runtime argument: the packed buffer's own extent is read. ``tile_store(acc)``: the
    lines writing the accumulators (default: int32 stores into C, ``vector_tile_store_lines``),
    reading the ``extra`` parameters (e.g. the requantize of ``quant_anchor``). ``inline``:
    Numba inlines the micro-kernel into the macro-kernel's loop (``inline="always"``): no call
    per tile, whose passing of some 30 arguments and reference counting of the array
    arguments cost as much as a K = 64 tile's requantize, and 5-9% of the GEMM at 1024^3 with
    K = 1024 tiles (docs/int8-gemm.md, "The micro-kernel inlined"). ``a_in_place``: ``AA`` is A itself
    (flat, row-major [M, K], K a multiple of G): each row's group is broadcast straight from
    its row (rows past the tile's ``mlen`` repeat its last row: computed, never stored).
    ``prefetch_c``: the tile requests its lines of C for writing, one per K group from the
    first (``c_lines_paced``; with the default int32 store only)."""
    nv = nr // lanes
    acc = [[f"c_{r}_{v}" for v in range(nv)] for r in range(mr)]
    more = "".join(f", {x}" for x in extra)
    head = [
        "@numba.njit(cache=True)" if not inline else '@numba.njit(cache=True, inline="always")   # no call per tile',
        f"def micro_kernel(AA, ai, BB, bj, p0, kc, C, ci, cj, mlen, nlen, first{more}):",
        f'    """{mr} x {nr} int32 tile of C in {mr * nv} vectors of {lanes} lanes, over the K block.',
        "",
        f"    Per K group of G: {nv} B vector load(s), {mr} A group broadcast(s), {mr * nv} vdot_{dot}.",
        '    """',
    ]
    if a_in_place:
        lines = [f"ra_{r} = (ci + min({r}, mlen - 1)) * K + p0   # row {r} of A, from step p0"
                 for r in range(mr)]
    else:
        lines = [f"a = ai * ({panel_depth or 'AA.shape[1]'} * MR * G)   # this A panel (flat index)"]
    lines += [f"b = bj * ({panel_depth or 'BB.shape[1]'} * NR * G)   # this B panel",
              "kg = (kc + G - 1) // G   # K groups in this block (the last one zero-padded)"]
    # vector lengths are literals (the intrinsics need compile-time lane counts)
    lines += [" = ".join(acc[r]) + f" = vsplat(ZERO, {lanes})" for r in range(mr)]
    paced = c_lines_paced(mr, nr) if prefetch_c and tile_store is None else []
    if paced:
        lines.append("po = 0   # lines of this tile of C requested so far")

    def body(g, _s=0):
        head = ([f"pg = ({g}) * G"] if a_in_place else [f"pa = a + ({g}) * (MR * G)"]) \
            + [f"pb = b + ({g}) * (NR * G)"] + (paced if _s == 0 else [])
        return register_tile_step(
            mr, nv, head,
            lambda v: f"vload(BB, pb + {v * lanes * group}, {lanes * group})",
            (lambda r: f"vbroadcast_group(AA, ra_{r} + pg, {lanes})") if a_in_place else
            (lambda r: f"vbroadcast_group(AA, pa + {r * group}, {lanes})"),
            lambda r, v: f"{acc[r][v]} = vdot_{dot}({acc[r][v]}, a_{r}, b_{v})")
    lines += k_loop(unroll, body, var="g", count="kg", note=GROUP_NOTE)
    lines += (tile_store(acc) if tile_store is not None
              else vector_tile_store_lines(acc, nr, lanes, "np.int32"))
    return head + indent(lines)


def kernel_source(c: dict, name: str = "kernel", runtime: tuple[str, ...] = (),
                  prologue: list[str] = (), b_packed: bool = False,
                  extra: tuple[str, ...] = ()) -> list[str]:
    """The block loops (``loop_order``; ``parallel`` as prange), packing hoisted to where each
    block is determined, and the macro-kernel over MR x NR tiles; the tile knobs in
    ``runtime`` are arguments, set up by the ``prologue`` lines. ``b_packed``: the kernel
    takes ``BP``, the whole B packed ahead by ``pack_b_all`` (``BP[j0 // TILE_N, p0 //
    TILE_K]`` is the block ``pack_b`` would write), instead of B. ``extra``: parameters after
    C passed on to the micro-kernel (its ``tile_store`` reads them)."""
    order, par = c["loop_order"], c["parallel"]
    jit = "@numba.njit(cache=True" + (", parallel=True" if par != "none" else "") + ")"
    params = kernel_params(runtime)
    if b_packed:
        params = params.replace("A, B, C", "A, BP, C", 1)
    more = "".join(f", {x}" for x in extra)
    if extra:
        params = params.replace(", C", ", C" + more, 1)
    lines = [jit, f"def {name}({params}):",
             '    """C = A @ B (uint8 x int8 -> int32), writing every element of C'
             + (' (B packed ahead: BP)."""' if b_packed else '."""')]
    body: list[str] = list(prologue)
    alloc_a = "Ap = empty_a(A_PANELS, KG, MR, G)   # packed A block"
    if b_packed:   # no B packing: the block's panels are a view of BP
        level_a = max(order.index("m"), order.index("k"))
        level_b = max(order.index("k"), order.index("n"))
        level_par = order.index(par) if par != "none" else 99
        at_par = [alloc_a.replace("block", "block (private to this iteration)")] \
            if level_a >= level_par else []
        if level_a < level_par:
            body.append(alloc_a)
        ind = emit_block_loops(body, order, par, at_par,
                               [(level_a, "pack_a(A, i0, p0, mc, kc, Ap)"),
                                (level_b, "Bp = BP[j0 // TILE_N, p0 // TILE_K]   # packed ahead")])
        a_arg = "Ap, ir // MR"
    else:
        in_place = a_in_place(c, b_packed)
        if in_place:   # only B is packed
            body.append("Af = A.reshape(M * K)   # flat: the micro-kernel broadcasts groups of its rows")
        ind = emit_packed_block_loops(body, order, par, None if in_place else alloc_a,
                                      "Bp = empty_b(B_PANELS, KG, NR, G)   # packed B block")
        a_arg = "Af, 0" if in_place else "Ap, ir // MR"
    body += [
        f"{ind}first = p0 == 0   # first K block stores, later ones add",
        f"{ind}for jr in range(0, nc, NR):",
        f"{ind}    nlen = min(NR, nc - jr)",
        f"{ind}    for ir in range(0, mc, MR):",
        f"{ind}        mlen = min(MR, mc - ir)",
        f"{ind}        micro_kernel({a_arg}, Bp, jr // NR, p0, kc, C, i0 + ir, j0 + jr, mlen, nlen, first{more})",
    ]
    return lines + indent(body)


def a_in_place(c: dict, b_packed: bool = False) -> bool:
    """Whether the micro-kernel reads A itself (the GEMM's ``pack_a=False``; the templates
    whose B is packed ahead, and those without the knob, pack A)."""
    return not c.get("pack_a", True) and not b_packed


def tile_constants(w, c: dict, runtime: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(module lines, kernel prologue) for the cache blocks and what follows from them (K
    groups and panels per packed block, parallel blocks): module constants, or, for the knobs
    in ``runtime``, set at the top of the kernel from its arguments."""
    derived = [("KG", "(TILE_K + G - 1) // G", "K groups in one packed block"),
               ("A_PANELS", "(TILE_M + MR - 1) // MR", "MR-row panels in one packed A block"),
               ("B_PANELS", "(TILE_N + NR - 1) // NR", "NR-column panels in one packed B block")]
    if c["parallel"] != "none":
        _, _, tile, dim = _AXIS[c["parallel"]]
        derived.append((f"{dim}_BLOCKS", f"({dim} + {tile} - 1) // {tile}", f"parallel {dim} blocks"))
    return tile_section(w, c, runtime, derived)


def constants(w, c: dict, runtime: tuple[str, ...] = ()) -> list[str]:
    """The module constants of the engine for GEMM ``w`` (M, N, K) and a validated config
    (cache blocks among them unless they are ``runtime`` arguments: ``tile_constants``)."""
    group, _, _ = OPERANDS[c["dot"]]
    return [
        f"M, N, K = {w.M}, {w.N}, {w.K}",
        "ZERO = np.int32(0)",
        f"MR, NR = {c['mr']}, {c['nr']}   # register micro-tile",
        f"G = {group}   # K elements per group (one 32-bit lane of a dot-product instruction)",
        f"LANES = {c['vec'] // 32}   # int32 lanes per {c['vec']}-bit vector",
    ] + tile_constants(w, c, runtime)[0]


def c_lines_paced(mr: int, nr: int) -> list[str]:
    """Lines of one K group of the micro-kernel requesting the tile's lines of C (int32) for
    writing, one per group from the first (MR rows x lines per row, a row's last element
    included: C need not start on a line). Without them the tile's 24 vector stores missed
    at the end of each 6 x 64 tile: 1024^3 at 1 thread 5.38 -> 4.94 ms (399 -> 435 GOPS of
    a 469 ceiling); as a burst of 24 requests before the K loop 5.21 ms (AMD Zen 4,
    2026-12-06; docs/int8-gemm.md, "C lines requested over the K loop")."""
    per_row = len(row_line_columns(nr, 4))
    return [f"if po < {mr * per_row}:   # a line of this tile of C",
            f"    prefetch_w2(C, ci + po // {per_row}, cj + min((po % {per_row}) * 16, {nr - 1}))",
            "    po += 1"]


def prefetches_c(w) -> bool:
    """Whether an int32 C is large enough for its tiles to request their lines
    (``c_lines_paced``): as the float engine's PREFETCH, C larger than L2 keeps."""
    from search_spaces.gemm_engine.core import PREFETCH_BYTES

    return w.M * w.N * 4 >= PREFETCH_BYTES


def imports(c: dict, vector_b: bool = False, prefetch: bool = False) -> list[str]:
    """``vector_b``: the helpers of ``interleave4_store`` too (the vector B packing,
    ``pack_b_source``'s ``vector_nr``; a qconv2d's transposed A groups)."""
    more = ", vconcat, vinterleave4" if vector_b else ""
    return ["import numba",
            "import numpy as np",
            *(["from numba import prange"] if c["parallel"] != "none" else []),
            "from search_spaces.runtime.simd import "
            + ("prefetch_w2, " if prefetch else "") + "vadd, vload, vload2, vsplat, vstore, vstore2",
            f"from search_spaces.runtime.simd_int8 import vbroadcast_group, vdot_{c['dot']}{more}"]


def vector_b_packing(c: dict) -> bool:
    """Whether B's full panels are packed by vectors: groups of 4 bytes (vnni, maddubs)."""
    return OPERANDS[c["dot"]][0] == 4


def engine_parts(c: dict, *, pack_a: list[str] | None = None, b_layout: str = "KN",
                 name: str = "kernel", runtime: tuple[str, ...] = (),
                 prologue: list[str] = (), b_packed: bool = False, tile_store=None,
                 extra: tuple[str, ...] = (), vector_b: bool = False,
                 prefetch_c: bool = False) -> list[list[str]]:
    """The functions of the engine (after ``constants``): aligned buffers, packing (``pack_a``
    replaces the A packing, e.g. an implicit im2col), micro-kernel and the blocked ``name``
    (taking the ``runtime`` tile knobs as arguments, set up by ``prologue``). ``b_packed``:
    ``name`` takes B packed ahead (``pack_b_all``, also emitted; module-constant tiles only).
    ``tile_store``/``extra``: the micro-kernel's write-back and its further parameters
    (``micro_kernel_source``), passed by ``name`` after C. The micro-kernel is inlined into
    ``name``."""
    group, a_pack, b_pack = OPERANDS[c["dot"]]
    lanes = c["vec"] // 32
    if b_packed and runtime:
        raise ValueError("B packed ahead needs the cache blocks as module constants")
    return [empty_aligned_source("empty_a", a_pack),
            empty_aligned_source("empty_b", b_pack),
            pack_a if pack_a is not None else pack_a_source(),
            pack_b_source(b_layout, c["nr"] if vector_b else None),
            *([pack_b_all_source()] if b_packed else []),
            micro_kernel_source(c["mr"], c["nr"], lanes, group, c["dot"], c["unroll_k"],
                                "KG" if "tile_k" not in runtime else None, tile_store, extra,
                                a_in_place=a_in_place(c, b_packed), prefetch_c=prefetch_c),
            kernel_source(c, name, runtime, prologue, b_packed, extra)]


def generate(w, c: dict, version: int, template: str = "gemm_int8",
             runtime: tuple[str, ...] = ()) -> str:
    """The whole module for workload ``w`` (a quantized ``Gemm``) and a validated config; the
    tile knobs in ``runtime`` are kernel arguments (not in the source)."""
    group, _, _ = OPERANDS[c["dot"]]
    vector_b = vector_b_packing(c)
    prefetch = prefetches_c(w)
    shown = {k: v for k, v in sorted(c.items()) if k not in runtime and k != "threads"}
    config_json = json.dumps(shown, separators=(", ", ": "))
    called = ([f"Called as kernel({kernel_params(runtime)}): {', '.join(runtime)} are arguments,",
               "so every config differing only in them runs this one compiled module."]
              if runtime else [])
    head = [
        f'"""GEMM C[{w.M}, {w.N}] int32 = A[{w.M}, {w.K}] uint8 @ B[{w.K}, {w.N}] int8 ({w.dtype}), row-major.',
        "",
        f"Generated by search_spaces.templates.gemm_int8 (template {template}, version {version}) from the config",
        f"    {config_json}",
        f"Structure: block loops (order {'/'.join(c['loop_order'])}, outermost first) -> packing in",
        f"K groups of {group} -> macro-kernel over MR x NR register tiles -> vdot_{c['dot']} micro-kernel.",
        *called,
        '"""',
        *imports(c, vector_b=vector_b, prefetch=prefetch),
        "",
        *constants(w, c, runtime),
    ]
    prologue = tile_constants(w, c, runtime)[1]
    parts = [head] + engine_parts(c, runtime=runtime, prologue=prologue, vector_b=vector_b,
                                  prefetch_c=prefetch)
    return "\n\n\n".join("\n".join(p) for p in parts) + "\n"
