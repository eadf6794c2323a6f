"""Neural-network ops: dense/matmul, conv2d, pooling, normalisation, softmax, LRN.

Layouts are strings of dimension letters: data ``NCHW``/``NHWC`` (any permutation of NCHW),
kernels ``OIHW``/``HWIO`` (any permutation of OIHW). References compute in the canonical
NCHW/OIHW order and transpose at the edges; they favour clarity over speed but use
``einsum``/BLAS so a ResNet-50 runs in seconds.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import TensorType
from workloads.graph.ops.registry import (OpPattern, check_layout, norm_axis, register_op,
                                      require_float, same_dtype)

# ---- dense / matmul -------------------------------------------------------------------


def _dense_infer(ts, a):
    x, w = ts
    if w.rank != 2 or x.rank < 1 or x.shape[-1] != w.shape[1]:
        raise GraphError(f"dense: data {x} and weight {w} do not match "
                         "(expected data[..., K] and weight[N, K])")
    return TensorType(x.shape[:-1] + (w.shape[0],), same_dtype("dense", ts))


register_op("dense", OpPattern.ANCHOR, 2, _dense_infer, lambda xs, a: xs[0] @ xs[1].T,
            doc="data[..., K] x weight[N, K]^T -> [..., N]")


def _matmul_shape(op: str, a: tuple, b: tuple) -> tuple:
    if not a or not b:
        raise GraphError(f"{op}: operands must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise GraphError(f"{op}: inner dimensions differ: {list(a)} x {list(b)}")
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        raise GraphError(f"{op}: batch dimensions of {list(a)} and {list(b)} do not broadcast") from None
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


register_op("matmul", OpPattern.ANCHOR, 2,
            lambda ts, a: TensorType(_matmul_shape("matmul", ts[0].shape, ts[1].shape),
                                     same_dtype("matmul", ts)),
            lambda xs, a: np.matmul(xs[0], xs[1]), doc="np.matmul semantics")


def _bmm_infer(ts, a):
    x, y = ts
    if x.rank != 3 or y.rank != 3:
        raise GraphError(f"batch_matmul: operands must be rank 3, got {x} and {y}")
    n, k = (y.shape[1], y.shape[2]) if a["transpose_b"] else (y.shape[2], y.shape[1])
    if x.shape[2] != k or (x.shape[0] != y.shape[0] and 1 not in (x.shape[0], y.shape[0])):
        raise GraphError(f"batch_matmul: {x} and {y} do not match")
    return TensorType((max(x.shape[0], y.shape[0]), x.shape[1], n), same_dtype("batch_matmul", ts))


register_op("batch_matmul", OpPattern.ANCHOR, 2, _bmm_infer,
            lambda xs, a: np.matmul(xs[0], np.swapaxes(xs[1], 1, 2) if a["transpose_b"] else xs[1]),
            attrs={"transpose_b": ("bool", False)}, doc="a[B,M,K] x b[B,K,N] (or b[B,N,K])")

# ---- conv2d ---------------------------------------------------------------------------


def _perm(src: str, dst: str) -> tuple[int, ...]:
    return tuple(src.index(c) for c in dst)


def _norm_padding(p: tuple) -> tuple:
    if len(p) == 1:
        return p * 4
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    return p


def _conv_normalize(a: dict) -> dict:
    a["padding"] = _norm_padding(a["padding"])
    if not a["kernel_layout"]:
        a["kernel_layout"] = "HWIO" if a["data_layout"] == "NHWC" else "OIHW"
    return a


def _pair(op: str, name: str, v: tuple, n: int = 2, minimum: int = 1) -> tuple:
    if len(v) != n or any(x < minimum for x in v):
        raise GraphError(f"{op}: {name} must be {n} integers >= {minimum}, got {list(v)}")
    return v


def _out_dim(op: str, size: int, k: int, s: int, p0: int, p1: int, d: int = 1,
             ceil: bool = False) -> int:
    span = size + p0 + p1 - d * (k - 1) - 1
    if span < 0:
        raise GraphError(f"{op}: window {k} (dilation {d}) larger than padded input {size + p0 + p1}")
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p0:  # last window must start inside the input
        out -= 1
    return out


def _conv_infer(ts, a):
    x, w = ts
    dl = check_layout("conv2d", a["data_layout"], "NCHW")
    kl = check_layout("conv2d", a["kernel_layout"], "OIHW")
    if x.rank != 4 or w.rank != 4:
        raise GraphError(f"conv2d: data and weight must be rank 4, got {x} and {w}")
    n, c, h, wd = (x.shape[dl.index(ch)] for ch in "NCHW")
    o, i, kh, kw = (w.shape[kl.index(ch)] for ch in "OIHW")
    g = a["groups"]
    sh, sw = _pair("conv2d", "strides", a["strides"])
    dh, dw = _pair("conv2d", "dilation", a["dilation"])
    pt, pl, pb, pr = _pair("conv2d", "padding", a["padding"], 4, 0)
    if g < 1 or c != i * g or o % g:
        raise GraphError(f"conv2d: {c} input channels, weight {w} ({kl}) and groups={g} do not match")
    oh = _out_dim("conv2d", h, kh, sh, pt, pb, dh)
    ow = _out_dim("conv2d", wd, kw, sw, pl, pr, dw)
    dims = {"N": n, "C": o, "H": oh, "W": ow}
    return TensorType(tuple(dims[ch] for ch in dl), same_dtype("conv2d", ts))


def _conv_compute(xs, a):
    x = xs[0].transpose(_perm(a["data_layout"], "NCHW"))
    w = xs[1].transpose(_perm(a["kernel_layout"], "OIHW"))
    (sh, sw), (dh, dw), g = a["strides"], a["dilation"], a["groups"]
    pt, pl, pb, pr = a["padding"]
    o, i, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # [N, C, OH, OW, KH, KW]
    n, c, oh, ow = win.shape[:4]
    win = win.reshape(n, g, c // g, oh, ow, kh, kw)
    wg = w.reshape(g, o // g, i, kh, kw)
    acc = np.float64 if x.dtype.kind == "f" else np.int64
    out = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True, dtype=acc)
    out = out.reshape(n, o, oh, ow).astype(x.dtype)
    return out.transpose(_perm("NCHW", a["data_layout"]))


register_op("conv2d", OpPattern.ANCHOR, 2, _conv_infer, _conv_compute, attrs={
    "strides": ("ints", (1, 1)), "padding": ("ints", (0, 0, 0, 0)),
    "dilation": ("ints", (1, 1)), "groups": ("int", 1),
    "data_layout": ("str", "NCHW"), "kernel_layout": ("str", ""),
}, normalize=_conv_normalize, doc="2-D convolution; padding is (top, left, bottom, right)")

# ---- pooling --------------------------------------------------------------------------


def _pool_normalize(a: dict) -> dict:
    a["padding"] = _norm_padding(a["padding"])
    return a


def _pool_infer(op):
    def infer(ts, a):
        (x,) = ts
        lay = check_layout(op, a["layout"], "NCHW")
        if x.rank != 4:
            raise GraphError(f"{op}: input must be rank 4, got {x}")
        kh, kw = _pair(op, "pool_size", a["pool_size"])
        sh, sw = _pair(op, "strides", a["strides"])
        pt, pl, pb, pr = _pair(op, "padding", a["padding"], 4, 0)
        if max(pt, pb) >= kh or max(pl, pr) >= kw:
            raise GraphError(f"{op}: padding {list(a['padding'])} must be smaller than the window")
        h, w = x.shape[lay.index("H")], x.shape[lay.index("W")]
        dims = dict(zip(lay, x.shape))
        dims["H"] = _out_dim(op, h, kh, sh, pt, pb, ceil=a["ceil_mode"])
        dims["W"] = _out_dim(op, w, kw, sw, pl, pr, ceil=a["ceil_mode"])
        return TensorType(tuple(dims[ch] for ch in lay), x.dtype)
    return infer


def _pool_windows(x, a, oshape, fill):
    """Windows [N, C, OH, OW, KH, KW] over x (NCHW) padded with ``fill``; extra (ceil) padding too."""
    (kh, kw), (sh, sw) = a["pool_size"], a["strides"]
    pt, pl, pb, pr = a["padding"]
    oh, ow = oshape
    eb = max(0, (oh - 1) * sh + kh - (x.shape[2] + pt + pb))
    er = max(0, (ow - 1) * sw + kw - (x.shape[3] + pl + pr))
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb + eb), (pl, pr + er)), constant_values=fill)
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    return win[:, :, :oh, :ow], (pt, pb, pl, pr, eb, er)


def _pool_compute(op):
    def compute(xs, a):
        lay = a["layout"]
        x = xs[0].transpose(_perm(lay, "NCHW"))
        t = _pool_infer(op)([TensorType(x.shape, x.dtype.name)], {**a, "layout": "NCHW"})
        oshape = t.shape[2:]
        if op == "max_pool2d":
            lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
            win, _ = _pool_windows(x, a, oshape, lowest)
            out = win.max(axis=(4, 5))
        else:
            win, (pt, pb, pl, pr, eb, er) = _pool_windows(x.astype(np.float64), a, oshape, 0.0)
            ones = np.ones((1, 1) + x.shape[2:])
            inner = 1.0 if a["count_include_pad"] else 0.0
            mask = np.pad(ones, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=inner)
            mask = np.pad(mask, ((0, 0), (0, 0), (0, eb), (0, er)))
            mwin = sliding_window_view(mask, tuple(a["pool_size"]), axis=(2, 3))
            count = mwin[:, :, ::a["strides"][0], ::a["strides"][1]][:, :, :oshape[0], :oshape[1]]
            out = (win.sum(axis=(4, 5)) / np.maximum(count.sum(axis=(4, 5)), 1.0)).astype(x.dtype)
        return out.transpose(_perm("NCHW", lay))
    return compute


_POOL_ATTRS = {"pool_size": ("ints",), "strides": ("ints", (1, 1)),
               "padding": ("ints", (0, 0, 0, 0)), "layout": ("str", "NCHW"),
               "ceil_mode": ("bool", False)}
register_op("max_pool2d", OpPattern.REDUCTION, 1, _pool_infer("max_pool2d"),
            _pool_compute("max_pool2d"), attrs=_POOL_ATTRS, normalize=_pool_normalize)
register_op("avg_pool2d", OpPattern.REDUCTION, 1, _pool_infer("avg_pool2d"),
            _pool_compute("avg_pool2d"),
            attrs={**_POOL_ATTRS, "count_include_pad": ("bool", False)}, normalize=_pool_normalize)


def _gap_infer(ts, a):
    (x,) = ts
    lay = check_layout("global_avg_pool2d", a["layout"], "NCHW")
    if x.rank != 4:
        raise GraphError(f"global_avg_pool2d: input must be rank 4, got {x}")
    return TensorType(tuple(1 if ch in "HW" else d for ch, d in zip(lay, x.shape)), x.dtype)


def _gap_compute(xs, a):
    lay = a["layout"]
    axes = (lay.index("H"), lay.index("W"))
    return xs[0].mean(axis=axes, keepdims=True, dtype=np.float64).astype(xs[0].dtype)


register_op("global_avg_pool2d", OpPattern.REDUCTION, 1, _gap_infer, _gap_compute,
            attrs={"layout": ("str", "NCHW")})

# ---- normalisation and friends --------------------------------------------------------


def _channel_shape(rank: int, axis: int, c: int) -> tuple[int, ...]:
    return tuple(c if i == axis else 1 for i in range(rank))


def _bn_infer(ts, a):
    x = ts[0]
    ax = norm_axis("batch_norm", a["axis"], x.rank)
    for name, t in zip(("gamma", "beta", "mean", "var"), ts[1:]):
        if t.shape != (x.shape[ax],):
            raise GraphError(f"batch_norm: {name} must be [{x.shape[ax]}], got {t}")
    require_float("batch_norm", x)
    return TensorType(x.shape, same_dtype("batch_norm", ts))


def _bn_compute(xs, a):
    x, g, b, m, v = xs
    shp = _channel_shape(x.ndim, a["axis"] % x.ndim, x.shape[a["axis"]])
    scale = (g / np.sqrt(v + x.dtype.type(a["epsilon"]))).reshape(shp)
    return (x - m.reshape(shp)) * scale + b.reshape(shp)


register_op("batch_norm", OpPattern.BROADCAST, 5, _bn_infer, _bn_compute,
            attrs={"axis": ("int", 1), "epsilon": ("float", 1e-5)},
            doc="inference batch norm: (x - mean) / sqrt(var + eps) * gamma + beta")


def _bias_add_infer(ts, a):
    x, b = ts
    ax = norm_axis("bias_add", a["axis"], x.rank)
    if b.shape != (x.shape[ax],):
        raise GraphError(f"bias_add: bias must be [{x.shape[ax]}], got {b}")
    return TensorType(x.shape, same_dtype("bias_add", ts))


register_op("bias_add", OpPattern.BROADCAST, 2, _bias_add_infer,
            lambda xs, a: xs[0] + xs[1].reshape(
                _channel_shape(xs[0].ndim, a["axis"] % xs[0].ndim, xs[1].shape[0])),
            attrs={"axis": ("int", 1)})


def _softmax_infer(ts, a):
    norm_axis("softmax", a["axis"], ts[0].rank)
    require_float("softmax", ts[0])
    return ts[0]


def _softmax(xs, a):
    x = xs[0]
    e = np.exp(x - x.max(axis=a["axis"], keepdims=True))
    return e / e.sum(axis=a["axis"], keepdims=True)


register_op("softmax", OpPattern.OPAQUE, 1, _softmax_infer, _softmax, attrs={"axis": ("int", -1)})


def _lrn_infer(ts, a):
    norm_axis("lrn", a["axis"], ts[0].rank)
    require_float("lrn", ts[0])
    if a["size"] < 1:
        raise GraphError(f"lrn: size must be >= 1, got {a['size']}")
    return ts[0]


def _lrn(xs, a):
    """ONNX LRN: x / (bias + alpha / size * sum of x^2 over a window of channels) ** beta."""
    x = xs[0]
    ax, size = a["axis"] % x.ndim, a["size"]
    sq = np.moveaxis(x.astype(np.float64) ** 2, ax, -1)
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    padded = np.pad(sq, [(0, 0)] * (sq.ndim - 1) + [(lo, hi)])
    csum = np.concatenate([np.zeros(sq.shape[:-1] + (1,)), np.cumsum(padded, axis=-1)], axis=-1)
    window = csum[..., size:] - csum[..., :-size]
    div = (a["bias"] + a["alpha"] / size * np.moveaxis(window, -1, ax)) ** a["beta"]
    return (x / div).astype(x.dtype)


register_op("lrn", OpPattern.OPAQUE, 1, _lrn_infer, _lrn, attrs={
    "size": ("int",), "alpha": ("float", 1e-4), "beta": ("float", 0.75),
    "bias": ("float", 1.0), "axis": ("int", 1)}, doc="local response normalisation across channels")
