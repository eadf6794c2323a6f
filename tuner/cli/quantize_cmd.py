"""``python -m tuner quantize MODEL``: INT8 quantization of a model's graph, and its report.

Calibrates the FP32 graph (``--calibration N`` seeded random inputs, or a .npy/.npz file of
real inputs; ``--method minmax|percentile|entropy``), stores the calibration record, rewrites
the graph into 8-bit ops and prints the coverage. ``--report`` compares FP32 and INT8 per
quantized op and end to end over ``--inputs`` (a count of seeded random inputs, disjoint from
the calibration seeds, or a file; a .npz with labels ``y`` adds accuracy). ``--emit FILE``
writes the quantized IR (``python -m tuner passes FILE --dump`` shows it fused).
"""
from __future__ import annotations

import argparse

REPORT_SEED = 10_000   # report inputs use seeds from here: never the calibration's (0..N-1)


def register(subparsers: argparse._SubParsersAction) -> None:
    from tuner.cli.common import add_input_shape_args

    p = subparsers.add_parser(
        "quantize", help="INT8-quantize a model graph (calibration, coverage, accuracy report)",
        description="Quantize a model (.onnx or IR text) to uint8 activations / int8 weights "
                    "and report FP32 vs INT8.")
    p.add_argument("model", metavar="MODEL", help=".onnx file or graph in IR text form")
    add_input_shape_args(p)
    p.add_argument("--calibration", default="32", metavar="N|FILE",
                   help="N seeded random inputs (default 32) or a .npy/.npz file of real inputs")
    p.add_argument("--calib-method", "--method", dest="method", default="minmax",
                   choices=("minmax", "percentile", "entropy"),
                   help="calibration method (--method: the same option, its older name)")
    p.add_argument("--percentile", type=float, default=99.99, help="for --calib-method percentile")
    p.add_argument("--report", action="store_true", help="compare FP32 and INT8 (per op, end to end)")
    p.add_argument("--inputs", default="200", metavar="N|FILE",
                   help="report inputs: N seeded random inputs (default 200) or a .npy/.npz file")
    w = p.add_mutually_exclusive_group()
    w.add_argument("--reduce-range", dest="reduce_range", action="store_true", default=None,
                   help="7-bit weights [-64, 64] (default without AVX-512 VNNI)")
    w.add_argument("--full-range", dest="reduce_range", action="store_false",
                   help="8-bit weights [-127, 127] (default with AVX-512 VNNI)")
    p.add_argument("--random-weights", type=int, default=None, metavar="SEED",
                   help="ONNX: replace the float weights by seeded random ones (as verify does)")
    p.add_argument("--recalibrate", action="store_true",
                   help="calibrate again even if a stored calibration matches")
    p.add_argument("--emit", metavar="FILE", help="write the quantized graph (IR text) to FILE")
    p.add_argument("--ort", action="store_true",
                   help="with --report: also quantize with ONNX Runtime (QDQ, per channel, U8S8) "
                        "and report its top-1 agreement beside ours")
    p.add_argument("--db", default=None, help="records database (calibration records go beside it)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=run)


def _load(args):
    from tuner.cli.common import input_shapes, model_graph
    from workloads.errors import UsageError

    if args.random_weights is not None:
        if not args.model.endswith(".onnx"):
            raise UsageError("--random-weights applies to .onnx models")
        from tuner.compiler.verify_model import prepare
        return prepare(args.model, args.random_weights, **input_shapes(args))
    graph = model_graph(args)
    if args.model.endswith(".onnx"):
        from tuner.frontend.onnx import read_model
        return read_model(args.model), graph
    return None, graph


def run(args: argparse.Namespace) -> int:
    from tuner.cli.common import print_json
    from workloads.errors import UsageError
    from tuner.quant.calibrate import samples_from_arg
    from workloads.graph.quant_params import default_reduce_range
    from tuner.quant.report import compare, format_coverage, format_report

    if args.ort and not args.report:
        raise UsageError("--ort needs --report")
    model, graph = _load(args)
    samples = samples_from_arg(graph, args.calibration)
    report_samples = samples_from_arg(graph, args.inputs, first_seed=REPORT_SEED) if args.report else None
    from tuner.target import host_target

    reduce_range = (default_reduce_range(host_target().features) if args.reduce_range is None
                    else args.reduce_range)
    from tuner.quant.flow import quantize_model

    run_ = quantize_model(graph, samples, method=args.method, percentile=args.percentile,
                          reduce_range=reduce_range, db=args.db, recalibrate=args.recalibrate)
    q = run_.quantized
    cov = q.coverage.to_dict()
    result = {"model": args.model, "method": args.method, "calibration": run_.calibration.samples,
              "calibration_record": str(run_.record), "calibration_reused": run_.reused,
              "weights": "int8 [-64, 64] (reduce_range)" if reduce_range else "int8 [-127, 127]",
              "activations": "uint8 asymmetric", "coverage": cov}
    if args.emit:
        from workloads.graph.text import to_text
        with open(args.emit, "w", encoding="utf-8") as fh:
            fh.write(to_text(q.graph))
        result["emitted"] = args.emit
    rep = None
    if args.report:
        rep = compare(run_.fp_graph, q, report_samples)
        result["report"] = rep
        if args.ort:
            from tuner.quant.ort_compare import ort_agreement
            result["onnxruntime"] = ort_agreement(model, graph, samples, report_samples,
                                                  reduce_range=reduce_range, method=args.method,
                                                  percentile=args.percentile)
    if args.json:
        print_json(result)
        return 0
    print(f"{graph.name}: {result['activations']} activations, {result['weights']} weights "
          f"per output channel; calibration {args.method} on {run_.calibration.samples} "
          f"({'reused' if run_.reused else 'stored'}: {run_.record})")
    if rep is not None:
        print(format_report(rep))
        o = result.get("onnxruntime")
        if o is not None and o["status"] != "ok":
            print(f"ONNX Runtime {o['version']} quantize_static failed: {o['error']}")
        elif o is not None:
            print(f"ONNX Runtime {o['version']} quantize_static (QDQ, per channel, U8S8, "
                  f"reduce_range={o['reduce_range']}, {o['calibrate_method']}): top-1 agreement "
                  f"{100 * o['top1_agreement']:.2f}%"
                  + (f", accuracy {100 * o['accuracy_int8']:.2f}%" if "accuracy_int8" in o else ""))
    print(format_coverage(cov))
    if args.emit:
        print(f"quantized IR written to {args.emit}")
    return 0
