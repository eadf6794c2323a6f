"""ONNX (opset 9 and later) to the graph IR: ``load(path) -> Graph``.

Needs the optional extra ``pip install 'tuner[onnx]'``. The converter walks the ONNX graph in
order; each ONNX op has one converter in ``tuner.frontend.onnx_ops.CONVERTERS`` (a table read
top to bottom). Conventions:

- initializers and ``Constant`` nodes are *import-time values*: they become IR constants when
  a computed value reads them, and shape-like arguments (Reshape's shape, Unsqueeze's axes,
  Clip's bounds, ConstantOfShape's shape) are read from them directly;
- integer shape arithmetic whose inputs are all import-time values (``Shape -> Gather ->
  Concat -> Reshape`` as exported by PyTorch) is evaluated while importing;
- float tensors built by ``ConstantOfShape`` stay IR ops (``constant_of_shape``) so that the
  FoldConstant pass folds them, as it folds everything computed from constants;
- initializers that are also listed as graph inputs (opset 9 style) are constants, the graph
  inputs are the remaining ones; a symbolic first dimension is ``batch`` (1), other symbolic
  dimensions come from ``shapes`` (the CLI's ``--input-shape``), which may set symbolic
  dimensions only (the model's rank and fixed sizes stay, as ONNX Runtime requires).

Every problem (not a readable ONNX file, an opset before 9, an unsupported op or attribute)
is one ``UsageError`` line naming the file, the op type and the node.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from workloads.errors import UsageError
from workloads.graph.builder import GraphBuilder
from workloads.graph.graph_errors import GraphError
from workloads.graph.ir import Graph, TensorType

MIN_OPSET = 9


def require_onnx():
    """The ``onnx`` module, or a one-line UsageError telling how to install it."""
    try:
        import onnx
    except ImportError:
        raise UsageError("ONNX models need the optional extra: pip install 'tuner[onnx]' "
                         "(the onnx package is not installed)") from None
    return onnx


def read_model(path: str):
    """Parse and check an ONNX file (UsageError when it is not a readable ONNX model)."""
    onnx = require_onnx()
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    try:
        model = onnx.load(path, load_external_data=True)
    except Exception as exc:  # DecodeError, RuntimeError, OSError ...: all mean "not ONNX"
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{path}: not a readable ONNX model ({msg})") from None
    if not model.HasField("graph") or not model.graph.node:
        raise UsageError(f"{path}: not a readable ONNX model (no graph nodes; truncated or "
                         "not an ONNX file?)")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        msg = " ".join(str(exc).split())[:300]
        raise UsageError(f"{path}: malformed ONNX model: {msg}") from None
    return model


def load(path: str, *, shapes: Mapping[str, Sequence[int]] | None = None,
         batch: int = 1) -> Graph:
    """The IR graph of the ONNX model at ``path`` (named after the file).

    ``shapes`` fixes input shapes by name; otherwise a symbolic first dimension is ``batch``.
    """
    model = read_model(path)
    name = os.path.splitext(os.path.basename(path))[0]
    return from_model(model, name=name, shapes=shapes, batch=batch, where=path)


def _dim_text(d) -> str:
    """One dimension of an ONNX shape as text: its size, or its symbolic name (? if none)."""
    if d.HasField("dim_value") and d.dim_value > 0:
        return str(int(d.dim_value))
    return d.dim_param or "?"


def opset_of(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def from_model(model, *, name: str = "model", shapes: Mapping[str, Sequence[int]] | None = None,
               batch: int = 1, where: str = "<model>") -> Graph:
    """Convert an in-memory ``onnx.ModelProto``."""
    return import_model(model, name=name, shapes=shapes, batch=batch, where=where)[0]


def import_model(model, *, name: str = "model", shapes: Mapping[str, Sequence[int]] | None = None,
                 batch: int = 1, where: str = "<model>") -> tuple[Graph, dict[str, str]]:
    """The graph and the map ONNX value name -> IR value name (for tools that edit weights)."""
    from tuner.frontend.onnx_ops import CONVERTERS

    opset = opset_of(model)
    if opset < MIN_OPSET:
        raise UsageError(f"{where}: opset {opset} is not supported; the importer needs opset "
                         f"{MIN_OPSET} or later (upgrade it with onnx.version_converter)")
    g = model.graph
    bad = {}
    for k, node in enumerate(g.node):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if key not in CONVERTERS and key not in bad:
            bad[key] = node_label(node, k)
    if bad:
        ops = ", ".join(f"{op} (node {label})" for op, label in bad.items())
        raise UsageError(f"{where}: unsupported ONNX op{'s' if len(bad) > 1 else ''} {ops}; "
                         f"supported: {', '.join(sorted(CONVERTERS))}")
    imp = Importer(model, name, opset, where)
    imp.add_inputs(shapes or {}, batch)
    for k, node in enumerate(g.node):
        imp.convert(node, k, CONVERTERS[node.op_type])
    outs = []
    for o in g.output:
        if o.name not in imp.values and o.name not in imp.consts:
            raise UsageError(f"{where}: graph output {o.name!r} is never computed")
        outs.append(imp.tensor(o.name))
    try:
        return imp.b.build(*outs), dict(imp.values)
    except GraphError as exc:
        raise UsageError(f"{where}: {exc}") from None


def node_label(node, index: int) -> str:
    return repr(node.name) if node.name else f"#{index} (output {node.output[0]!r})" \
        if node.output else f"#{index}"


_DTYPES = {1: "float32", 11: "float64", 6: "int32", 7: "int64"}


def elem_dtype(code: int, what: str) -> str:
    from onnx import TensorProto

    if code in _DTYPES:
        return _DTYPES[code]
    tname = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else str(code)
    raise UsageError(f"{what}: element type {tname} is not supported "
                     f"(supported: {', '.join(_DTYPES.values())})")


class Importer:
    """State of one conversion: the IR builder, ONNX name -> IR value, import-time arrays."""

    def __init__(self, model, name: str, opset: int, where: str) -> None:
        from onnx import numpy_helper

        self.model, self.opset, self.where = model, opset, where
        g = model.graph
        reserved = {v for n in g.node for v in n.output} | {i.name for i in g.input}
        self.b = GraphBuilder(name, reserved=reserved)
        self.values: dict[str, str] = {}            # ONNX name -> IR value name
        self.consts: dict[str, np.ndarray] = {}     # ONNX name -> import-time array
        for init in g.initializer:
            arr = numpy_helper.to_array(init)
            self.consts[init.name] = self._supported(arr, f"initializer {init.name!r}")
        self.node = None

    def _supported(self, arr: np.ndarray, what: str) -> np.ndarray:
        if arr.dtype == np.bool_:
            return arr
        if arr.dtype.name not in _DTYPES.values():
            raise UsageError(f"{self.where}: {what}: element type {arr.dtype.name} is not "
                             f"supported (supported: {', '.join(_DTYPES.values())})")
        return arr

    def given_shape(self, name: str, dims, given: Sequence[int]) -> tuple[int, ...]:
        """An input shape the caller gives: it sets the model's symbolic dimensions, and must
        keep its rank and fixed dimensions (ONNX Runtime refuses other shapes for them); any
        shape where the model declares none (``dims`` None)."""
        shape = tuple(int(d) for d in given)
        if dims is None:
            return shape
        model = [_dim_text(d) for d in dims]
        if len(shape) != len(model) or any(n < 1 for n in shape) or any(
                m.isdigit() and int(m) != n for m, n in zip(model, shape)):
            raise UsageError(f"{self.where}: input {name!r} is {'x'.join(model)} in the model; "
                             f"{'x'.join(map(str, shape))} does not fit it (a given shape sets "
                             "the symbolic dimensions)")
        return shape

    def add_inputs(self, shapes: Mapping[str, Sequence[int]], batch: int) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise UsageError(f"batch must be a positive integer, got {batch!r}")
        batched = False
        names = {vi.name for vi in self.model.graph.input if vi.name not in self.consts}
        unknown = [n for n in shapes if n not in names]
        if unknown:
            raise UsageError(f"{self.where}: no graph input named {unknown[0]!r} (inputs: "
                             f"{', '.join(sorted(names))})")
        for vi in self.model.graph.input:
            if vi.name in self.consts:
                continue
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise UsageError(f"{self.where}: input {vi.name!r} is not a tensor")
            dtype = elem_dtype(tt.elem_type, f"{self.where}: input {vi.name!r}")
            if vi.name in shapes:
                shape = self.given_shape(vi.name, tt.shape.dim if tt.HasField("shape") else None,
                                         shapes[vi.name])
            else:
                shape = []
                for k, d in enumerate(tt.shape.dim):
                    if d.HasField("dim_value") and d.dim_value > 0:
                        shape.append(int(d.dim_value))
                    elif k == 0:
                        shape.append(int(batch))
                        batched = True
                    else:
                        raise UsageError(f"{self.where}: input {vi.name!r} has symbolic dimension "
                                         f"{k} ({d.dim_param or '?'}); give its shape (--input-shape "
                                         f"{vi.name}={'x'.join(_dim_text(e) for e in tt.shape.dim)})")
            self.values[vi.name] = self.b.input(vi.name, tuple(shape), dtype).name
        if batch != 1 and not batched:
            raise UsageError(f"{self.where}: batch {batch}: no input left with a symbolic first "
                             "dimension (the model fixes its batch)")

    # -- values --------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return bool(name) and (name in self.values or name in self.consts)

    def const_value(self, name: str) -> np.ndarray | None:
        """The import-time array of ``name`` (initializer, Constant, shape arithmetic)."""
        return self.consts.get(name)

    def tensor(self, name: str) -> str:
        """The IR value of ``name``; an import-time array becomes an IR constant on first use."""
        if name in self.values:
            return self.values[name]
        if name in self.consts:
            arr = self.consts[name]
            if arr.dtype == np.bool_:
                raise self.error(f"boolean tensor {name!r} is not supported")
            self.values[name] = self.b.const(arr, self.b.fresh(name)).name
            return self.values[name]
        raise self.error(f"input {name!r} is not defined before this node")

    def type(self, ref: str) -> TensorType:
        return self.b.type_of(ref)

    def op(self, op: str, *inputs: str, name: str | None = None, out: bool = False,
           **attrs: Any) -> str:
        """Append an IR op. ``out=True``: it computes the node's first output and takes its
        ONNX name; otherwise ``name`` (default: output name + op) is made unique."""
        first = self.node[0].output[0]
        if out and first not in self.b:
            return self.b.op(op, *inputs, name=first, **attrs).name
        return self.b.op(op, *inputs, name=self.b.fresh(name or f"{first}.{op}"), **attrs).name

    def scalar(self, value: float, like: str, name: str) -> str:
        return self.b.const(np.array(value, dtype=self.type(like).dtype), self.b.fresh(name)).name

    # -- conversion ----------------------------------------------------------------------
    def error(self, message: str) -> UsageError:
        n, k = self.node
        return UsageError(f"{self.where}: node {node_label(n, k)} ({n.op_type}): {message}")

    def convert(self, node, index: int, fn) -> None:
        from onnx import helper

        self.node = (node, index)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        try:
            results = fn(self, node, attrs)
        except UsageError:
            raise
        except GraphError as exc:
            raise self.error(str(exc)) from None
        if not isinstance(results, (list, tuple)):
            results = [results]
        for k, out in enumerate(node.output):
            if not out:
                continue
            if k >= len(results) or results[k] is None:
                if any(out in n.input for n in self.model.graph.node) or \
                        any(out == o.name for o in self.model.graph.output):
                    raise self.error(f"output {k} ({out!r}) is not supported (inference only)")
                continue
            r = results[k]
            if isinstance(r, (np.ndarray, np.generic)):
                self.consts[out] = np.asarray(r)
            else:
                self.values[out] = r
