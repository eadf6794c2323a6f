"""Checking a built module against a peer: ONNX Runtime on the same model and weights.

``verify_onnx(path, seed=...)``: with ``seed`` the model's float weights are replaced by
seeded random ones first (``tuner.frontend.onnx_weights.randomize``; the same rewritten model
goes to ONNX Runtime and to the importer). Both run a seeded standard-normal input; every
output is compared: max absolute error, max relative error (over elements with |expected| >=
atol, where a relative error means something) and ``np.allclose(rtol, atol)``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from workloads.errors import UsageError

RTOL, ATOL = 1e-3, 1e-4   # float32


@dataclass
class OutputCheck:
    name: str
    shape: tuple
    max_abs: float
    max_rel: float
    ok: bool


@dataclass
class VerifyResult:
    model: str
    outputs: list[OutputCheck] = field(default_factory=list)
    rtol: float = RTOL
    atol: float = ATOL
    summary: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.outputs) and all(o.ok for o in self.outputs)

    @property
    def max_abs(self) -> float:
        return max(o.max_abs for o in self.outputs)

    @property
    def max_rel(self) -> float:
        return max(o.max_rel for o in self.outputs)


def compare(name: str, got: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> OutputCheck:
    if got.shape != expected.shape:
        return OutputCheck(name, tuple(got.shape), float("inf"), float("inf"), False)
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    ref = np.abs(expected.astype(np.float64))
    big = ref >= atol
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff[big] / ref[big]).max()) if big.any() else 0.0
    finite = bool(np.isfinite(got).all() == np.isfinite(expected).all())
    ok = finite and bool(np.allclose(got, expected, rtol=rtol, atol=atol))
    return OutputCheck(name, tuple(got.shape), max_abs, max_rel, ok)


def ort_session(model_bytes: bytes, threads: int, **options):
    """An ONNX Runtime CPU session: ``threads`` intra-op threads, one inter-op, sequential;
    ``options``: further ``SessionOptions`` attributes (e.g. ``enable_profiling=True``)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageError("comparing with ONNX Runtime needs the optional extra: "
                         "pip install 'tuner[onnx]' (onnxruntime is not installed)") from None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    for name, value in options.items():
        setattr(so, name, value)
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def prepare(path: str, seed: int | None, *, shapes=None, batch: int = 1):
    """(model proto with the weights to use, IR graph of exactly that model; ``shapes`` and
    ``batch`` set its symbolic input dimensions, ``tuner.frontend.onnx.load``)."""
    from tuner.frontend.onnx import from_model, read_model
    from tuner.frontend.onnx_weights import randomize

    model = read_model(path)
    if seed is not None:
        model = randomize(model, seed, shapes=shapes, batch=batch)
    name = os.path.splitext(os.path.basename(path))[0]
    return model, from_model(model, name=name, shapes=shapes, batch=batch, where=path)


def verify_onnx(path: str, *, seed: int | None = None, threads: int = 1, opt_level: int | None = None,
                input_seed: int = 0, rtol: float = RTOL, atol: float = ATOL, db: str | None = None,
                strict: bool = False, tuned: bool = True, jobs: int | None = None,
                shapes=None, batch: int = 1) -> VerifyResult:
    from tuner.compiler.compile_model import build
    from workloads.graph.executor import random_inputs

    model, graph = prepare(path, seed, shapes=shapes, batch=batch)
    inputs = random_inputs(graph, seed=input_seed)
    sess = ort_session(model.SerializeToString(), threads)
    feed = {p.name: x for p, x in zip(graph.inputs, inputs)}
    expected = sess.run(None, feed)
    module = build(graph, opt_level=opt_level, threads=threads, db=db, strict=strict,
                   tuned=tuned, jobs=jobs)
    got = module.run(inputs)
    res = VerifyResult(graph.name, rtol=rtol, atol=atol, summary=module.summary.line(path))
    for name, g, e in zip(graph.outputs, got, expected):
        res.outputs.append(compare(name, g, np.asarray(e), rtol, atol))
    return res


@dataclass
class StepCheck:
    """One kernel of an int8 build against the NumPy reference of its fused group."""

    name: str
    label: str
    source: str
    dtype: str
    mismatches: int          # integer outputs: elements that differ; float: outside tolerance
    max_abs: float


@dataclass
class Int8VerifyResult(VerifyResult):
    steps: list[StepCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return super().ok and all(s.mismatches == 0 for s in self.steps)


def verify_int8(graph, *, inputs: list | None = None, input_seed: int = 0, rtol: float = 1e-5,
                atol: float = 1e-6, module=None, **build_options) -> Int8VerifyResult:
    """An int8 build checked against the NumPy executor of its quantized graph.

    Step by step: the optimized quantized graph's fused groups run with the NumPy reference
    (each on the reference's own values), and after each kernel of the module its output is
    compared with the group's: integer outputs (uint8, int8, int32) **exactly**, float outputs
    within ``rtol``/``atol``. End to end: the module's outputs against ``execute`` of the
    quantized graph (before the pass pipeline) within ``rtol``/``atol``.
    ``build_options`` go to ``build`` (``int8`` defaults to True); ``module`` reuses a build.
    """
    from tuner.compiler.compile_model import build, pipeline
    from workloads.graph.executor import execute, random_inputs

    if module is None:
        build_options.setdefault("int8", True)
        module = build(graph, **build_options)
    qrun = module.quantized
    if qrun is None:
        raise UsageError("verify_int8 needs a module built with int8")
    qgraph = qrun.quantized.graph
    inputs = inputs if inputs is not None else random_inputs(qgraph, seed=input_seed)
    g = pipeline(qgraph, module.summary.opt_level)
    env = {p.name: np.asarray(x) for p, x in zip(g.inputs, inputs)}
    env.update({n.name: np.asarray(n.value.array) for n in g.nodes if n.is_const})
    nodes = {n.name: n for n in g.nodes}
    res = Int8VerifyResult(module.name, rtol=rtol, atol=atol, summary=module.summary.line())

    def after(step) -> None:
        node = nodes[step.name]
        ref = np.asarray(execute(node.body, [env[i] for i in node.inputs])[0])
        env[step.name] = ref
        if step.source == "view":
            return
        got = step.output
        if ref.dtype.kind in "iu":
            bad = int((got.astype(np.int64) != ref.astype(np.int64)).sum())
            err = float(np.abs(got.astype(np.int64) - ref.astype(np.int64)).max()) if ref.size else 0.0
        else:
            diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
            bad = int((~np.isclose(got, ref, rtol=rtol, atol=atol)).sum())
            err = float(diff.max()) if diff.size else 0.0
        res.steps.append(StepCheck(step.name, step.label, step.source, ref.dtype.name, bad, err))

    got = module.run_steps(inputs, after)
    expected = execute(qgraph, inputs)
    for name, a, e in zip(qgraph.outputs, got, expected):
        res.outputs.append(compare(name, a, np.asarray(e), rtol, atol))
    return res
