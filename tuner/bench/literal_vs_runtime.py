"""What runtime cache-block arguments cost against literals (docs/compile-once.md).

``python -m tuner.bench.literal_vs_runtime SHAPE [CONFIG_JSON] [ROUNDS]``: the gemm template's
1-thread default config (with CONFIG_JSON's knobs over it) generated five ways, differing
only in which cache blocks are kernel arguments (none, tile_m, tile_n, tile_k, all three);
all five are loaded in this one process, checked, and timed interleaved on the same buffers
(forward then reversed order per round, CPU time per call, ~50 ms per sample), so machine
drift hits them alike. Prints each one's median and its ratio to the literal kernel's.
"""
from __future__ import annotations

import json
import sys
import time

MODES = {"literal": (), "tile_m": ("tile_m",), "tile_n": ("tile_n",), "tile_k": ("tile_k",),
         "all": ("tile_m", "tile_n", "tile_k")}


def kernels(w, changes: dict) -> tuple[dict, object]:
    """Mode -> bound kernel for the config, and the config."""
    from search_spaces.space import Config
    from search_spaces.template import bind_runtime_args, kernel_source
    from search_spaces.templates.gemm import GemmTemplate
    from tuner.dispatch import align_numba_cache
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.measurer import write_source

    align_numba_cache()
    cfg = Config({**GemmTemplate().default_config(w, 1), **changes})
    out = {}
    for mode, knobs in MODES.items():
        t = type("Gemm_" + mode, (GemmTemplate,), {"runtime_knobs": knobs})()
        mod = import_kernel_module(write_source(kernel_source(t, w, cfg), template=t))
        out[mode] = bind_runtime_args(mod.kernel, t.runtime_args(w, cfg))
    return out, cfg


def main(argv: list[str]) -> int:
    import numba
    import numpy as np

    from workloads.gemm import Gemm

    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    w = Gemm.parse(argv[0])
    changes = json.loads(argv[1]) if len(argv) > 1 else {}
    rounds = int(argv[2]) if len(argv) > 2 else 11
    numba.set_num_threads(1)
    fns, cfg = kernels(w, changes)
    ins = w.make_inputs(seed=1)
    ref = w.reference(ins)
    for mode, fn in fns.items():
        out = w.make_outputs()
        fn(*ins, *out)
        problem = w.check(ins, out, ref)
        if problem:
            raise SystemExit(f"{mode}: {problem}")
    out = w.make_outputs()
    fn0 = fns["literal"]
    t0 = time.process_time()
    fn0(*ins, *out)
    calls = max(1, int(0.05 / max(time.process_time() - t0, 1e-6)))
    res: dict[str, list[float]] = {m: [] for m in fns}
    order = list(fns.items())
    for r in range(rounds):
        for mode, fn in (order if r % 2 == 0 else order[::-1]):
            c0 = time.process_time()
            for _ in range(calls):
                fn(*ins, *out)
            res[mode].append((time.process_time() - c0) / calls)
    print(f"{w}, config {cfg.to_json()}, {calls} call(s) per sample, {rounds} rounds, 1 thread")
    lit = float(np.median(res["literal"]))
    for mode, v in res.items():
        med = float(np.median(v))
        print(f"{mode:8s} median {med * 1e3:9.3f} ms  min {min(v) * 1e3:9.3f}  "
              f"vs literal {med / lit:.3f}  {w.flops() / med / 1e9:6.1f} GFLOPS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
