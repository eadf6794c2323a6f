"""Epilogue code for the int8 anchors (``templates/quant_anchor.py``): the fused ``requantize``
and residual ``qadd`` ops of ``workloads.graph.ops.quant`` as scalar statements on one int32
accumulator, in exactly the reference's arithmetic:

- ``requantize``: ``v = float32(acc + bias[c]) * scale[c]`` (one float32 product), then for an
  8-bit output ``clamp(rint(v) + zero_point, qmin, qmax)`` in float32 (``rint`` rounds half
  to even, as NumPy's), converted to the integer level;
- ``qadd``: ``clamp(rint(float32(a - a_zp) * a_mul + float32(b - b_zp) * b_mul) + zp, qmin,
  qmax)``: two float32 products and one float32 sum, never contracted into an FMA (the
  kernels are compiled without fastmath);
- ``dequantize`` (last, when FP32 ops read the result): ``float32(q - zp) * scale``.

The kernel adds the bias with the zero-point correction folded in (``corr[c] = bias[c] -
x_zero_point * sum_k w[c, k]``): ``acc + corr`` is then the reference's ``acc + bias``.

``tile_statements`` is the same arithmetic on a register tile (the micro-kernel's int32
accumulators, L = 8 lanes per vector at 256 bits, 16 at 512): ``vcvt_f32``, ``vmul``,
``vrint``, ``vmax``/``vmin``, ``vcvt_i32`` and the packs of ``runtime/simd_int8`` (AVX2's
saturating vpackssdw/vpackuswb; AVX-512's vpmovdb narrowing), so an 8-bit output row of the
tile leaves as 2L bytes per pair of vectors; a partial tile at the edge takes ``statements``
lane by lane.
"""
from __future__ import annotations

from workloads.graph.ops.quant import QRANGE

_INT = {"uint8": "np.uint8", "int8": "np.int8", "int32": "np.int32", "float32": "np.float32"}


def _f32(x: float) -> str:
    return f"np.float32({float(x)!r})"


def _clamp_lines(var: str, attrs: dict) -> list[str]:
    lo, hi = QRANGE[attrs["dtype"]]
    qmin = lo if attrs.get("qmin") is None else attrs["qmin"]
    qmax = hi if attrs.get("qmax") is None else attrs["qmax"]
    return [f"{var} = np.rint({var}) + {_f32(attrs['zero_point'])}",
            f"{var} = min(max({var}, {_f32(qmin)}), {_f32(qmax)})   # clamp to [{qmin}, {qmax}]"]


def statements(epilogue: list[dict], channel: str, flat: str) -> tuple[list[str], str]:
    """Statements turning the int32 ``v`` (``acc + corr[channel]``, set by the caller) into the
    output element, and the expression stored (cast to the output dtype). Operand arrays are
    ``sc`` (requantize scale, flat) and ``e<k>`` (flat qadd operands); ``channel`` and
    ``flat`` index them."""
    if not epilogue:
        return [], "np.int32(v)"
    rq = epilogue[0]
    (_, _, _), (_, sshape, _) = rq["others"]
    sidx = "0" if sshape[0] == 1 else channel
    lines = [f"f = np.float32(v) * sc[{sidx}]   # requantize: float32(acc + bias) * scale"]
    dtype = rq["attrs"]["dtype"]
    if dtype == "float32":
        if len(epilogue) > 1:
            raise ValueError("a float32 requantize output takes no further epilogue")
        return lines, "f"
    lines += _clamp_lines("f", rq["attrs"])
    for e in epilogue[1:]:
        a = e["attrs"]
        if e["op"] == "dequantize":   # the 8-bit level back to float32 for FP32 consumers
            lines.append(f"f = np.float32(np.int32(f) - np.int32({a['zero_point']})) "
                         f"* {_f32(a['scale'])}   # dequantize")
            return lines, "f"
        (k, _, _), = e["others"]
        run, other = "np.int32(f)", f"np.int32(e{k}[{flat}])"
        first, second = (run, other) if e["operand"] == 0 else (other, run)
        lines += [f"fa = np.float32({first} - np.int32({a['a_zero_point']})) * {_f32(a['a_mul'])}   # qadd",
                  f"fb = np.float32({second} - np.int32({a['b_zero_point']})) * {_f32(a['b_mul'])}",
                  "f = fa + fb"]
        lines += _clamp_lines("f", a)
        dtype = a["dtype"]
    return lines, f"{_INT[dtype]}(f)"


def out_dtype_src(epilogue: list[dict]) -> str:
    """The NumPy dtype (source) of the element ``statements`` produces."""
    if not epilogue:
        return "np.int32"
    last = epilogue[-1]
    if last["op"] == "dequantize" or last["attrs"]["dtype"] == "float32":
        return "np.float32"
    return _INT[last["attrs"]["dtype"]]


def scale_param(epilogue: list[dict]) -> int | None:
    """Parameter index of the requantize scale (None without a requantize)."""
    return epilogue[0]["others"][1][0] if epilogue else None


def bias_param(epilogue: list[dict]) -> tuple[int, bool] | None:
    """(parameter index, per channel) of the requantize bias (None without a requantize)."""
    if not epilogue:
        return None
    k, shape, _ = epilogue[0]["others"][0]
    return k, shape[0] != 1


def bias_source(epilogue: list[dict], channel: str) -> str:
    """Source of output channel ``channel``'s requantize bias ("0" without a requantize)."""
    bias = bias_param(epilogue)
    return "0" if bias is None else f"p{bias[0]}[" + (channel if bias[1] else "0") + "]"


def prepared_inputs(workload) -> tuple[int, ...]:
    """What a quantized anchor's ``prepare`` takes: the weight and, with a requantize, the bias."""
    bias = bias_param(workload.epilogue)
    return (workload.p["anchor_inputs"][1],) + ((bias[0],) if bias is not None else ())


def operand_params(epilogue: list[dict]) -> list[int]:
    """Parameter indices of the qadd operands."""
    return [e["others"][0][0] for e in epilogue[1:] if e["op"] == "qadd"]


def tile_reason(epilogue: list[dict]) -> str | None:
    """Why the epilogue has no register-tile form (None: it has one): an 8-bit requantize,
    then any number of 8-bit qadds."""
    if not epilogue:
        return "no requantize (int32 output)"
    if epilogue[0]["attrs"]["dtype"] == "float32":
        return "a float32 requantize output"
    for e in epilogue[1:]:
        if e["op"] != "qadd":
            return f"a {e['op']} after the requantize"
    return None


def _splat(name: str, x: float, lanes: int) -> str:
    return f"{name} = vsplat({_f32(x)}, {lanes})"


def _clamp_splats(tag: str, attrs: dict, lanes: int) -> list[str]:
    lo, hi = QRANGE[attrs["dtype"]]
    qmin = lo if attrs.get("qmin") is None else attrs["qmin"]
    qmax = hi if attrs.get("qmax") is None else attrs["qmax"]
    return [_splat(f"zp{tag}", attrs["zero_point"], lanes), _splat(f"lo{tag}", qmin, lanes),
            _splat(f"hi{tag}", qmax, lanes)]


def tile_statements(epilogue: list[dict], acc: list[list[str]], lanes: int, n: int,
                    nchw: bool = False) -> list[str]:
    """The write-back of a micro-kernel's int32 register tile ``acc[r][v]`` (row r, vector v
    of ``lanes`` lanes; an even number per row) as the epilogue's 8-bit levels into the flat
    output ``C`` of ``n`` channels, reading ``corr``, ``sc`` and the flat qadd operands
    ``e<k>`` at ``ci``, ``cj``. Row-major output (NHWC, dense): each row's bytes stored as
    2 * ``lanes``-byte vectors. ``nchw``: rows are pixels of ``P`` per image, channels ``P`` apart: each
    4 rows x 16 channels stored transposed (``vstore_t4``: one 4-byte store per channel; MR a
    multiple of 4), a residual operand read the same way (``vload_t4``). A full tile in
    registers; a partial one (``mlen`` < MR, ``nlen`` < NR, or NCHW rows across two images)
    lane by lane (``vlane``) through ``statements``."""
    if tile_reason(epilogue) is not None or lanes not in (8, 16) or len(acc[0]) % 2 or (nchw and len(acc) % 4):
        raise ValueError("no register-tile form for this epilogue or tile")
    mr, nv = len(acc), len(acc[0])
    rq = epilogue[0]
    per_channel = rq["others"][1][1][0] != 1
    out = epilogue[-1]["attrs"]["dtype"]
    pack = "vpack_u8" if out == "uint8" else "vpack_i8"
    qadds = list(enumerate(epilogue[1:], 1))
    full = ["# requantize in registers: int32 + corr -> float32 * scale -> rint + zp -> clamp,",
            f"# packed to bytes ({pack}): {2 * lanes} channels per row and pair of vectors"]
    for v in range(nv):
        full.append(f"k{v} = vload(corr, cj + {v * lanes}, {lanes})   # zero-point-corrected bias")
        if per_channel:
            full.append(f"s{v} = vload(sc, cj + {v * lanes}, {lanes})   # per-channel scale")
    if not per_channel:
        full.append(f"s = vsplat(sc[0], {lanes})")
    full += _clamp_splats("0", rq["attrs"], lanes)
    for t, e in qadds:
        a = e["attrs"]
        full += [_splat(f"az{t}", a["a_zero_point"], lanes), _splat(f"am{t}", a["a_mul"], lanes),
                 _splat(f"bz{t}", a["b_zero_point"], lanes), _splat(f"bm{t}", a["b_mul"], lanes)]
        full += _clamp_splats(str(t), a, lanes)

    def row_bytes(r: int, p: int, operand) -> list[str]:
        """Row r's channels of pair p requantized into the byte vector y<r % 4>."""
        lines = []
        for h in range(2):
            v = 2 * p + h
            x = f"x{h}"
            sv = f"s{v}" if per_channel else "s"
            lines += [f"{x} = vmul(vcvt_f32(vadd({acc[r][v]}, k{v})), {sv})",
                      f"{x} = vmin(vmax(vadd(vrint({x}), zp0), lo0), hi0)"]
            for t, e in qadds:
                other = f"vcvt_f32(vwiden_i32(o{t}, {operand(r, h)}, {lanes}))"
                first, second = (x, other) if e["operand"] == 0 else (other, x)
                lines += [f"{x} = vadd(vmul(vsub({first}, az{t}), am{t}), vmul(vsub({second}, bz{t}), bm{t}))",
                          f"{x} = vmin(vmax(vadd(vrint({x}), zp{t}), lo{t}), hi{t})"]
        return lines + [f"y{r % 4} = {pack}(vcvt_i32(x0), vcvt_i32(x1))"]

    if not nchw:
        for r in range(mr):
            row = f"(ci + {r}) * {n} + cj"
            for p in range(nv // 2):
                for t, e in qadds:
                    (k, _, _), = e["others"]
                    full.append(f"o{t} = vload(e{k}, {row} + {2 * p * lanes}, {2 * lanes})   # qadd operand bytes")
                full += row_bytes(r, p, lambda r, h: h * lanes)
                full.append(f"vstore(C, {row} + {2 * p * lanes}, y{r % 4})")
        cond = "mlen == MR and nlen == NR"
        where = ["i = ci + r"]
        flat = f"i * {n} + j"
    else:
        full += ["nb = ci // P   # the image of the tile's rows",
                 "base = (nb * N + cj) * P + ci - nb * P   # flat index of (channel cj, first pixel)"]
        for p in range(nv // 2):
            for g4 in range(mr // 4):
                at = f"base + {2 * p * lanes} * P + {4 * g4}"
                for t, e in qadds:
                    (k, _, _), = e["others"]
                    full.append(f"o{t} = vload_t4(e{k}, {at}, P, {2 * lanes})   # qadd operand: 4 pixels x {2 * lanes} channels")
                for r in range(4 * g4, 4 * g4 + 4):
                    full += row_bytes(r, p, lambda r, h: (r % 4) * 2 * lanes + h * lanes)
                full.append(f"vstore_t4(C, {at}, P, vconcat(vconcat(y0, y1), vconcat(y2, y3)))"
                            "   # 4 bytes per channel")
        cond = "mlen == MR and nlen == NR and ci - ci // P * P + MR <= P"
        where = ["i = ci + r", "nb = i // P", "pix = i - nb * P"]
        flat = f"(nb * {n} + j) * P + pix"
    stmts, store = statements(epilogue, "j", flat)
    # no spill array: the accumulators are read lane by lane
    part = ["# partial tile: lane by lane, what fits"]
    for r in range(mr):
        part += [f"if {r} < mlen:"] + ["    " + ln.replace("+ r", f"+ {r}") for ln in where]
        for v in range(nv):
            part += [f"    for cc in range(min({lanes}, nlen - {v * lanes})):",
                     f"        j = cj + {v * lanes} + cc",
                     f"        v = np.int32(vlane({acc[r][v]}, cc) + corr[j])"]
            part += ["        " + ln for ln in stmts]
            part += [f"        C[{flat}] = {store}"]
    return ([f"if {cond}:"] + ["    " + ln for ln in full]
            + ["else:"] + ["    " + ln for ln in part])
