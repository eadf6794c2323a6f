"""The graph IR: tensor types, attributes, constants, nodes and graphs — all immutable.

A ``Graph`` is a list of ``Node``s in topological order plus the names of its outputs. Every
node defines exactly one value, named by the node (SSA). Three node kinds are built in:

- ``input``: a graph parameter (its ``type`` is required);
- ``const``: holds an array (``value``, a read-only ``ConstValue``);
- ``fused``: holds a subgraph (``body``, a ``Graph`` whose inputs are bound positionally to
  the node's inputs, with one output) — the "primitive function" FuseOps produces;

every other node applies a registered op (``workloads.graph.ops``) to its inputs. Nodes are
changed with ``node.replace(...)``, graphs with ``graph.replace(...)``; passes build new
graphs with ``GraphBuilder`` (``workloads.graph.builder``).
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from workloads.graph.graph_errors import GraphError

DTYPES = ("float32", "float64", "int32", "int64", "uint8", "int8")  # 8-bit: quantized values
INPUT, CONST, FUSED = "input", "const", "fused"
BUILTIN_OPS = (INPUT, CONST, FUSED)


@dataclass(frozen=True)
class TensorType:
    """Static shape and dtype of a value; printed as ``float32[1, 3, 224, 224]``."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise GraphError(f"bad shape {self.shape!r}: dimensions must be integers") from None
        if any(d < 0 for d in shape):
            raise GraphError(f"bad shape {shape}: dimensions must be >= 0")
        if self.dtype not in DTYPES:
            raise GraphError(f"unsupported dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        object.__setattr__(self, "shape", shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


def _freeze(value: Any) -> Any:
    """Attribute values are None, bool, int, float, str or (nested) tuples of them."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise GraphError(f"attribute value {value!r} ({type(value).__name__}) is not supported")


class Attrs(Mapping[str, Any]):
    """An immutable, hashable mapping of attribute name -> value, kept in sorted key order."""

    __slots__ = ("_d",)

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        d = dict(items)
        self._d = {k: _freeze(d[k]) for k in sorted(d)}

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return hash(tuple((k, type(v).__name__, v) for k, v in self._d.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        # bool and int compare equal in Python; attributes of different kinds must not.
        return dict(self) == dict(other) and all(
            type(v) is type(other[k]) for k, v in self._d.items())

    def replace(self, **changes: Any) -> "Attrs":
        return Attrs({**self._d, **changes})

    def __repr__(self) -> str:
        return f"Attrs({self._d!r})"


EMPTY_ATTRS = Attrs()


class ConstValue:
    """A read-only array compared and hashed by dtype, shape and exact bytes."""

    __slots__ = ("array", "_digest")

    def __init__(self, array: Any, dtype: str | None = None) -> None:
        a = np.array(array, dtype=dtype, order="C", copy=True)
        if a.dtype.name not in DTYPES:
            raise GraphError(f"constant dtype {a.dtype.name!r} is not supported; "
                             f"choose one of {', '.join(DTYPES)}")
        a.flags.writeable = False
        self.array = a
        self._digest: bytes | None = None

    @property
    def type(self) -> TensorType:
        return TensorType(self.array.shape, self.array.dtype.name)

    @property
    def digest(self) -> bytes:
        if self._digest is None:
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{self.array.dtype.name}{self.array.shape}".encode())
            h.update(self.array.tobytes())
            self._digest = h.digest()
        return self._digest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConstValue):
            return NotImplemented
        return self is other or self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __getstate__(self) -> tuple:
        return (self.array, self._digest)

    def __setstate__(self, state: tuple) -> None:
        self.array, self._digest = state

    def __repr__(self) -> str:
        return f"ConstValue({self.type})"


@dataclass(frozen=True)
class Node:
    """One value-defining statement: ``name = op(inputs, attrs) : type``."""

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    attrs: Attrs = EMPTY_ATTRS
    type: TensorType | None = None
    value: ConstValue | None = None
    body: "Graph | None" = None

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, tuple):
            object.__setattr__(self, "inputs", tuple(self.inputs))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))

    @property
    def is_input(self) -> bool:
        return self.op == INPUT

    @property
    def is_const(self) -> bool:
        return self.op == CONST

    @property
    def is_fused(self) -> bool:
        return self.op == FUSED

    @property
    def is_compute(self) -> bool:
        """True for nodes that compute at run time (ops and fused groups)."""
        return self.op not in (INPUT, CONST)

    def replace(self, **changes: Any) -> "Node":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Graph:
    """Nodes in topological order (inputs first) and the names of the output values."""

    name: str
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple):
            object.__setattr__(self, "nodes", tuple(self.nodes))
        if not isinstance(self.outputs, tuple):
            object.__setattr__(self, "outputs", tuple(self.outputs))

    @cached_property
    def _index(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        try:
            return self._index[name]
        except KeyError:
            raise GraphError(f"graph {self.name} has no value %{name}", node=name) from None

    def get(self, name: str) -> Node | None:
        return self._index.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.is_input)

    @property
    def input_types(self) -> tuple[TensorType | None, ...]:
        return tuple(n.type for n in self.inputs)

    @property
    def output_types(self) -> tuple[TensorType | None, ...]:
        return tuple(self.node(o).type for o in self.outputs)

    @cached_property
    def users(self) -> Mapping[str, tuple[str, ...]]:
        """Value name -> names of the nodes that read it (each consumer once, in order)."""
        users: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                users.setdefault(i, []).append(n.name)
        return {k: tuple(v) for k, v in users.items()}

    @cached_property
    def output_set(self) -> frozenset[str]:
        return frozenset(self.outputs)

    def type_of(self, name: str) -> TensorType:
        t = self.node(name).type
        if t is None:
            raise GraphError(f"%{name} has no type (run InferType)", node=name)
        return t

    def replace(self, **changes: Any) -> "Graph":
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        from workloads.graph.text import to_text
        return to_text(self)


def materialize_init(attrs: Mapping[str, Any], ttype: TensorType) -> np.ndarray:
    """The array of a constant described by a recipe ``init="normal"|"uniform", seed=...``.

    Recipes let example graphs carry deterministic weights without listing them: ``normal``
    draws ``scale * N(0, 1)``, ``uniform`` draws from ``[low, high)`` (integers for int
    dtypes), both from ``numpy.random.default_rng(seed)``.
    """
    init = attrs.get("init")
    rng = np.random.default_rng(int(attrs.get("seed", 0)))
    if init == "normal":
        a = rng.standard_normal(ttype.shape) * float(attrs.get("scale", 1.0))
    elif init == "uniform":
        low, high = float(attrs.get("low", -1.0)), float(attrs.get("high", 1.0))
        if not ttype.is_float:
            a = rng.integers(int(low), int(high), size=ttype.shape, endpoint=False)
        else:
            a = rng.uniform(low, high, size=ttype.shape)
    else:
        raise GraphError(f"unknown constant init {init!r}; choose normal or uniform")
    return a.astype(ttype.dtype)


INIT_KEYS = frozenset({"init", "seed", "scale", "low", "high"})
