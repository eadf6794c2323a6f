"""An estimate of the core's floating-point peak: measured frequency x FLOPs per cycle.

Frequency is measured, not read from a table: a Numba loop of dependent integer adds runs at
one add per cycle, so adds per second of this thread's CPU time is the clock the core runs at
under load (turbo included; CPU time, not wall time, so a busy shared machine does not halve
it). FLOPs per cycle come from the ISA and the number of FMA pipes per core:
- AVX-512 with two 512-bit FMA units (Skylake-SP and later Xeons): 2 x 16 fp32 FMA/cycle;
- AMD Zen 4 (znver4): AVX-512 on two 256-bit FMA pipes: 2 x 8 fp32 FMA/cycle;
- AVX2 + FMA: 2 x 8 fp32 FMA/cycle.
An FMA is 2 FLOPs; fp64 halves the lanes. The figure is an upper bound for percent-of-peak.
"""
from __future__ import annotations

import functools
import time

_FMA_LANES_FP32 = {  # per cycle per core, all FMA pipes together
    "znver4": 16, "znver5": 32, "skylake-avx512": 32, "cascadelake": 32, "cooperlake": 32,
    "icelake-server": 32, "sapphirerapids": 32, "emeraldrapids": 32, "graniterapids": 32,
}


def fma_lanes_fp32(target) -> int:
    if target.cpu_name in _FMA_LANES_FP32:
        return _FMA_LANES_FP32[target.cpu_name]
    if target.has_fma:
        return 32 if target.simd_bits == 512 else 16
    return 8 if target.simd_bits >= 256 else 4  # separate add and multiply, no FMA


@functools.lru_cache(maxsize=1)
def measured_ghz(n: int = 200_000_000) -> float:
    """Clock frequency from a chain of dependent adds (one per cycle), best of three."""
    import numba

    @numba.njit(cache=False)
    def chain(n, x):
        # each iteration: 4 dependent adds on the loop-carried value (1-cycle latency each)
        for i in range(n):
            x = (((x + i) ^ 1) + 3) ^ 5
        return x

    chain(10, 1)
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        chain(n // 4, 1)
        best = min(best, time.thread_time() - t0)
    return n / best / 1e9


def peak_gflops(target, dtype: str, threads: int) -> float | None:
    if dtype not in ("float32", "float64"):
        return None
    lanes = fma_lanes_fp32(target) // (2 if dtype == "float64" else 1)
    return measured_ghz() * lanes * 2 * threads
