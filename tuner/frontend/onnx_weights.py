"""Seeded random weights for an ONNX model (``verify --random-weights SEED``).

The light models in the onnx wheel build every weight with ``ConstantOfShape`` (all 0.02), so
their outputs are trivially uniform and a comparison proves little. ``randomize(model, seed)``
returns a copy in which every float weight — initializers, ``Constant`` nodes and the float
``ConstantOfShape`` nodes with a constant shape — is an initializer of seeded random values of
the same shape; the same rewritten model is given to ONNX Runtime and to the importer, so both
see exactly the same numbers. Scalars (Clip bounds, Dropout ratios) are left alone.

Scales follow each tensor's role so a deep network neither overflows nor vanishes: He-normal
(std sqrt(2 / fan_in)) for Conv/Gemm/MatMul weights, small normals for biases, BatchNorm
scale in [0.5, 1.5] and shift small; anything else uniform in [0.5, 1.5]. Then the weights
are *calibrated* like a trained network's, in one NumPy-executor pass over a seeded input
(LSUV-style, in topological order): each Conv/Gemm/MatMul weight is rescaled so the layer's
output has unit standard deviation (the last layers: ``LOGIT_STD``), and each BatchNorm's mean and variance are set to the
per-channel statistics of its input. Activations stay O(1) through any depth and the logits
too, so a final softmax is neither uniform nor one-hot (without it, Inception v1's output is
one-hot and ResNet-50's residual sums grow ~2x per block: a comparison would prove little;
with logits of std 1 a 1% error would hide under atol).
"""
from __future__ import annotations

import numpy as np

from workloads.errors import UsageError


_LAYERS = ("conv2d", "dense", "matmul")
LOGIT_STD = 4.0
_MOVEMENT = frozenset({"transpose", "reshape", "flatten", "expand_dims", "squeeze"})


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


def randomize(model, seed: int, *, shapes=None, batch: int = 1):
    """A copy of ``model`` with seeded random float weights (see the module docstring);
    ``shapes``/``batch``: its symbolic input dimensions for the calibration pass
    (``tuner.frontend.onnx.load``)."""
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
    calibrate(m, seed, shapes=shapes, batch=batch)
    return m


def calibrate(model, seed: int, *, shapes=None, batch: int = 1) -> None:
    """On a seeded standard-normal input, in topological order (initializers changed in
    place): scale each Conv/Gemm/MatMul weight so its layer's output has unit std; set each
    BatchNormalization mean/var to the per-channel statistics of its input."""
    from onnx import numpy_helper

    from tuner.frontend.onnx import import_model
    from workloads.graph.executor import bind_inputs, evaluate
    from workloads.graph.executor import random_inputs

    graph, values = import_model(model, name="calibrate", shapes=shapes, batch=batch)
    onnx_name = {ir: ox for ox, ir in values.items()}
    inits = {t.name: t for t in model.graph.initializer}
    env = bind_inputs(graph, random_inputs(graph, seed=seed + 1))
    consts = {n.name: n.value.array for n in graph.nodes if n.is_const}
    producer = {n.name: n for n in graph.nodes}

    def weight_init(ir_name: str) -> tuple[str | None, list[str]]:
        """(ONNX initializer, IR values computed from it by data movement only) feeding a
        layer's weight input (Gemm/MatMul weights come through a transpose or reshape)."""
        chain = []
        while onnx_name.get(ir_name) not in inits:
            p = producer.get(ir_name)
            if p is None or p.op not in _MOVEMENT or len(p.inputs) != 1:
                return None, []
            chain.append(ir_name)
            ir_name = p.inputs[0]
        return onnx_name[ir_name], chain

    # The last layers (no layer after them) get a wider output: logits of std LOGIT_STD make
    # a softmax output peaked but not one-hot, so a small error in them shows.
    after_layer: set[str] = set()
    for node in reversed(graph.nodes):
        users = graph.users.get(node.name, ())
        if any(u in after_layer or producer[u].op in _LAYERS for u in users):
            after_layer.add(node.name)

    for node in graph.nodes:
        if not node.is_compute:
            continue
        args = [env[i] if i in env else consts[i] for i in node.inputs]
        if node.op in _LAYERS:
            init, chain = weight_init(node.inputs[1])
            out = evaluate(node, args)
            std = float(out.std()) / (1.0 if node.name in after_layer else LOGIT_STD)
            if init is not None and std > 0 and np.isfinite(std):
                t = inits[init]
                arr = (numpy_helper.to_array(t) / std).astype(args[1].dtype)
                t.CopyFrom(numpy_helper.from_array(arr, t.name))
                consts[values[init]] = arr
                for v in chain:
                    env[v] = (env[v] / std).astype(env[v].dtype)
                out = (out / std).astype(out.dtype)
            env[node.name] = out
            continue
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
