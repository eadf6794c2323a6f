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


def operand_params(epilogue: list[dict]) -> list[int]:
    """Parameter indices of the qadd operands."""
    return [e["others"][0][0] for e in epilogue[1:] if e["op"] == "qadd"]
