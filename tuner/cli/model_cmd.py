"""``python -m tuner run-model MODEL`` (latency p50/p95) and ``python -m tuner verify MODEL``
(the built module against ONNX Runtime, optionally with seeded random weights)."""
from __future__ import annotations


def register(sub) -> None:
    from tuner.cli.build_cmd import add_model_build_args

    p = sub.add_parser("run-model", help="build a model and time it (p50, p95)")
    add_model_build_args(p)
    p.add_argument("--repeat", type=int, default=30, help="timed runs (default 30)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="seed of the random input")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run_model)

    v = sub.add_parser("verify", help="compare the built module with ONNX Runtime (exit 0 when within tolerance)")
    add_model_build_args(v)
    v.add_argument("--random-weights", type=int, default=None, metavar="SEED",
                   help="replace the float weights by seeded random ones (same for both runtimes)")
    v.add_argument("--input-seed", type=int, default=0)
    v.add_argument("--rtol", type=float, default=1e-3)
    v.add_argument("--atol", type=float, default=1e-4)
    v.add_argument("--json", action="store_true")
    v.set_defaults(handler=run_verify)


def run_model(args) -> int:
    from tuner.cli.build_cmd import build_module
    from tuner.cli.common import fmt_time, model_graph, print_json
    from workloads.errors import UsageError
    from workloads.graph.executor import random_inputs

    if args.repeat < 1 or args.warmup < 0:
        raise UsageError("--repeat must be >= 1 and --warmup >= 0")
    graph = model_graph(args)
    module = build_module(args, graph)
    inputs = random_inputs(graph, seed=args.seed)
    t = module.time(inputs, warmup=args.warmup, repeat=args.repeat, max_seconds=1e9)
    overhead = module.overhead()
    report = {"model": args.model, "threads": module.threads, "opt_level": module.summary.opt_level,
              "summary": module.summary.line(args.model), "counts": module.summary.counts,
              **t.as_dict(), "runtime_overhead_s": overhead}
    if args.json:
        print_json(report)
        return 0
    print(module.summary.line(args.model))
    print(f"{module.name}: {module.threads} thread(s), {len(t.samples)} runs: "
          f"p50 {fmt_time(t.p50)}, p95 {fmt_time(t.p95)} (min {fmt_time(min(t.samples))}); "
          f"runtime overhead {fmt_time(overhead)} per run")
    return 0


def run_verify_int8(args) -> int:
    """``verify --int8``: the int8 build against the NumPy executor of its quantized graph,
    kernel by kernel (integers exactly) and end to end."""
    from tuner.cli.build_cmd import build_module
    from tuner.cli.common import model_graph, print_json
    from tuner.compiler.verify_model import verify_int8

    graph = model_graph(args, seed=args.random_weights)
    module = build_module(args, graph)
    rtol = 1e-5 if args.rtol == 1e-3 else args.rtol
    atol = 1e-6 if args.atol == 1e-4 else args.atol
    res = verify_int8(graph, module=module, input_seed=args.input_seed, rtol=rtol, atol=atol)
    if args.json:
        print_json({"model": args.model, "ok": res.ok, "rtol": res.rtol, "atol": res.atol,
                    "summary": res.summary, "outputs": [o.__dict__ for o in res.outputs],
                    "steps": [s.__dict__ for s in res.steps]})
        return 0 if res.ok else 1
    print(module.summary.line(args.model))
    ints = [s for s in res.steps if s.dtype not in ("float32", "float64")]
    bad = [s for s in res.steps if s.mismatches]
    print(f"{res.model} INT8 vs the NumPy executor of its quantized graph: {len(res.steps)} kernels "
          f"checked one by one ({len(ints)} with integer outputs, compared exactly; float within "
          f"rtol {res.rtol:g}, atol {res.atol:g})")
    for s in bad:
        print(f"  MISMATCH %{s.name} ({s.label}, {s.source}, {s.dtype}): {s.mismatches} elements, "
              f"max abs difference {s.max_abs:g}")
    for o in res.outputs:
        print(f"  {o.name} {list(o.shape)}: max abs error {o.max_abs:.3g}, "
              f"max rel error {o.max_rel:.3g}  {'ok' if o.ok else 'MISMATCH'}")
    print("PASS" if res.ok else "FAIL: the int8 module differs from its reference")
    return 0 if res.ok else 1


def run_verify(args) -> int:
    from tuner.compiler.verify_model import verify_onnx
    from tuner.cli.common import input_shapes, print_json, threads_of
    from workloads.errors import UsageError

    if not (args.rtol >= 0 and args.atol >= 0):
        raise UsageError(f"--rtol and --atol must be >= 0, got {args.rtol:g} and {args.atol:g}")
    if args.int8:
        return run_verify_int8(args)

    if not args.model.endswith(".onnx"):
        raise UsageError(f"verify compares with ONNX Runtime: give an .onnx model, not {args.model}")
    from tuner.cli.build_cmd import int8_options
    int8_options(args)   # INT8 options without --int8: usage error
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    res = verify_onnx(args.model, seed=args.random_weights, threads=threads_of(args),
                      opt_level=args.opt_level, input_seed=args.input_seed, rtol=args.rtol,
                      atol=args.atol, db=args.db, strict=args.strict, tuned=not args.untuned,
                      jobs=args.jobs, **input_shapes(args))
    if args.json:
        print_json({"model": args.model, "ok": res.ok, "rtol": res.rtol, "atol": res.atol,
                    "random_weights": args.random_weights, "summary": res.summary,
                    "outputs": [o.__dict__ for o in res.outputs]})
        return 0 if res.ok else 1
    print(res.summary)
    weights = f"random weights (seed {args.random_weights})" if args.random_weights is not None \
        else "the model's weights"
    print(f"{res.model} vs ONNX Runtime, {weights}, rtol {res.rtol:g}, atol {res.atol:g}:")
    for o in res.outputs:
        print(f"  {o.name} {list(o.shape)}: max abs error {o.max_abs:.3g}, "
              f"max rel error {o.max_rel:.3g}  {'ok' if o.ok else 'MISMATCH'}")
    print("PASS" if res.ok else "FAIL: outputs differ beyond tolerance")
    return 0 if res.ok else 1
