"""``python -m tuner tasks MODEL``: the fused subgraphs of a model as workloads to tune.

One row per distinct workload (equal groups merged): kind, what it computes, occurrences,
GFLOP per call, time per call (the best record's median, or an estimate) and its estimated
share of the model's run time, and whether the records database has a config for it on this
target and thread count. The same pass pipeline as ``build`` (``--opt-level``, default as build) makes
the groups, so the keys are the ones the builder looks up.
"""
from __future__ import annotations

from tuner import settings


def register(sub) -> None:
    from tuner.cli.common import add_db_arg, add_input_shape_args, add_threads_arg

    p = sub.add_parser("tasks", help="list a model's fused subgraphs as workloads (tuning tasks)")
    p.add_argument("model", metavar="MODEL", help="model file: .onnx or IR text")
    add_input_shape_args(p)
    p.add_argument("--opt-level", "-O", type=int, default=None, choices=range(4), metavar="N",
                   help="graph pass pipeline 0..3 (default as build: 3, 2 with --int8)")
    add_threads_arg(p)
    add_db_arg(p)
    p.add_argument("--keys", action="store_true", help="print each task's workload key")
    p.add_argument("--json", action="store_true", help="print the tasks as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    from tuner.cli.common import model_graph, open_store, print_json, threads_of
    from tuner.target import host_target
    from tuner.tasks import extract_tasks, shares

    from tuner.compiler.compile_model import default_opt_level

    threads = threads_of(args)
    store, target = open_store(args), host_target()
    graph = model_graph(args)
    args.opt_level = default_opt_level(graph, args.opt_level)
    tasks = extract_tasks(graph, opt_level=args.opt_level, store=store,
                          target=target, threads=threads)
    share = shares(tasks)
    rows = [{"task": i, "kind": t.workload.kind, "workload": t.workload.summary(),
             "occurrences": t.occurrences, "gflop": t.workload.flops() / 1e9,
             "time_ms": t.time * 1e3, "time_source": t.time_source, "share": s,
             "tuned": t.tuned, "template": t.template, "key": t.key, "groups": t.groups}
            for i, (t, s) in enumerate(zip(tasks, share))]
    if args.json:
        print_json({"model": args.model, "target": target.key, "threads": threads,
                    "opt_level": args.opt_level, "tasks": rows})
        return 0
    print(f"{args.model}: {len(tasks)} tasks from {sum(t.occurrences for t in tasks)} kernels "
          f"(opt level {args.opt_level}, target {target.key}, {threads} thread(s))")
    print(f"{'#':>3} {'kind':9} {'workload':44} {'in':>22} {'occ':>4} {'GFLOP':>7} "
          f"{'ms/call':>8} {'share':>6}  db")
    for r, t in zip(rows, tasks):
        shape = "x".join(map(str, t.workload.input_specs()[0][0]))
        src = "" if r["time_source"] == "record" else "~"
        print(f"{r['task']:>3} {r['kind']:9} {r['workload'][:44]:44} {shape[:22]:>22} "
              f"{r['occurrences']:>4} {r['gflop']:>7.3f} {src + format(r['time_ms'], '.3f'):>8} "
              f"{r['share'] * 100:>5.1f}%  {'tuned' if r['tuned'] else '-'}")
        if args.keys:
            print(f"      {r['key']}")
    total = sum(t.weight for t in tasks)
    print(f"estimated latency {total * 1e3:.2f} ms ('~' = estimate at nominal rates, else the "
          f"best record); {sum(t.tuned for t in tasks)} of {len(tasks)} tasks tuned")
    return 0


def int8_graph(args, int8):
    """The quantized graph of ``args.model`` a ``build --int8`` of the same options compiles."""
    from tuner.cli.common import model_graph
    from tuner.quant.flow import quantize_for_build

    graph = model_graph(args, seed=getattr(args, "random_weights", None))
    return quantize_for_build(graph, int8, args.db).quantized.graph


def tune_model_cmd(args) -> int:
    """``python -m tuner tune model MODEL --trials N``: every task of the model, one store."""
    import shlex
    import sys

    from tuner.cli.common import model_graph, open_store, print_json, threads_of
    from workloads.errors import UsageError
    from tuner.measure.measurer import MeasureOptions
    from tuner.search import STRATEGIES
    from tuner.target import host_target
    from tuner.tasks import tune_model

    if args.kind != "model" or not args.model:
        raise UsageError("usage: python -m tuner tune model MODEL.onnx --trials N "
                         f"(got kind {args.kind!r}, model {args.model!r})")
    if args.trials is None or args.trials < 1:
        raise UsageError(f"--trials must be positive, got {args.trials}")
    if args.strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {args.strategy!r}; choose one of {', '.join(STRATEGIES)}")
    threads = threads_of(args)
    store, target = open_store(args), host_target()
    mopts = MeasureOptions(threads=threads, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                           placements=getattr(args, "placements", 4),
                           cache_flush=getattr(args, "cache_flush", False),
                           run_timeout=args.run_timeout, build_timeout=args.build_timeout)
    echo = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    args.opt_level = settings.opt_level(args.opt_level, bool(getattr(args, "int8", False)))
    if not args.json:
        print(f"model    : {args.model} (opt level {args.opt_level})")
        print(f"target   : {target.key}, {threads} thread(s); db {store.url}")
        print(f"budget   : {args.trials} trials over the model's tasks, strategy {args.strategy}")
    from tuner.cli.build_cmd import int8_options
    int8 = int8_options(args)
    graph = model_graph(args) if args.input_shape else args.model   # a path: named so in the report
    if int8 is not None:
        graph = int8_graph(args, int8)
        if not args.json:
            print(f"int8     : tasks of the quantized graph (calibration {int8.method} on "
                  f"{int8.calibration}{'' if args.random_weights is None else f', random weights {args.random_weights}'})")
    elif getattr(args, "random_weights", None) is not None:
        raise UsageError("--random-weights only applies with --int8 (float tasks do not depend on weights)")
    report = tune_model(graph, trials=args.trials, store=store, target=target,
                        threads=threads, opt_level=args.opt_level, strategy=args.strategy,
                        round_size=args.batch_size, seed=args.seed, measure_opts=mopts,
                        progress=False, log_path=args.log or None,
                        command=shlex.join(["python", "-m", "tuner", *sys.argv[1:]]), echo=echo,
                        end_to_end=not args.no_end_to_end)
    if args.json:
        print_json(report)
        return 0
    print(f"\n{'#':>3} {'kind':9} {'workload':40} {'occ':>4} {'trials':>6} {'before ms':>10} "
          f"{'after ms':>9} before is")
    for r in report["tasks"]:
        print(f"{r['task']:>3} {r['kind']:9} {r['workload'][:40]:40} {r['occurrences']:>4} "
              f"{r['trials']:>6} {r['time_before_ms']:>10.3f} {r['time_after_ms']:>9.3f} "
              f"{r['time_source']}")
    print(f"spent {report['spent']} of {report['budget']} trials in {report['wall_time_s']:.0f} s; "
          f"estimated latency {report['estimated_latency_before_ms']:.2f} ms -> "
          f"{report['estimated_latency_after_ms']:.2f} ms (sum of per-task times x occurrences; "
          "before: each task's record or its measured default config; tasks the budget did not "
          "reach at their nominal estimate)")
    e = report.get("end_to_end")
    if e:
        c = e["tuned_counts"]
        verdict = ("within the spread: no measurable change" if abs(e["speedup"] - 1) <= e["spread"]
                   else ("faster" if e["speedup"] > 1 else "SLOWER"))
        print(f"measured end to end ({threads} thread(s), {sum(e['samples'].values())} runs in "
              f"{e['rounds']} alternating rounds): defaults {e['defaults']['p50_ms']:.2f} ms, "
              f"tuned {e['tuned']['p50_ms']:.2f} ms ({c.get('tuned', 0)} tuned kernels): "
              f"{e['speedup']:.3f}x, spread {100 * e['spread']:.1f}% -> {verdict}")
    return 0
