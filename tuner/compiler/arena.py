"""One block of memory on transparent huge pages for a built module's long-lived arrays.

A built model streams each layer's prepared weights once per run (ResNet-50: 91 MB in 53
arrays), and each read crosses a 4 KiB page every 4 KiB: on 4 KiB pages a B panel walks the
page tables every 16 K steps of its micro-kernel. Where the kernel offers transparent huge
pages on request (Linux, ``/sys/kernel/mm/transparent_hugepage/enabled`` = ``madvise`` or
``always``), ``arena(nbytes)`` maps an anonymous block advised ``MADV_HUGEPAGE`` (2 MiB pages,
512x fewer TLB entries for the same bytes). NumPy advises huge pages itself only for single
allocations of 4 MiB or more, and Numba's allocator (which ``prepare`` returns its packed
weights from) never does; elsewhere the block is an ordinary NumPy array.

``place(arrays)`` copies arrays into one arena (each on a 64-byte boundary, as the kernels'
``empty_aligned`` gives) and returns the copies, C-contiguous and writable like the
originals, so compiled kernels see the same Numba types (no new signatures).
Measured in docs/models.md ("Weights on huge pages").
"""
from __future__ import annotations

import mmap

import numpy as np

ALIGN = 64          # bytes: a cache line, the kernels' vector-load alignment
HUGE_PAGE = 2 << 20
MIN_BYTES = 1 << 20  # smaller sets gain nothing measurable from one 2 MiB page


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _plain(nbytes: int) -> np.ndarray:
    """``nbytes`` of NumPy memory starting on an ``ALIGN`` boundary (malloc gives 16)."""
    buf = np.empty(nbytes + ALIGN, np.uint8)
    off = -buf.ctypes.data % ALIGN
    return buf[off:off + nbytes]


def arena(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` starting on an ``ALIGN`` boundary, on huge pages
    where the OS grants them on request."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < MIN_BYTES:
        return _plain(nbytes)
    size = (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    try:
        block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        block.madvise(advice)
    except (OSError, ValueError):   # no anonymous maps or advice here: plain memory
        return _plain(nbytes)
    return np.frombuffer(block, np.uint8, count=nbytes)   # page-aligned; keeps ``block`` alive


def slices(sizes: list[int], dtypes: list) -> list[np.ndarray]:
    """Uninitialised 1-D arrays of ``sizes[i]`` bytes of ``dtypes[i]``, carved from one arena."""
    block = arena(sum(_aligned(n) for n in sizes))
    out, off = [], 0
    for n, d in zip(sizes, dtypes):
        dt = np.dtype(d)
        out.append(block[off:off + n // dt.itemsize * dt.itemsize].view(dt))
        off += _aligned(n)
    return out


def place(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Copies of ``arrays`` (same shapes, dtypes and values, C order) in one arena."""
    flat = slices([a.nbytes for a in arrays], [a.dtype for a in arrays])
    out = []
    for a, f in zip(arrays, flat):
        c = f.reshape(a.shape)
        c[...] = a
        out.append(c)
    return out
