"""``python -m tuner build MODEL``: build an executable module and say how it was built.

One summary line counts the kernels by where their config came from (tuned records, fallback
configs, fixed kernels, groups left to NumPy); ``--details`` lists every kernel with its
workload, config or the reason for a fallback, and the memory plan.
"""
from __future__ import annotations


def add_model_build_args(p) -> None:
    """Options shared by build, run-model and verify."""
    from tuner.cli.common import add_db_arg, add_input_shape_args, add_threads_arg

    p.add_argument("model", metavar="MODEL", help="model file: .onnx (extra .[onnx]) or IR text")
    add_input_shape_args(p)
    add_threads_arg(p)
    add_db_arg(p)
    p.add_argument("--opt-level", "-O", type=int, default=None, choices=range(4), metavar="N",
                   help="graph pass pipeline 0..3 (default 3: NHWC, direct convolutions; 2 "
                        "with --int8: NCHW; 0 = no graph optimisation)")
    p.add_argument("--strict", action="store_true",
                   help="fail (NoRecordError) when any kernel would use a fallback config")
    p.add_argument("--untuned", action="store_true",
                   help="ignore the records: template default configs everywhere")
    p.add_argument("--jobs", type=int, default=None,
                   help="compile processes (default: usable cores)")
    add_int8_args(p)


def add_int8_args(p) -> None:
    """``--int8`` and its calibration options (build, run-model, verify, tune model)."""
    q = p.add_argument_group("INT8 (quantized build)")
    q.add_argument("--int8", action="store_true",
                   help="calibrate, quantize (uint8 activations, int8 per-channel weights) and "
                        "build the quantized graph; the summary adds its coverage")
    q.add_argument("--calibration", default=None, metavar="N|FILE",
                   help="with --int8: N seeded random inputs (default 32, as verify feeds) or a "
                        ".npy/.npz file of real inputs")
    q.add_argument("--calib-method", default="minmax", choices=("minmax", "percentile", "entropy"),
                   help="with --int8: calibration method (default minmax)")
    q.add_argument("--percentile", type=float, default=99.99, help="for --calib-method percentile")
    w = q.add_mutually_exclusive_group()
    w.add_argument("--reduce-range", dest="reduce_range", action="store_true", default=None,
                   help="7-bit weights [-64, 64] (default without AVX-512 VNNI)")
    w.add_argument("--full-range", dest="reduce_range", action="store_false",
                   help="8-bit weights [-127, 127] (default with AVX-512 VNNI)")


def int8_options(args):
    """``Int8Options`` from ``--int8`` and its options (None without ``--int8``; the
    INT8 options without it are a usage error)."""
    from workloads.errors import UsageError

    if not getattr(args, "int8", False):
        given = [o for o, v in (("--calibration", args.calibration),
                                ("--reduce-range/--full-range", args.reduce_range)) if v is not None]
        if args.calib_method != "minmax":
            given.append("--calib-method")
        if given:
            raise UsageError(f"{', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} "
                             "with --int8")
        return None
    from tuner.quant.flow import Int8Options

    return Int8Options(calibration=args.calibration or "32", method=args.calib_method,
                       percentile=args.percentile, reduce_range=args.reduce_range)


def register(sub) -> None:
    p = sub.add_parser("build", help="build a model into an executable module (fallbacks counted)")
    add_model_build_args(p)
    p.add_argument("--details", action="store_true",
                   help="list every kernel: source (tuned/fallback/fixed/numpy), config or reason")
    p.add_argument("--random-weights", type=int, default=None, metavar="SEED",
                   help="an .onnx model with its float weights replaced by seeded random ones (as "
                        "verify, tune model --int8 and bench model use: the same calibration)")
    p.set_defaults(handler=run)


def build_module(args, graph=None):
    """Build ``args.model`` (or ``graph``) with the shared options; returns the module."""
    from tuner.compiler import build
    from tuner.cli.common import model_graph, threads_of
    from workloads.errors import UsageError

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    int8 = int8_options(args)
    if graph is None:
        graph = model_graph(args, seed=getattr(args, "random_weights", None))
    return build(graph, opt_level=args.opt_level, threads=threads_of(args), db=args.db,
                 strict=args.strict, tuned=not args.untuned, jobs=args.jobs, int8=int8 or False)


def run(args) -> int:
    from workloads.graph.analysis import human_bytes

    module = build_module(args)
    s = module.summary
    print(s.line(args.model))
    if s.quant:
        from tuner.bench.peak import int8_arithmetic_note, stored_core_peaks

        print(int8_arithmetic_note(stored_core_peaks(), args.model))
    if args.details:
        print(f"\n{s.kernels} kernels, {s.views} views, opt level {s.opt_level}, "
              f"{s.threads} thread(s); built in {s.build_seconds:.1f} s "
              f"(compile and load {s.compile_seconds:.1f} s)")
        print(f"memory plan: {human_bytes(s.planned_bytes)} of reused buffers for "
              f"{human_bytes(s.naive_bytes)} of intermediate values\n")
        print(module.details())
        if s.quant:
            print(quant_details(s.quant))
    return 0


def quant_details(q: dict) -> str:
    """The coverage of an int8 build in full: calibration, ops both ways, why each FP32 op stayed."""
    lines = [f"\nINT8: calibration {q['method']} on {q['calibration']} (record {q['calibration_record']}); "
             f"weights {'int8 [-64, 64] (reduce_range)' if q['reduce_range'] else 'int8 [-127, 127]'}, "
             "uint8 asymmetric activations",
             f"  quantized: {', '.join(f'{op} x{n}' for op, n in q['quantized_by_op'].items()) or 'none'}",
             f"  FP32:      {', '.join(f'{op} x{n}' for op, n in q['fp32_by_op'].items()) or 'none'}"]
    lines += [f"    %{name}: {why}" for name, why in q["fp32_reasons"].items()]
    lines.append(f"  conversions: {q['quantize_ops']} quantize + {q['dequantize_ops']} dequantize; "
                 f"{q['quantized_numpy']} of {q['quantized_kernels']} quantized kernels run with NumPy")
    return "\n".join(lines)
