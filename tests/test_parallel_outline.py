"""Parallel loop bodies outlined into serial functions (search_spaces/parallel_outline.py)."""
import importlib.util

import numba
import numpy as np

from search_spaces.parallel_outline import outline_parallel_loops

SOURCE = '''import numba
import numpy as np
from numba import prange

SCALE = 3


@numba.njit(inline="always")
def row_op(X, Y, i, n):
    for j in range(n):
        Y[i, j] = X[i, j] * SCALE + i


@numba.njit(cache=False, parallel=True, fastmath=True)
def kernel(X, Y, total):
    n = X.shape[1]
    for i in prange(X.shape[0]):   # parallel over rows
        # a comment inside the body
        row_op(X, Y, i, n)
        Y[i, 0] += n
    s = 0.0
    for i in prange(X.shape[0]):   # a reduction: stays as it is
        s += Y[i, 1]
    total[0] = s
    twice(X, Y)


@numba.njit(parallel=True)
def twice(X, Y):
    for i in prange(X.shape[0]):   # two eligible loops in one function, below another one
        row_op(X, Y, i, 1)
    for i in prange(X.shape[0]):
        row_op(Y, Y, i, 1)
'''


def _load(src: str, tmp_path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_parallel_body_with_calls_is_outlined_and_a_reduction_is_not(tmp_path):
    out = outline_parallel_loops(SOURCE)
    assert "def kernel_block0(i, X, Y, n):" in out          # index first, then free names
    assert "kernel_block0(np.int64(i), X, Y, n)" in out      # one int64 signature
    assert "@numba.njit(fastmath=True)\ndef kernel_block0(" in out   # serial, not cached alone
    assert "# a comment inside the body" in out
    assert "s += Y[i, 1]" in out and "kernel_block1" not in out   # its s is the function's
    assert "twice_block0(np.int64(i), X, Y)" in out and "twice_block1(np.int64(i), Y)" in out
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    want_y, want_t = np.empty_like(x), np.zeros(1)
    _load(SOURCE, tmp_path, "plain").kernel(x, want_y, want_t)
    y, t = np.empty_like(x), np.zeros(1)
    mod = _load(out, tmp_path, "outlined")
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    mod.kernel(x, y, t)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(t, want_t)
    assert [str(s[0]) for s in mod.kernel_block0.signatures] == ["int64"]   # compiled once


def test_loops_that_outlining_would_change_are_left_alone():
    serial = SOURCE.replace("parallel=True", "parallel=False")
    assert outline_parallel_loops(serial) == serial           # no parallel function
    early = SOURCE.replace("        Y[i, 0] += n\n", "        if n == 0:\n            continue\n")
    assert "kernel_block" not in outline_parallel_loops(early)   # continue of the loop itself
    array_only = SOURCE.replace("        row_op(X, Y, i, n)\n", "")
    assert "kernel_block" not in outline_parallel_loops(array_only)   # nothing typed twice
    called = SOURCE.replace('@numba.njit(inline="always")', "@numba.njit")
    assert "_block" not in outline_parallel_loops(called)   # a call, not a body inlined twice
