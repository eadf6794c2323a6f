"""FoldConstant: compute at compile time every node whose inputs are all constants."""
from __future__ import annotations

from workloads.graph.builder import GraphBuilder, has_side_effect
from workloads.graph.executor import evaluate
from workloads.graph.ir import Graph
from workloads.graph.passes.infra import graph_pass
from workloads.graph.passes.rewrite import prune_newly_dead


def fold_constants(graph: Graph) -> Graph:
    """One topological sweep: a folded node becomes a constant (same name), so folding
    cascades through chains (``constant_of_shape`` -> ``multiply`` -> ``layout_transform``...).
    Side-effecting nodes are never folded; constants left unused are dropped."""
    b = GraphBuilder(graph.name, reserved=(n.name for n in graph.nodes))
    folded = False
    for node in graph.nodes:
        if node.is_compute and not has_side_effect(node) and all(b[i].is_const for i in node.inputs):
            value = evaluate(node, [b[i].value.array for i in node.inputs])
            b.const(value, node.name, dtype=node.type.dtype if node.type else None)
            folded = True
        else:
            b.add(node)
    if not folded:
        return graph
    return prune_newly_dead(graph, b.build(*graph.outputs))


@graph_pass("FoldConstant", opt_level=2)
def FoldConstant(graph: Graph) -> Graph:
    """All inputs constant and no side effect: computed now, cascading."""
    return fold_constants(graph)
