"""``bench ladder``: REFERENCE.md's GEMM optimisation ladder as points of the template space.

Each step (naive, blocking, vectorization, loop permutation, packing, write cache, parallel)
is a config of the same GEMM template (``GemmTemplate.ladder``); "tuned" is the best record
for this target (tuned first with ``tune_trials`` when missing). Every step is measured beside
NumPy with the same thread count, in one run, by the same pinned worker.
"""
from __future__ import annotations

import datetime as dt

from search_spaces import template_for
from tuner.bench.gemm_bench import side_by_side
from tuner.dispatch import select_config
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.measure.result import summarize
from tuner.target import host_target
from tuner.tuning import TuneOptions, tune


def bench_ladder(workload, store, threads: int, tune_trials: int = 0, strategy: str = "model",
                 measure: MeasureOptions | None = None, log=print) -> dict:
    target = host_target()
    template = template_for(workload, "gemm")   # the ladder is the float template's
    steps = list(template.ladder(workload))
    mopts = MeasureOptions(**{**(measure.__dict__ if measure else {}), "threads": threads})
    rows = []
    with Measurer(mopts) as m:
        sel = select_config(workload, template, store, target, threads, quiet=True)
        if sel.source == "fallback" and tune_trials > 0:
            log(f"tuning {workload} with {threads} thread(s), {tune_trials} trials ...")
            tune(workload, template, store, target,
                 TuneOptions(strategy=strategy, trials=tune_trials, threads=threads, progress=False),
                 mopts, measurer=m)
            sel = select_config(workload, template, store, target, threads, quiet=True)
        steps.append((f"tuned ({sel.source})", sel.config))
        for name, cfg in steps:
            t = template.threads(cfg)
            if t > threads:
                rows.append({"step": name, "config": dict(cfg), "status": "SKIPPED",
                             "error": f"needs {t} threads, budget {threads}"})
                log(f"{name:24s} skipped: needs {t} threads")
                continue
            res, ks, _ = side_by_side(m, workload, template, cfg, rounds=1)
            ns = m.baseline(workload, t).samples if ks else []
            row = {"step": name, "config": dict(cfg), "threads": t, "status": res.status.value,
                   "error": res.error}
            if ks and ns:
                k, n = summarize(ks), summarize(ns)
                row.update(kernel_median_s=k["median"], numpy_median_s=n["median"],
                           kernel_gflops=workload.flops() / k["median"] / 1e9,
                           ratio=n["median"] / k["median"])
                log(f"{name:24s} {t}t  {k['median']:9.4f} s  {row['kernel_gflops']:7.1f} GFLOPS   "
                    f"numpy {n['median']:8.4f} s   ratio {row['ratio']:.3f}")
            else:
                log(f"{name:24s} {res.status.value}: {res.error[:100]}")
            rows.append(row)
    return {"kind": "bench-ladder", "workload": workload.key,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "target": target.to_dict(), "settings": mopts.__dict__, "rows": rows}


def ladder_markdown(data: dict) -> str:
    t = data["target"]
    lines = [f"ladder for {data['workload']} on {t['cpu_name']}, {data['date']}", "",
             "| step | threads | kernel (s) | NumPy (s) | GFLOPS | ratio (NumPy/kernel) |",
             "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "ratio" in r:
            lines.append(f"| {r['step']} | {r['threads']} | {r['kernel_median_s']:.4f} | "
                         f"{r['numpy_median_s']:.4f} | {r['kernel_gflops']:.1f} | {r['ratio']:.3f} |")
        else:
            lines.append(f"| {r['step']} | - | {r['status']} | | | |")
    return "\n".join(lines)
