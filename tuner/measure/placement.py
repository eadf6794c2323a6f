"""Buffer placement: fresh arrays whose data starts a chosen number of bytes past a 64-byte
boundary, and the rotation of placements the run worker times a kernel over.

Why: a kernel timed on one set of buffers can be fast only there. Measured (1024^3 fp32,
1 thread, Zen 3): one tuned config took 28 to 54 ms over 13 placements of A, B and C while
OpenBLAS stayed at 28 ms; the tuner had timed the lucky one. Timing every candidate over
several placements, and scoring it by the slowest placement, keeps such configs from winning.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

LINE = 64  # bytes: a cache line, and the alignment a fresh NumPy buffer does not promise

# (offset of A, of B, of C) from a 64-byte boundary, in bytes. The first is the ideal case,
# the others misalign one, two or all three operands by a half/quarter line (NumPy's own
# allocator gives 16-byte alignment, so these are placements an ordinary script gets).
PLACEMENTS: tuple[tuple[int, ...], ...] = (
    (0, 0, 0), (16, 16, 16), (32, 0, 16), (0, 32, 32), (48, 16, 0), (16, 48, 32),
)


def empty_at(shape: Sequence[int], dtype, offset: int) -> np.ndarray:
    """A fresh C-contiguous array whose first element is ``offset`` bytes past a 64-byte
    boundary (``offset`` a multiple of the itemsize, below 64)."""
    dt = np.dtype(dtype)
    if offset % dt.itemsize or not 0 <= offset < LINE:
        raise ValueError(f"offset {offset} must be a multiple of {dt.itemsize} in [0, {LINE})")
    nbytes = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(nbytes + 2 * LINE, np.uint8)
    start = (-raw.ctypes.data) % LINE + offset
    return raw[start:start + nbytes].view(dt).reshape(tuple(shape))


def offset_of(arr: np.ndarray) -> int:
    """Bytes past the last 64-byte boundary of ``arr``'s first element."""
    return arr.ctypes.data % LINE


def placed_copies(arrays: Sequence[np.ndarray], offsets: Sequence[int]) -> list[np.ndarray]:
    """Fresh copies of ``arrays`` at the given offsets (anything not an array is passed on
    as it is)."""
    out = []
    for a, off in zip(arrays, offsets):
        if not isinstance(a, np.ndarray):
            out.append(a)
            continue
        b = empty_at(a.shape, a.dtype, off % LINE - (off % LINE) % a.dtype.itemsize)
        b[...] = a
        out.append(b)
    return out


def rotation(n: int, n_args: int) -> list[tuple[int, ...]]:
    """The first ``n`` placements for ``n_args`` arrays (operands past the third are placed
    like the third; fewer operands take the leading offsets)."""
    out = []
    for p in PLACEMENTS[:max(1, n)]:
        out.append(tuple(p[min(i, len(p) - 1)] for i in range(n_args)))
    return out


def spread(medians: Sequence[float]) -> float:
    """(slowest - fastest) / fastest over per-placement medians: 0.10 means 10%."""
    return (max(medians) - min(medians)) / min(medians) if medians else 0.0
