"""Quantized (8-bit) ops: quantize, dequantize, requantize, qconv2d, qdense, qadd.

The integer semantics are the contract with the int8 kernels, so every reference here is
exact (integers, or float32 arithmetic spelled out step by step, never float64):

- ``quantize(x)``: ``clamp(rint(x / scale) + zero_point, qmin, qmax)`` as ONNX QuantizeLinear
  (``rint`` rounds half to even), ``x`` float, result ``uint8``/``int8``;
- ``dequantize(q)``: ``(q - zero_point) * scale`` in float32 (ONNX DequantizeLinear);
- ``qconv2d(x, w)``/``qdense(x, w)``: ``x`` uint8 with zero point ``x_zero_point``, ``w`` int8
  symmetric (zero point 0), ``sum((x - x_zp) * w)`` accumulated exactly in int32. Padding
  pads with ``x_zero_point`` (real 0). A kernel computes ``sum(x * w) - x_zp * sum(w)``
  (``vpmaddubsw``/``vpmaddwd`` or VNNI ``vpdpbusd`` take u8 x s8) and gets the same integers.
  ``w_max`` is the weight range the op promises, |w| <= w_max (64 for 7-bit ``reduce_range``
  weights, 127 for full-range ones, 128 = no promise); the reference refuses weights outside
  it, and the int8 kernels may use AVX2's saturating ``vpmaddubsw`` only when ``w_max <= 64``;
- ``requantize(acc, bias, scale)``: the anchor's epilogue, as MLAS's requantize does it:
  ``clamp(rint(float32(acc + bias) * scale[c]) + zero_point, qmin, qmax)`` with the product
  in float32 and ``scale[c] = x_scale * w_scale[c] / y_scale`` per output channel along
  ``axis``; ``qmin``/``qmax`` also carry a fused relu/clip (relu is ``qmin = zero_point``).
  With ``dtype="float32"`` it stops at ``float32(acc + bias) * scale[c]`` (``scale[c] =
  x_scale * w_scale[c]``): the anchor's output goes straight to FP32 consumers (the logits
  before a softmax) without an 8-bit round trip;
- ``qadd(a, b)``: residual add of two 8-bit tensors with their own scales:
  ``clamp(rint(float32(a - a_zp) * a_mul + float32(b - b_zp) * b_mul) + zero_point, qmin, qmax)``
  with ``a_mul = a_scale / y_scale`` and ``b_mul = b_scale / y_scale`` (float32 products,
  then one float32 sum: a kernel must not contract them into an FMA).

Max pooling, concatenation and the data-movement ops need no quantized variant: on 8-bit
tensors that share one scale and zero point they are exact as they are.
"""
from __future__ import annotations

import numpy as np

from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import TensorType
from workloads.graph.ops.nn import _conv_compute, _conv_infer, _conv_normalize
from workloads.graph.ops.registry import OpPattern, norm_axis, register_op, require_float

QDTYPES = ("uint8", "int8")
QRANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def _check_q(op: str, t: TensorType, dtype: str | tuple = QDTYPES) -> None:
    allowed = (dtype,) if isinstance(dtype, str) else dtype
    if t.dtype not in allowed:
        raise GraphError(f"{op}: needs a {' or '.join(allowed)} input, got {t}")


def _check_range(op: str, a) -> None:
    lo, hi = QRANGE[a["dtype"]]
    zp = a["zero_point"]
    if not lo <= zp <= hi:
        raise GraphError(f"{op}: zero_point {zp} outside {a['dtype']} range [{lo}, {hi}]")
    qmin = lo if a.get("qmin") is None else a["qmin"]
    qmax = hi if a.get("qmax") is None else a["qmax"]
    if not lo <= qmin <= qmax <= hi:
        raise GraphError(f"{op}: clamp [{qmin}, {qmax}] must lie in [{lo}, {hi}]")
    if "scale" in a and not (a["scale"] > 0 and np.isfinite(a["scale"])):
        raise GraphError(f"{op}: scale must be a positive finite number, got {a['scale']}")


def clamp_bounds(a) -> tuple[int, int]:
    """The effective (qmin, qmax) of a node's attributes (None means the dtype's range)."""
    lo, hi = QRANGE[a["dtype"]]
    return (lo if a["qmin"] is None else a["qmin"], hi if a["qmax"] is None else a["qmax"])


def _round_clamp(v: np.ndarray, a) -> np.ndarray:
    qmin, qmax = clamp_bounds(a)
    return np.clip(np.rint(v) + a["zero_point"], qmin, qmax).astype(a["dtype"])


# ---- quantize / dequantize ------------------------------------------------------------

_QATTRS = {"scale": ("float",), "zero_point": ("int", 0), "dtype": ("str", "uint8", QDTYPES),
           "qmin": ("int?", None), "qmax": ("int?", None)}


def _quantize_infer(ts, a):
    require_float("quantize", ts[0])
    _check_range("quantize", a)
    return TensorType(ts[0].shape, a["dtype"])


def _quantize(xs, a):
    x = xs[0].astype(np.float32)
    return _round_clamp(x / np.float32(a["scale"]), a)


register_op("quantize", OpPattern.ELEMWISE, 1, _quantize_infer, _quantize, attrs=_QATTRS,
            doc="float -> 8-bit: clamp(rint(x / scale) + zero_point, qmin, qmax)")


def _dequantize_infer(ts, a):
    _check_q("dequantize", ts[0])
    if not (a["scale"] > 0 and np.isfinite(a["scale"])):
        raise GraphError(f"dequantize: scale must be a positive finite number, got {a['scale']}")
    return TensorType(ts[0].shape, "float32")


register_op("dequantize", OpPattern.ELEMWISE, 1, _dequantize_infer,
            lambda xs, a: (xs[0].astype(np.int32) - np.int32(a["zero_point"])).astype(np.float32)
            * np.float32(a["scale"]),
            attrs={"scale": ("float",), "zero_point": ("int", 0)},
            doc="8-bit -> float32: (q - zero_point) * scale")

# ---- requantize: the int32 accumulator's epilogue -------------------------------------

_RQATTRS = {"axis": ("int", 1), "zero_point": ("int", 0), "dtype": ("str", "uint8", QDTYPES),
            "qmin": ("int?", None), "qmax": ("int?", None)}
_RQ_DTYPES = (*QDTYPES, "float32")


def _requantize_infer(ts, a):
    acc, bias, scale = ts
    _check_q("requantize", acc, "int32")
    if bias.dtype != "int32" or scale.dtype != "float32":
        raise GraphError(f"requantize: bias must be int32 and scale float32, got {bias} and {scale}")
    ax = norm_axis("requantize", a["axis"], acc.rank)
    c = acc.shape[ax]
    for what, t in (("bias", bias), ("scale", scale)):
        if t.shape not in ((c,), (1,)):
            raise GraphError(f"requantize: {what} must be [{c}] or [1] (axis {ax} of {acc}), got {t}")
    if a["dtype"] == "float32":
        if a["zero_point"] != 0 or a["qmin"] is not None or a["qmax"] is not None:
            raise GraphError("requantize: a float32 output takes no zero_point, qmin or qmax")
    else:
        _check_range("requantize", a)
    return TensorType(acc.shape, a["dtype"])


def _requantize(xs, a):
    acc, bias, scale = xs
    ax = a["axis"] % acc.ndim
    shape = tuple(-1 if i == ax else 1 for i in range(acc.ndim))
    total = acc.astype(np.int64) + bias.astype(np.int64).reshape(shape)
    if total.size and (total.min() < np.iinfo(np.int32).min or total.max() > np.iinfo(np.int32).max):
        raise GraphError("requantize: accumulator + bias overflows int32")
    v = total.astype(np.float32) * scale.astype(np.float32).reshape(shape)  # float32 product
    return v if a["dtype"] == "float32" else _round_clamp(v, a)


register_op("requantize", OpPattern.BROADCAST, 3, _requantize_infer, _requantize,
            attrs={**_RQATTRS, "dtype": ("str", "uint8", _RQ_DTYPES)},
            doc="int32 acc -> 8-bit: clamp(rint(float32(acc + bias[c]) * scale[c]) + zp, qmin, qmax); "
                "dtype=float32: float32(acc + bias[c]) * scale[c] (an output read by FP32 ops)")

# ---- quantized anchors ----------------------------------------------------------------


def _int_acc(x: np.ndarray, x_zp: int) -> np.ndarray:
    return x.astype(np.int64) - np.int64(x_zp)


def _check_weight(op: str, w: np.ndarray, a) -> None:
    """The weight range the op promises (``w_max``: 64 for 7-bit ``reduce_range`` weights,
    which AVX2's saturating ``vpmaddubsw`` needs; 127 otherwise) holds for ``w``."""
    if w.size and int(np.abs(w.astype(np.int32)).max()) > a["w_max"]:
        raise GraphError(f"{op}: weight {int(np.abs(w.astype(np.int32)).max())} outside "
                         f"[-{a['w_max']}, {a['w_max']}] (w_max)")


def _to_int32(op: str, acc: np.ndarray) -> np.ndarray:
    if acc.size and (acc.min() < np.iinfo(np.int32).min or acc.max() > np.iinfo(np.int32).max):
        raise GraphError(f"{op}: accumulator overflows int32")
    return acc.astype(np.int32)


def _qconv_infer(ts, a):
    x, w = ts
    _check_q("qconv2d", x, "uint8")
    _check_q("qconv2d", w, "int8")
    if not 0 <= a["x_zero_point"] <= 255:
        raise GraphError(f"qconv2d: x_zero_point {a['x_zero_point']} outside [0, 255]")
    if not 1 <= a["w_max"] <= 128:
        raise GraphError(f"qconv2d: w_max {a['w_max']} outside [1, 128]")
    conv_attrs = {k: v for k, v in a.items() if k not in ("x_zero_point", "w_max")}
    t = _conv_infer([TensorType(x.shape, "int32"), TensorType(w.shape, "int32")], conv_attrs)
    return TensorType(t.shape, "int32")


def _qconv(xs, a):
    _check_weight("qconv2d", xs[1], a)
    conv_attrs = {k: v for k, v in a.items() if k not in ("x_zero_point", "w_max")}
    # Integers in int64 through einsum: exact (products < 2^15, sums of < 2^48 terms).
    acc = _conv_compute([_int_acc(xs[0], a["x_zero_point"]), xs[1].astype(np.int64)], conv_attrs)
    return _to_int32("qconv2d", acc)


register_op("qconv2d", OpPattern.ANCHOR, 2, _qconv_infer, _qconv, attrs={
    "strides": ("ints", (1, 1)), "padding": ("ints", (0, 0, 0, 0)),
    "dilation": ("ints", (1, 1)), "groups": ("int", 1),
    "data_layout": ("str", "NCHW"), "kernel_layout": ("str", ""), "x_zero_point": ("int", 0),
    "w_max": ("int", 128),
}, normalize=_conv_normalize,
    doc="u8 data (zero point x_zero_point) x s8 weight -> int32 accumulator; conv2d's attributes")


def _qdense_infer(ts, a):
    x, w = ts
    _check_q("qdense", x, "uint8")
    _check_q("qdense", w, "int8")
    if not 0 <= a["x_zero_point"] <= 255:
        raise GraphError(f"qdense: x_zero_point {a['x_zero_point']} outside [0, 255]")
    if not 1 <= a["w_max"] <= 128:
        raise GraphError(f"qdense: w_max {a['w_max']} outside [1, 128]")
    if w.rank != 2 or x.rank < 1 or x.shape[-1] != w.shape[1]:
        raise GraphError(f"qdense: data {x} and weight {w} do not match "
                         "(expected data[..., K] and weight[N, K])")
    return TensorType(x.shape[:-1] + (w.shape[0],), "int32")


def _qdense(xs, a):
    _check_weight("qdense", xs[1], a)
    return _to_int32("qdense", _int_acc(xs[0], a["x_zero_point"]) @ xs[1].astype(np.int64).T)


register_op("qdense", OpPattern.ANCHOR, 2, _qdense_infer, _qdense,
            attrs={"x_zero_point": ("int", 0), "w_max": ("int", 128)},
            doc="u8 data[..., K] (zero point x_zero_point) x s8 weight[N, K]^T -> int32 [..., N]")

# ---- residual add ---------------------------------------------------------------------


def _qadd_infer(ts, a):
    a_t, b_t = ts
    for t in ts:
        _check_q("qadd", t)
    if a_t.shape != b_t.shape:
        raise GraphError(f"qadd: operands must have one shape, got {a_t} and {b_t}")
    for k in ("a_mul", "b_mul"):
        if not (a[k] > 0 and np.isfinite(a[k])):
            raise GraphError(f"qadd: {k} must be a positive finite number, got {a[k]}")
    _check_range("qadd", a)
    return TensorType(a_t.shape, a["dtype"])


def _qadd(xs, a):
    fa = (xs[0].astype(np.int32) - np.int32(a["a_zero_point"])).astype(np.float32) * np.float32(a["a_mul"])
    fb = (xs[1].astype(np.int32) - np.int32(a["b_zero_point"])).astype(np.float32) * np.float32(a["b_mul"])
    return _round_clamp(fa + fb, a)


register_op("qadd", OpPattern.BROADCAST, 2, _qadd_infer, _qadd, attrs={
    "a_zero_point": ("int", 0), "a_mul": ("float",), "b_zero_point": ("int", 0),
    "b_mul": ("float",), **{k: v for k, v in _RQATTRS.items() if k != "axis"}},
    commutative=False,
    doc="8-bit residual add: (a - a_zp) * a_mul + (b - b_zp) * b_mul, rounded, + zero_point")
