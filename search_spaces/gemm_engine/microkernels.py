"""The engine's micro-kernel generators: the K loop and register-tile step every micro-kernel
is written with (``k_loop``, ``register_tile_step``: float FMA here and in ``core``, integer
dot products in ``int8_microkernels``), the vector tile store, and the GEMM template's
micro-kernel styles and edge kernel.

Each generator returns Python source text (a list of lines) for one Numba function of the
generated module. The module defines the constants they use (``M, N, K, MR, NR, DTYPE``,
``ZERO``...), so trip counts are compile-time constants for LLVM.

Every micro-kernel has one signature::

    micro_kernel(AA, ai, BB, bj, p0, kc, C, ci, cj, mlen, nlen, first)

``AA``/``BB`` are either the packed panels (flat, ``packing``'s layout: ``Ap[panel*kc*MR + p*MR
+ r]``, ``Bp[panel*kc*NR + p*NR + c]``, panel ``ai``/``bj``) or the original row-major operands (indexed by row ``ai`` / column
``bj`` and the K offset ``p0``). It computes the MR x NR block of C at (ci, cj) over ``kc``
steps of K, storing (``first``) or adding its result; only ``mlen`` x ``nlen`` of it is
written (partial tiles exist only where the operands are zero-padded panels).

Formulations (knob ``microkernel``):

- ``loops``: plain Numba loops over a small local accumulator array (LLVM decides whether
  to unroll, vectorise and keep it in registers).
- ``unrolled``: every accumulator a named scalar ``c_r_c`` and every statement spelled out,
  so the SLP vectoriser sees straight-line code with no memory accumulator.
- ``intrinsic``: explicit LLVM vector values through ``search_spaces.runtime.simd`` (vector loads
  from the packed B panel, broadcasts of A, ``llvm.fma``), one register per accumulator.
"""
from __future__ import annotations

from workloads.errors import InstantiationError

JIT = "@numba.njit(cache=True{extra})"


def _jit(fastmath: bool = False, inline: bool = False) -> str:
    extra = ""
    if fastmath:
        extra += ", fastmath=True"
    return JIT.format(extra=extra)


def _par(expr: str) -> str:
    return f"({expr})" if " " in expr else expr


def a_elem(pack_a: bool, r: str, p: str) -> str:
    """Source of A[row r of the tile, step p of K] for the micro-kernel arguments."""
    return f"AA[ai * kc * MR + {_par(p)} * MR + {r}]" if pack_a else f"AA[ai + {r}, p0 + {p}]"


def b_elem(pack_b: bool, p: str, c: str) -> str:
    return f"BB[bj * kc * NR + {_par(p)} * NR + {c}]" if pack_b else f"BB[p0 + {p}, bj + {c}]"


# -- edges ---------------------------------------------------------------------------------
def edge_kernel_source(pack_a: bool, pack_b: bool, fastmath: bool) -> list[str]:
    """Generic bounded loops for partial tiles of unpacked operands (always correct).

    Row-axpy order (r, p, c): the inner loop walks a row of B and of C contiguously, so it
    vectorises and streams. (Dot products over p walked B down a column, one cache line per
    element: a 1023^3 GEMM spent 5x the whole tile work in its 31-column edge.)
    """
    return [
        _jit(fastmath),
        "def edge_kernel(AA, ai, BB, bj, p0, kc, C, ci, cj, mlen, nlen, first):",
        '    """Partial tile (mlen < MR or nlen < NR) read from unpadded operands: row updates."""',
        "    for r in range(mlen):",
        "        if first:",
        "            for c in range(nlen):",
        "                C[ci + r, cj + c] = ZERO",
        "        for p in range(kc):",
        f"            a = {a_elem(pack_a, 'r', 'p')}",
        "            for c in range(nlen):",
        f"                C[ci + r, cj + c] += a * {b_elem(pack_b, 'p', 'c')}",
    ]


def store_acc_lines() -> list[str]:
    """Store (first K block) or add the local tile ``acc`` into C; only mlen x nlen fit."""
    return [
        "if mlen == MR and nlen == NR:",
        "    if first:",
        "        for r in range(MR):",
        "            for c in range(NR):",
        "                C[ci + r, cj + c] = acc[r, c]",
        "    else:",
        "        for r in range(MR):",
        "            for c in range(NR):",
        "                C[ci + r, cj + c] += acc[r, c]",
        "else:  # partial tile at the edge of C (operands are zero-padded panels)",
        "    for r in range(mlen):",
        "        for c in range(nlen):",
        "            if first:",
        "                C[ci + r, cj + c] = acc[r, c]",
        "            else:",
        "                C[ci + r, cj + c] += acc[r, c]",
    ]


def vector_tile_store_lines(acc: list[list[str]], nr: int, lanes: int, dtype_src: str) -> list[str]:
    """The write-back of a register tile, shared by every micro-kernel of the engine (float FMA
    and int8 dot products): ``acc[r][v]`` is row r's v-th vector of ``lanes`` elements. A whole
    tile is stored (first K block) or added to C with vector loads/stores; a partial tile at
    C's edge spills the registers to a local MR x NR array of ``dtype_src`` and stores what fits."""
    mr, nv = len(acc), len(acc[0])
    lines = ["if mlen == MR and nlen == NR:", "    if first:"]
    for r in range(mr):
        lines += [f"        vstore2(C, ci + {r}, cj + {v * lanes}, {acc[r][v]})" for v in range(nv)]
    lines += ["    else:"]
    for r in range(mr):
        lines += [f"        vstore2(C, ci + {r}, cj + {v * lanes}, vadd(vload2(C, ci + {r}, cj + {v * lanes}, {lanes}), {acc[r][v]}))"
                  for v in range(nv)]
    lines += ["else:  # partial tile at the edge of C: spill the registers, store what fits",
              f"    acc = np.empty((MR, NR), {dtype_src})"]
    for r in range(mr):
        lines += [f"    vstore(acc, {r * nr + v * lanes}, {acc[r][v]})" for v in range(nv)]
    return lines + store_acc_lines()[10:]   # the bounded store loops


# -- micro-kernels -------------------------------------------------------------------------
K_NOTE = "# K loop unrolled by {steps}, then the remainder one step at a time"


def k_loop(steps: int, body, var: str = "p", count: str = "kc", rem_var: str | None = None,
           note: str | None = K_NOTE) -> list[str]:
    """The K loop of every micro-kernel of the engine: ``var`` over [0, ``count``) with
    ``body(expr, s)`` (unindented lines) for the ``steps`` steps of one iteration (``expr``
    ``var`` or ``var + s``), then the remainder one step at a time (``body(rem_var, 0)``).
    One step per iteration: a plain loop over ``rem_var``."""
    rem_var = rem_var or var
    if steps == 1:
        return [f"for {rem_var} in range({count}):"] + indent(body(rem_var, 0))
    lines = ([note.format(steps=steps)] if note else []) + [
        f"for {var} in range(0, {count} - {steps - 1}, {steps}):"]
    for s in range(steps):
        lines += indent(body(f"{var} + {s}" if s else var, s))
    return lines + [f"for {rem_var} in range({count} - {count} % {steps}, {count}):"] \
        + indent(body(rem_var, 0))


def register_tile_step(mr: int, nv: int, head: list[str], load_b, load_a, update) -> list[str]:
    """One step of K of a register-tiled micro-kernel, whatever the element type: the step's
    ``head`` lines (operand offsets), ``nv`` vector loads of a row of B (``b_v =
    load_b(v)``), then per row r of the tile a broadcast of A (``a_r = load_a(r)``) and
    its ``nv`` accumulator updates (``update(r, v)``: FMA, integer dot product, or an FMA
    into C in place)."""
    out = list(head)
    out += [f"b_{v} = {load_b(v)}" for v in range(nv)]
    for r in range(mr):
        out.append(f"a_{r} = {load_a(r)}")
        out += [update(r, v) for v in range(nv)]
    return out


def indent(lines: list[str], n: int = 4) -> list[str]:
    return [(" " * n + ln) if ln else ln for ln in lines]


def micro_loops_source(pack_a: bool, pack_b: bool, fastmath: bool, unroll: int,
                       write_cache: bool) -> list[str]:
    head = [
        _jit(fastmath),
        "def micro_kernel(AA, ai, BB, bj, p0, kc, C, ci, cj, mlen, nlen, first):",
    ]
    if not write_cache:
        doc = '    """C[ci:ci+MR, cj:cj+NR] += A-tile @ B-tile, accumulated straight into C (no write cache)."""'

        def body(p, _s=0):
            return [f"for r in range(MR):",
                    f"    a = {a_elem(pack_a, 'r', p)}",
                    f"    for c in range(NR):",
                    f"        C[ci + r, cj + c] += a * {b_elem(pack_b, p, 'c')}"]
        return head + [doc] + indent(k_loop(unroll, body))

    doc = '    """MR x NR tile of C accumulated in a local array (write cache), then stored once."""'

    def body(p, _s=0):
        return [f"for r in range(MR):",
                f"    a = {a_elem(pack_a, 'r', p)}",
                f"    for c in range(NR):",
                f"        acc[r, c] += a * {b_elem(pack_b, p, 'c')}"]
    lines = ["acc = np.zeros((MR, NR), DTYPE)"] + k_loop(unroll, body) + store_acc_lines()
    return head + [doc] + indent(lines)


def micro_unrolled_source(mr: int, nr: int, pack_a: bool, pack_b: bool, fastmath: bool,
                          unroll: int) -> list[str]:
    head = [
        _jit(fastmath),
        "def micro_kernel(AA, ai, BB, bj, p0, kc, C, ci, cj, mlen, nlen, first):",
        f'    """{mr} x {nr} tile of C in {mr * nr} scalar accumulators c_<row>_<col>, fully unrolled."""',
    ]
    acc = [[f"c_{r}_{c}" for c in range(nr)] for r in range(mr)]
    lines = []
    for r in range(mr):
        lines.append(" = ".join(acc[r]) + " = ZERO")

    def body(p, _s=0):
        out = [f"a_{r} = {a_elem(pack_a, str(r), p)}" for r in range(mr)]
        out += [f"b_{c} = {b_elem(pack_b, p, str(c))}" for c in range(nr)]
        for r in range(mr):
            out += [f"{acc[r][c]} += a_{r} * b_{c}" for c in range(nr)]
        return out
    lines += k_loop(unroll, body)
    # Spill the accumulators to a small array once (cheap next to the K loop), then store.
    lines += ["acc = np.empty((MR, NR), DTYPE)"]
    for r in range(mr):
        lines += [f"acc[{r}, {c}] = {acc[r][c]}" for c in range(nr)]
    lines += store_acc_lines()
    return head + indent(lines)


def row_line_columns(nr: int, itemsize: int) -> list[int]:
    """The columns of an NR-wide tile row whose cache lines a prefetch asks for, whatever the
    row's alignment: its first element, one per line's worth of elements after it, and its
    last element (an unaligned row straddles one line more)."""
    return sorted(set(range(0, nr, max(1, 64 // itemsize))) | {nr - 1})


def prefetch_c_lines(mr: int, nr: int, itemsize: int) -> list[str]:
    """Write hints for every cache line of the MR x NR tile of C at (ci, cj), whatever C's
    alignment (``row_line_columns``)."""
    cols = row_line_columns(nr, itemsize)
    lines = ["# the C tile's lines, fetched for writing while the K loop runs (placement-proof)"]
    for r in range(mr):
        lines += [f"prefetch_w2(C, ci + {r}, cj + {c})" for c in cols]
    return lines


def micro_intrinsic_source(mr: int, nr: int, vec: int, unroll: int, pack_a: bool,
                           pack_b: bool, write_cache: bool, itemsize: int = 4) -> list[str]:
    """Explicit LLVM vectors: each row of the tile is NR/VEC vectors of VEC lanes.

    With ``write_cache`` the MR x NR/VEC accumulators stay in registers for the whole K loop
    and C is written once; without it every K step loads, updates and stores C. With the
    write cache the tile of C is prefetched for writing before the K loop
    (``prefetch_c_lines``): without it the time depended on C's offset from a cache line by
    up to 14% (1024^3 fp32, 6x16 tile). A packed panel is ``kc`` steps deep (the engine's
    packing layout, ``search_spaces.gemm_engine.packing``).
    """
    nv = nr // vec
    acc = [[f"c_{r}_{v}" for v in range(nv)] for r in range(mr)]
    where = "registers" if write_cache else "C itself (no write cache)"
    head = [
        _jit(),
        "def micro_kernel(AA, ai, BB, bj, p0, kc, C, ci, cj, mlen, nlen, first):",
        f'    """{mr} x {nr} tile of C as {mr * nv} vectors of {vec} lanes, accumulated in {where}.',
        "",
        f"    Per K step: {nv} vector load(s) of a B row, {mr} broadcast(s) of A, {mr * nv} FMA(s).",
        '    """',
    ]
    lines = []
    if pack_a:
        lines.append("a = ai * (kc * MR)   # this A panel in the packed block (flat index)")
    if pack_b:
        lines.append("b = bj * (kc * NR)   # this B panel")
    if write_cache:
        lines += prefetch_c_lines(mr, nr, itemsize)
        for r in range(mr):
            lines.append(" = ".join(acc[r]) + f" = vsplat(ZERO, {vec})")

    def body(p, _s=0):
        head = []
        if pack_a:
            head.append("pa = a + p * MR" if p == "p" else f"pa = a + ({p}) * MR")
        if pack_b:
            head.append("pb = b + p * NR" if p == "p" else f"pb = b + ({p}) * NR")

        def load_b(v):
            return (f"vload(BB, pb + {v * vec}, {vec})" if pack_b
                    else f"vload2(BB, p0 + {p}, bj + {v * vec}, {vec})")

        def load_a(r):
            return (f"vbroadcast(AA, pa + {r}, {vec})" if pack_a
                    else f"vbroadcast2(AA, ai + {r}, p0 + {p}, {vec})")

        def update(r, v):
            if write_cache:
                return f"{acc[r][v]} = vfma(a_{r}, b_{v}, {acc[r][v]})"
            at = f"ci + {r}, cj + {v * vec}"
            return f"vstore2(C, {at}, vfma(a_{r}, b_{v}, vload2(C, {at}, {vec})))"
        return register_tile_step(mr, nv, head, load_b, load_a, update)
    lines += k_loop(unroll, body)
    if not write_cache:
        return head + indent(lines)
    lines += vector_tile_store_lines(acc, nr, vec, "DTYPE")
    return head + indent(lines)


# -- dispatch ------------------------------------------------------------------------------
def extra_imports(c: dict) -> list[str]:
    """The vector operations the module calls: the intrinsic micro-kernel's, and the vector
    copies of the B packing."""
    names = set()
    if c["microkernel"] == "intrinsic":
        names |= {"prefetch_w2", "vadd", "vbroadcast", "vbroadcast2", "vfma", "vload", "vload2",
                  "vsplat", "vstore", "vstore2"}
    if c["pack_b"]:
        names |= {"vload", "vload_n", "vstore"}
    if not names:
        return []
    lines, line = [], "from search_spaces.runtime.simd import ("
    for k, name in enumerate(sorted(names)):
        item = name + (", " if k < len(names) - 1 else ")")
        if len(line) + len(item.rstrip()) > 100:
            lines.append(line.rstrip())
            line = " " * len("from search_spaces.runtime.simd import (")
        line += item
    return lines + [line]


def micro_kernel_source(c: dict) -> list[str]:
    kind = c["microkernel"]
    fm = bool(c["fastmath"])
    if kind == "loops":
        return micro_loops_source(c["pack_a"], c["pack_b"], fm, c["unroll_k"], c["write_cache"])
    if kind == "unrolled":
        return micro_unrolled_source(c["mr"], c["nr"], c["pack_a"], c["pack_b"], fm, c["unroll_k"])
    if kind == "intrinsic":
        return micro_intrinsic_source(c["mr"], c["nr"], c["vec"], c["unroll_k"], c["pack_a"],
                                      c["pack_b"], c["write_cache"], c.get("itemsize", 4))
    raise InstantiationError(f"micro-kernel formulation {kind!r} is not implemented")
