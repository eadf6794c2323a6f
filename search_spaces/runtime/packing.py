"""Weight packing shared by the generated modules (``prepare`` of the NHWC convolutions):
one Numba function, compiled once per process and argument type and kept in Numba's cache
across processes, instead of a copy compiled in every module (11 of them in a ResNet-50
build, ~0.23 s CPU each; docs/compile-once.md, "One weight packer for every module")."""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def pack_panels(pw, nr):
    """The weight ``pw`` [..., n] (its leading axes are K; an HWIO conv weight) as whole-K
    ``nr``-column panels starting on a 64-byte boundary: BP[(q * K + k) * nr + c] =
    W[k, q * nr + c], zeros past the last column (whole-line vector loads of B)."""
    n = pw.shape[-1]
    k_all = pw.size // n
    Wt = pw.reshape(-1)
    panels = (n + nr - 1) // nr
    size = panels * k_all * nr
    per_line = 64 // Wt.itemsize
    buf = np.empty(size + per_line, Wt.dtype)
    off = (per_line - (buf.ctypes.data // Wt.itemsize) % per_line) % per_line
    BP = buf[off:off + size]
    BP[:] = 0
    for q in range(panels):
        w = min(nr, n - q * nr)
        for k in range(k_all):
            for c in range(w):
                BP[(q * k_all + k) * nr + c] = Wt[k * n + q * nr + c]
    return BP
