"""Where a built model's time goes: its largest kernels, their share, GFLOPS, and for GEMM-like
kernels (conv2d, dense and their int8 forms) the time a BLAS GEMM of the same size takes
in the same process, on the same thread count.

``hotspots(module.profile(inputs), threads)`` takes the kernels timed one by one, keeps
the ``top`` largest and, for each conv/dense kernel, times ``numpy.matmul`` of float32
operands shaped as the GEMM the kernel computes (a grouped conv: one GEMM per group and
image, timed as that many calls). ``vs_blas`` = BLAS time / kernel time: above 1 the kernel
beats the library at the GEMM alone (it also does its epilogue and im2col); an int8 kernel
is compared with the float32 GEMM of its shape (what its float form would cost).
"""
from __future__ import annotations

import time

import numpy as np

GEMM_KINDS = ("conv2d", "dense", "qconv2d", "qconv2d_grouped", "qdense")


def gemm_equivalent(key: str) -> tuple[int, int, int, int] | None:
    """(calls, M, N, K) of the GEMMs a conv/dense workload computes, or None."""
    from workloads import from_key

    w = from_key(key)
    if w.kind == "conv2d":
        from search_spaces.templates.conv2d import Conv2dTemplate
        from workloads.errors import InstantiationError

        try:
            pl = Conv2dTemplate.plan(w)
        except InstantiationError:   # a conv no GEMM formulation covers (NHWC grouped)
            return None
        return pl["batches"] * pl["groups"], pl["M"], pl["N"], pl["K"]
    if w.kind in ("dense", "qdense", "qconv2d", "qconv2d_grouped"):
        g = w.geometry   # a grouped qconv2d's is one group's
        return g.get("groups", 1), g["M"], g["N"], g["K"]
    return None


def gemm_label(eq: tuple[int, int, int, int] | None) -> str | None:
    """``M.. N.. K..`` of a ``gemm_equivalent`` (prefixed by the call count when several)."""
    if eq is None:
        return None
    return "{}x M{} N{} K{}".format(*eq) if eq[0] > 1 else "M{1} N{2} K{3}".format(*eq)


def _blas_seconds(calls: int, M: int, N: int, K: int, threads: int, repeat: int = 7) -> float:
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    times = []
    with threadpool_limits(threads):
        np.matmul(a, b, out=c)
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(calls):
                np.matmul(a, b, out=c)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def hotspots(prof, threads: int, *, top: int = 5) -> list[dict]:
    """The ``top`` kernels by time (share of the kernels' total, ms, GFLOPS, BLAS ratio) of a
    ``Module.profile`` list of (step, seconds)."""
    from workloads import from_key

    total = sum(t for _, t in prof) or 1.0
    rows = []
    for step, t in sorted(prof, key=lambda st: -st[1])[:top]:
        row = {"kernel": step.name, "label": step.label, "kind": step.kind,
               "source": step.source, "ms": t * 1e3, "share": t / total,
               "gflops": None, "gemm": None, "blas_ms": None, "vs_blas": None}
        if step.workload:
            w = from_key(step.workload)
            row["gflops"] = w.flops() / t / 1e9 if t > 0 else None
            if w.kind in GEMM_KINDS:
                eq = gemm_equivalent(step.workload)
                if eq is not None:
                    blas = _blas_seconds(*eq, threads)
                    row.update(gemm=gemm_label(eq), blas_ms=blas * 1e3, vs_blas=blas / t if t > 0 else None)
        rows.append(row)
    return rows


def hotspots_markdown(rows: list[dict]) -> str:
    lines = ["| kernel | group | source | ms | share | GFLOPS | GEMM | BLAS ms | vs BLAS |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(v, fmt):
            return "-" if v is None else fmt.format(v)
        lines.append(f"| {r['kernel']} | {r['label']} | {r['source']} | {r['ms']:.3f} | "
                     f"{100 * r['share']:.1f}% | {f(r['gflops'], '{:.1f}')} | {r['gemm'] or '-'} | "
                     f"{f(r['blas_ms'], '{:.3f}')} | {f(r['vs_blas'], '{:.2f}x')} |")
    return "\n".join(lines)
