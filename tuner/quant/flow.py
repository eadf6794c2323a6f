"""The quantization flow the CLI runs: canonical FP32 graph -> calibration (stored) -> 8-bit graph."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from workloads.graph.ir import Graph
from workloads.graph.passes.quantize import QuantizedGraph, check_quantizable, quantize_graph
from tuner.quant import records
from tuner.quant.calibrate import Calibration, Samples, calibrate


def canonical(graph: Graph) -> Graph:
    """The O2 pipeline without FuseOps: what the Quantize pass expects (batch_norm and scales
    folded into the weights, biases as ``add`` of a constant)."""
    from workloads.graph.passes import PassContext, Sequential, pipeline_passes

    passes = [p for p in pipeline_passes(2) if p.name != "FuseOps"]
    return Sequential(passes, name="canonical")(graph, PassContext(opt_level=2))


@dataclass
class QuantRun:
    fp_graph: Graph
    calibration: Calibration
    quantized: QuantizedGraph
    record: Path
    reused: bool


def quantize_model(graph: Graph, samples: Samples, *, method: str, percentile: float,
                   reduce_range: bool, db: str | None = None,
                   recalibrate: bool = False) -> QuantRun:
    """Calibrate (or reuse the stored calibration of the same model, data, method and
    target), quantize, and store the calibration record (only after both succeeded)."""
    from tuner.target import host_target

    fp = canonical(graph)
    check_quantizable(fp)   # before the (long) calibration
    target = host_target()
    digest = records.graph_digest(fp)
    key = records.record_key(digest, method, samples.source,
                             percentile if method == "percentile" else None, target.key,
                             reduce_range)
    path = records.record_path(records.calibration_dir(db), graph.name, key)
    calib = None if recalibrate else records.load(path)
    reused = calib is not None
    if calib is None:
        calib = calibrate(fp, samples, method, percentile)
    qg = quantize_graph(fp, calib.ranges, reduce_range=reduce_range)
    if not reused:
        records.save(path, calib, model=graph.name, digest=digest, reduce_range=reduce_range,
                     target=target)
    return QuantRun(fp, calib, qg, path, reused)
