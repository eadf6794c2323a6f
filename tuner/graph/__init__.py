"""The graph IR and its passes (DESIGN: "Graph IR and passes").

Public API::

    from tuner.graph import GraphBuilder, parse, to_text, verify, execute
    from tuner.graph.passes import default_pipeline, PassContext
"""
from __future__ import annotations

from tuner.graph.errors import GraphError, ParseError, PassError
from tuner.graph.ir import Attrs, ConstValue, Graph, Node, TensorType
from tuner.graph.ops import OPS, OpPattern, get_op
from tuner.graph.builder import GraphBuilder
from tuner.graph.text import load, parse, to_text
from tuner.graph.verify import verify
from tuner.graph.executor import execute, random_inputs

__all__ = [
    "GraphError", "ParseError", "PassError", "Attrs", "ConstValue", "Graph", "Node",
    "TensorType", "OPS", "OpPattern", "get_op", "GraphBuilder", "load", "parse", "to_text",
    "verify", "execute", "random_inputs",
]
