"""ConvertLayout: run conv2d and pooling in another data layout (NCHW <-> NHWC).

Each value of the input graph may get a *converted* twin (the same tensor in the desired
layout). Layout-sensitive ops (conv2d, pools) are rewritten to the desired layout; ops that do
not care (elementwise, broadcasting with per-channel or scalar operands) and ops with an axis
(batch_norm, bias_add, softmax, lrn, concatenate) follow their converted inputs, so the
converted region grows as far as it can. Every other consumer reads the value in its original
layout, made on demand by one ``layout_transform`` per value; graph outputs are returned in
their original layout. So transforms appear only at the boundaries, and back-to-back
transforms (``A->B`` then ``B->A``, here or in the input) cancel. Kernel weights get a
``layout_transform`` too, which FoldConstant folds away when they are constants.

Grouped and depthwise convs have kernels for NCHW only, so a graph that has them is not
converted to NHWC at all: each would sit between two layout transforms, and the channel
shuffles around them would move across layouts. Measured (AMD Zen 5, 1 thread, ``bench
model``): ShuffleNet with its 48 grouped/depthwise convs kept in NCHW inside an NHWC graph ran
at 0.64x ONNX Runtime against 1.00x all in NCHW; AlexNet's two grouped convs made no
difference either way (1.64x vs 1.68x).
"""
from __future__ import annotations

from workloads.errors import UsageError
from workloads.graph.builder import has_side_effect
from workloads.graph.ir import Graph, Node
from workloads.graph.ops import OpPattern, get_op
from workloads.graph.passes.infra import graph_pass
from workloads.graph.passes.rewrite import Rewriter, prune_newly_dead

KERNEL_LAYOUT = {"NCHW": "OIHW", "NHWC": "HWIO"}
# op -> (layout attribute, kernel layout attribute or None)
LAYOUT_OPS = {
    "conv2d": ("data_layout", "kernel_layout"),
    "max_pool2d": ("layout", None),
    "avg_pool2d": ("layout", None),
    "global_avg_pool2d": ("layout", None),
}
# op -> how many leading inputs are the data (None: all); the op's "axis" attribute moves.
AXIS_OPS = {"batch_norm": 1, "bias_add": 1, "softmax": 1, "lrn": 1, "concatenate": None}


class _Converter:
    def __init__(self, graph: Graph, desired: str) -> None:
        self.rw = Rewriter(graph)
        self.b = self.rw.builder
        self.desired = desired
        self.orig: dict[str, str] = {}           # old value -> new value, original layout
        self.conv: dict[str, tuple[str, str]] = {}  # old value -> (new value, its original layout)

    # -- transforms with cancellation ----------------------------------------------------
    def transform(self, value: str, src: str, dst: str, name: str | None = None) -> str:
        if src == dst:
            return value
        prod = self.b[value]
        if prod.op == "layout_transform" and prod.attrs["dst_layout"] == src:
            inner_src = prod.attrs["src_layout"]
            return self.transform(prod.inputs[0], inner_src, dst, name)
        return self.b.op("layout_transform", value, src_layout=src, dst_layout=dst,
                         name=name or self.b.fresh(f"{value}.{dst.lower()}")).name

    def original(self, old: str) -> str:
        """The value ``old`` in its original layout (transformed back on first demand)."""
        if old not in self.orig:
            new, layout = self.conv[old]
            self.orig[old] = self.transform(new, self.desired, layout)
        return self.orig[old]

    def converted(self, old: str, layout: str) -> str:
        """The value ``old`` (original layout ``layout``) in the desired layout."""
        if old in self.conv and self.conv[old][1] == layout:
            return self.conv[old][0]
        new = self.transform(self.original(old), layout, self.desired)
        self.conv[old] = (new, layout)
        return new

    def source_layout(self, old: str) -> str | None:
        return self.conv[old][1] if old in self.conv else None

    # -- per node ------------------------------------------------------------------------
    def visit(self, node: Node) -> None:
        if node.op in LAYOUT_OPS and self.convert_layout_op(node):
            return
        if self.follow(node):
            return
        if node.op == "layout_transform":
            a = node.attrs
            new = self.transform(self.original(node.inputs[0]), a["src_layout"], a["dst_layout"],
                                 name=node.name)
            self.orig[node.name] = new
            return
        inputs = tuple(self.original(i) for i in node.inputs)
        self.orig[node.name] = self.b.add(node if inputs == node.inputs else node.replace(inputs=inputs)).name

    def convert_layout_op(self, node: Node) -> bool:
        attr, kattr = LAYOUT_OPS[node.op]
        layout = node.attrs[attr]
        if layout == self.desired or sorted(layout) != sorted(self.desired):
            return False
        data = self.converted(node.inputs[0], layout)
        inputs = [data]
        attrs = {attr: self.desired}
        if kattr is not None:
            kdst = KERNEL_LAYOUT.get(self.desired)
            if kdst is None:
                return False
            w = self.transform(self.original(node.inputs[1]), node.attrs[kattr], kdst)
            inputs.append(w)
            attrs[kattr] = kdst
        new = self.b.op(node.op, *inputs, name=node.name, **{**node.attrs, **attrs})
        self.conv[node.name] = (new.name, layout)
        return True

    def follow(self, node: Node) -> bool:
        """Run a layout-agnostic or axis op on converted inputs; False if it cannot."""
        if not node.inputs or has_side_effect(node) or node.is_fused or node.type.rank != len(self.desired):
            return False
        layouts = {self.source_layout(i) for i in node.inputs} - {None}
        if len(layouts) != 1:
            return False
        (layout,) = layouts
        pattern = get_op(node.op).pattern
        attrs = dict(node.attrs)
        if node.op in AXIS_OPS:
            n_data = AXIS_OPS[node.op] or len(node.inputs)
            if any(self.source_layout(i) != layout for i in node.inputs[:n_data]):
                return False
            axis = attrs["axis"] % node.type.rank
            attrs["axis"] = self.desired.index(layout[axis])
            inputs = [self.conv[i][0] for i in node.inputs[:n_data]]
            inputs += [self.original(i) for i in node.inputs[n_data:]]
        elif pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST):
            inputs = []
            for i in node.inputs:
                t = self.rw.type(i)
                if self.source_layout(i) == layout:
                    inputs.append(self.conv[i][0])
                elif t.size == 1:
                    inputs.append(self.original(i))  # a scalar broadcasts in any layout
                elif t.rank < node.type.rank:
                    # Per-channel constants like [C, 1, 1]: lift to full rank, then transform.
                    lifted = self.b.op("expand_dims", self.original(i), axis=0,
                                       num_newaxis=node.type.rank - t.rank,
                                       name=self.b.fresh(f"{i}.{len(self.desired)}d"))
                    inputs.append(self.transform(lifted.name, layout, self.desired))
                else:
                    inputs.append(self.converted(i, layout))
        else:
            return False
        new = self.b.op(node.op, *inputs, name=node.name, **attrs)
        self.conv[node.name] = (new.name, layout)
        return True


def grouped_conv(node: Node) -> bool:
    return node.op == "conv2d" and node.attrs.get("groups", 1) > 1


def convert_layout(graph: Graph, desired: str = "NHWC") -> Graph:
    if desired not in KERNEL_LAYOUT:
        raise UsageError(f"ConvertLayout: desired layout must be one of "
                         f"{', '.join(KERNEL_LAYOUT)}, got {desired!r}")
    if desired == "NHWC" and any(grouped_conv(n) for n in graph.nodes):
        return graph   # grouped convs: NCHW kernels only (module docstring)
    c = _Converter(graph, desired)
    for node in graph.nodes:
        if node.is_input or node.is_const:
            c.orig[node.name] = c.b.add(node).name
        else:
            c.visit(node)
    new = c.b.build(*(c.original(o) for o in graph.outputs))
    new = prune_newly_dead(graph, new)
    return graph if new == graph else new


@graph_pass("ConvertLayout", opt_level=3, required=("InferType",))
def ConvertLayout(graph: Graph, desired: str = "NHWC") -> Graph:
    """Convert conv2d/pool data layouts to ``desired`` (NCHW or NHWC)."""
    return convert_layout(graph, desired)
