"""A fused group's body and its description: canonical IR text, and the body rebuilt from the
description's params (``workloads.fused``'s workloads keep one or the other in their params)."""
from __future__ import annotations

from workloads.errors import UsageError


def is_chain(params: dict) -> bool:
    """True when the description alone rebuilds the body (every operand is a parameter or
    the running value)."""
    return all(k >= 0 for e in params["epilogue"] + params.get("prologue", [])
               for k, *_ in e["others"])


def canonical_body_text(body) -> str:
    """The body as IR text with values renamed p<k> (parameters) and t<k> (ops)."""
    from workloads.graph.ir import Graph
    from workloads.graph.text import to_text

    names: dict[str, str] = {}
    k_in = k_op = 0
    for n in body.nodes:
        if n.is_input:
            names[n.name] = f"p{k_in}"
            k_in += 1
        else:
            names[n.name] = f"t{k_op}"
            k_op += 1
    nodes = tuple(n.replace(name=names[n.name], inputs=tuple(names[i] for i in n.inputs))
                  for n in body.nodes)
    return to_text(Graph("group", nodes, tuple(names[o] for o in body.outputs)))


def _chain(b, ps, ops: list[dict], cur):
    """Apply the described ops (epilogue form) to the running value ``cur``."""
    for e in ops:
        inputs = [ps[k] for k, *_ in e["others"]]
        if e["operand"] >= 0:
            if cur is None:
                raise UsageError("group epilogue refers to a running value before any op")
            inputs.insert(e["operand"], cur)
        cur = b.op(e["op"], *inputs, **e["attrs"])
    return cur


def build_body(params: dict):
    """The group's body graph from params (its text when present, else the chain)."""
    from workloads.graph import GraphBuilder, parse
    from workloads.graph.graph_errors import GraphError

    try:
        if params.get("body"):
            return parse(params["body"])
        b = GraphBuilder("group")
        ps = [b.input(f"p{k}", tuple(shape), dtype) for k, (shape, dtype) in enumerate(params["inputs"])]
        cur = None
        if params["anchor"] is not None:
            args = [ps[i] for i in params["anchor_inputs"]]
            if params.get("prologue"):
                # the prologue's ops run on the anchor's data input, in order
                args[0] = _chain(b, ps, params["prologue"], args[0])
            cur = b.op(params["anchor"], *args, **params["anchor_attrs"])
        elif params.get("prologue"):
            raise UsageError("fused group has a prologue but no anchor")
        cur = _chain(b, ps, params["epilogue"], cur)
        if cur is None:
            raise UsageError("fused group has no ops")
        g = b.build(cur)
    except GraphError as exc:
        raise UsageError(f"cannot rebuild fused group: {exc}") from None
    out = g.node(g.outputs[0]).type
    want = (tuple(params["output"][0]), params["output"][1])
    if (out.shape, out.dtype) != want:
        raise UsageError(f"fused group rebuilds to {out}, description says {want}")
    return g
