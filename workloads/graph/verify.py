"""The verifier: is a graph well-formed and well-typed?

Checks: every value defined once; every use defined before it (so the graph is acyclic and
in topological order — a cycle is reported as such); known ops with the right arity and
attributes; every node typed, and its type the one its op computes; constants' types match
their arrays; fused bodies verified recursively and bound consistently to their inputs.
"""
from __future__ import annotations

from workloads.graph.builder import infer_node_type
from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import CONST, FUSED, INIT_KEYS, INPUT, Graph, Node, TensorType
from workloads.graph.ops import OPS, get_op


def find_cycle(graph: Graph) -> list[str] | None:
    """A cycle of value names (first repeated at the end), or None when acyclic."""
    deps = {n.name: n.inputs for n in graph.nodes}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for root in deps:
        if state.get(root):
            continue
        stack = [(root, iter(deps[root]))]
        path = [root]
        state[root] = 1
        while stack:
            name, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[name] = 2
            elif nxt in deps and state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt in deps and not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(deps[nxt])))
                path.append(nxt)
    return None


def problems(graph: Graph, *, where: str = "") -> list[str]:
    """Everything wrong with ``graph`` (empty when it verifies)."""
    errs: list[str] = []
    ctx = f"{where}graph {graph.name}: "
    seen: set[str] = set()
    types: dict[str, TensorType] = {}
    names = [n.name for n in graph.nodes]
    dups = sorted({n for n in names if names.count(n) > 1}) if len(set(names)) != len(names) else []
    for d in dups:
        errs.append(f"{ctx}%{d} is defined {names.count(d)} times (single definition)")
    order_broken = False
    for node in graph.nodes:
        for i in node.inputs:
            if i not in seen:
                if i in graph:
                    order_broken = True
                    errs.append(f"{ctx}%{node.name} uses %{i} before its definition")
                else:
                    errs.append(f"{ctx}%{node.name} uses undefined value %{i}")
        seen.add(node.name)
        errs.extend(ctx + e for e in _node_problems(node, graph, types, where))
    if order_broken:
        cycle = find_cycle(graph)
        if cycle:
            errs.append(f"{ctx}cycle: " + " -> ".join(f"%{c}" for c in cycle))
    if not graph.outputs:
        errs.append(f"{ctx}no outputs")
    for o in graph.outputs:
        if o not in seen:
            errs.append(f"{ctx}returns undefined value %{o}")
    return errs


def _node_problems(node: Node, graph: Graph, types: dict[str, TensorType], where: str) -> list[str]:
    name = f"%{node.name}"
    if node.type is None:
        return [f"{name} ({node.op}) has no type (run InferType)"]
    if node.op not in OPS and node.op not in (INPUT, CONST, FUSED):
        return [f"{name}: unknown op {node.op!r}"]
    errs = []
    if node.op == INPUT:
        if node.inputs or node.value is not None or node.body is not None:
            errs.append(f"input {name} must have no inputs, value or body")
    elif node.op == CONST:
        if node.value is None:
            return [f"constant {name} has no value"]
        if node.inputs:
            errs.append(f"constant {name} must have no inputs")
        if set(node.attrs) - INIT_KEYS:
            errs.append(f"constant {name}: unexpected attributes {sorted(set(node.attrs) - INIT_KEYS)}")
    elif node.op == FUSED:
        if node.body is None:
            return [f"fused {name} has no body"]
        body = node.body
        errs += problems(body, where=f"{where}%{node.name}/")
        if any(n.is_fused for n in body.nodes):
            errs.append(f"fused {name}: fused groups must not nest")
        if len(body.inputs) != len(node.inputs):
            errs.append(f"fused {name}: body takes {len(body.inputs)} inputs, node passes {len(node.inputs)}")
        for p, i in zip(body.inputs, node.inputs):
            if i in types and p.type != types[i]:
                errs.append(f"fused {name}: parameter %{p.name}: {p.type} bound to %{i}: {types[i]}")
    else:
        try:
            op = get_op(node.op)
            if dict(op.make_attrs(node.attrs)) != dict(node.attrs):
                errs.append(f"{name}: attributes {dict(node.attrs)} are not in canonical form")
        except GraphError as exc:
            errs.append(f"{name}: {exc}")
    if not errs and all(i in types for i in node.inputs):
        try:
            t = infer_node_type(node, [types[i] for i in node.inputs])
            if t != node.type:
                errs.append(f"{name}: type {node.type} but {node.op} computes {t}")
        except GraphError as exc:
            errs.append(str(exc))
    types[node.name] = node.type
    return errs


def verify(graph: Graph) -> Graph:
    """Raise ``GraphError`` listing the first problems, or return ``graph`` unchanged."""
    errs = problems(graph)
    if errs:
        more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
        raise GraphError("; ".join(errs[:3]) + more)
    return graph
