"""Counting: nodes per kind and the bytes of intermediate tensors a graph writes and reads.

Cost model (what fusion saves): every top-level compute node (op or fused group) writes its
output to memory once, and every top-level consumer reads each distinct intermediate input
once. Values inside a fused group stay in registers/cache and cost nothing. Graph inputs and
constants are not intermediates (reported separately as ``input_bytes``/``const_bytes``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from workloads.graph.ir import Graph


@dataclass(frozen=True)
class GraphStats:
    nodes: int
    inputs: int
    constants: int
    ops: int                 # top-level compute nodes (fused groups count once)
    fused: int
    written: int             # bytes of intermediate tensors written
    read: int                # bytes of intermediate tensors read
    const_bytes: int
    op_counts: Counter = field(default_factory=Counter)  # ops including those inside groups

    def row(self) -> str:
        return (f"{self.nodes:6d} {self.ops:5d} {self.fused:6d} "
                f"{human_bytes(self.written):>10} {human_bytes(self.read):>10}")


def graph_stats(graph: Graph) -> GraphStats:
    intermediate = {n.name: n.type.nbytes for n in graph.nodes if n.is_compute and n.type}
    written = sum(intermediate.values())
    read = sum(intermediate[i] for n in graph.nodes for i in dict.fromkeys(n.inputs)
               if i in intermediate)
    counts: Counter = Counter()
    for n in graph.nodes:
        if n.is_fused and n.body is not None:
            counts.update(m.op for m in n.body.nodes if m.is_compute)
        elif n.is_compute:
            counts[n.op] += 1
    return GraphStats(
        nodes=len(graph.nodes), inputs=sum(n.is_input for n in graph.nodes),
        constants=sum(n.is_const for n in graph.nodes),
        ops=sum(n.is_compute for n in graph.nodes), fused=sum(n.is_fused for n in graph.nodes),
        written=written, read=read,
        const_bytes=sum(n.type.nbytes for n in graph.nodes if n.is_const and n.type),
        op_counts=counts)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
