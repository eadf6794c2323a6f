"""``python -m tuner build MODEL``: build an executable module and say how it was built.

One summary line counts the kernels by where their config came from (tuned records, fallback
configs, fixed kernels, groups left to NumPy); ``--details`` lists every kernel with its
workload, config or the reason for a fallback, and the memory plan.
"""
from __future__ import annotations


def add_model_build_args(p) -> None:
    """Options shared by build, run-model and verify."""
    from tuner.cli.common import add_db_arg, add_threads_arg

    p.add_argument("model", metavar="MODEL", help="model file: .onnx (extra .[onnx]) or IR text")
    add_threads_arg(p)
    add_db_arg(p)
    p.add_argument("--opt-level", "-O", type=int, default=2, choices=range(4), metavar="N",
                   help="graph pass pipeline 0..3 (default 2; 0 = no graph optimisation)")
    p.add_argument("--strict", action="store_true",
                   help="fail (NoRecordError) when any kernel would use a fallback config")
    p.add_argument("--untuned", action="store_true",
                   help="ignore the records: template default configs everywhere")
    p.add_argument("--jobs", type=int, default=None,
                   help="compile processes (default: usable cores)")


def register(sub) -> None:
    p = sub.add_parser("build", help="build a model into an executable module (fallbacks counted)")
    add_model_build_args(p)
    p.add_argument("--details", action="store_true",
                   help="list every kernel: source (tuned/fallback/fixed/numpy), config or reason")
    p.set_defaults(handler=run)


def build_module(args, graph=None):
    """Build ``args.model`` (or ``graph``) with the shared options; returns the module."""
    from tuner.compiler import build
    from tuner.cli.common import threads_of
    from workloads.errors import UsageError
    from tuner.frontend import load_model

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    graph = graph if graph is not None else load_model(args.model)
    return build(graph, opt_level=args.opt_level, threads=threads_of(args), db=args.db,
                 strict=args.strict, tuned=not args.untuned, jobs=args.jobs)


def run(args) -> int:
    from workloads.graph.analysis import human_bytes

    module = build_module(args)
    s = module.summary
    print(s.line(args.model))
    if args.details:
        print(f"\n{s.kernels} kernels, {s.views} views, opt level {s.opt_level}, "
              f"{s.threads} thread(s); built in {s.build_seconds:.1f} s "
              f"(compile and load {s.compile_seconds:.1f} s)")
        print(f"memory plan: {human_bytes(s.planned_bytes)} of reused buffers for "
              f"{human_bytes(s.naive_bytes)} of intermediate values\n")
        print(module.details())
    return 0
