"""Where a model's cold build spends its compile time, per module and per Numba function.

``python -m tuner.bench.compile_profile MODEL [--threads N] [--top K] [--functions]``: plans
the model's kernels as an untuned build does (template defaults), then compiles every
distinct (module, argument types) pair the build would compile, one after the other in
this process, into a fresh Numba cache (a temporary directory: nothing is read from or
left in ``$TUNER_CACHE``). For every module: the CPU time of its compile and the number of
Numba functions compiled; for every function (``--functions``): its exclusive compile CPU
time (its own, without the functions it calls, which compile during its type inference),
split in the proportion of its own wall time in the front end (bytecode to typed IR, type
inference) and in lowering (Numba's lowering, the LLVM optimisation of the function with
its callees linked in, machine code; for a parallel function also its parfor lowering).

The first module compiled also pays for the shared runtime helpers (``search_spaces.runtime``),
so modules are compiled largest-template first and the first figure is indicative only.
Timings are CPU times of one process (``time.process_time``), less disturbed by other jobs
than wall time, but still load-sensitive: label them with the load.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict


class FunctionTimes:
    """Exclusive compile times per Numba function, from ``numba:compile`` events (nested: a
    callee compiles during its caller's type inference)."""

    def __init__(self):
        self.stack: list[list] = []          # [name, CPU start, wall start, child CPU, child wall]
        self.exclusive: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.children: dict[str, float] = defaultdict(float)
        self.children_wall: dict[str, float] = defaultdict(float)

    def listener(self):
        from numba.core import event

        times = self

        class _L(event.Listener):
            def on_start(self, ev):
                disp = ev.data["dispatcher"]
                times.stack.append([disp.py_func.__name__, time.process_time(),
                                    time.perf_counter(), 0.0, 0.0])

            def on_end(self, ev):
                name, t0, w0, child, child_wall = times.stack.pop()
                total, wall = time.process_time() - t0, time.perf_counter() - w0
                times.exclusive[name] += total - child
                times.children[name] += child
                times.children_wall[name] += child_wall
                times.calls[name] += 1
                if times.stack:
                    times.stack[-1][3] += total
                    times.stack[-1][4] += wall
        return _L()


def _stages(mod) -> dict[str, tuple[float, float]]:
    """(front end, lowering) wall seconds per function of a compiled module from Numba's
    pipeline timings, the front end with its callees' compiles (the caller subtracts
    ``FunctionTimes.children_wall``); lowering includes the parfor lowering of a parallel
    function (its body compiled again as a gufunc)."""
    import numba

    out: dict[str, tuple[float, float]] = {}
    for name, obj in vars(mod).items():
        if not isinstance(obj, numba.core.dispatcher.Dispatcher):
            continue
        front = lower = 0.0
        for cres in obj.overloads.values():
            for pname, t in cres.metadata.get("pipeline_times", {}).get("nopython", {}).items():
                secs = t.init + t.run + t.finalize
                if "lowering" in pname:
                    lower += secs
                else:
                    front += secs
        out[name] = (front, lower)
    return out


def profile(path: str, threads: int = 1) -> list[dict]:
    """One dict per compiled (module, argument types): template, variant line, CPU seconds,
    functions compiled and per-function (exclusive, front end, lowering) seconds."""
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-profile-")
    import numba.core.config

    numba.core.config.reload_config()
    from numba.core import event

    from tuner.compiler.compile_model import build_request, compiled_kernels, pipeline
    from tuner.frontend import load_model
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.worker import build as compile_request

    g = pipeline(load_model(path))   # the default level, as `build` runs it
    kernels = compiled_kernels(g, threads=threads, tuned=False)   # what `build` compiles
    todo: dict[tuple, object] = {}
    for k in kernels.values():
        if k.path is None:
            continue
        sig = (k.path, tuple((len(s), str(d)) for s, d in
                             k.workload.input_specs() + k.workload.output_specs()))
        todo.setdefault(sig, k)
    rows = []
    for (_path, _sig), k in sorted(todo.items(), key=lambda kv: kv[1].template.name):
        ft = FunctionTimes()
        lst = ft.listener()
        event.register("numba:compile", lst)
        t0 = time.process_time()
        try:
            reply = compile_request(build_request(k))
        finally:
            event.unregister("numba:compile", lst)
        cpu = time.process_time() - t0
        stages = _stages(import_kernel_module(k.path))
        funcs = {}
        for name, excl in ft.exclusive.items():
            # the exclusive CPU time split in the proportion of the function's own wall time
            front, lower = stages.get(name, (0.0, 0.0))
            front = max(0.0, front - ft.children_wall[name])
            share = front / (front + lower) if front + lower > 0 else 0.0
            funcs[name] = (excl, excl * share, excl * (1 - share))
        first = k.path.read_text().split('"""', 2)[1].splitlines()[0]
        rows.append({"template": k.template.name, "module": k.path.stem, "variant": first,
                     "status": reply.get("status"), "cpu": cpu,
                     "functions": sum(ft.calls.values()), "per_function": funcs})
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.bench.compile_profile",
                                description=__doc__.strip().splitlines()[0])
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--functions", action="store_true", help="per-function times of every module")
    p.add_argument("--top", type=int, default=0, help="only the K slowest modules")
    args = p.parse_args(argv)
    if not os.path.isfile(args.model):
        print(f"compile_profile: no such model file: {args.model}", file=sys.stderr)
        return 2
    rows = profile(args.model, args.threads)
    total = sum(r["cpu"] for r in rows)
    by_fn: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    shown = sorted(rows, key=lambda r: -r["cpu"])[: args.top or None]
    print(f"{len(rows)} compiles, {total:.1f} s CPU (one process, fresh Numba cache)")
    for r in shown:
        print(f"{r['cpu']:6.2f} s  {r['functions']:3d} fn  {r['template']:12s} {r['module'][:14]}  {r['variant'][:90]}")
        if args.functions:
            for name, (excl, front, lower) in sorted(r["per_function"].items(), key=lambda kv: -kv[1][0]):
                print(f"          {excl:6.3f} s  front {front:6.3f}  lowering {lower:6.3f}  {name}")
    for r in rows:
        for name, (excl, front, lower) in r["per_function"].items():
            acc = by_fn[name]
            acc[0] += excl
            acc[1] += front
            acc[2] += lower
            acc[3] += 1
    print("\nper function name, summed over modules (exclusive s, front end, lowering, modules):")
    for name, (excl, front, lower, n) in sorted(by_fn.items(), key=lambda kv: -kv[1][0]):
        print(f"  {excl:7.2f}  {front:7.2f}  {lower:7.2f}  {n:3d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
