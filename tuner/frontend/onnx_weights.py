"""Seeded random weights for an ONNX model (``verify --random-weights SEED``).

The light models in the onnx wheel build every weight with ``ConstantOfShape`` (all 0.02), so
their outputs are trivially uniform and a comparison proves little. ``randomize(model, seed)``
returns a copy in which every float weight — initializers, ``Constant`` nodes and the float
``ConstantOfShape`` nodes with a constant shape — is an initializer of seeded random values of
the same shape; the same rewritten model is given to ONNX Runtime and to the importer, so both
see exactly the same numbers. Scalars (Clip bounds, Dropout ratios) are left alone.

Scales follow each tensor's role so a deep network neither overflows nor vanishes: He-normal
(std sqrt(2 / fan_in)) for Conv/Gemm/MatMul weights, small normals for biases, BatchNorm
scale in [0.5, 1.5] and shift small; anything else uniform in [0.5, 1.5]. BatchNorm mean and
variance are then *calibrated* like a trained network's: one NumPy-executor pass on a seeded
input sets them to the per-channel statistics of each BatchNorm's input, so every BatchNorm
normalises and ResNet-style residual sums stay O(1) (random statistics grow the activations
~2x per block and the softmax output turns one-hot, which would make the check trivial).
"""
from __future__ import annotations

import numpy as np

from tuner.errors import UsageError


def _role(consumers: list[tuple], shape: tuple) -> tuple[str, float]:
    """('normal', std) or ('uniform', 0) for a tensor read as ``consumers`` [(node, index)]."""
    for node, k in consumers:
        op = node.op_type
        attrs = {a.name: a for a in node.attribute}
        if op == "Conv" and k == 1 and len(shape) >= 2:
            return "normal", float(np.sqrt(2.0 / max(1, int(np.prod(shape[1:])))))
        if op == "Gemm" and k == 1 and len(shape) == 2:
            trans_b = attrs["transB"].i if "transB" in attrs else 0
            return "normal", float(np.sqrt(2.0 / max(1, shape[1] if trans_b else shape[0])))
        if op == "MatMul" and k == 1 and len(shape) >= 2:
            return "normal", float(np.sqrt(2.0 / max(1, shape[-2])))
        if op in ("Conv", "Gemm") and k == 2:
            return "normal", 0.05
        if op == "BatchNormalization":
            return ("uniform", 0.0) if k in (1, 4) else ("normal", 0.1)
        if op in ("Add", "Sum", "Sub"):
            return "normal", 0.1
    return "uniform", 0.0


def randomize(model, seed: int):
    """A copy of ``model`` with seeded random float weights (see the module docstring)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if seed < 0:
        raise UsageError(f"--random-weights seed must be >= 0, got {seed}")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    consumers: dict[str, list] = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            consumers.setdefault(i, []).append((n, k))
    inits = {t.name: t for t in g.initializer}
    rng = np.random.default_rng(seed)

    def draw(name: str, shape: tuple, dtype) -> np.ndarray:
        kind, std = _role(consumers.get(name, []), shape)
        if kind == "normal":
            a = rng.standard_normal(shape) * std
        else:
            a = rng.uniform(0.5, 1.5, size=shape)
        return a.astype(dtype)

    def wanted(name: str, shape: tuple, dtype) -> bool:
        if np.dtype(dtype).kind != "f":
            return False
        weight_use = any(n.op_type in ("Conv", "Gemm", "MatMul", "BatchNormalization") and k >= 1
                         for n, k in consumers.get(name, []))
        return weight_use or int(np.prod(shape, dtype=np.int64)) > 1

    # Initializers.
    for t in g.initializer:
        arr = numpy_helper.to_array(t)
        if wanted(t.name, arr.shape, arr.dtype):
            t.CopyFrom(numpy_helper.from_array(draw(t.name, arr.shape, arr.dtype), t.name))
    # Constant / ConstantOfShape nodes -> initializers.
    keep, new_inits = [], []
    for n in g.node:
        out = n.output[0] if n.output else ""
        arr = None
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            vals = [a for a in n.attribute if a.name in ("value", "value_floats")]
            if vals:
                v = helper.get_attribute_value(vals[0])
                arr = numpy_helper.to_array(v) if vals[0].name == "value" else np.array(v, np.float32)
        elif n.op_type == "ConstantOfShape" and n.domain in ("", "ai.onnx") and n.input[0] in inits:
            dims = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]).reshape(-1))
            vals = [a for a in n.attribute if a.name == "value"]
            dtype = numpy_helper.to_array(vals[0].t).dtype if vals else np.float32
            arr = np.zeros(dims, dtype)
        if arr is not None and wanted(out, arr.shape, arr.dtype):
            new_inits.append(numpy_helper.from_array(draw(out, arr.shape, arr.dtype), out))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    if m.ir_version < 4:   # initializers must be listed as graph inputs before IR version 4
        listed = {i.name for i in g.input}
        for t in new_inits:
            if t.name not in listed:
                g.input.append(helper.make_tensor_value_info(t.name, TensorProto.FLOAT
                                                             if t.data_type == TensorProto.FLOAT
                                                             else t.data_type, list(t.dims)))
    # Drop initializers nothing reads any more (the ConstantOfShape shapes).
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    dead = {t.name for t in g.initializer if t.name not in used}
    if dead:
        live = [t for t in g.initializer if t.name not in dead]
        del g.initializer[:]
        g.initializer.extend(live)
        live_in = [i for i in g.input if i.name not in dead]
        del g.input[:]
        g.input.extend(live_in)
    if any(n.op_type == "BatchNormalization" for n in g.node):
        calibrate_batch_norm(m, seed)
    return m


def calibrate_batch_norm(model, seed: int) -> None:
    """Set every BatchNormalization mean/var initializer (in place) to the per-channel
    statistics of its input on a seeded standard-normal input, in topological order."""
    from onnx import numpy_helper

    from tuner.frontend.onnx import import_model
    from tuner.graph.executor import bind_inputs, evaluate
    from tuner.graph.executor import random_inputs

    graph, values = import_model(model, name="calibrate")
    onnx_name = {ir: ox for ox, ir in values.items()}
    inits = {t.name: t for t in model.graph.initializer}
    env = bind_inputs(graph, random_inputs(graph, seed=seed + 1))
    consts = {n.name: n.value.array for n in graph.nodes if n.is_const}
    for node in graph.nodes:
        if not node.is_compute:
            continue
        args = [env[i] if i in env else consts[i] for i in node.inputs]
        if node.op == "batch_norm" and all(onnx_name.get(i) in inits for i in node.inputs[3:5]):
            x = args[0].astype(np.float64)
            axes = tuple(k for k in range(x.ndim) if k != node.attrs["axis"] % x.ndim)
            mean, var = x.mean(axis=axes), x.var(axis=axes) + 1e-3
            for ir_name, arr in zip(node.inputs[3:5], (mean, var)):
                t = inits[onnx_name[ir_name]]
                arr = arr.astype(args[3].dtype)
                t.CopyFrom(numpy_helper.from_array(arr, t.name))
                consts[ir_name] = arr
            args = [env[i] if i in env else consts[i] for i in node.inputs]
        env[node.name] = evaluate(node, args)
