"""The graph IR and its passes (DESIGN: "Graph IR and passes").

Public API::

    from workloads.graph import GraphBuilder, parse, to_text, verify, execute
    from workloads.graph.passes import default_pipeline, PassContext
"""
from __future__ import annotations

from workloads.graph.graph_errors import GraphError, ParseError, PassError
from workloads.graph.ir import Attrs, ConstValue, Graph, Node, TensorType
from workloads.graph.ops import OPS, OpPattern, get_op
from workloads.graph.builder import GraphBuilder
from workloads.graph.text import load, parse, to_text
from workloads.graph.verify import verify
from workloads.graph.executor import execute, random_inputs

__all__ = [
    "GraphError", "ParseError", "PassError", "Attrs", "ConstValue", "Graph", "Node",
    "TensorType", "OPS", "OpPattern", "get_op", "GraphBuilder", "load", "parse", "to_text",
    "verify", "execute", "random_inputs",
]
