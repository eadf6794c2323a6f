"""A core's floating-point peak, two ways: measured FMA throughput (``measured_fma_gflops``,
what ``peak_gflops`` and ``bench gemm``'s "% peak" use), and an estimate from the measured
frequency x FLOPs per cycle (``estimated_peak_gflops``), below.

The estimate's table can be wrong for a CPU it does not name, and a VM's clock reading can
be off: on the Intel Xeon VM of 2026-12-03 (LLVM ``rocketlake``) the estimate was 298 fp32
GFLOPS per core, the measured FMA throughput 198, so "% peak" read 48% for OpenBLAS's 146
GFLOPS where 74% of what the core can do was the truth (docs/isa.md).

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


def _best_thread_seconds(fn, *args) -> float:
    """The fastest of three calls ``fn(*args)`` in this thread's CPU seconds (a busy shared
    machine does not halve it, as it would wall time)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        fn(*args)
        best = min(best, time.thread_time() - t0)
    return best


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
    return n / _best_thread_seconds(chain, n // 4, 1) / 1e9


def estimated_peak_gflops(target, dtype: str, threads: int) -> float | None:
    """Measured clock x the table's FMA lanes per cycle x 2 FLOPs x threads."""
    if dtype not in ("float32", "float64"):
        return None
    lanes = fma_lanes_fp32(target) // (2 if dtype == "float64" else 1)
    return measured_ghz() * lanes * 2 * threads


_FMA_CHAINS = 12   # independent accumulators: enough for 2 pipes x 4-6 cycles of latency,
                   # and with the two operands they fit AVX2's 16 registers


@functools.lru_cache(maxsize=None)
def measured_fma_gflops(dtype: str = "float32", n: int = 5_000_000) -> float:
    """One core's fused multiply-add throughput at the compile target's vector width
    (``search_spaces.isa``: what the kernels are generated for, ``TUNER_CPU`` included):
    ``_FMA_CHAINS`` independent vector accumulators each updated by ``vfma`` (``llvm.fma``)
    ``n`` times, in registers, no memory traffic; FLOPs per second of this thread's CPU
    time, best of three. No kernel can beat it on this core."""
    import numpy as np
    import numba

    from search_spaces import isa

    lanes, k = isa.current().lanes(dtype), _FMA_CHAINS
    lines = ["from search_spaces.runtime.simd import vfma, vload, vstore",
             "def fma_chains(x, n):"]
    lines += [f"    a{i} = vload(x, {i * lanes}, {lanes})" for i in range(k + 2)]
    lines += ["    for _ in range(n):"]
    lines += [f"        a{i} = vfma(a{i}, a{k}, a{k + 1})" for i in range(k)]
    lines += [f"    vstore(x, {i * lanes}, a{i})" for i in range(k)]
    ns: dict = {}
    exec(compile("\n".join(lines), "<fma_chains>", "exec"), ns)
    fn = numba.njit(ns["fma_chains"])
    x = np.full((k + 2) * lanes, 0.5, dtype)
    x[k * lanes:] = 0.999        # a <- a * 0.999 + 0.999: bounded, no denormals
    fn(x, 10)
    return k * n * lanes * 2 / _best_thread_seconds(fn, x, n) / 1e9


def peak_gflops(target, dtype: str, threads: int) -> float | None:
    """The measured FMA throughput of one core (``measured_fma_gflops``) x threads: the
    denominator of "% peak". None for an integer dtype."""
    if dtype not in ("float32", "float64"):
        return None
    return measured_fma_gflops(dtype) * threads


@functools.lru_cache(maxsize=None)
def measured_dot_gops(dot: str, n: int = 2_000_000) -> float:
    """One core's integer dot-product throughput for formulation ``dot`` (``maddubs``:
    ``vpmaddubsw`` then ``vpmaddwd`` by ones; ``madd16``: ``vpmaddwd``; ``vnni``:
    ``vpdpbusd``) at the compile target's vector width: the int8 micro-kernel's inner loop
    from L1, i.e. per iteration 2 B vectors and R A groups (``vbroadcast_group``) read from
    small arrays at an offset that moves with the loop counter (a multiply whose operands
    do not change would be hoisted out of the loop), R x 2 int32 accumulators each updated by
    ``vdot_<dot>``; R = 4 for ``maddubs`` (each dot needs a temporary: 8 accumulators fit
    AVX2's 16 registers, as the micro-kernel's default 4 x 16 tile), 6 otherwise. Operations
    (2 per multiply-add) per second of this thread's CPU time, best of three: what an int8
    GEMM on this core cannot beat. Set beside ``measured_fma_gflops`` it says what INT8 can
    gain over FP32 in arithmetic here (AMD Zen 2 runs both 256-bit integer multiplies on one
    pipe and FMAs on two: about 1x; docs/int8-gemm.md)."""
    import numpy as np
    import numba

    from search_spaces import isa
    from search_spaces.runtime.simd_int8 import OPERANDS

    group, a_type, b_type = OPERANDS[dot]
    lanes = isa.current().lanes("int32")
    rows, step = (4 if dot == "maddubs" else 6), 8    # 8 offsets the loop cycles through
    per_a, per_b = rows * 4 // np.dtype(a_type).itemsize, 2 * lanes * group
    lines = ["from search_spaces.runtime.simd import vload, vsplat, vstore",
             f"from search_spaces.runtime.simd_int8 import vbroadcast_group, vdot_{dot}",
             "import numpy as np",
             "def dot_chains(aw, bw, out, n):"]
    lines += [f"    c{r}_{v} = vsplat(np.int32(0), {lanes})" for r in range(rows) for v in range(2)]
    lines += ["    for i in range(n):",
              f"        ia, ib = (i & {step - 1}) * {per_a}, (i & {step - 1}) * {per_b}"]
    lines += [f"        b{v} = vload(bw, ib + {v * lanes * group}, {lanes * group})" for v in range(2)]
    for r in range(rows):
        lines.append(f"        a{r} = vbroadcast_group(aw, ia + {r * 4 // np.dtype(a_type).itemsize}, {lanes})")
        lines += [f"        c{r}_{v} = vdot_{dot}(c{r}_{v}, a{r}, b{v})" for v in range(2)]
    lines += [f"    vstore(out, {(r * 2 + v) * lanes}, c{r}_{v})" for r in range(rows) for v in range(2)]
    ns: dict = {}
    exec(compile("\n".join(lines), f"<dot_chains_{dot}>", "exec"), ns)
    fn = numba.njit(ns["dot_chains"])
    rng = np.random.default_rng(0)
    aw = rng.integers(0, 8, step * per_a).astype(a_type)
    bw = rng.integers(-8, 8, step * per_b).astype(b_type)
    out = np.zeros(rows * 2 * lanes, np.int32)
    fn(aw, bw, out, 10)
    return rows * 2 * n * lanes * group * 2 / _best_thread_seconds(fn, aw, bw, out, n) / 1e9


def core_peaks() -> dict:
    """One core's measured arithmetic ceilings: the fp32 FMA throughput in GFLOPS and, per int8 dot-product formulation this CPU runs, its GOPS."""
    from search_spaces.templates.gemm_int8 import GemmInt8Template, supported

    tpl = GemmInt8Template()
    dots = [d for d in ("maddubs", "madd16", "vnni") if supported(d, tpl.default_vec(), tpl.features)]
    return {"fp32_fma_gflops": measured_fma_gflops("float32"), **{d: measured_dot_gops(d) for d in dots}}


def peaks_line(peaks: dict) -> str:
    """What INT8 can gain over FP32 in arithmetic on this core, one line."""
    f = peaks["fp32_fma_gflops"]
    dots = ", ".join(f"{d} {g:.1f} GOPS ({g / f:.2f}x)" for d, g in peaks.items() if d != "fp32_fma_gflops")
    return f"one core's measured ceilings: fp32 FMA {f:.1f} GFLOPS; int8 {dots}"


# Below this ratio of the best int8 dot-product ceiling to the fp32 FMA peak, INT8 cannot win
# much in arithmetic on the core, only in bytes moved: AMD Zen 2 measures 0.97x (ResNet-50 INT8
# 1.06x our FP32 build, Inception v1 0.85x), Zen 3 ~1.9x, AVX-512 VNNI cores 3-4x.
INT8_ARITHMETIC_GAIN = 1.3


def stored_core_peaks() -> dict:
    """``core_peaks()`` measured once per target key and Numba version, then read from
    ``peaks.json`` in the kernel cache (the ceilings are the machine's; ~2 s of compile and
    measurement each time otherwise). An unreadable file is measured again and rewritten."""
    import json
    import os

    import numba

    from tuner.settings import cache_dir
    from tuner.target import host_target

    path = cache_dir() / "peaks.json"
    key = f"{host_target().key} numba {numba.__version__}"
    try:
        stored = json.loads(path.read_text())
        if not isinstance(stored, dict):
            stored = {}
    except (OSError, ValueError):
        stored = {}
    if isinstance(stored.get(key), dict) and "fp32_fma_gflops" in stored[key]:
        return stored[key]
    stored[key] = core_peaks()
    tmp = path.with_name(f"peaks.json.{os.getpid()}")
    tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
    os.replace(tmp, path)   # atomic: a concurrent reader sees the old file or the new one
    return stored[key]


def int8_arithmetic_note(peaks: dict, model: str = "MODEL") -> str:
    """One line on what INT8 can gain in arithmetic on this core: the best int8 ceiling
    against the fp32 FMA peak, and a warning when that is under ``INT8_ARITHMETIC_GAIN``."""
    f = peaks["fp32_fma_gflops"]
    dot, g = max(((d, v) for d, v in peaks.items() if d != "fp32_fma_gflops"), key=lambda dv: dv[1])
    head = (f"int8 arithmetic on this core: {dot} {g:.0f} GOPS = {g / f:.2f}x the fp32 FMA peak "
            f"({f:.0f} GFLOPS, measured)")
    if g / f >= INT8_ARITHMETIC_GAIN:
        return head
    return (f"note: {head}: INT8 saves bytes here, not arithmetic, and may run slower than the "
            f"FP32 build; compare both (`python -m tuner bench model {model} --groups LE`)")
