"""``bench int8``: the int8 GEMM beside ONNX Runtime's MatMulInteger and our own fp32 GEMM.

For every (threads, dtype, shape), three contenders run in this one process, pinned to the
first ``threads`` CPUs, alternating round by round (each round: a warm-up and ``repeat``
samples of at least ``min_repeat_ms`` per contender), so a neighbour's load hits all of them
alike:

- ours: the int8 kernel (best record for this target and thread count, tuned first with
  ``tune_trials`` when there is none, else the announced fallback);
- ONNX Runtime: a one-node model ``MatMulInteger(A uint8, B int8 initializer, zero points 0)``,
  ``intra_op_num_threads`` = threads, one inter-op thread;
- fp32: our float32 GEMM of the same shape (its own record or fallback), on float copies;
- numpy fp32: NumPy's float32 ``matmul`` (its BLAS limited to ``threads``), the strongest
  float GEMM at hand, for context.

Each figure is the median of all its samples; ratios are competitor time / our time (> 1:
ours is faster). At one thread every contender runs on the calling thread (ONNX Runtime with
one intra-op thread has no pool), so each round also takes samples of the thread's CPU time
(``time.thread_time``): on a shared machine where other processes take turns on the cores,
wall time counts their turns and CPU time does not, so the ``cpu`` figures are the steadier ones. Both integer outputs are checked exactly against NumPy: a contender that
gives a wrong answer (ONNX Runtime's ``vpmaddubsw`` path saturates on full-range weights the
way ours would) is reported as such, never silently timed.
"""
from __future__ import annotations

import datetime as dt
import os

import numpy as np

from search_spaces import template_for
from tuner.dispatch import load_kernel, select_config
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.measure.result import summarize
from tuner.measure.worker import time_callable
from tuner.target import host_target
from tuner.tuning import TuneOptions, tune
from workloads.gemm import Gemm

DEFAULT_SHAPES = ["1024x1024x1024", "256x1024x1024", "1x4096x1024", "1000x1000x1000"]
CONTENDERS = ("int8", "ort", "fp32", "np32")


def matmul_integer_model(b: np.ndarray) -> bytes:
    """A one-node ONNX model: Y[M, N] int32 = MatMulInteger(A[M, K] uint8, B, 0, 0)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    K, N = b.shape
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B", "a_zero_point", "b_zero_point"], ["Y"])],
        "matmul_integer",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["M", N])],
        initializer=[numpy_helper.from_array(b, "B"),
                     numpy_helper.from_array(np.array(0, np.uint8), "a_zero_point"),
                     numpy_helper.from_array(np.array(0, np.int8), "b_zero_point")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _config(w: Gemm, store, target, threads: int, tune_trials: int, strategy: str,
            mopts: MeasureOptions, log):
    template = template_for(w)
    sel = select_config(w, template, store, target, threads, quiet=True)
    if sel.source == "fallback" and tune_trials > 0:
        log(f"tuning {w} with {threads} thread(s), {tune_trials} trials ...")
        with Measurer(mopts) as m:
            tune(w, template, store, target, TuneOptions(strategy=strategy, trials=tune_trials,
                                                         threads=threads, progress=False), mopts,
                 measurer=m)
        sel = select_config(w, template, store, target, threads, quiet=True)
    return template, sel


def bench_int8(shapes, dtypes, threads_list, store, tune_trials: int = 0, strategy: str = "model",
               rounds: int = 3, repeat: int = 5, min_repeat_ms: float = 50.0, log=print) -> dict:
    import numba
    from threadpoolctl import threadpool_limits

    from tuner.compiler.verify_model import ort_session

    target = host_target()
    allowed = sorted(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    from tuner.bench.peak import core_peaks, peaks_line

    peaks = core_peaks()
    log(peaks_line(peaks))
    rows = []
    for threads in threads_list:
        mopts = MeasureOptions(threads=threads, repeat=repeat, min_repeat_ms=min_repeat_ms, max_time_s=10.0)
        for dtype in dtypes:
            for shape in shapes:
                w = Gemm.parse(shape, dtype)
                wf = Gemm(w.M, w.N, w.K, "float32")
                tpl, sel = _config(w, store, target, threads, tune_trials, strategy, mopts, log)
                ftpl, fsel = _config(wf, store, target, threads, tune_trials, strategy, mopts, log)
                kernel, fkernel = load_kernel(w, tpl, sel.config), load_kernel(wf, ftpl, fsel.config)
                a, b = w.make_inputs()
                (ref,) = w.reference([a, b])
                af, bf = a.astype(np.float32), b.astype(np.float32)
                c, cf = np.empty((w.M, w.N), np.int32), np.empty((w.M, w.N), np.float32)
                cn = np.empty_like(cf)
                os.sched_setaffinity(0, allowed[:threads])   # ORT's threads inherit it
                blas = threadpool_limits(limits=threads, user_api="blas")
                try:
                    sess = ort_session(matmul_integer_model(b), threads)
                    feeds = {"A": a}
                    calls = {
                        "int8": (tpl.threads(sel.config), lambda: kernel(a, b, c)),
                        "ort": (None, lambda: sess.run(None, feeds)),
                        "fp32": (ftpl.threads(fsel.config), lambda: fkernel(af, bf, cf)),
                        "np32": (None, lambda: np.matmul(af, bf, out=cn)),
                    }
                    kernel(a, b, c)
                    ours_check = w.check([a, b], [c], [ref])
                    ort_check = w.check([a, b], [sess.run(None, feeds)[0]], [ref])
                    samples = {k: [] for k in CONTENDERS}
                    cpu = {k: [] for k in CONTENDERS} if threads == 1 else {}
                    for _ in range(rounds):
                        for name, (nthreads, fn) in calls.items():
                            if nthreads is not None:
                                numba.set_num_threads(min(nthreads, numba.config.NUMBA_NUM_THREADS))
                            s, _ = time_callable(fn, 1, repeat, min_repeat_ms, 10.0)
                            samples[name] += s
                            if cpu:
                                cpu[name] += thread_cpu_samples(fn, repeat, min_repeat_ms)
                finally:
                    os.sched_setaffinity(0, allowed)
                    blas.restore_original_limits()
                st = {k: summarize(v) for k, v in samples.items()}
                ops = w.flops()
                row = {"threads": threads, "dtype": dtype, "shape": shape,
                       "int8_config_source": sel.source, "int8_config": dict(sel.config),
                       "fp32_config_source": fsel.source, "fp32_config": dict(fsel.config),
                       "int8_check": ours_check, "ort_check": ort_check,
                       **{f"{k}_median_s": st[k]["median"] for k in CONTENDERS},
                       **{f"{k}_iqr_s": st[k]["iqr"] for k in CONTENDERS},
                       **{f"{k}_gops": ops / st[k]["median"] / 1e9 for k in CONTENDERS},
                       "int8_peak_share": ops / st["int8"]["median"] / 1e9 / (peaks[sel.config["dot"]] * threads),
                       "ratio_vs_ort": st["ort"]["median"] / st["int8"]["median"],
                       "ratio_vs_fp32": st["fp32"]["median"] / st["int8"]["median"],
                       "ratio_vs_numpy_fp32": st["np32"]["median"] / st["int8"]["median"],
                       "samples": samples, "cpu_samples": cpu}
                if cpu:
                    ct = {k: summarize(v) for k, v in cpu.items()}
                    row.update({f"{k}_cpu_median_s": ct[k]["median"] for k in CONTENDERS})
                    row.update({f"{k}_cpu_iqr_s": ct[k]["iqr"] for k in CONTENDERS})
                    row.update(cpu_ratio_vs_ort=ct["ort"]["median"] / ct["int8"]["median"],
                               cpu_ratio_vs_fp32=ct["fp32"]["median"] / ct["int8"]["median"],
                               cpu_ratio_vs_numpy_fp32=ct["np32"]["median"] / ct["int8"]["median"],
                               int8_cpu_gops=ops / ct["int8"]["median"] / 1e9)
                rows.append(row)
                log(format_row(row))
    import onnxruntime

    versions = {**target.versions, "onnxruntime": onnxruntime.__version__}
    return {"kind": "bench-int8", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "target": {**target.to_dict(), "versions": versions},
            "settings": {"rounds": rounds, "repeat": repeat, "min_repeat_ms": min_repeat_ms,
                         "tune_trials": tune_trials},
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "peaks": peaks, "rows": rows}


def thread_cpu_samples(fn, repeat: int, min_repeat_ms: float) -> list[float]:
    """Seconds of this thread's CPU time per call: ``repeat`` samples of at least
    ``min_repeat_ms`` of CPU time each (the call was warmed up by the wall-time samples)."""
    import time

    out = []
    for _ in range(repeat):
        t0, n = time.thread_time(), 0
        while True:
            fn()
            n += 1
            spent = time.thread_time() - t0
            if spent * 1000 >= min_repeat_ms:
                break
        out.append(spent / n)
    return out


def _flag(check: str | None) -> str:
    return "" if check is None else " WRONG"


def format_row(r: dict) -> str:
    return (f"{r['threads']}t {r['dtype']:7s} {r['shape']:15s} int8 {r['int8_median_s'] * 1e3:8.3f} ms"
            f"{_flag(r['int8_check'])} {r['int8_gops']:6.1f} GOPS  ort {r['ort_median_s'] * 1e3:8.3f} ms"
            f"{_flag(r['ort_check'])}  fp32 {r['fp32_median_s'] * 1e3:8.3f} ms  "
            f"vs ORT {r['ratio_vs_ort']:4.2f}x  vs fp32 {r['ratio_vs_fp32']:4.2f}x  "
            f"vs numpy fp32 {r['ratio_vs_numpy_fp32']:4.2f}x"
            + (f"  | cpu: int8 {r['int8_cpu_median_s'] * 1e3:.3f} ms, vs ORT {r['cpu_ratio_vs_ort']:4.2f}x, "
               f"vs fp32 {r['cpu_ratio_vs_fp32']:4.2f}x" if "cpu_ratio_vs_ort" in r else ""))


def _share(r: dict) -> str:
    return f"{100 * r['int8_peak_share']:.0f}%" if "int8_peak_share" in r else "-"


def table_markdown(data: dict) -> str:
    t = data["target"]
    v = t["versions"]
    lines = [f"bench int8 on {t['cpu_name']} ({t['cores']} cores, "
             f"{'avx512' if 'avx512bw' in t['features'] else 'avx2'}), {data['date']}, numba {v['numba']}, "
             f"llvmlite {v['llvmlite']}, onnxruntime {v['onnxruntime']}; {data['settings']['rounds']} "
             f"alternating rounds; load average before/after {data['load_average_1m']}"]
    if "peaks" in data:
        from tuner.bench.peak import peaks_line

        lines.append(peaks_line(data["peaks"]) + "; % peak: of its formulation's ceiling x threads")
    lines += ["", "| threads | dtype | shape | int8 config | int8 ms (IQR) | ORT ms (IQR) | fp32 ms (IQR) | "
              "NumPy fp32 ms (IQR) | int8 GOPS | % peak | vs ORT | vs fp32 | vs NumPy fp32 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        def cell(k):
            return (f"{r[f'{k}_median_s'] * 1e3:.3f} ({r[f'{k}_iqr_s'] * 1e3:.3f})"
                    + (" WRONG" if r.get(f"{k}_check") else ""))
        lines.append(f"| {r['threads']} | {r['dtype']} | {r['shape']} | {r['int8_config_source']} "
                     f"{r['int8_config'].get('dot')} | {cell('int8')} | {cell('ort')} | {cell('fp32')} | {cell('np32')} | "
                     f"{r['int8_gops']:.1f} | {_share(r)} | {r['ratio_vs_ort']:.2f} | {r['ratio_vs_fp32']:.2f} | "
                     f"{r['ratio_vs_numpy_fp32']:.2f} |")
    cpu_rows = [r for r in data["rows"] if "cpu_ratio_vs_ort" in r]
    if cpu_rows:
        lines += ["", "One thread, thread CPU time (the same rounds; steadier on a shared machine):", "",
                  "| dtype | shape | int8 ms (IQR) | ORT ms (IQR) | fp32 ms (IQR) | NumPy fp32 ms (IQR) | "
                  "int8 GOPS | vs ORT | vs fp32 | vs NumPy fp32 |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in cpu_rows:
            def c(k):
                return f"{r[f'{k}_cpu_median_s'] * 1e3:.3f} ({r[f'{k}_cpu_iqr_s'] * 1e3:.3f})"
            lines.append(f"| {r['dtype']} | {r['shape']} | {c('int8')} | {c('ort')} | {c('fp32')} | {c('np32')} | "
                         f"{r['int8_cpu_gops']:.1f} | {r['cpu_ratio_vs_ort']:.2f} | {r['cpu_ratio_vs_fp32']:.2f} | "
                         f"{r['cpu_ratio_vs_numpy_fp32']:.2f} |")
    wrong = [f"{r['threads']}t {r['dtype']} {r['shape']} {k}: {r[f'{k}_check']}"
             for r in data["rows"] for k in ("int8", "ort") if r.get(f"{k}_check")]
    if wrong:
        lines += ["", "Wrong answers (exact check against NumPy):"] + [f"- {x}" for x in wrong]
    return "\n".join(lines)
