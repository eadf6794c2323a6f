"""One converter per ONNX op: ``fn(imp, node, attrs) -> output(s)``.

A converter returns, for each ONNX output, an IR value name (built with ``imp.op``), an
``np.ndarray`` (an import-time value: integer shape arithmetic, constants) or None (an output
the inference graph does not have, e.g. Dropout's mask; an error if anything reads it).
Opset differences are handled here (``imp.opset``): Softmax's axis semantics (13), Clip's
bounds as attributes or inputs (11), Unsqueeze/Squeeze axes as an input (13), Dropout's ratio
as an input (12), optional Gemm C (11).
"""
from __future__ import annotations

import numpy as np

from tuner.frontend.onnx import Importer, elem_dtype

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _opt(node, k: int) -> str | None:
    return node.input[k] if len(node.input) > k and node.input[k] else None


def _need_const(imp: Importer, name: str | None, what: str) -> np.ndarray | None:
    if name is None:
        return None
    v = imp.const_value(name)
    if v is None:
        raise imp.error(f"{what} ({name!r}) must be a constant (an initializer or Constant)")
    return v


def _all_const(imp: Importer, node) -> list[np.ndarray] | None:
    """The import-time arrays of every input when all are integer constants (shape math)."""
    vals = [imp.const_value(i) for i in node.input if i]
    if vals and all(v is not None and v.dtype.kind in "iub" for v in vals):
        return vals
    return None


# ---- convolution and pooling ------------------------------------------------------------

def _pads(imp: Importer, attrs: dict, spatial: tuple, kernel: tuple, strides: tuple,
          dilations: tuple) -> tuple[int, int, int, int]:
    """ONNX pads/auto_pad -> IR padding (top, left, bottom, right)."""
    auto = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        p = [int(x) for x in attrs.get("pads", [0, 0, 0, 0])]
        if len(p) != 4:
            raise imp.error(f"pads {p} must have 4 values for a 2-D window")
        return (p[0], p[1], p[2], p[3])        # ONNX: [h_begin, w_begin, h_end, w_end]
    if auto == "VALID":
        return (0, 0, 0, 0)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise imp.error(f"auto_pad {auto!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        begin.append(small if auto == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return (begin[0], begin[1], end[0], end[1])


def _window(imp: Importer, attrs: dict, x: str, kernel: tuple | None = None):
    t = imp.type(x)
    if t.rank != 4:
        raise imp.error(f"only 2-D windows (rank-4 NCHW input) are supported, got {t}")
    kernel = tuple(int(k) for k in (attrs.get("kernel_shape") or kernel or ()))
    if len(kernel) != 2:
        raise imp.error(f"kernel_shape {list(kernel)} must have 2 values")
    strides = tuple(int(s) for s in attrs.get("strides", (1, 1)))
    dilations = tuple(int(d) for d in attrs.get("dilations", (1, 1)))
    pads = _pads(imp, attrs, t.shape[2:], kernel, strides, dilations)
    return kernel, strides, dilations, pads


def conv(imp: Importer, node, attrs: dict):
    x, w = imp.tensor(node.input[0]), imp.tensor(node.input[1])
    wt = imp.type(w)
    if wt.rank != 4:
        raise imp.error(f"only 2-D convolution is supported (weight {wt})")
    kernel, strides, dilations, pads = _window(imp, attrs, x, wt.shape[2:])
    bias = _opt(node, 2)
    y = imp.op("conv2d", x, w, strides=strides, padding=pads, dilation=dilations,
               groups=int(attrs.get("group", 1)), out=bias is None)
    if bias is not None:
        y = imp.op("bias_add", y, imp.tensor(bias), axis=1, out=True)
    return y


def _pool(op: str):
    def convert(imp: Importer, node, attrs: dict):
        x = imp.tensor(node.input[0])
        kernel, strides, dilations, pads = _window(imp, attrs, x)
        if dilations != (1, 1):
            raise imp.error(f"pooling dilations {list(dilations)} are not supported")
        if int(attrs.get("storage_order", 0)) != 0:
            raise imp.error("storage_order=1 (column-major indices) is not supported")
        extra = {"count_include_pad": bool(attrs.get("count_include_pad", 0))} \
            if op == "avg_pool2d" else {}
        return imp.op(op, x, pool_size=kernel, strides=strides, padding=pads,
                      ceil_mode=bool(attrs.get("ceil_mode", 0)), out=True, **extra)
    return convert


def global_average_pool(imp: Importer, node, attrs: dict):
    x = imp.tensor(node.input[0])
    if imp.type(x).rank != 4:
        raise imp.error(f"only rank-4 NCHW input is supported, got {imp.type(x)}")
    return imp.op("global_avg_pool2d", x, out=True)


# ---- dense ----------------------------------------------------------------------------

def gemm(imp: Importer, node, attrs: dict):
    a, b = imp.tensor(node.input[0]), imp.tensor(node.input[1])
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if attrs.get("transA", 0):
        a = imp.op("transpose", a, axes=(1, 0))
    if not attrs.get("transB", 0):                 # dense wants the weight as [N, K]
        b = imp.op("transpose", b, axes=(1, 0))
    if alpha != 1.0:                               # scales the weight: folded when constant
        b = imp.op("multiply", b, imp.scalar(alpha, b, f"{node.output[0]}.alpha"))
    c = _opt(node, 2)
    y = imp.op("dense", a, b, out=c is None)
    if c is not None:
        cv = imp.tensor(c)
        if beta != 1.0:
            cv = imp.op("multiply", cv, imp.scalar(beta, cv, f"{node.output[0]}.beta"))
        y = imp.op("add", y, cv, out=True)
    return y


def matmul(imp: Importer, node, attrs: dict):
    a, b = imp.tensor(node.input[0]), imp.tensor(node.input[1])
    if imp.type(b).rank == 2:                      # x[..., K] @ W[K, N] is dense(x, W^T)
        return imp.op("dense", a, imp.op("transpose", b, axes=(1, 0)), out=True)
    return imp.op("matmul", a, b, out=True)


# ---- normalisation, activations, arithmetic ------------------------------------------

def batch_norm(imp: Importer, node, attrs: dict):
    if attrs.get("training_mode", 0):
        raise imp.error("training_mode=1 is not supported (inference only)")
    args = [imp.tensor(i) for i in node.input[:5]]
    return imp.op("batch_norm", *args, epsilon=float(attrs.get("epsilon", 1e-5)), axis=1, out=True)


def _unary(op: str):
    def convert(imp: Importer, node, attrs: dict):
        return imp.op(op, imp.tensor(node.input[0]), out=True)
    return convert


_NUMPY_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
                 "maximum": np.maximum, "minimum": np.minimum}


def _variadic(op: str):
    def convert(imp: Importer, node, attrs: dict):
        ins = [i for i in node.input if i]
        consts = _all_const(imp, node)
        if consts is not None and op in _NUMPY_BINARY:
            out = consts[0]
            for v in consts[1:]:
                out = _NUMPY_BINARY[op](out, v)
            return np.asarray(out)
        if len(ins) == 1:
            return imp.tensor(ins[0])
        acc = imp.tensor(ins[0])
        for k, i in enumerate(ins[1:], start=2):
            acc = imp.op(op, acc, imp.tensor(i), out=k == len(ins))
        return acc
    return convert


def divide(imp: Importer, node, attrs: dict):
    consts = _all_const(imp, node)
    if consts is not None:
        a, b = consts
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) ^ (b < 0), -q, q).astype(np.result_type(a, b))
    return imp.op("divide", imp.tensor(node.input[0]), imp.tensor(node.input[1]), out=True)


def clip(imp: Importer, node, attrs: dict):
    x = imp.tensor(node.input[0])
    if imp.opset < 11:
        lo, hi = float(attrs.get("min", -FLOAT32_MAX)), float(attrs.get("max", FLOAT32_MAX))
    else:
        lo_v = _need_const(imp, _opt(node, 1), "Clip min")
        hi_v = _need_const(imp, _opt(node, 2), "Clip max")
        lo = float(lo_v) if lo_v is not None else -FLOAT32_MAX
        hi = float(hi_v) if hi_v is not None else FLOAT32_MAX
    if imp.type(x).is_float:
        lo, hi = max(lo, -FLOAT32_MAX), min(hi, FLOAT32_MAX)
    return imp.op("clip", x, a_min=lo, a_max=hi, out=True)


def dropout(imp: Importer, node, attrs: dict):
    ratio = attrs.get("ratio", 0.5)
    if imp.opset >= 12 and _opt(node, 1):
        v = _need_const(imp, _opt(node, 1), "Dropout ratio")
        ratio = float(v)
    return [imp.op("dropout", imp.tensor(node.input[0]), rate=float(ratio), out=True), None]


def softmax(imp: Importer, node, attrs: dict):
    x = imp.tensor(node.input[0])
    t = imp.type(x)
    if imp.opset >= 13:
        return imp.op("softmax", x, axis=int(attrs.get("axis", -1)), out=True)
    # Before opset 13: the input is coerced to 2-D [prod(dims[:axis]), prod(dims[axis:])].
    axis = int(attrs.get("axis", 1))
    axis = axis + t.rank if axis < 0 else axis
    if not 0 <= axis < t.rank:
        raise imp.error(f"axis {attrs.get('axis')} out of range for {t}")
    if axis == t.rank - 1:
        return imp.op("softmax", x, axis=-1, out=True)
    flat = imp.op("flatten", x, axis=axis)
    sm = imp.op("softmax", flat, axis=1)
    return imp.op("reshape", sm, newshape=t.shape, out=True)


def lrn(imp: Importer, node, attrs: dict):
    return imp.op("lrn", imp.tensor(node.input[0]), size=int(attrs["size"]),
                  alpha=float(attrs.get("alpha", 1e-4)), beta=float(attrs.get("beta", 0.75)),
                  bias=float(attrs.get("bias", 1.0)), axis=1, out=True)


# ---- shapes and data movement ----------------------------------------------------------

def _shape_of(imp: Importer, name: str) -> tuple[int, ...]:
    v = imp.const_value(name)
    return tuple(v.shape) if v is not None and name not in imp.values else imp.type(imp.tensor(name)).shape


def reshape(imp: Importer, node, attrs: dict):
    shape = _need_const(imp, _opt(node, 1), "Reshape shape")
    if shape is None:
        raise imp.error("Reshape needs a shape input")
    src = _shape_of(imp, node.input[0])
    allowzero = bool(attrs.get("allowzero", 0))
    new = [int(d) for d in np.asarray(shape).reshape(-1)]
    new = [src[k] if d == 0 and not allowzero else d for k, d in enumerate(new)]
    x = imp.const_value(node.input[0])
    if x is not None and x.dtype.kind in "iub":
        return x.reshape(new)
    return imp.op("reshape", imp.tensor(node.input[0]), newshape=new, out=True)


def flatten(imp: Importer, node, attrs: dict):
    src = _shape_of(imp, node.input[0])
    axis = int(attrs.get("axis", 1))
    axis = axis + len(src) if axis < 0 else axis
    return imp.op("flatten", imp.tensor(node.input[0]), axis=axis, out=True)


def transpose(imp: Importer, node, attrs: dict):
    perm = attrs.get("perm")
    x = imp.const_value(node.input[0])
    if x is not None and x.dtype.kind in "iub":
        return np.transpose(x, perm)
    return imp.op("transpose", imp.tensor(node.input[0]),
                  axes=tuple(int(p) for p in perm) if perm is not None else None, out=True)


def concat(imp: Importer, node, attrs: dict):
    axis = int(attrs["axis"])
    consts = _all_const(imp, node)
    if consts is not None:
        return np.concatenate([np.atleast_1d(c) for c in consts], axis=axis)
    ins = [imp.tensor(i) for i in node.input if i]
    if len(ins) == 1:
        return ins[0]
    return imp.op("concatenate", *ins, axis=axis, out=True)


def _axes(imp: Importer, node, attrs: dict, what: str) -> list[int] | None:
    if imp.opset >= 13:
        v = _need_const(imp, _opt(node, 1), f"{what} axes")
        return None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]
    return None if attrs.get("axes") is None else [int(a) for a in attrs["axes"]]


def unsqueeze(imp: Importer, node, attrs: dict):
    axes = _axes(imp, node, attrs, "Unsqueeze")
    if not axes:
        raise imp.error("Unsqueeze needs axes")
    src = _shape_of(imp, node.input[0])
    rank = len(src) + len(axes)
    norm = sorted(a + rank if a < 0 else a for a in axes)
    if len(set(norm)) != len(norm) or any(not 0 <= a < rank for a in norm):
        raise imp.error(f"axes {axes} are out of range or repeated for output rank {rank}")
    shape, it = [], iter(src)
    for k in range(rank):
        shape.append(1 if k in norm else next(it))
    x = imp.const_value(node.input[0])
    if x is not None and x.dtype.kind in "iub":
        return x.reshape(shape)
    if len(norm) == 1:
        return imp.op("expand_dims", imp.tensor(node.input[0]), axis=norm[0], out=True)
    return imp.op("reshape", imp.tensor(node.input[0]), newshape=shape, out=True)


def squeeze(imp: Importer, node, attrs: dict):
    axes = _axes(imp, node, attrs, "Squeeze")
    x = imp.const_value(node.input[0])
    if x is not None and x.dtype.kind in "iub":
        return np.squeeze(x, axis=tuple(axes) if axes else None)
    return imp.op("squeeze", imp.tensor(node.input[0]), axes=axes, out=True)


def shape(imp: Importer, node, attrs: dict):
    dims = np.array(_shape_of(imp, node.input[0]), dtype=np.int64)
    start, end = attrs.get("start", 0), attrs.get("end")
    return dims[start:end]


def gather(imp: Importer, node, attrs: dict):
    data, idx = imp.const_value(node.input[0]), imp.const_value(node.input[1])
    if data is None or idx is None or data.dtype.kind not in "iub":
        raise imp.error("Gather is supported only on constant shape values (no IR gather op)")
    return np.take(data, idx, axis=int(attrs.get("axis", 0)))


def cast(imp: Importer, node, attrs: dict):
    dtype = elem_dtype(int(attrs["to"]), f"{imp.where}: Cast")
    x = imp.const_value(node.input[0])
    if x is not None and (x.dtype.kind in "iub" or np.dtype(dtype).kind in "iub"):
        return x.astype(dtype)
    ref = imp.tensor(node.input[0])
    if imp.type(ref).dtype != dtype:
        raise imp.error(f"Cast from {imp.type(ref).dtype} to {dtype} is not supported")
    return ref


def identity(imp: Importer, node, attrs: dict):
    x = imp.const_value(node.input[0])
    return x if x is not None and node.input[0] not in imp.values else imp.tensor(node.input[0])


def constant(imp: Importer, node, attrs: dict):
    from onnx import numpy_helper

    if "value" in attrs:
        arr = numpy_helper.to_array(attrs["value"])
    elif "value_float" in attrs:
        arr = np.array(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        arr = np.array(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        arr = np.array(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        arr = np.array(attrs["value_ints"], np.int64)
    else:
        raise imp.error(f"Constant with {', '.join(attrs) or 'no'} attribute is not supported")
    return imp._supported(np.asarray(arr), f"node {node.output[0]!r}")


def constant_of_shape(imp: Importer, node, attrs: dict):
    from onnx import numpy_helper

    shp = _need_const(imp, _opt(node, 0), "ConstantOfShape shape")
    dims = tuple(int(d) for d in np.asarray(shp).reshape(-1))
    value = numpy_helper.to_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
    value = imp._supported(value.reshape(-1), "ConstantOfShape value")
    if value.dtype.kind != "f":
        return np.full(dims, value[0], dtype=value.dtype)
    return imp.op("constant_of_shape", shape=dims, value=float(value[0]),
                  dtype=value.dtype.name, out=True)


CONVERTERS = {
    # anchors
    "Conv": conv, "Gemm": gemm, "MatMul": matmul,
    # pooling
    "MaxPool": _pool("max_pool2d"), "AveragePool": _pool("avg_pool2d"),
    "GlobalAveragePool": global_average_pool,
    # normalisation and activations
    "BatchNormalization": batch_norm, "Relu": _unary("relu"), "Sigmoid": _unary("sigmoid"),
    "Tanh": _unary("tanh"), "Sqrt": _unary("sqrt"), "Exp": _unary("exp"),
    "Neg": _unary("negative"), "Clip": clip, "Dropout": dropout, "Softmax": softmax, "LRN": lrn,
    # arithmetic (NumPy broadcasting from opset 7)
    "Add": _variadic("add"), "Sub": _variadic("subtract"), "Mul": _variadic("multiply"),
    "Div": divide, "Sum": _variadic("add"), "Max": _variadic("maximum"),
    "Min": _variadic("minimum"),
    # shapes and data movement
    "Reshape": reshape, "Flatten": flatten, "Transpose": transpose, "Concat": concat,
    "Unsqueeze": unsqueeze, "Squeeze": squeeze, "Identity": identity,
    # constants and shape arithmetic (evaluated while importing)
    "Constant": constant, "ConstantOfShape": constant_of_shape, "Shape": shape,
    "Gather": gather, "Cast": cast,
}
