"""qdepthwise_conv2d template: a depthwise ``qconv2d`` (groups == input channels, ``MU = O / C``
output channels per input plane; NCHW/OIHW, batch 1) with its fused ``requantize``/``qadd``
epilogue, as a direct kernel (workload ``workloads.quant_fused.QDepthwiseConv2dGroup``).

Each output is KH*KW multiply-adds of one plane: no GEMM (as one per group, N = MU and K =
KH*KW are slivers, and a call per channel costs more than its arithmetic: ShuffleNet's
136-channel 3 x 3 layer at 28 x 28 ran 1.6 ms as 136 GEMMs). The kernel:

- each input plane is copied once into a scratch plane ``P`` bordered with the data's zero
  point (``x_zero_point``: real 0), so the tap loops have no bounds tests;
  the plane holds the bytes' levels as float32;
- per output channel, blocks of ``rows`` output rows x ``unroll`` vectors of ``vec`` columns
  are held in vector accumulators; each tap is one weight broadcast and, per accumulator, one
  load (stride 2: the even lanes of two) and one FMA, as the float template does. The sums
  are integers whose every partial value stays below 2**24 (KH*KW*255*w_max: a 3 x 3 window
  reaches 293,760), so float32 holds them exactly (plain int32 loops of 28-wide rows were
  unrolled into scalar multiplies by LLVM, not vectorized: 0.54 ms for ShuffleNet's
  136-plane 28 x 28 layer on AMD Zen 2, 1 thread; 0.40 ms this way);
- each finished vector becomes int32, plus ``corr[o] = bias[o] - x_zero_point * sum(w[o])``
  (the zero-point correction folded into the bias, as the GEMM templates do), through the
  epilogue (``search_spaces.quant_epilogue``) element by element: bit-exact against the
  reference.

Knobs: ``vec``, ``unroll``, ``rows``, ``threads`` (planes split into one contiguous range per
thread with ``prange``).
"""
from __future__ import annotations

import json

from search_spaces import isa
from search_spaces import quant_epilogue as qe
from search_spaces.space import Config, ConfigSpace
from search_spaces.template import Template
from search_spaces.templates.depthwise_conv2d import direct_default, direct_space
from workloads.errors import InstantiationError


def plan(w) -> dict:
    g = w.geometry
    if g["C"] != 1 or g["batch"] != 1:
        raise InstantiationError(f"not a depthwise qconv2d at batch 1: {g['C']} input channels per group, "
                                 f"batch {g['batch']}")
    if g["KH"] * g["KW"] * 255 * w.w_max >= 1 << 24:
        raise InstantiationError(f"a {g['KH']}x{g['KW']} window's integer sums may pass 2**24 "
                                 "(not exact in float32)")
    if g["SW"] not in (1, 2):
        raise InstantiationError(f"depthwise qconv2d with horizontal stride {g['SW']} is not generated")
    planes = g["groups"]
    return {**g, "MU": g["N"], "planes": planes, "O_all": planes * g["N"]}


class QDepthwiseConv2dTemplate(Template):
    name = "qdepthwise_conv2d"
    version = 1
    workload_kind = "qdepthwise_conv2d"
    entry = "kernel"

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        """The float depthwise template's knobs and constraints (float32 accumulators)."""
        return direct_space(plan(workload), isa.current().lanes("float32"), max_threads)

    def default_config(self, workload, max_threads: int = 1) -> Config:
        """The float depthwise template's rule (``direct_default``)."""
        g = plan(workload)
        macs = g["O_all"] * g["OH"] * g["OW"] * g["KH"] * g["KW"]
        return direct_default(self.space(workload, max_threads), g, macs, max_threads)

    def prepared_inputs(self, workload, config) -> tuple[int, ...]:
        """The weight and, with a requantize, the bias: what ``prepare`` takes."""
        return qe.prepared_inputs(workload)

    def codegen(self, workload, config: Config) -> str:
        w = workload
        c = dict(config)
        self.space(w, max(int(c.get("threads", 1)), 1)).validate(config)
        g = plan(w)
        V, U, R, T = int(c["vec"]), int(c["unroll"]), int(c["rows"]), int(c["threads"])
        epi = w.epilogue
        x_i, w_i = w.p["anchor_inputs"]
        pad = w.attrs["padding"]   # (top, left, bottom, right)
        SH, SW, DH, DW = g["SH"], g["SW"], g["DH"], g["DW"]
        OH, OW, KH, KW = g["OH"], g["OW"], g["KH"], g["KW"]
        # the scratch plane: every row and column a block reads (blocks past the edge too)
        HP = max(g["PT"] + g["H"] + pad[2], (-(-OH // R) * R - 1) * SH + (KH - 1) * DH + 1)
        WP = max(g["PL"] + g["W"] + pad[3],
                 (-(-OW // (V * U)) * V * U - 1) * SW + (KW - 1) * DW + 1 + 2 * V)
        try:
            stmts, store = qe.statements(epi, "o", "ro + ow + cc")
        except ValueError as exc:
            raise InstantiationError(str(exc)) from None
        n_in = len(w.input_specs())
        prepared = self.prepared_inputs(w, config)
        kept = [k for k in range(n_in) if k not in prepared]
        sc = qe.scale_param(epi)
        head = [f'"""{w.summary()}: depthwise {KH}x{KW} stride {SH}x{SW}, {g["planes"]} planes x '
                f'{g["MU"]} output channels, uint8 x int8 (|w| <= {w.w_max}) -> {w.dtype}.',
                "",
                f"Generated by search_spaces.templates.quant_depthwise (version {self.version}) from",
                f"    {json.dumps(dict(sorted(c.items())), separators=(', ', ': '))}",
                f"{R} output rows x {U} vectors of {V} lanes per block, the taps' integer products",
                "summed in float32 (exact: every partial sum is an integer below 2**24), then int32",
                "+ corr and the epilogue: " + (" -> ".join(e["op"] for e in epi) or "none (int32 output)") + ".",
                '"""',
                "import numba", "import numpy as np"] + (["from numba import prange"] if T > 1 else []) + [
                "from search_spaces.runtime.simd import vbroadcast, vfma, vload, vload_even, vsplat, vstore"]
        consts = [f"PLANES, MU, N = {g['planes']}, {g['MU']}, {g['O_all']}   # input planes, outputs per plane, output channels",
                  f"IN_H, IN_W, OH, OW, KH, KW = {g['H']}, {g['W']}, {OH}, {OW}, {KH}, {KW}",
                  f"PT, PL = {g['PT']}, {g['PL']}",
                  f"HP, WP = {HP}, {WP}   # the zero-point bordered scratch plane (float32 levels)",
                  f"XZP = {w.x_zero_point}   # data zero point",
                  f"THREADS = {T}"]
        prep_params = ", ".join(f"p{k}" for k in prepared)
        prepare = ["@numba.njit(cache=True)",
                   f"def prepare({prep_params}):",
                   '    """(Wf, corr): the taps as float32 [N * KH * KW] and corr[o] = bias[o] - XZP * sum(w[o])',
                   '    (the zero-point correction folded into the bias)."""',
                   f"    Wi = p{w_i}.reshape((N, KH * KW)).astype(np.int32)",
                   "    corr = np.empty(N, np.int32)",
                   "    for o in range(N):",
                   f"        corr[o] = {qe.bias_source(epi, 'o')} - XZP * Wi[o].sum()",
                   "    return Wi.reshape(-1).astype(np.float32), corr"]
        acc = [[f"a{r}_{u}" for u in range(U)] for r in range(R)]
        blk = []
        for r in range(R):
            blk.append(" = ".join(acc[r]) + f" = vsplat(np.float32(0), {V})")
        for kh in range(KH):
            for kw in range(KW):
                blk.append(f"wv = vbroadcast(Wf, o * {KH * KW} + {kh * KW + kw}, {V})")
                for r in range(R):
                    row = f"(oh0 + {r}) * {SH} + {kh * DH}"
                    for u in range(U):
                        col = f"ow0 + {u * V}"
                        ld = (f"vload(P, ({row}) * WP + {col} + {kw * DW}, {V})" if SW == 1 else
                              f"vload_even(P, ({row}) * WP + ({col}) * 2 + {kw * DW}, {V})" if SW == 2 else None)
                        if ld is None:
                            raise InstantiationError(f"depthwise qconv2d with horizontal stride {SW} is not generated")
                        blk.append(f"{acc[r][u]} = vfma(wv, {ld}, {acc[r][u]})")
        for r in range(R):
            blk += [f"oh = oh0 + {r}",
                    "if oh < OH:",
                    "    ro = ob + oh * OW"]
            for u in range(U):
                blk += [f"    ow = ow0 + {u * V}",
                        f"    vstore(Tv, 0, {acc[r][u]})",
                        f"    for cc in range(min(OW - ow, {V})):",
                        "        v = np.int32(Tv[cc]) + corr[o]"]
                blk += ["        " + ln for ln in stmts]
                blk += [f"        Cf[ro + ow + cc] = {store}"]
        body = [f"X = p{x_i}.reshape(-1)", "Cf = out.reshape(-1)"]
        if sc is not None:
            body.append(f"sc = p{sc}.reshape(-1)")
        body += [f"e{k} = p{k}.reshape(-1)" for k in qe.operand_params(epi)]
        body += ["per = (PLANES + THREADS - 1) // THREADS",
                 f"for t in {'prange' if T > 1 else 'range'}(THREADS):",
                 "    P = np.empty(HP * WP, np.float32)",
                 "    P[:] = XZP   # the border: real 0",
                 f"    Tv = np.empty({V}, np.float32)",
                 "    for q in range(t * per, min(PLANES, (t + 1) * per)):",
                 "        for ih in range(IN_H):",
                 "            d = (ih + PT) * WP + PL",
                 "            s = (q * IN_H + ih) * IN_W",
                 "            for iw in range(IN_W):",
                 "                P[d + iw] = X[s + iw]",
                 "        for m in range(MU):",
                 "            o = q * MU + m",
                 "            ob = o * (OH * OW)",
                 f"            for oh0 in range(0, OH, {R}):",
                 f"                for ow0 in range(0, OW, {V * U}):",
                 *["                    " + ln for ln in blk]]
        kparams = ", ".join([f"p{k}" for k in kept] + ["Wf", "corr"])
        kern = [f"@numba.njit(cache=True{', parallel=True' if T > 1 else ''})",
                f"def kernel_prepared({kparams}, out):",
                '    """The kernel on prepared operands (Wf, corr from ``prepare``); every element of',
                '    out is written."""'] + ["    " + ln for ln in body]
        params = ", ".join(f"p{k}" for k in range(n_in))
        per_call = ["@numba.njit(cache=True)",
                    f"def kernel({params}, out):",
                    '    """The workload\'s signature: prepare the constant operands on every call."""',
                    f"    Wf, corr = prepare({prep_params})",
                    f"    kernel_prepared({', '.join([f'p{k}' for k in kept] + ['Wf', 'corr'])}, out)"]
        parts = [head + [""] + consts, prepare, kern, per_call]
        return "\n\n\n".join("\n".join(p) for p in parts) + "\n"
