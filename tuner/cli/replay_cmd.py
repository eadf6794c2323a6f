"""``python -m tuner replay TABLE``: compare search strategies on recorded measurements.

Nothing is compiled or timed: each strategy is run with seeds 0..N-1 against a recorded table
(``workloads/tables/*.jsonl.gz``; record more with ``python -m tuner.replay.record``), and the
medians over seeds of trials-to-90/95/99% of the table's best and of the area under the
best-so-far curve are printed.
"""
from __future__ import annotations

DEFAULT_SPECS = ("random", "grid", "tpe", "model", "model+transfer")


def register(sub) -> None:
    p = sub.add_parser("replay", help="replay recorded measurements to compare search strategies")
    p.add_argument("table", metavar="TABLE",
                   help="a table file or the name of a shipped one (e.g. gemm-256x256x256); "
                        "'list' lists the shipped tables")
    p.add_argument("--strategy", action="append", default=None, metavar="S",
                   help="strategy to replay (repeatable or comma-separated): a registered one "
                        "(random, grid, tpe, model), model-knobs (no domain features) or "
                        "model+transfer; default: " + ", ".join(DEFAULT_SPECS))
    p.add_argument("--seeds", type=int, default=20, help="seeds per strategy (default 20)")
    p.add_argument("--budget", type=int, default=None,
                   help="trials per replay (default: every recorded config)")
    p.add_argument("--batch-size", type=int, default=8, help="configs per ask (default 8)")
    p.add_argument("--auc-trials", type=int, default=100,
                   help="AUC is the mean best-so-far fraction over this many trials (default 100)")
    p.add_argument("--transfer-from", default=None, metavar="TABLES",
                   help="comma-separated tables model+transfer is pre-trained on "
                        "(default: every other shipped table of the same template and target)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw the median curves (matplotlib)")
    p.add_argument("--json", action="store_true", help="print {strategy: medians} as JSON")
    p.set_defaults(handler=run)


def _specs(args) -> list[str]:
    from workloads.errors import UsageError
    from tuner.replay.runner import PLAIN, TRANSFER
    from tuner.search import STRATEGIES

    specs = [s.strip() for arg in (args.strategy or [",".join(DEFAULT_SPECS)])
             for s in arg.split(",") if s.strip()]
    valid = [*STRATEGIES, PLAIN, TRANSFER]
    for s in specs:
        if s not in valid:
            raise UsageError(f"unknown strategy {s!r}; choose from {', '.join(valid)}")
    return list(dict.fromkeys(specs))


def run(args) -> int:
    from tuner.cli.common import print_json
    from workloads.errors import UsageError
    from tuner.replay.table import Table, shipped_tables

    if args.table == "list":
        for name in shipped_tables():
            t = Table.load(name)
            print(f"{name:28s} {t.space().size:5d} configs  best "
                  f"{t.flops / t.best_time / 1e9:6.1f} GFLOPS  {t.header['target']['key']}")
        return 0
    for name in ("seeds", "batch_size", "auc_trials"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.budget is not None and args.budget < 1:
        raise UsageError("--budget must be at least 1")
    specs = _specs(args)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'tuner[plot]'") from None
    table = Table.load(args.table)
    table.best_time  # noqa: B018 - a table without a success is a usage error, before any work
    names = args.transfer_from.split(",") if args.transfer_from else shipped_tables()
    # transfer learns from other workloads of the same template on the same target only
    transfer = [t for t in (Table.load(n) for n in names) if t.name != table.name
                and t.header["template"]["name"] == table.header["template"]["name"]
                and t.header["target"]["key"] == table.header["target"]["key"]]

    from tuner.replay.runner import replay

    results = replay(table, specs, seeds=args.seeds, budget=args.budget,
                     batch_size=args.batch_size, auc_trials=args.auc_trials, transfer_from=transfer)
    if args.plot:
        _plot(table, results, args.plot)
    if args.json:
        print_json({name: s.to_dict() for name, s in results.items()})
        return 0
    w = table.header["workload"]
    st = ", ".join(f"{k} {v}" for k, v in sorted(table.statuses().items()))
    size = table.space().size
    print(f"table    : {table.name}  ({w['key']}, template {table.header['template']['name']} "
          f"v{table.header['template']['version']})")
    print(f"recorded : {len(table.rows)} rows ({st}); {size} candidates; best "
          f"{table.flops / table.best_time / 1e9:.1f} GFLOPS on {table.header['target']['key']}")
    print(f"replay   : {args.seeds} seeds, batch {args.batch_size}, budget {args.budget or size}, "
          f"AUC over the first {min(args.auc_trials, args.budget or size)} trials"
          + (f"; transfer from {', '.join(t.name for t in transfer) or 'nothing'}"
             if "model+transfer" in specs else ""))
    print(f"{'strategy':16s} {'to 90%':>7s} {'to 95%':>7s} {'to 99%':>7s} {'AUC':>6s}   reached 99%")
    for name, s in results.items():
        d = s.to_dict()
        cells = [f"{d[k]:7.1f}" if d[k] is not None else f"{'>' + str(args.budget):>7s}"
                 for k in ("trials_to_90", "trials_to_95", "trials_to_99")]
        print(f"{name:16s} {' '.join(cells)} {d['auc']:6.3f}   {s.reached(0.99)}/{len(s.runs)}")
    print("(trials: medians over seeds; AUC: median mean best-so-far fraction of the table's best)")
    return 0


def _plot(table, results, path: str) -> None:
    import numpy as np

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(max(len(r.curve) for r in s.runs) for s in results.values())
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, s in results.items():
        curves = np.array([r.curve + [r.curve[-1] if r.curve else 0.0] * (n - len(r.curve))
                           for r in s.runs])
        x = np.arange(1, n + 1)
        ax.plot(x, np.median(curves, axis=0), label=name)
        ax.fill_between(x, np.percentile(curves, 25, axis=0), np.percentile(curves, 75, axis=0),
                        alpha=0.15)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("trials")
    ax.set_ylabel("best so far / table's best")
    ax.set_title(f"replay {table.name}: median and IQR over {len(next(iter(results.values())).runs)} seeds")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        from workloads.errors import UsageError

        raise UsageError(f"cannot write plot {path!r}: {exc}") from None
