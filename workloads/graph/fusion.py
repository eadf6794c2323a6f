"""Walking a fused graph: enumerate fused groups and describe each one canonically.

A ``GroupDescription`` is what task extraction needs to turn a group into a workload: the
group kind, the main (anchor or reduction) op with its attributes and input types, the
ordered epilogue of elementwise/broadcast ops (each with its attributes, which operand is the
running value, and the types of the others), the input types of the whole group in parameter
order and the output type. ``key`` is canonical JSON (sorted keys, no names), equal for two
groups exactly when they compute the same function of same-typed inputs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from workloads.graph.builder import node_pattern
from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import Attrs, Graph, Node, TensorType
from workloads.graph.ops import OpPattern


@dataclass(frozen=True)
class EpilogueOp:
    op: str
    attrs: Attrs
    operand: int                               # position of the running value in the op's inputs
    others: tuple[tuple[int, TensorType], ...]  # (group parameter index, type) of other operands

    def params(self) -> dict[str, Any]:
        return {"op": self.op, "attrs": dict(self.attrs), "operand": self.operand,
                "others": [[k, list(t.shape), t.dtype] for k, t in self.others]}


@dataclass(frozen=True)
class GroupDescription:
    name: str                          # the fused node (= its output value)
    kind: OpPattern                    # max pattern of the members
    anchor: str | None                 # conv2d, dense, max_pool2d, ...; None for injective groups
    anchor_attrs: Attrs
    anchor_inputs: tuple[int, ...]     # group parameter index of each anchor input
    epilogue: tuple[EpilogueOp, ...]   # in order; empty when the anchor is alone
    inputs: tuple[TensorType, ...]     # types of the group parameters, in order
    output: TensorType
    ops: tuple[str, ...]               # every member op, in order
    # ops applied, in order, to the parameter anchor_inputs[0] before the anchor reads it
    # (the running value starts as that parameter); keys without one are unchanged
    prologue: tuple[EpilogueOp, ...] = ()

    def params(self) -> dict[str, Any]:
        out = {
            "kind": str(self.kind), "anchor": self.anchor, "anchor_attrs": dict(self.anchor_attrs),
            "anchor_inputs": list(self.anchor_inputs),
            "epilogue": [e.params() for e in self.epilogue],
            "inputs": [[list(t.shape), t.dtype] for t in self.inputs],
            "output": [list(self.output.shape), self.output.dtype],
            "ops": list(self.ops),
        }
        if self.prologue:
            out["prologue"] = [e.params() for e in self.prologue]
        return out

    @property
    def key(self) -> str:
        return json.dumps(self.params(), sort_keys=True, separators=(",", ":"))

    def summary(self) -> str:
        head = f"{self.anchor}" if self.anchor else f"{str(self.kind)}"
        if self.prologue:
            head = "[" + " -> ".join(e.op for e in self.prologue) + "] -> " + head
        epi = " -> ".join(e.op for e in self.epilogue)
        return head + (f" + [{epi}]" if epi else "")


def fused_groups(graph: Graph) -> list[Node]:
    """The fused nodes of ``graph`` in execution order."""
    return [n for n in graph.nodes if n.is_fused]


def group_kind(body: Graph) -> OpPattern:
    kinds = [node_pattern(n) for n in body.nodes if n.is_compute]
    return max(kinds) if kinds else OpPattern.ELEMWISE


def describe(node: Node) -> GroupDescription:
    """Describe one fused node (``GraphError`` if ``node`` is not fused)."""
    if not node.is_fused or node.body is None:
        raise GraphError(f"%{node.name} is not a fused group", node=node.name)
    body = node.body
    param_index = {p.name: k for k, p in enumerate(body.inputs)}
    ops = [n for n in body.nodes if n.is_compute]
    kind = group_kind(body)
    main = next((n for n in ops if node_pattern(n) in (OpPattern.ANCHOR, OpPattern.REDUCTION)), None)
    anchor_inputs: tuple[int, ...] = ()
    chain = ops
    running = None
    pro = _prologue(ops, main, body, param_index) if main is not None and main.op == "conv2d" else None
    anchored = main is not None and (ops[0] is main or pro is not None)
    prologue: tuple[EpilogueOp, ...] = ()
    if anchored:
        at = ops.index(main)
        anchor_inputs = tuple(param_index.get(i, -1) for i in main.inputs)
        if pro is not None:
            start, prologue = pro
            anchor_inputs = (start,) + anchor_inputs[1:]
        chain, running = ops[at + 1:], main.name
    epilogue = []
    for n in chain:
        operand = n.inputs.index(running) if running in n.inputs else -1
        epilogue.append(_link(n, operand, body, param_index))
        running = n.name
    return GroupDescription(
        name=node.name, kind=kind,
        anchor=main.op if anchored else None,
        anchor_attrs=main.attrs if anchored else Attrs(),
        anchor_inputs=anchor_inputs, epilogue=tuple(epilogue),
        inputs=tuple(p.type for p in body.inputs), output=node.type, ops=tuple(n.op for n in ops),
        prologue=prologue)


def _link(n: Node, operand: int, body: Graph, param_index: dict[str, int]) -> EpilogueOp:
    others = tuple((param_index.get(i, -1), body.type_of(i)) for k, i in enumerate(n.inputs)
                   if k != operand)
    return EpilogueOp(n.op, n.attrs, operand, others)


def _prologue(ops: list[Node], main: Node, body: Graph,
              param_index: dict[str, int]) -> tuple[int, tuple[EpilogueOp, ...]] | None:
    """(parameter index, ops) when the members before ``main`` are a chain from one parameter
    into main's first input (each op reading the previous one, its other operands
    parameters); None otherwise."""
    at = ops.index(main)
    if at == 0 or not main.inputs or main.inputs[0] != ops[at - 1].name:
        return None
    first, shape = ops[0], body.type_of(main.inputs[0]).shape
    start = next((param_index[i] for i in first.inputs
                  if i in param_index and body.type_of(i).shape == shape), None)
    if start is None:
        return None
    running = body.inputs[start].name
    links = []
    for n in ops[:at]:
        if running not in n.inputs or any(i not in param_index for i in n.inputs if i != running):
            return None
        links.append(_link(n, n.inputs.index(running), body, param_index))
        running = n.name
    return start, tuple(links)
