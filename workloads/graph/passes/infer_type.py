"""InferType: give every value its type from the op shape rules (and check annotations)."""
from __future__ import annotations

from workloads.graph.builder import infer_node_type
from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import Graph, TensorType
from workloads.graph.passes.infra import graph_pass


def infer_types(graph: Graph) -> Graph:
    """Return ``graph`` with every node (and every fused body) typed.

    A type written on a node (in the text form, or by a frontend) must equal the inferred
    one; an ill-typed op raises ``GraphError`` naming the node, its inputs and the rule.
    """
    types: dict[str, TensorType] = {}
    nodes = []
    changed = False
    for node in graph.nodes:
        if node.name in types:
            raise GraphError(f"value %{node.name} is defined twice", node=node.name)
        for i in node.inputs:
            if i not in types:
                where = "never defined" if i not in graph else "defined later (cycle or misordering)"
                raise GraphError(f"%{node.name} uses %{i}, which is {where}", node=node.name)
        in_types = [types[i] for i in node.inputs]
        new = node
        if node.is_fused and node.body is not None:
            body = node.body
            params = iter(in_types)
            typed = infer_types(body.replace(nodes=tuple(
                n.replace(type=next(params, n.type)) if n.is_input else n for n in body.nodes)))
            if typed != body:
                new = new.replace(body=typed)
        t = infer_node_type(new, in_types)
        if node.type is not None and node.type != t:
            raise GraphError(f"%{node.name}: annotated type {node.type} but {node.op} "
                             f"computes {t}", node=node.name)
        if new.type != t:
            new = new.replace(type=t)
        types[node.name] = t
        changed |= new is not node
        nodes.append(new)
    for o in graph.outputs:
        if o not in types:
            raise GraphError(f"graph {graph.name} returns %{o}, which is never defined", node=o)
    return graph.replace(nodes=tuple(nodes)) if changed else graph


@graph_pass("InferType", opt_level=0)
def InferType(graph: Graph) -> Graph:
    """Fill in and check the type of every value."""
    return infer_types(graph)
