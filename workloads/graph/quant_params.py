"""Quantization parameters: (scale, zero point) of activations, per-channel int8 weights.

Why uint8 asymmetric activations and int8 symmetric weights: the x86 integer dot products
take one *unsigned* and one *signed* byte operand — AVX2 ``vpmaddubsw`` (u8 x s8 -> s16
pairs) and AVX-512 VNNI ``vpdpbusd`` (u8 x s8 -> s32) alike — so activations are u8 and
weights s8 on every x86 target. Activations are asymmetric because most of them follow a
relu (all >= 0): a zero point of 0 then spends all 256 levels on [0, max] where a symmetric
s8 range would waste half. Weights are symmetric (zero point 0) so the kernel needs no
weight zero-point correction, only ``x_zp * sum(w)`` per output channel, folded at build time.

Why 7-bit weights without VNNI (``reduce_range``): ``vpmaddubsw`` adds two u8*s8 products
into a *saturating* int16; 255*127*2 = 64770 overflows it, 255*64*2 = 32640 does not. So on
AVX2 without ``avx512vnni`` the weights use [-64, 64] (as ONNX Runtime's reduce_range),
and with VNNI (32-bit accumulation, no int16 step) the full [-127, 127].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

U8_MIN, U8_MAX = 0, 255


@dataclass(frozen=True)
class QParams:
    """Affine uint8 quantization of one tensor: real = (q - zero_point) * scale."""

    scale: float
    zero_point: int
    dtype: str = "uint8"

    def quantize(self, x: np.ndarray) -> np.ndarray:
        q = np.rint(x.astype(np.float32) / np.float32(self.scale)) + self.zero_point
        return np.clip(q, U8_MIN, U8_MAX).astype(np.uint8)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return (q.astype(np.int32) - self.zero_point).astype(np.float32) * np.float32(self.scale)

    def level(self, x: float) -> int:
        """The quantized level of the real value ``x`` (clamped to the dtype)."""
        return int(np.clip(np.rint(np.float32(x) / np.float32(self.scale)) + self.zero_point,
                           U8_MIN, U8_MAX))

    def to_dict(self) -> dict:
        return {"scale": self.scale, "zero_point": self.zero_point, "dtype": self.dtype}


def activation_params(lo: float, hi: float) -> QParams:
    """uint8 parameters covering [lo, hi] widened to include 0 (real 0 must be exact:
    zero padding and relu rely on it)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ValueError(f"range [{lo}, {hi}] is not finite")
    if hi - lo < 1e-12:  # a tensor that is always 0
        return QParams(1.0, 0)
    scale = float(np.float32((hi - lo) / (U8_MAX - U8_MIN)))
    zp = int(np.clip(np.rint(-lo / scale), U8_MIN, U8_MAX))
    return QParams(scale, zp)


def weight_qmax(reduce_range: bool) -> int:
    """Largest |q| of an int8 weight: 64 with ``reduce_range`` (7-bit), else 127."""
    return 64 if reduce_range else 127


def default_reduce_range(features: tuple[str, ...] | None = None) -> bool:
    """7-bit weights unless the CPU has AVX-512 VNNI (see the module docstring)."""
    if features is None:   # callers in tuner pass the target's features (TUNER_CPU included)
        import llvmlite.binding as llvm

        features = tuple(k for k, on in llvm.get_host_cpu_features().items() if on)
    return "avx512vnni" not in features


def quantize_weight(w: np.ndarray, axis: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per output channel) — symmetric, per channel along ``axis``."""
    wc = np.moveaxis(w.astype(np.float64), axis, 0).reshape(w.shape[axis], -1)
    amax = np.abs(wc).max(axis=1) if wc.size else np.zeros(w.shape[axis])
    scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    shape = tuple(-1 if i == axis else 1 for i in range(w.ndim))
    q = np.clip(np.rint(w.astype(np.float32) / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale
