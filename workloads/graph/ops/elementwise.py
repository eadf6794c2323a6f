"""Elementwise and broadcasting ops: unary math, activations, and binary arithmetic."""
from __future__ import annotations

from typing import Callable

import numpy as np

from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import TensorType
from workloads.graph.ops.registry import (OpPattern, broadcast, register_op, require_float,
                                      same_dtype)


def _unary(name: str, fn: Callable, attrs: dict | None = None, float_only: bool = False,
           doc: str = "") -> None:
    def infer(ts, a):
        if float_only:
            require_float(name, ts[0])
        return ts[0]

    register_op(name, OpPattern.ELEMWISE, 1, infer, lambda xs, a: fn(xs[0], a),
                attrs=attrs, doc=doc)


_unary("relu", lambda x, a: np.maximum(x, x.dtype.type(0)), doc="max(x, 0)")
# 0.5 * (tanh(x/2) + 1) is the logistic function without overflow for large |x|.
_unary("sigmoid", lambda x, a: 0.5 * (np.tanh(0.5 * x) + 1), float_only=True)
_unary("tanh", lambda x, a: np.tanh(x), float_only=True)
_unary("sqrt", lambda x, a: np.sqrt(x), float_only=True)
_unary("exp", lambda x, a: np.exp(x), float_only=True)
_unary("negative", lambda x, a: np.negative(x))
_unary("clip", lambda x, a: np.clip(x, a["a_min"], a["a_max"]),
       attrs={"a_min": ("float",), "a_max": ("float",)}, doc="min(max(x, a_min), a_max)")
_unary("dropout", lambda x, a: x, attrs={"rate": ("float", 0.5)},
       doc="identity at inference (SimplifyInference removes it)")


def _int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.any(b == 0):
        raise GraphError("divide: integer division by zero")
    q = np.abs(a) // np.abs(b)  # truncation toward zero, as in C and ONNX
    return np.where((a < 0) ^ (b < 0), -q, q)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(a, b), np.integer):
        return _int_divide(a, b)
    return np.divide(a, b)


def _binary(name: str, fn: Callable, commutative: bool = False) -> None:
    def infer(ts, a) -> TensorType:
        return TensorType(broadcast(name, ts), same_dtype(name, ts))

    register_op(name, OpPattern.BROADCAST, 2, infer, lambda xs, a: fn(xs[0], xs[1]),
                commutative=commutative, doc=f"{name} with NumPy broadcasting")


_binary("add", np.add, commutative=True)
_binary("subtract", np.subtract)
_binary("multiply", np.multiply, commutative=True)
_binary("divide", _divide)
_binary("maximum", np.maximum, commutative=True)
_binary("minimum", np.minimum, commutative=True)
