"""The op registry: for each op its attributes, shape rule, NumPy reference and fusion kind.

An op is data (``OpDef``): passes and the executor never special-case an op by name unless
the transformation is about that op. Attributes are checked and completed with their
defaults when a node is made (``OpDef.make_attrs``), so equal computations have equal attrs
and the printer can leave defaults out.
"""
from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import Attrs, TensorType


class OpPattern(enum.IntEnum):
    """Fusion pattern kinds, ordered as in TVM (a group's kind is the max of its members)."""

    ELEMWISE = 0    # out[i] = f(in[i]); same shape
    BROADCAST = 1   # elementwise with NumPy broadcasting of some operands
    INJECTIVE = 2   # each output element reads one input element (reshape, transpose, concat)
    REDUCTION = 3   # windowed or full reductions (pools); takes an elementwise epilogue
    ANCHOR = 4      # compute-heavy op (conv2d, dense, matmul); takes an elementwise epilogue
    OPAQUE = 8      # never fused (softmax, lrn, side effects, fused groups themselves)

    def __str__(self) -> str:
        return self.name.lower()


REQUIRED = object()
_KINDS = ("int", "float", "bool", "str", "ints", "floats", "ints?", "int?")


@dataclass(frozen=True)
class AttrSpec:
    kind: str
    default: Any = REQUIRED
    choices: tuple | None = None

    def coerce(self, op: str, name: str, v: Any) -> Any:
        def bad(expect: str) -> GraphError:
            return GraphError(f"{op}: attribute {name}={v!r} must be {expect}")

        kind = self.kind
        if kind.endswith("?"):
            if v is None:
                return None
            kind = kind[:-1]
        if kind == "int":
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or float(v) != int(v):
                raise bad("an integer")
            v = int(v)
        elif kind == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise bad("a number")
            v = float(v)
        elif kind == "bool":
            if not isinstance(v, (bool, np.bool_)):
                raise bad("true or false")
            v = bool(v)
        elif kind == "str":
            if not isinstance(v, str):
                raise bad("a string")
        elif kind in ("ints", "floats"):
            if not isinstance(v, (list, tuple)):
                raise bad(f"a list of {kind[:-1]}s")
            item = AttrSpec(kind[:-1])
            v = tuple(item.coerce(op, name, x) for x in v)
        if self.choices is not None and v not in self.choices:
            raise GraphError(f"{op}: attribute {name}={v!r} must be one of {list(self.choices)}")
        return v


InferFn = Callable[[Sequence[TensorType], Attrs], TensorType]
ComputeFn = Callable[..., np.ndarray]


@dataclass(frozen=True)
class OpDef:
    """Everything the compiler knows about one op.

    ``arity``: number of inputs, or None for one or more (variadic). ``compute(args, attrs)``
    is the NumPy reference; side-effecting ops also get ``trace=`` (a list or None).
    ``normalize(attrs_dict) -> attrs_dict`` completes attributes that depend on others.
    """

    name: str
    pattern: OpPattern
    arity: int | None
    attrs: Mapping[str, AttrSpec]
    infer: InferFn
    compute: ComputeFn
    side_effect: bool = False
    commutative: bool = False
    normalize: Callable[[dict], dict] | None = None
    doc: str = ""

    def make_attrs(self, given: Mapping[str, Any]) -> Attrs:
        unknown = sorted(set(given) - set(self.attrs))
        if unknown:
            raise GraphError(f"{self.name}: unknown attribute {unknown[0]!r}; "
                             f"known: {', '.join(self.attrs) or 'none'}")
        out: dict[str, Any] = {}
        for name, spec in self.attrs.items():
            if name in given:
                out[name] = spec.coerce(self.name, name, given[name])
            elif spec.default is REQUIRED:
                raise GraphError(f"{self.name}: attribute {name!r} is required")
            else:
                out[name] = spec.default
        if self.normalize is not None:
            out = self.normalize(out)
        return Attrs(out)

    def non_default(self, attrs: Attrs) -> dict[str, Any]:
        """Attributes that differ from their defaults (what the printer shows)."""
        out = {}
        for k, v in attrs.items():
            spec = self.attrs.get(k)
            if spec is None or spec.default is REQUIRED:
                out[k] = v
                continue
            # The default may depend on other attributes (conv2d's kernel_layout).
            others = {j: w for j, w in attrs.items() if j != k}
            try:
                default = self.make_attrs(others)[k]
            except GraphError:
                default = spec.default
            if Attrs({k: v}) != Attrs({k: default}):
                out[k] = v
        return out

    def infer_type(self, types: Sequence[TensorType], attrs: Attrs) -> TensorType:
        if self.arity is None:
            if not types:
                raise GraphError(f"{self.name} takes one or more inputs, got none")
        elif len(types) != self.arity:
            raise GraphError(f"{self.name} takes {self.arity} input(s), got {len(types)}")
        return self.infer(types, attrs)


OPS: dict[str, OpDef] = {}


def register_op(name: str, pattern: OpPattern, arity: int | None, infer: InferFn,
                compute: ComputeFn, attrs: Mapping[str, AttrSpec | tuple] | None = None,
                **kw: Any) -> OpDef:
    """Add an op. ``attrs`` values may be ``AttrSpec`` or ``(kind, default[, choices])``."""
    specs = {k: v if isinstance(v, AttrSpec) else AttrSpec(*v) for k, v in (attrs or {}).items()}
    for k, s in specs.items():
        assert s.kind in _KINDS, (name, k, s.kind)
    if name in OPS:
        raise ValueError(f"op {name!r} registered twice")
    op = OpDef(name, pattern, arity, specs, infer, compute, **kw)
    OPS[name] = op
    return op


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(OPS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise GraphError(f"unknown op {name!r}{hint}") from None


# ---- helpers shared by the shape rules ------------------------------------------------

def same_dtype(op: str, types: Sequence[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise GraphError(f"{op}: inputs must have one dtype, got {', '.join(str(t) for t in types)}")
    return types[0].dtype


def broadcast(op: str, types: Sequence[TensorType]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(t.shape for t in types)))
    except ValueError:
        raise GraphError(f"{op}: shapes {', '.join(str(t) for t in types)} do not broadcast") from None


def norm_axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise GraphError(f"{op}: axis {axis} out of range for rank {rank}")
    return axis % rank


def check_layout(op: str, layout: str, letters: str) -> str:
    if sorted(layout) != sorted(letters):
        raise GraphError(f"{op}: layout {layout!r} must be a permutation of {letters!r}")
    return layout


def require_float(op: str, t: TensorType) -> None:
    if not t.is_float:
        raise GraphError(f"{op}: needs a floating-point input, got {t}")
