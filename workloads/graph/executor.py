"""The NumPy reference executor: runs any graph, fused or not, node by node.

It is the baseline every optimization is checked against: ``execute(g, x)`` and
``execute(pass_(g), x)`` must agree. Values are freed after their last use, so a full
ResNet-50 fits in memory. Side-effecting ops (``probe``) append to ``trace`` when given.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from workloads.errors import UsageError
from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import CONST, FUSED, INPUT, Graph, Node
from workloads.graph.ops import get_op


def evaluate(node: Node, args: Sequence[np.ndarray], trace: list | None = None) -> np.ndarray:
    """The value of one node given its input arrays."""
    if node.op == CONST:
        return node.value.array
    if node.op == FUSED:
        return execute(node.body, list(args), trace=trace)[0]
    if node.op == INPUT:
        raise GraphError(f"input %{node.name} has no value to evaluate", node=node.name)
    op = get_op(node.op)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        out = op.compute(list(args), node.attrs, trace=trace) if op.side_effect \
            else op.compute(list(args), node.attrs)
    out = np.asarray(out)
    if node.type is not None:
        if out.dtype.name != node.type.dtype:
            out = out.astype(node.type.dtype)
        if out.shape != node.type.shape:
            raise GraphError(f"%{node.name} = {node.op}: reference produced shape "
                             f"{list(out.shape)}, type says {node.type}", node=node.name)
    return out


def bind_inputs(graph: Graph, inputs: Mapping[str, Any] | Sequence[Any]) -> dict[str, np.ndarray]:
    params = graph.inputs
    if isinstance(inputs, Mapping):
        missing = [p.name for p in params if p.name not in inputs]
        extra = sorted(set(inputs) - {p.name for p in params})
        if missing or extra:
            raise UsageError(f"graph {graph.name} inputs: missing {missing}, unexpected {extra}")
        values = [inputs[p.name] for p in params]
    else:
        values = list(inputs)
        if len(values) != len(params):
            raise UsageError(f"graph {graph.name} takes {len(params)} inputs, got {len(values)}")
    env = {}
    for p, v in zip(params, values):
        a = np.asarray(v)
        if p.type is not None and (a.shape != p.type.shape or a.dtype.name != p.type.dtype):
            raise UsageError(f"input %{p.name} must be {p.type}, got {a.dtype.name}{list(a.shape)}")
        env[p.name] = a
    return env


def execute(graph: Graph, inputs: Mapping[str, Any] | Sequence[Any], *,
            trace: list | None = None) -> list[np.ndarray]:
    """Run ``graph`` on ``inputs`` (by name or in order); return the outputs in order."""
    env = bind_inputs(graph, inputs)
    last_use: dict[str, int] = {}
    for idx, node in enumerate(graph.nodes):
        for i in node.inputs:
            last_use[i] = idx
    keep = graph.output_set
    for idx, node in enumerate(graph.nodes):
        if node.op == INPUT:
            continue
        try:
            args = [env[i] for i in node.inputs]
        except KeyError as exc:
            raise GraphError(f"%{node.name} uses %{exc.args[0]} before it is computed",
                             node=node.name) from None
        env[node.name] = evaluate(node, args, trace)
        for i in dict.fromkeys(node.inputs):
            if last_use.get(i) == idx and i not in keep:
                del env[i]
    return [env[o] for o in graph.outputs]


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """Deterministic inputs for ``graph``: standard normal floats, small integers."""
    rng = np.random.default_rng(seed)
    out = []
    for p in graph.inputs:
        t = p.type
        if t.is_float:
            out.append(rng.standard_normal(t.shape).astype(t.dtype))
        else:
            lo = 0 if t.dtype == "uint8" else -8  # stay inside every integer dtype's range
            out.append(rng.integers(lo, lo + 16, size=t.shape).astype(t.dtype))
    return out
