"""``python -m tuner bench gemm | int8 | ladder | model | layers | tiles | cache | compare | report``: measured claims,
always beside a competitor in the same run."""
from __future__ import annotations

import os
import datetime as dt
import json
from pathlib import Path

from tuner.cli.common import add_db_arg, add_input_shape_args, open_store


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks against NumPy, measured in the same run")
    bsub = p.add_subparsers(dest="bench_command", metavar="BENCH")
    bsub.required = True

    g = bsub.add_parser("gemm", help="tuned GEMM vs NumPy over a list of shapes")
    g.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: the issue's list)")
    g.add_argument("--dtypes", default="float32,float64")
    g.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    g.add_argument("--no-dispatched", action="store_true",
                   help="skip timing tuner.gemm in a fresh ordinary process beside the worker")
    _common(g)
    g.set_defaults(handler=run_gemm)

    i8 = bsub.add_parser("int8", help="int8 GEMM vs ONNX Runtime MatMulInteger and our fp32 GEMM")
    i8.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: 1024^3 and three more)")
    i8.add_argument("--dtypes", default="int8,int8w7",
                    help="int8 (full-range weights) and/or int8w7 (weights in [-64, 64])")
    i8.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    i8.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds")
    _common(i8)
    i8.set_defaults(handler=run_int8, repeat=5)

    lad = bsub.add_parser("ladder", help="the optimisation ladder as points of the template space")
    lad.add_argument("--shape", default="1024x1024x1024")
    lad.add_argument("--dtype", default="float32")
    lad.add_argument("--threads", type=int, default=None, help="budget (default: all cores)")
    _common(lad)
    lad.set_defaults(handler=run_ladder)

    mb = bsub.add_parser("model", help="model latency: built (groups B-D) vs ONNX Runtime and the NumPy executor")
    mb.add_argument("model", metavar="MODEL", nargs="+",
                    help="one or more .onnx models (extra .[onnx]); several give one summary table")
    add_input_shape_args(mb)
    mb.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    mb.add_argument("--groups", default="ANBCD",
                    help="A ONNX Runtime, N NumPy executor, B no passes, C + passes, D + tuned, L + passes in NHWC (O3), M L + tuned, "
                         "E C + INT8, F D + INT8 (tuned int8 records), Q ONNX Runtime INT8")
    mb.add_argument("--calibration", type=int, default=16, metavar="N",
                    help="INT8 groups: seeded random calibration inputs (default 16)")
    mb.add_argument("--calib-method", default="minmax", choices=("minmax", "percentile", "entropy"))
    mb.add_argument("--agreement", type=int, default=200, metavar="N",
                    help="INT8 groups: seeded inputs for the top-1 agreement with FP32 (default 200)")
    mb.add_argument("--repeat", type=int, default=20, help="timed runs per contender")
    mb.add_argument("--rounds", type=int, default=10,
                    help="alternating passes over the contenders, each taking repeat/rounds "
                         "(at least 3) runs per contender (default 10)")
    mb.add_argument("--seed", type=int, default=0, help="random weights seed")
    mb.add_argument("--jobs", type=int, default=None, help="compile processes")
    add_db_arg(mb)
    mb.add_argument("--out", default=None, help="result JSON (default logs/bench-model-<time>.json)")
    mb.set_defaults(handler=run_model)

    ly = bsub.add_parser("layers", help="each kernel of a built model beside the ONNX Runtime "
                                        "nodes computing the same values (both profiled, same run)")
    ly.add_argument("model", metavar="MODEL", help=".onnx model (extra .[onnx])")
    add_input_shape_args(ly)
    ly.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ly.add_argument("--repeat", type=int, default=15, help="profiled runs per side (medians)")
    ly.add_argument("--top", type=int, default=20, help="rows printed, by our time minus ORT's")
    ly.add_argument("--seed", type=int, default=0, help="random weights seed")
    ly.add_argument("--opt-level", "-O", type=int, default=None, dest="opt_level",
                    help="graph pass pipeline (default: the build's)")
    ly.add_argument("--untuned", action="store_true", help="template defaults, no records")
    add_db_arg(ly)
    ly.add_argument("--out", default=None, help="result JSON (default logs/bench-layers-<time>.json)")
    ly.set_defaults(handler=run_layers)

    ti = bsub.add_parser("tiles", help="a model's heaviest tasks: the template default against config variants, "
                                        "in the tuning worker, both orders")
    ti.add_argument("model", metavar="MODEL", help="model file: .onnx (extra .[onnx]) or IR text")
    ti.add_argument("--variants", required=True,
                    help='JSON list of knob changes over each default, e.g. \'[{"mr": 6, "nr": 64}, {"tile_k": 256}]\'')
    ti.add_argument("--threads", type=int, default=1)
    ti.add_argument("--tasks", type=int, default=12, help="how many of the heaviest tasks (default 12)")
    ti.add_argument("--kind", default="conv2d", help="workload kind of the tasks (default conv2d)")
    ti.add_argument("--rows", type=int, default=None, metavar="M",
                    help="only tasks whose GEMM has M rows (e.g. 49: a 7 x 7 output)")
    ti.add_argument("--opt-level", "-O", type=int, default=None, metavar="N",
                    help="graph pass pipeline (default: the build's)")
    ti.add_argument("--cache-flush", action="store_true", help="evict the kernel's weights and other inputs but the first from the caches before each timed call, as a built model meets them (one call per sample; docs/measurement.md)")
    ti.add_argument("--out", default=None, help="result JSON (default logs/bench-tiles-<time>.json)")
    ti.set_defaults(handler=run_tiles)

    ca = bsub.add_parser("cache", help="each kernel of a built model: its time in the model against the "
                                        "tuning worker's stand-ins, back to back and with its operands flushed")
    ca.add_argument("model", metavar="MODEL", help="model file: .onnx (extra .[onnx], seeded random weights) or IR text")
    ca.add_argument("--threads", type=int, default=1)
    ca.add_argument("--kinds", default="conv2d,dense", help="workload kinds of the kernels (comma-separated)")
    ca.add_argument("--rounds", type=int, default=3, help="profiles of the model (the best median counts)")
    ca.add_argument("--opt-level", "-O", type=int, default=None, metavar="N",
                    help="graph pass pipeline (default: the build's)")
    add_db_arg(ca)
    ca.add_argument("--out", default=None, help="result JSON (default logs/bench-cache-<time>.json)")
    ca.set_defaults(handler=run_cache)

    pl = bsub.add_parser("placement", help="one GEMM's time on differently placed operands, beside NumPy's")
    pl.add_argument("--shape", default="1024x1024x1024")
    pl.add_argument("--dtype", default="float32")
    pl.add_argument("--configs", default="[{}]",
                    help="JSON list of config overrides over the 1-thread default (default: [{}])")
    pl.add_argument("--kernels", default="", help="comma-separated generated kernel files to time too (`show` output: its "
                         "'# called as:' line gives the runtime arguments)")
    pl.add_argument("--rounds", type=int, default=3)
    pl.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    pl.add_argument("--out", default=None, help="result JSON (default logs/bench-placement-<time>.json)")
    pl.set_defaults(handler=run_placement)

    c = bsub.add_parser("compare", help="the best configs of several tuning databases, re-measured side by side")
    c.add_argument("--shape", default="1024x1024x1024")
    c.add_argument("--dtype", default="float32")
    c.add_argument("--dbs", required=True, help="comma-separated SQLAlchemy URLs (or SQLite file paths)")
    c.add_argument("--threads", type=int, default=None, help="thread count of the records (default: all cores)")
    c.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds")
    c.add_argument("--repeat", type=int, default=7)
    c.add_argument("--min-repeat-ms", type=float, default=50.0)
    c.add_argument("--out", default=None, help="result JSON (default logs/bench-compare-<time>.json)")
    c.set_defaults(handler=run_compare)

    r = bsub.add_parser("report", help="print the markdown table of a result file")
    r.add_argument("file")
    r.set_defaults(handler=run_report)


def _common(p) -> None:
    add_db_arg(p)
    p.add_argument("--tune-trials", type=int, default=0,
                   help="tune shapes that have no record with this many trials first (0: use fallback)")
    p.add_argument("--strategy", default="model")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--min-repeat-ms", type=float, default=50.0)
    p.add_argument("--placements", type=int, default=4,
                   help="buffer placements each measurement rotates over (score: the slowest)")
    p.add_argument("--out", default=None, help="result JSON (default logs/bench-<kind>-<time>.json; CSV beside it)")


def _ints(text: str, name: str) -> list[int]:
    from workloads.errors import UsageError

    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise UsageError(f"{name} must be positive integers, got {text!r}")
    return vals


def _out(args, kind: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(args.out or f"logs/bench-{kind}-{stamp}.json")


def _save_json(args, kind: str, data: dict, table: str) -> int:
    """Write a result as JSON (``--out`` or logs/bench-<kind>-<time>.json), print its table."""
    path = _out(args, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))
    print()
    print(table)
    print(f"\nwrote {path}")
    return 0


def _check_tune_trials(args) -> None:
    from workloads.errors import UsageError

    if getattr(args, "tune_trials", 0) < 0:
        raise UsageError(f"--tune-trials must be >= 0 (0: no tuning), got {args.tune_trials}")


def _mopts(args):
    from tuner.measure.measurer import MeasureOptions

    from workloads.errors import UsageError

    placements = getattr(args, "placements", MeasureOptions.placements)   # compare: default
    if placements < 1:
        raise UsageError(f"--placements must be >= 1, got {placements}")
    _check_tune_trials(args)
    return MeasureOptions(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, max_time_s=10.0,
                          placements=placements)


def run_gemm(args) -> int:
    from tuner.bench.gemm_bench import DEFAULT_SHAPES, bench_gemm, table_markdown, write_results
    from workloads.errors import UsageError
    from tuner.target import usable_cores
    from workloads.gemm import Gemm

    shapes = args.shapes.split(",") if args.shapes else DEFAULT_SHAPES
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for s in shapes:
        for d in dtypes:
            Gemm.parse(s, d)  # every bad shape or dtype is reported before any work
    threads = _ints(args.threads, "--threads")
    if max(threads) > usable_cores():
        raise UsageError(f"--threads {max(threads)}: this machine allows 1..{usable_cores()}")
    data = bench_gemm(shapes, dtypes, threads, open_store(args), args.tune_trials, args.strategy,
                      _mopts(args), dispatched=not args.no_dispatched)
    path, csv_path = write_results(data, _out(args, "gemm"))
    print()
    print(table_markdown(data))
    print(f"\nwrote {path} and {csv_path}")
    return 0


def _thread_list(args) -> list[int]:
    """``--threads`` as a list of counts, each within this machine's cores (the model benches)."""
    from tuner.target import usable_cores
    from workloads.errors import UsageError

    threads = _ints(args.threads, "--threads")
    if max(threads) > usable_cores():
        raise UsageError(f"--threads {max(threads)}: this machine allows 1..{usable_cores()}")
    return threads


def _check_onnx(model: str, command: str) -> None:
    """A model compared with ONNX Runtime: an existing .onnx file."""
    from workloads.errors import UsageError

    if not model.endswith(".onnx"):
        raise UsageError(f"{command} compares with ONNX Runtime: give an .onnx model, not {model}")
    if not os.path.isfile(model):
        raise UsageError(f"no such model file: {model}")


def _check_threads_and_level(args) -> None:
    """``--threads N`` within this machine's cores, ``--opt-level`` 0..3 (the per-model benches)."""
    from tuner.target import usable_cores
    from workloads.errors import UsageError

    if not 1 <= args.threads <= usable_cores():
        raise UsageError(f"--threads {args.threads}: this machine allows 1..{usable_cores()}")
    if args.opt_level is not None and not 0 <= args.opt_level <= 3:
        raise UsageError(f"--opt-level must be 0..3, got {args.opt_level}")


def run_cache(args) -> int:
    import importlib.util

    from tuner.bench.cache_state import bench_cache, cache_markdown
    from workloads.errors import UsageError

    if args.model.endswith(".onnx") and not importlib.util.find_spec("onnx"):
        raise UsageError("bench cache on an ONNX model needs the extra: pip install -e '.[onnx]'")
    if not Path(args.model).is_file():
        raise UsageError(f"no such model file: {args.model}")
    _check_threads_and_level(args)
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not kinds:
        raise UsageError("--kinds must name at least one workload kind, e.g. conv2d,dense")
    data = bench_cache(args.model, threads=args.threads, opt_level=args.opt_level, kinds=kinds,
                       rounds=args.rounds, db=args.db, log=lambda line: None)
    return _save_json(args, "cache", data, cache_markdown(data))


def run_placement(args) -> int:
    from tuner.bench.placement_bench import bench_placement, contenders, placement_markdown
    from workloads.errors import UsageError
    from workloads.gemm import Gemm

    w = Gemm.parse(args.shape, args.dtype)
    try:
        configs = json.loads(args.configs)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--configs must be a JSON list of objects: {exc}") from None
    if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
        raise UsageError("--configs must be a JSON list of objects, e.g. '[{}, {\"mr\": 4}]'")
    kernels = [k for k in args.kernels.split(",") if k]
    for k in kernels:
        if not Path(k).is_file():
            raise UsageError(f"--kernels: no such file {k}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    data = bench_placement(w, contenders(w, configs, kernels), rounds=args.rounds, clock=args.clock)
    return _save_json(args, "placement", data, placement_markdown(data))


def run_int8(args) -> int:
    import importlib.util

    from workloads.errors import UsageError
    from tuner.target import usable_cores
    from workloads.gemm import INT8_DTYPES, Gemm

    if not all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime")):
        raise UsageError("bench int8 compares with ONNX Runtime: pip install -e '.[onnx]'")
    from tuner.bench.int8_bench import DEFAULT_SHAPES, bench_int8, table_markdown

    shapes = [s.strip() for s in args.shapes.split(",")] if args.shapes else DEFAULT_SHAPES
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in INT8_DTYPES]
    if bad or not dtypes:
        raise UsageError(f"--dtypes must be among {', '.join(INT8_DTYPES)}, got {args.dtypes!r}")
    for s in shapes:
        for d in dtypes:
            Gemm.parse(s, d)  # every bad shape is reported before any work
    threads = _ints(args.threads, "--threads")
    if max(threads) > usable_cores():
        raise UsageError(f"--threads {max(threads)}: this machine allows 1..{usable_cores()}")
    if args.rounds < 1 or args.repeat < 1:
        raise UsageError("--rounds and --repeat must be >= 1")
    _check_tune_trials(args)
    data = bench_int8(shapes, dtypes, threads, open_store(args), args.tune_trials, args.strategy,
                      args.rounds, args.repeat, args.min_repeat_ms)
    return _save_json(args, "int8", data, table_markdown(data))


def run_ladder(args) -> int:
    from tuner.bench.ladder import bench_ladder, ladder_markdown
    from tuner.cli.common import threads_of
    from workloads.gemm import Gemm

    w = Gemm.parse(args.shape, args.dtype)
    data = bench_ladder(w, open_store(args), threads_of(args), args.tune_trials, args.strategy, _mopts(args))
    return _save_json(args, "ladder", data, ladder_markdown(data))


def run_model(args) -> int:
    from tuner.cli.common import input_shapes
    from tuner.bench.model_bench import GROUPS, bench_model, models_markdown, table_markdown, write_results
    from workloads.errors import UsageError

    threads = _thread_list(args)
    if not args.groups or set(args.groups) - set(GROUPS):
        raise UsageError(f"--groups must be letters of {''.join(GROUPS)}, got {args.groups!r}")
    if args.calibration < 1 or args.agreement < 1:
        raise UsageError("--calibration and --agreement must be >= 1")
    if args.repeat < 3:
        raise UsageError(f"--repeat must be >= 3, got {args.repeat}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    for model in args.model:
        _check_onnx(model, "bench model")
    results = [bench_model(model, threads, groups=args.groups, seed=args.seed, repeat=args.repeat,
                           rounds=args.rounds,
                           db=args.db, jobs=args.jobs, calibration=args.calibration,
                           agreement=args.agreement, calib_method=args.calib_method,
                           shapes=input_shapes(args).get("shapes"))
               for model in args.model]
    data = results[0] if len(results) == 1 else {"kind": "bench-models", "models": results}
    path = write_results(data, _out(args, "model"))
    for d in results:
        print(f"\n{d['name']}:")
        print(table_markdown(d))
    if len(results) > 1:
        print("\n" + models_markdown(results))
    print(f"\nwrote {path}")
    return 0


def run_layers(args) -> int:
    from tuner.cli.common import input_shapes
    from tuner.bench.layer_compare import compare_layers, layers_markdown
    from tuner.bench.model_bench import write_results
    from workloads.errors import UsageError

    threads = _thread_list(args)
    _check_onnx(args.model, "bench layers")
    if args.repeat < 3 or args.top < 1:
        raise UsageError(f"--repeat must be >= 3 and --top >= 1, got {args.repeat} and {args.top}")
    if args.opt_level is not None and args.opt_level not in (0, 1, 2, 3):
        raise UsageError(f"-O must be 0..3, got {args.opt_level}")
    data = compare_layers(args.model, threads, seed=args.seed, repeat=args.repeat,
                          opt_level=args.opt_level, tuned=not args.untuned, db=args.db,
                          shapes=input_shapes(args).get("shapes"))
    path = write_results(data, _out(args, "layers"))
    print(layers_markdown(data, args.top))
    print(f"\nwrote {path}")
    return 0


def run_tiles(args) -> int:
    from tuner.bench.tile_ab import bench_tiles, parse_variants, tiles_markdown
    from tuner.frontend import load_model
    from workloads.errors import UsageError

    variants = parse_variants(args.variants)
    _check_threads_and_level(args)
    if args.tasks < 1:
        raise UsageError(f"--tasks must be >= 1, got {args.tasks}")
    if args.rows is not None and args.rows < 1:
        raise UsageError(f"--rows must be >= 1, got {args.rows}")
    graph = load_model(args.model)
    data = bench_tiles(graph, variants, threads=args.threads, tasks=args.tasks, kind=args.kind,
                       rows=args.rows, opt_level=args.opt_level, cache_flush=args.cache_flush,
                       log=lambda line: print(line, flush=True))
    return _save_json(args, "tiles", data, tiles_markdown(data))


def run_compare(args) -> int:
    from tuner.bench.compare import bench_compare, compare_markdown
    from tuner.cli.common import threads_of
    from workloads.errors import UsageError
    from workloads.gemm import Gemm

    w = Gemm.parse(args.shape, args.dtype)
    dbs = [d.strip() for d in args.dbs.split(",") if d.strip()]
    if not dbs:
        raise UsageError("--dbs needs at least one database")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    dbs = [d if "://" in d else f"sqlite:///{Path(d).resolve()}" for d in dbs]
    for d in dbs:
        if d.startswith("sqlite:///") and not Path(d[len("sqlite:///"):]).is_file():
            raise UsageError(f"no such database file: {d[len('sqlite:///'):]}")
    data = bench_compare(w, dbs, threads_of(args), args.rounds, _mopts(args))
    return _save_json(args, "compare", data, compare_markdown(data))


def run_report(args) -> int:
    from tuner.bench.gemm_bench import table_markdown
    from tuner.bench.ladder import ladder_markdown
    from workloads.errors import UsageError

    try:
        data = json.loads(Path(args.file).read_text())
        kind = data["kind"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{args.file} is not a bench result file ({exc})") from None
    if kind in ("bench-model", "bench-models"):
        from tuner.bench.model_bench import models_markdown
        from tuner.bench.model_bench import table_markdown as model_markdown

        results = data["models"] if kind == "bench-models" else [data]
        for d in results:
            print(f"{d['name']}:\n{model_markdown(d)}\n")
        if len(results) > 1:
            print(models_markdown(results))
        return 0
    if kind == "bench-int8":
        from tuner.bench.int8_bench import table_markdown as int8_markdown

        print(int8_markdown(data))
        return 0
    if kind == "bench-tiles":
        from tuner.bench.tile_ab import tiles_markdown

        print(tiles_markdown(data))
        return 0
    if kind == "bench-cache":
        from tuner.bench.cache_state import cache_markdown

        print(cache_markdown(data))
        return 0
    if kind == "bench-compare":
        from tuner.bench.compare import compare_markdown

        print(compare_markdown(data))
        return 0
    print(ladder_markdown(data) if kind == "bench-ladder" else table_markdown(data))
    return 0
