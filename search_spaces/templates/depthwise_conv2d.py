"""depthwise_conv2d template: a depthwise convolution (groups == input channels, each input
channel giving ``O / C`` output channels) with its fused epilogue, as a direct kernel.

A depthwise conv does KH*KW multiply-adds per output and reuses nothing across channels, so it
is no GEMM (as one, K = KH*KW would be a sliver). The kernel, NCHW data / OIHW weights:

- each input plane is copied once into a zero-bordered scratch plane ``P`` (row stride
  ``WP``, with slack rows and columns), so the inner loops have no bounds tests;
- for each output channel of that plane, blocks of ``rows`` output rows x ``unroll`` vectors of
  ``vec`` output columns are held in ``rows * unroll`` vector accumulators; each of the
  KH*KW taps is one weight broadcast and, per accumulator, one vector load of ``P`` (stride 1:
  consecutive columns; stride 2: the even lanes of two loads) and one FMA
  (``search_spaces.runtime.simd``; lanes from the target ISA, ``search_spaces.isa``);
- the epilogue (bias, residual, relu/clip ...) is applied to each accumulator as it is stored
  (masked vector stores at the right edge; scalar code for epilogues with column or full
  operands at the edge, or with no vector form).

Knobs: ``vec`` (half or whole register), ``unroll``, ``rows``, ``threads`` (planes split into
one contiguous range per thread with ``prange``). Strides other than 1 and 2 along W, and NHWC
data, are not generated (``InstantiationError``: the builder runs such a group with NumPy and
counts it).
"""
from __future__ import annotations

import json
import math
from typing import Mapping

from search_spaces import isa
from search_spaces.epilogue import DTYPE_SRC, VECTOR_IMPORTS, Epilogue
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.template import Template
from workloads.errors import InstantiationError


PARALLEL_MACS = 1 << 18   # below this, a second thread costs more than it saves


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def plan(w) -> dict:
    """Geometry of the direct kernel; raises for what it does not generate."""
    g = w.geometry
    if (g["data_layout"], g["kernel_layout"]) != ("NCHW", "OIHW"):
        raise InstantiationError(f"depthwise conv2d is generated for NCHW/OIHW, not "
                                 f"{g['data_layout']}/{g['kernel_layout']}")
    if g["groups"] != g["C"] or g["O"] % g["C"]:
        raise InstantiationError(f"not a depthwise conv: groups={g['groups']}, C={g['C']}, O={g['O']}")
    if g["SW"] not in (1, 2):
        raise InstantiationError(f"depthwise conv2d with horizontal stride {g['SW']} is not "
                                 "generated (vector loads of stride 1 or 2)")
    return {**g, "MU": g["O"] // g["C"], "planes": g["N"] * g["C"]}


def direct_space(g: dict, lanes: int, max_threads: int) -> ConfigSpace:
    """The knobs of a direct depthwise kernel (this template's and the int8 one's,
    ``quant_depthwise``): ``vec`` (half or whole register of ``lanes``), ``unroll`` vectors
    of output columns, ``rows``, ``threads``; ``g`` has OH, OW and planes."""
    target = isa.current()
    L = lanes
    knobs = [
        Knob("vec", (L // 2, L), True, "vector lanes (half or whole register)"),
        Knob("unroll", (1, 2, 3, 4), True, "vectors of output columns per iteration"),
        Knob("rows", (1, 2, 3, 4), True, "output rows per iteration"),
        Knob("threads", tuple(range(1, max(1, max_threads) + 1)), True,
             "Numba threads (planes split across them)"),
    ]

    def registers(c):
        live = c["rows"] * c["unroll"] + 2   # accumulators + a load + the weight broadcast
        if live > target.registers:
            return (f"{c['rows']} x {c['unroll']} accumulators + 2 = {live} vector registers "
                    f"> the {target.registers} of {target.name}")
        return None

    def covers(c):
        if (c["unroll"] - 1) * c["vec"] >= g["OW"]:
            return f"unroll={c['unroll']} x vec={c['vec']}: a vector past every output column"
        if c["rows"] > g["OH"]:
            return f"rows={c['rows']} > {g['OH']} output rows"
        return None

    def threads(c):
        if c["threads"] > g["planes"]:
            return f"threads={c['threads']} > {g['planes']} planes"
        return None
    return ConfigSpace(knobs, [Constraint("registers", registers),
                               Constraint("covers", covers), Constraint("threads", threads)])


def scratch_plane(g: dict, V: int, U: int, R: int) -> tuple[int, int]:
    """(HP, WP) of a direct kernel's bordered scratch plane: every row and column a block of
    R rows x U vectors of V columns reads (blocks past the edge too, a stride-2 load's second
    vector too), and at least the padded image's top-left part the plane copy writes."""
    HP = (_ceil(g["OH"], R) * R - 1) * g["SH"] + (g["KH"] - 1) * g["DH"] + 1
    WP = (_ceil(g["OW"], V * U) * V * U - 1) * g["SW"] + (g["KW"] - 1) * g["DW"] + 1 + 2 * V
    return max(HP, g["PT"] + g["H"]), max(WP, g["PL"] + g["W"])


def tap_block(g: dict, V: int, U: int, R: int, zero: str, weight: str, load2: str) -> list[str]:
    """Source of one block of a direct kernel (this template's and ``quant_depthwise``'s):
    the R x U accumulators ``a<r>_<u>`` set to ``zero``, then per tap one broadcast ``wv`` of
    ``weight`` (formatted with the tap index ``t``) and per accumulator one load of the scratch
    plane ``P`` at output rows oh0.., columns ow0.. (stride 2: ``load2``, formatted with the
    index ``i``, reads the even lanes) and one FMA."""
    SH, SW, DH, DW, KH, KW = g["SH"], g["SW"], g["DH"], g["DW"], g["KH"], g["KW"]
    acc = [[f"a{r}_{u}" for u in range(U)] for r in range(R)]
    lines = [" = ".join(acc[r]) + f" = {zero}" for r in range(R)]
    for kh in range(KH):
        for kw in range(KW):
            lines.append(f"wv = {weight.format(t=kh * KW + kw)}")
            for r in range(R):
                row = f"(oh0 + {r}) * {SH} + {kh * DH}" if r else f"oh0 * {SH} + {kh * DH}"
                for u in range(U):
                    col = f"ow0 + {u * V}" if u else "ow0"
                    ld = (f"vload(P, ({row}) * WP + {col} + {kw * DW}, {V})" if SW == 1 else
                          load2.format(i=f"({row}) * WP + ({col}) * 2 + {kw * DW}"))
                    lines.append(f"{acc[r][u]} = vfma(wv, {ld}, {acc[r][u]})")
    return lines


def direct_default(sp: ConfigSpace, g: dict, macs: int, max_threads: int) -> Config:
    """Whole registers (half for a row of at most half a register), vectors to span a row up
    to 2, 2 rows, every thread from PARALLEL_MACS multiply-adds."""
    vec = sp.knob("vec").values[-1]
    if g["OW"] <= vec // 2:
        vec = sp.knob("vec").values[0]
    unroll = max(1, min(2, _ceil(g["OW"], vec)))
    rows = min(2, g["OH"])
    threads = max(1, min(max_threads, g["planes"])) if macs >= PARALLEL_MACS else 1
    cfg = {"vec": vec, "unroll": unroll, "rows": rows, "threads": threads}
    if sp.violation(cfg) is not None:
        cfg.update(unroll=1, rows=1)
    sp.validate(Config(cfg))
    return Config(cfg)


class DepthwiseConv2dTemplate(Template):
    name = "depthwise_conv2d"
    version = 1
    workload_kind = "depthwise_conv2d"
    entry = "kernel"

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        return direct_space(plan(workload), isa.current().lanes(workload.dtype), max_threads)

    def default_config(self, workload, max_threads: int = 1) -> Config:
        """Whole registers; enough vectors to span a row up to 2 (a 7-wide row: 1); 2 rows
        (3x3 stride 1: each loaded input row serves two output rows); every thread only from
        PARALLEL_MACS multiply-adds (a 16 x 14 x 14 3x3 conv, 28k MACs, 13 us: one thread
        beat two by 4x in a side-by-side re-measurement, Zen 3 under load)."""
        g = plan(workload)
        macs = g["N"] * g["O"] * g["OH"] * g["OW"] * g["KH"] * g["KW"]
        return direct_default(self.space(workload, max_threads), g, macs, max_threads)

    def domain_features(self, params, config, caches=None) -> dict:
        return depthwise_features(params, config, caches)

    def codegen(self, workload, config: Config) -> str:
        w = workload
        c = dict(config)
        self.space(w, max(int(c.get("threads", 1)), 1)).validate(config)
        g = plan(w)
        V, U, R, T = c["vec"], c["unroll"], c["rows"], c["threads"]
        epi = Epilogue(w.epilogue, w.out_shape, w.dtype, (1,), (2, 3))
        x_idx, w_idx = w.p["anchor_inputs"]
        OH, OW, KH, KW = g["OH"], g["OW"], g["KH"], g["KW"]
        HP, WP = scratch_plane(g, V, U, R)
        head = [f'"""depthwise conv2d NCHW/OIHW {w.summary()}: '
                f'{list(w.input_specs()[x_idx][0])} * {list(w.input_specs()[w_idx][0])} -> {list(w.out_shape)}.',
                "",
                f"Generated by search_spaces.templates.depthwise_conv2d (version {self.version}) from",
                f"    {json.dumps(dict(sorted(c.items())), separators=(', ', ': '))}",
                f"{R} output rows x {U} vectors of {V} lanes per iteration; epilogue: {epi.describe()}.",
                '"""',
                "import numba", "import numpy as np", "from numba import prange",
                "from search_spaces.runtime.simd import vadd, vbroadcast, vfma, vload, vload_n, "
                "vload_s2, vsplat, vstore, vstore_n",
                VECTOR_IMPORTS]
        consts = [f"DTYPE = {DTYPE_SRC[w.dtype]}", "ZERO = DTYPE(0)",
                  f"C, H, W, MU = {g['C']}, {g['H']}, {g['W']}, {g['MU']}   # input planes, "
                  "output channels per plane",
                  f"OH, OW, KH, KW = {OH}, {OW}, {KH}, {KW}",
                  f"PT, PL = {g['PT']}, {g['PL']}",
                  f"HP, WP = {HP}, {WP}   # zero-bordered scratch plane",
                  f"PLANES, THREADS = {g['planes']}, {T}"]
        parts = [head, consts, self._plane_source(g, epi, V, U, R)]
        n_params = len(w.input_specs())
        params = ", ".join(f"p{k}" for k in range(n_params))
        jit = "@numba.njit(cache=True" + (", parallel=True)" if T > 1 else ")")
        kern = [jit, f"def kernel({params}, out):",
                '    """Every element of out is written (inputs C-contiguous)."""']
        body = epi.prep_lines()
        body += [f"X = p{x_idx}.reshape(-1)", f"Wt = p{w_idx}.reshape(-1)", "Cf = out.reshape(-1)",
                 "per = (PLANES + THREADS - 1) // THREADS",
                 f"for t in {'prange' if T > 1 else 'range'}(THREADS):",
                 "    P = np.zeros(HP * WP, DTYPE)   # borders stay zero",
                 "    T = np.empty(VEC_T, DTYPE)",
                 "    for q in range(t * per, min(PLANES, (t + 1) * per)):",
                 "        ci = q % C",
                 "        src = q * (H * W)",
                 "        for ih in range(H):",
                 "            d = (ih + PT) * WP + PL",
                 "            s = src + ih * W",
                 "            for iw in range(0, W, VEC_T):",
                 "                vstore_n(P, d + iw, vload_n(X, s + iw, W - iw, VEC_T), W - iw)",
                 "        for m in range(MU):",
                 "            o = ci * MU + m",
                 f"            plane(P, Wt, o * (KH * KW), Cf, ((q - ci) * MU + o) * (OH * OW), o, T, {epi.args()})"]
        kern += ["    " + ln for ln in body]
        parts.append(kern)
        src = "\n\n\n".join("\n".join(p) for p in parts) + "\n"
        return src.replace("VEC_T", str(V))

    @staticmethod
    def _plane_source(g: dict, epi: Epilogue, V: int, U: int, R: int) -> list[str]:
        acc = [[f"a{r}_{u}" for u in range(U)] for r in range(R)]
        lines = ["@numba.njit(cache=True, fastmath=True)",
                 f"def plane(P, Wt, wb, Cf, ob, o, T, {epi.args()}):",
                 f'    """Output channel o (flat at ob) from scratch plane P and taps Wt[wb:wb+KH*KW]."""']
        body = ["for oh0 in range(0, OH, %d):" % R,
                "    for ow0 in range(0, OW, %d):" % (V * U)]
        ind = "        "
        body += [ind + ln for ln in tap_block(g, V, U, R, f"vsplat(ZERO, {V})",
                                               f"vbroadcast(Wt, wb + {{t}}, {V})",
                                               f"vload_s2(P, {{i}}, {V}, {V})")]
        vector = epi.vectorizable()
        edge_scalar = not vector or bool(epi.needs() & {"col", "flat"})
        if vector:
            body += [ind + ln for ln in epi.vec_operands("o", V)]
        for r in range(R):
            body += [f"{ind}oh = oh0 + {r}",
                     f"{ind}if oh < OH:",
                     f"{ind}    ro = ob + oh * OW"]
            for u in range(U):
                i2 = ind + "    "
                body += [f"{i2}ow = ow0 + {u * V}",
                         f"{i2}n = OW - ow",
                         f"{i2}v = {acc[r][u]}"]
                full = [f"vstore(Cf, ro + ow, v)"]
                if vector:
                    full = epi.apply_vec("v", "oh * OW + ow", "ro + ow", V) + full
                scalar = ["vstore(T, 0, v)",
                          "for c in range(min(n, %d)):" % V,
                          "    s = T[c]"] \
                    + ["    " + ln for ln in epi.apply("s", "o", "oh * OW + ow + c", "ro + ow + c")] \
                    + ["    Cf[ro + ow + c] = s"]
                if not vector:
                    body += [f"{i2}if n > 0:"] + [i2 + "    " + ln for ln in scalar]
                    continue
                body += [f"{i2}if n >= {V}:"] + [i2 + "    " + ln for ln in full]
                if edge_scalar:
                    body += [f"{i2}elif n > 0:"] + [i2 + "    " + ln for ln in scalar]
                else:
                    masked = epi.apply_vec("v", "oh * OW + ow", "ro + ow", V) + ["vstore_n(Cf, ro + ow, v, n)"]
                    body += [f"{i2}elif n > 0:"] + [i2 + "    " + ln for ln in masked]
        return lines + ["    " + ln for ln in body]


def depthwise_features(params: Mapping, config: Mapping, caches: Mapping | None = None) -> dict:
    """What a config means for a depthwise conv: accumulators, lanes wasted at the right
    edge and past the last row block, taps per loaded vector, scratch plane against L1, and
    planes per thread."""
    from search_spaces.templates.features import DEFAULT_CACHES, _log2
    from workloads.fused import DepthwiseConv2dGroup

    caches = {**DEFAULT_CACHES, **(caches or {})}
    g = plan(DepthwiseConv2dGroup.from_params(dict(params)))
    V, U, R, T = (int(config.get(k, d)) for k, d in (("vec", 8), ("unroll", 1), ("rows", 1),
                                                       ("threads", 1)))
    cols = _ceil(g["OW"], V * U) * V * U
    rows = _ceil(g["OH"], R) * R
    plane_bytes = (rows * g["SH"] + g["KH"]) * (cols * g["SW"] + g["KW"]) * 4
    return {
        "dw_accumulators": float(R * U), "dw_lanes": float(V),
        "dw_col_efficiency": g["OW"] / cols, "dw_row_efficiency": g["OH"] / rows,
        "dw_window": float(g["KH"] * g["KW"]), "dw_stride": float(g["SH"] * g["SW"]),
        "dw_plane_l1": plane_bytes / caches["L1d"],
        "dw_planes_per_thread": _log2(math.ceil(g["planes"] / T)), "dw_threads": float(T),
    }
