"""Building graphs: ``GraphBuilder`` (used by frontends, tests and every pass).

Example::

    b = GraphBuilder("mlp")
    x = b.input("x", (8, 64))
    w = b.const(np.ones((32, 64), np.float32), name="w1")
    h = b.op("relu", b.op("dense", x, w))
    graph = b.build(h)

Every op node is checked (known op, arity, attributes completed with defaults) and typed
when it is added, so a graph under construction is always well-typed. Names are unique;
``fresh(base)`` makes a new one that avoids both the names defined so far and ``reserved``
(passes reserve the names of the graph they rewrite).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import (CONST, FUSED, INIT_KEYS, INPUT, Attrs, ConstValue, Graph, Node,
                            TensorType, materialize_init)
from workloads.graph.ops import OpPattern, get_op

ValueRef = Union[Node, str]


def infer_node_type(node: Node, input_types: Sequence[TensorType]) -> TensorType:
    """The type a node computes from its inputs' types (fused bodies are typed recursively)."""
    if node.op == INPUT:
        if node.type is None:
            raise GraphError(f"input %{node.name} has no type", node=node.name)
        return node.type
    if node.op == CONST:
        if node.value is None:
            raise GraphError(f"constant %{node.name} has no value", node=node.name)
        return node.value.type
    try:
        if node.op == FUSED:
            from workloads.graph.passes.infer_type import infer_types
            body = node.body
            if body is None:
                raise GraphError("fused node has no body")
            if len(body.inputs) != len(input_types):
                raise GraphError(f"fused body takes {len(body.inputs)} inputs, got {len(input_types)}")
            if len(body.outputs) != 1:
                raise GraphError(f"fused body must have one output, has {len(body.outputs)}")
            params = [p.replace(type=t) for p, t in zip(body.inputs, input_types)]
            typed = infer_types(body.replace(nodes=tuple(params) + tuple(n for n in body.nodes if not n.is_input)))
            return typed.node(typed.outputs[0]).type
        return get_op(node.op).infer_type(list(input_types), node.attrs)
    except GraphError as exc:
        args = ", ".join(f"%{i}: {t}" for i, t in zip(node.inputs, input_types))
        raise GraphError(f"%{node.name} = {node.op}({args}): {exc}", node=node.name) from None


def has_side_effect(node: Node) -> bool:
    """True when a node must run even if its value is unused (and never be folded or merged)."""
    if node.op == FUSED:
        return node.body is not None and any(has_side_effect(n) for n in node.body.nodes)
    if node.op in (INPUT, CONST):
        return False
    return get_op(node.op).side_effect


def node_pattern(node: Node) -> OpPattern:
    """Fusion kind of a node (fused groups and side-effecting ops are opaque)."""
    if node.op == FUSED or has_side_effect(node):
        return OpPattern.OPAQUE
    return get_op(node.op).pattern


class GraphBuilder:
    """Appends typed nodes with unique names and builds an immutable ``Graph``."""

    def __init__(self, name: str = "main", *, reserved: Iterable[str] = ()) -> None:
        self.name = name
        self._nodes: list[Node] = []
        self._defined: dict[str, Node] = {}
        self._reserved = set(reserved)
        self._counters: dict[str, int] = {}

    # -- names ---------------------------------------------------------------------------
    def fresh(self, base: str = "t") -> str:
        """A name starting with ``base`` not defined here and not reserved."""
        if base not in self._defined and base not in self._reserved:
            return base
        k = self._counters.get(base, 0)
        while True:
            k += 1
            name = f"{base}_{k}"
            if name not in self._defined and name not in self._reserved:
                self._counters[base] = k
                return name

    def _claim(self, name: str | None, base: str) -> str:
        if name is None:
            return self.fresh(base)
        if not isinstance(name, str) or not name:
            raise GraphError(f"bad value name {name!r}")
        if name in self._defined:
            raise GraphError(f"value %{name} is defined twice", node=name)
        return name

    # -- lookups -------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Node:
        try:
            return self._defined[name]
        except KeyError:
            raise GraphError(f"value %{name} is not defined (yet)", node=name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._defined

    def _ref(self, v: ValueRef) -> str:
        name = v.name if isinstance(v, Node) else v
        if name not in self._defined:
            raise GraphError(f"value %{name} is used before it is defined", node=name)
        return name

    def type_of(self, v: ValueRef) -> TensorType:
        t = self[self._ref(v)].type
        if t is None:
            raise GraphError(f"%{self._ref(v)} has no type", node=self._ref(v))
        return t

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    # -- adding nodes --------------------------------------------------------------------
    def add(self, node: Node) -> Node:
        """Append a ready-made node (its inputs must be defined; its name must be new)."""
        self._claim(node.name, node.op)
        for i in node.inputs:
            self._ref(i)
        self._nodes.append(node)
        self._defined[node.name] = node
        return node

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Node:
        return self.add(Node(self._claim(name, "x"), INPUT, type=TensorType(tuple(shape), dtype)))

    def const(self, value: Any, name: str | None = None, *, dtype: str | None = None,
              attrs: Mapping[str, Any] | None = None) -> Node:
        cv = value if isinstance(value, ConstValue) else ConstValue(value, dtype)
        return self.add(Node(self._claim(name, "c"), CONST, attrs=Attrs(attrs or {}),
                             type=cv.type, value=cv))

    def const_init(self, name: str | None, shape: Sequence[int], dtype: str = "float32",
                   **recipe: Any) -> Node:
        """A constant from a recipe (``init="normal", seed=1, scale=0.1``), printed as such."""
        if set(recipe) - INIT_KEYS:
            raise GraphError(f"unknown constant recipe keys {sorted(set(recipe) - INIT_KEYS)}")
        t = TensorType(tuple(shape), dtype)
        return self.const(materialize_init(recipe, t), name, attrs=recipe)

    def op(self, op: str, *inputs: ValueRef, name: str | None = None, **attrs: Any) -> Node:
        """Append ``op(inputs, attrs)``; attributes are checked and the type inferred."""
        refs = tuple(self._ref(i) for i in inputs)
        try:
            full = get_op(op).make_attrs(attrs)
        except GraphError as exc:
            raise GraphError(f"%{name or op}: {exc}", node=name) from None
        node = Node(self._claim(name, op), op, refs, full)
        node = node.replace(type=infer_node_type(node, [self.type_of(r) for r in refs]))
        return self.add(node)

    def fused(self, body: Graph, *inputs: ValueRef, name: str | None = None) -> Node:
        refs = tuple(self._ref(i) for i in inputs)
        node = Node(self._claim(name, "fused"), FUSED, refs, body=body)
        node = node.replace(type=infer_node_type(node, [self.type_of(r) for r in refs]))
        return self.add(node)

    def build(self, *outputs: ValueRef) -> Graph:
        """The graph with these outputs; input nodes are moved first (keeping their order)."""
        if len(outputs) == 1 and isinstance(outputs[0], (list, tuple)):
            outputs = tuple(outputs[0])
        if not outputs:
            raise GraphError(f"graph {self.name} has no outputs")
        outs = tuple(self._ref(o) for o in outputs)
        nodes = [n for n in self._nodes if n.is_input] + [n for n in self._nodes if not n.is_input]
        return Graph(self.name, tuple(nodes), outs)


def const_array(graph_or_builder: Graph | GraphBuilder, name: str) -> np.ndarray | None:
    """The array of ``name`` if it is a constant, else None."""
    node = graph_or_builder[name] if isinstance(graph_or_builder, GraphBuilder) \
        else graph_or_builder.get(name)
    return node.value.array if node is not None and node.is_const else None
