"""Operands evicted from the caches before a timed call: how a built model meets its weights.

A kernel timed back to back finds every operand where its previous call left it: a 9.4 MB
weight in the last-level cache, the activations in L2. In a built model the activations were
just written by the step before (cached), but the weights were last read one inference ago,
and the 50-200 MB of other weights and activations written since have pushed them out: they
come from memory. ResNet-50's 7 x 7 layers (M = 49, 9.4 MB of weights each) ran 2.2-2.4 ms in
the model against 1.7 ms back to back (Intel Xeon, 1 thread, 2026-12-03), and the cache
blocks that win in one state are not those that win in the other (docs/measurement.md).

``evict(arrays)`` flushes every cache line of the arrays (``clflush``): the measurement
option ``cache_flush`` (``MeasureOptions``, ``--cache-flush``) calls it on a kernel's
operands other than its first input (the activation a model's previous step wrote) before
each timed call, as TVM's ``enable_cpu_cache_flush`` does. Each sample is then one call.
"""
from __future__ import annotations

from typing import Iterable

import numba
import numpy as np

from search_spaces.runtime.simd import clflush


@numba.njit(cache=True, nogil=True)
def _evict_flat(a):
    step = max(1, 64 // a.itemsize)
    for i in range(0, a.size, step):
        clflush(a, i)
    if a.size:
        clflush(a, a.size - 1)   # the last line, when the array does not start on a line


def evict(arrays: Iterable) -> None:
    """Flush every cache line of each C-contiguous NumPy array in ``arrays`` (others skipped)."""
    for a in arrays:
        if isinstance(a, np.ndarray) and a.size and a.flags.c_contiguous:
            _evict_flat(a.reshape(-1).view(np.uint8))


def flushed_operands(inputs, prepared=()) -> list:
    """What ``cache_flush`` evicts: the prepared operands (weights as the kernel reads them)
    and every input but the first."""
    return [*prepared, *list(inputs)[1:]]
