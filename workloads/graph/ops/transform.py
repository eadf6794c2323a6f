"""Injective (data movement) ops, constant generators and the side-effecting ``probe``."""
from __future__ import annotations

import numpy as np

from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import DTYPES, TensorType
from workloads.graph.ops.registry import OpPattern, check_layout, norm_axis, register_op, same_dtype


def _reshape_shape(src: tuple, newshape: tuple) -> tuple:
    size = int(np.prod(src, dtype=np.int64))
    if sum(1 for d in newshape if d == -1) > 1 or any(d < -1 for d in newshape):
        raise GraphError(f"reshape: bad newshape {list(newshape)} (at most one -1, others >= 0)")
    known = int(np.prod([d for d in newshape if d != -1], dtype=np.int64))
    if -1 in newshape:
        if known == 0 or size % known:
            raise GraphError(f"reshape: cannot reshape {list(src)} into {list(newshape)}")
        newshape = tuple(size // known if d == -1 else d for d in newshape)
    if int(np.prod(newshape, dtype=np.int64)) != size:
        raise GraphError(f"reshape: cannot reshape {list(src)} ({size} elements) into {list(newshape)}")
    return tuple(newshape)


register_op("reshape", OpPattern.INJECTIVE, 1,
            lambda ts, a: TensorType(_reshape_shape(ts[0].shape, a["newshape"]), ts[0].dtype),
            lambda xs, a: xs[0].reshape(_reshape_shape(xs[0].shape, a["newshape"])),
            attrs={"newshape": ("ints",)}, doc="newshape may hold one -1")


def _flatten_shape(shape: tuple, axis: int) -> tuple:
    ax = norm_axis("flatten", axis, len(shape) + 1) if axis != len(shape) else axis
    return (int(np.prod(shape[:ax], dtype=np.int64)), int(np.prod(shape[ax:], dtype=np.int64)))


register_op("flatten", OpPattern.INJECTIVE, 1,
            lambda ts, a: TensorType(_flatten_shape(ts[0].shape, a["axis"]), ts[0].dtype),
            lambda xs, a: xs[0].reshape(_flatten_shape(xs[0].shape, a["axis"])),
            attrs={"axis": ("int", 1)}, doc="2-D [prod(dims[:axis]), prod(dims[axis:])]")


def _axes(op: str, axes: tuple | None, rank: int) -> tuple:
    if axes is None:
        return tuple(reversed(range(rank)))
    norm = tuple(norm_axis(op, a, rank) for a in axes)
    if sorted(norm) != list(range(rank)):
        raise GraphError(f"{op}: axes {list(axes)} are not a permutation of 0..{rank - 1}")
    return norm


register_op("transpose", OpPattern.INJECTIVE, 1,
            lambda ts, a: TensorType(tuple(ts[0].shape[i] for i in _axes("transpose", a["axes"], ts[0].rank)),
                                     ts[0].dtype),
            lambda xs, a: xs[0].transpose(_axes("transpose", a["axes"], xs[0].ndim)),
            attrs={"axes": ("ints?", None)}, doc="axes=None reverses the dimensions")


def layout_perm(src: str, dst: str) -> tuple[int, ...]:
    """Axes permutation taking a tensor in layout ``src`` to layout ``dst``."""
    return tuple(src.index(c) for c in dst)


def _lt_infer(ts, a):
    src, dst = a["src_layout"], a["dst_layout"]
    check_layout("layout_transform", dst, src)
    if len(set(src)) != len(src) or len(src) != ts[0].rank:
        raise GraphError(f"layout_transform: layout {src!r} does not fit {ts[0]}")
    return TensorType(tuple(ts[0].shape[i] for i in layout_perm(src, dst)), ts[0].dtype)


register_op("layout_transform", OpPattern.INJECTIVE, 1, _lt_infer,
            lambda xs, a: xs[0].transpose(layout_perm(a["src_layout"], a["dst_layout"])),
            attrs={"src_layout": ("str",), "dst_layout": ("str",)},
            doc="e.g. NCHW -> NHWC, OIHW -> HWIO (a transpose named by layouts)")


def _concat_infer(ts, a):
    dtype = same_dtype("concatenate", ts)
    rank = ts[0].rank
    ax = norm_axis("concatenate", a["axis"], rank)
    for t in ts[1:]:
        if t.rank != rank or any(d != e for i, (d, e) in enumerate(zip(t.shape, ts[0].shape)) if i != ax):
            raise GraphError(f"concatenate: {t} does not match {ts[0]} outside axis {ax}")
    shape = list(ts[0].shape)
    shape[ax] = sum(t.shape[ax] for t in ts)
    return TensorType(tuple(shape), dtype)


register_op("concatenate", OpPattern.INJECTIVE, None, _concat_infer,
            lambda xs, a: np.concatenate(xs, axis=a["axis"]), attrs={"axis": ("int", 1)})


def _expand_shape(shape: tuple, axis: int, num: int) -> tuple:
    rank = len(shape)
    if not -rank - 1 <= axis <= rank or num < 0:
        raise GraphError(f"expand_dims: axis {axis} out of range for rank {rank}")
    ax = axis % (rank + 1)
    return shape[:ax] + (1,) * num + shape[ax:]


register_op("expand_dims", OpPattern.INJECTIVE, 1,
            lambda ts, a: TensorType(_expand_shape(ts[0].shape, a["axis"], a["num_newaxis"]), ts[0].dtype),
            lambda xs, a: xs[0].reshape(_expand_shape(xs[0].shape, a["axis"], a["num_newaxis"])),
            attrs={"axis": ("int",), "num_newaxis": ("int", 1)})


def _squeeze_shape(shape: tuple, axes: tuple | None) -> tuple:
    if axes is None:
        return tuple(d for d in shape if d != 1)
    norm = {norm_axis("squeeze", a, len(shape)) for a in axes}
    for a in norm:
        if shape[a] != 1:
            raise GraphError(f"squeeze: axis {a} of {list(shape)} is not 1")
    return tuple(d for i, d in enumerate(shape) if i not in norm)


register_op("squeeze", OpPattern.INJECTIVE, 1,
            lambda ts, a: TensorType(_squeeze_shape(ts[0].shape, a["axes"]), ts[0].dtype),
            lambda xs, a: xs[0].reshape(_squeeze_shape(xs[0].shape, a["axes"])),
            attrs={"axes": ("ints?", None)}, doc="axes=None removes every dimension of size 1")


def _cos_infer(ts, a):
    return TensorType(a["shape"], a["dtype"])


register_op("constant_of_shape", OpPattern.INJECTIVE, 0, _cos_infer,
            lambda xs, a: np.full(a["shape"], a["value"], dtype=a["dtype"]),
            attrs={"shape": ("ints",), "value": ("float", 0.0), "dtype": ("str", "float32", DTYPES)},
            doc="a tensor filled with value (ONNX ConstantOfShape with its shape resolved)")


def _probe(xs, a, trace=None):
    if trace is not None:
        trace.append((a["tag"], np.array(xs[0], copy=True)))
    return xs[0]


register_op("probe", OpPattern.OPAQUE, 1, lambda ts, a: ts[0], _probe,
            attrs={"tag": ("str", "")}, side_effect=True,
            doc="identity that records its input in the executor's trace (a side effect)")
