"""conv2d template: a convolution with its fused epilogue as an (implicit) GEMM.

Formulations, decided by the layout the graph has and by the knobs:

- NHWC data, HWIO weights (the O3 pipeline): ``out[N*OH*OW, O] = im2col(x)[P, K] @ W[K, O]``
  with K = KH*KW*C, by default a direct convolution: A's rows are read in place, each output
  pixel's window of the zero-padded image (``pack_a=False``: A source ``window_nhwc``, no
  im2col copy), or packed straight from the image (``pack_a=True``: implicit im2col). The
  weights are B, read in place (``pack_b=False``) or packed once per build into whole-K
  NR-column panels (``pack_b=True``: B source ``prepacked``, the module's ``prepare``).
- NCHW data, OIHW weights (O2, the default): per image ``out[O, OH*OW] = W[O, K] @
  im2col(x)[K, P]`` with K = C*KH*KW. The weights are A (in place or packed), the image is B,
  packed by implicit im2col (forced) except for a 1x1/stride-1/unpadded conv.
- Grouped convolution (NCHW/OIHW, ``1 < groups``, more than one input channel per group;
  depthwise convs have their own template): ``groups`` GEMMs per image, ``out[g*Og:(g+1)*Og,
  P] = W[g*Og:(g+1)*Og, K] @ im2col(x[g*Cg:(g+1)*Cg])[K, P]`` with K = Cg*KH*KW: the same core
  with per-group base offsets into the weights, the image's channels and the output's channels
  (per-channel epilogue operands are sliced per group), so the knobs, constraints and repair
  are the ungrouped conv's.

Both feed the register-tiled LLVM-vector micro-kernel of ``search_spaces.gemm_engine.core`` (the GEMM
template's formulation) and apply the epilogue (bias, scale/shift, residual, relu/clip...) to
each output tile while it is in L1. Knobs: cache tiles, micro-tile (mr, nr, vec), loop order,
packing, parallel axis and threads.
"""
from __future__ import annotations

import json
from typing import Mapping

from search_spaces.gemm_engine import core
from search_spaces.gemm_engine.space import (best_nr, core_constraints, core_knobs,
                                             default_core_config)
from search_spaces import isa
from search_spaces.epilogue import Epilogue
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.templates.features import split_efficiency
from workloads.errors import InstantiationError

# The largest whole-K weight panel (K x NR float32) an NHWC conv's default runs as one K block
# on 16-register ISAs (AVX2): 1536 x 64 lanes x 4 bytes, the panel of the K <= 1536 limit at
# AVX-512's 64-wide tiles; AVX2's 16-wide panels reach it at K = 6144.
ONE_K_PANEL_BYTES = 1536 * 64 * 4
# Rows of padding (a share of M) from which an NHWC default on a 32-register ISA takes
# 7-row tiles instead, where those pad less (``_nhwc_default``: M = 49 pads 10% at 6 rows)
ROW_PADDING = 0.05
# The runtime dimensions placing a direct conv's output inside a larger array (``core.out_rows``):
# interior offset (rows, columns), the array's rows and columns, its channels per pixel and
# the first channel written (a zero-bordered image, or a concatenation over channels).
HANDOFF_DIMS = ("OPT", "OPL", "OHP", "OWP", "OLD", "OCO")


# Where the threads split N, a 3-vector tile gives way to 2 vectors when that evens the
# threads' columns (``_nhwc_default``); a switch for A/B comparisons.
BALANCED_PANELS = True


def _widest_share(N: int, nr: int, threads: int) -> int:
    """Columns of the busiest thread when ``threads`` split N's NR-wide panels."""
    panels = -(-N // nr)
    return -(-panels // threads) * nr


def pad_rows(M: int, mr: int) -> float:
    """The share of M that MR-row tiles compute in excess: ceil(M / mr) * mr / M - 1."""
    return -(-M // mr) * mr / M - 1


class Conv2dTemplate(core.ShapeGenericTemplate):
    name = "conv2d"
    # 4: shared B blocks packed by every thread (pack_b_split), two-chain narrow kernel;
    # 5: a per-channel prologue (batch norm + relu before a 1x1 conv) applied in pack_b;
    # 6: the split packing a prange of the parallel core (no parallel function of its own),
    # the edge kernel only where a tile can be partial, helpers without wrappers or cache
    # 7: NHWC convs read their image through the windows in place (``window_nhwc``)
    # 8: parallel 'm' and 'n' with neither operand packed per call are one grid module
    #    whose blocks are arguments (``core.grid_split``)
    # 9: 64-column window tiles request their output lines paced over K (``core.paces_output``)
    # 10: direct NHWC convs store through a table of output rows (``core.out_rows``) and
    #     take their image already padded (PREPAD): a producer writes its consumer's input
    # 11: the table holds each pixel's offset, with the output's channels per pixel (OLD) and
    #     first channel (OCO): a producer writes its channels of a concatenation in place
    version = 11
    workload_kind = "conv2d"
    entry = "kernel"
    # Cache blocks are arguments (with the shape and geometry: ``dims``); configs differing in
    # them share a module (one K block or several is a runtime choice of the store too).
    runtime_knobs = ("tile_m", "tile_n", "tile_k")
    # Dimensions kept as module constants: the window (measured, docs/compile-once.md: the
    # im2col packing's index arithmetic with a runtime window cost 4-6% on 3x3 layers, with
    # a literal one nothing); layers share a module per window, not per image size.
    literal_dims: tuple[str, ...] = ("KH", "KW", "SH", "SW", "PT", "PL", "DH", "DW")
    # ... but the stride is an argument of a direct NHWC conv (``window_nhwc``), which reads it
    # once per M block (``core.pixel_rows``): its 3 x 3 layers of stride 1 and 2 share a module
    # (ResNet-50: three fewer modules, ~6 s of CPU each to compile; docs/compile-once.md,
    # "Strides as arguments of direct convolutions")
    window_runtime_dims: tuple[str, ...] = ("SH", "SW")

    # -- shape of the GEMM -------------------------------------------------------------------
    @staticmethod
    def plan(w) -> dict:
        g = w.geometry
        groups = g["groups"]
        pointwise = (g["KH"] == g["KW"] == 1 and g["SH"] == g["SW"] == 1
                     and g["PT"] == g["PL"] == 0 and g["OH"] == g["H"] and g["OW"] == g["W"])
        if groups > 1 and (g["data_layout"], g["kernel_layout"]) != ("NCHW", "OIHW"):
            raise InstantiationError(f"grouped conv2d (groups={groups}) is generated for "
                                     f"NCHW/OIHW only, not {g['data_layout']}/{g['kernel_layout']}")
        if groups > 1 and (g["C"] % groups or g["O"] % groups):
            raise InstantiationError(f"groups={groups} does not divide C={g['C']} and O={g['O']}")
        if g["data_layout"] == "NHWC" and g["kernel_layout"] == "HWIO":
            return {"layout": "NHWC", "M": g["N"] * g["OH"] * g["OW"], "N": g["O"],
                    "K": g["KH"] * g["KW"] * g["C"], "batches": 1,
                    "a": "direct" if pointwise else "im2col_nhwc", "b": "direct",
                    "rows": (0, 1, 2), "cols": (3,), "pointwise": pointwise, "groups": 1,
                    "image": g["N"] * g["H"] * g["W"] * g["C"]}
        if g["data_layout"] == "NCHW" and g["kernel_layout"] == "OIHW":
            return {"layout": "NCHW", "M": g["O"] // groups, "N": g["OH"] * g["OW"],
                    "K": g["C"] // groups * g["KH"] * g["KW"], "batches": g["N"],
                    "a": "direct", "b": "direct" if pointwise else "im2col_nchw",
                    "rows": (1,), "cols": (2, 3), "pointwise": pointwise, "groups": groups}
        raise InstantiationError(f"conv2d layouts {g['data_layout']}/{g['kernel_layout']} are not "
                                 "generated (NHWC/HWIO or NCHW/OIHW)")

    @staticmethod
    def epilogue(w, pl: dict) -> Epilogue:
        """The group's epilogue (ops on the conv's output) over the plan's row and column axes."""
        return Epilogue(w.epilogue, w.out_shape, w.dtype, pl["rows"], pl["cols"])

    @staticmethod
    def prologue(w) -> Epilogue | None:
        """The group's prologue (ops on the image before the conv, ``FuseOps``' per-channel
        chains) as code applied by ``pack_b`` to each image row (one input channel): operand
        names ``q<k>``; None without one. Only a pointwise NCHW conv packs its image as plain
        rows, so only it takes one."""
        if not w.prologue:
            return None
        pl = Conv2dTemplate.plan(w)
        if pl["layout"] != "NCHW" or not pl["pointwise"] or pl["groups"] != 1:
            raise InstantiationError("a conv2d prologue is generated for pointwise NCHW convs only")
        x_shape = tuple(w.p["inputs"][w.p["anchor_inputs"][0]][0])
        pro = Epilogue(w.prologue, x_shape, w.dtype, (1,), (2, 3), prefix="q")
        if set(pro.operands.values()) - {"row", "scalar"} or not pro.vectorizable():
            raise InstantiationError("a conv2d prologue needs per-channel operands and vector ops")
        return pro

    @staticmethod
    def a_source(pl: dict, c: Mapping) -> str:
        """Where A comes from: a conv's NHWC image is read through its windows in place
        (``window_nhwc``: a direct convolution) or packed by implicit im2col (``pack_a``)."""
        if pl["layout"] == "NHWC" and not c["pack_a"]:
            # pointwise too: a partial tile repeats its last pixel instead of running the
            # scalar edge kernel of an A read in place (M = 196, 8 rows: 1.26 -> 0.68 ms)
            return "window_nhwc"
        if pl["a"] == "direct":
            return "pack" if c["pack_a"] else "direct"
        return pl["a"]

    @staticmethod
    def b_source(pl: dict, c: Mapping) -> str:
        """Where B comes from: the image packed per call (NCHW), or the weights read in place,
        or (NHWC, ``pack_b``) packed once per weight as whole-K panels (``prepacked``)."""
        if pl["b"] != "direct":
            return pl["b"]
        if not c["pack_b"]:
            return "direct"
        return "prepacked" if pl["layout"] == "NHWC" else "pack"

    def prepared_inputs(self, workload, config) -> tuple[int, ...]:
        """The weight, where it is packed once (``prepacked``: NHWC with ``pack_b``)."""
        if self.b_source(self.plan(workload), config) == "prepacked":
            return (workload.p["anchor_inputs"][1],)
        return ()

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        pl = self.plan(workload)
        # NHWC: pack_a=False reads the image in place (through its windows when not pointwise)
        pack_a = (True,) if pl["a"] not in ("direct", "im2col_nhwc") else (False, True)
        # a prologue is applied while the image is packed: B is always packed then
        pack_b = (True,) if pl["b"] != "direct" or workload.prologue else (False, True)
        target = isa.current()
        knobs = core_knobs(pl["M"], pl["N"], pl["K"], max_threads, pack_a, pack_b,
                           workload.dtype, target)
        if pl["layout"] == "NHWC":
            # the direct conv's tiles may be 4 vectors wide (its B panels are prepacked or
            # read in place: no per-call packing code for the width)
            L = target.lanes(workload.dtype)
            knobs = [Knob("nr", k.values + (4 * L,), True, k.doc) if k.name == "nr" else k
                     for k in knobs]
        if pl["groups"] > 1:
            # a grouped conv may also run its groups in parallel, each GEMM on one thread
            knobs = [Knob("parallel", ("none", "m", "n", "g"), False,
                          "block loop run with numba.prange ('g': the groups)")
                     if k.name == "parallel" else k for k in knobs]
        constraints = core_constraints(pl["M"], pl["N"], target)
        if pl["layout"] == "NHWC":
            N = pl["N"]

            def window_edge(c):
                # the scalar edge kernel reads A with GEMM strides: not through windows
                if not c["pack_a"] and not c["pack_b"] and N % c["nr"]:
                    return (f"a window A (pack_a=False) with B in place needs nr={c['nr']} to "
                            f"divide N={N} (no edge kernel): pack B")
                return None
            constraints.append(Constraint("window_edge", window_edge))
        return ConfigSpace(knobs, constraints)

    def default_config(self, workload, max_threads: int = 1) -> Config:
        pl = self.plan(workload)
        sp = self.space(workload, max_threads)
        if pl["layout"] == "NHWC":
            return self._nhwc_default(sp, pl, max_threads)
        else:
            # Measured (ResNet-50 shapes, 1 thread, CPU time beside BLAS, v2): the weights
            # read in place are never slower than packed per call (and 15% faster at
            # M256 N196 K2304); an 8 x 32 micro-tile beats 6 x 16 at N = 196 (0.90x vs
            # 0.74x of BLAS), so the 32-wide tile is taken up to 15% N padding, with 8 rows.
            # v3 (vector packing): the image packed is faster for pointwise convs at every N
            # too (N = 3136: 1.44 -> 1.11 ms at K=64 with a residual, 2.42 -> 2.10 ms at
            # K=256; no scalar edge tiles), so B is always packed.
            pack_b = True
            # An MR that divides M (the weights are read in place: a partial tile would be the
            # scalar edge kernel); 8 rows up to NR = 32 (N = 49, 16-wide tiles: 8 rows 2.88 ms,
            # 6 rows 3.11 ms at K = 4608). Where no MR divides M the weights are packed
            # (zero-padded panels, no scalar rows): ShuffleNet's grouped 1x1 convs, M = 34 per
            # group, K = 34, N = 784, Zen 3, 1 thread, CPU time, paired: 222 -> 142 us and
            # 243 -> 159 us; at M = 24 (divisible) packing costs 7% (375 -> 401 us).
            # v3, paired runs: below N = 1024 an 8 x 16 tile beats 8 x 32 / 4 x 48 (N = 196:
            # 4-9%, N = 784: 2-5%, N = 169/729: 2-3%); at N = 3136 it loses 10% to 4 x 48.
            # Widths are in elements (16, 32, 48 on AVX-512 fp32); rows are those that fit the
            # register file beside them (isa.Isa.spill_reason). AVX2 (16 ymm): 4 rows x 3 vectors (12 + 3 + 1 = 16) at every N. ResNet-50 NCHW
            # convs, Zen 3, 1 thread, CPU time, paired (load ~11 from other jobs): 4 x 24 beat
            # 4 x 16 on 7 of 8 layers (sum 53.1 vs 55.1 ms), 8 x 8 was 1.9x slower, 6 x 16 with
            # A packed (M % 6 != 0) 1.2x slower; the AVX-512-shaped 8 x 16 / 16-lane tile
            # (what ran here before) 2.4-2.9x slower (docs/isa.md).
            # AVX-512 (32 zmm), Intel Xeon (LLVM "rocketlake", 2026-12-01, ResNet-50 NCHW convs,
            # 1 thread, thread CPU time, alternating, /tmp-only A/B through dispatch.load_kernel):
            # 8 rows x 2 vectors (16 accumulators) beats the 8 x 16 tile fitted on Zen 4 at
            # every N below 1024 (N = 196: 1.17x and 1.19x; N = 784: 1.15x, 1.17x; N = 49:
            # 1.12x), and 8 x 48 (24 accumulators, 28 of 32 registers) beats 4 x 48 at
            # N = 3136 (1.24x). Zen 4 (512-bit ops on 256-bit units) had preferred 8 x 16 by
            # 2-9% under conv2d v3.
            nrs = sp.knob("nr").values
            vec = sp.knob("vec").values[-1]
            if isa.current().registers < 32:
                nr = nrs[-1]
            else:
                nr = 2 * vec if pl["N"] < 1024 else best_nr(pl["N"], nrs, threshold=1.15)
            rows = [r for r in ((8, 6, 4) if nr <= 2 * vec or isa.current().registers >= 32 else (4, 6, 8))
                    if isa.current().spill_reason(r, nr // vec) is None]
            mr = next((r for r in rows if pl["M"] % r == 0), None)
            pack_a = mr is None
            mr = mr or rows[0]
            cfg = default_core_config(sp, pl["M"], pl["N"], pl["K"], max_threads, pack_a,
                                      pack_b, nr=nr, mr=mr)
            # One K block up to K = 1536 (no second pass over the output; paired runs: the
            # stem K=147 2.70 -> 2.54 ms, K=576 -2.5%, K=864/1152 -3 to -5%; at K=2304 three
            # or five blocks are equal).
            ks = [v for v in sp.knob("tile_k").values if v >= pl["K"]]
            if ks and pl["K"] <= 1536:
                cfg = cfg.replace(tile_k=ks[0])
            return self._group_split(cfg, pl)
        return default_core_config(sp, pl["M"], pl["N"], pl["K"], max_threads, pack_a, pack_b)

    @staticmethod
    def _nhwc_default(sp: ConfigSpace, pl: dict, max_threads: int) -> Config:
        """A direct convolution: the image read in place through its windows (``window_nhwc``),
        the HWIO weights packed once per build (``prepacked``); 6 pixels x 4 vectors of
        channels where 4 vectors divide the channels (24 + 4 + 1 = 29 of 32 registers), 8 x 3
        where 3 do, else 8 x 2 (AVX2: 6 x 2 whatever the channels).

        Measured (AMD Zen 5, 1 thread, ResNet-50's NHWC layers beside one another, paired):
        4 x 64 against 8 x 32 0.93x time on the 1x1 K = 64 expansion (0.62 vs 0.67 ms),
        0.95x on the 14 x 14 3x3 (1.16 vs 1.22 ms), equal on 56 x 56 3x3; 6 x 48 (panels
        padding 256 channels to 288) 1.0-1.5x slower. Channels that fit one vector get a
        one-vector tile: SqueezeNet's 1x1 squeezes to 16 channels at 55 x 55, 8 x 16 against
        8 x 32 (half of it padding): 0.068 vs 0.142 ms (K = 64), 0.083 vs 0.168 ms (K = 128);
        12 or 16 rows of one vector were no faster (0.070, 0.094-0.101 ms).

        Intel Xeon (LLVM ``rocketlake``, 2026-12-03, ResNet-50's twelve heaviest NHWC conv
        tasks, tuning worker, two passes in opposite orders, the better kept): 6 x 64 against
        4 x 64 1.05-1.44x faster on ten of twelve at 1 thread (3x3 196 x 256 x 2304: 1.44x,
        3136 x 64 x 576: 1.23x, 49 x 512 x 4608: 1.19x), 0.98x on the 7 x 7 stem, 1.03x on
        the strided 3x3; at 2 threads 0.97-1.33x. Again once the weight panels were
        aligned (``empty_aligned``; before, a worker's panels sat on or off a cache line by
        chance): 6 x 64 1.05-1.16x faster than 4 x 64 on eleven of the twelve (`bench tiles`,
        docs/isa.md). Each B row of a whole-K panel (streamed from L2 when the panel
        outgrows L1) now feeds 6 pixels instead of 4. (Zen 5's measurements above compared
        4 x 64 with 8 x 32 and 6 x 48, not with 6 x 64.) Where 4 vectors do not divide the
        channels but 3 do (within 1% padding), 8 x 48 against 8 x 32: Inception v2's N = 96
        layers 1.06-1.10x, SqueezeNet's N = 1000 classifier 1.17x; with more padding it lost
        (N = 160: 0.87x, N = 224: 0.96x).

        7 x 7 outputs (M = 49) in 6-row tiles compute 54 rows, in 8-row tiles 56: where a
        tile height pads M by ROW_PADDING or more and 7 rows pad less, the tile is 7 rows of
        (at most) 2 vectors, 14 + 2 + 1 registers (7 x 4 vectors spill two accumulators per
        K step). AMD Zen 4, `bench tiles --rows 49 --variants '[{"mr": 7, "nr": 32}]'`, both
        orders in the tuning worker, 2026-12-06: ResNet-50's four M = 49 tasks 1.07-1.10x
        at 1 thread (7 x 48: 1.06-1.09x, 7 x 64: 0.94-1.07x), 1.02-1.11x at 2; DenseNet-121's
        sixteen 1.06-1.13x, Inception v2's ten 1.07-1.15x (one 1.00); on the layers whose M
        6 divides within 1%, 7 x 32 ran 0.92-1.04x of 6 x 64 (docs/isa.md, "Seven-row tiles
        for 7 x 7 outputs").

        Where the threads split N (``parallel='n'``) and 3-vector panels leave one thread more
        columns than 2-vector panels would, the tile is 8 x 2 vectors: SqueezeNet's 1000-class
        conv (M169 N1000 K512) at 2 threads ran 11 + 10 panels of 48 (528 columns on one
        thread), now 16 + 16 of 32; the model, both builds in one process, 20 and 24
        alternating rounds: 1.006x and 1.005x (13 and 16 rounds faster), outputs identical; at
        1 thread 8 x 48 stays (8 x 32 0.94x there, `bench tiles --rows 169`). No other layer of
        the nine light models changes (AMD Zen 4, 2026-12-07)."""
        vec, N = sp.knob("vec").values[-1], pl["N"]
        big = isa.current().registers >= 32
        if big and N % (4 * vec) == 0:
            nr, mr = 4 * vec, 6
        elif big and N > 2 * vec and -(-N // (3 * vec)) * 3 * vec <= 1.01 * N:
            nr, mr = 3 * vec, 8        # 24 + 3 + 1 = 28 registers, at most 1% padding
        else:
            nr, mr = (vec if N <= vec else 2 * vec), (8 if big else 6)
        if big and pad_rows(pl["M"], mr) >= ROW_PADDING and pad_rows(pl["M"], 7) < pad_rows(pl["M"], mr):
            nr, mr = min(nr, 2 * vec), 7   # 7 x 64 would spill: 28 + 4 + 1 > 32
        pack_b = True
        # A is the image, read in place through the windows: what a split over N shares,
        # and no packed A block whose size a long block of pixels would grow (direct_conv)
        cfg = default_core_config(sp, pl["M"], pl["N"], pl["K"], max_threads, False, pack_b,
                                  nr=nr, mr=mr, a_bytes=pl["image"] * 4, direct_conv=True)
        if (BALANCED_PANELS and nr == 3 * vec and cfg["parallel"] == "n"
                and _widest_share(N, 2 * vec, max_threads) < _widest_share(N, nr, max_threads)):
            cfg = default_core_config(sp, pl["M"], pl["N"], pl["K"], max_threads, False, pack_b,
                                      nr=2 * vec, mr=8, a_bytes=pl["image"] * 4, direct_conv=True)
        # One K block (no second pass over the output) up to K = 1536; on AVX2 while a
        # whole-K weight panel is at most ONE_K_PANEL_BYTES (K <= 6144 at 16-wide panels).
        # AMD Zen 2, 1 thread, `bench tiles` (tile_k 512 -> one block of 3072 or 6144):
        # ResNet-50's 3x3 M196 N256 K2304 1.10-1.13x, M49 N512 K4608 1.02-1.09x; VGG-19's
        # M3136 N256 K2304 1.15x, M784 N512 K4608 1.06x, M196 N512 K4608 1.09x (docs/isa.md,
        # "One K block on AVX2"). Not measured on AVX-512 (its 32- and 48-wide panels keep
        # the 1536 limit).
        ks = [v for v in sp.knob("tile_k").values if v >= pl["K"]]
        if ks and (pl["K"] <= 1536 or (not big and pl["K"] * nr * 4 <= ONE_K_PANEL_BYTES)):
            cfg = cfg.replace(tile_k=ks[0])
        elif big and isa.long_k_block() in sp.knob("tile_k").values:
            # fewer, longer K blocks where measured (``isa.LONG_K_BLOCK``): each block after
            # the first reads and writes the whole output again
            cfg = cfg.replace(tile_k=isa.long_k_block())
        return cfg

    @staticmethod
    def _group_split(cfg: Config, pl: dict) -> Config:
        """Groups in parallel (one region per call, each group's GEMM on one thread) where
        they split across the threads at least as evenly as the blocks of one GEMM: one
        parallel region instead of one per group. ShuffleNet's grouped 1x1 convs (4 groups,
        M = 34-136 rows each, N = 49-784) split their blocks 62% busy on 2 threads, their
        groups 100%."""
        T = int(cfg["threads"])
        if pl["groups"] < 2 or T < 2:
            return cfg
        axis = cfg["parallel"]
        blocks = split_efficiency(pl["M"] if axis == "m" else pl["N"],
                                  cfg["tile_m"] if axis == "m" else cfg["tile_n"], T)
        return cfg.replace(parallel="g") if split_efficiency(pl["groups"], 1, T) >= blocks else cfg

    def domain_features(self, params, config, caches=None) -> dict:
        return conv2d_features(params, config, caches)

    # -- shape-generic modules -------------------------------------------------------------
    def dims(self, w, config) -> core.Dims:
        """The GEMM's shape, the cache blocks and the convolution's geometry: arguments of the
        kernel (``literal_dims`` stay module constants), so layers whose configs share the
        micro-kernel variant share one module (docs/compile-once.md)."""
        pl, g = self.plan(w), w.geometry
        a_src, b_src = self.a_source(pl, config), self.b_source(pl, config)
        epi = self.epilogue(w, pl)
        values = core.gemm_dims(pl["M"], pl["N"], pl["K"], config, b_src, w.dtype, a_src,
                                1 + len(core.full_operands(epi)))
        values.update({"H": g["H"], "W": g["W"], "CI": g["C"], "KH": g["KH"], "KW": g["KW"],
                       "OH": g["OH"], "OW": g["OW"], "SH": g["SH"], "SW": g["SW"],
                       "PT": g["PT"], "PL": g["PL"], "DH": g["DH"], "DW": g["DW"],
                       "IMAGES": pl["batches"]})
        if pl["groups"] > 1:
            values.update({"GROUPS": pl["groups"], "CG": g["C"] // pl["groups"]})
        if a_src == "window_nhwc":
            hp, wp = self.padded(g)
            values.update({"NIMG": g["N"], "HP": hp, "WP": wp})
            # where the output's interior sits (``core.out_rows``): none by default; a build
            # sets them where this conv writes its consumer's padded input
            # (``tuner.compiler.handoff``), and PREPAD where this conv's image comes padded
            values.update(dict(zip(HANDOFF_DIMS, (0, 0, g["OH"], g["OW"], pl["N"], 0))))
            if (hp, wp) != (g["H"], g["W"]):
                values["PREPAD"] = 0
            return core.Dims(values, [d for d in self.literal_dims if d not in self.window_runtime_dims])
        return core.Dims(values, self.literal_dims)

    @staticmethod
    def padded(g) -> tuple[int, int]:
        """Rows and columns of the zero-padded image every window of the output reads."""
        return (max(g["PT"] + g["H"], (g["OH"] - 1) * g["SH"] + (g["KH"] - 1) * g["DH"] + 1),
                max(g["PL"] + g["W"], (g["OW"] - 1) * g["SW"] + (g["KW"] - 1) * g["DW"] + 1))

    def codegen(self, workload, config: Config) -> str:
        w = workload
        c = dict(config)
        self.space(w, max(int(c.get("threads", 1)), 1)).validate(config)
        pl = self.plan(w)
        g = w.geometry
        x_idx, w_idx = w.p["anchor_inputs"]
        epi = self.epilogue(w, pl)
        pro = self.prologue(w)
        a_src = self.a_source(pl, c)
        b_src = self.b_source(pl, c)
        G = pl["groups"]
        dims = self.dims(w, c)
        sw = g["SW"] if g["SW"] in (1, 2) else 3
        shown = {k: v for k, v in sorted(c.items()) if k not in self.runtime_knobs and k != "threads"}
        if core.grid_split(c, a_src, b_src):
            shown["parallel"] = "m|n"   # the grid's blocks are arguments
        n_params = len(w.input_specs())
        params = ", ".join(f"p{k}" for k in range(n_params))
        rest = "out" + (f", {dims.params()}" if dims.runtime else "") + ")"   # after the inputs
        signature = f"kernel({params}, {rest}"
        head = [f'"""conv2d {g["data_layout"]}/{g["kernel_layout"]}{" grouped" if G > 1 else ""}, '
                f'{w.dtype}: GEMM per image{" and group" if G > 1 else ""}, A = {a_src}, B = {b_src}'
                + (f" (stride class {sw if sw < 3 else 'other'})" if "im2col" in a_src + b_src else "") + ".",
                (f"Prologue on each image row while it is packed: {pro.describe()}. " if pro else "")
                + f"Epilogue on each tile: {epi.describe()}."
                + (" The groups run in parallel (prange), each GEMM on one thread." if c["parallel"] == "g" else ""),
                "",
                f"Generated by search_spaces.templates.conv2d (template conv2d, version {self.version}) from",
                f"    {json.dumps(shown, separators=(', ', ': '))}",
                f"Called as {signature}: the shape, the geometry and the cache",
                "blocks are arguments, so every layer of this variant runs this one compiled module.",
                '"""'] + core.IMPORTS
        by_group = c["parallel"] == "g"
        # groups in parallel: each group's GEMM runs the serial core on one thread
        core_c = dict(c, parallel="none", threads=1) if by_group else c
        parts = [head] + core.module_parts(dims, w.dtype, core_c, a_src, b_src, epi, sw, pro)
        jit = "@numba.njit(cache=True, parallel=True)" if by_group else "@numba.njit(cache=True)"
        prepacked = b_src == "prepacked"
        if prepacked:   # kernel = prepare + kernel_prepared (search_spaces/template.py)
            head.append(core.PREPACK_IMPORT)
            parts.append(core.prepack_source())
            # kernel_prepared takes the inputs not prepared, then BP, then out (PreparedKernel)
            kept = ", ".join(f"p{k}" for k in range(n_params) if k != w_idx)
            parts.append(["@numba.njit(cache=True)", f"def {signature}:",
                          '    """Every element of out is written: the weight packed, then kernel_prepared."""',
                          f"    BP = pack_panels(p{w_idx}, NR)",
                          f"    kernel_prepared({kept}, BP, {rest}"])
            signature = f"kernel_prepared({kept}, BP, {rest}"
        kern = [jit, f"def {signature}:",
                '    """Every element of out is written (inputs C-contiguous)."""']
        body = ([dims.pack()] + dims.unpack()) if dims.runtime else ["geo = ()"]
        body += epi.prep_lines("out.shape")
        pro_args = ""
        if pro is not None:
            body += pro.prep_lines()
            pro_args = pro.args()
        body += [f"X = p{x_idx}.reshape(-1)", ("Wt = BP" if prepacked else f"Wt = p{w_idx}.reshape(-1)"),
                 "Cf = out.reshape(-1)"]
        if a_src == "window_nhwc" and self.padded(g) != (g["H"], g["W"]):
            body += ["if PREPAD:   # the image's producer wrote it zero-padded (HP x WP)",
                     "    Xp = X",
                     "else:",
                     "    Xp = pad_image(X, geo)   # every window in bounds",
                     f"gemm_core(Xp, 0, Wt, 0, Cf, 0, geo, {epi.args()})"]
        elif pl["layout"] == "NHWC":
            body.append(f"gemm_core(X, 0, Wt, 0, Cf, 0, geo, {epi.args()})")
        elif G == 1:
            body += ["for img in range(IMAGES):",
                     f"    gemm_core(Wt, 0, X, img * (CI * H * W), Cf, img * (M * N), geo, {epi.args()}{pro_args})"]
        else:
            # Group grp: weight rows grp*M.., image channels grp*CG.., output channels grp*M..;
            # per-channel epilogue operands start at the group's first channel.
            args = "".join((f"e{k}[grp * M:], " if kind == "row" else f"e{k}, ")
                           for k, kind in sorted(epi.operands.items()))
            body += ["for img in range(IMAGES):",
                     f"    for grp in {'prange' if by_group else 'range'}(GROUPS):",
                     "        gemm_core(Wt, grp * (M * K), X, img * (CI * H * W) + grp * (CG * H * W),",
                     f"                  Cf, img * (GROUPS * M * N) + grp * (M * N), geo, {args})"]
        kern += ["    " + ln for ln in body]
        parts.append(kern)
        return "\n\n\n".join("\n".join(p) for p in parts) + "\n"


def conv2d_features(params: Mapping, config: Mapping, caches: Mapping | None = None) -> dict:
    """conv2d as the implicit GEMM its template computes (``Conv2dTemplate.plan``): the GEMM
    features of (M, N, K) with the template's fixed choices (LLVM-vector micro-kernel,
    register write cache), plus the convolution's own: window, stride, the im2col expansion
    of the packed operand, images per call, groups (one GEMM each), and whether the image is
    read in place."""
    from search_spaces.templates.features import _log2, gemm_features
    from workloads.fused import Conv2dGroup

    w = Conv2dGroup.from_params(dict(params))
    pl, g = Conv2dTemplate.plan(w), w.geometry
    gemm_cfg = {"microkernel": "intrinsic", "write_cache": True, "unroll_k": 1, **config}
    f = gemm_features({"M": pl["M"], "N": pl["N"], "K": pl["K"], "dtype": w.dtype}, gemm_cfg, caches)
    image = g["C"] // pl["groups"] * g["H"] * g["W"]   # one group's channels
    f.update({
        "conv_window": float(g["KH"] * g["KW"]), "conv_stride": float(g["SH"] * g["SW"]),
        "conv_pointwise": float(pl["pointwise"]), "conv_nhwc": float(pl["layout"] == "NHWC"),
        "conv_im2col_expansion": _log2(pl["K"] * (pl["M"] if pl["layout"] == "NHWC" else pl["N"])
                                       / max(1, image)),
        "conv_images": _log2(pl["batches"]),
        "conv_groups": _log2(pl["groups"]),   # GEMMs of this shape per image
    })
    if config.get("parallel") == "g":   # one task per group
        T = int(config.get("threads", 1))
        f.update(par_tasks=_log2(pl["groups"]),
                 par_balance=split_efficiency(pl["groups"], 1, T) if T > 1 else 1.0)
    return f
