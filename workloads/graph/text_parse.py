"""Parser for the text form (see ``workloads.graph.text`` for the syntax)."""
from __future__ import annotations

import base64
import heapq
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.graph.graph_errors import GraphError, ParseError
from workloads.graph.ir import (CONST, DTYPES, FUSED, INIT_KEYS, INPUT, Attrs, ConstValue, Graph,
                            Node, TensorType, materialize_init)
from workloads.graph.ops import OPS, get_op

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+|\#[^\n]*)
  | (?P<nl>\n)
  | (?P<value>%(?:"(?:[^"\\]|\\.)*"|[A-Za-z0-9_.$\-]+))
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>-?(?:inf|nan)(?![A-Za-z0-9_])|-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[()\[\]{},=:])
""", re.VERBOSE)


@dataclass
class _Tok:
    kind: str
    text: str
    line: int


def _tokenize(text: str) -> list[_Tok]:
    toks, line, pos = [], 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}", line)
        kind = m.lastgroup
        if kind == "nl":
            line += 1
        elif kind != "ws":
            toks.append(_Tok(kind, m.group(), line))
        pos = m.end()
    toks.append(_Tok("eof", "", line))
    return toks


@dataclass
class _Stmt:
    name: str
    op: str
    inputs: list[str]
    attrs: dict[str, Any]
    type: TensorType | None
    body: Graph | None
    line: int


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self, text: str | None = None, kind: str | None = None) -> bool:
        t = self.toks[self.i]
        return (text is None or t.text == text) and (kind is None or t.kind == kind)

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str | None = None, kind: str | None = None, what: str = "") -> _Tok:
        t = self.toks[self.i]
        if not self.peek(text, kind):
            want = what or (repr(text) if text else kind)
            got = repr(t.text) if t.kind != "eof" else "end of input"
            raise ParseError(f"expected {want}, found {got}", t.line)
        return self.next()

    # -- grammar -------------------------------------------------------------------------
    def value_name(self) -> tuple[str, int]:
        t = self.expect(kind="value", what="a value name like %x")
        body = t.text[1:]
        return (json.loads(body) if body.startswith('"') else body), t.line

    def ttype(self) -> TensorType:
        t = self.expect(kind="ident", what="a type like float32[1, 3]")
        if t.text not in DTYPES:
            raise ParseError(f"unknown dtype {t.text!r}; choose one of {', '.join(DTYPES)}", t.line)
        self.expect("[")
        dims = []
        while not self.peek("]"):
            d = self.expect(kind="number", what="a dimension")
            if not re.fullmatch(r"\d+", d.text):
                raise ParseError(f"bad dimension {d.text!r}", d.line)
            dims.append(int(d.text))
            if not self.peek("]"):
                self.expect(",")
        self.expect("]")
        return TensorType(tuple(dims), t.text)

    def literal(self) -> Any:
        t = self.next()
        if t.kind == "number":
            txt = t.text
            if re.fullmatch(r"-?\d+", txt):
                return int(txt)
            return float(txt)
        if t.kind == "string":
            return json.loads(t.text)
        if t.kind == "ident" and t.text in ("true", "false", "none"):
            return {"true": True, "false": False, "none": None}[t.text]
        if t.text == "[":
            items = []
            while not self.peek("]"):
                items.append(self.literal())
                if not self.peek("]"):
                    self.expect(",")
            self.expect("]")
            return items
        raise ParseError(f"expected a literal, found {t.text!r}", t.line)

    def graph(self) -> tuple[str, list, list[_Stmt], list[tuple[str, int]], int]:
        start = self.expect("graph", what="'graph'")
        gname = "main"
        if self.peek(kind="ident"):
            gname = self.next().text
        elif self.peek(kind="string"):
            gname = json.loads(self.next().text)
        self.expect("(")
        params = []
        while not self.peek(")"):
            name, line = self.value_name()
            self.expect(":")
            params.append((name, self.ttype(), line))
            if not self.peek(")"):
                self.expect(",")
        self.expect(")")
        self.expect("{")
        stmts: list[_Stmt] = []
        while not self.peek("return"):
            stmts.append(self.stmt())
        self.next()
        outs = [self.value_name()]
        while self.peek(","):
            self.next()
            outs.append(self.value_name())
        self.expect("}")
        return gname, params, stmts, outs, start.line

    def stmt(self) -> _Stmt:
        name, line = self.value_name()
        self.expect("=")
        op_tok = self.expect(kind="ident", what="an op name")
        if op_tok.text not in OPS and op_tok.text not in (CONST, FUSED):
            try:
                get_op(op_tok.text)
            except GraphError as exc:
                raise ParseError(str(exc), op_tok.line) from None
        self.expect("(")
        inputs, attrs = [], {}
        while not self.peek(")"):
            if self.peek(kind="value"):
                if attrs:
                    raise ParseError("inputs must come before attributes", self.toks[self.i].line)
                inputs.append(self.value_name()[0])
            else:
                key = self.expect(kind="ident", what="an input %name or attribute name=value")
                self.expect("=")
                if key.text in attrs:
                    raise ParseError(f"attribute {key.text!r} given twice", key.line)
                attrs[key.text] = self.literal()
            if not self.peek(")"):
                self.expect(",")
        self.expect(")")
        ttype = None
        if self.peek(":"):
            self.next()
            ttype = self.ttype()
        body = None
        if op_tok.text == FUSED:
            body = _build(*self.graph(), infer=False)
        return _Stmt(name, op_tok.text, inputs, attrs, ttype, body, line)


def _const_value(st: _Stmt) -> tuple[ConstValue, Attrs]:
    if st.type is None:
        raise ParseError(f"constant %{st.name} needs a type, e.g. ': float32[4]'", st.line)
    t, a = st.type, st.attrs
    keys = set(a)
    try:
        if keys and keys <= INIT_KEYS and "init" in keys:
            return ConstValue(materialize_init(a, t)), Attrs(a)
        if keys == {"fill"}:
            return ConstValue(np.full(t.shape, a["fill"], dtype=t.dtype)), Attrs()
        if keys == {"data"}:
            arr = np.array(a["data"], dtype=t.dtype).reshape(-1)
            if arr.size != t.size:
                raise ParseError(f"constant %{st.name}: {arr.size} values for {t}", st.line)
            return ConstValue(arr.reshape(t.shape)), Attrs()
        if keys == {"b64"}:
            raw = base64.b64decode(a["b64"], validate=True)
            arr = np.frombuffer(raw, dtype=np.dtype(t.dtype).newbyteorder("<"))
            if arr.size != t.size:
                raise ParseError(f"constant %{st.name}: {arr.size} values for {t}", st.line)
            return ConstValue(arr.astype(t.dtype).reshape(t.shape)), Attrs()
        if keys == {"elided"}:
            raise ParseError(f"constant %{st.name}: data was elided in this dump "
                             "(print it with elide=False to round-trip)", st.line)
    except (ValueError, TypeError, GraphError) as exc:
        raise ParseError(f"constant %{st.name}: {exc}", st.line) from None
    raise ParseError(f"constant %{st.name}: give one of init=..., fill=, data=[...] or b64=", st.line)


def _build(gname: str, params: list, stmts: list[_Stmt], outs: list[tuple[str, int]],
           gline: int, *, infer: bool = True, verify: bool = True) -> Graph:
    lines: dict[str, int] = {}
    nodes: dict[str, Node] = {}
    order: list[str] = []
    for name, t, line in params:
        if name in nodes:
            raise ParseError(f"%{name} is defined twice (first on line {lines[name]})", line)
        nodes[name], lines[name] = Node(name, INPUT, type=t), line
    for st in stmts:
        if st.name in nodes:
            raise ParseError(f"%{st.name} is defined twice (first on line {lines[st.name]})", st.line)
        lines[st.name] = st.line
        try:
            if st.op == CONST:
                value, attrs = _const_value(st)
                node = Node(st.name, CONST, attrs=attrs, type=st.type, value=value)
            elif st.op == FUSED:
                if st.attrs:
                    raise ParseError("fused nodes take no attributes", st.line)
                node = Node(st.name, FUSED, tuple(st.inputs), type=st.type, body=st.body)
            else:
                node = Node(st.name, st.op, tuple(st.inputs), get_op(st.op).make_attrs(st.attrs),
                            type=st.type)
        except GraphError as exc:
            raise ParseError(str(exc), st.line) from None
        nodes[st.name] = node
        order.append(st.name)
    for st in stmts:
        for i in st.inputs:
            if i not in nodes:
                raise ParseError(f"%{st.name} uses undefined value %{i}", st.line)
    for o, line in outs:
        if o not in nodes:
            raise ParseError(f"return of undefined value %{o}", line)
    sorted_names = _toposort([p[0] for p in params] + order, nodes, lines)
    graph = Graph(gname, tuple(nodes[n] for n in sorted_names), tuple(o for o, _ in outs))
    if infer:
        from workloads.graph.passes.infer_type import infer_types
        from workloads.graph.verify import verify as verify_graph
        try:
            graph = infer_types(graph)
            if verify:
                verify_graph(graph)
        except GraphError as exc:
            raise ParseError(str(exc), lines.get(exc.node or "", gline)) from None
    return graph


def _toposort(names: list[str], nodes: dict[str, Node], lines: dict[str, int]) -> list[str]:
    """Stable topological order (text order where possible); a cycle is a ParseError."""
    pos = {n: k for k, n in enumerate(names)}
    indeg = {n: len(set(nodes[n].inputs)) for n in names}
    users: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for i in set(nodes[n].inputs):
            users[i].append(n)
    ready = [(pos[n], n) for n in names if indeg[n] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(n)
        for u in users[n]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, (pos[u], u))
    if len(out) != len(names):
        from workloads.graph.verify import find_cycle
        stuck = [n for n in names if indeg[n] > 0]
        cycle = find_cycle(Graph("g", tuple(nodes[n] for n in stuck), ())) or stuck
        raise ParseError("cycle: " + " -> ".join(f"%{c}" for c in cycle), lines[cycle[0]])
    return out


def parse_graph(text: str, *, infer: bool = True, verify: bool = True) -> Graph:
    p = _Parser(text)
    parts = p.graph()
    p.expect(kind="eof", what="end of input after the graph")
    return _build(*parts, infer=infer, verify=verify)
