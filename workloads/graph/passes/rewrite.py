"""Rewrite rules as data: ``rewrite(graph, {op_name: rule, ...})``.

A rule is ``rule(node, rw) -> Node | str | None``. It looks at ``node`` and its producers in
the *input* graph (``rw.node(name)``, ``rw.users(name)``, ``rw.const(name)``), and either
returns None (keep the node) or emits replacement nodes with ``rw.op``/``rw.new_const`` and
returns the value that replaces ``node`` (a new node, or the name of an existing value).
Inputs given to ``rw.op`` may be names from the input graph: they are mapped to their
current replacements. A rule should name its final node ``node.name`` so the names that
consumers and readers see stay stable.

Nodes that only the replaced nodes used are dropped (``prune_newly_dead``); dead code that was
already dead in the input is left to DeadCodeElimination.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Union

import numpy as np

from workloads.graph.builder import GraphBuilder, has_side_effect
from workloads.graph.ir import Graph, Node, TensorType

Rule = Callable[[Node, "Rewriter"], Union[Node, str, None]]


class Rewriter:
    """What a rule may look at (the input graph) and how it emits (the new graph)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.builder = GraphBuilder(graph.name, reserved=(n.name for n in graph.nodes))
        self.mapping: dict[str, str] = {}

    # -- the input graph -----------------------------------------------------------------
    def node(self, name: str) -> Node:
        return self.graph.node(name)

    def users(self, name: str) -> tuple[str, ...]:
        return self.graph.users.get(name, ())

    def single_use(self, name: str) -> bool:
        """True when ``name`` feeds exactly one node and is not a graph output."""
        return len(self.users(name)) == 1 and name not in self.graph.output_set

    def const(self, name: str) -> np.ndarray | None:
        n = self.graph.get(name)
        return n.value.array if n is not None and n.is_const else None

    def type(self, name: str) -> TensorType:
        return self.graph.type_of(name)

    # -- emitting ------------------------------------------------------------------------
    def value(self, ref: Union[Node, str]) -> str:
        name = ref.name if isinstance(ref, Node) else ref
        return self.mapping.get(name, name)

    def op(self, op: str, *inputs: Union[Node, str], name: str | None = None, **attrs: Any) -> Node:
        return self.builder.op(op, *(self.value(i) for i in inputs), name=name, **attrs)

    def new_const(self, array: Any, name: str | None = None, base: str = "c") -> Node:
        return self.builder.const(array, name or self.builder.fresh(base))

    def fresh(self, base: str) -> str:
        return self.builder.fresh(base)

    def keep(self, node: Node) -> Node:
        """Re-emit ``node`` with its inputs mapped (unchanged when nothing it reads changed)."""
        inputs = tuple(self.value(i) for i in node.inputs)
        return self.builder.add(node if inputs == node.inputs else node.replace(inputs=inputs))

    def finish(self) -> Graph:
        new = self.builder.build(*(self.value(o) for o in self.graph.outputs))
        return prune_newly_dead(self.graph, new)


def rewrite(graph: Graph, rules: Mapping[str, Rule], *, fixpoint: bool = False,
            max_rounds: int = 100) -> Graph:
    """Apply ``rules`` (op name -> rule) to every node in topological order.

    With ``fixpoint``, repeat until nothing changes (rules see the result of earlier rounds,
    so chains of rewrites cascade).
    """
    for _ in range(max_rounds if fixpoint else 1):
        rw = Rewriter(graph)
        for node in graph.nodes:
            rule = rules.get(node.op)
            out = rule(node, rw) if rule is not None else None
            if out is None:
                rw.keep(node)
            else:
                rw.mapping[node.name] = out.name if isinstance(out, Node) else rw.value(out)
        new = rw.finish()
        if new == graph:
            return graph
        graph = new
    return graph


def prune_newly_dead(old: Graph, new: Graph) -> Graph:
    """Drop nodes of ``new`` that nothing uses, unless they were already dead in ``old``.

    Inputs and side-effecting nodes are always kept.
    """
    uses: dict[str, int] = {n.name: 0 for n in new.nodes}
    for n in new.nodes:
        for i in n.inputs:
            uses[i] += 1
    for o in new.outputs:
        uses[o] += 1
    was_dead = {n.name for n in old.nodes
                if not old.users.get(n.name) and n.name not in old.output_set}
    dropped: set[str] = set()
    for n in reversed(new.nodes):
        if uses[n.name] or n.is_input or n.name in was_dead or has_side_effect(n):
            continue
        dropped.add(n.name)
        for i in n.inputs:
            uses[i] -= 1
    if not dropped:
        return new
    return new.replace(nodes=tuple(n for n in new.nodes if n.name not in dropped))
