"""dense template: ``dense`` (x[..., K] @ W[N, K]^T) or ``matmul`` (x[..., K] @ W[K, N]) with
its fused epilogue.

Formulations (knob ``formulation``):

- ``dot``: dot products along contiguous rows of x and W (dense weights only), four weight
  rows at a time sharing each vector of x (explicit LLVM vectors, FMA accumulators, one
  horizontal sum per output), ``block_n`` weight rows per block so a block of W stays in
  cache across the rows of x. Batch-1 inference layers (M = 1) are memory-bound
  matrix-vector products: reading W once, in long streams, is all there is to it. While
  four rows are read, the next four are requested into L2 at the same columns (a line per
  64 bytes read): the four hardware streams alone left a core's memory bandwidth unused
  (N 1000, K 2048, 8 MB, AMD Zen 4, standalone: 0.353 -> 0.261 ms, 23 -> 31 GB/s; prefetching
  the current rows 1-4 KB ahead instead: 0.41-0.45 ms).
- ``gemm``: the register-tiled LLVM-vector core of ``search_spaces.gemm_engine.core`` (x is A, read
  in place or packed; W^T is B, packed from W's rows (``pack_t``) for dense, read in place or
  packed for matmul), for larger M.

The epilogue (bias, scale, residual, activation) is applied to each result while it is in a
register (dot) or to each output tile in L1 (gemm).
"""
from __future__ import annotations

import json

import numpy as np

from search_spaces import isa
from search_spaces.gemm_engine import core
from search_spaces.gemm_engine.space import core_constraints, core_knobs, default_core_config, repair
from search_spaces.epilogue import DTYPE_SRC, Epilogue
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from workloads.errors import InstantiationError


# dot: weight rows that share each loaded x vector, two vectors of each per step (8
# accumulators + 2 x vectors + a weight vector: 11 registers, inside AVX2's 16). AlexNet's fc6 (M 1, N 4096, K 9216, 151 MB of weights),
# Zen 3, 1 thread, quiet: one row at a time with a fast-math reduction took 25.4 ms against
# OpenBLAS's 7.1 ms for the same product.
DOT_ROWS = 4


class DenseTemplate(core.ShapeGenericTemplate):
    name = "dense"
    # 5: the GEMM core of conv2d v4; 6: of conv2d v6; 7: of conv2d v8 (grid split);
    # 8: dot requests the next weight rows into L2 while it reads the current ones
    version = 8
    workload_kind = "dense"
    entry = "kernel"
    # blocks are arguments (with the shape: ``dims``), not part of the source
    runtime_knobs = ("tile_m", "tile_n", "tile_k", "block_n")
    literal_dims: tuple[str, ...] = ()   # dimensions kept as module constants

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        g = workload.geometry
        M, N, K = g["M"], g["N"], g["K"]
        forms = ("dot", "gemm") if g["weight"] == "NK" else ("gemm",)
        pack_b = (True,) if g["weight"] == "NK" else (False, True)
        knobs = [Knob("formulation", forms, False, "dot products or the register-tiled GEMM core"),
                 Knob("block_n", (1, 4, 16, 64), True, "dot: weight rows per block")]
        target = isa.current()
        knobs += core_knobs(M, N, K, max_threads, (False, True), pack_b, workload.dtype, target)
        cons = core_constraints(M, N, target)

        def dot_only(c):
            if c["formulation"] == "dot" and c["parallel"] == "m":
                return "dot parallelises over weight rows (parallel='n')"
            return None
        return ConfigSpace(knobs, cons + [Constraint("dot_parallel", dot_only)])

    def default_config(self, workload, max_threads: int = 1) -> Config:
        g = workload.geometry
        sp = self.space(workload, max_threads)
        base = default_core_config(sp.__class__([k for k in sp.knobs if k.name not in ("formulation", "block_n")],
                                                sp.constraints[:3]),
                                   g["M"], g["N"], g["K"], max_threads, g["M"] >= 64, True)
        form = "dot" if g["weight"] == "NK" and g["M"] < 16 else "gemm"
        cfg = {**dict(base), "formulation": form, "block_n": 16}
        if form == "dot" and cfg["parallel"] == "m":
            cfg["parallel"] = "n"
        return repair(sp, cfg)

    # -- shape-generic modules -------------------------------------------------------------
    @staticmethod
    def sources(g: dict, c: dict) -> tuple[str, str]:
        """(A source, B source) of the gemm formulation's core: A packed or read in place;
        B packed from its transpose (an NK weight), packed, or read in place."""
        return ("pack" if c["pack_a"] else "direct",
                "pack_t" if g["weight"] == "NK" else ("pack" if c["pack_b"] else "direct"))

    def dims(self, w, config) -> core.Dims:
        """M, N, K and the blocks (``block_n`` for dot, the cache blocks for gemm): kernel
        arguments, so layers of one variant share a module (docs/compile-once.md)."""
        g = w.geometry
        if config["formulation"] == "dot":
            values = {"M": g["M"], "N": g["N"], "K": g["K"], "BN": config["block_n"]}
        else:
            a_src, b_src = self.sources(g, config)
            values = core.gemm_dims(g["M"], g["N"], g["K"], config, b_src, w.dtype, a_src)
        return core.Dims(values, self.literal_dims)

    def codegen(self, workload, config: Config) -> str:
        w = workload
        c = dict(config)
        self.space(w, max(int(c.get("threads", 1)), 1)).validate(config)
        g = w.geometry
        rank = len(w.out_shape)
        epi = Epilogue(w.epilogue, w.out_shape, w.dtype, tuple(range(rank - 1)), (rank - 1,))
        x_idx, w_idx = w.p["anchor_inputs"]
        dims = self.dims(w, c)
        params = ", ".join(f"p{k}" for k in range(len(w.input_specs())))
        signature = f"kernel({params}, out" + (f", {dims.params()}" if dims.runtime else "") + ")"
        shown = {k: v for k, v in sorted(c.items())
                 if k not in self.runtime_knobs and k != "threads"
                 and (k in ("formulation", "parallel") or c["formulation"] == "gemm")}
        a_src, b_src = self.sources(g, c)
        if c["formulation"] == "gemm" and core.grid_split(c, a_src, b_src):
            shown["parallel"] = "m|n"   # the grid's blocks are arguments
        head = [f'"""{w.anchor} (weight {g["weight"]}), {w.dtype}, {c["formulation"]} formulation; '
                f"epilogue: {epi.describe()}.",
                "",
                f"Generated by search_spaces.templates.dense (template dense, version {self.version}) from",
                f"    {json.dumps(shown, separators=(', ', ': '))}",
                f"Called as {signature}: the shape and the blocks are",
                "arguments, so every layer of this variant runs this one compiled module.",
                '"""']
        prep = (([dims.pack()] + dims.unpack()) if dims.runtime else ["geo = ()"]) \
            + epi.prep_lines("out.shape") + [f"X = p{x_idx}.reshape(-1)", f"Wt = p{w_idx}.reshape(-1)",
                                             "Cf = out.reshape(-1)"]
        if c["formulation"] == "dot":
            if g["weight"] != "NK":
                raise InstantiationError("dot needs a row-major [N, K] weight")
            par = c["parallel"] != "none"
            vec = isa.current().lanes(w.dtype)
            consts = [f"DTYPE = {DTYPE_SRC[w.dtype]}", "ZERO = DTYPE(0)",
                      f"VEC, ROWS = {vec}, {DOT_ROWS}   # vector lanes; weight rows sharing each x vector"] \
                + dims.module_lines()
            loop = "prange(N_BLOCKS)" if par else "range(N_BLOCKS)"
            body = prep + [
                "N_BLOCKS = (N + BN - 1) // BN   # blocks of BN weight rows",
                "KV = K - K % VEC                 # the vector part of each row",
                f"for jb in {loop}:",
                "    T = np.empty(VEC, DTYPE)",
                "    for i in range(M):",
                "        xo = i * K",
                "        j = jb * BN",
                "        j1 = min(N, j + BN)",
                "        while j < j1:",
                "            r = min(ROWS, j1 - j)   # rows of this step (ROWS, or the block's last)",
            ]
            acc = [f"a{r}" for r in range(DOT_ROWS)]
            acc2 = [f"b{r}" for r in range(DOT_ROWS)]
            # the next ROWS weight rows requested into L2 at the step's columns: one line
            # per 64 bytes the step reads of a row
            item = np.dtype(w.dtype).itemsize
            lines = max(1, 2 * vec * item // 64)
            pf = [f"                        prefetch_l2(Wt, nxt + {r} * K + k{f' + {q * 64 // item}' if q else ''})"
                  for r in range(DOT_ROWS) for q in range(lines)]
            body += ["            " + " = ".join(acc + acc2) + " = vsplat(ZERO, VEC)",
                     "            if r == ROWS:",
                     "                k = 0",
                     "                nxt = (j + ROWS) * K   # the next rows, streamed into L2 meanwhile",
                     "                ahead = j + 2 * ROWS <= N",
                     "                while k + 2 * VEC <= KV:   # two vectors per row: 8 FMA chains",
                     "                    if ahead:"] + pf + [
                     "                    xv = vload(X, xo + k, VEC)",
                     "                    xw = vload(X, xo + k + VEC, VEC)"]
            body += [f"                    a{r} = vfma(xv, vload(Wt, (j + {r}) * K + k, VEC), a{r})"
                     for r in range(DOT_ROWS)]
            body += [f"                    b{r} = vfma(xw, vload(Wt, (j + {r}) * K + k + VEC, VEC), b{r})"
                     for r in range(DOT_ROWS)]
            body += ["                    k += 2 * VEC",
                     "                if k < KV:",
                     "                    xv = vload(X, xo + k, VEC)"]
            body += [f"                    a{r} = vfma(xv, vload(Wt, (j + {r}) * K + k, VEC), a{r})"
                     for r in range(DOT_ROWS)]
            body += [f"                a{r} = vadd(a{r}, b{r})" for r in range(DOT_ROWS)]
            body += ["            else:",
                     "                for k in range(0, KV, VEC):",
                     "                    a0 = vfma(vload(X, xo + k, VEC), vload(Wt, j * K + k, VEC), a0)",
                     "                r = 1"]
            for r in range(DOT_ROWS):
                body += [f"            if r > {r}:",
                         f"                vstore(T, 0, a{r})",
                         "                s = ZERO",
                         "                for q in range(VEC):",
                         "                    s += T[q]",
                         "                for k in range(KV, K):",
                         f"                    s += X[xo + k] * Wt[(j + {r}) * K + k]",
                         "                v = s",
                         f"                jj = j + {r}"]
                body += ["                " + ln for ln in epi.apply("v", "i", "jj", "i * N + jj")]
                body += ["                Cf[i * N + jj] = v"]
            body += ["            j += r"]
            kern = [f"@numba.njit(cache=True, fastmath=True{', parallel=True' if par else ''})",
                    f"def {signature}:", '    """Every element of out is written."""']
            kern += ["    " + ln for ln in body]
            parts = [head + ["import numba", "import numpy as np", "from numba import prange",
                             "from search_spaces.runtime.simd import prefetch_l2, vadd, vfma, vload, vsplat, vstore"],
                     consts, kern]
            return "\n\n\n".join("\n".join(p) for p in parts) + "\n"
        parts = [head + core.IMPORTS] + core.module_parts(dims, w.dtype, c, a_src, b_src, epi)
        kern = ["@numba.njit(cache=True)", f"def {signature}:",
                '    """Every element of out is written (inputs C-contiguous)."""']
        kern += ["    " + ln for ln in prep + [f"gemm_core(X, 0, Wt, 0, Cf, 0, geo, {epi.args()})"]]
        parts.append(kern)
        return "\n\n\n".join("\n".join(p) for p in parts) + "\n"
