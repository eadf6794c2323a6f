"""``python -m tuner run gemm --shape S``: run the dispatched kernel, check it, time it."""
from __future__ import annotations

from tuner.cli.common import (add_db_arg, add_threads_arg, add_workload_args, fmt_time,
                              open_store, print_json, threads_of, workload_of)


def register(sub) -> None:
    p = sub.add_parser("run", help="run a workload with its best recorded config (or the fallback)")
    add_workload_args(p)
    add_threads_arg(p)
    add_db_arg(p)
    p.add_argument("--strict", action="store_true", help="fail instead of using a fallback config")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--min-repeat-ms", type=float, default=40.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args) -> int:
    import numba
    from threadpoolctl import threadpool_limits

    from search_spaces import template_for
    from tuner.dispatch import load_kernel, select_config
    from workloads.errors import TunerError
    from tuner.measure.result import summarize
    from tuner.measure.worker import time_callable
    from tuner.target import host_target

    workload = workload_of(args)
    threads = threads_of(args)
    template = template_for(workload)
    target = host_target()
    sel = select_config(workload, template, open_store(args), target, threads, strict=args.strict)
    fn = load_kernel(workload, template, sel.config)
    numba.set_num_threads(min(template.threads(sel.config), numba.config.NUMBA_NUM_THREADS))
    inputs, outputs = workload.make_inputs(), workload.make_outputs()
    fn(*inputs, *outputs)
    problem = workload.check(inputs, outputs, workload.reference(inputs))
    if problem:
        raise TunerError(f"kernel for {workload} gave a wrong answer: {problem}")
    samples, _ = time_callable(lambda: fn(*inputs, *outputs), 1, args.repeat, args.min_repeat_ms, 10.0)
    out = workload.make_outputs()[0]
    with threadpool_limits(limits=threads, user_api="blas"):
        base, _ = time_callable(lambda: workload.baseline(inputs, [out]), 1, args.repeat, args.min_repeat_ms, 10.0)
    st, bst = summarize(samples), summarize(base)
    gflops = workload.flops() / st["median"] / 1e9
    report = {"workload": workload.key, "target": target.key, "threads": threads,
              "config_source": sel.source, "config": dict(sel.config), "median_s": st["median"],
              "iqr_s": st["iqr"], "gflops": gflops, "numpy_median_s": bst["median"],
              "ratio_vs_numpy": bst["median"] / st["median"], "note": sel.note}
    if args.json:
        print_json(report)
        return 0
    print(f"{workload} on {target.key}, {threads} thread(s)")
    print(f"config   : {sel.source} {sel.config.to_json()}")
    print(f"kernel   : median {fmt_time(st['median'])} (IQR {fmt_time(st['iqr'])}), {gflops:.1f} GFLOPS, correct")
    print(f"numpy    : median {fmt_time(bst['median'])}, "
          f"{workload.flops() / bst['median'] / 1e9:.1f} GFLOPS; ratio {report['ratio_vs_numpy']:.2f}x")
    return 0
