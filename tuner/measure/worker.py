"""Code that runs inside a worker process (never in the tuner's own process).

Two jobs, each a plain function of a request dict that returns a reply dict:

- ``build``: import the generated module from its content-addressed file and compile its entry
  for the workload's argument types. Numba writes the machine code to its cache
  (``cache=True``), so the run worker loads it instead of compiling again.
- ``run``: import the module (Numba cache hit), bind the config's runtime arguments
  (``runtime_args``: cache blocks, passed after the arrays), load its compiled code (a kernel
  that is not a Numba dispatcher, or one with prepared operands, is called once and checked
  instead), then time it on ``placements`` sets of freshly allocated, differently
  placed inputs and outputs (``tuner.measure.placement``): per placement, check once (the
  first placement's checked call is the first call), warm up, time samples of at least
  ``min_repeat_ms`` each. The reply's samples are the slowest
  placement's; every placement's median and the spread are in its info.
- ``baseline``: the same timing procedure for NumPy's ``A @ B`` with BLAS limited to the same
  number of threads.

Exceptions inside a job become ``{"status": ..., "error": ...}`` replies; a segfault or a
hang kills the process, which the parent (``tuner.measure.pool``) classifies as CRASH or
TIMEOUT.
"""
from __future__ import annotations

import os
import pickle
import time
import traceback
from typing import Any, Callable

_MODULES: dict[str, Any] = {}
_DATA: dict[str, Any] = {}  # workload key -> (workload, inputs, expected); last one only
_ALLOWED_CPUS: list[int] = []  # the CPUs this worker was started with


def _load_module(path: str):
    mod = _MODULES.get(path)
    if mod is None:
        from tuner.measure.kernel_key import import_kernel_module

        mod = _MODULES[path] = import_kernel_module(path)
    return mod


# How long OpenBLAS's pool threads spin after a multi-threaded call: 2**28 TSC cycles, 0.07-0.13
# s at 2-4 GHz. A 2-thread GEMM kernel (384^3, AMD Zen 2) timed right after the NumPy baseline
# measured 1.63 ms on its first placement against 0.80 on the others.
BLAS_SPIN_S = 0.15


def serial_blas():
    """BLAS limited to one thread, for the worker's own NumPy work (references, tolerances).

    Once a multi-threaded BLAS call has woken OpenBLAS's pool threads, they spin (a
    ``sched_yield`` loop) for 2**28 TSC cycles, ~0.1 s, before they sleep, and on a 2-core
    machine they take a core from a 2-thread kernel timed meanwhile. The float checks
    compute two float64 references of the anchor (``tolerance``) before each placement is
    timed: a 2-thread ResNet-50 conv (M3136 N64 K576, AMD Zen 2) measured 1.31-3.85 ms
    across runs (slow placements at 2x its CPU time: a thread spinning at the barrier while
    its partner waited for a core) where a script runs it at 1.31-1.34 ms; with the checks'
    BLAS at one thread, 1.30-1.34 ms in ten runs (docs/measurement.md). The NumPy baseline
    keeps its threads: it is timed as a user's script calls it. Built modules wrap their
    NumPy steps in it too (``compile_model._serial_blas``). The BLAS libraries are found once
    per process (a ``ThreadpoolController``): ~8 us per use instead of ~400 us."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


_BLAS = None   # serial_blas's controller


def _workload(req):
    import workloads

    key = req["workload_key"]
    data = _DATA.get(key)
    if data is None:
        _DATA.clear()
        blob = req.get("workload_blob")
        w = pickle.loads(blob) if blob is not None else workloads.from_key(key)
        inputs = w.make_inputs(seed=req.get("seed", 0))
        with serial_blas():
            expected = w.reference(inputs) if req.get("check", True) else None
        data = _DATA[key] = (w, inputs, expected)
    return data


def _short_error(exc: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    tb = traceback.extract_tb(exc.__traceback__)
    where = tb[-1] if tb else None
    if where:
        text += f" (at {os.path.basename(where.filename)}:{where.lineno})"
    return text[:limit]


def time_callable(fn: Callable[[], Any], warmup: int, repeat: int, min_repeat_ms: float,
                  max_time_s: float, cutoff_s: float | None = None,
                  before: Callable[[], Any] | None = None) -> tuple[list[float], dict]:
    """Seconds per call for each of up to ``repeat`` samples of at least ``min_repeat_ms``.
    With ``before`` (the ``cache_flush`` option's eviction) each sample, the probe included,
    is one call with ``before()`` run untimed just ahead of it.

    The first timed call (the probe) is checked against ``cutoff_s`` (the tuner passes a
    multiple of the best time so far): a slower candidate keeps the probe as its only sample,
    one call, and says so. Otherwise warm-up runs ``warmup`` calls and at least
    ``min_repeat_ms`` of calls (only while calls are cheap), and ``number``, the calls per
    sample, comes from the fastest warm call, not the cold probe. (Measured: a 2-thread GEMV
    whose probe took 3.3 ms got 15 calls per sample and a median of 0.57 ms per call, cold
    caches and a sleeping second core included; warmed, it measures 0.32 ms, as a script
    running it back to back does.) When the whole measurement would exceed ``max_time_s`` (a
    slow candidate) fewer samples are taken, at least 3.
    """
    if before is not None:
        before()
    t0 = time.perf_counter()
    fn()
    probe = max(time.perf_counter() - t0, 1e-9)
    if cutoff_s is not None and probe > cutoff_s:
        return [probe], {"number": 1, "cut_short": True}
    warm_s = probe
    if probe <= 0.1 * max_time_s:
        started, calls = time.perf_counter(), 0
        budget = min(0.1 * max_time_s, max(min_repeat_ms / 1000.0, 0.0))
        while calls < max(0, warmup) or time.perf_counter() - started < budget:
            t1 = time.perf_counter()
            fn()
            warm_s = min(warm_s, max(time.perf_counter() - t1, 1e-9))
            calls += 1
    number = 1 if before is not None else max(1, int(min_repeat_ms / 1000.0 / warm_s + 0.999))
    per_sample = warm_s * number
    if per_sample * repeat > max_time_s:
        repeat = max(3, min(repeat, int(max_time_s / per_sample)))
    samples, cpu = [], []
    for _ in range(repeat):
        if before is not None:
            before()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
        cpu.append((time.process_time() - c0) / number)
    # CPU seconds of the whole process per call: on a shared machine, for a 1-thread kernel,
    # the figure that time slices taken by other processes do not inflate
    return samples, {"number": number, "cpu_samples": cpu, **({"cache_flush": True} if before else {})}


def time_placements(fn: Callable[..., Any], w, inputs, outputs, expected, req: dict,
                    prepared: tuple = ()):
    """Time ``fn(*inputs, *outputs)`` on ``req["placements"]`` placements of fresh copies
    (with ``req["cache_flush"]``: ``prepared``, the kernel's prepared operands, and the
    inputs but the first evicted before each call, ``tuner.measure.cache_flush``).

    Each placement gets its own warm-up and ``ceil(repeat / placements)`` (at least 3)
    samples within its share of ``max_time_s``. (The warm-up is not redundant after the
    placement's checked call: skipping it made 2-thread kernels measure 1.6-1.8x slower than
    they run in a script — 21.8 vs 13.4 ms at 1024^3 on the Zen 3 — since the check leaves
    Numba's threads asleep and the sample size was then sized from a cold call.) The score
    must not reward one lucky
    placement, so the samples returned are those of the placement with the slowest median:
    a script calling the kernel gets whatever placement its allocator gives, and the slowest
    one is what the tuner can promise (the median across placements would still crown a
    config fast on most placements and twice as slow on the rest). Returns (samples, info)
    or an error reply: each placement's first output is checked, so a kernel right only
    where its buffers are aligned is a WRONG_ANSWER naming the placement. Per placement,
    ``cpu_median`` is the median CPU time per call (see ``time_callable``);
    ``cpu_placement_spread`` its spread, which on a busy machine tells placement effects
    from time-slicing.

    Two shortcuts for candidates that cannot win (the tuner passes both as multiples of the
    best median so far): the first placement's checked call is timed, and when it is slower
    than ``cutoff_s`` it is the candidate's one sample (``cut_short``: no further call);
    when the first placement's median exceeds ``placement_cut_s`` the other placements are
    not timed (``placements_cut``): their slowest median could only be slower still, so the
    candidate's score stays above the cut. Racing (``race_cut_s``, the best score so far):
    from the second placement on, a candidate whose slowest placement so far is slower than
    that score cannot become the best, and the rest are not timed either (its samples are
    the slowest placement's so far; ``placements_cut`` counts those skipped). Measured on a
    64-trial 1024^3 search (Zen 5, 2 threads): 30 of 64 candidates stopped after 2-3
    placements, ~10 s of 34 s of timing saved (docs/measurement.md).
    """
    from tuner.measure.placement import placed_copies, rotation, spread

    n = max(1, int(req.get("placements", 1)))
    per_repeat = max(3, -(-int(req["repeat"]) // n)) if n > 1 else int(req["repeat"])
    per_time = float(req["max_time_s"]) / n
    found: list[tuple[float, list[float], dict, list[float]]] = []
    plan = rotation(n, len(inputs) + len(outputs))   # at most n (the table's length)
    for offsets in plan:
        if req.get("placements") is None:     # no rotation asked for: the given buffers
            ins, outs = inputs, outputs
        else:
            arrays = placed_copies([*inputs, *outputs], offsets)
            ins, outs = arrays[:len(inputs)], arrays[len(inputs):]
        cutoff = req.get("cutoff_s") if not found else None
        if expected is not None and ins is not inputs:   # right wherever the buffers start
            t0 = time.perf_counter()
            fn(*ins, *outs)
            checked = max(time.perf_counter() - t0, 1e-9)
            with serial_blas():
                problem = w.check(ins, outs, expected)
            if problem:
                return {"status": "WRONG_ANSWER", "error": f"placement {offsets}: {problem}"}
            if cutoff is not None and checked > cutoff:   # the checked call is the probe
                one = {"offsets": list(offsets), "median": checked, "samples": 1, "number": 1}
                return [checked], {"number": 1, "cut_short": True, "placements": [one]}
        before = None
        if req.get("cache_flush"):
            from tuner.measure.cache_flush import evict, flushed_operands

            flushed = flushed_operands(ins, prepared)
            before = lambda: evict(flushed)   # noqa: E731
        samples, timing = time_callable(lambda: fn(*ins, *outs), req["warmup"], per_repeat,
                                        req["min_repeat_ms"], per_time, cutoff, before)
        med = sorted(samples)[len(samples) // 2]
        cpu = timing.get("cpu_samples") or [0.0]
        found.append((med, samples, {"offsets": list(offsets), "median": med,
                                     "cpu_median": sorted(cpu)[len(cpu) // 2],
                                     "samples": len(samples), "number": timing["number"]}, cpu))
        if timing.get("cut_short"):
            return samples, {**timing, "placements": [found[-1][2]]}
        cut = req.get("placement_cut_s")
        if len(found) == 1 and n > 1 and cut is not None and med > cut:
            return samples, {"number": timing["number"], "placements": [found[-1][2]],
                             "placements_cut": n - 1, "cpu_samples": cpu}
        race = req.get("race_cut_s")
        if 1 < len(found) < len(plan) and race is not None and max(f[0] for f in found) > race:
            break   # raced out: scored below on the placements timed, the rest counted as cut
    slowest = max(found, key=lambda f: f[0])
    medians = [f[0] for f in found]
    info = {"number": slowest[2]["number"], "placements": [f[2] for f in found],
            "placement_spread": spread(medians), "placement_rule": "slowest",
            "cpu_placement_spread": spread([f[2]["cpu_median"] for f in found]),
            "cpu_samples": slowest[3]}
    if len(found) < len(plan):
        info["placements_cut"] = len(plan) - len(found)
    return slowest[1], info


def _pin(threads: int) -> None:
    """Pin the calling thread to the first ``threads`` CPUs this process may use."""
    try:
        if not _ALLOWED_CPUS:
            _ALLOWED_CPUS.extend(sorted(os.sched_getaffinity(0)))
        os.sched_setaffinity(0, _ALLOWED_CPUS[:max(1, threads)])
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        pass


def build(req: dict) -> dict:
    import numba
    import numpy as np

    t0 = time.perf_counter()
    try:
        mod = _load_module(req["path"])
        fn = getattr(mod, req.get("entry", "kernel"))
        if isinstance(fn, numba.core.dispatcher.Dispatcher):
            sig = tuple(numba.typeof(np.empty((1,) * len(shape), dtype=dtype))
                        for shape, dtype in req["arg_specs"])
            sig += tuple(numba.typeof(a) for a in req.get("runtime_args", ()))
            # ``prepared_only``: the caller runs the prepared form alone (a measurement, a
            # model whose prepared operands are constants): the entry, which would compile
            # prepare and kernel_prepared once more inlined into itself, is left uncompiled
            if not (req.get("prepared") and req.get("prepared_only")):
                fn.compile(sig)
            if req.get("prepared"):   # the prepared form too (what a built model calls)
                _compile_prepared(mod, req)
    except Exception as exc:  # noqa: BLE001 - any failure of user code is a status
        return {"status": "COMPILE_ERROR", "error": _short_error(exc),
                "compile_time": time.perf_counter() - t0}
    return {"status": "OK", "compile_time": time.perf_counter() - t0}


def _compile_prepared(mod, req: dict) -> None:
    """Compile ``prepare`` and ``kernel_prepared`` (search_spaces/template.py) for the
    workload's argument types (``arg_specs``: inputs, then outputs; ``n_inputs`` of them
    inputs): ``prepare`` on zero arrays of the prepared inputs' shapes gives the types of
    what ``kernel_prepared`` takes after the inputs not prepared."""
    import numba
    import numpy as np

    specs, idx, n_in = req["arg_specs"], list(req["prepared"]), int(req["n_inputs"])
    prepared = mod.prepare(*(np.zeros(specs[i][0], specs[i][1]) for i in idx))
    typ = [numba.typeof(np.empty((1,) * len(shape), dtype)) for shape, dtype in specs]
    sig = tuple(t for k, t in enumerate(typ[:n_in]) if k not in idx)
    sig += tuple(numba.typeof(a) for a in prepared) + tuple(typ[n_in:])
    sig += tuple(numba.typeof(a) for a in req.get("runtime_args", ()))
    mod.kernel_prepared.compile(sig)


def run(req: dict) -> dict:
    import numba

    threads = int(req.get("threads", 1))
    _pin(threads)
    try:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except ValueError as exc:
        return {"status": "RUNTIME_ERROR", "error": f"cannot use {threads} threads: {exc}"}
    w, inputs, expected = _workload(req)
    try:
        from search_spaces.template import bind_runtime_args

        mod = _load_module(req["path"])
        compiled = getattr(mod, req.get("entry", "kernel"))
        fn = bind_runtime_args(compiled, tuple(req.get("runtime_args", ())))
        if req.get("prepared"):   # constant operands prepared once, outside the timed calls
            from search_spaces.template import prepare_kernel

            fn = prepare_kernel(mod, tuple(req["prepared"]), inputs,
                                tuple(req.get("runtime_args", ())))
            compiled = mod.kernel_prepared
    except Exception as exc:  # noqa: BLE001
        return {"status": "COMPILE_ERROR", "error": _short_error(exc)}
    outputs = w.make_outputs()
    args = [*inputs, *outputs]
    info: dict[str, Any] = {"prepared": list(req["prepared"])} if req.get("prepared") else {}
    if req.get("cache_flush"):   # every reply, cut-short ones included, says how it was timed
        info["cache_flush"] = True
    try:
        load_only = (req.get("placements") is not None and not req.get("prepared")
                     and isinstance(compiled, numba.core.dispatcher.Dispatcher))
        if load_only:
            # loaded from Numba's cache without a call: the first placement's checked call is
            # the first call (a slow candidate's one probe, not one call more)
            compiled.compile(tuple(numba.typeof(a)
                                   for a in (*args, *req.get("runtime_args", ()))))
        else:
            fn(*args)  # first call: loads Numba's cache; its output is the one checked
        stats = getattr(compiled, "stats", None)
        if stats is not None:
            info["cache_hits"] = sum(stats.cache_hits.values())
            info["cache_misses"] = sum(stats.cache_misses.values())
        if expected is not None and not load_only:
            with serial_blas():
                problem = w.check(inputs, outputs, expected)
            if problem:
                return {"status": "WRONG_ANSWER", "error": problem, "info": info}
        timed = time_placements(fn, w, inputs, outputs, expected, req,
                                getattr(fn, "prepared", ()) if req.get("prepared") else ())
    except Exception as exc:  # noqa: BLE001
        return {"status": "RUNTIME_ERROR", "error": _short_error(exc), "info": info}
    if isinstance(timed, dict):
        return {**timed, "info": info}
    samples, timing = timed
    return {"status": "OK", "samples": samples, "info": {**info, **timing}}


def baseline(req: dict) -> dict:
    """Time the workload's NumPy baseline (``A @ B`` for GEMM) with BLAS limited to ``threads``."""
    from threadpoolctl import threadpool_info, threadpool_limits

    threads = int(req.get("threads", 1))
    _pin(threads)
    w, inputs, _ = _workload({**req, "check": False})
    outs = w.make_outputs()
    with threadpool_limits(limits=threads, user_api="blas"):
        n_in = len(inputs)
        samples, timing = time_placements(lambda *a: w.baseline(list(a[:n_in]), list(a[n_in:])),
                                          w, inputs, outs, None, req)
        blas = [{k: p.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
                for p in threadpool_info() if p.get("user_api") == "blas"]
    if threads > 1:   # let OpenBLAS's pool threads stop spinning before a kernel is timed
        time.sleep(BLAS_SPIN_S)
    return {"status": "OK", "samples": samples,
            "info": {**timing, "impl": w.baseline_name, "blas": blas}}


def overhead(req: dict) -> dict:
    """Fixed cost of one call: an empty Numba function taking three small arrays (dispatch,
    type checks, unboxing) beside NumPy's ``matmul`` on 1x1 operands (ufunc machinery)."""
    import numba
    import numpy as np

    @numba.njit
    def empty(a, b, c):
        pass

    dtype = req.get("dtype", "float32")
    a, b, c = (np.ones((1, 1), dtype=dtype) for _ in range(3))
    empty(a, b, c)
    nb, _ = time_callable(lambda: empty(a, b, c), 1, 7, 20.0, 2.0)
    npy, _ = time_callable(lambda: np.matmul(a, b, out=c), 1, 7, 20.0, 2.0)
    return {"status": "OK", "numba_call_s": sorted(nb)[len(nb) // 2],
            "numpy_call_s": sorted(npy)[len(npy) // 2]}


JOBS = {"build": build, "run": run, "baseline": baseline, "overhead": overhead,
        "ping": lambda req: {"status": "OK"}}


def serve(read_fd: int, write_fd: int) -> None:
    """Entry point of a worker process: serve (job, request) pairs until the pipe closes.

    Started by ``tuner.measure.pool.Worker`` as ``python -c ...serve(r, w)`` with its
    environment (NUMBA_NUM_THREADS, NUMBA_CACHE_DIR) already set and stdout/stderr in a log.
    """
    from multiprocessing.connection import Connection

    requests = Connection(read_fd, writable=False)
    replies = Connection(write_fd, readable=False)
    while True:
        try:
            job, req = requests.recv()
        except (EOFError, OSError):
            return
        try:
            reply = JOBS[job](req)
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer
            reply = {"status": "RUNTIME_ERROR", "error": "worker: " + _short_error(exc)}
        replies.send(reply)
