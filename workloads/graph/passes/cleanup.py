"""EliminateCommonSubexpr and DeadCodeElimination."""
from __future__ import annotations

from typing import Hashable

from workloads.graph.builder import GraphBuilder, has_side_effect
from workloads.graph.ir import Graph, Node
from workloads.graph.ops import get_op
from workloads.graph.passes.infra import graph_pass


def _cse_key(node: Node) -> Hashable:
    if node.is_const:
        return ("const", node.value)  # equal arrays (dtype, shape, bytes), whatever their recipe
    inputs = node.inputs
    if not node.is_fused and get_op(node.op).commutative:
        inputs = tuple(sorted(inputs))
    return (node.op, inputs, node.attrs, node.body)


def eliminate_common_subexpr(graph: Graph) -> Graph:
    """Nodes computing the same op on the same values with the same attributes (and equal
    constants) are merged into the first; side-effecting nodes are never merged."""
    b = GraphBuilder(graph.name, reserved=(n.name for n in graph.nodes))
    seen: dict[Hashable, str] = {}
    mapping: dict[str, str] = {}
    for node in graph.nodes:
        inputs = tuple(mapping.get(i, i) for i in node.inputs)
        node = node if inputs == node.inputs else node.replace(inputs=inputs)
        if node.is_input or has_side_effect(node):
            b.add(node)
            continue
        key = _cse_key(node)
        if key in seen:
            mapping[node.name] = seen[key]
            continue
        seen[key] = node.name
        b.add(node)
    if not mapping:
        return graph
    return b.build(*(mapping.get(o, o) for o in graph.outputs))


@graph_pass("EliminateCommonSubexpr", opt_level=2)
def EliminateCommonSubexpr(graph: Graph) -> Graph:
    """Merge duplicate computations and equal constants."""
    return eliminate_common_subexpr(graph)


def dead_code_elimination(graph: Graph) -> Graph:
    """Keep what the outputs need, every side-effecting node and what it needs, and the
    graph inputs (the signature). Fused bodies are cleaned too."""
    live: set[str] = set(graph.outputs) | {n.name for n in graph.nodes if has_side_effect(n)}
    for node in reversed(graph.nodes):
        if node.name in live:
            live.update(node.inputs)
    nodes = []
    for n in graph.nodes:
        if n.name in live or n.is_input:
            if n.is_fused and n.body is not None:
                body = dead_code_elimination(n.body)
                n = n if body is n.body else n.replace(body=body)
            nodes.append(n)
    if tuple(nodes) == graph.nodes:
        return graph
    return graph.replace(nodes=tuple(nodes))


@graph_pass("DeadCodeElimination", opt_level=1)
def DeadCodeElimination(graph: Graph) -> Graph:
    """Remove values nothing needs (side-effecting nodes stay)."""
    return dead_code_elimination(graph)
