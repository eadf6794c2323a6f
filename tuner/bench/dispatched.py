"""The dispatched path timed where users run it: a fresh, ordinary Python process calling
``tuner.gemm(A, B)`` on freshly allocated operands.

The tuning worker's figure is what the tuner promises; this is what a script gets. The child
is not pinned and sets no Numba/BLAS environment of its own (it inherits the caller's, with
``TUNER_DB``/``TUNER_CACHE`` pointing at the same records and kernel cache). Each round
allocates new operands (wherever NumPy's allocator puts them), makes one untimed call (the
first round's loads the kernel from Numba's cache) and times samples of back-to-back calls
that allocate C, as ``C = tuner.gemm(A, B)`` in a loop does. Per-round medians show how much
the figure moves with the operands' placement.
"""
from __future__ import annotations

import json
import subprocess
import sys

from tuner.measure.pool import child_env

_CHILD = r"""
import json, statistics, sys, time
import numpy as np
import tuner
from tuner.dispatch import _SELECTED
from tuner.measure.worker import time_callable

M, N, K, dtype, threads, rounds, repeat, min_ms, max_s = json.loads(sys.argv[1])
rng = np.random.default_rng(1)
out = {"rounds": [], "samples": [], "cpu_samples": []}
for r in range(rounds):
    A = rng.uniform(-1, 1, (M, K)).astype(dtype)
    B = rng.uniform(-1, 1, (K, N)).astype(dtype)
    t0 = time.perf_counter()
    tuner.gemm(A, B, threads=threads)
    if r == 0:
        out["first_call_s"] = time.perf_counter() - t0
    samples, timing = time_callable(lambda: tuner.gemm(A, B, threads=threads), 1, repeat,
                                    min_ms, max_s / rounds)
    out["samples"] += samples
    out["cpu_samples"] += timing["cpu_samples"]
    out["rounds"].append({"median": statistics.median(samples), "number": timing["number"],
                          "offsets": [A.ctypes.data % 64, B.ctypes.data % 64]})
(sel,) = [v[1] for k, v in _SELECTED.items() if k[1:6] == (M, N, K, dtype, threads)]
out.update(config=dict(sel.config), source=sel.source)
print("DISPATCHED " + json.dumps(out))
"""


def time_dispatched(workload, threads: int, db_url: str, rounds: int = 3, repeat: int = 7,
                    min_repeat_ms: float = 50.0, max_time_s: float = 10.0,
                    timeout: float = 600.0) -> dict:
    """Samples (seconds per call) of ``tuner.gemm`` for ``workload`` in a fresh process, with
    per-round medians, the config it selected and its first call's time; ``{"error": ...}``
    when the child failed."""
    args = [workload.M, workload.N, workload.K, workload.dtype, threads, rounds,
            max(3, -(-repeat // rounds)), min_repeat_ms, max_time_s]
    env = child_env({"TUNER_DB": db_url})
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"dispatched run did not finish within {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("DISPATCHED "):
            return json.loads(line[len("DISPATCHED "):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"dispatched run failed (exit {proc.returncode}): {tail[:300]}"}
