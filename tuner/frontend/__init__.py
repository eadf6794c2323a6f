"""Frontends: model files to the graph IR.

- ``tuner.frontend.onnx.load(path) -> Graph``: ONNX (opset 9 and later), needs the optional
  extra ``pip install 'tuner[onnx]'``.
- ``tuner.frontend.load_model(path)``: any model file the commands accept (``.onnx`` or the
  IR text form), every bad input reported as one ``UsageError`` line.
"""
from __future__ import annotations

import os


def load_model(path: str, *, shapes=None, batch: int = 1):
    """A graph from ``path``: ONNX when it ends in ``.onnx``, else the IR text form.
    ``shapes`` ({input name: shape}) and ``batch`` set an ONNX model's symbolic input
    dimensions (``tuner.frontend.onnx.load``); an IR text fixes its own shapes."""
    from workloads.errors import UsageError
    from workloads.graph.graph_errors import GraphError

    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    if path.endswith(".onnx"):
        from tuner.frontend.onnx import load

        return load(path, shapes=shapes, batch=batch)
    if shapes or batch != 1:
        raise UsageError(f"{path}: input shapes apply to .onnx models (an IR text fixes its own)")
    from workloads.graph.text import parse

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    try:
        return parse(text)
    except (UsageError, GraphError) as exc:
        raise UsageError(f"{path}: {exc}") from None
