"""What shape-generic conv2d kernels cost against literal shapes (docs/compile-once.md).

``python -m tuner.bench.shape_literals MODEL LAYER [--literal all|none|default|NAMES] [--calls N]
[--time ROUNDS] [--key]``: the conv2d group ``LAYER`` of MODEL (``stem``, ``1x1``, ``3x3``,
``3x3s2``: the first conv2d group with that window and stride; or a workload key, as
``--key`` prints, with any MODEL: no graph passes, which valgrind makes slow), untuned
default config, 1 thread, generated with the named dimensions as module constants (``all``: every one, as
before shape-generic modules; ``none``: every one an argument; ``default``: the template's
own choice (``literal_dims``; a direct conv's stride an argument); else comma-separated names,
e.g. ``KH,KW``), loaded (compiled at the first run, from the kernel cache after),
checked, then called N times. Meant to run under ``valgrind --tool=callgrind
--collect-atstart=no --toggle-collect='*call_cfunc*'`` (instruction counts of the N calls
only, load-independent) after one run outside valgrind has compiled it. ``--time ROUNDS``
instead times the all-literal kernel and the one with ``--literal`` interleaved (CPU time per call,
median over rounds) in this process.
"""
from __future__ import annotations

import argparse
import sys
import time

LAYERS = {"stem": (7, 2), "1x1": (1, 1), "3x3": (3, 1), "3x3s2": (3, 2)}


def workload(model: str, layer: str):
    from tuner.compiler.compile_model import pipeline
    from tuner.frontend import load_model
    from workloads.fused import workload_for_group
    from workloads.graph.fusion import fused_groups

    if ":" in layer:
        import workloads
        return workloads.from_spec(layer)
    kh, sh = LAYERS[layer]
    g = pipeline(load_model(model))   # the default level, as `build` runs it
    for node in fused_groups(g):
        try:
            w = workload_for_group(node)
        except Exception:  # noqa: BLE001 - not a generated group
            continue
        if w.kind == "conv2d" and (w.geometry["KH"], w.geometry["SH"]) == (kh, sh):
            return w
    raise SystemExit(f"{model}: no conv2d group with a {kh}x{kh} window, stride {sh}")


def kernel(w, literal: tuple[str, ...] | None):
    """The bound kernel of the default config with ``literal`` dimensions as constants (None:
    the template's own choice, whose direct convs take the stride as an argument)."""
    from search_spaces.template import bind_runtime_args, kernel_source
    from search_spaces.templates.conv2d import Conv2dTemplate
    from tuner.dispatch import align_numba_cache
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.measurer import write_source

    align_numba_cache()
    t = Conv2dTemplate() if literal is None else \
        type("Conv2dLiteral", (Conv2dTemplate,), {"literal_dims": literal, "window_runtime_dims": ()})()
    cfg = t.default_config(w, 1)
    mod = import_kernel_module(write_source(kernel_source(t, w, cfg), template=t))
    return bind_runtime_args(mod.kernel, t.runtime_args(w, cfg)), cfg


ALL = ("M", "N", "K", "TILE_M", "TILE_N", "TILE_K", "H", "W", "CI", "KH", "KW", "OH", "OW",
       "SH", "SW", "PT", "PL", "DH", "DW", "IMAGES", "GROUPS", "CG")


def main(argv: list[str]) -> int:
    import numba
    import numpy as np

    p = argparse.ArgumentParser(prog="python -m tuner.bench.shape_literals",
                                description=__doc__.strip().splitlines()[0])
    p.add_argument("model")
    p.add_argument("layer", help=f"{', '.join(sorted(LAYERS))} or a workload key")
    p.add_argument("--literal", default="none")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--time", type=int, default=0, metavar="ROUNDS")
    p.add_argument("--key", action="store_true", help="print the layer's workload key and stop")
    a = p.parse_args(argv)
    if ":" not in a.layer and a.layer not in LAYERS:
        p.error(f"LAYER: one of {', '.join(sorted(LAYERS))} or a workload key")
    numba.set_num_threads(1)
    w = workload(a.model, a.layer)
    if a.key:
        print(w.key)
        return 0
    lit = {"all": ALL, "none": (), "default": None}.get(a.literal, tuple(a.literal.split(",")))
    fns = {"literal": kernel(w, ALL)[0], "runtime": kernel(w, lit)[0]} if a.time \
        else {a.literal: kernel(w, lit)[0]}
    ins = w.make_inputs()
    ref = w.reference(ins)
    out = w.make_outputs()
    for name, fn in fns.items():
        fn(*ins, *out)
        problem = w.check(ins, out, ref)
        if problem:
            raise SystemExit(f"{name}: {problem}")
    g = w.geometry
    print(f"{a.layer if ':' not in a.layer else w.anchor}: {g['C']}x{g['H']}x{g['W']} -> {g['O']}x{g['OH']}x{g['OW']}, "
          f"{g['KH']}x{g['KW']} stride {g['SH']}, config {kernel(w, ())[1].to_json()}")
    if not a.time:
        (fn,) = fns.values()
        for _ in range(a.calls):
            fn(*ins, *out)
        return 0
    t0 = time.process_time()
    fns["literal"](*ins, *out)
    calls = max(1, int(0.05 / max(time.process_time() - t0, 1e-6)))
    res: dict[str, list[float]] = {m: [] for m in fns}
    order = list(fns.items())
    for r in range(a.time):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            c0 = time.process_time()
            for _ in range(calls):
                fn(*ins, *out)
            res[name].append((time.process_time() - c0) / calls)
    lit_med = float(np.median(res["literal"]))
    for name, v in res.items():
        med = float(np.median(v))
        print(f"{name:8s} median {med * 1e3:8.3f} ms  min {min(v) * 1e3:8.3f}  vs literal {med / lit_med:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
