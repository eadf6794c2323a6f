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
- D  + tuned configs from the records (where a record exists; the row says how many).

The model gets seeded random weights (``onnx_weights.randomize``) so every row computes on
the same realistic numbers, and each row's output is compared with ONNX Runtime's (max abs
error). Measurements are interleaved: ``rounds`` passes over all contenders, each taking
``repeat / rounds`` samples, so a neighbour's load spreads over every row. Each row also
names its main bottleneck (the kind of kernel taking most of the time, from a per-kernel
profile) and the runtime's own overhead (the same loop over no-op kernels).
"""
from __future__ import annotations

import datetime as dt
import json
import platform
from pathlib import Path
from typing import Callable

import numpy as np

from tuner.compiler.module import Timing, time_fn

GROUPS = {
    "A": ("ONNX Runtime", "onnxruntime", "-"),
    "N": ("NumPy executor", "none", "none"),
    "B": ("built, no graph passes", "none (O0)", "none"),
    "C": ("built + graph passes", "O2", "none"),
    "D": ("built + passes + tuned", "O2", "records"),
}
COLUMNS = ["group", "what", "threads", "graph_passes", "tuning", "dtype", "p50_ms", "p95_ms",
           "vs_numpy", "vs_ort", "cpu_p50_ms", "vs_numpy_cpu", "vs_ort_cpu", "max_abs_err",
           "kernels", "bottleneck", "overhead_ms"]


def _bottleneck(module, inputs) -> str:
    share: dict[str, float] = {}
    for step, t in module.profile(inputs, repeat=2):
        share[step.kind] = share.get(step.kind, 0.0) + t
    total = sum(share.values()) or 1.0
    kind, t = max(share.items(), key=lambda kv: kv[1])
    return f"{kind} {100 * t / total:.0f}%"


def bench_model(path: str, threads_list: list[int], *, groups: str = "ANBCD", seed: int = 0,
                repeat: int = 20, rounds: int = 2, db: str | None = None, jobs: int | None = None,
                log: Callable[[str], None] = print) -> dict:
    from threadpoolctl import threadpool_limits

    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import compare, ort_session, prepare
    from workloads.graph.executor import execute, random_inputs
    from tuner.target import host_target

    model, graph = prepare(path, seed)
    inputs = random_inputs(graph, seed=1)
    feed = {p.name: x for p, x in zip(graph.inputs, inputs)}
    model_bytes = model.SerializeToString()
    rows = []
    for threads in threads_list:
        contenders: dict[str, dict] = {}
        sess = ort_session(model_bytes, threads)
        expected = np.asarray(sess.run(None, feed)[0])
        if "A" in groups:
            contenders["A"] = {"fn": lambda s=sess: s.run(None, feed), "out": expected}
        if "N" in groups:
            def numpy_run(t=threads):
                with threadpool_limits(limits=t, user_api="blas"):
                    return execute(graph, inputs)
            contenders["N"] = {"fn": numpy_run, "out": numpy_run()[0]}
        for g, (opt, tuned) in {"B": (0, False), "C": (2, False), "D": (2, True)}.items():
            if g not in groups:
                continue
            log(f"building {graph.name} for group {g} ({threads} thread(s)) ...")
            m = build(graph, opt_level=opt, tuned=tuned, threads=threads, db=db, jobs=jobs)
            log("  " + m.summary.line(path))
            contenders[g] = {"module": m, "fn": lambda m=m: m.run(inputs, copy=False),
                             "out": m.run(inputs)[0]}
        timing = {g: Timing() for g in contenders}
        per_round = max(3, repeat // max(1, rounds))
        for _ in range(max(1, rounds)):
            for g, c in contenders.items():
                t = time_fn(c["fn"], warmup=2, repeat=per_round, max_seconds=60)
                timing[g].samples += t.samples
                timing[g].cpu_samples += t.cpu_samples
        for g, c in contenders.items():
            what, passes, tuning = GROUPS[g]
            m = c.get("module")
            t = timing[g]
            row = {"group": g, "what": what, "threads": threads, "graph_passes": passes,
                   "tuning": tuning, "dtype": "float32", "p50_ms": t.p50 * 1e3,
                   "p95_ms": t.p95 * 1e3, "samples_ms": [x * 1e3 for x in t.samples],
                   "cpu_p50_ms": t.cpu_p50 * 1e3,
                   "cpu_samples_ms": [x * 1e3 for x in t.cpu_samples],
                   "max_abs_err": compare("out", np.asarray(c["out"]), expected, 1e-3, 1e-4).max_abs,
                   "kernels": "-", "bottleneck": "-", "overhead_ms": None}
            if m is not None:
                row.update(kernels=m.summary.line(path).split(": ", 1)[1].split(";")[0],
                           counts=m.summary.counts, bottleneck=_bottleneck(m, inputs),
                           overhead_ms=m.overhead() * 1e3)
            rows.append(row)
        for row in rows[-len(contenders):]:
            for g, col in (("N", "vs_numpy"), ("A", "vs_ort")):
                if g in timing:
                    row[col] = timing[g].p50 * 1e3 / row["p50_ms"]
                    row[col + "_cpu"] = timing[g].cpu_p50 * 1e3 / row["cpu_p50_ms"]
        log(table_markdown({"rows": rows[-len(contenders):]}))
    return {"kind": "bench-model", "model": path, "name": graph.name, "seed": seed,
            "input_shapes": [list(p.type.shape) for p in graph.inputs], "repeat": repeat,
            "rounds": rounds, "warmup": 2, "target": host_target().key,
            "versions": _versions(), "time": dt.datetime.now().isoformat(timespec="seconds"),
            "rows": rows}


def _versions() -> dict:
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
