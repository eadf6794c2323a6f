"""The quantization flow the CLI runs: canonical FP32 graph -> calibration (stored) -> 8-bit graph."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from workloads.graph.ir import Graph
from workloads.graph.passes.quantize import QuantizedGraph, check_quantizable, quantize_graph
from tuner.quant import records
from tuner.quant.calibrate import Calibration, Samples, calibrate


def canonical(graph: Graph, disabled: frozenset[str] = frozenset()) -> Graph:
    """The O2 pipeline without FuseOps: what the Quantize pass expects (batch_norm and scales
    folded into the weights, biases as ``add`` of a constant); ``disabled``: pass names
    skipped."""
    from workloads.graph.passes import PassContext, Sequential, pipeline_passes

    passes = [p for p in pipeline_passes(2) if p.name != "FuseOps"]
    return Sequential(passes, name="canonical")(graph, PassContext(opt_level=2, disabled=disabled))


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


@dataclass(frozen=True)
class Int8Options:
    """How ``build(..., int8=...)`` quantizes: calibration inputs (a count of seeded random
    inputs, a .npy/.npz path or ``Samples``), method, percentile, weight range (None: this
    target's default), and where calibration records go (``db``)."""

    calibration: object = 32
    method: str = "minmax"
    percentile: float = 99.99
    reduce_range: bool | None = None
    recalibrate: bool = False


def quantize_for_build(graph: Graph, options: "Int8Options | bool", db: str | None = None) -> QuantRun:
    """The quantized graph a build compiles: calibration (stored or reused) and the Quantize
    pass, exactly as ``python -m tuner quantize`` does it; bad calibration input and a model
    with nothing to quantize are ``UsageError`` before anything is recorded."""
    from workloads.errors import UsageError
    from workloads.graph.quant_params import default_reduce_range
    from tuner.quant.calibrate import METHODS, samples_from_arg
    from tuner.target import host_target

    opts = Int8Options() if options is True else options
    if not isinstance(opts, Int8Options):
        raise UsageError(f"int8 must be True or an Int8Options, got {type(options).__name__}")
    if opts.method not in METHODS:
        raise UsageError(f"calibration method must be one of {', '.join(METHODS)}, got {opts.method!r}")
    samples = opts.calibration if isinstance(opts.calibration, Samples) \
        else samples_from_arg(graph, str(opts.calibration))
    reduce_range = default_reduce_range(host_target().features) if opts.reduce_range is None \
        else bool(opts.reduce_range)
    return quantize_model(graph, samples, method=opts.method, percentile=opts.percentile,
                          reduce_range=reduce_range, db=db, recalibrate=opts.recalibrate)
