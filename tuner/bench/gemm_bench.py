"""``bench gemm``: the tuned kernel and NumPy side by side, shape by shape, in one run.

For every (threads, dtype, shape): the config is the best record for this target (tuned first
with ``tune_trials`` when there is none and a budget is given, otherwise the announced
fallback); the kernel and NumPy's ``A @ B`` (BLAS limited to the same threads) are measured
alternately twice by the same pinned worker and each figure is the median of all its
samples. Rows carry both medians and spreads, GFLOPS, the ratio NumPy time / kernel time and
percent of the estimated peak; the file carries the target, versions and settings.

With ``dispatched`` (the default) each row also times the dispatched path: a fresh ordinary
process calling ``tuner.gemm`` on fresh operands (``tuner.bench.dispatched``), beside the
worker's figure: ``dispatched_vs_worker`` (its time / the worker's; 1.05 = 5% slower where
it is used than where it was measured) and ``dispatched_ratio`` (NumPy time / its time).
Both the worker and NumPy are timed over several buffer placements, scored by the slowest
(``MeasureOptions.placements``); the spread across placements is in ``*_placement_spread``.
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import os
import statistics
from pathlib import Path

from search_spaces import get_template, template_for
from tuner.bench.dispatched import time_dispatched
from tuner.bench.peak import estimated_peak_gflops, measured_ghz, peak_gflops
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
           "kernel_pct_peak", "numpy_pct_peak", "kernel_placement_spread", "numpy_placement_spread",
           "dispatched_median_s", "dispatched_iqr_s", "dispatched_vs_worker", "dispatched_vs_worker_cpu",
           "dispatched_ratio"]


def side_by_side(measurer: Measurer, workload, template, config, rounds: int = 2,
                 blas: list | None = None, spreads: dict | None = None):
    """Kernel and NumPy measured alternately; returns (kernel result, kernel samples, numpy
    samples). ``blas`` receives the BLAS libraries threadpoolctl saw in the baseline worker;
    ``spreads`` (when given) each side's largest placement spread (wall and CPU time) and the
    kernel's CPU samples (``kernel_cpu_samples``)."""
    ks, ns, last = [], [], None
    for _ in range(rounds):
        (last,) = measurer.measure(workload, template, [config])
        if not last.ok:
            return last, [], []
        ks += last.samples
        base = measurer.baseline(workload)
        ns += base.samples
        if blas is not None and not blas:
            blas += base.info.get("blas") or []
        if spreads is not None:
            spreads.setdefault("kernel_cpu_samples", []).extend(last.info.get("cpu_samples", []))
            for side, r in (("kernel", last), ("numpy", base)):
                for key, name in (("placement_spread", side), ("cpu_placement_spread", side + "_cpu")):
                    if key in r.info:
                        spreads[name] = max(spreads.get(name, 0.0), r.info[key])
    return last, ks, ns


def blas_coretypes(rows: list[dict]) -> list[str]:
    """The BLAS kernels the baseline ran ("OpenBLAS 0.3.x Haswell"): OpenBLAS picks its core
    type at load (``OPENBLAS_CORETYPE`` can hold it to one, e.g. Haswell's AVX2 kernels)."""
    seen = {f"{b.get('internal_api')} {b.get('version')} {b.get('architecture')}"
            for r in rows for b in r.get("blas", [])}
    return sorted(seen)


def bench_gemm(shapes, dtypes, threads_list, store, tune_trials: int = 0, strategy: str = "model",
               measure: MeasureOptions | None = None, log=print, dispatched: bool = True) -> dict:
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
                    blas: list = []
                    spreads: dict = {}
                    res, ks, ns = side_by_side(m, w, template, sel.config, blas=blas, spreads=spreads)
                    kernel_cpu = spreads.pop("kernel_cpu_samples", [])
                    row = {"threads": threads, "dtype": dtype, "shape": shape,
                           "config_source": sel.source, "config": dict(sel.config),
                           "status": res.status.value, "error": res.error, "blas": blas,
                           **{f"{k}_placement_spread": v for k, v in spreads.items()}}
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
                        if dispatched:
                            row.update(_dispatched_columns(w, threads, store.url, mopts, sel.config,
                                                           k["median"], n["median"], kernel_cpu))
                    rows.append(row)
                    log(format_row(row))
    return {"kind": "bench-gemm", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "target": target.to_dict(), "measured_ghz": measured_ghz(),
            "peak_gflops_per_core": {d: peak_gflops(target, d, 1) for d in dtypes},
            "peak_source": "measured FMA throughput (tuner.bench.peak.measured_fma_gflops)",
            "estimated_peak_gflops_per_core": {d: estimated_peak_gflops(target, d, 1) for d in dtypes},
            "call_overhead_s": overhead, "settings": mopts.__dict__,
            "blas": blas_coretypes(rows),
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "rows": rows}


def _dispatched_columns(w, threads: int, url: str, mopts: MeasureOptions, config,
                        kernel_s: float, numpy_s: float, kernel_cpu: list[float]) -> dict:
    """The dispatched path's figures beside the worker's. ``*_cpu``: the same ratio in CPU
    time per call (process time; for 1 thread the figure time-slicing on a busy machine does
    not inflate)."""
    d = time_dispatched(w, threads, url, repeat=mopts.repeat, min_repeat_ms=mopts.min_repeat_ms,
                        max_time_s=mopts.max_time_s)
    if "error" in d:
        return {"dispatched_error": d["error"]}
    st = summarize(d["samples"])
    out = {"dispatched_median_s": st["median"], "dispatched_iqr_s": st["iqr"],
           "dispatched_vs_worker": st["median"] / kernel_s, "dispatched_ratio": numpy_s / st["median"],
           "dispatched_rounds": d["rounds"], "dispatched_first_call_s": d.get("first_call_s"),
           "dispatched_samples": d["samples"]}
    if kernel_cpu and d.get("cpu_samples"):
        out["dispatched_vs_worker_cpu"] = (summarize(d["cpu_samples"])["median"]
                                           / summarize(kernel_cpu)["median"])
    if d.get("config") != dict(config):   # another process, another selection: say so
        out["dispatched_config"] = d.get("config")
    return out


def format_row(r: dict) -> str:
    if "ratio" not in r:
        return f"{r['threads']}t {r['dtype']:8s} {r['shape']:16s} {r['status']}: {r['error'][:80]}"
    pct = f"{r['kernel_pct_peak']:5.1f}%" if r.get("kernel_pct_peak") is not None else "   - "
    return (f"{r['threads']}t {r['dtype']:8s} {r['shape']:16s} {r['config_source']:8s} "
            f"kernel {r['kernel_median_s'] * 1e3:9.3f} ms {r['kernel_gflops']:7.1f} GF {pct}  "
            f"numpy {r['numpy_median_s'] * 1e3:9.3f} ms {r['numpy_gflops']:7.1f} GF  "
            f"ratio {r['ratio']:5.2f}" + _format_dispatched(r))


def _format_dispatched(r: dict) -> str:
    if "dispatched_median_s" in r:
        return (f"  dispatched {r['dispatched_median_s'] * 1e3:9.3f} ms "
                f"x{r['dispatched_vs_worker']:.3f} of worker"
                + (f" (cpu x{r['dispatched_vs_worker_cpu']:.3f})" if "dispatched_vs_worker_cpu" in r else "")
                + f", ratio {r['dispatched_ratio']:5.2f}")
    return f"  dispatched: {r['dispatched_error']}" if "dispatched_error" in r else ""


def table_markdown(data: dict) -> str:
    """The README table, generated from a result file."""
    t = data["target"]
    lines = [f"{data['kind']} on {t['cpu_name']} ({t['cores']} cores), {data['date']}, "
             f"numba {t['versions']['numba']}, numpy {t['versions']['numpy']}, "
             f"measured clock {data['measured_ghz']:.2f} GHz"
             + (f", % peak of the measured FMA throughput "
                f"({data['peak_gflops_per_core'].get('float32') or 0:.0f} fp32 GFLOPS per core)"
                if data.get("peak_source") else "")
             + (f", baseline {'; '.join(data['blas'])}" if data.get("blas") else ""),
             "", "| threads | dtype | shape | config | kernel ms | numpy ms | kernel GFLOPS | "
             "numpy GFLOPS | ratio | % peak | placement spread kernel / numpy | dispatched ms | "
             "dispatched / worker | numpy / dispatched |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "ratio" not in r:
            lines.append(f"| {r['threads']} | {r['dtype']} | {r['shape']} | {r['status']} |" + " |" * 10)
            continue
        pct = f"{r['kernel_pct_peak']:.0f}%" if r.get("kernel_pct_peak") is not None else "-"
        spread = " / ".join(f"{100 * r[k]:.1f}%" if r.get(k) is not None else "-"
                            for k in ("kernel_placement_spread", "numpy_placement_spread"))
        disp = (f"{r['dispatched_median_s'] * 1e3:.3f} | {r['dispatched_vs_worker']:.3f} | "
                f"{r['dispatched_ratio']:.2f}" if "dispatched_median_s" in r else "- | - | -")
        lines.append(f"| {r['threads']} | {r['dtype']} | {r['shape']} | {r['config_source']} | "
                     f"{r['kernel_median_s'] * 1e3:.3f} | {r['numpy_median_s'] * 1e3:.3f} | "
                     f"{r['kernel_gflops']:.1f} | {r['numpy_gflops']:.1f} | {r['ratio']:.2f} | {pct} | "
                     f"{spread} | {disp} |")
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
