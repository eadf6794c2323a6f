"""fixed template: untuned kernels for pooling, softmax and LRN (with their epilogue).

One point per workload. ``codegen`` writes plain Numba loops for ``max_pool2d``,
``avg_pool2d`` (padding, ceil mode, count_include_pad), ``global_avg_pool2d`` (NCHW or any
layout), ``softmax`` (any axis) and ``lrn`` (any channel axis), each followed by the group's
elementwise epilogue on every output element. NCHW pools (float, and 8-bit max pools with or
without a trailing dequantize) have vector forms (``fixed_vector``) whose ``threads`` knob
splits the planes. Anything else (batch_matmul, integer ops,
grouped convolutions the conv2d and depthwise_conv2d templates do not generate ...) raises
``InstantiationError``: the model builder then runs that
group with the NumPy reference executor, and says so.
"""
from __future__ import annotations

import math

from search_spaces.epilogue import DTYPE_SRC, Epilogue
from search_spaces import isa
from search_spaces.templates.fixed_vector import (VEC_NAMES, lrn_last_axis_vector_source,
                                                  lrn_vector, lrn_vector_source,
                                                  max_pool_vector, pool8_nchw_vector,
                                                  pool_nchw_vector, pool_nhwc_vector,
                                                  pool_nhwc_vector_applies, pool_vector,
                                                  split_loop, window_count)
from search_spaces.space import Config, ConfigSpace, Knob
from search_spaces.template import Template
from workloads.errors import InstantiationError

GENERATED = ("max_pool2d", "avg_pool2d", "global_avg_pool2d", "softmax", "lrn")
POOLS = ("max_pool2d", "avg_pool2d", "global_avg_pool2d")
PARALLEL_READS = 1 << 16   # a vector pool reading fewer input elements runs on one thread


def _main(w) -> tuple[str, dict, list[dict]]:
    """(op, attrs, epilogue) of the group: its first op and the chain after it."""
    if w.p.get("body"):
        raise InstantiationError("fixed kernels are generated for chains only")
    if w.anchor is not None:
        return w.anchor, w.attrs, w.epilogue
    if not w.epilogue:
        raise InstantiationError("empty group")
    first = w.epilogue[0]
    return first["op"], first["attrs"], w.epilogue[1:]


def _convert_expr(convert: dict, operand: str) -> str:
    """The scalar expression of the (de)quantize op ``convert`` (an epilogue entry) applied
    to ``operand``: how a pooled value is converted as it is stored."""
    from types import SimpleNamespace

    from search_spaces.templates.injective import quant_scalar_op
    return quant_scalar_op(SimpleNamespace(op=convert["op"], attrs=convert["attrs"]), [operand])


class FixedTemplate(Template):
    name = "fixed"
    version = 8   # 7: NHWC max/avg pools in vectors of channels, NHWC global average pool by rows;
                  # 8: several channel vectors per NHWC pool step where VEC divides the channels
    workload_kind = "fixed"
    tunable = False   # one point per workload: nothing to search
    entry = "kernel"

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        planes = self._vector_planes(workload) or self._lrn_rows(workload)
        if not planes:
            return ConfigSpace([Knob("threads", (1,), True, "scalar fixed kernels run on one thread")])
        return ConfigSpace([Knob("threads", tuple(range(1, min(max(1, max_threads), planes) + 1)), True,
                                 "Numba threads (vector pools: planes split across them)")])

    def default_config(self, workload, max_threads: int = 1) -> Config:
        """One thread, or every thread for a vector pool reading at least PARALLEL_READS
        input elements (ShuffleNet's 24 x 56 x 56 3x3/2 average pool: 75k)."""
        threads = self.space(workload, max_threads).knob("threads").values[-1]
        if math.prod(workload.p["inputs"][0][0]) < PARALLEL_READS:
            threads = 1
        return Config({"threads": threads})

    @staticmethod
    def _vector_planes(w) -> int:
        """The (n, c) planes of a pool the vector form generates (0 when the scalar one runs)."""
        try:
            op, attrs, epilogue = _main(w)
        except InstantiationError:
            return 0
        in_dtype = w.p["inputs"][0][1]
        if not (FixedTemplate._pool8(w) or FixedTemplate._pool_quantize(w)) and (
                op not in POOLS or epilogue or in_dtype != w.dtype or not w.dtype.startswith("float")):
            return 0
        xs = tuple(w.p["inputs"][0][0])
        if pool_nhwc_vector_applies(op, attrs) and not FixedTemplate._pool_quantize(w):
            return xs[0] * tuple(w.out_shape)[1]   # NHWC: output rows
        if not pool_vector(op, attrs):
            return 0
        return xs[0] * xs[1] if len(xs) == 4 else 0

    @staticmethod
    def _lrn_rows(w) -> int:
        """The rows of an LRN across the last axis (``_lrn_last_axis``, split across threads;
        0 for any other kernel)."""
        try:
            op, attrs, _ = _main(w)
        except InstantiationError:
            return 0
        xs = tuple(w.p["inputs"][0][0])
        if op != "lrn" or attrs["axis"] % len(xs) != len(xs) - 1 or not w.dtype.startswith("float"):
            return 0
        return math.prod(xs[:-1])

    @staticmethod
    def _pool_quantize(w) -> bool:
        """A float max pool followed by a quantize (an FP32 pool feeding a quantized op):
        pooled in float vectors, each converted to 8 bits as it is stored."""
        try:
            op, _, epilogue = _main(w)
        except InstantiationError:
            return False
        return (op == "max_pool2d" and w.p["inputs"][0][1].startswith("float")
                and len(epilogue) == 1 and epilogue[0]["op"] == "quantize")

    @staticmethod
    def _pool8(w) -> bool:
        """An 8-bit max pool with the vector form (``pool8_nchw_vector``): uint8/int8 in, the
        same dtype out or a dequantize after it; NCHW, horizontal stride 1 or 2."""
        try:
            op, attrs, epilogue = _main(w)
        except InstantiationError:
            return False
        in_dtype = w.p["inputs"][0][1]
        if op != "max_pool2d" or in_dtype not in ("uint8", "int8") or len(w.p["inputs"][0][0]) != 4:
            return False
        plain = not epilogue and w.dtype == in_dtype
        deq = len(epilogue) == 1 and epilogue[0]["op"] == "dequantize" and w.dtype == "float32"
        return (plain or deq) and max_pool_vector(attrs)

    def codegen(self, workload, config: Config) -> str:
        w = workload
        threads = int(config.get("threads", 1))
        self.space(w, threads).validate(config)
        op, attrs, epilogue = _main(w)
        if op not in GENERATED:
            raise InstantiationError(f"no generated kernel for {op!r} (the NumPy reference runs it)")
        # max pooling of 8-bit values, and max pooling followed by a (de)quantize (where an
        # 8-bit value meets FP32 ops): pooled in the input's dtype, then converted exactly
        in_dtype = w.p["inputs"][0][1]
        convert = None
        if op == "max_pool2d" and len(epilogue) == 1 and epilogue[0]["op"] in ("quantize", "dequantize"):
            convert, epilogue = epilogue[0], []
        int_pool = op == "max_pool2d" and in_dtype in ("uint8", "int8") and not epilogue
        if not w.dtype.startswith("float") and not int_pool and convert is None:
            raise InstantiationError(f"{op} on {w.dtype} is not generated (NumPy runs it)")
        shape = tuple(w.out_shape)
        self._threads = threads
        self._float = in_dtype.startswith("float")
        self._lowest = ("LOWEST" if not self._float else "DTYPE(-np.inf)" if in_dtype == w.dtype
                        else f"{DTYPE_SRC[in_dtype]}(-np.inf)")
        epi = Epilogue(epilogue, shape, w.dtype, tuple(range(len(shape))), ())
        x_shape = tuple(w.p["inputs"][0][0])
        n_params = len(w.input_specs())
        sig = ", ".join([f"p{k}" for k in range(n_params)] + ["out"])
        lines = epi.prep_lines() + ["X = p0", "Cf = out.reshape(-1)"]
        imports = ["import numba", "import numpy as np"]
        vec = isa.current().lanes(w.dtype)
        pool8 = self._pool8(w)
        vector = (self._vector_planes(w) > 0
                  or not epilogue and op == "lrn" and w.dtype == in_dtype and lrn_vector(attrs, x_shape))
        if pool8 or vector:
            # Outputs as vectors (search_spaces.templates.fixed_vector); the kernel stores them itself.
            ops = "vmax" if pool8 else "vdiv, vmax, vmul"
            imports += [f"from search_spaces.runtime.simd import {', '.join(VEC_NAMES)}",
                        f"from search_spaces.runtime.vector_ops import {ops}"]
        if threads > 1:
            imports.append("from numba import prange")
        if pool8:
            # 8-bit max pooling: vector_bits / 8 lanes (32 on AVX2), whole-vector loads and stores
            deq = _convert_expr(convert, "T[i]") if convert is not None else None
            lines += pool8_nchw_vector(attrs, x_shape, shape, isa.current().vector_bits // 8,
                                       threads, deq)
        elif vector:
            quant = None
            if op in POOLS and convert is not None:   # a float max pool, then a quantize
                quant = _convert_expr(convert, "T[i]")
                vec = isa.current().lanes(in_dtype)
            if op in POOLS and attrs["layout"] == "NHWC":
                lines += pool_nhwc_vector(op, attrs, x_shape, shape, vec, threads)
            elif op in POOLS:
                lines += pool_nchw_vector(op, attrs, x_shape, shape, vec, threads, quant)
            elif attrs["axis"] % len(x_shape) == len(x_shape) - 1:
                lines += lrn_last_axis_vector_source(attrs, x_shape, vec, threads)
            else:
                lines += lrn_vector_source(attrs, x_shape, vec)
        else:
            body = getattr(self, "_" + op)(attrs, x_shape, shape)
            lines += body
            # Every generator leaves the value in ``v`` and its flat output index in ``f``.
            ind = " " * (len(body[-1]) - len(body[-1].lstrip()))
            lines += [ind + ln for ln in epi.apply("v", "f", "f", "f")]
            if convert is not None:
                lines.append(f"{ind}v = {_convert_expr(convert, 'v')}   # {convert['op']}")
            lines += [ind + "Cf[f] = v"]
        head = [f'"""fixed kernel: {w.summary()} {list(x_shape)} -> {list(shape)} {w.dtype}.',
                "", f"Generated by search_spaces.templates.fixed (version {self.version}).", '"""',
                *imports, "",
                f"DTYPE = {DTYPE_SRC[w.dtype]}", "ZERO = DTYPE(0)"]
        if not self._float:
            head.append(f"LOWEST = {DTYPE_SRC[in_dtype]}({-128 if in_dtype == 'int8' else 0})"
                        "   # the lowest level (the reference's padding)")
        if not self._float or in_dtype != w.dtype:
            head.append(f"IN_DTYPE = {DTYPE_SRC[in_dtype]}   # the input's dtype")
        jit = "@numba.njit(cache=True" + (", parallel=True)" if threads > 1 else ")")
        kern = [jit, f"def kernel({sig}):"] + ["    " + ln for ln in lines]
        return "\n".join(head) + "\n\n\n" + "\n".join(kern) + "\n"

    # -- generators: each returns loop lines ending in the element's statement ------------
    @staticmethod
    def _dims(layout: str, shape: tuple) -> dict:
        return {ch: shape[layout.index(ch)] for ch in "NCHW"}

    @staticmethod
    def _window(a: dict, x: dict, ind: str) -> list[str]:
        """The lines bounding output pixel (oh, ow)'s pooling window in the input: rows
        h0..h1, columns w0..w1 (h0, w0 may be negative: padding)."""
        (kh, kw), (sh, sw) = a["pool_size"], a["strides"]
        pt, pl = a["padding"][:2]
        return [f"{ind}h0 = oh * {sh} - {pt}", f"{ind}w0 = ow * {sw} - {pl}",
                f"{ind}h1 = min(h0 + {kh}, {x['H']})", f"{ind}w1 = min(w0 + {kw}, {x['W']})"]

    def _pool(self, a: dict, xs: tuple, os: tuple, kind: str) -> list[str]:
        lay = a["layout"]
        if lay == "NHWC":
            return self._pool_nhwc(a, xs, os, kind)
        x, o = self._dims(lay, xs), self._dims(lay, os)
        loops = {"N": "n", "C": "c", "H": "oh", "W": "ow"}
        ext = {"N": o["N"], "C": o["C"], "H": o["H"], "W": o["W"]}
        # Loop in memory order of the output (innermost dimension contiguous).
        lines, ind = [], ""
        for ch in lay:
            lines.append(f"{ind}for {loops[ch]} in range({ext[ch]}):")
            ind += "    "
        xidx = {"N": "n", "C": "c", "H": "ih", "W": "iw"}
        xflat = " + ".join(f"{xidx[ch]} * {math.prod(xs[lay.index(ch) + 1:])}" for ch in lay)
        oflat = " + ".join(f"{loops[ch]} * {math.prod(os[lay.index(ch) + 1:])}" for ch in lay)
        lines += self._window(a, x, ind)
        if kind == "max":
            # the lowest value of the dtype, as the reference pads (8-bit: the lowest level)
            lines += [f"{ind}v = {self._lowest}",
                      f"{ind}for ih in range(max(h0, 0), h1):",
                      f"{ind}    for iw in range(max(w0, 0), w1):",
                      f"{ind}        xv = Xf[{xflat}]",
                      f"{ind}        if xv > v:",
                      f"{ind}            v = xv"]
        else:
            lines += [f"{ind}s = 0.0",
                      f"{ind}for ih in range(max(h0, 0), h1):",
                      f"{ind}    for iw in range(max(w0, 0), w1):",
                      f"{ind}        s += Xf[{xflat}]",
                      f"{ind}v = DTYPE(s / {window_count(a, x['H'], x['W'])})"]
        lines.append(f"{ind}f = {oflat}")
        return ["Xf = X.reshape(-1)"] + lines

    def _pool_nhwc(self, a: dict, xs: tuple, os: tuple, kind: str) -> list[str]:
        """NHWC pooling: per output pixel, the window's bounds once, then per channel the
        window folded into one scalar (the channel loop outermost: LLVM vectorizes it across
        channels, a max as ``vmaxps``). One value per element as the NCHW loops (``v``,
        ``f``), so the epilogue is the same. Measured on SqueezeNet's 111 x 111 x 64 3x3/2 max
        pool: 0.06 ms; a row of accumulators updated per window row did not vectorize (0.23
        ms), the NCHW loop order on NHWC data (bounds inside the channel loop) took 1.1 ms on
        ResNet-50's 112 x 112 x 64."""
        x, o = self._dims("NHWC", xs), self._dims("NHWC", os)
        C = o["C"]
        lines = ["Xf = X.reshape(-1)",
                 f"for n in range({o['N']}):",
                 f"    for oh in range({o['H']}):",
                 f"        for ow in range({o['W']}):"]
        ind = " " * 12
        lines += self._window(a, x, ind)
        if kind != "max":
            lines.append(f"{ind}cnt = {window_count(a, x['H'], x['W'])}")
        lines += [f"{ind}fb = ((n * {o['H']} + oh) * {o['W']} + ow) * {C}",
                  f"{ind}for c in range({C}):",
                  f"{ind}    v = {self._lowest}" if kind == "max" else f"{ind}    s = 0.0",
                  f"{ind}    for ih in range(max(h0, 0), h1):",
                  f"{ind}        for iw in range(max(w0, 0), w1):",
                  f"{ind}            xv = Xf[((n * {x['H']} + ih) * {x['W']} + iw) * {C} + c]"]
        if kind == "max":
            lines.append(f"{ind}            v = xv if xv > v else v")
        else:
            lines += [f"{ind}            s += xv", f"{ind}    v = DTYPE(s / cnt)"]
        lines.append(f"{ind}    f = fb + c")
        return lines

    @staticmethod
    def _lrn_last_axis(a, outer: int, L: int, size: int, lo: int, threads: int = 1) -> list[str]:
        """LRN across a contiguous axis (NHWC channels): per row, the squares into a
        zero-bordered row, the window sums as ``size`` shifted reads (loops that vectorize),
        the power by square roots where beta is 0.5, 0.75 or 1 (the NCHW scalar form took
        9.6 ms for Inception v1's 56 x 56 x 192 LRN: a window loop and a ``pow`` per value).
        The rows split into ``threads`` ranges, each with its own row of squares (ZFNet-512's
        first LRN at 2 threads: 3.5 ms on one thread, where the NCHW vector form split its
        planes)."""
        beta = float(a["beta"])
        power = {0.5: "np.sqrt(d)", 0.75: "np.sqrt(d) * np.sqrt(np.sqrt(d))", 1.0: "d"}.get(
            beta, f"d ** {beta!r}")
        window = " + ".join(f"sq[t + {j}]" for j in range(size))
        scratch = [f"sq = np.zeros({L + size}, DTYPE)   # squares of one row, zero past its ends"]
        return ["Xf = X.reshape(-1)"] + split_loop(threads, scratch, str(outer), "o", "th") + [
                f"        base = o * {L}",
                f"        for t in range({L}):",
                "            xv = Xf[base + t]",
                f"            sq[t + {lo}] = xv * xv",
                f"        for t in range({L}):",
                f"            d = DTYPE({a['bias']!r}) + DTYPE({a['alpha'] / size!r}) * ({window})",
                "            f = base + t",
                f"            v = DTYPE(Xf[f] / ({power}))"]

    def _max_pool2d(self, a, xs, os):
        return self._pool(a, xs, os, "max")

    def _avg_pool2d(self, a, xs, os):
        return self._pool(a, xs, os, "avg")

    def _global_avg_pool2d(self, a, xs, os):
        lay = a["layout"]
        if lay == "NHWC":
            # rows of channels summed into a row of float64 accumulators (vectorizes; the
            # transpose to planes below took 0.13 ms for SqueezeNet's 13 x 13 x 1000)
            x = self._dims("NHWC", xs)
            C, hw = x["C"], x["H"] * x["W"]
            return ["Xf = X.reshape(-1)",
                    f"acc = np.empty({C}, np.float64)",
                    f"for n in range({x['N']}):",
                    f"    for c in range({C}):",
                    "        acc[c] = 0.0",
                    f"    for t in range({hw}):",
                    f"        xb = (n * {hw} + t) * {C}",
                    f"        for c in range({C}):",
                    "            acc[c] += Xf[xb + c]",
                    f"    for c in range({C}):",
                    f"        f = n * {C} + c",
                    f"        v = DTYPE(acc[c] / {hw})"]
        axes = (lay.index("H"), lay.index("W"))
        # Move H, W last (a view), sum each (n, c) plane in float64.
        perm = tuple(d for d in range(4) if d not in axes) + axes
        hw = xs[axes[0]] * xs[axes[1]]
        n_out = math.prod(os)
        return [f"Xt = np.ascontiguousarray(np.transpose(X, {perm})).reshape({n_out}, {hw})",
                f"for f in range({n_out}):",
                "    s = 0.0",
                f"    for t in range({hw}):",
                "        s += Xt[f, t]",
                f"    v = DTYPE(s / {hw})"]

    def _softmax(self, a, xs, os):
        ax = a["axis"] % len(xs)
        outer, L, inner = math.prod(xs[:ax]), xs[ax], math.prod(xs[ax + 1:])
        return ["Xf = X.reshape(-1)",
                f"for o in range({outer}):",
                f"    for i in range({inner}):",
                f"        base = o * {L * inner} + i",
                "        m = DTYPE(-np.inf)",
                f"        for t in range({L}):",
                f"            m = max(m, Xf[base + t * {inner}])",
                "        s = 0.0",
                f"        for t in range({L}):",
                f"            s += np.exp(Xf[base + t * {inner}] - m)",
                f"        for t in range({L}):",
                f"            f = base + t * {inner}",
                "            v = DTYPE(np.exp(Xf[f] - m) / s)"]

    def _lrn(self, a, xs, os):
        ax = a["axis"] % len(xs)
        outer, L, inner = math.prod(xs[:ax]), xs[ax], math.prod(xs[ax + 1:])
        size = a["size"]
        lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
        if inner == 1:
            return self._lrn_last_axis(a, outer, L, size, lo, self._threads)
        return ["Xf = X.reshape(-1)",
                f"for o in range({outer}):",
                f"    for i in range({inner}):",
                f"        base = o * {L * inner} + i",
                f"        for t in range({L}):",
                "            s = 0.0",
                f"            for u in range(max(0, t - {lo}), min({L}, t + {hi} + 1)):",
                f"                xv = np.float64(Xf[base + u * {inner}])",
                "                s += xv * xv",
                f"            f = base + t * {inner}",
                f"            v = DTYPE(Xf[f] / ({a['bias']!r} + {a['alpha'] / size!r} * s) ** {a['beta']!r})"]
