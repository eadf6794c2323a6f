"""The ``rowaxpy`` formulation of the GEMM template, for matrix-vector-like shapes (M < 8).

With a few rows of C there is no reuse of B to block for: the product is a stream over B
(``K x N`` elements, read once), and what matters is how that stream is read. The blocked
micro-kernel reads ``tile_k`` rows of B at a time in ``NR``-column strips (that many concurrent
streams 16 KB apart, a call and a C-tile load/store per strip). Here every row of B is read
front to back::

    for each K part (one per thread with parallel='k'), for each column block of tile_n:
        for k in steps of unroll_k rows:
            for each row i of C:   C[i, j0:j1] += A[i, k:k+U] @ B[k:k+U, j0:j1]   (vectorized j)

The C block stays in L1 and B is read once, sequentially (the other rows of C re-read the
same B rows from L1). ``parallel='k'`` gives each thread a contiguous half of B's rows and
its own partial C, summed at the end; ``parallel='n'`` splits the columns instead.

Measured (1x1024x4096, standalone, NumPy/OpenBLAS on the same threads, 2026-11-29): float32
1 thread, 4 rows per pass 0.249 ms vs NumPy 0.259 (the tiled micro-kernel default: 0.436);
2 threads, K split 0.120 ms vs 0.163-0.175 (a column split: 0.72 ms, each thread reading half
of every 4 KB row); float64 1 thread, 1 row per pass 0.91 ms vs 1.00.
"""
from __future__ import annotations


from search_spaces.gemm_engine.blocked import _ceil, kernel_params, module_head, tile_section
from workloads.gemm import Gemm


def _rows_pass(unroll: int, fastmath: bool) -> list[str]:
    """``rows_pass``: Cb[i, j0:j1] += A[i, k0:k1] @ B[k0:k1, j0:j1], ``unroll`` rows per step.

    The inner loop runs over 1-D slices from index 0: with ``range(j0, j1)`` Numba cannot
    prove the index non-negative and emits a wraparound select per element, which kept LLVM
    from vectorizing it (measured 0.84 ms instead of 0.25 for 1x1024x4096 float32)."""
    fm = ", fastmath=True" if fastmath else ""
    b_rows = "; ".join(f"b{u} = B[k + {u}, j0:j1]" for u in range(unroll))
    a_loads = "; ".join(f"a{u} = A[i, k + {u}]" for u in range(unroll))
    terms = " + ".join(f"a{u} * b{u}[j]" for u in range(unroll))
    return [
        f"@numba.njit(cache=True{fm})",
        "def rows_pass(A, B, Cb, k0, k1, j0, j1):",
        f'    """Cb[i, j0:j1] += A[i, k0:k1] @ B[k0:k1, j0:j1], {unroll} row(s) of B per step."""',
        "    n = j1 - j0",
        f"    steps = max(0, k1 - k0) // {unroll}",
        "    for s in range(steps):",
        f"        k = k0 + s * {unroll}",
        f"        {b_rows}",
        "        for i in range(M):",
        "            c = Cb[i, j0:j1]",
        f"            {a_loads}",
        "            for j in range(n):",
        f"                c[j] += {terms}",
        f"    for k in range(k0 + steps * {unroll}, k1):   # rows left over",
        "        b = B[k, j0:j1]",
        "        for i in range(M):",
        "            c = Cb[i, j0:j1]",
        "            a = A[i, k]",
        "            for j in range(n):",
        "                c[j] += a * b[j]",
    ]


def _kernel(par: str, runtime: tuple[str, ...], prologue: list[str]) -> list[str]:
    jit = "@numba.njit(cache=True" + (", parallel=True" if par != "none" else "") + ")"
    head = [jit, f"def kernel({kernel_params(runtime)}):", '    """C = A @ B, writing every element of C."""']
    head += ["    " + ln for ln in prologue]
    if par == "k":
        return head + [
            "    P = np.zeros((K_PARTS, M, N), DTYPE)   # one partial C per K part",
            "    for t in prange(K_PARTS):   # parallel over contiguous K parts",
            "        k0 = t * K_CHUNK",
            "        k1 = min(K, k0 + K_CHUNK)",
            "        for j0 in range(0, N, TILE_N):",
            "            rows_pass(A, B, P[t], k0, k1, j0, min(N, j0 + TILE_N))",
            "    for i in range(M):",
            "        for j in range(N):",
            "            acc = P[0, i, j]",
            "            for t in range(1, K_PARTS):",
            "                acc += P[t, i, j]",
            "            C[i, j] = acc",
        ]
    loop = ("    for blk in prange(N_BLOCKS):   # parallel over N blocks" if par == "n"
            else "    for blk in range(N_BLOCKS):")
    return head + [
        loop,
        "        j0 = blk * TILE_N",
        "        j1 = min(N, j0 + TILE_N)",
        "        for i in range(M):",
        "            for j in range(j0, j1):",
        "                C[i, j] = ZERO",
        "        rows_pass(A, B, C, 0, K, j0, j1)",
    ]


def generate(w: Gemm, c: dict, version: int, runtime: tuple[str, ...] = ()) -> str:
    """The module for a validated config; the tile knobs in ``runtime`` are kernel arguments
    (only ``tile_n`` is used: tile_m and tile_k are pinned to the whole dimension)."""
    par, unroll, threads = c["parallel"], c["unroll_k"], c["threads"]
    parts = max(1, threads) if par == "k" else 1
    chunk = _ceil(_ceil(w.K, parts), unroll) * unroll   # whole steps in every part but the last
    split = {"k": "K split over threads", "n": "N blocks over threads"}.get(par, "one thread")
    head = module_head(w, c, version, [
        "Structure: 'rowaxpy' (search_spaces/gemm_engine/rowaxpy.py): every row of B streamed once,",
        f"{unroll} row(s) per step, into an L1-resident block of C rows ({split})."], [], runtime)
    module, prologue = tile_section(w, c, runtime, [("N_BLOCKS", "(N + TILE_N - 1) // TILE_N", "column blocks of C")])
    head += module
    head.append(f"K_PARTS, K_CHUNK = {parts}, {chunk}   # contiguous row ranges of B (one per thread)")
    body = [head, _rows_pass(unroll, w.dtype != "int32"), _kernel(par, runtime, prologue)]
    return "\n\n\n".join("\n".join(p) for p in body) + "\n"
