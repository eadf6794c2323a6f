"""FuseOps: partition the graph into groups and wrap each in a ``fused`` node.

Rules (``OpPattern`` kinds, decided in topological order):

- an ANCHOR (conv2d, dense, matmul) or REDUCTION (pools) op starts a group; ELEMWISE and
  BROADCAST ops whose output has the group's shape join it as an *epilogue*, one after the
  other (a chain: each consumes the previous result; other operands become group inputs);
- ELEMWISE, BROADCAST and INJECTIVE ops form injective groups, merging every producer group
  that is itself injective (so ``reshape -> add -> relu`` or ``concat(relu, relu)`` fuse);
- INJECTIVE ops never join an anchor group (so a ``layout_transform`` between conv2d and its
  relu blocks that fusion: run ConvertLayout before FuseOps);
- a *prologue*: a pointwise conv2d (NCHW/OIHW, 1x1, stride 1, unpadded, one group, float32)
  takes in the group producing its data input when that group is a chain of per-channel
  ``multiply``/``add``/``subtract``/``relu``/``clip`` ops (a pre-activation batch norm +
  relu, as in DenseNet): the conv template applies it while packing the image, so the
  scaled tensor is never written (``prologue_ok``);
- OPAQUE ops (softmax, lrn, side effects, existing fused nodes) stay alone;
- a value joins its consumer's group only if that consumer is its only one and it is not a
  graph output, so no value is ever computed twice or needs a second output;
- a group never exceeds ``max_group_size`` ops (1 means no fusion at all).

Every op ends up in a fused node (groups of one included), named after the group's output so
consumers keep their references; constants and graph inputs stay outside as group inputs.
The body is a ``Graph`` with parameters ``%p0, %p1, ...`` (see ``workloads.graph.fusion`` to
describe a group for task extraction).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workloads.graph.builder import GraphBuilder, node_pattern
from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import Graph, Node
from workloads.graph.ops import OpPattern
from workloads.graph.passes.infra import graph_pass

_EPILOGUE = (OpPattern.ELEMWISE, OpPattern.BROADCAST)
_MAIN = (OpPattern.ANCHOR, OpPattern.REDUCTION)
# ops a conv2d prologue may hold: what the conv template's image packing applies per channel
PROLOGUE_OPS = ("multiply", "add", "subtract", "relu", "clip")


def _per_channel(shape: tuple[int, ...], rank: int) -> bool:
    """A broadcast operand that varies at most along NCHW's channel axis (right-aligned)."""
    if len(shape) > rank:
        return False
    full = (1,) * (rank - len(shape)) + tuple(shape)
    return all(d == 1 for k, d in enumerate(full) if k != 1)


def prologue_ok(graph: Graph, members: list[str], conv: Node) -> bool:
    """Whether the group ``members`` (op names, in order) can run as ``conv``'s prologue: a
    chain of ``PROLOGUE_OPS`` on one tensor of the conv's input type, other operands
    per-channel values from outside the group, and a pointwise float32 NCHW conv2d."""
    a = conv.attrs
    x = graph.type_of(conv.inputs[0])
    if (conv.op != "conv2d" or a.get("data_layout") != "NCHW" or a.get("kernel_layout") != "OIHW"
            or a.get("groups", 1) != 1 or x.dtype != "float32" or len(x.shape) != 4):
        return False
    wt, out = graph.type_of(conv.inputs[1]), conv.type
    if (tuple(wt.shape[2:]) != (1, 1) or any(s != 1 for s in a.get("strides", (1, 1)))
            or tuple(out.shape[2:]) != tuple(x.shape[2:])):
        return False
    inside = set(members)
    running = None
    for k, name in enumerate(members):
        n = graph.node(name)
        if n.op not in PROLOGUE_OPS or n.type.shape != x.shape or n.type.dtype != x.dtype:
            return False
        if k == 0:
            full = [i for i in n.inputs if graph.type_of(i).shape == x.shape]
            if len(full) != 1:
                return False
            running = full[0]
        if running not in n.inputs or n.inputs.count(running) != 1:
            return False
        for i in n.inputs:
            if i != running and (i in inside or not _per_channel(graph.type_of(i).shape, 4)):
                return False
        running = name
    return running == conv.inputs[0]


@dataclass(eq=False)
class _Group:
    members: list[str]
    kind: OpPattern
    root: str = ""
    merged_into: "_Group | None" = field(default=None, repr=False)

    def find(self) -> "_Group":
        g = self
        while g.merged_into is not None:
            g = g.merged_into
        return g


def partition(graph: Graph, max_group_size: int = 16, prologue: bool = True) -> list[list[str]]:
    """Groups of op-node names (each in topological order, its output last); ``prologue=False``
    keeps conv prologues out (separate groups, as before they existed: for comparisons)."""
    if max_group_size < 1:
        raise GraphError(f"FuseOps: max_group_size must be >= 1, got {max_group_size}")
    group_of: dict[str, _Group] = {}
    groups: list[_Group] = []

    def can_absorb(value: str, consumer: str) -> _Group | None:
        g = group_of.get(value)
        if g is None:
            return None
        g = g.find()
        if g.root != value or g.kind == OpPattern.OPAQUE or value in graph.output_set:
            return None
        return g if graph.users.get(value) == (consumer,) else None

    for node in graph.nodes:
        if not node.is_compute or node.is_fused:
            continue
        p = node_pattern(node)
        target = None
        if p != OpPattern.OPAQUE and max_group_size > 1:
            producers = [g for g in dict.fromkeys(can_absorb(i, node.name) for i in node.inputs) if g]
            if p in _EPILOGUE:
                target = next((g for g in producers if g.kind in _MAIN and len(g.members) < max_group_size
                               and graph.type_of(g.root).shape == node.type.shape), None)
            if prologue and p == OpPattern.ANCHOR and node.inputs:
                g = can_absorb(node.inputs[0], node.name)
                if (g is not None and g.kind in _EPILOGUE and len(g.members) < max_group_size
                        and prologue_ok(graph, g.members, node)):
                    target = g   # the chain becomes the conv's prologue; the group an anchor's
            if target is None and p <= OpPattern.INJECTIVE:
                size = 1
                for g in producers:
                    if g.kind <= OpPattern.INJECTIVE and size + len(g.members) <= max_group_size:
                        if target is None:
                            target = g
                        else:
                            target.members += g.members
                            target.kind = max(target.kind, g.kind)
                            g.merged_into = target
                        size += len(g.members)
        if target is None:
            target = _Group([], p)
            groups.append(target)
        target.members.append(node.name)
        target.kind = max(target.kind, p)
        target.root = node.name
        group_of[node.name] = target
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    return [sorted(g.members, key=order.__getitem__) for g in groups if g.merged_into is None]


def _group_name(members: list[Node]) -> str:
    return "fused_" + "_".join(m.op for m in members)


def make_body(members: list[Node], name: str) -> tuple[Graph, tuple[str, ...]]:
    """The group's subgraph and the outside values it reads (in order of first use)."""
    inside = {m.name for m in members}
    outside = tuple(dict.fromkeys(i for m in members for i in m.inputs if i not in inside))
    b = GraphBuilder(name, reserved=inside)
    params = {}
    for k, v in enumerate(outside):
        params[v] = b.add(Node(b.fresh(f"p{k}"), "input", type=None)).name
    for m in members:
        b.add(m.replace(inputs=tuple(params.get(i, i) for i in m.inputs)))
    return b.build(members[-1].name), outside


def fuse_ops(graph: Graph, max_group_size: int = 16, prologue: bool = True) -> Graph:
    groups = partition(graph, max_group_size, prologue)
    if not groups:
        return graph
    root_of = {m: g[-1] for g in groups for m in g}
    members_of = {g[-1]: g for g in groups}
    b = GraphBuilder(graph.name, reserved=(n.name for n in graph.nodes))
    for node in graph.nodes:
        if node.name not in root_of:
            b.add(node)
        elif root_of[node.name] == node.name:
            members = [graph.node(m) for m in members_of[node.name]]
            body, outside = make_body(members, _group_name(members))
            params = iter(graph.type_of(v) for v in outside)
            body = body.replace(nodes=tuple(n.replace(type=next(params)) if n.is_input else n
                                            for n in body.nodes))
            b.add(Node(node.name, "fused", outside, type=node.type, body=body))
    return b.build(*graph.outputs)


@graph_pass("FuseOps", opt_level=0, required=("InferType",))
def FuseOps(graph: Graph, max_group_size: int = 16, prologue: bool = True) -> Graph:
    """Group ops into fused nodes: anchor + elementwise epilogue (+ a pointwise conv's
    per-channel prologue), injective chains."""
    return fuse_ops(graph, max_group_size, prologue)
