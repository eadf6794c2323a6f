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

import os

import numpy as np

from search_spaces import isa
from search_spaces.gemm_engine.space import (LOOP_ORDERS, block_values, nr_values, pick_knob, repair,
                                             spill, split, threads_match_parallel, tiles_fit_micro,
                                             vec_values, with_splits)
from search_spaces.gemm_engine.space import vector_width as engine_vector_width
from search_spaces.isa import Isa
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.template import Template
from workloads.gemm import Gemm

MICROKERNELS = ("loops", "unrolled", "intrinsic")
GEMV_ROWS = 8   # M below this: the 'rowaxpy' formulation and parallel='k' join the space
MAX_UNROLLED_ACCUMULATORS = 256   # source size / compile time bound for "unrolled"
SMALL_PARALLEL_FLOPS = 2 * 96 ** 3   # default config: one thread below this much work


def native_lanes(dtype: str, target: Isa | None = None) -> int:
    """Elements of ``dtype`` in one vector register of the ISA generated for (16 fp32 lanes
    on AVX-512, 8 on AVX2)."""
    return (target or isa.current()).lanes(dtype)


def _k_tiles(w: Gemm) -> tuple[int, ...]:
    """tile_k values. Few rows of C (GEMV-like): B is streamed once, and thin K blocks keep the
    number of concurrent row streams within what the hardware prefetcher tracks."""
    return block_values(w.K, 4 if w.M < GEMV_ROWS else 32)


class GemmTemplate(Template):
    name = "gemm"
    version = 10   # 10: packing by the engine's packers (flat kc-deep panels, vector B copies)
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
            Knob("tile_m", with_splits(block_values(w.M, 16), w.M, max_threads), True, "rows of C per cache block (A block in L2)"),
            Knob("tile_n", with_splits(block_values(w.N, 16), w.N, max_threads), True, "columns of C per cache block (B block in L3/L2)"),
            Knob("tile_k", _k_tiles(w), True, "K depth per cache block (B micro-panel in L1)"),
            Knob("mr", (1, 2, 4, 6, 8, 12, 16), True, "rows of the register micro-tile"),
            Knob("nr", (1, L // 2) + nr_values(L) + (4 * L,), True, "columns of the register micro-tile"),
            Knob("loop_order", LOOP_ORDERS, False, "order of the block loops, outermost first"),
            Knob("pack_a", (False, True), False, "copy A blocks into contiguous MR-row panels"),
            Knob("pack_b", (False, True), False, "copy B blocks into contiguous NR-column panels"),
            Knob("microkernel", MICROKERNELS + (("rowaxpy",) if gemv else ()), False,
                 "how the micro-kernel is written ('rowaxpy': B streamed by rows, M < 8)"),
            Knob("vec", vec_values(L), True, "vector lanes of the intrinsic micro-kernel (ymm/zmm)"),
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

        def registers(c):
            # Accumulators, one row of B and an A broadcast must fit the register file
            # (isa.Isa.spill_reason); on AVX-512 this is the earlier "<= 28 accumulators".
            if c["microkernel"] in ("intrinsic", "unrolled"):
                reason = spill(target, c["mr"], c["nr"], c["vec"] if c["microkernel"] == "intrinsic" else L)
                if reason:
                    return reason
            if c["microkernel"] == "loops" and c["mr"] * c["nr"] > 2 * registers_total * L:
                return f"{c['mr']}x{c['nr']} accumulator tile is far larger than the register file"
            if c["microkernel"] == "unrolled" and c["mr"] * c["nr"] > MAX_UNROLLED_ACCUMULATORS:
                return f"{c['mr'] * c['nr']} unrolled scalar accumulators > {MAX_UNROLLED_ACCUMULATORS}"
            return None

        def vector_width(c):
            if c["microkernel"] == "intrinsic":
                return engine_vector_width(c)
            if c["vec"] != L:
                return f"vec only applies to microkernel='intrinsic' (keep vec={L})"
            return None

        def write_cache(c):
            if not c["write_cache"] and c["microkernel"] == "unrolled":
                return "microkernel 'unrolled' always keeps its accumulators in named scalars"
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

        # the engine's (search_spaces/gemm_engine/space.py), then this template's styles'
        return [tiles_fit_micro(w.M, w.N, multiple=False),
                Constraint("registers", registers),
                Constraint("vector_width", vector_width),
                Constraint("write_cache", write_cache),
                threads_match_parallel(),
                Constraint("rowaxpy", rowaxpy)]

    @staticmethod
    def _last(knob: str, w: Gemm) -> int:
        """The largest value of a tile knob (the one covering the dimension)."""
        if knob == "tile_m":
            return block_values(w.M, 16)[-1]
        return _k_tiles(w)[-1]

    # -- defaults and the ladder -----------------------------------------------------------
    def default_config(self, workload: Gemm, max_threads: int = 1) -> Config:
        """6 x 2L (AVX2) or 6 x 4L (AVX-512) intrinsic micro-kernel on packed panels (the BLIS
        structure, n/k/m blocks), 4 x 4L with A read in place on ``isa.A_IN_PLACE_CPUS``;
        with threads, the outermost (N) block loop is split so each thread gets equal work."""
        return self._default(workload, max_threads, a_in_place=isa.reads_a_in_place())

    def seed_configs(self, workload: Gemm, max_threads: int = 1) -> list[Config]:
        """The default, then the ISA's other default (A in place or packed, as the CPUs of
        ``isa.A_IN_PLACE_CPUS`` and the others take it) when it applies to the shape: on a CPU
        where the other formulation wins, a 64-trial search starts from it (on Zen 5 two
        64-trial runs from the packed default reached 0.87-0.88 of a 500-trial run's best,
        which was the in-place tile)."""
        here = isa.reads_a_in_place()
        first = self._default(workload, max_threads, a_in_place=here)
        other = self._default(workload, max_threads, a_in_place=not here)
        return [first] + ([other] if other != first else [])

    def _default(self, workload: Gemm, max_threads: int, a_in_place: bool) -> Config:
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
        tile_n = 1024 if threads == 1 or split(w.N, threads) > 1024 else split(w.N, threads)
        # AVX2 (6 x 16 fp32 tile: 12 + 2 + 1 of 16 ymm, no spill in the K loop) takes deeper K
        # blocks: 1024^3 on Zen 3, 1 thread, CPU time beside NumPy in one process (load ~12 from
        # other jobs): tile_k 384 0.82x, 512 0.87x, 768 0.87x, 1024 0.88x; 2 threads 512 also
        # ahead of 384 (docs/isa.md). AVX-512 keeps 384.
        deep_k = 384 if w.M >= 128 and isa.current().vector_bits >= 512 else 512
        # 32 vector registers (AVX-512) hold a 6 x 4-vector tile (24 + 4 + 1 = 29): Intel Xeon
        # (LLVM "rocketlake"), 2026-12-01, 1 thread, thread CPU time alternating with NumPy in
        # one process: 1024^3 0.86-0.88x -> 0.95-0.99x NumPy against 6 x 2 vectors, 256^3
        # 0.90x -> 0.94x (12 x 2 vectors: 0.96x / 0.95x; 8 x 3: 0.93x; 4 x 4: 0.87x).
        # (float32 only: the float64 and int32 tiles were not measured here and keep 2 vectors.)
        nv = 4 if w.dtype == "float32" and isa.current().registers >= 32 and w.N >= 8 * L else 2
        cfg = {
            "tile_m": pick_knob(sp, "tile_m", 96), "tile_n": pick_knob(sp, "tile_n", tile_n, at_least=True),
            "tile_k": pick_knob(sp, "tile_k", deep_k), "mr": 6, "nr": nv * L,
            "loop_order": "nkm", "pack_a": True, "pack_b": True, "microkernel": "intrinsic",
            "vec": L, "unroll_k": 1, "write_cache": True,
            "parallel": "n" if threads > 1 else "none", "threads": threads,
        }
        if nv == 4 and w.M >= 6 and w.M % 4 == 0 and w.N >= 64 * threads and a_in_place:
            # AMD Zen 5 and Zen 4 (``isa.A_IN_PLACE_CPUS``): 4 x 4 vectors with A read in place
            # (16 + 4 + 1 zmm; broadcasts straight from A's rows, no A packing), one 64-column
            # B panel per N block, K blocks up to 1024. Zen 5, 2026-12-02, 1 thread, thread CPU
            # time beside OpenBLAS 0.3.31 SkylakeX in one process: 256^3 0.83 -> 1.06x, 512^3
            # 0.93 -> 1.07x, 1024^3 0.90 -> 1.08x, 2048^3 0.89 -> 0.97x; 2 threads (ours alone,
            # wall) 1.22-1.55x faster than 6 x 4 packed; a 500-trial search at 2 threads picked
            # it (docs/isa.md). AMD Zen 4 (512-bit FMAs on two 256-bit pipes), 2026-12-06,
            # alternating with NumPy (OpenBLAS SkylakeX) in one process: 1 thread 256^3 0.96 ->
            # 1.10x, 512^3 0.99 -> 1.08x, 1024^3 1.02 -> 1.10x, 2048^3 0.99 -> 1.06x; 2
            # threads 512^3 0.90 -> 1.09x, 1024^3 0.98 -> 1.09x, 2048^3 0.99 -> 1.03x; a fresh
            # 64-trial `tune gemm` picked it (1.13x NumPy). M a multiple of 4: in-place rows
            # have no zero padding, and a partial tile would run the scalar edge kernel.
            cfg.update(mr=4, pack_a=False, tile_n=pick_knob(sp, "tile_n", 64),
                       tile_k=pick_knob(sp, "tile_k", 1024))
        if w.M < 6:
            # matrix-vector-like: a few rows of C, B streamed once in thin K blocks, unpacked
            mr = max(v for v in (1, 2, 4) if v <= w.M)
            # the widest row of B the registers hold beside mr accumulator rows (AVX-512: 4L)
            nv = max(v for v in (4, 3, 2, 1) if isa.current().spill_reason(mr, v) is None)
            cfg.update(mr=mr, nr=nv * L, pack_b=False, tile_k=pick_knob(sp, "tile_k", 8),
                       tile_n=pick_knob(sp, "tile_n", max(tile_n, 1024) if threads == 1 else tile_n))
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
        return repair(sp, cfg)

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
        blocking = {**naive, "tile_m": pick_knob(sp, "tile_m", 32), "tile_n": pick_knob(sp, "tile_n", 32),
                    "tile_k": pick_knob(sp, "tile_k", 128)}
        steps.append(("blocking", blocking))
        # vectorization: the inner j loop as one explicit SIMD vector (FMA into C)
        vectorization = {**blocking, "microkernel": "intrinsic", "nr": L}
        steps.append(("vectorization", vectorization))
        # loop permutation: K outside an 8-row x 2-vector inner tile (TVM's reorder(ko, mi, ki, ni)),
        # n/k/m block order (a B block is reused by every M block), larger blocks
        permutation = {**vectorization, "loop_order": "nkm", "mr": 8, "nr": 2 * L,
                       "tile_m": pick_knob(sp, "tile_m", 64),
                       "tile_n": pick_knob(sp, "tile_n", 256), "tile_k": pick_knob(sp, "tile_k", 256)}
        steps.append(("loop permutation", permutation))
        # packing: contiguous A and B panels
        packing = {**permutation, "pack_a": True, "pack_b": True}
        steps.append(("packing", packing))
        # write cache: a 6 x 2L register tile, C written once per block
        write_cache = {**packing, "write_cache": True, "mr": 6, "nr": 2 * L,
                       "tile_m": pick_knob(sp, "tile_m", 96), "tile_n": pick_knob(sp, "tile_n", 512)}
        steps.append(("write cache", write_cache))
        # parallel: the outermost (N) block loop over 2 threads
        parallel = {**write_cache, "parallel": "n", "threads": 2,
                    "tile_n": pick_knob(sp, "tile_n", 512 if split(w.N, 2) > 768 else split(w.N, 2),
                                    at_least=True)}
        steps.append(("parallel", parallel))
        return [(name, repair(sp, cfg)) for name, cfg in steps]

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
