"""``bench model``: end-to-end latency of one model, every contender measured in the same run.

Rows, for each thread count (the experiment groups of ../shared/REFERENCE.md), each with wall
time (p50/p95) and process CPU time (p50; on a shared machine the ratios of CPU times are
the steadier ones; with more than one thread it sums every thread of the process):

- A  ONNX Runtime (the framework baseline): ``intra_op_num_threads`` = threads, one inter-op
     thread, sequential execution;
- N  the NumPy reference executor on the un-optimized graph (the unoptimized baseline; BLAS
     limited to the same threads with threadpoolctl);
- B  built without graph passes (opt level 0: one kernel per op) and without tuning;
- C  + graph passes (opt level 2), still template defaults;
- D  + tuned configs from the records (where a record exists; the row says how many);
- E  C + INT8: ``build --int8`` (calibrated on ``calibration`` seeded random inputs, uint8
     activations, int8 per-channel weights), template defaults;
- F  D + INT8: the same quantized graph with the records of tuned int8 kernels
     (``tune model MODEL --int8 --random-weights SEED``, same calibration);
- Q  ONNX Runtime INT8: ``quantize_static`` (QDQ, per channel, U8 activations, S8 weights, the
     same ``reduce_range``, method and calibration inputs), ``intra_op_num_threads`` = threads.

INT8 rows also give the weight bytes, the top-1 agreement with FP32 (ONNX Runtime's FP32
output) over ``agreement`` seeded inputs (seeds 10000.., never a calibration seed) and, for
E/F, the coverage (ops quantized, conversions, quantized kernels left to NumPy).

The model gets seeded random weights (``onnx_weights.randomize``) so every row computes on
the same realistic numbers, and each row's output is compared with ONNX Runtime's (max abs
error). Measurements are interleaved: ``rounds`` passes over all contenders, each taking
``repeat / rounds`` (at least 3) samples, so a neighbour's load spreads over every row. Ten
rounds by default: two identical ResNet-50 builds at 2 threads differed by a p50 std of 2.7%
over eight runs of 2 rounds x 10 samples and 1.0% with 10 rounds x 3 (SqueezeNet 4.4% ->
1.9%, ResNet-50 at 1 thread 0.5% -> 0.2%; AMD Zen 4, 2026-12-07). Each row also
names its main bottleneck (the kind of kernel taking most of the time, from a per-kernel
profile), where the time goes (its five largest kernels with share, GFLOPS and the time of a
BLAS GEMM of the same size: ``tuner.bench.hotspots``) and the runtime's own overhead (the
same loop over no-op kernels).

Several models in one command (``bench model A.onnx B.onnx ...``) give one JSON with each
model's result and ``models_markdown``: one line per model and thread count, every group's
p50 and its ratio to ONNX Runtime.
"""
from __future__ import annotations

import datetime as dt
import json
import platform
from pathlib import Path
from typing import Callable

import numpy as np

from tuner.compiler.module import time_interleaved
from tuner.bench.hotspots import hotspots, hotspots_markdown

GROUPS = {
    "A": ("ONNX Runtime", "onnxruntime", "-"),
    "N": ("NumPy executor", "none", "none"),
    "B": ("built, no graph passes", "none (O0)", "none"),
    "C": ("built + graph passes", "O2", "none"),
    "D": ("built + passes + tuned", "O2", "records"),
    "L": ("built + passes, NHWC (O3: direct convolutions)", "O3", "none"),
    "M": ("built + passes, NHWC (O3) + tuned", "O3", "records"),
    "E": ("built + passes + INT8", "O2", "none"),
    "F": ("built + passes + tuned + INT8", "O2", "records"),
    "Q": ("ONNX Runtime INT8 (QDQ U8S8)", "onnxruntime", "-"),
}
INT8_GROUPS = "EFQ"
COLUMNS = ["group", "what", "threads", "graph_passes", "tuning", "dtype", "p50_ms", "p95_ms",
           "vs_numpy", "vs_ort", "cpu_p50_ms", "vs_numpy_cpu", "vs_ort_cpu", "max_abs_err",
           "weight_mb", "top1_vs_fp32", "coverage", "kernels", "bottleneck", "overhead_ms"]
AGREEMENT_SEED = 10_000   # agreement inputs: never a calibration seed (0..N-1)
SETTLE_SECONDS = 0.2   # sleep before each contender's samples at > 1 thread (time_interleaved)


def _bottleneck(prof) -> str:
    """The kind of kernel taking most of the time, and the largest single kernel's share
    (``prof``: ``Module.profile`` pairs)."""
    share: dict[str, float] = {}
    top = (None, 0.0)
    for step, t in prof:
        share[step.kind] = share.get(step.kind, 0.0) + t
        if t > top[1]:
            top = (step, t)
    total = sum(share.values()) or 1.0
    kind, t = max(share.items(), key=lambda kv: kv[1])
    step = top[0]
    largest = f"; largest {step.kind} {step.source} {100 * top[1] / total:.0f}%" if step else ""
    return f"{kind} {100 * t / total:.0f}%{largest}"


def _weight_mb(graph) -> float:
    return sum(n.value.array.nbytes for n in graph.nodes if n.is_const) / 1e6


def _onnx_weight_mb(model_bytes: bytes) -> float:
    import onnx
    from onnx import numpy_helper

    m = onnx.load_from_string(model_bytes)
    return sum(numpy_helper.to_array(t).nbytes for t in m.graph.initializer) / 1e6


def _coverage(q: dict) -> str:
    total = q["ops_quantized"] + q["ops_fp32"]
    return (f"{q['ops_quantized']}/{total} ops int8, {q['conversions']} q/dq, "
            f"{q['quantized_numpy']}/{q['quantized_kernels']} int8 kernels numpy")


def _top1(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    agree = [np.argmax(np.asarray(o).reshape(-1)) == np.argmax(np.asarray(r).reshape(-1))
             for o, r in zip(outputs, reference)]
    return float(np.mean(agree))


def bench_model(path: str, threads_list: list[int], *, groups: str = "ANBCD", seed: int = 0,
                repeat: int = 20, rounds: int = 10, db: str | None = None, jobs: int | None = None,
                calibration: int = 16, agreement: int = 200, calib_method: str = "minmax",
                shapes: dict | None = None, log: Callable[[str], None] = print) -> dict:
    from threadpoolctl import threadpool_limits

    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import compare, ort_session, prepare
    from workloads.graph.executor import execute, random_inputs
    from tuner.target import host_target

    model, graph = prepare(path, seed, shapes=shapes)   # shapes: its symbolic input dimensions
    inputs = random_inputs(graph, seed=1)
    feed = {p.name: x for p, x in zip(graph.inputs, inputs)}
    model_bytes = model.SerializeToString()
    rows = []
    int8 = qbytes = None
    agree_inputs = agree_ref = None
    if set(groups) & set(INT8_GROUPS):
        from tuner.quant.calibrate import random_samples
        from tuner.quant.flow import Int8Options
        from tuner.target import host_target as _host
        from workloads.graph.quant_params import default_reduce_range

        samples = random_samples(graph, calibration)
        reduce_range = default_reduce_range(_host().features)
        int8 = Int8Options(calibration=samples, method=calib_method, reduce_range=reduce_range)
        agree_inputs = [random_inputs(graph, seed=AGREEMENT_SEED + i) for i in range(agreement)]
        ref_sess = ort_session(model_bytes, 1)
        agree_ref = [ref_sess.run(None, {p.name: x for p, x in zip(graph.inputs, row)})[0]
                     for row in agree_inputs]
        if "Q" in groups:
            from tuner.quant.ort_compare import quantize_with_ort

            log(f"quantizing {graph.name} with ONNX Runtime (group Q) ...")
            qbytes = quantize_with_ort(model, graph, samples, reduce_range=reduce_range,
                                       method=calib_method)
    for threads in threads_list:
        contenders: dict[str, dict] = {}
        sess = ort_session(model_bytes, threads)
        expected = np.asarray(sess.run(None, feed)[0])
        if "A" in groups:
            contenders["A"] = {"fn": lambda s=sess: s.run(None, feed), "out": expected,
                               "weight_mb": _weight_mb(graph)}
        if "Q" in groups:
            qsess = ort_session(qbytes, threads)
            contenders["Q"] = {"fn": lambda s=qsess: s.run(None, feed),
                               "out": np.asarray(qsess.run(None, feed)[0]),
                               "weight_mb": _onnx_weight_mb(qbytes),
                               "top1": _top1([qsess.run(None, {p.name: x for p, x in zip(graph.inputs, row)})[0]
                                              for row in agree_inputs], agree_ref)}
        if "N" in groups:
            def numpy_run(t=threads):
                with threadpool_limits(limits=t, user_api="blas"):
                    return execute(graph, inputs)
            contenders["N"] = {"fn": numpy_run, "out": numpy_run()[0]}
        for g, (opt, tuned, q) in {"B": (0, False, False), "C": (2, False, False),
                                   "D": (2, True, False), "L": (3, False, False), "M": (3, True, False),
                                   "E": (2, False, True),
                                   "F": (2, True, True)}.items():
            if g not in groups:
                continue
            log(f"building {graph.name} for group {g} ({threads} thread(s)) ...")
            m = build(graph, opt_level=opt, tuned=tuned, threads=threads, db=db, jobs=jobs,
                      int8=int8 if q else False)
            log("  " + m.summary.line(path))
            contenders[g] = {"module": m, "fn": lambda m=m: m.run(inputs, copy=False),
                             "out": m.run(inputs)[0]}
            if q:
                contenders[g].update(weight_mb=_weight_mb(m.quantized.quantized.graph),
                                     top1=_top1([m.run(row)[0] for row in agree_inputs], agree_ref),
                                     coverage=_coverage(m.summary.quant))
            else:
                contenders[g]["weight_mb"] = _weight_mb(graph)
        # threads > 1: each contender's pool spin-waits after its runs; let it stop first
        timing = time_interleaved({g: c["fn"] for g, c in contenders.items()}, rounds=rounds,
                                  repeat=repeat, warmup=2, max_seconds=60,
                                  settle=SETTLE_SECONDS if threads > 1 else 0.0)
        for g, c in contenders.items():
            what, passes, tuning = GROUPS[g]
            m = c.get("module")
            t = timing[g]
            row = {"group": g, "what": what, "threads": threads, "graph_passes": passes,
                   "tuning": tuning, "dtype": "int8" if g in INT8_GROUPS else "float32",
                   "p50_ms": t.p50 * 1e3,
                   "weight_mb": c.get("weight_mb"), "top1_vs_fp32": c.get("top1"),
                   "coverage": c.get("coverage", "-"),
                   "p95_ms": t.p95 * 1e3, "samples_ms": [x * 1e3 for x in t.samples],
                   "cpu_p50_ms": t.cpu_p50 * 1e3,
                   "cpu_samples_ms": [x * 1e3 for x in t.cpu_samples],
                   "max_abs_err": compare("out", np.asarray(c["out"]), expected, 1e-3, 1e-4).max_abs,
                   "kernels": "-", "bottleneck": "-", "overhead_ms": None}
            if m is not None:
                prof = m.profile(inputs, repeat=5)
                row.update(kernels=m.summary.line(path).split(": ", 1)[1].split(";")[0],
                           counts=m.summary.counts, bottleneck=_bottleneck(prof),
                           hotspots=hotspots(prof, threads), overhead_ms=m.overhead() * 1e3)
            rows.append(row)
        for row in rows[-len(contenders):]:
            for g, col in (("N", "vs_numpy"), ("A", "vs_ort")):
                if g in timing:
                    row[col] = timing[g].p50 * 1e3 / row["p50_ms"]
                    row[col + "_cpu"] = timing[g].cpu_p50 * 1e3 / row["cpu_p50_ms"]
        log(table_markdown({"rows": rows[-len(contenders):]}))
        for row in rows[-len(contenders):]:
            if row.get("hotspots"):
                log(f"\nwhere the time goes, group {row['group']}, {threads} thread(s):")
                log(hotspots_markdown(row["hotspots"]))
    return {"kind": "bench-model", "model": path, "name": graph.name, "seed": seed,
            "calibration": calibration if int8 else None, "calib_method": calib_method,
            "agreement_inputs": agreement if int8 else None,
            "input_shapes": [list(p.type.shape) for p in graph.inputs], "repeat": repeat,
            "rounds": rounds, "warmup": 2, "target": host_target().key,
            "versions": model_versions(), "time": dt.datetime.now().isoformat(timespec="seconds"),
            "rows": rows}


def model_versions() -> dict:
    """Python and the versions of the libraries a model benchmark ran with."""
    out = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "llvmlite", "onnx", "onnxruntime"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    return out


def _fmt(v, col: str) -> str:
    if v is None:
        return "-"
    if col.startswith("vs_"):
        return f"{v:.2f}x"
    if col == "max_abs_err":
        return f"{v:.1e}"
    if col == "top1_vs_fp32":
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def table_markdown(data: dict) -> str:
    cols = COLUMNS
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in data["rows"]:
        lines.append("| " + " | ".join(_fmt(r.get(c), c) for c in cols) + " |")
    return "\n".join(lines)


def write_results(data: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def models_markdown(results: list[dict]) -> str:
    """One line per model and thread count: ONNX Runtime's p50 and every other group's p50
    with its ratio to it (ORT time / ours: above 1 is faster than ONNX Runtime)."""
    groups = [g for g in GROUPS if any(r["group"] == g for d in results for r in d["rows"])]
    others = [g for g in groups if g != "A"]
    head = ["model", "threads"] + (["A ms"] if "A" in groups else []) + [f"{g} ms" for g in others]
    if "A" in groups:
        head += [f"{g} vs A" for g in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in results:
        for t in sorted({r["threads"] for r in d["rows"]}):
            rows = {r["group"]: r for r in d["rows"] if r["threads"] == t}
            cells = [d["name"], str(t)]
            cells += [_fmt(rows[g]["p50_ms"], "p50_ms") if g in rows else "-" for g in groups]
            if "A" in groups:
                cells += [_fmt(rows[g].get("vs_ort"), "vs_ort") if g in rows else "-" for g in others]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
