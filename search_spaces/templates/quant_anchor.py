"""int8 templates for the quantized anchors: ``qdense`` and ``qconv2d`` (workloads
``workloads.quant_fused``) with their fused ``requantize``/``qadd`` epilogue, generated on the
int8 GEMM engine (``gemm_engine/int8_microkernels.py``).

Each is the GEMM C[M, N] int32 = A[M, K] uint8 @ B[K, N] int8 of the group (``w.gemm()``): the
space, constraints and defaults are the ``gemm_int8`` template's for that GEMM (tiles, micro
tile, loop order, ``dot`` instruction — ``maddubs`` only for 7-bit weights, ``w_max <= 64`` —
vector width, unrolling, threads), so records, tuning and the cost model treat it like any
other template. What differs is where A and B come from and what happens to C:

- ``qdense``: A is the data [M, K] read in place while packing; B the weight [N, K], packed
  from its rows (``b_layout="NK"``);
- ``qconv2d``: A is never materialised: the packing of each A block *is* the im2col (implicit
  GEMM): row i an output pixel, column k a (channel, kh, kw) tap (NCHW/OIHW) or (kh, kw,
  channel) (NHWC/HWIO), taps outside the image read as ``x_zero_point`` (real 0), written in K
  groups of 4 (or 2 int16) as the dot-product instructions want. A 1x1 convolution with stride 1
  and no padding is a plain GEMM on the data (NHWC: [M, C]; NCHW at batch 1: [C, M], packed
  transposed). B is the weight as [O, K] (OIHW) or [K, O] (HWIO).

Then, per output element, ``acc + corr[c]`` with ``corr[c] = bias[c] - x_zero_point *
sum_k w[c, k]`` (the zero-point correction folded into the bias, computed with the packing of
B), and the epilogue of ``search_spaces.quant_epilogue``: bit-exact against the reference.

Knob ``requantize`` (version 3) says where that epilogue runs: ``pass``, the GEMM writes the
int32 [M, N] accumulator and one vectorized pass requantizes it; ``registers``, the
micro-kernel's tile store requantizes its int32 accumulators (``vcvtdq2ps``, scale,
``vroundps``, clamp, saturating packs) and stores bytes (``quant_epilogue.tile_statements``):
16 contiguous bytes per tile row for NHWC and dense outputs, 4 pixels x 16 channels stored
transposed (4 bytes per channel) for NCHW. It applies to an 8-bit requantize (+ qadd)
epilogue with the whole reduction in one K block (constraint ``register_requantize``) and is
the default there.
"""
from __future__ import annotations

import json

from search_spaces import quant_epilogue as qe
from search_spaces.gemm_engine import int8_microkernels as i8
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.template import Template
from workloads.errors import InstantiationError


def _engine():
    from search_spaces import get_template

    return get_template("gemm_int8")


REQUANTIZE = ("pass", "registers")


class QuantAnchorTemplate(Template):
    # the names of the generated prepare / prepared-kernel pair (a grouped conv calls them
    # once per group from its own ``prepare`` and ``kernel_prepared``)
    prepare_name, kernel_name = "prepare", "kernel_prepared"
    version = 5   # 5: NCHW im2col groups copied as 16-byte transposes; 4: the micro-kernel inlined for requantize="pass" too (gemm_int8 v4)
    entry = "kernel"

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        """The engine's space for the group's GEMM, plus ``requantize``: where the epilogue
        runs. ``pass``: the GEMM writes the int32 [M, N] accumulator, then one vectorized
        pass over it; ``registers``: the micro-kernel's tile store requantizes its int32
        accumulators in registers and stores the 8-bit levels (no int32 array; constraint
        ``register_requantize`` says where it applies)."""
        sp = _engine().space(workload.gemm(), max_threads)
        knob = Knob("requantize", REQUANTIZE, False,
                    "epilogue in a separate pass over the int32 accumulator, or in the micro-kernel's registers")
        return ConfigSpace(list(sp.knobs) + [knob],
                           list(sp.constraints) + [Constraint("register_requantize",
                                                              lambda c: self.register_reason(workload, c))])

    def register_reason(self, w, c) -> str | None:
        """Why ``requantize="registers"`` does not apply to this workload and config (None:
        it does, or the config asks for the separate pass)."""
        if c.get("requantize", "pass") == "pass":
            return None
        g = w.geometry
        nchw = self.out_index(w)[1] != f"i * {g['N']} + j"
        if nchw and c["mr"] % 4:
            return f"requantize in registers with NCHW outputs stores 4 pixels per channel (mr a multiple of 4, not {c['mr']})"
        reason = qe.tile_reason(w.epilogue)
        if reason is not None:
            return f"requantize in registers needs an 8-bit requantize (+ qadd) epilogue, not {reason}"
        if c["tile_k"] < g["K"]:
            return f"requantize in registers needs one K block (tile_k={c['tile_k']} < K={g['K']})"
        pair = 2 * (c["vec"] // 32)
        if c["nr"] % pair:
            return (f"requantize in registers packs pairs of {pair // 2}-lane int32 vectors "
                    f"(nr a multiple of {pair} at vec {c['vec']}, not {c['nr']})")
        return None

    def default_config(self, workload, max_threads: int = 1) -> Config:
        """The engine's default, with the requantize in registers where it applies."""
        cfg = dict(_engine().default_config(workload.gemm(), max_threads, anchor=True))
        cfg["requantize"] = "registers"
        if self.register_reason(workload, cfg) is not None:
            cfg["requantize"] = "pass"
        return Config(cfg)

    # -- what the subclasses define --------------------------------------------------------
    def operands(self, w, c: dict) -> tuple[list[str], list[str] | None, str]:
        """(kernel-start lines making ``A`` and ``B``, the pack_a source or None for the
        engine's, B's layout "NK" or "KN")."""
        raise NotImplementedError

    def out_index(self, w) -> tuple[list[str], str, str]:
        """(per-row lines, flat output index, channel index) for GEMM element (i, j)."""
        g = w.geometry
        return [], f"i * {g['N']} + j", "j"

    def describe(self, w) -> str:
        return ""

    def transposed_groups(self, w, c: dict) -> bool:
        """Whether A's packing copies K groups with ``interleave4_store`` (its helpers are
        imported): the subclass's own packing says."""
        return False

    # -- code generation -------------------------------------------------------------------
    def gemm_config(self, c: dict) -> dict:
        """The config the GEMM (and ``kernel_prepared``) is generated from: the config itself
        (a grouped conv's ``parallel="g"`` runs each group's GEMM on one thread)."""
        return c

    def codegen(self, workload, config: Config) -> str:
        w = workload
        full = dict(config)
        self.space(w, max(int(full.get("threads", 1)), 1)).validate(config)
        c = self.gemm_config(full)
        g = w.geometry
        M, N, K = g["M"], g["N"], g["K"]
        epi = w.epilogue
        prep, pack_a, b_layout = self.operands(w, c)
        row_lines, flat, chan = self.out_index(w)
        try:
            stmts, store = qe.statements(epi, chan, flat)
        except ValueError as exc:
            raise InstantiationError(str(exc)) from None
        par = c["parallel"] != "none"
        n_in = len(w.input_specs())
        params = ", ".join(f"p{k}" for k in range(n_in))
        head = [f'"""{w.summary()}: {self.describe(w)}GEMM M={M}, N={N}, K={K}, uint8 x int8 '
                f'(|w| <= {w.w_max}) -> {w.dtype}.',
                "",
                f"Generated by search_spaces.templates.quant_anchor (template {self.name}, version "
                f"{self.version}) from",
                f"    {json.dumps(dict(sorted(full.items())), separators=(', ', ': '))}",
                f"int8 GEMM engine ({c['dot']}, {c['mr']} x {c['nr']} tile) "
                + ("requantizing each register tile in its store (no int32 array):"
                   if c.get("requantize", "pass") == "registers" else "into an int32 accumulator,"),
                "then acc + (bias - x_zero_point * sum(w)) and the epilogue: "
                + (" -> ".join(e["op"] for e in epi) or "none (int32 output)") + ".",
                '"""']
        consts = i8.constants(w.gemm(), c) + [f"XZP = {w.x_zero_point}   # data zero point"] \
            + self.extra_constants(w)
        sc = qe.scale_param(epi)
        prepared = self.prepared_inputs(w, config)
        kept = [k for k in range(n_in) if k not in prepared]
        # prepare: the constant operands (weight, bias) -> B packed in the kernel's blocks and
        # the zero-point correction folded into the bias, once per weight (at build time)
        prep_params = ", ".join(f"p{k}" for k in prepared)
        prepare = ["@numba.njit(cache=True)",
                   f"def {self.prepare_name}({prep_params}):",
                   '    """The constant operands in the form the kernel reads: (BP, corr) with BP the',
                   "    weight packed in K groups per (TILE_N, TILE_K) block (``pack_b_all``) and",
                   "    corr[c] = bias[c] - XZP * sum_k w[c, k] (the zero-point correction folded",
                   '    into the bias). Called once per weight by a build, outside the timed region."""',
                   f"    B = {self.weight_view(w)}",
                   "    BP = pack_b_all(B)",
                   "    corr = np.empty(N, np.int32)",
                   "    for j in range(N):",
                   "        s = 0",
                   "        for k in range(K):",
                   f"            s += B[{'j, k' if b_layout == 'NK' else 'k, j'}]",
                   f"        corr[j] = {qe.bias_source(epi, 'j')} - XZP * s",
                   "    return BP, corr"]
        in_registers = c.get("requantize", "pass") == "registers"
        body = [ln for ln in prep if not ln.startswith("B = ")]
        extra: tuple[str, ...] = ()
        tile_store = None
        if in_registers:   # the micro-kernel stores the 8-bit levels: no int32 array
            extra = ("corr", "sc") + tuple(f"e{k}" for k in qe.operand_params(epi))
            lanes = c["vec"] // 32

            nchw = flat != f"i * {N} + j"

            def tile_store(acc):
                return qe.tile_statements(epi, acc, lanes, N, nchw)
        else:
            body += ["acc = np.empty((M, N), np.int32)",
                     "gemm(A, BP, acc)"]
        if sc is not None:
            body.append(f"sc = p{sc}.reshape(-1)")
        body += [f"e{k} = p{k}.reshape(-1)" for k in qe.operand_params(epi)]
        if in_registers:
            body += ["Cf = out.reshape(-1)",
                     f"gemm(A, BP, Cf, {', '.join(extra)})   # requantized in the micro-kernel's tile store"]
        else:
            # int32 arithmetic wraps, and acc + bias fits int32 (the reference checks it), so
            # acc + corr is exact even if a partial sum wrapped; int32 keeps the loop vectorizable
            body += self.store_lines(w, epi, stmts, store, flat, row_lines, par)
        kparams = ", ".join([f"p{k}" for k in kept] + ["BP", "corr"])
        # parallel only where this function holds the prange (the epilogue rows); with the
        # requantize in the registers the block loop of ``gemm`` is the parallel one
        kern = [f"@numba.njit(cache=True{', parallel=True' if par and not in_registers else ''})",
                f"def {self.kernel_name}({kparams}, out):",
                '    """The kernel on prepared operands (BP, corr from ``prepare``); every element',
                '    of out is written."""'] + ["    " + ln for ln in body]
        per_call = ["@numba.njit(cache=True)",
                    f"def kernel({params}, out):",
                    '    """The workload\'s signature: prepare the constant operands on every call, then',
                    '    the kernel (what runs when a weight is not a constant of the graph)."""',
                    f"    BP, corr = prepare({prep_params})",
                    f"    kernel_prepared({', '.join([f'p{k}' for k in kept] + ['BP', 'corr'])}, out)"]
        imports = i8.imports(c, vector_b=self.transposed_groups(w, c))
        if full["parallel"] != "none" and "from numba import prange" not in imports:
            imports.append("from numba import prange")
        if in_registers:
            imports += ["from search_spaces.runtime.simd_int8 import vconcat, vcvt_f32, vcvt_i32, vlane, vload_t4, "
                        "vpack_i8, vpack_u8, vrint, vstore_t4, vwiden_i32",
                        "from search_spaces.runtime.vector_ops import vmax, vmin, vmul, vsub"]
        parts = [head + imports + [""] + consts]
        parts += i8.engine_parts(c, pack_a=pack_a, b_layout=b_layout, name="gemm", b_packed=True,
                                 tile_store=tile_store, extra=extra)
        parts += [prepare, kern, per_call] + self.entry_points(w, full, prepared, kept)
        return "\n\n\n".join("\n".join(p) for p in parts) + "\n"

    def prepared_inputs(self, workload, config) -> tuple[int, ...]:
        """The weight and, with a requantize, the bias: what ``prepare`` takes."""
        return qe.prepared_inputs(workload)

    def weight_view(self, w) -> str:
        """Source of B from the weight parameter: [N, K] ("NK") or [K, N] ("KN")."""
        raise NotImplementedError

    def store_lines(self, w, epi, stmts, store, flat, row_lines, par) -> list[str]:
        """The epilogue: per output row, ``acc + corr`` through ``stmts`` into out."""
        g = w.geometry
        if flat == f"i * {g['N']} + j":   # the output row is contiguous: store in place
            body = ["Cf = out.reshape(-1)",
                    f"for i in {'prange' if par else 'range'}(M):"]
            body += ["    " + ln for ln in row_lines]
            body += ["    for j in range(N):",
                     "        v = np.int32(acc[i, j] + corr[j])"]
            body += ["        " + ln for ln in stmts]
            body += [f"        Cf[{flat}] = {store}"]
        else:   # (NCHW) C[i, j] is out[n, j, pix]: RB pixels at a time, each row's epilogue
            # a contiguous (vectorized) loop over channels into a tile, then per channel one
            # contiguous run of RB pixels stored (a transposition through L1, not N strided
            # stores per pixel)
            body = ["Cf = out.reshape(-1)",
                    "RB = 32   # pixels per tile",
                    "NPB = (P + RB - 1) // RB   # tiles per image",
                    f"tile = np.empty((RB, N), {qe.out_dtype_src(epi)})" if not par else "",
                    f"for blk in {'prange' if par else 'range'}(M // P * NPB):",
                    "    n = blk // NPB",
                    "    pix0 = (blk - n * NPB) * RB",
                    "    rb = min(RB, P - pix0)"]
            if par:   # private to the iteration
                body.append(f"    tile = np.empty((RB, N), {qe.out_dtype_src(epi)})")
            body += ["    for r in range(rb):",
                     "        pix = pix0 + r",
                     "        i = n * P + pix",
                     "        for j in range(N):",
                     "            v = np.int32(acc[i, j] + corr[j])"]
            body += ["            " + ln for ln in stmts]
            body += [f"            tile[r, j] = {store}",
                     "    for j in range(N):",
                     "        base = (n * N + j) * P + pix0",
                     "        for r in range(rb):",
                     "            Cf[base + r] = tile[r, j]"]
            body = [ln for ln in body if ln]
        return body

    def extra_constants(self, w) -> list[str]:
        return []

    def entry_points(self, w, c: dict, prepared: tuple[int, ...], kept: list[int]) -> list[list[str]]:
        """Functions beyond ``prepare``/``kernel_prepared``/``kernel`` (a grouped conv's loops)."""
        return []


class QDenseTemplate(QuantAnchorTemplate):
    name = "qdense"
    workload_kind = "qdense"

    def operands(self, w, c):
        x_i, w_i = w.p["anchor_inputs"]
        return ([f"A = p{x_i}.reshape((M, K))   # data rows", f"B = p{w_i}   # weight [N, K]"],
                None, "NK")

    def weight_view(self, w) -> str:
        return f"p{w.p['anchor_inputs'][1]}   # weight [N, K]"


class QConv2dTemplate(QuantAnchorTemplate):
    name = "qconv2d"
    workload_kind = "qconv2d"

    @staticmethod
    def plain_gemm(w) -> bool:
        """1x1, stride 1, no padding (and batch 1 for NCHW): the data is already A."""
        g = w.geometry
        one = g["KH"] == g["KW"] == 1 and g["SH"] == g["SW"] == 1 \
            and not any(w.attrs["padding"])
        return one and (g["data_layout"] == "NHWC" or g["batch"] == 1)

    def weight_view(self, w) -> str:
        w_i = w.p["anchor_inputs"][1]
        if w.geometry["data_layout"] == "NCHW":
            return f"p{w_i}.reshape((N, K))   # OIHW weight as [O, C*KH*KW]"
        return f"p{w_i}.reshape((K, N))   # HWIO weight as [KH*KW*C, O]"

    def describe(self, w) -> str:
        g = w.geometry
        how = "1x1 as a plain GEMM" if self.plain_gemm(w) else "implicit im2col in the A packing"
        return (f"{g['data_layout']}/{g['kernel_layout']} {g['KH']}x{g['KW']} stride "
                f"{g['SH']}x{g['SW']}, {how}; ")

    @staticmethod
    def padded(w) -> bool:
        return any(w.attrs["padding"])

    def transposed_groups(self, w, c) -> bool:
        """Whether the im2col copies a panel's K groups as 16-byte transposes (``_im2col_pack``,
        and a 1x1's A^T packing, ``pack_a_source("KM", vector_groups=True)``): NCHW, 4 x 4
        byte groups (4-row panels, ``maddubs``/``vnni``), stride 1 along W, so a tap's 4
        pixels are 4 adjacent bytes of the image. Zen 3, ResNet-50's 3 x 3 layer
        M3136 N64 K576 at 1 thread (fastest of 80, thread CPU time): the whole im2col 0.58
        -> 0.27 ms, the kernel 1.94 -> 1.62 ms."""
        g = w.geometry
        return (g["data_layout"] == "NCHW" and int(c["mr"]) == 4 and i8.OPERANDS[c["dot"]][0] == 4
                and g["SW"] == 1)

    def extra_constants(self, w) -> list[str]:
        g = w.geometry
        nchw = g["data_layout"] == "NCHW"
        lines = [f"IN_C, IN_H, IN_W = {g['C']}, {g['H']}, {g['W']}   # input channels, height, width",
                 f"OUT_H, OUT_W = {g['OH']}, {g['OW']}",
                 f"P = {g['OH'] * g['OW']}   # output pixels per image"]
        if self.plain_gemm(w):
            return lines
        pt, pl = g["PT"], g["PL"]
        pad = w.attrs["padding"]   # (top, left, bottom, right)
        # tall and wide enough for every window (and the data at PT, PL)
        hp = max(pt + g["H"] + pad[2], (g["OH"] - 1) * g["SH"] + (g["KH"] - 1) * g["DH"] + 1)
        wp = max(pl + g["W"] + pad[3], (g["OW"] - 1) * g["SW"] + (g["KW"] - 1) * g["DW"] + 1)
        lines += [f"BATCH = {g['batch']}",
                  f"SH, SW, PT, PL, DH, DW = {g['SH']}, {g['SW']}, {pt}, {pl}, {g['DH']}, {g['DW']}",
                  f"KH, KW = {g['KH']}, {g['KW']}",
                  f"PAD_H, PAD_W = {hp}, {wp}   # the image padded with the zero point (what the im2col reads)",
                  "# per reduction index k: the flat offset of its tap in the padded image (dilated)",
                  "_k = np.arange(K)"]
        if nchw:   # k = (c, kh, kw), as OIHW flattens; image [C, H, W]
            lines += ["IMG, ROW, PIXEL, CHANNEL = IN_C * PAD_H * PAD_W, PAD_W, 1, PAD_H * PAD_W",
                      "K_OFF_S = ((_k // (KH * KW)) * CHANNEL + (_k // KW) % KH * DH * ROW"
                      " + _k % KW * DW * PIXEL).astype(np.int64)"]
        else:      # k = (kh, kw, c), as HWIO flattens; image [H, W, C]
            lines += ["IMG, ROW, PIXEL, CHANNEL = PAD_H * PAD_W * IN_C, PAD_W * IN_C, IN_C, 1",
                      "K_OFF_S = (_k % IN_C + (_k // (KW * IN_C)) * DH * ROW"
                      " + (_k // IN_C) % KW * DW * PIXEL).astype(np.int64)"]
        return lines + ["K_OFF = K_OFF_S.astype(np.uint64)   # unsigned: indexing without a wraparound test"]

    def operands(self, w, c):
        g = w.geometry
        x_i, w_i = w.p["anchor_inputs"]
        nchw = g["data_layout"] == "NCHW"
        b = (f"B = p{w_i}.reshape((N, K))   # OIHW weight as [O, C*KH*KW]" if nchw
             else f"B = p{w_i}.reshape((K, N))   # HWIO weight as [KH*KW*C, O]")
        b_layout = "NK" if nchw else "KN"
        if self.plain_gemm(w):
            if nchw:   # batch 1: the data is [C, H*W] = A^T
                return ([f"A = p{x_i}.reshape((K, M))   # data [C, H*W]: A transposed", b],
                        i8.pack_a_source("KM", self.transposed_groups(w, c)), b_layout)
            return [f"A = p{x_i}.reshape((M, K))   # data [N*H*W, C]", b], None, b_layout
        a = (f"A = pad_input(p{x_i})   # the data padded with the zero point: the A packing is the im2col"
             if self.padded(w) else f"A = p{x_i}   # the 4-D data: the A packing is the im2col")
        return [a, b], self._im2col_pack(w, c, self.transposed_groups(w, c)), b_layout

    def codegen(self, workload, config: Config) -> str:
        src = super().codegen(workload, config)
        if not self.plain_gemm(workload) and self.padded(workload):
            head, sep, rest = src.partition("\n\n\n@numba.njit(cache=True)\ndef empty_a(")
            src = head + "\n\n\n" + "\n".join(self._pad_source(workload)) + sep + rest
        return src

    @staticmethod
    def _pad_source(w) -> list[str]:
        nchw = w.geometry["data_layout"] == "NCHW"
        shape = "(BATCH, IN_C, PAD_H, PAD_W)" if nchw else "(BATCH, PAD_H, PAD_W, IN_C)"
        inner = ("Xp[:, :, PT:PT + IN_H, PL:PL + IN_W] = X" if nchw
                 else "Xp[:, PT:PT + IN_H, PL:PL + IN_W, :] = X")
        return ["@numba.njit(cache=True)",
                "def pad_input(X):",
                '    """The data with PT/PL (and bottom/right) borders of the zero point: the im2col of',
                '    a padded image needs no bounds test (the border costs one copy of the input)."""',
                f"    Xp = np.empty({shape}, np.uint8)",
                "    Xp[:] = XZP",
                f"    {inner}",
                "    return Xp"]

    @staticmethod
    def _im2col_pack(w, c, transposed: bool = False) -> list[str]:
        """Implicit im2col over the (padded) image, every window inside it: per panel of MR
        rows, each row's window origin once; per K group of G taps their flat offsets once
        and MR x G byte copies unrolled (no index arithmetic per element; NHWC with C a
        multiple of G: one contiguous G-byte span per row and group)."""
        g = w.geometry
        mr = int(c["mr"])
        G = i8.OPERANDS[c["dot"]][0]
        nchw = g["data_layout"] == "NCHW"
        span = (not nchw) and g["C"] % G == 0 and int(c["tile_k"]) % G == 0
        units = [f"U{v}" for v in range(mr * G)]
        lines = [
            ", ".join(units) + " = " + ", ".join(f"np.uint64({v})" for v in range(mr * G)),
            "",
            "",
            "@numba.njit(cache=True)",
            "def pack_a(X, i0, p0, mc, kc, Ap):",
            '    """Implicit im2col: rows i0..i0+mc (output pixels) x taps p0..p0+kc of the',
            "    convolution's A, packed as Ap[q, g, r, t] = A[i0 + q*MR + r, p0 + g*G + t] from",
            "    the image padded with the zero point (every window inside it: no bounds test);",
            "    zeros past mc rows and kc taps.",
            "",
            "    A full panel: each row's window origin once, per K group the taps' flat offsets",
            f"    once, then the {mr} x {G} elements of the group copied unrolled, in Ap's order"
            + ("; NHWC with C" if span else "."),
            *(["    a multiple of G: a group is one contiguous span of G channels per row."] if span else []),
            "    The last, partial panel and group element by element.",
            '    """',
            "    Xf = X.reshape(-1)",
            "    Apf = Ap.reshape(-1)",
            "    # the full panels index with unsigned integers (U<c> = np.uint64(c)): no",
            "    # negative-index wraparound test per element",
            "    full = kc // G",
            "    kg = (kc + G - 1) // G",
            "    for q in range((mc + MR - 1) // MR):",
            "        h = min(MR, mc - q * MR)",
            "        dq = q * (KG * MR * G)   # this panel in Apf",
            "        if h == MR:",
        ]
        body = []
        for r in range(mr):
            body += [f"i = i0 + q * MR + {r}",
                     "n = i // P",
                     "pix = i - n * P",
                     "oh = pix // OUT_W",
                     f"b{r} = np.uint64(n * IMG + oh * SH * ROW + (pix - oh * OUT_W) * SW * PIXEL)   # row {r}'s window origin"]
        group_loop = ["for g in range(full):",
                      "    k = p0 + g * G",
                      "    d = np.uint64(dq + g * (MR * G))"]
        if span:
            group_loop.append("    o = K_OFF[k]   # G contiguous channels of one tap")
            for r in range(mr):
                group_loop += [f"    Apf[d + U{r * G + t}] = Xf[b{r} + o + U{t}]" for t in range(G)]
        else:
            group_loop += [f"    o{t} = K_OFF[k + {t}]" for t in range(G)]
            for r in range(mr):
                group_loop += [f"    Apf[d + U{r * G + t}] = Xf[b{r} + o{t}]" for t in range(G)]
        if transposed:
            # each tap's 4 pixels are 4 adjacent bytes: 4 taps as one 16-byte [tap][pixel]
            # block, stored as the group's [pixel][tap] by one shuffle
            body += ["if b3 == b0 + U3:   # 4 pixels side by side in one image row",
                     "    for g in range(full):",
                     "        k = p0 + g * G",
                     *("        " + ln for ln in i8.interleave4_store(
                         "Xf", tuple(f"b0 + K_OFF[k + {t}]" for t in range(G)), 4, "Apf",
                         "dq + g * (MR * G)")),
                     "else:   # the panel wraps to the next image row: element by element",
                     *("    " + ln for ln in group_loop)]
        else:
            body += group_loop
        body += ["if full < kg:   # the last, partial group"]
        body += ["    for t in range(G):",
                 "        for r in range(MR):",
                 "            Apf[dq + full * (MR * G) + r * G + t] = 0"]
        for r in range(mr):
            body += [f"    for t in range(kc - full * G):",
                     f"        Apf[dq + full * (MR * G) + {r * G} + t] = Xf[np.int64(b{r}) + K_OFF_S[p0 + full * G + t]]"]
        lines += ["            " + ln for ln in body]
        lines += [
            "        else:   # the last panel: rows past h are zero",
            "            for gg in range(kg):",
            "                for r in range(MR):",
            "                    i = i0 + q * MR + r",
            "                    n = i // P",
            "                    pix = i - n * P",
            "                    oh = pix // OUT_W",
            "                    b = n * IMG + oh * SH * ROW + (pix - oh * OUT_W) * SW * PIXEL",
            "                    for t in range(G):",
            "                        kk = gg * G + t",
            "                        v = np.uint8(0)",
            "                        if r < h and kk < kc:",
            "                            v = Xf[b + K_OFF_S[p0 + kk]]",
            "                        Apf[dq + (gg * MR + r) * G + t] = v",
        ]
        return lines

    def out_index(self, w):
        g = w.geometry
        if g["data_layout"] == "NHWC":
            return [], f"i * {g['N']} + j", "j"
        # NCHW: C[i, j] is out[n, j, pixel]
        return (["n = i // P", "pix = i - n * P"], "(n * N + j) * P + pix", "j")


class QGroupedConv2dTemplate(QConv2dTemplate):
    """A grouped (or depthwise) qconv2d, NCHW/OIHW at batch 1 (``QGroupedConv2dGroup``): one
    group's kernel generated as a ``qconv2d`` (``prepare_group``/``kernel_group``: its space,
    im2col and epilogue; the workload's geometry is one group's), called once per group on the
    group's contiguous run of input channels, weights, biases, scales, residual operands and
    output channels. ``prepare`` packs every group's weights into one array (a leading group
    axis). The knobs are the per-group GEMM's; ``parallel`` splits each group's GEMM, or
    (``"g"``) gives each thread whole groups."""

    name = "qconv2d_grouped"
    workload_kind = "qconv2d_grouped"
    version = 6   # 6: parallel="g" (qconv2d's own version is 5)
    prepare_name, kernel_name = "prepare_group", "kernel_group"

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        """The per-group GEMM's space with one more value of ``parallel``: ``g``, the
        config's threads taking whole groups (``prange`` over the groups), each group's GEMM
        on one thread. The GEMM's constraints are checked on the config it is generated from
        (``gemm_config``)."""
        sp = super().space(workload, max_threads)
        knobs = [Knob(k.name, k.values + ("g",), k.ordinal,
                      k.doc + " ('g': the groups, each GEMM on one thread)")
                 if k.name == "parallel" else k for k in sp.knobs]
        cons = [Constraint(k.name, lambda c, k=k: k.check(self.gemm_config(dict(c))))
                for k in sp.constraints]
        return ConfigSpace(knobs, cons)

    def gemm_config(self, c: dict) -> dict:
        return {**c, "parallel": "none", "threads": 1} if c.get("parallel") == "g" else c

    def default_config(self, workload, max_threads: int = 1) -> Config:
        """The per-group GEMM's default, serial; with threads, at least as many groups as
        threads and the int8 GEMM's parallel threshold of work over all groups
        (``gemm_int8.SMALL_PARALLEL_FLOPS``), the threads take whole groups
        (``parallel="g"``, as the float conv2d template's grouped convs): a group's GEMM is
        too small to split (ShuffleNet's, M = 784, N = 60, K = 60) and a split per group is a
        fork and join per group."""
        from search_spaces.templates.gemm_int8 import SMALL_PARALLEL_FLOPS

        cfg = dict(super().default_config(workload, 1))
        if max_threads > 1 and workload.geometry["groups"] >= max_threads \
                and workload.flops() >= SMALL_PARALLEL_FLOPS:
            cfg.update(parallel="g", threads=max_threads)
        return self.space(workload, max_threads).validate(Config(cfg))

    def describe(self, w) -> str:
        return f"{w.geometry['groups']} groups, each " + super().describe(w)

    def extra_constants(self, w) -> list[str]:
        g = w.geometry
        return super().extra_constants(w) + [
            f"GROUPS = {g['groups']}   # GEMMs, one per group of IN_C input and N output channels",
            f"XG, WG, OG = {g['C'] * g['H'] * g['W']}, {g['N'] * g['K']}, {g['N'] * g['OH'] * g['OW']}"
            "   # one group's data, weight and output elements"]

    def entry_points(self, w, c, prepared, kept):
        g = w.geometry
        epi = w.epilogue
        x_i, w_i = w.p["anchor_inputs"]
        bias = qe.bias_param(epi)
        sc = qe.scale_param(epi)
        per_channel = {k: s[0] != 1 for k, (s, _d) in enumerate(w.input_specs())}

        def group_slice(k: int) -> str:
            """Parameter k for group gi: its run of the group's channels (or all of it)."""
            shape = w.input_specs()[k][0]
            if k == x_i:
                return f"p{k}.reshape(-1)[gi * XG:(gi + 1) * XG].reshape((1, IN_C, IN_H, IN_W))"
            if k == w_i:
                return f"p{k}.reshape(-1)[gi * WG:(gi + 1) * WG].reshape(({g['N']}, {', '.join(map(str, shape[1:]))}))"
            if (bias is not None and k == bias[0]) or k == sc:
                return f"p{k}.reshape(-1)[gi * N:(gi + 1) * N]" if per_channel[k] else f"p{k}"
            # a residual (qadd) operand, output-shaped
            return f"p{k}.reshape(-1)[gi * OG:(gi + 1) * OG].reshape((1, N, OUT_H, OUT_W))"

        pparams = ", ".join(f"p{k}" for k in prepared)
        first = ", ".join(group_slice(k) for k in prepared)
        prepare = ["@numba.njit(cache=True)",
                   f"def prepare({pparams}):",
                   '    """Every group\'s (BP, corr) from ``prepare_group``, stacked on a leading group axis."""',
                   "    gi = 0",
                   f"    bp, cr = prepare_group({first})",
                   "    BP = np.empty((GROUPS,) + bp.shape, bp.dtype)",
                   "    corr = np.empty((GROUPS, N), np.int32)",
                   "    BP[0] = bp",
                   "    corr[0] = cr",
                   "    for gi in range(1, GROUPS):",
                   f"        bp, cr = prepare_group({first})",
                   "        BP[gi] = bp",
                   "        corr[gi] = cr",
                   "    return BP, corr"]
        over_groups = c["parallel"] == "g"
        kparams = ", ".join([f"p{k}" for k in kept] + ["BP", "corr"])
        args = ", ".join([group_slice(k) for k in kept] + ["BP[gi]", "corr[gi]"])
        kern = [f"@numba.njit(cache=True{', parallel=True' if over_groups else ''})",
                f"def kernel_prepared({kparams}, out):",
                '    """Each group\'s kernel on its channels; every element of out is written'
                + (' (the threads take whole groups)."""' if over_groups else '."""'),
                "    Of = out.reshape(-1)",
                f"    for gi in {'prange' if over_groups else 'range'}(GROUPS):",
                f"        kernel_group({args}, Of[gi * OG:(gi + 1) * OG].reshape((1, N, OUT_H, OUT_W)))"]
        return [prepare, kern]
