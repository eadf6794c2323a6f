"""GEMM template: C[M, N] = A[M, K] @ B[K, N] as blocked, packed, register-tiled Numba code.

The generated kernel is the BLIS/GotoBLAS structure, every choice a knob::

    for the three block loops, in ``loop_order`` (tile_m x tile_n x tile_k cache blocks):
        pack A block into MR-row panels   (pack_a; hoisted to where the block is invariant)
        pack B block into NR-column panels (pack_b; likewise)
        for each NR column strip, for each MR row strip:     (macro-kernel)
            micro_kernel: MR x NR tile of C over the K block  (microkernel, vec, unroll_k,
                          write_cache)

``parallel`` turns the M or N block loop into ``numba.prange`` wherever it sits in the order.
Matrix-vector-like shapes (M < 8) have one more formulation, ``microkernel='rowaxpy'``
(``gemm_rowaxpy.py``): B streamed row by row into L1-resident rows of C, ``unroll_k`` rows per
step, ``tile_n`` columns per block, and ``parallel='k'`` (K split over threads, partial Cs
summed); the knobs it does not use are pinned to one value so no config is measured twice.
Edges: packed panels are zero-padded, so the micro-kernel always computes full tiles and
stores only what fits; partial tiles of unpacked operands go to a bounded edge kernel.
Every rung of the REFERENCE.md ladder (naive ... parallel) is a point of this space.
"""
from __future__ import annotations

import itertools
import os

import numpy as np

from search_spaces import isa
from search_spaces.isa import Isa
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.template import Template
from workloads.errors import InstantiationError
from workloads.gemm import Gemm

LOOP_ORDERS = tuple("".join(p) for p in itertools.permutations("mnk"))
MICROKERNELS = ("loops", "unrolled", "intrinsic")
GEMV_ROWS = 8   # M below this: the 'rowaxpy' formulation and parallel='k' join the space
MAX_UNROLLED_ACCUMULATORS = 256   # source size / compile time bound for "unrolled"
SMALL_PARALLEL_FLOPS = 2 * 96 ** 3   # default config: one thread below this much work


def native_lanes(dtype: str, target: Isa | None = None) -> int:
    """Elements of ``dtype`` in one vector register of the ISA generated for (16 fp32 lanes
    on AVX-512, 8 on AVX2)."""
    return (target or isa.current()).lanes(dtype)


def _tile_values(dim: int, start: int) -> tuple[int, ...]:
    """``start``, then powers of two and 1.5x powers of two from 2*start, up to the first
    value covering ``dim`` (a tile that large means one block: the loop disappears)."""
    out = [start]
    v = 2 * start
    while out[-1] < dim:
        out += [t for t in (v, v * 3 // 2) if t > out[-1]][: 1 if v >= dim else 2]
        v *= 2
    return tuple(out)


def _k_tiles(w: Gemm) -> tuple[int, ...]:
    """tile_k values. Few rows of C (GEMV-like): B is streamed once, and thin K blocks keep the
    number of concurrent row streams within what the hardware prefetcher tracks."""
    return _tile_values(w.K, 4 if w.M < GEMV_ROWS else 32)


def _with_splits(values: tuple[int, ...], dim: int, max_threads: int) -> tuple[int, ...]:
    """Add the tiles that split ``dim`` evenly over 2..max_threads threads (rounded up to 16),
    so a parallel block loop can give every thread one equal block."""
    extra = {_split(dim, t) for t in range(2, max_threads + 1) if dim >= 64 * t}
    return tuple(sorted(set(values) | {v for v in extra if v < values[-1]}))


def _split(dim: int, parts: int) -> int:
    """ceil(dim / parts) rounded up to a multiple of 16."""
    return -(-dim // (16 * parts)) * 16


def _covers(tile: int, dim: int) -> bool:
    return tile >= dim


class GemmTemplate(Template):
    name = "gemm"
    version = 9   # 9: the intrinsic micro-kernel prefetches its C tile (placement-proof)
    workload_kind = "gemm"
    dtypes = ("float32", "float64", "int32")   # int8: search_spaces/templates/gemm_int8.py
    entry = "kernel"
    # cache blocks are kernel arguments: one compiled module per micro-kernel variant, measured
    # free against literals (docs/compile-once.md)
    runtime_knobs = ("tile_m", "tile_n", "tile_k")

    # -- the space -----------------------------------------------------------------------
    def space(self, workload: Gemm, max_threads: int = 1) -> ConfigSpace:
        w = workload
        target = isa.current()
        L = native_lanes(w.dtype, target)
        gemv = w.M < GEMV_ROWS
        knobs = [
            Knob("tile_m", _with_splits(_tile_values(w.M, 16), w.M, max_threads), True, "rows of C per cache block (A block in L2)"),
            Knob("tile_n", _with_splits(_tile_values(w.N, 16), w.N, max_threads), True, "columns of C per cache block (B block in L3/L2)"),
            Knob("tile_k", _k_tiles(w), True, "K depth per cache block (B micro-panel in L1)"),
            Knob("mr", (1, 2, 4, 6, 8, 12, 16), True, "rows of the register micro-tile"),
            Knob("nr", (1, L // 2, L, 2 * L, 3 * L, 4 * L), True, "columns of the register micro-tile"),
            Knob("loop_order", LOOP_ORDERS, False, "order of the block loops, outermost first"),
            Knob("pack_a", (False, True), False, "copy A blocks into contiguous MR-row panels"),
            Knob("pack_b", (False, True), False, "copy B blocks into contiguous NR-column panels"),
            Knob("microkernel", MICROKERNELS + (("rowaxpy",) if gemv else ()), False,
                 "how the micro-kernel is written ('rowaxpy': B streamed by rows, M < 8)"),
            Knob("vec", (L // 2, L), True, "vector lanes of the intrinsic micro-kernel (ymm/zmm)"),
            Knob("unroll_k", (1, 2, 4), True, "unroll factor of the micro-kernel's K loop"),
            Knob("write_cache", (False, True), False, "accumulate the tile locally, store C once"),
            Knob("parallel", ("none", "m", "n") + (("k",) if gemv else ()), False,
                 "block loop run with numba.prange ('k': rowaxpy's K split)"),
            Knob("threads", tuple(range(1, max(1, max_threads) + 1)), True, "Numba threads"),
        ]
        return ConfigSpace(knobs, self._constraints(w, target))

    def _constraints(self, w: Gemm, target: Isa) -> list[Constraint]:
        L = native_lanes(w.dtype, target)
        registers_total = target.registers

        def tiles_fit_micro(c):
            # A tile that is not a multiple of the micro-tile only pads its last panel (some
            # wasted FLOPs, measured like any other cost); one smaller than it is pointless.
            if c["tile_m"] < c["mr"] and not _covers(c["tile_m"], w.M):
                return f"tile_m={c['tile_m']} is smaller than mr={c['mr']}"
            if c["tile_n"] < c["nr"] and not _covers(c["tile_n"], w.N):
                return f"tile_n={c['tile_n']} is smaller than nr={c['nr']}"
            return None

        def registers(c):
            # Accumulators, one row of B and an A broadcast must fit the register file
            # (isa.Isa.spill_reason); on AVX-512 this is the earlier "<= 28 accumulators".
            if c["microkernel"] in ("intrinsic", "unrolled"):
                nv = -(-c["nr"] // (c["vec"] if c["microkernel"] == "intrinsic" else L))
                spill = target.spill_reason(c["mr"], nv)
                if spill:
                    return spill
            if c["microkernel"] == "loops" and c["mr"] * c["nr"] > 2 * registers_total * L:
                return f"{c['mr']}x{c['nr']} accumulator tile is far larger than the register file"
            if c["microkernel"] == "unrolled" and c["mr"] * c["nr"] > MAX_UNROLLED_ACCUMULATORS:
                return f"{c['mr'] * c['nr']} unrolled scalar accumulators > {MAX_UNROLLED_ACCUMULATORS}"
            return None

        def vector_width(c):
            if c["microkernel"] == "intrinsic":
                if c["nr"] % c["vec"]:
                    return f"nr={c['nr']} is not a multiple of vec={c['vec']}"
            elif c["vec"] != L:
                return f"vec only applies to microkernel='intrinsic' (keep vec={L})"
            return None

        def write_cache(c):
            if not c["write_cache"] and c["microkernel"] == "unrolled":
                return "microkernel 'unrolled' always keeps its accumulators in named scalars"
            return None

        def threads(c):
            if (c["threads"] > 1) != (c["parallel"] != "none"):
                return "threads > 1 exactly when parallel != 'none'"
            return None

        def rowaxpy(c):
            if c["microkernel"] != "rowaxpy":
                return "parallel='k' needs microkernel='rowaxpy'" if c["parallel"] == "k" else None
            if c["parallel"] == "m":
                return "rowaxpy splits K or N over threads, not M"
            # knobs the formulation does not use: one value each, so no duplicate kernels
            pinned = {"mr": 1, "nr": L, "vec": L, "pack_a": False, "pack_b": False,
                      "write_cache": False, "loop_order": "nkm",
                      "tile_m": self._last("tile_m", w), "tile_k": self._last("tile_k", w)}
            for knob, value in pinned.items():
                if c[knob] != value:
                    return f"rowaxpy does not use {knob} (keep {knob}={value})"
            return None

        return [Constraint("tiles_fit_micro", tiles_fit_micro),
                Constraint("registers", registers),
                Constraint("vector_width", vector_width),
                Constraint("write_cache", write_cache),
                Constraint("threads", threads),
                Constraint("rowaxpy", rowaxpy)]

    @staticmethod
    def _last(knob: str, w: Gemm) -> int:
        """The largest value of a tile knob (the one covering the dimension)."""
        if knob == "tile_m":
            return _tile_values(w.M, 16)[-1]
        return _k_tiles(w)[-1]

    # -- defaults and the ladder -----------------------------------------------------------
    def default_config(self, workload: Gemm, max_threads: int = 1) -> Config:
        """6 x 2L intrinsic micro-kernel on packed panels (the BLIS structure, n/k/m blocks);
        with threads, the outermost (N) block loop is split so each thread gets equal work."""
        w = workload
        L = native_lanes(w.dtype)
        sp = self.space(w, max_threads)
        # Two threads win from 128^3 up on a quiet machine (standalone, default tiles with N
        # split over 2 threads vs 1 thread: 128^3 0.033 vs 0.053 ms, 256^3 0.193 vs 0.351,
        # 512^3 1.40 vs 2.63; 64^3 0.008 vs 0.009), so only tiny products stay on one thread.
        # (An earlier bench measured 2 threads slower at 128-512: a neighbour on the other
        # core makes a 2-thread kernel wait at every parallel region's barrier.)
        threads = 1 if w.flops() < SMALL_PARALLEL_FLOPS else max(1, max_threads)
        # one equal N block per thread while that block stays moderate, else 1024-column blocks
        tile_n = 1024 if threads == 1 or _split(w.N, threads) > 1024 else _split(w.N, threads)
        # AVX2 (6 x 16 fp32 tile: 12 + 2 + 1 of 16 ymm, no spill in the K loop) takes deeper K
        # blocks: 1024^3 on Zen 3, 1 thread, CPU time beside NumPy in one process (load ~12 from
        # other jobs): tile_k 384 0.82x, 512 0.87x, 768 0.87x, 1024 0.88x; 2 threads 512 also
        # ahead of 384 (docs/isa.md). AVX-512 keeps 384.
        deep_k = 384 if w.M >= 128 and isa.current().vector_bits >= 512 else 512
        cfg = {
            "tile_m": _pick(sp, "tile_m", 96), "tile_n": _pick(sp, "tile_n", tile_n, at_least=True),
            "tile_k": _pick(sp, "tile_k", deep_k), "mr": 6, "nr": 2 * L,
            "loop_order": "nkm", "pack_a": True, "pack_b": True, "microkernel": "intrinsic",
            "vec": L, "unroll_k": 1, "write_cache": True,
            "parallel": "n" if threads > 1 else "none", "threads": threads,
        }
        if w.M < 6:
            # matrix-vector-like: a few rows of C, B streamed once in thin K blocks, unpacked
            mr = max(v for v in (1, 2, 4) if v <= w.M)
            # the widest row of B the registers hold beside mr accumulator rows (AVX-512: 4L)
            nv = max(v for v in (4, 3, 2, 1) if isa.current().spill_reason(mr, v) is None)
            cfg.update(mr=mr, nr=nv * L, pack_b=False, tile_k=_pick(sp, "tile_k", 8),
                       tile_n=_pick(sp, "tile_n", max(tile_n, 1024) if threads == 1 else tile_n))
        if w.M == 1:
            # a vector times a matrix: B streamed by rows (gemm_rowaxpy.py). Measured
            # (1x1024x4096, standalone, vs NumPy in the same run): float32 4 rows per step
            # 0.30 ms vs 0.28-0.30 at 1 thread (the micro-kernel above: 0.42), K split 0.128 vs
            # 0.16 at 2 threads; float64 1 row per step 1.01 vs 1.07-1.16 and 0.33 vs 0.49.
            # At M = 4 the micro-kernel stays ahead at 1 thread (0.68 vs 0.91 ms): search's call.
            cfg.update(microkernel="rowaxpy", mr=1, nr=L, vec=L, pack_a=False, pack_b=False,
                       write_cache=False, loop_order="nkm", tile_m=self._last("tile_m", w),
                       tile_k=self._last("tile_k", w), tile_n=sp.knob("tile_n").values[-1],
                       unroll_k=4 if np.dtype(w.dtype).itemsize <= 4 else 1,
                       parallel="k" if threads > 1 else "none")
        return _repair(sp, cfg)

    def ladder(self, workload: Gemm) -> list[tuple[str, Config]]:
        """REFERENCE.md's optimisation ladder as points of this space, each step adding one
        idea to the previous one ("tuned" comes from the records database)."""
        w = workload
        L = native_lanes(w.dtype)
        sp = self.space(w, max_threads=2)
        full = {k: sp.knob(k).values[-1] for k in ("tile_m", "tile_n", "tile_k")}
        # naive: i/j/k loops, C[i, j] += A[i, k] * B[k, j]
        naive = {**full, "mr": 1, "nr": 1, "loop_order": "mnk", "pack_a": False,
                 "pack_b": False, "microkernel": "loops", "vec": L, "unroll_k": 1,
                 "write_cache": False, "parallel": "none", "threads": 1}
        steps = [("naive", naive)]
        # blocking: 32 x 32 x 128 cache blocks
        blocking = {**naive, "tile_m": _pick(sp, "tile_m", 32), "tile_n": _pick(sp, "tile_n", 32),
                    "tile_k": _pick(sp, "tile_k", 128)}
        steps.append(("blocking", blocking))
        # vectorization: the inner j loop as one explicit SIMD vector (FMA into C)
        vectorization = {**blocking, "microkernel": "intrinsic", "nr": L}
        steps.append(("vectorization", vectorization))
        # loop permutation: K outside an 8-row x 2-vector inner tile (TVM's reorder(ko, mi, ki, ni)),
        # n/k/m block order (a B block is reused by every M block), larger blocks
        permutation = {**vectorization, "loop_order": "nkm", "mr": 8, "nr": 2 * L,
                       "tile_m": _pick(sp, "tile_m", 64),
                       "tile_n": _pick(sp, "tile_n", 256), "tile_k": _pick(sp, "tile_k", 256)}
        steps.append(("loop permutation", permutation))
        # packing: contiguous A and B panels
        packing = {**permutation, "pack_a": True, "pack_b": True}
        steps.append(("packing", packing))
        # write cache: a 6 x 2L register tile, C written once per block
        write_cache = {**packing, "write_cache": True, "mr": 6, "nr": 2 * L,
                       "tile_m": _pick(sp, "tile_m", 96), "tile_n": _pick(sp, "tile_n", 512)}
        steps.append(("write cache", write_cache))
        # parallel: the outermost (N) block loop over 2 threads
        parallel = {**write_cache, "parallel": "n", "threads": 2,
                    "tile_n": _pick(sp, "tile_n", 512 if _split(w.N, 2) > 768 else _split(w.N, 2),
                                    at_least=True)}
        steps.append(("parallel", parallel))
        return [(name, _repair(sp, cfg)) for name, cfg in steps]

    def transfer_hazard(self, workload: Gemm, config: Config) -> str | None:
        """Unpacked operands make a config shape-fragile: the micro-kernel's vector loads of an
        unpacked B row are unaligned unless rows are whole cache lines, and partial micro-tiles
        of unpacked operands run the bounded edge kernel. Measured: the tuned 2-thread 1024^3
        config (A and B unpacked, 8x32 tiles) ran 1023^3 at 0.17x NumPy, the packed template
        default at 0.91x."""
        w, c = workload, config
        if c.get("microkernel") == "rowaxpy":
            return None   # plain row streams: no alignment or edge-tile cliffs
        itemsize = np.dtype(w.dtype).itemsize
        if not c.get("pack_b", True):
            if (w.N * itemsize) % 64:
                return f"unpacked B rows of {w.N * itemsize} bytes are not whole cache lines"
            if w.N % c["nr"]:
                return f"N={w.N} leaves partial {c['nr']}-column tiles of unpacked B"
        if not c.get("pack_a", True) and w.M % c["mr"]:
            return f"M={w.M} leaves partial {c['mr']}-row tiles of unpacked A"
        return None

    def domain_features(self, params, config, caches=None) -> dict:
        from search_spaces.templates.features import gemm_features

        return gemm_features(params, config, caches)

    # -- code generation -------------------------------------------------------------------
    def codegen(self, workload: Gemm, config: Config) -> str:
        w = workload
        c = dict(config)
        # Validate against the widest space this machine tunes in: a 1-thread config proposed
        # in a 2-thread budget may use a tile that splits N over 2 threads.
        sp = self.space(w, max_threads=max(int(c.get("threads", 1)), os.cpu_count() or 1))
        sp.validate(config)
        if c["microkernel"] == "rowaxpy":
            from search_spaces.gemm_engine.rowaxpy import generate as generate_rowaxpy
            return generate_rowaxpy(w, c, self.version, self.runtime_knobs)
        from search_spaces.gemm_engine.blocked import generate
        return generate(w, c, self.version, self.runtime_knobs)

    def runtime_args(self, workload: Gemm, config: Config) -> tuple:
        """The cache blocks, clipped to the shape, in ``runtime_knobs`` order."""
        from search_spaces.gemm_engine.blocked import clipped_tiles

        tiles = clipped_tiles(workload, config)
        return tuple(tiles[k] for k in self.runtime_knobs)


def _pick(space: ConfigSpace, knob: str, want: int, at_least: bool = False) -> int:
    """The knob value closest to ``want`` (tile lists depend on the workload); with
    ``at_least`` the smallest value >= want (so N splits into no more blocks than threads)."""
    values = space.knob(knob).values
    if at_least:
        return min((v for v in values if v >= want), default=values[-1])
    return min(values, key=lambda v: (abs(v - want), v))


def _repair(space: ConfigSpace, cfg: dict) -> Config:
    """Make a hand-written config valid for small shapes: shrink the micro-tile until it is."""
    cfg = dict(cfg)
    for _ in range(64):
        reason = space.violation(cfg)
        if reason is None:
            return Config(cfg)
        if reason.startswith("tiles_fit_micro"):
            # The closest tile at least as large as the micro-tile (or covering the dim).
            for dim_knob, micro in (("tile_m", "mr"), ("tile_n", "nr")):
                vals = space.knob(dim_knob).values
                ok = [v for v in vals if v >= cfg[micro] or v == vals[-1]]
                if cfg[dim_knob] not in ok:
                    cfg[dim_knob] = min(ok, key=lambda v: abs(v - cfg[dim_knob]))
        elif reason.startswith("registers") and cfg["mr"] > 1:
            cfg["mr"] = max(v for v in space.knob("mr").values if v < cfg["mr"])
        else:
            raise InstantiationError(f"cannot repair hand-written gemm config {cfg}: {reason}")
    raise InstantiationError(f"cannot repair hand-written gemm config {cfg}")
