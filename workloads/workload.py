"""What a workload is: a kind, canonical parameters, a FLOP count, inputs and a reference.

A workload never knows how it is computed (that is a template's job). It knows how to make
deterministic inputs, how to compute the right answer with NumPy, and how close a candidate's
answer must be (a tolerance that depends on dtype and reduction length).
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np


def outside_tolerance(got: np.ndarray, expected: np.ndarray, err: np.ndarray,
                      tol: np.ndarray | float) -> str | None:
    """None when ``err <= tol`` everywhere, else how many elements are off and the worst one."""
    tol = np.broadcast_to(tol, err.shape)
    bad = err > tol
    if not bad.any():
        return None
    i = np.unravel_index(np.argmax(err - tol), err.shape)
    return (f"{int(bad.sum())} of {bad.size} elements outside tolerance; worst at "
            f"{tuple(map(int, i))}: got {float(got[i]):.6g}, expected {float(expected[i]):.6g}, "
            f"tolerance {float(tol[i]):.3g}")


def first_difference(got: np.ndarray, expected: np.ndarray, bad: np.ndarray) -> str | None:
    """For exact checks: None when no element is ``bad``, else how many differ and the first."""
    if not bad.any():
        return None
    i = np.unravel_index(np.argmax(bad), bad.shape)
    return (f"{int(bad.sum())} of {bad.size} elements differ; first at "
            f"{tuple(map(int, i))}: got {got[i]}, expected {expected[i]}")


class Workload(ABC):
    """Base class. Subclasses are frozen dataclasses registered in ``workloads.REGISTRY``."""

    kind: ClassVar[str]
    #: FLOP/s assumed before anything is measured (task scheduling, latency estimates)
    nominal_flops_rate: ClassVar[float] = 1e9

    @classmethod
    def parse_spec(cls, text: str) -> "Workload":
        """The workload a short spec names (``tuner.tune("gemm:1024x1024x1024")``, ``tune gemm
        --shape``); kinds that have one override this."""
        from workloads.errors import UsageError

        raise UsageError(f"workload kind {cls.kind!r} has no short spec; pass a workload object "
                         f"or its key ('{cls.kind}:{{...}}')")

    @classmethod
    def claims_group(cls, params: dict[str, Any]) -> bool:
        """Whether a fused group described by ``params`` becomes this kind (kinds made from
        fused groups override this; see ``workloads.kind_of``)."""
        return False

    def tune_command(self, threads: int) -> str:
        """The command that tunes this workload (named in fallback warnings)."""
        return f"python -m tuner tune model MODEL.onnx --threads {threads}"

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Canonical parameters (JSON-serialisable); ``from_params(params())`` round-trips."""

    @classmethod
    @abstractmethod
    def from_params(cls, params: dict[str, Any]) -> "Workload":
        ...

    @property
    def key(self) -> str:
        """Canonical key, e.g. ``gemm:{"K":1024,"M":1024,"N":1024,"dtype":"float32"}``."""
        return f"{self.kind}:{json.dumps(self.params(), sort_keys=True, separators=(',', ':'))}"

    @abstractmethod
    def flops(self) -> int:
        ...

    @abstractmethod
    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each input array, in kernel argument order."""

    @abstractmethod
    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each output array, written by the kernel (after the inputs)."""

    @abstractmethod
    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The right answer, computed with NumPy (in float64 where the dtype is floating)."""

    @abstractmethod
    def check(self, inputs: list[np.ndarray], outputs: list[np.ndarray],
              expected: list[np.ndarray]) -> str | None:
        """None when ``outputs`` are within tolerance of ``expected``, else what is wrong."""

    #: what ``baseline`` runs, as reports name it
    baseline_name: ClassVar[str] = "NumPy reference"

    def baseline(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """The competitor timed beside tuned kernels, in the same worker and thread count:
        NumPy's own implementation (here the reference; kinds override it with the library
        call a user would write, e.g. ``np.matmul`` for GEMM)."""
        for out, ref in zip(outputs, self.reference(inputs)):
            out[...] = ref

    def make_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Deterministic inputs: uniform in [-1, 1] for floats, small integers otherwise."""
        rng = np.random.default_rng(seed)
        arrays = []
        for shape, dtype in self.input_specs():
            if np.issubdtype(np.dtype(dtype), np.floating):
                arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
            else:
                arrays.append(rng.integers(-8, 8, size=shape).astype(dtype))
        return arrays

    def make_outputs(self) -> list[np.ndarray]:
        # Filled with NaN (floats) so a kernel that skips an element is caught by the check;
        # integers with -12345, 8-bit ones with 0xA5 / -0x5B (every level is a valid 8-bit
        # value, so an unwritten element is caught only where the result differs)
        outs = []
        for shape, dtype in self.output_specs():
            out = np.empty(shape, dtype=dtype)
            if np.issubdtype(out.dtype, np.floating):
                out.fill(np.nan)
            else:
                out.fill({1: 0xA5 if out.dtype.kind == "u" else -0x5B}.get(out.dtype.itemsize, -12345))
            outs.append(out)
        return outs

    def nbytes(self) -> int:
        specs = self.input_specs() + self.output_specs()
        return sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in specs)

    def __str__(self) -> str:
        return self.key
