"""Measurement results: every candidate ends with exactly one Status and its evidence."""
from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    OK = "OK"
    INVALID = "INVALID"              # rejected by the space's constraints or the template
    COMPILE_ERROR = "COMPILE_ERROR"  # codegen or Numba failed to build the source
    RUNTIME_ERROR = "RUNTIME_ERROR"  # the kernel raised
    CRASH = "CRASH"                  # the worker process died (segfault, abort, OOM kill)
    TIMEOUT = "TIMEOUT"              # build or run took longer than its limit
    WRONG_ANSWER = "WRONG_ANSWER"    # ran, but the output disagrees with NumPy

    def __str__(self) -> str:
        return self.value


@dataclass
class MeasureResult:
    status: Status
    samples: list[float] = field(default_factory=list)  # seconds per call, every sample kept
    compile_time: float | None = None                   # seconds spent in Numba (build worker)
    error: str = ""                                     # error text for any non-OK status
    info: dict[str, Any] = field(default_factory=dict)  # calls per sample, cache hit, ...

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def stats(self) -> dict[str, float | None]:
        return summarize(self.samples)


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of a sorted list (numpy's default method)."""
    pos = (len(sorted_xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(samples: list[float]) -> dict[str, float | None]:
    """median, IQR, p95, mean, min and max of the samples (None when there are none)."""
    if not samples:
        return {"median": None, "iqr": None, "p95": None, "mean": None, "min": None, "max": None}
    xs = sorted(samples)
    return {
        "median": statistics.median(xs),
        "iqr": _quantile(xs, 0.75) - _quantile(xs, 0.25),
        "p95": _quantile(xs, 0.95),
        "mean": statistics.fmean(xs),
        "min": xs[0],
        "max": xs[-1],
    }
