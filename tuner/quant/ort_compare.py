"""The same model and calibration data through ONNX Runtime's static quantization.

``onnxruntime.quantization.quantize_static`` with QDQ format, per-channel weights, uint8
activations and int8 weights (U8S8, what ORT uses on x86), the same ``reduce_range`` and
the matching calibration method; then FP32 ORT and INT8 ORT run the report inputs and the
top-1 agreement (and accuracy when labelled) is reported beside ours.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile

import numpy as np

from workloads.errors import UsageError
from workloads.graph.ir import Graph
from tuner.quant.calibrate import Samples

_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}


QDQ_OPSET = 13   # per-channel DequantizeLinear (its axis attribute) needs opset 13


def ort_agreement(model, graph: Graph, calib: Samples, inputs: Samples, *, reduce_range: bool,
                  method: str, percentile: float = 99.99) -> dict:
    """{"status": "ok", "top1_agreement", "top5_agreement", ["accuracy_fp32",
    "accuracy_int8"], ...}, or {"status": "failed", "error": ...} when ONNX Runtime cannot
    quantize or run the model (a failure of the competitor is a result, not a crash)."""
    if model is None:
        raise UsageError("--ort needs an .onnx model")
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import quantize_static  # noqa: F401
    except ImportError:
        raise UsageError("--ort needs onnxruntime: pip install 'tuner[onnx]'") from None
    try:
        return {"status": "ok", **_run(model, graph, calib, inputs, reduce_range, method, percentile)}
    except Exception as exc:  # ORT's InvalidGraph, Fail, converter errors ...
        msg = " ".join(str(exc).split())[:300] or type(exc).__name__
        return {"status": "failed", "version": ort.__version__, "error": msg}


def quantize_with_ort(model, graph: Graph, calib: Samples, *, reduce_range: bool, method: str,
                      percentile: float = 99.99) -> bytes:
    """The model quantized by ONNX Runtime's ``quantize_static`` (QDQ, per channel, U8
    activations, S8 weights, ``reduce_range``, the calibration method and samples given), as
    serialized ONNX bytes."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod,
                                          QuantFormat, QuantType, quantize_static)

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), QDQ_OPSET)
    if opset < QDQ_OPSET:
        model = onnx.version_converter.convert_version(model, QDQ_OPSET)
    names = [p.name for p in graph.inputs]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calib.inputs)

        def get_next(self):
            row = next(self.it, None)
            return None if row is None else dict(zip(names, row))

    with tempfile.TemporaryDirectory(prefix="tuner-ort-q") as d:
        src, dst = os.path.join(d, "fp32.onnx"), os.path.join(d, "int8.onnx")
        with open(src, "wb") as fh:
            fh.write(model.SerializeToString())
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)   # ORT's "consider pre-processing" warnings
        try:
            with contextlib.redirect_stdout(io.StringIO()):   # ORT prints calibration progress
                quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ,
                                per_channel=True, activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QInt8, reduce_range=reduce_range,
                                calibrate_method=getattr(CalibrationMethod, _METHODS[method]),
                                extra_options={"CalibPercentile": percentile})
        finally:
            root.setLevel(level)
        with open(dst, "rb") as fh:
            return fh.read()


def _run(model, graph: Graph, calib: Samples, inputs: Samples, reduce_range: bool, method: str,
         percentile: float) -> dict:
    import onnxruntime as ort

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), QDQ_OPSET)
    names = [p.name for p in graph.inputs]
    qbytes = quantize_with_ort(model, graph, calib, reduce_range=reduce_range, method=method,
                               percentile=percentile)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    fp = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(qbytes, so, providers=["CPUExecutionProvider"])
    a, b = [], []
    for row in inputs.inputs:
        feed = dict(zip(names, row))
        ya, yb = fp.run(None, feed)[0], q.run(None, feed)[0]
        batch = ya.shape[0] if ya.ndim > 1 else 1
        a.append(ya.reshape(batch, -1))
        b.append(yb.reshape(batch, -1))
    fa, qa = np.concatenate(a), np.concatenate(b)
    top1 = fa.argmax(axis=1)
    top5 = np.argsort(-qa, axis=1, kind="stable")[:, :min(5, qa.shape[1])]
    out = {"version": ort.__version__, "format": "QDQ", "per_channel": True,
           "opset": max(opset, QDQ_OPSET),
           "reduce_range": reduce_range, "calibrate_method": _METHODS[method],
           "percentile": percentile if method == "percentile" else None,
           "top1_agreement": float(np.mean(top5[:, 0] == top1)),
           "top5_agreement": float(np.mean((top5 == top1[:, None]).any(axis=1)))}
    if inputs.labels is not None and inputs.labels.shape[0] == fa.shape[0]:
        out["accuracy_fp32"] = float(np.mean(top1 == inputs.labels))
        out["accuracy_int8"] = float(np.mean(top5[:, 0] == inputs.labels))
    return out
