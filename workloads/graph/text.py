"""Text form of the IR: ``to_text(graph)`` prints, ``parse(text)`` reads it back.

::

    # comments start with '#'
    graph block(%data: float32[1, 3, 16, 16]) {
      %w = const(init="normal", seed=1, scale=0.2) : float32[8, 3, 3, 3]
      %b = const(fill=0.1) : float32[8]
      %c = conv2d(%data, %w, padding=[1, 1, 1, 1]) : float32[1, 8, 16, 16]
      %r = relu(%c)
      return %r
    }

A statement is ``%name = op(%inputs..., attr=literal...) [: type]``; types are optional in
input (InferType fills them) and always printed. Attributes equal to their default are not
printed. A constant is written as a recipe (``init=...``), ``fill=`` (all elements equal),
``data=[...]`` (flat, small arrays) or ``b64="..."`` (raw little-endian bytes, exact). A fused
node is followed by its body: ``%f = fused(%a, %b) : type graph fused_conv2d_relu(...) {...}``.
Values may appear in any order (they are sorted topologically; a cycle is an error). Names
that are not plain identifiers are quoted: ``%"onnx::Conv_3"``.
"""
from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

import numpy as np

from workloads.graph.ir import CONST, FUSED, INPUT, Graph, Node
from workloads.graph.ops import get_op

_PLAIN = re.compile(r"[A-Za-z0-9_.$\-]+\Z")
MAX_INLINE = 16   # constants up to this size are printed as data=[...]
ELIDE_ABOVE = 8   # with elide=True, larger non-uniform constants print as elided=N


def _name(n: str) -> str:
    return f"%{n}" if _PLAIN.match(n) else f"%{json.dumps(n)}"


def _literal(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)  # 'inf', '-inf' or a repr that round-trips exactly
    if isinstance(v, _Num):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r}")


class _Num(str):
    """A number already formatted (shortest text that reads back to the same value)."""


def _scalar(x: np.generic) -> Any:
    if isinstance(x, np.floating):
        s = str(x)  # NumPy prints the shortest round-tripping text for the dtype
        return _Num(s if any(c in s for c in ".eain") else s + ".0")
    return int(x)


def _const_args(node: Node, elide: bool) -> list[str]:
    if node.attrs.get("init") is not None:
        return [f"{k}={_literal(v)}" for k, v in node.attrs.items()]
    a = node.value.array
    flat = a.reshape(-1)
    raw = flat.view(np.uint8).reshape(flat.size, a.itemsize) if a.size else None
    if a.size >= 1 and (raw == raw[0]).all():
        return [f"fill={_literal(_scalar(flat[0]))}"]
    if elide and a.size > ELIDE_ABOVE:
        return [f"elided={a.size}"]
    if a.size <= MAX_INLINE:
        return [f"data={_literal(tuple(_scalar(x) for x in flat))}"]
    return [f"b64={json.dumps(base64.b64encode(a.astype(a.dtype.newbyteorder('<')).tobytes()).decode())}"]


def _node_line(node: Node, indent: str, elide: bool) -> list[str]:
    if node.op == CONST:
        args = _const_args(node, elide)
    else:
        args = [_name(i) for i in node.inputs]
        if node.op != FUSED:
            shown = get_op(node.op).non_default(node.attrs) if node.attrs else {}
            args += [f"{k}={_literal(v)}" for k, v in shown.items()]
    line = f"{indent}{_name(node.name)} = {node.op}({', '.join(args)})"
    if node.type is not None:
        line += f" : {node.type}"
    if node.op == FUSED and node.body is not None:
        body = _graph_lines(node.body, indent, elide)
        return [line + " " + body[0].lstrip()] + body[1:]
    return [line]


def _graph_lines(graph: Graph, indent: str, elide: bool) -> list[str]:
    params = ", ".join(f"{_name(p.name)}: {p.type}" for p in graph.inputs)
    gname = graph.name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", graph.name) else json.dumps(graph.name)
    lines = [f"{indent}graph {gname}({params}) {{"]
    for node in graph.nodes:
        if node.op != INPUT:
            lines += _node_line(node, indent + "  ", elide)
    lines.append(f"{indent}  return {', '.join(_name(o) for o in graph.outputs)}")
    lines.append(f"{indent}}}")
    return lines


def to_text(graph: Graph, *, elide: bool = False) -> str:
    """The text form. ``elide=True`` abbreviates large constants (not parseable back)."""
    return "\n".join(_graph_lines(graph, "", elide)) + "\n"


def parse(text: str, *, infer: bool = True, verify: bool = True) -> Graph:
    """Read the text form; errors are ``ParseError``s starting with ``line N:``.

    With ``infer`` (default) the graph is typed by InferType and, with ``verify``, checked.
    """
    from workloads.graph.text_parse import parse_graph
    return parse_graph(text, infer=infer, verify=verify)


def load(path: str, **kw: Any) -> Graph:
    with open(path, encoding="utf-8") as fh:
        return parse(fh.read(), **kw)
