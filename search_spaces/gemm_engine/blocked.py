"""Assemble the GEMM module source from a validated config (see search_spaces/templates/gemm.py)."""
from __future__ import annotations

import json
import math

from search_spaces import isa
from search_spaces.gemm_engine import microkernels as mk
from search_spaces.gemm_engine import packing
from workloads.gemm import Gemm

_DTYPE_SRC = {"float32": "np.float32", "float64": "np.float64", "int32": "np.int32"}
_AXIS = {  # block loop of each axis: index variable, start, extent, tile, dimension
    "m": ("i0", "mc", "TILE_M", "M"),
    "n": ("j0", "nc", "TILE_N", "N"),
    "k": ("p0", "kc", "TILE_K", "K"),
}


def emit_block_loops(body: list[str], order: str, par: str, at_parallel: list[str],
                     packs: list[tuple[int, str | list[str]]],
                     bounds: dict[str, tuple[str, str]] | None = None, ind: str = "") -> str:
    """Append the three block loops (``order``, outermost first; ``par`` as ``prange``) to
    ``body``. ``at_parallel`` lines open the parallel loop's body (private buffers); each
    ``(level, line)`` of ``packs`` (a statement or a list of them) is emitted inside the loop
    at that level. ``bounds``: an axis's (start, end) expressions where the loop covers part
    of the dimension (a block of a grid split), else (0, the dimension); ``ind``: the
    indentation of the outermost loop. Returns the innermost indentation. Shared by the
    GEMM kernel and the dense/conv2d core."""
    level_par = order.index(par) if par != "none" else -1
    for lev, axis in enumerate(order):
        var, ext, tile, dim = _AXIS[axis]
        lo, hi = (bounds or {}).get(axis, ("0", dim))
        if axis == par:
            body.append(f"{ind}for blk in prange({dim}_BLOCKS):   # parallel over {dim} blocks")
            body.append(f"{ind}    {var} = blk * {tile}")
        else:
            body.append(f"{ind}for {var} in range({lo}, {hi}, {tile}):")
        ind += "    "
        body.append(f"{ind}{ext} = min({tile}, {hi} - {var})")
        if lev == level_par:
            body += [ind + line for line in at_parallel]
        for level, lines in packs:   # a statement, or a list of them
            if level == lev:
                body += [ind + line for line in ([lines] if isinstance(lines, str) else lines)]
    return ind


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


TILE_KNOBS = ("tile_m", "tile_n", "tile_k")
_TILE_NAME = {"tile_m": "TILE_M", "tile_n": "TILE_N", "tile_k": "TILE_K"}


def clipped_tiles(w: Gemm, c: dict) -> dict[str, int]:
    """The cache-block knobs clipped to the shape (a tile past the dimension is one block)."""
    return {"tile_m": min(c["tile_m"], w.M), "tile_n": min(c["tile_n"], w.N),
            "tile_k": min(c["tile_k"], w.K)}


def tile_section(w: Gemm, c: dict, runtime: tuple[str, ...],
                 derived: list[tuple[str, str, str]]) -> tuple[list[str], list[str]]:
    """(module lines, kernel-body lines) defining TILE_M, TILE_N, TILE_K and the quantities
    ``derived`` from them (name, expression, comment). A tile knob in ``runtime`` is an
    argument of the kernel (lower-case name): its constant and everything derived are set at
    the top of the kernel body instead of the module, so the source does not depend on it."""
    tiles = clipped_tiles(w, c)
    module, body = [], []
    literal = [k for k in TILE_KNOBS if k not in runtime]
    if literal:
        module.append(", ".join(_TILE_NAME[k] for k in literal) + " = "
                      + ", ".join(str(tiles[k]) for k in literal)
                      + "   # cache blocks (clipped to the shape)")
    if runtime:
        body.append(", ".join(_TILE_NAME[k] for k in runtime) + " = " + ", ".join(runtime)
                    + "   # cache blocks: runtime arguments (clipped to the shape by the caller)")
    (body if runtime else module).extend(f"{name} = {expr}   # {note}" for name, expr, note in derived)
    return module, body


def kernel_params(runtime: tuple[str, ...]) -> str:
    """The generated entry's parameters: the operands, then the runtime knobs."""
    return ", ".join(("A", "B", "C") + tuple(runtime))


def module_head(w: Gemm, config: dict, version: int, structure: list[str],
                imports: list[str], runtime: tuple[str, ...] = ()) -> list[str]:
    """The generated module's docstring (shape, config, ``structure`` lines), its imports and
    the constants every GEMM formulation uses (M, N, K, DTYPE, ZERO). The config shown leaves
    out the ``runtime`` knobs (their values are arguments, not part of the source) and
    ``threads`` (Numba's thread count, set by the caller; rowaxpy's K split is in the source)."""
    shown = {k: v for k, v in sorted(config.items()) if k not in runtime and k != "threads"}
    config_json = json.dumps(shown, separators=(", ", ": "))
    called = ([f"Called as kernel({kernel_params(runtime)}): {', '.join(runtime)} are arguments,",
               "so every config differing only in them runs this one compiled module."]
              if runtime else [])
    return [
        f'"""GEMM C[{w.M}, {w.N}] = A[{w.M}, {w.K}] @ B[{w.K}, {w.N}], {w.dtype}, row-major.',
        "",
        f"Generated by search_spaces.templates.gemm (template gemm, version {version}) from the config",
        f"    {config_json}",
        *structure,
        *called,
        '"""',
        "import numba",
        "import numpy as np",
        *(["from numba import prange"] if config["parallel"] != "none" else []),
        *imports,
        "",
        f"M, N, K = {w.M}, {w.N}, {w.K}",
        f"DTYPE = {_DTYPE_SRC[w.dtype]}",
        "ZERO = DTYPE(0)",
    ]


def generate(w: Gemm, c: dict, version: int, runtime: tuple[str, ...] = ()) -> str:
    """The module for a validated config; the tile knobs in ``runtime`` are kernel arguments."""
    from search_spaces.gemm_engine.core import Dims
    head = module_head(w, c, version, [
        f"Structure: block loops (order {'/'.join(c['loop_order'])}, outermost first) -> "
        "packing -> macro-kernel over",
        f"MR x NR register tiles -> '{c['microkernel']}' micro-kernel."], mk.extra_imports(c), runtime)
    # not knobs: plain loops always want fast-math; the micro-kernel's C prefetch its lines
    c = {**c, "fastmath": w.dtype != "int32", "itemsize": 8 if w.dtype == "float64" else 4}
    mr, nr = c["mr"], c["nr"]
    par = c["parallel"]
    pack_a, pack_b = c["pack_a"], c["pack_b"]
    fm = w.dtype != "int32"   # fast-math (FMA contraction, reassociation) for floats

    head.append(f"MR, NR = {mr}, {nr}   # register micro-tile")
    derived = [("A_PANELS", "(TILE_M + MR - 1) // MR", "MR-row panels in one packed A block"),
               ("B_PANELS", "(TILE_N + NR - 1) // NR", "NR-column panels in one packed B block")]
    if par != "none":
        _, _, tile, dim = _AXIS[par]
        derived.append((f"{dim}_BLOCKS", f"({dim} + {tile} - 1) // {tile}", f"parallel {dim} blocks"))
    module, prologue = tile_section(w, c, runtime, derived)
    head += module
    parts = [head]
    no_dims = Dims({})   # M, N, K are module constants: the packing takes no ``geo``
    if pack_a or pack_b:
        head.append(f"ITEMSIZE = {4 if w.dtype != 'float64' else 8}   # bytes per element")
        parts.append(packing.empty_aligned_source())
    if pack_a:
        parts.append(packing.pack_a_source("pack", no_dims, running_index=True))
    if pack_b:
        copy = math.gcd(nr, isa.current().lanes(w.dtype))   # whole vectors where nr allows
        head.append(f"VEC = {copy}   # lanes of the B packing's vector copies")
        parts.append(packing.pack_b_source("pack", no_dims, 1, nr, copy))
    parts.append(mk.micro_kernel_source(c))
    if not (pack_a and pack_b and c["write_cache"]):
        parts.append(mk.edge_kernel_source(pack_a, pack_b, fm))
    parts.append(_kernel_source(c, runtime, prologue))
    return "\n\n\n".join("\n".join(p) for p in parts) + "\n"


def emit_packed_block_loops(body: list[str], order: str, par: str, alloc_a: str | None,
                            alloc_b: str | None, pack_a: str = "pack_a(A, i0, p0, mc, kc, Ap)",
                            pack_b: str = "pack_b(B, p0, j0, kc, nc, Bp)") -> str:
    """``emit_block_loops`` with packing: each operand with an allocation line (None: read in
    place) is packed where its block is first fully determined (hoisted out of the third
    loop) by the calls ``pack_a`` / ``pack_b``. A buffer
    packed outside the parallel loop is shared; inside it, private per iteration. Shared by
    the float and int8 GEMM kernels; returns the innermost indentation."""
    level_a = max(order.index("m"), order.index("k"))
    level_b = max(order.index("k"), order.index("n"))
    level_par = order.index(par) if par != "none" else 99
    if alloc_a and level_a < level_par:
        body.append(alloc_a)
    if alloc_b and level_b < level_par:
        body.append(alloc_b)
    private = "block (private to this iteration)"
    at_parallel = ([alloc_a.replace("block", private)] if alloc_a and level_a >= level_par else []) \
        + ([alloc_b.replace("block", private)] if alloc_b and level_b >= level_par else [])
    packs = ([(level_a, pack_a)] if alloc_a else []) + ([(level_b, pack_b)] if alloc_b else [])
    return emit_block_loops(body, order, par, at_parallel, packs)


def _kernel_source(c: dict, runtime: tuple[str, ...], prologue: list[str]) -> list[str]:
    order, par = c["loop_order"], c["parallel"]
    pack_a, pack_b = c["pack_a"], c["pack_b"]
    jit = "@numba.njit(cache=True" + (", parallel=True" if par != "none" else "") + ")"
    lines = [jit, f"def kernel({kernel_params(runtime)}):",
             '    """C = A @ B, writing every element of C."""']
    body: list[str] = list(prologue)
    if not c["write_cache"]:
        body.append("C[:, :] = ZERO   # the micro-kernel accumulates straight into C")
    alloc_a = "Ap = empty_aligned(A_PANELS * TILE_K * MR)   # packed A block" if pack_a else None
    alloc_b = "Bp = empty_aligned(B_PANELS * TILE_K * NR)   # packed B block" if pack_b else None
    if pack_a:
        body.append("Af = A.reshape(M * K)   # flat view: the packing reads rows by offset")
    if pack_b:
        body.append("Bf = B.reshape(K * N)   # flat view")
    ind = emit_packed_block_loops(body, order, par, alloc_a, alloc_b,
                                  "pack_a(Af, 0, i0, p0, mc, kc, Ap)",
                                  "pack_b(Bf, 0, p0, j0, kc, nc, Bp, 0, kc)")
    first = "p0 == 0" if c["write_cache"] else "False"
    a_args = ("Ap", "ir // MR") if pack_a else ("A", "i0 + ir")
    b_args = ("Bp", "jr // NR") if pack_b else ("B", "j0 + jr")
    args = f"{a_args[0]}, {a_args[1]}, {b_args[0]}, {b_args[1]}, p0, kc, C, i0 + ir, j0 + jr, mlen, nlen, first"
    body += [
        f"{ind}first = {first}   # first K block stores, later ones add",
        f"{ind}# macro-kernel: NR-column strips of the block, MR-row strips inside",
        f"{ind}for jr in range(0, nc, NR):",
        f"{ind}    nlen = min(NR, nc - jr)",
        f"{ind}    for ir in range(0, mc, MR):",
        f"{ind}        mlen = min(MR, mc - ir)",
    ]
    if pack_a and pack_b and c["write_cache"]:
        # zero-padded panels and a local tile: the micro-kernel handles partial tiles itself
        body.append(f"{ind}        micro_kernel({args})")
    else:
        # the micro-kernel would touch C (or unpadded operands) outside the tile: edges apart
        full = " and ".join(x for x in (("mlen == MR" if not (pack_a and c["write_cache"]) else ""),
                                        ("nlen == NR" if not (pack_b and c["write_cache"]) else "")) if x)
        body += [f"{ind}        if {full}:",
                 f"{ind}            micro_kernel({args})",
                 f"{ind}        else:",
                 f"{ind}            edge_kernel({args})"]
    return lines + ["    " + ln for ln in body]
