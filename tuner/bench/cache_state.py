"""``bench cache MODEL``: each kernel of a built model timed three ways — in the model, back to
back, and with its operands evicted (the ``cache_flush`` measurement) — to show which
stand-in for the model a tuning measurement should be on this CPU.

In the model (``Module.profile``, the best of ``rounds`` medians) a step meets its input as the
step before left it and its weights as one inference ago left them: usually in memory. Back to
back (the tuning worker's default) every operand stays where the last call put it. Flushed, the
step's operands other than its first input and its output (its weights, as the kernel reads
them, and residual operands) are evicted from every cache level before each call
(``tuner.measure.cache_flush``). Ratios: model time / stand-in time (1.0: the stand-in
predicts the model)."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np


def _median_call(fn, args, before=None, calls: int = 11) -> float:
    times = []
    for _ in range(calls):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times[2:]))


def bench_cache(path: str, *, threads: int = 1, opt_level: int | None = None,
                kinds: tuple[str, ...] = ("conv2d", "dense"), rounds: int = 3, seed: int = 0,
                db: str | None = None, log: Callable[[str], None] = print) -> dict:
    from tuner.compiler.compile_model import build
    from tuner.measure.cache_flush import evict, flushed_operands
    from tuner.target import host_target
    from workloads.graph.executor import random_inputs

    if path.endswith(".onnx"):   # seeded random weights, as bench model and verify use
        from tuner.compiler.verify_model import prepare

        _, graph = prepare(path, seed)
    else:
        from tuner.frontend import load_model

        graph = load_model(path)
    inputs = random_inputs(graph, seed=1)
    m = build(graph, threads=threads, db=db, opt_level=opt_level)
    in_model: dict[int, float] = {}   # by step: profile lists the steps that run a kernel
    for _ in range(max(1, rounds)):
        for s, t in m.profile(inputs, repeat=7):
            in_model[id(s)] = min(in_model.get(id(s), float("inf")), t)
    rows = []
    for s in m.steps:
        if s.fn is None or s.kind not in kinds:
            continue
        flushed = flushed_operands(s.args[:-1])   # a step's args: its inputs..., its output
        warm = _median_call(s.fn, s.args)
        cold = _median_call(s.fn, s.args, before=lambda: evict(flushed))
        rows.append({"step": s.name, "label": s.label, "kind": s.kind, "config": s.config,
                     "shapes": [list(a.shape) for a in s.args if hasattr(a, "shape")][:2],
                     "model_s": in_model[id(s)], "back_to_back_s": warm, "flushed_s": cold})
    totals = {key: sum(r[key] for r in rows) for key in ("model_s", "back_to_back_s", "flushed_s")}
    data = {"kind": "bench-cache", "model": path, "threads": threads, "opt_level": m.summary.opt_level,
            "kinds": list(kinds), "rounds": rounds, "target": host_target().to_dict(),
            "rows": rows, "totals": totals}
    log(cache_markdown(data))
    return data


def cache_markdown(data: dict) -> str:
    def ms(x: float) -> str:
        return f"{x * 1e3:.3f}"

    head = ["| step | shapes | in model ms | back to back ms | flushed ms | model / back to back | model / flushed |",
            "|---|---|---|---|---|---|---|"]
    body = [f"| {r['label']} | {' '.join('x'.join(map(str, s)) for s in r['shapes'])} | {ms(r['model_s'])} | "
            f"{ms(r['back_to_back_s'])} | {ms(r['flushed_s'])} | "
            f"{r['model_s'] / r['back_to_back_s']:.2f} | {r['model_s'] / r['flushed_s']:.2f} |"
            for r in data["rows"]]
    t = data["totals"]
    body.append(f"| **sum of {len(data['rows'])} kernels** | | **{ms(t['model_s'])}** | {ms(t['back_to_back_s'])} | "
                f"{ms(t['flushed_s'])} | **{t['model_s'] / t['back_to_back_s']:.2f}** | "
                f"**{t['model_s'] / t['flushed_s']:.2f}** |")
    return "\n".join(head + body)
