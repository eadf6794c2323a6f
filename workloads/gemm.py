"""GEMM: C[M, N] = A[M, K] @ B[K, N], row-major operands.

Shapes are given as ``MxNxK`` (the order AutoTVM and the published ladder use: M rows of C,
N columns of C, K the reduction). dtype float32 (default), float64 or int32 (exact check), or
one of the quantized ``INT8_DTYPES``: A uint8 (activations) x B int8 (weights) -> C int32,
checked exactly against ``A.astype(int32) @ B.astype(int32)``. ``int8`` allows every int8
weight; ``int8w7`` promises weights in [-64, 64] (ONNX Runtime's ``reduce_range``), the range
in which the saturating ``vpmaddubsw`` formulation is exact, so its inputs stay in that range.
"""
from __future__ import annotations

import math
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from workloads.errors import UsageError
from workloads.workload import Workload, first_difference, outside_tolerance

_LAST_TOLERANCE: list = []   # [key, tolerance array] of the last inputs checked (Gemm.tolerance)

# quantized GEMM dtype -> largest |weight| its inputs hold (A is always the full uint8 range)
INT8_DTYPES = {"int8": 128, "int8w7": 64}
DTYPES = ("float32", "float64", "int32", *INT8_DTYPES)
# int8: |C| <= 255 * 128 * K must fit int32
MAX_INT8_K = 65536
_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*$")
# Dimensions beyond this are rejected outright (indices must fit comfortably in int64 maths).
MAX_DIM = 1 << 20


def available_memory() -> int:
    """Bytes of memory available to a new allocation (MemAvailable), or total RAM."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Gemm(Workload):
    M: int
    N: int
    K: int
    dtype: str = "float32"

    kind: ClassVar[str] = "gemm"
    nominal_flops_rate: ClassVar[float] = 20e9

    def __post_init__(self) -> None:
        for name in ("M", "N", "K"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise UsageError(f"gemm {name} must be an integer, got {v!r}")
            if not 1 <= v <= MAX_DIM:
                raise UsageError(f"gemm {name}={v} out of range: each dimension must be 1..{MAX_DIM}")
        if self.dtype not in DTYPES:
            raise UsageError(f"gemm dtype {self.dtype!r} not supported; choose one of {', '.join(DTYPES)}")
        if self.dtype in INT8_DTYPES and self.K > MAX_INT8_K:
            raise UsageError(f"gemm {self.dtype} K={self.K} out of range: int32 sums of u8 x s8 "
                             f"products are exact only for K <= {MAX_INT8_K}")

    @classmethod
    def parse(cls, shape: str, dtype: str = "float32", check_memory: bool = True) -> "Gemm":
        """Parse ``MxNxK``; every malformed or unsatisfiable shape is a one-line UsageError."""
        m = _SHAPE_RE.match(shape or "")
        if not m:
            raise UsageError(
                f"bad GEMM shape {shape!r}: expected MxNxK with three positive integers, e.g. 1024x1024x1024"
            )
        M, N, K = (int(g) for g in m.groups())
        if min(M, N, K) == 0:
            raise UsageError(f"bad GEMM shape {shape!r}: every dimension must be at least 1")
        w = cls(M, N, K, dtype)
        if check_memory:
            # Inputs, output, reference (float64) and packing buffers: about 3x the operands.
            need = 3 * w.nbytes() + 8 * M * N
            avail = available_memory()
            if need > avail:
                raise UsageError(
                    f"GEMM shape {shape!r} needs about {need / 2**30:.1f} GiB; only "
                    f"{avail / 2**30:.1f} GiB of memory is available"
                )
        return w

    @classmethod
    def parse_spec(cls, text: str) -> "Gemm":
        """``MxNxK`` or ``MxNxK:dtype`` (``tuner.tune("gemm:1024x1024x1024:float64")``)."""
        shape, _, dtype = text.partition(":")
        return cls.parse(shape, dtype or "float32")

    def tune_command(self, threads: int) -> str:
        return (f"python -m tuner tune gemm --shape {self.shape_str} --dtype {self.dtype} "
                f"--threads {threads}")

    @property
    def shape_str(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    def params(self) -> dict[str, Any]:
        return {"M": int(self.M), "N": int(self.N), "K": int(self.K), "dtype": self.dtype}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Gemm":
        try:
            return cls(params["M"], params["N"], params["K"], params.get("dtype", "float32"))
        except KeyError as exc:
            raise UsageError(f"gemm parameters lack {exc}") from None

    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def quantized(self) -> bool:
        """uint8 x int8 -> int32 (one of ``INT8_DTYPES``)."""
        return self.dtype in INT8_DTYPES

    def input_specs(self):
        if self.quantized:
            return [((self.M, self.K), "uint8"), ((self.K, self.N), "int8")]
        return [((self.M, self.K), self.dtype), ((self.K, self.N), self.dtype)]

    def output_specs(self):
        return [((self.M, self.N), "int32" if self.quantized else self.dtype)]

    @property
    def baseline_name(self) -> str:
        return "numpy.matmul (float64 operands, exact)" if self.quantized else "numpy.matmul"

    def baseline(self, inputs, outputs):
        if self.quantized:
            # The fastest exact thing a NumPy user can write: NumPy has no BLAS for integers
            # (int32 matmul of 1024^3 takes ~13 s), while float64 BLAS is exact here, every
            # partial sum being an integer below 255 * 128 * 65536 < 2**53.
            outputs[0][...] = np.matmul(inputs[0].astype(np.float64), inputs[1].astype(np.float64))
            return
        np.matmul(inputs[0], inputs[1], out=outputs[0])

    def make_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Quantized: A uniform over uint8, B uniform over the dtype's weight range, with the
        extremes planted (row 0 of A all 255, column 0 of B the largest weight, the last
        column the most negative), so every check meets the pairs that saturate int16."""
        if not self.quantized:
            return super().make_inputs(seed)
        rng = np.random.default_rng(seed)
        wmax = INT8_DTYPES[self.dtype]
        a = rng.integers(0, 256, size=(self.M, self.K), dtype=np.int32).astype(np.uint8)
        b = rng.integers(-wmax, min(wmax, 127) + 1, size=(self.K, self.N), dtype=np.int32).astype(np.int8)
        a[0, :] = 255
        b[:, 0] = min(wmax, 127)
        b[:, -1] = -wmax
        return [a, b]

    def reference(self, inputs):
        a, b = inputs
        if self.quantized:
            return [a.astype(np.int32) @ b.astype(np.int32)]
        if self.dtype == "int32":
            return [a.astype(np.int64) @ b.astype(np.int64)]
        return [a.astype(np.float64) @ b.astype(np.float64)]

    def tolerance(self, inputs) -> np.ndarray | float:
        """Per-element absolute tolerance: c * eps * sqrt(K) * (|A| @ |B|).

        A floating-point dot product of length K has a worst-case error of about
        K * eps * sum|a||b|; blocked and vectorised summation (and fastmath reassociation)
        behave like a random walk, about sqrt(K) * eps * sum|a||b|. We allow 4 sqrt(K) + 16
        units of that, which passes every correct summation order and still catches a
        skipped block or a wrong index (errors of order |a||b|).
        """
        if self.dtype == "int32" or self.quantized:
            return 0.0
        a, b = inputs
        # The bound is a float64 GEMM as large as the workload (1024^3: ~0.1 s CPU), and the
        # run worker checks every placement of every candidate on copies of the same inputs:
        # the last bound is kept, keyed by the inputs' contents (a CRC, ~1 ms per MB).
        key = (self.key, a.shape, b.shape, zlib.crc32(np.ascontiguousarray(a).data),
               zlib.crc32(np.ascontiguousarray(b).data))
        if _LAST_TOLERANCE and _LAST_TOLERANCE[0] == key:
            return _LAST_TOLERANCE[1]
        eps = np.finfo(self.dtype).eps
        bound = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        tol = (4 * math.sqrt(self.K) + 16) * eps * bound
        _LAST_TOLERANCE[:] = [key, tol]
        return tol

    def check(self, inputs, outputs, expected):
        (c,), (ref,) = outputs, expected
        if c.shape != ref.shape:
            return f"output shape {c.shape} != expected {ref.shape}"
        if self.dtype == "int32" or self.quantized:
            return first_difference(c, ref, c.astype(np.int64) != ref)
        if not np.isfinite(c).all():
            n = int((~np.isfinite(c)).sum())
            return f"{n} of {c.size} elements are NaN/inf (unwritten or overflow)"
        return outside_tolerance(c, ref, np.abs(c.astype(np.float64) - ref), self.tolerance(inputs))
