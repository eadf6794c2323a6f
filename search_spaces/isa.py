"""The vector ISA the kernels are generated for: register width, lanes, register count, FMA.

One source of truth for templates and ``tuner.target``: the ISA is what Numba compiles for.
Numba compiles for the host CPU unless ``NUMBA_CPU_NAME`` names another one (``tuner.settings``
sets it from ``TUNER_CPU``, in this process and in every worker), so ``current()`` reads
Numba's configuration, not the environment: the templates and the compiler cannot disagree.

llvmlite reports the host CPU's features but cannot list a *named* CPU's, so ``KNOWN_CPUS``
holds the ISA-relevant features of the CPUs an override may name (checked against LLVM's own
code generation in ``tests/test_isa.py``).

Register budget of a micro-kernel (``spill_reason``): MR x NV accumulators, NV vectors of a B
row and one broadcast of A must all be live in the loop over K, so
``MR * NV + NV + 1 <= registers``; one more and LLVM spills an accumulator to the stack
inside the hot loop. AVX2: 16 ymm (the classic 6 x 16 fp32 tile: 12 + 2 + 1 = 15); AVX-512:
32 zmm (and 32 ymm with AVX-512VL).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass

import numpy as np

from workloads.errors import UsageError

# ISA-relevant features of CPUs an override may name (LLVM spelling, without '+').
_AVX2 = ("sse4.2", "avx", "avx2", "fma", "f16c", "bmi2")
_SKX = _AVX2 + ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
KNOWN_CPUS: dict[str, tuple[str, ...]] = {
    "generic": ("sse2",),   # Numba's NUMBA_CPU_NAME=generic (portable caches)
    "x86-64": ("sse2",),
    "x86-64-v2": ("sse2", "sse4.2"),
    "sandybridge": ("sse4.2", "avx"),
    "haswell": _AVX2,
    "broadwell": _AVX2,
    "skylake": _AVX2,
    "x86-64-v3": _AVX2,
    "znver1": _AVX2,
    "znver2": _AVX2,
    "znver3": _AVX2,
    "alderlake": _AVX2 + ("avxvnni",),
    "skylake-avx512": _SKX,
    "x86-64-v4": _SKX,
    "cascadelake": _SKX + ("avx512vnni",),
    "icelake-server": _SKX + ("avx512vnni", "avx512vbmi"),
    "sapphirerapids": _SKX + ("avx512vnni", "avx512vbmi", "avx512bf16", "avxvnni"),
    "znver4": _SKX + ("avx512vnni", "avx512vbmi", "avx512bf16"),
    "znver5": _SKX + ("avx512vnni", "avx512vbmi", "avx512bf16"),
}
# CPUs on which the GEMM template's default reads A in place with a 4 x 4-vector tile
# (measured there: templates/gemm.py, docs/isa.md): AMD Zen 5 (two 512-bit FMA pipes) and Zen 4
# (512-bit FMAs on two 256-bit pipes); other AVX-512 CPUs keep the ISA's default (the Intel
# Xeon VM measured here exposed one 512-bit FMA unit, and its refit chose 6 x 4 packed).
A_IN_PLACE_CPUS = frozenset({"znver4", "znver5"})
# The int8 GEMM's 512-bit VNNI default reads A in place on the same CPUs, keeping the packed
# default's 6 rows unless a CPU measured better with others (``templates/gemm_int8.py``,
# docs/int8-gemm.md): Zen 5 4 x 64; Zen 4 6 x 64.
INT8_IN_PLACE_ROWS = {"znver5": 4}
# Direct convs with K above one block (K > 1536) run K in blocks of this many steps on these
# CPUs (1 MB of L2 per core: a 1536 x 64 weight panel is 384 KB) instead of the core's 512:
# AMD Zen 4, `bench tiles --cache-flush`, 2026-12-07: VGG-19's K = 2304 / 4608 layers
# 1.02-1.03x, ResNet-50's 1.01-1.05x (templates/conv2d.py ``_nhwc_default``).
LONG_K_BLOCK = {"znver4": 1536}
# Features that decide what a kernel may execute (an override must be a subset of the host's).
EXECUTION_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                      "avx512vnni", "avx512bf16", "avxvnni")


@dataclass(frozen=True)
class Isa:
    """What a micro-kernel can use: the widest vector register and how many there are."""

    name: str                  # "avx512", "avx2", "avx", "sse"
    vector_bits: int           # 512, 256, 128
    registers: int             # architectural vector registers (32 zmm, 16 ymm, 16 xmm)
    fma: bool
    avx512bw: bool = False     # byte/word AVX-512 ops (int8 work)
    avx512vnni: bool = False   # vpdpbusd (int8 dot products)

    def lanes(self, dtype: str) -> int:
        """Elements of ``dtype`` in one vector register. 4-byte and narrower types count as
        fp32 lanes (the int32 GEMM's vectors are fp32-wide), 8-byte types as fp64 lanes."""
        return self.vector_bits // (64 if np.dtype(dtype).itemsize == 8 else 32)

    @property
    def fp32_lanes(self) -> int:
        return self.lanes("float32")

    @property
    def fp64_lanes(self) -> int:
        return self.lanes("float64")

    def live_registers(self, mr: int, nv: int) -> int:
        """Vector registers an MR-row, NV-vector micro-kernel keeps live in its K loop."""
        return mr * nv + nv + 1

    def spill_reason(self, mr: int, nv: int) -> str | None:
        """Why an MR x NV-vector micro-tile cannot stay in registers (None when it fits)."""
        live = self.live_registers(mr, nv)
        if live > self.registers:
            return (f"{mr * nv} accumulators + {nv} B vector(s) + 1 A broadcast = {live} vector "
                    f"registers > the {self.registers} of {self.name} (accumulators would spill)")
        return None

    def describe(self) -> str:
        extra = [n for n, on in (("fma", self.fma), ("avx512bw", self.avx512bw),
                                 ("avx512vnni", self.avx512vnni)) if on]
        return (f"{self.name}: {self.vector_bits}-bit x {self.registers} registers, "
                f"{self.fp32_lanes} fp32 / {self.fp64_lanes} fp64 lanes"
                + (f", {' '.join(extra)}" if extra else ""))


AVX512 = Isa("avx512", 512, 32, True, avx512bw=True)
AVX2 = Isa("avx2", 256, 16, True)


def isa_from_features(features) -> Isa:
    """The ISA of a feature set (names with or without a leading '+')."""
    f = {x.lstrip("+") for x in features}
    if "avx512f" in f:
        return Isa("avx512", 512, 32, "fma" in f, avx512bw="avx512bw" in f,
                   avx512vnni="avx512vnni" in f)
    if "avx" in f:
        return Isa("avx2" if "avx2" in f else "avx", 256, 16, "fma" in f)
    return Isa("sse", 128, 16, False)


def known_cpu_features(cpu: str) -> tuple[str, ...]:
    """Features of a named CPU; an unknown name is a UsageError listing the known ones."""
    try:
        return tuple(sorted(KNOWN_CPUS[cpu]))
    except KeyError:
        raise UsageError(f"unknown CPU {cpu!r} for TUNER_CPU; known: "
                         f"{', '.join(sorted(KNOWN_CPUS))}") from None


@functools.lru_cache(maxsize=1)
def host_cpu() -> tuple[str, tuple[str, ...]]:
    """LLVM's name and enabled features of the machine this process runs on."""
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    return llvm.get_host_cpu_name(), tuple(sorted(k for k, on in feats.items() if on))


def compile_cpu() -> tuple[str, tuple[str, ...], bool]:
    """(cpu name, features, overridden) that Numba compiles for in this process: the host, or
    the CPU ``NUMBA_CPU_NAME`` names (set from ``TUNER_CPU`` by ``tuner.settings``)."""
    from numba.core import config

    name = config.CPU_NAME
    if name and name != "host":
        return name, known_cpu_features(name), True
    return (*host_cpu(), False)


_forced: contextvars.ContextVar[Isa | None] = contextvars.ContextVar("forced_isa", default=None)


def compile_features() -> frozenset[str]:
    """ISA features of what the kernels are generated for: the CPU Numba compiles for (the
    host, or ``TUNER_CPU``'s), or inside ``using(isa)`` that ISA's. Templates that choose
    instructions by feature (the int8 dot products) read this, never the host's features, so an
    AVX2 override on an AVX-512 host generates AVX2 instructions."""
    forced = _forced.get()
    if forced is None:
        from numba.core import config

        return _features_of(config.CPU_NAME)
    f = {"sse2", "sse4.2"}
    if forced.vector_bits >= 256:
        f |= {"avx"} | ({"avx2", "fma"} if forced.fma else set())
    if forced.vector_bits == 512:
        f |= {"avx512f", "avx512vl", "avx512dq"}
        f |= {"avx512bw"} if forced.avx512bw else set()
        f |= {"avx512vnni"} if forced.avx512vnni else set()
    return frozenset(f)


def tuned_cpu() -> str | None:
    """The CPU defaults may be fitted to: the one Numba compiles for (host or ``TUNER_CPU``),
    or None inside ``using(isa)``, which generates the ISA's generic defaults."""
    return None if _forced.get() is not None else compile_cpu()[0]


def reads_a_in_place() -> bool:
    """Whether the GEMM defaults read A in place: the CPU fitted to is in ``A_IN_PLACE_CPUS``."""
    return tuned_cpu() in A_IN_PLACE_CPUS


def long_k_block() -> int | None:
    """The K block of a direct conv whose K exceeds one block, on the CPU fitted to
    (``LONG_K_BLOCK``); None: the core's default."""
    return LONG_K_BLOCK.get(tuned_cpu())


def int8_in_place_rows(rows: int) -> int:
    """Rows of the int8 VNNI tile read in place on the CPU fitted to (``INT8_IN_PLACE_ROWS``),
    else ``rows``, the packed default's."""
    return INT8_IN_PLACE_ROWS.get(tuned_cpu(), rows)


def current() -> Isa:
    """The ISA templates generate for (see the module docstring)."""
    forced = _forced.get()
    return forced if forced is not None else isa_from_features(compile_cpu()[1])


@functools.lru_cache(maxsize=None)
def _features_of(cpu_name) -> frozenset[str]:
    """``compile_cpu()``'s features as a set, per value of Numba's CPU_NAME (cached: spaces
    ask for them per config)."""
    return frozenset(compile_cpu()[1])


@contextlib.contextmanager
def using(isa: Isa):
    """Generate for ``isa`` inside the block (spaces, defaults, codegen); what the compiler
    targets is unchanged, so only inspect or compile-check such kernels, never time them."""
    token = _forced.set(isa)
    try:
        yield isa
    finally:
        _forced.reset(token)
