"""``python -m tuner tune gemm --shape MxNxK``: search, record, report against NumPy."""
from __future__ import annotations

import shlex
import sys

from tuner.cli.common import (add_db_arg, add_input_shape_args, add_threads_arg,
                              add_workload_args, fmt_time, print_json, threads_of, workload_of)


def register(sub) -> None:
    p = sub.add_parser("tune", help="tune a workload and record the results")
    add_workload_args(p)
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="with KIND 'model': the model (.onnx or IR text) whose tasks to tune")
    add_input_shape_args(p)
    p.add_argument("--opt-level", "-O", type=int, default=None, choices=range(4), metavar="N",
                   help="tune model: graph pass pipeline (default as build: 3, 2 with "
                        "--int8)")
    p.add_argument("--strategy", default="model", help="random | grid | tpe | model (default)")
    p.add_argument("--trials", type=int, default=64,
                   help="measured configs for this workload, resumed ones included (default 64)")
    p.add_argument("--timeout", type=float, default=None, help="stop searching after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    add_threads_arg(p)
    add_db_arg(p)
    p.add_argument("--template", default=None, help="template name (default: the kind's first)")
    p.add_argument("--batch-size", type=int, default=8, help="configs built in parallel per batch")
    p.add_argument("--max-new-variants", type=int, default=2, metavar="N",
                   help="model search: at most N configs of a batch need a kernel not compiled "
                        "yet, the rest vary the cache blocks of compiled ones (default 2, was 4 "
                        "before 2026-12-01; 0: no cap)")
    p.add_argument("--trials-per-variant", type=int, default=8, metavar="N",
                   help="model search: at most trials/N distinct kernels compiled in a run, "
                        "the default config's included (default 8: 8 kernels for 64 trials; "
                        "before 2026-12-01 no such limit; 0: no limit)")
    p.add_argument("--early-stopping", type=int, default=None, metavar="N",
                   help="stop after N trials without a new best")
    p.add_argument("--repeat", type=int, default=7, help="timed samples per candidate")
    p.add_argument("--min-repeat-ms", type=float, default=40.0, help="minimum length of one sample")
    p.add_argument("--placements", type=int, default=4,
                   help="buffer placements each candidate is timed on (score: the slowest)")
    p.add_argument("--cache-flush", action="store_true", help="evict the kernel's weights and other inputs but the first from the caches before each timed call, as a built model meets them (one call per sample; docs/measurement.md)")
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
    p.add_argument("--no-end-to-end", action="store_true",
                   help="tune model: skip building the model with defaults and with the records "
                        "and timing both at the end")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    from tuner.cli.build_cmd import add_int8_args
    add_int8_args(p)   # tune model --int8: the tasks of the quantized graph
    p.add_argument("--random-weights", type=int, default=None, metavar="SEED",
                   help="tune model --int8 on an .onnx model: calibrate it with seeded random "
                        "weights (as verify and bench model do), so the zero points match theirs")
    p.set_defaults(handler=run)


def run(args) -> int:
    from tuner.api import tune

    if args.kind == "model" or args.model is not None:
        from tuner.cli.tasks_cmd import tune_model_cmd

        return tune_model_cmd(args)
    if args.int8 or args.random_weights is not None or args.input_shape:
        from workloads.errors import UsageError
        raise UsageError("--int8, --random-weights and --input-shape apply to tune model (a "
                         "GEMM's int8 form is --dtype int8 or int8w7)")
    workload = workload_of(args)
    threads = threads_of(args)
    r = tune(workload, trials=args.trials, strategy=args.strategy, threads=threads,
             template=args.template, db=args.db, seed=args.seed, timeout=args.timeout,
             early_stopping=args.early_stopping, batch_size=args.batch_size, repeat=args.repeat,
             min_repeat_ms=args.min_repeat_ms, run_timeout=args.run_timeout,
             build_timeout=args.build_timeout, placements=args.placements,
             cache_flush=args.cache_flush,
             transfer=not args.no_transfer,
             max_new_variants=args.max_new_variants or None,
             trials_per_variant=args.trials_per_variant or None,
             optuna_storage=None if args.optuna_storage == "memory" else args.optuna_storage,
             log=args.log or None, progress=not args.no_progress,
             command=shlex.join(["python", "-m", "tuner", *sys.argv[1:]]),
             echo=None if args.json else print)
    report = {
        "run_id": r.run_id, "workload": workload.key, "target": _target_key(), "threads": threads,
        "measured": r.measured, "resumed": r.resumed, "statuses": r.statuses,
        "stop_reason": r.stop_reason, "wall_time_s": round(r.wall_time, 2),
        "best": r.best.to_dict() if r.best else None,
        "numpy_median_s": r.baseline_median, "ratio_vs_numpy": r.ratio,
    }
    s = r.summary
    report["kernels_compiled"], report["configs_run"] = s.compiled, s.runs
    if args.json:
        print_json(report)
        return 0 if s.best else 1
    print(f"measured {s.measured} new configs ({s.resumed} resumed from the database) in "
          f"{s.wall_time:.1f} s; stopped: {s.stop_reason}")
    if s.phase_time:
        other = s.wall_time - sum(s.phase_time.values())
        print("time     : " + ", ".join(f"{k} {v:.1f} s" for k, v in s.phase_time.items())
              + f", search/db/other {other:.1f} s")
    if s.runs:
        print(f"kernels  : {s.compiled} compiled for {s.runs} configs run (configs differing only "
              "in runtime knobs share one)")
    print("statuses : " + (", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items())) or "none new"))
    if s.best is None:
        print("no config ran correctly; nothing to recommend (see `python -m tuner db history`)")
        return 1
    b = s.best
    base = s.baseline.median if s.baseline and s.baseline.samples else None
    print(f"best     : {b.config.to_json()}")
    print(f"           median {fmt_time(b.median)}, {workload.flops() / b.median / 1e9:.1f} GFLOPS "
          f"({b.measurements} measurements, slowest median counts)")
    g = b.guard
    if g:
        verdict = ("the tuned config is applied" if g["accepted"]
                   else "within noise: dispatch keeps the template's default")
        whose = ("" if g.get("best") == b.config.hash else
                 " of a config the best outranks" if g["accepted"] else " of a config the best ties")
        print(f"default  : margin{whose} {g['margin']:.3f} (default time / its time, side by side; "
              f"noise {g['noise']:.3f}): {verdict}")
    if base:
        print(f"numpy    : median {fmt_time(base)}, {workload.flops() / base / 1e9:.1f} GFLOPS "
              f"({workload.baseline_name}, {threads} thread(s), same run)")
        print(f"ratio    : {s.ratio:.2f}x NumPy's speed (NumPy time / tuned time)")
    return 0


def _target_key() -> str:
    from tuner.target import host_target

    return host_target().key
