"""``bench gemm``: the tuned kernel and NumPy side by side, shape by shape, in one run.

For every (threads, dtype, shape): the config is the best record for this target (tuned first
with ``tune_trials`` when there is none and a budget is given, otherwise the announced
fallback); the kernel and NumPy's ``A @ B`` (BLAS limited to the same threads) are measured
alternately twice by the same pinned worker and each figure is the median of all its
samples. Rows carry both medians and spreads, GFLOPS, the ratio NumPy time / kernel time and
percent of the estimated peak; the file carries the target, versions and settings.
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import os
import statistics
from pathlib import Path

from search_spaces import template_for
from tuner.bench.peak import measured_ghz, peak_gflops
from tuner.dispatch import select_config
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.measure.result import summarize
from tuner.target import host_target
from tuner.tuning import TuneOptions, tune
from workloads.gemm import Gemm

DEFAULT_SHAPES = ["64x64x64", "128x128x128", "256x256x256", "512x512x512", "1024x1024x1024",
                  "2048x2048x2048", "1000x1000x1000", "1023x1023x1023", "1025x1025x1025",
                  "1x1024x4096", "128x4096x1024", "4096x128x1024", "64x64x4096"]
COLUMNS = ["threads", "dtype", "shape", "config_source", "kernel_median_s", "kernel_iqr_s",
           "numpy_median_s", "numpy_iqr_s", "kernel_gflops", "numpy_gflops", "ratio",
           "kernel_pct_peak", "numpy_pct_peak"]


def side_by_side(measurer: Measurer, workload, template, config, rounds: int = 2):
    """Kernel and NumPy measured alternately; returns (kernel result, kernel samples, numpy samples)."""
    ks, ns, last = [], [], None
    for _ in range(rounds):
        (last,) = measurer.measure(workload, template, [config])
        if not last.ok:
            return last, [], []
        ks += last.samples
        ns += measurer.baseline(workload).samples
    return last, ks, ns


def bench_gemm(shapes, dtypes, threads_list, store, tune_trials: int = 0, strategy: str = "model",
               measure: MeasureOptions | None = None, log=print) -> dict:
    target = host_target()
    rows, overhead = [], {}
    load_before = os.getloadavg()[0]
    for threads in threads_list:
        mopts = MeasureOptions(**{**(measure.__dict__ if measure else {}), "threads": threads})
        with Measurer(mopts) as m:
            for dtype in dtypes:
                overhead[f"{dtype}/{threads}"] = m.call_overhead(dtype)
                for shape in shapes:
                    w = Gemm.parse(shape, dtype)
                    template = template_for(w)
                    sel = select_config(w, template, store, target, threads, quiet=True)
                    if sel.source == "fallback" and tune_trials > 0:
                        log(f"tuning {w} with {threads} thread(s), {tune_trials} trials ...")
                        tune(w, template, store, target,
                             TuneOptions(strategy=strategy, trials=tune_trials, threads=threads,
                                         progress=False), mopts, measurer=m)
                        sel = select_config(w, template, store, target, threads, quiet=True)
                    res, ks, ns = side_by_side(m, w, template, sel.config)
                    row = {"threads": threads, "dtype": dtype, "shape": shape,
                           "config_source": sel.source, "config": dict(sel.config),
                           "status": res.status.value, "error": res.error}
                    if ks and ns:
                        k, n = summarize(ks), summarize(ns)
                        peak = peak_gflops(target, dtype, threads)
                        kg, ng = w.flops() / k["median"] / 1e9, w.flops() / n["median"] / 1e9
                        row.update(kernel_median_s=k["median"], kernel_iqr_s=k["iqr"],
                                   numpy_median_s=n["median"], numpy_iqr_s=n["iqr"],
                                   kernel_gflops=kg, numpy_gflops=ng, ratio=n["median"] / k["median"],
                                   kernel_pct_peak=100 * kg / peak if peak else None,
                                   numpy_pct_peak=100 * ng / peak if peak else None,
                                   kernel_samples=ks, numpy_samples=ns)
                    rows.append(row)
                    log(format_row(row))
    return {"kind": "bench-gemm", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "target": target.to_dict(), "measured_ghz": measured_ghz(),
            "peak_gflops_per_core": {d: peak_gflops(target, d, 1) for d in dtypes},
            "call_overhead_s": overhead, "settings": mopts.__dict__,
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "rows": rows}


def format_row(r: dict) -> str:
    if "ratio" not in r:
        return f"{r['threads']}t {r['dtype']:8s} {r['shape']:16s} {r['status']}: {r['error'][:80]}"
    pct = f"{r['kernel_pct_peak']:5.1f}%" if r.get("kernel_pct_peak") is not None else "   - "
    return (f"{r['threads']}t {r['dtype']:8s} {r['shape']:16s} {r['config_source']:8s} "
            f"kernel {r['kernel_median_s'] * 1e3:9.3f} ms {r['kernel_gflops']:7.1f} GF {pct}  "
            f"numpy {r['numpy_median_s'] * 1e3:9.3f} ms {r['numpy_gflops']:7.1f} GF  "
            f"ratio {r['ratio']:5.2f}")


def table_markdown(data: dict) -> str:
    """The README table, generated from a result file."""
    t = data["target"]
    lines = [f"{data['kind']} on {t['cpu_name']} ({t['cores']} cores), {data['date']}, "
             f"numba {t['versions']['numba']}, numpy {t['versions']['numpy']}, "
             f"measured clock {data['measured_ghz']:.2f} GHz",
             "", "| threads | dtype | shape | config | kernel ms | numpy ms | kernel GFLOPS | "
             "numpy GFLOPS | ratio | % peak |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "ratio" not in r:
            lines.append(f"| {r['threads']} | {r['dtype']} | {r['shape']} | {r['status']} | | | | | | |")
            continue
        pct = f"{r['kernel_pct_peak']:.0f}%" if r.get("kernel_pct_peak") is not None else "-"
        lines.append(f"| {r['threads']} | {r['dtype']} | {r['shape']} | {r['config_source']} | "
                     f"{r['kernel_median_s'] * 1e3:.3f} | {r['numpy_median_s'] * 1e3:.3f} | "
                     f"{r['kernel_gflops']:.1f} | {r['numpy_gflops']:.1f} | {r['ratio']:.2f} | {pct} |")
    ov = data.get("call_overhead_s") or {}
    for key, o in ov.items():
        if o.get("status") == "OK":
            lines.append(f"\ncall overhead ({key} threads): Numba kernel call "
                         f"{o['numba_call_s'] * 1e6:.2f} us, NumPy matmul 1x1 {o['numpy_call_s'] * 1e6:.2f} us")
    return "\n".join(lines)


def write_results(data: dict, out: Path) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, default=str))
    csv_path = out.with_suffix(".csv")
    with open(csv_path, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=COLUMNS + ["config"], extrasaction="ignore")
        wr.writeheader()
        for r in data["rows"]:
            wr.writerow({**r, "config": json.dumps(r.get("config", {}), sort_keys=True)})
    return out, csv_path


def median_ratio(data: dict) -> float | None:
    ratios = [r["ratio"] for r in data["rows"] if "ratio" in r]
    return statistics.median(ratios) if ratios else None
