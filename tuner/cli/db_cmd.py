"""``python -m tuner db list | best | history | export | import``: the records database."""
from __future__ import annotations

import sys

from tuner.cli.common import add_db_arg, fmt_time, open_store, print_json, print_table


def register(sub) -> None:
    p = sub.add_parser("db", help="query, export and import the tuning records")
    dsub = p.add_subparsers(dest="db_command", metavar="ACTION")
    dsub.required = True

    def action(name: str, help: str, fn):
        a = dsub.add_parser(name, help=help)
        add_db_arg(a)
        a.set_defaults(handler=fn)
        return a

    a = action("list", "workloads with trial counts and best GFLOPS", cmd_list)
    a.add_argument("--json", action="store_true")
    a = action("best", "best config per workload/target/threads (with target and versions)", cmd_best)
    _filters(a)
    a.add_argument("--json", action="store_true")
    a = action("history", "every trial of a workload, in order", cmd_history)
    _filters(a)
    a.add_argument("--status", help="only this status (OK, CRASH, ...)")
    a.add_argument("--limit", type=int, default=50, help="last N trials (0: all)")
    a.add_argument("--json", action="store_true")
    a = action("export", "write trials as JSON lines", cmd_export)
    _filters(a)
    a.add_argument("-o", "--output", default="-", help="file (default: stdout)")
    a = action("import", "read trials from JSON lines (all or nothing)", cmd_import)
    a.add_argument("file", help="JSON-lines file ('-' for stdin)")
    a = action("check", "verify the database's integrity and report problems", cmd_check)


def _filters(a) -> None:
    a.add_argument("--workload", help="workload key, or gemm shape MxNxK[:dtype]")
    a.add_argument("--target", help="target key (default: all)")
    a.add_argument("--threads", type=int, default=None)


def _workload_key(text: str | None) -> str | None:
    if text is None or ":" in text and text.split(":", 1)[1].startswith("{"):
        return text
    from workloads.gemm import Gemm

    shape, _, dtype = text.partition(":")
    return Gemm.parse(shape, dtype or "float32", check_memory=False).key


def cmd_list(args) -> int:
    rows = open_store(args, create=False).workloads_summary()
    if args.json:
        print_json(rows)
    else:
        print_table(rows, ["workload", "target", "threads", "trials", "ok", "failed", "best_gflops"])
    return 0


def cmd_best(args) -> int:
    store = open_store(args, create=False)
    bests = store.best_many(_workload_key(args.workload), args.target, args.threads)
    if args.json:
        print_json([b.to_dict() for b in bests])
        return 0
    rows = [{"workload": b.workload_key, "target": b.target_key, "threads": b.threads,
             "template": f"{b.template} v{b.template_version}", "median": fmt_time(b.median),
             "gflops": b.gflops, "n": b.measurements, "vs_default": _guard(b),
             "versions": " ".join(f"{k}={b.versions.get(k)}" for k in ("numba", "llvmlite", "numpy", "tuner")),
             "config": b.config.to_json()} for b in bests]
    print_table(rows, ["workload", "target", "threads", "template", "median", "gflops", "n",
                       "vs_default", "versions", "config"])
    return 0


def _guard(b) -> str:
    """The side-by-side check against the template's default: margin (default time / tuned
    time), noise, and whether dispatch applies the tuned config."""
    g = b.guard
    if not g:
        return "-"
    cold = f", cold {g['cold_margin']:.3f}" if "cold_margin" in g else ""   # operands evicted
    if g.get("best") != b.config.hash:   # the check of a config it outranks or ties
        if g["accepted"]:
            return f">{g['margin']:.3f} (ranks above a checked config; noise {g['noise']:.3f}{cold}, applied)"
        return f"~{g['margin']:.3f} (ties a checked config; noise {g['noise']:.3f}{cold}, default kept)"
    return f"{g['margin']:.3f} (noise {g['noise']:.3f}{cold}, {'applied' if g['accepted'] else 'default kept'})"


def cmd_history(args) -> int:
    from workloads.errors import UsageError

    if args.limit < 0:
        raise UsageError(f"--limit must be >= 0 (0: all), got {args.limit}")
    rows = open_store(args, create=False).trials(workload_key=_workload_key(args.workload),
                                   target_key=args.target, threads=args.threads, status=args.status)
    if args.limit:
        rows = rows[-args.limit:]
    if args.json:
        from tuner.db.jsonl import trial_to_dict

        print_json([trial_to_dict(r) for r in rows])
        return 0
    table = [{"id": r.id, "when": r.created_at.strftime("%Y-%m-%d %H:%M:%S"), "strategy": r.strategy,
              "status": r.status, "median": fmt_time(r.median), "gflops": r.gflops,
              "compile_s": r.compile_time, "config": r.config,
              "error": (r.error.splitlines() or [""])[0][:60]} for r in rows]
    print_table(table, ["id", "when", "strategy", "status", "median", "gflops", "compile_s",
                        "config", "error"])
    return 0


def cmd_export(args) -> int:
    from tuner.db.jsonl import export_jsonl

    store = open_store(args, create=False)
    filters = dict(workload_key=_workload_key(args.workload), target_key=args.target, threads=args.threads)
    if args.output == "-":
        n = export_jsonl(store, sys.stdout, **filters)
    else:
        with open(args.output, "w") as fh:
            n = export_jsonl(store, fh, **filters)
    print(f"exported {n} trials", file=sys.stderr)
    return 0


def cmd_import(args) -> int:
    from tuner.db.jsonl import import_jsonl
    from workloads.errors import UsageError

    store = open_store(args)
    try:
        fh = sys.stdin if args.file == "-" else open(args.file)
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    with fh:
        try:
            imported, skipped = import_jsonl(store, fh)
        except UnicodeDecodeError:
            raise UsageError(f"{args.file} is not UTF-8 text; nothing was imported") from None
    print(f"imported {imported} trials ({skipped} already present)")
    return 0


def cmd_check(args) -> int:
    from tuner.db.check import check

    store = open_store(args, create=False)
    problems, notes = check(store)
    for n in notes:
        print(f"note: {n}")
    for p in problems:
        print(f"problem: {p}")
    print(f"{store.url}: " + (f"{len(problems)} problem(s)" if problems else "ok"))
    return 1 if problems else 0
