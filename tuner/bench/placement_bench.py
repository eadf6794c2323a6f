"""``bench placement``: how much a GEMM kernel's time depends on where its operands start.

Every contender (configs of the gemm template, generated kernel files, NumPy's ``matmul``) is
timed on the same placements of freshly allocated A, B, C (each at 0, 16 or 32 bytes past a
64-byte boundary: 14 of the 27 combinations, every offset of each operand covered), in turns
within each round. Per placement the figure is the fastest of ``rounds`` x ``calls`` calls:
with CPU time (``--clock cpu``, the default: thread CPU time, for 1-thread kernels) a busy
machine's time slices do not count, and the minimum drops what cache pollution by neighbours
adds, so what remains is the placement's own cost. The spread is (slowest - fastest) /
fastest over placements. This runs in this process, pinned to one CPU, 1 thread.
"""
from __future__ import annotations

import datetime as dt
import os
import re
import statistics
import time
from pathlib import Path

import numpy as np

from tuner.measure.placement import empty_at, spread

PLACEMENT_GRID = [(a, b, c) for a in (0, 16, 32) for b in (0, 16, 32) for c in (0, 16, 32)][::2]


def called_with(text: str) -> tuple:
    """The runtime arguments in the ``# called as: kernel(A, B, C, tile_m=96, ...)`` line that
    ``show`` prints after a kernel's source (() when there is none)."""
    m = re.search(r"^# called as: \w+\(A, B, C, (.*)\)\s*$", text, re.M)
    if not m:
        return ()
    return tuple(int(part.split("=", 1)[1]) for part in m.group(1).split(", "))


def _load_file(path: str):
    from search_spaces.template import bind_runtime_args
    from tuner.dispatch import align_numba_cache
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.measurer import write_source

    align_numba_cache()
    text = Path(path).read_text()
    mod = import_kernel_module(write_source(text))
    return bind_runtime_args(mod.kernel, called_with(text))


def contenders(workload, configs: list[dict], kernels: list[str], numpy: bool = True) -> dict:
    """Name -> callable(A, B, C): each config is applied over the template's 1-thread default."""
    from search_spaces import get_template
    from search_spaces.space import Config
    from tuner.dispatch import load_kernel

    t = get_template("gemm")
    base = dict(t.default_config(workload, 1))
    out = {}
    for i, over in enumerate(configs):
        out[f"config{i}"] = load_kernel(workload, t, Config({**base, **over}))
    for path in kernels:
        out[Path(path).stem] = _load_file(path)
    if numpy:
        out["numpy"] = lambda A, B, C: np.matmul(A, B, out=C)
    return out


def bench_placement(workload, fns: dict, rounds: int = 3, calls: int = 2, clock: str = "cpu",
                    placements=None) -> dict:
    import numba
    from threadpoolctl import threadpool_limits

    placements = placements or PLACEMENT_GRID
    tick = time.thread_time if clock == "cpu" else time.perf_counter
    try:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        pass
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    A0 = rng.uniform(-1, 1, (workload.M, workload.K)).astype(workload.dtype)
    B0 = rng.uniform(-1, 1, (workload.K, workload.N)).astype(workload.dtype)
    best = {k: [float("inf")] * len(placements) for k in fns}
    load = [os.getloadavg()[0]]
    with threadpool_limits(1, user_api="blas"):
        for _ in range(rounds):
            for j, (oa, ob, oc) in enumerate(placements):
                A = empty_at(A0.shape, A0.dtype, oa)
                A[...] = A0
                B = empty_at(B0.shape, B0.dtype, ob)
                B[...] = B0
                C = empty_at((workload.M, workload.N), A0.dtype, oc)
                C[...] = 0
                for name, fn in fns.items():
                    fn(A, B, C)
                    for _ in range(calls):
                        t0 = tick()
                        fn(A, B, C)
                        best[name][j] = min(best[name][j], tick() - t0)
    load.append(os.getloadavg()[0])
    rows = [{"name": k, "per_placement_s": v, "min_s": min(v), "median_s": statistics.median(v),
             "max_s": max(v), "spread": spread(v)} for k, v in best.items()]
    return {"kind": "bench-placement", "workload": workload.key, "clock": clock, "rounds": rounds,
            "calls": calls, "placements": [list(p) for p in placements], "rows": rows,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "load_average_1m": [round(x, 2) for x in load]}


def placement_markdown(data: dict) -> str:
    lines = [f"{data['kind']} {data['workload']}, {data['clock']} time, fastest of "
             f"{data['rounds']}x{data['calls']} calls per placement, {data['date']}, "
             f"load {data['load_average_1m']}", "",
             "| contender | fastest ms | median ms | slowest ms | spread |", "|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['name']} | {r['min_s'] * 1e3:.2f} | {r['median_s'] * 1e3:.2f} | "
                     f"{r['max_s'] * 1e3:.2f} | {100 * r['spread']:.1f}% |")
    return "\n".join(lines)
