"""The machine a record was measured on: CPU name, ISA features, cores, caches, versions.

The target *key* identifies the hardware as LLVM sees it (CPU name + ISA feature set + core
count). With ``TUNER_CPU`` the target is that CPU (its name and ``search_spaces.isa``'s table of
its features, so its own key) on this machine's cores and caches: kernels are generated and
compiled for it, and refused for measuring or running when this machine cannot execute its ISA
(``require_runnable``). Software versions are recorded beside it, not in it: a record from another numba or
llvmlite version still describes this CPU, and is applied with a notice (see dispatch).
"""
from __future__ import annotations

import functools
import hashlib
import os
import numbers
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from search_spaces import isa as isa_mod
from workloads.errors import UsageError


@dataclass(frozen=True)
class Target:
    cpu_name: str               # LLVM's name for the host CPU, e.g. "znver4"
    features: tuple[str, ...]   # enabled ISA features (+avx512f ...), sorted
    cores: int                  # CPUs usable by this process
    model_name: str = ""        # /proc/cpuinfo "model name"
    caches: dict = field(default_factory=dict)   # {"L1d": bytes, "L2": bytes, "L3": bytes}
    versions: dict = field(default_factory=dict)  # python, numpy, numba, llvmlite, tuner

    @property
    def key(self) -> str:
        digest = hashlib.sha1(",".join(self.features).encode()).hexdigest()[:8]
        return f"{self.cpu_name}-{digest}-{self.cores}c"

    @property
    def isa(self) -> isa_mod.Isa:
        """Vector width, lanes and register count of this target (what templates generate for)."""
        return isa_mod.isa_from_features(self.features)

    @property
    def simd_bits(self) -> int:
        """Widest vector register the ISA offers (512, 256, 128)."""
        return self.isa.vector_bits

    @property
    def has_fma(self) -> bool:
        return "fma" in self.features

    def to_dict(self) -> dict:
        d = asdict(self)
        d["features"] = list(self.features)
        d["key"] = self.key
        return d

    def describe(self) -> str:
        c = ", ".join(f"{k} {v // 1024} KiB" for k, v in self.caches.items())
        v = ", ".join(f"{k} {val}" for k, val in self.versions.items())
        isa = [x for x in ("avx512f", "avx512bw", "avx512vnni", "avx2", "fma") if x in self.features]
        return "\n".join([
            f"target key : {self.key}",
            f"cpu        : {self.cpu_name} ({self.model_name or 'unknown model'})",
            f"cores      : {self.cores}",
            f"simd       : {self.simd_bits}-bit, {' '.join(isa) or 'no AVX'}",
            f"isa        : {self.isa.describe()}",
            f"caches     : {c or 'not readable'}",
            f"versions   : {v}",
            f"features   : {len(self.features)} enabled",
        ])


def _cache_sizes() -> dict:
    out = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            typ = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        if typ == "Instruction":
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1:], 1)
        num = int(size[:-1]) if size[-1:] in "KMG" else int(size)
        out[f"L{level}{'d' if typ == 'Data' else ''}"] = num * mult
    return out


def _model_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions() -> dict:
    import llvmlite
    import numba
    import numpy

    import tuner

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "llvmlite": llvmlite.__version__,
        "tuner": tuner.__version__,
    }


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def thread_count(threads: int | None, label: str = "threads=") -> int:
    """``threads`` checked against this machine (None: every usable core); one UsageError line
    naming the option as the caller spells it (``threads=`` in Python, ``--threads `` on the
    command line)."""
    from workloads.errors import UsageError

    n = usable_cores() if threads is None else threads
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 or n > usable_cores():
        raise UsageError(f"{label}{n!r}: this machine allows 1..{usable_cores()}")
    return int(n)


def busy_cpus(interval: float = 0.3) -> float | None:
    """CPUs' worth of work running right now on the whole machine (all processes), from two
    reads of /proc/stat ``interval`` seconds apart; None where there is no /proc/stat. Unlike
    the load average it has no memory of work that just ended."""
    def snap():
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        ncpu = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
        v = [int(x) for x in lines[0].split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0), ncpu   # total, idle + iowait
    try:
        t0, i0, n = snap()
        time.sleep(interval)
        t1, i1, _ = snap()
    except (OSError, ValueError, IndexError):
        return None
    return n * (1 - (i1 - i0) / max(1, t1 - t0))


def busy_note(threads: int) -> str | None:
    """A warning when other work is already using the CPUs a ``threads``-thread measurement
    needs (more than the cores left over plus half a core busy: /proc/stat over 0.3 s, else
    the 1-minute load average), else None. Timings then say more about the neighbours than
    about the kernel; a 2-thread kernel on a 2-core machine suffers most (measured: the default
    1024^3 config fell from ~190 to 52 GFLOPS with other benchmarks running on both cores, so
    a run picked a 1-thread config)."""
    busy = busy_cpus()
    what = "{:.1f} CPUs busy"
    if busy is None:
        try:
            busy, what = os.getloadavg()[0], "load average {:.1f}"
        except (AttributeError, OSError):  # pragma: no cover - non-Unix
            return None
    cores = usable_cores()
    if busy <= cores - threads + 0.5:
        return None
    return (f"the machine is busy ({what.format(busy)} of {cores}) while measuring with "
            f"{threads} thread(s): timings will be disturbed; compare the results later, side by "
            "side, with `python -m tuner bench compare`")


def host_target() -> Target:
    """The target kernels are generated for: this machine, or the CPU ``TUNER_CPU`` names
    (cached per process and override)."""
    from tuner import settings

    settings.apply_cpu_override()
    return _target(settings.cpu_override())


@functools.lru_cache(maxsize=None)
def _target(override: str | None) -> Target:
    name, enabled, _ = isa_mod.compile_cpu()
    if override is not None and name != override:   # NUMBA_CPU_NAME set apart from TUNER_CPU
        name, enabled = override, isa_mod.known_cpu_features(override)
    return Target(
        cpu_name=name,
        features=enabled,
        cores=usable_cores(),
        model_name=_model_name(),
        caches=_cache_sizes(),
        versions=versions(),
    )


if __name__ == "__main__":  # pragma: no cover
    print(host_target().describe(), file=sys.stdout)


def missing_features(target: Target) -> list[str]:
    """Execution-relevant ISA features of ``target`` that this machine lacks."""
    host = set(isa_mod.host_cpu()[1])
    return [f for f in isa_mod.EXECUTION_FEATURES if f in target.features and f not in host]


def require_runnable(target: Target | None = None) -> None:
    """Refuse (one line, UsageError) to measure or run kernels compiled for a CPU whose ISA
    this machine cannot execute: they would die of SIGILL. Generating and showing them is fine."""
    target = target or host_target()
    missing = missing_features(target)
    if missing:
        host = isa_mod.host_cpu()[0]
        raise UsageError(f"target {target.cpu_name} (TUNER_CPU) needs {', '.join(missing)}, which "
                         f"this {host} machine lacks: its kernels can be generated and shown "
                         "but not measured or run here; unset TUNER_CPU or name a CPU this "
                         "machine can execute")
