"""Int8 GEMM template: C int32 = A uint8 (activations) @ B int8 (weights), exactly.

The float GEMM's BLIS structure (``gemm.py``: cache blocks in ``loop_order``, packed A and B,
an MR x NR register tile over a K block, ``parallel`` block loop), with the packing and the
micro-kernel of ``int8_microkernels.py``: K in groups of 4 bytes (or 2 int16), one group per
32-bit lane, accumulated by an explicit dot-product instruction (``simd_int8.py``).

Knob ``dot`` is the instruction, offered only where the CPU compiled for has it (the host's
features from llvmlite, or ``TUNER_CPU``'s; ``isa.compile_features``):

- ``madd16``: A and B widened to int16 while packing, ``vpmaddwd`` (AVX2 / AVX-512BW). Exact
  for every input.
- ``maddubs``: ``vpmaddubsw`` + ``vpmaddwd`` on the bytes. ``vpmaddubsw`` sums two u8 x s8
  products into a *saturating* int16, and 255 * 127 * 2 > 32767, so it is wrong for full-range
  weights: constraint ``exact`` allows it only for the ``int8w7`` workload (weights in
  [-64, 64]: 2 * 255 * 64 = 32640 fits).
- ``vnni``: ``vpdpbusd`` (AVX512-VNNI, or AVX-VNNI at 256 bits): products summed in int32,
  exact for every input.

``vec`` is the vector width (256, or 512 with AVX-512BW).
"""
from __future__ import annotations

import os

from search_spaces.gemm_engine.space import (INT8_PACK_OPS_PER_BYTE, LOOP_ORDERS, balanced_split,
                                             block_values, pick_knob, repair, split,
                                             threads_match_parallel, tiles_fit_micro, with_splits)
from search_spaces import isa
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.template import Template
from workloads.errors import InstantiationError
from workloads.gemm import INT8_DTYPES, Gemm

DOTS = ("madd16", "maddubs", "vnni")
SMALL_PARALLEL_FLOPS = 2 * 128 ** 3   # default config: one thread below this much work


def supported(dot: str, vec: int, features: frozenset[str]) -> bool:
    """Whether ``dot`` at ``vec`` bits compiles to real instructions on a CPU with ``features``."""
    if vec == 512:
        need = {"madd16": {"avx512bw"}, "maddubs": {"avx512bw"}, "vnni": {"avx512vnni"}}[dot]
        return need <= features
    if dot == "vnni":
        return {"avx512vnni", "avx512vl"} <= features or "avxvnni" in features
    return "avx2" in features


def vector_registers(features: frozenset[str]) -> int:
    return 32 if "avx512f" in features else 16


class GemmInt8Template(Template):
    name = "gemm_int8"
    # 5: tiles of a C over 1 MiB request their lines paced over K (``c_lines_paced``)
    version = 5   # 4: micro-kernel inlined into the block loops; 3: full B panels packed by vector shuffles (vnni, maddubs); 2: knob pack_a (A read in place)
    workload_kind = "gemm"
    dtypes = tuple(INT8_DTYPES)
    entry = "kernel"
    # cache blocks are kernel arguments, as in the float template (docs/compile-once.md)
    runtime_knobs = ("tile_m", "tile_n", "tile_k")

    def __init__(self, features: frozenset[str] | None = None):
        # None: the compile target's (``isa.compile_features``: the host's, or TUNER_CPU's);
        # tests pass another CPU's features to check its space
        self._features = features

    @property
    def features(self) -> frozenset[str]:
        return self._features if self._features is not None else isa.compile_features()

    def _check(self, w: Gemm) -> None:
        if w.dtype not in INT8_DTYPES:
            raise InstantiationError(f"template {self.name} computes {', '.join(INT8_DTYPES)}, not {w.dtype}")
        if "avx2" not in self.features:
            raise InstantiationError(f"template {self.name} needs AVX2; this CPU has none")

    # -- the space -----------------------------------------------------------------------
    def space(self, workload: Gemm, max_threads: int = 1) -> ConfigSpace:
        w = workload
        self._check(w)
        f = self.features
        vecs = tuple(v for v in (256, 512) if any(supported(d, v, f) for d in DOTS))
        dots = tuple(d for d in DOTS if any(supported(d, v, f) for v in vecs))
        lanes = vecs[0] // 32
        nrs = tuple(lanes * k for k in (1, 2, 3, 4)) + ((48, 64) if 512 in vecs else ())
        knobs = [
            Knob("tile_m", with_splits(block_values(w.M, 16), w.M, max_threads), True, "rows of C per cache block"),
            Knob("tile_n", with_splits(block_values(w.N, 16), w.N, max_threads), True, "columns of C per cache block"),
            Knob("tile_k", block_values(w.K, 64), True, "K depth per cache block (packed panels in L1/L2)"),
            Knob("mr", (1, 2, 3, 4, 6, 8), True, "rows of the register micro-tile"),
            Knob("nr", nrs, True, "columns of the register micro-tile (int32 lanes)"),
            Knob("loop_order", LOOP_ORDERS, False, "order of the block loops, outermost first"),
            Knob("dot", dots, False, "dot-product instruction (madd16 exact, maddubs saturating, vnni)"),
            Knob("vec", vecs, True, "vector bits"),
            Knob("unroll_k", (1, 2, 4), True, "unroll factor of the micro-kernel's K-group loop"),
            Knob("pack_a", (True, False), False, "copy A blocks into MR-row panels of K groups "
                 "(False: broadcast each row's groups from A itself)"),
            Knob("parallel", ("none", "m", "n"), False, "block loop run with numba.prange"),
            Knob("threads", tuple(range(1, max(1, max_threads) + 1)), True, "Numba threads"),
        ]
        return ConfigSpace(knobs, self._constraints(w))

    def _constraints(self, w: Gemm) -> list[Constraint]:
        f = self.features
        regs = vector_registers(f)

        def exact(c):
            if c["dot"] == "maddubs" and INT8_DTYPES[w.dtype] > 64:
                return ("maddubs saturates int16 pairs for weights outside [-64, 64] "
                        "(255*127*2 > 32767); exact only for dtype int8w7")
            return None

        def instruction(c):
            if not supported(c["dot"], c["vec"], f):
                return f"{c['dot']} at {c['vec']} bits is not supported by this CPU"
            return None

        def vector_width(c):
            lanes = c["vec"] // 32
            if c["nr"] % lanes:
                return f"nr={c['nr']} is not a multiple of the {lanes} int32 lanes of vec={c['vec']}"
            return None

        def registers(c):
            acc = c["mr"] * c["nr"] // (c["vec"] // 32)
            # plus one A broadcast and one temporary; B vectors (and maddubs's ones) can be
            # memory operands of the dot-product instruction
            live = acc + 2
            if live > regs:
                return f"{acc} accumulators + operands = {live} vector registers > {regs}"
            return None

        def a_in_place(c):
            if c["pack_a"]:
                return None
            if c["dot"] == "madd16":
                return "madd16 reads A widened to int16: A must be packed (pack_a=True)"
            if w.K % 4:
                return f"A read in place needs K={w.K} a multiple of the 4-byte groups"
            return None

        return [Constraint("exact", exact), Constraint("isa", instruction),
                Constraint("a_in_place", a_in_place),
                Constraint("vector_width", vector_width), Constraint("registers", registers),
                tiles_fit_micro(w.M, w.N, multiple=False), threads_match_parallel()]

    # -- defaults --------------------------------------------------------------------------
    def default_dot(self, w: Gemm) -> str:
        """The fastest exact instruction for this workload on this CPU."""
        vec = self.default_vec()
        if supported("vnni", vec, self.features):
            return "vnni"
        return "maddubs" if INT8_DTYPES[w.dtype] <= 64 else "madd16"

    def default_vec(self) -> int:
        return 512 if supported("madd16", 512, self.features) else 256

    def default_config(self, workload: Gemm, max_threads: int = 1, *, anchor: bool = False) -> Config:
        """A 4 (maddubs, vnni) or 6 (madd16) x 2-vector tile on packed panels, n/k/m blocks;
        with threads, N split evenly. VNNI at 512 bits: 6 x 4 vectors, or 8 x 2 for the int8
        anchors (``anchor``: their NCHW register requantize stores 4 rows at a time)."""
        w = workload
        sp = self.space(w, max_threads)
        vec = self.default_vec()
        lanes = vec // 32
        threads = 1 if w.flops() < SMALL_PARALLEL_FLOPS else max(1, max_threads)
        tile_n = 1024 if threads == 1 or split(w.N, threads) > 1024 else split(w.N, threads)
        dot = self.default_dot(w)
        # Measured at 1024^3, 1 thread, znver3 (thread CPU time, alternating, shared machine):
        # maddubs 4 x 16 unrolled by 2 157 GOPS (6 x 16: 127, 4 x 24: 131, not unrolled: 145);
        # madd16 6 x 16 128 GOPS (4 x 16: 113). Blocks: the whole K (1024) with 48-row A blocks
        # beat 96 x 512 and the tuned 128 x 512 (maddubs 13.0 vs 14.9 and 16.0 ms; madd16 17.1
        # vs 18.4 ms): one K block stores C once, and a 48 x 1024 A block stays in L2.
        mr, unroll = (6, 1) if dot == "madd16" else (4, 2)
        nv = 2
        # VNNI at 512 bits, Intel Xeon (LLVM "rocketlake"), 2026-12-01, 1 thread, thread CPU
        # time, alternating. GEMM 1024^3: 6 x 64 (24 accumulators + 2 of 32 zmm) 4.05-4.16 ms
        # against 5.01-5.05 for 4 x 32 (1.21-1.24x; 8 x 48 and 8 x 32 1.15x, 6 x 48 1.09x).
        # The anchors (qconv2d + requantize in registers, ResNet-50 stage-2 layers, NCHW and
        # NHWC): 8 x 32 1.03-1.26x against 4 x 32 on all 8 layers, 4 x 64 1.02-1.20x.
        if dot == "vnni" and vec == 512 and w.M >= (8 if anchor else 6) and w.N >= (2 if anchor else 8) * lanes:
            mr, nv = (8, 2) if anchor else (6, 4)
        # A read in place (``isa.A_IN_PLACE_CPUS``): no A block copied byte by byte, and
        # at 2 threads no thread packing all of A for its N half. AMD Zen 5 (two 512-bit
        # pipes, as the float GEMM), 1024^3, 1 thread, paired: 4 x 64 in place 1.12-1.13x the
        # packed 6 x 64 (3.24 vs 3.66 ms median; 6 x 64 in place 1.10x, 6 x 48 1.02x). AMD
        # Zen 4 (512-bit ops on 256-bit pipes), 1024^3, alternating with ONNX Runtime's
        # MatMulInteger in one process, 2026-12-06: 1 thread 6 x 64 in place 0.94-1.00x ORT,
        # packed 0.89-0.91x, 4 x 64 in place 0.92-0.93x; 2 threads 1.02x, 0.92x, 1.03x.
        in_place = (not anchor and dot == "vnni" and vec == 512 and w.K % 4 == 0 and w.M >= 4
                    and w.N >= 4 * lanes and isa.reads_a_in_place())
        if in_place:
            mr, nv = isa.int8_in_place_rows(mr), 4
        # AVX2 maddubs reads A in place too, same 4 x 16 tile: AMD Zen 3, 1024^3 int8w7, the
        # micro-kernel inlined (v4), alternating with ORT's MatMulInteger in one process,
        # 2026-12-04: 1 thread 0.98-0.99x ORT against 0.93-0.95x packed (packing A by bytes
        # is 0.47 ms of ~13); 2 threads 0.99-1.21x against 0.90-0.92x (each thread packed all
        # of A for its N half)
        if not anchor and dot == "maddubs" and vec == 256 and w.K % 4 == 0:
            in_place = True
        # a few rows of C (GEMV-like): no taller tile than there are rows (padding is work)
        mr = max(v for v in sp.knob("mr").values if v <= max(1, min(mr, w.M)))
        cfg = {"tile_m": pick_knob(sp, "tile_m", 48), "tile_n": pick_knob(sp, "tile_n", tile_n, at_least=True),
               "tile_k": pick_knob(sp, "tile_k", 1024), "mr": mr, "nr": nv * lanes, "loop_order": "nkm",
               "dot": dot, "vec": vec, "unroll_k": unroll, "pack_a": not in_place,
               "parallel": "n" if threads > 1 else "none", "threads": threads}
        if anchor and threads > 1:
            cfg = self._anchor_split(sp, repair(sp, cfg), w)
        return repair(sp, cfg)

    @staticmethod
    def _anchor_split(sp: ConfigSpace, cfg: dict, w: Gemm) -> dict:
        """The parallel axis of a model's int8 anchor. Its B (the weights) is packed ahead,
        but A (a conv's im2col) is packed by every thread that needs it: split over N, each
        thread packs all of A. ``balanced_split`` weighs that against the evenness of an M
        split, and an M split takes the whole N in one block (an N loop outside the parallel
        M loop would pack A once per N block). Zen 3, ResNet-50 INT8 at 2 threads, the
        graph built both ways in one process, per layer against the N split: M3136 N64 K576
        1.24-1.26x, M12544 N64 K147 1.23x, M784 N128 K1152 1.14x; an M split of the M196 and
        M49 layers measured 0.62-0.80x, and they stay on N."""
        cfg = balanced_split(sp, cfg, w.M, w.N, shared_a=(w.K, w.M * w.K),
                             per_shared_byte=INT8_PACK_OPS_PER_BYTE)
        if cfg["parallel"] == "m":
            cfg["tile_n"] = pick_knob(sp, "tile_n", min(w.N, 1024), at_least=True)
        return cfg

    # -- code generation -------------------------------------------------------------------
    def codegen(self, workload: Gemm, config: Config) -> str:
        w = workload
        c = dict(config)
        sp = self.space(w, max_threads=max(int(c.get("threads", 1)), os.cpu_count() or 1))
        sp.validate(config)
        from search_spaces.gemm_engine.int8_microkernels import generate

        return generate(w, c, self.version, self.name, self.runtime_knobs)

    def runtime_args(self, workload: Gemm, config: Config) -> tuple:
        """The cache blocks, clipped to the shape, in ``runtime_knobs`` order."""
        from search_spaces.gemm_engine.blocked import clipped_tiles

        tiles = clipped_tiles(workload, config)
        return tuple(tiles[k] for k in self.runtime_knobs)
