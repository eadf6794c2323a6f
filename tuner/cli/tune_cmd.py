"""``python -m tuner tune gemm --shape MxNxK``: search, record, report against NumPy."""
from __future__ import annotations

import shlex
import sys

from tuner.cli.common import (add_db_arg, add_threads_arg, add_workload_args, fmt_time,
                              open_store, print_json, threads_of, workload_of)


def register(sub) -> None:
    p = sub.add_parser("tune", help="tune a workload and record the results")
    add_workload_args(p)
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="with KIND 'model': the model (.onnx or IR text) whose tasks to tune")
    p.add_argument("--opt-level", "-O", type=int, default=2, choices=range(4), metavar="N",
                   help="tune model: graph pass pipeline (default 2, as build)")
    p.add_argument("--strategy", default="model", help="random | grid | tpe | model (default)")
    p.add_argument("--trials", type=int, default=64,
                   help="measured configs for this workload, resumed ones included (default 64)")
    p.add_argument("--timeout", type=float, default=None, help="stop searching after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    add_threads_arg(p)
    add_db_arg(p)
    p.add_argument("--template", default=None, help="template name (default: the kind's first)")
    p.add_argument("--batch-size", type=int, default=8, help="configs built in parallel per batch")
    p.add_argument("--early-stopping", type=int, default=None, metavar="N",
                   help="stop after N trials without a new best")
    p.add_argument("--repeat", type=int, default=7, help="timed samples per candidate")
    p.add_argument("--min-repeat-ms", type=float, default=40.0, help="minimum length of one sample")
    p.add_argument("--run-timeout", type=float, default=60.0, help="seconds before a run is TIMEOUT")
    p.add_argument("--build-timeout", type=float, default=120.0, help="seconds before a build is TIMEOUT")
    p.add_argument("--log", default="logs/tuning.jsonl",
                   help="append every recorded trial to this JSON-lines file (default "
                        "logs/tuning.jsonl; '' for none); `db import` reads it back")
    p.add_argument("--no-transfer", action="store_true",
                   help="model: do not pre-train on other workloads' records (for comparison)")
    p.add_argument("--optuna-storage", default="db", metavar="URL",
                   help="tpe: where the Optuna study lives: 'db' (the records database, "
                        "default; optuna-dashboard can open it), another URL, or 'memory'")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=run)


def _positive(name: str, value, allow_none: bool = False) -> None:
    from tuner.errors import UsageError

    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise UsageError(f"{name} must be positive, got {value}")


def run(args) -> int:
    from search_spaces import template_for
    from tuner.measure.measurer import MeasureOptions
    from tuner.target import host_target
    from tuner.tuning import TuneOptions, tune

    if args.kind == "model" or args.model is not None:
        from tuner.cli.tasks_cmd import tune_model_cmd

        return tune_model_cmd(args)
    workload = workload_of(args)
    threads = threads_of(args)
    for name in ("trials", "batch_size", "repeat", "min_repeat_ms", "run_timeout", "build_timeout"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    _positive("--timeout", args.timeout, allow_none=True)
    from tuner.errors import UsageError
    from tuner.search import STRATEGIES

    if args.strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {args.strategy!r}; choose one of {', '.join(STRATEGIES)}")
    template = template_for(workload, args.template)
    store = open_store(args)
    target = host_target()
    opts = TuneOptions(strategy=args.strategy, trials=args.trials, timeout=args.timeout,
                       seed=args.seed, threads=threads, batch_size=args.batch_size,
                       early_stopping=args.early_stopping, progress=not args.no_progress,
                       transfer=not args.no_transfer,
                       optuna_storage=None if args.optuna_storage == "memory" else args.optuna_storage,
                       log_path=args.log or None,
                       command=shlex.join(["python", "-m", "tuner", *sys.argv[1:]]))
    mopts = MeasureOptions(threads=threads, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                           run_timeout=args.run_timeout, build_timeout=args.build_timeout)
    space = template.space(workload, threads)
    n_valid = space.count_valid()
    if not args.json:
        print(f"workload : {workload}  ({workload.flops() / 1e9:.3f} GFLOP)")
        print(f"target   : {target.key}, {threads} thread(s)")
        print(f"template : {template.name} v{template.version}, {len(space.knobs)} knobs, "
              f"{space.size} points" + (f", {n_valid} valid" if n_valid is not None else ""))
        print(f"search   : {args.strategy}, {args.trials} trials, seed {args.seed}, db {store.url}")
    s = tune(workload, template, store, target, opts, mopts)
    report = {
        "run_id": s.run_id, "workload": s.workload_key, "target": s.target_key, "threads": s.threads,
        "measured": s.measured, "resumed": s.resumed, "statuses": dict(s.statuses),
        "stop_reason": s.stop_reason, "wall_time_s": round(s.wall_time, 2),
        "best": s.best.to_dict() if s.best else None,
        "numpy_median_s": s.baseline.median if s.baseline else None,
        "ratio_vs_numpy": s.ratio,
    }
    if args.json:
        print_json(report)
        return 0 if s.best else 1
    print(f"measured {s.measured} new configs ({s.resumed} resumed from the database) in "
          f"{s.wall_time:.1f} s; stopped: {s.stop_reason}")
    if s.phase_time:
        other = s.wall_time - sum(s.phase_time.values())
        print("time     : " + ", ".join(f"{k} {v:.1f} s" for k, v in s.phase_time.items())
              + f", search/db/other {other:.1f} s")
    print("statuses : " + (", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items())) or "none new"))
    if s.best is None:
        print("no config ran correctly; nothing to recommend (see `python -m tuner db history`)")
        return 1
    b = s.best
    base = s.baseline.median if s.baseline and s.baseline.samples else None
    print(f"best     : {b.config.to_json()}")
    print(f"           median {fmt_time(b.median)}, {workload.flops() / b.median / 1e9:.1f} GFLOPS "
          f"({b.measurements} measurements, slowest median counts)")
    if base:
        print(f"numpy    : median {fmt_time(base)}, {workload.flops() / base / 1e9:.1f} GFLOPS "
              f"({workload.baseline_name}, {threads} thread(s), same run)")
        print(f"ratio    : {s.ratio:.2f}x NumPy's speed (NumPy time / tuned time)")
    return 0
