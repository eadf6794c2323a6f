"""tuner: an autotuning search framework for CPU tensor kernels.

Public API (imported lazily so ``import tuner`` stays cheap):

- ``tuner.gemm(A, B)``: C = A @ B with the best tuned kernel for this shape and target
  (a visible fallback when none is recorded).
- ``tuner.build(graph)``: an executable module for a graph (``tuner.frontend.onnx.load``
  reads ONNX), with the best tuned configs applied and a one-line fallback summary.
"""
from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "gemm":
        from tuner.dispatch import gemm

        return gemm
    if name == "build":
        import importlib

        return importlib.import_module("tuner.build")  # a callable package: tuner.build(graph)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
