"""injective template: elementwise / broadcast / data-movement groups as one kernel.

Formulations (knob ``formulation``):

- ``loops``: (groups of elementwise and broadcast ops only, chains or DAGs) one loop nest over
  the output; every member op is a scalar expression of the element, each parameter read
  through its broadcast strides (0 on broadcast dims), so nothing is materialised and the
  inner loop vectorises. ``parallel`` runs the outermost loop with ``prange``.
- ``gather``: (data movement -- reshape, transpose, concatenate ... -- then optional
  elementwise ops with broadcast parameters, e.g. a channel shuffle, ``concatenate -> relu``,
  ``concatenate -> multiply -> add -> relu``) copy loops over the
  movement's affine index map, one loop nest per contiguous output segment
  (``search_spaces.templates.injective_gather``); ``parallel`` as for ``loops``.
- ``numpy``: every member op as a NumPy array expression compiled by Numba (reshape,
  transpose/layout_transform, concatenate, expand_dims, squeeze, flatten, constant_of_shape,
  and the elementwise ops); always available, materialises intermediates. It is array code
  (NumPy's functions as Numba compiles them), so builds count and name kernels that use it.
"""
from __future__ import annotations

import json
import math

import numpy as np

from search_spaces.epilogue import DTYPE_SRC, ELEMENTWISE_OPS, effective_shape, scalar_op
from search_spaces.templates.injective_gather import (gather_ok, gather_plan, gather_source,
                                                      parallel_segments, transpose_tile,
                                                      vector_copies)
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.template import Template
from workloads.errors import InstantiationError


def _body_nodes(w):
    body = w.body
    params = {n.name: k for k, n in enumerate(body.inputs)}
    return body, params, [n for n in body.nodes if n.is_compute]


QUANT_OPS = ("quantize", "dequantize")


def has_quant(w) -> bool:
    return any(n.op in QUANT_OPS for n in _body_nodes(w)[2])


def quant_scalar_op(n, args: list[str]) -> str:
    """``quantize``/``dequantize`` of one element, in the reference's float32 arithmetic
    (``workloads.graph.ops.quant``; the kernel is compiled without fastmath so the division
    stays a division)."""
    a = n.attrs
    if n.op == "dequantize":
        return (f"np.float32(np.int32({args[0]}) - np.int32({a['zero_point']})) "
                f"* np.float32({float(a['scale'])!r})")
    from workloads.graph.ops.quant import clamp_bounds
    qmin, qmax = clamp_bounds(a)
    return (f"{DTYPE_SRC[a['dtype']]}(min(max(np.rint(np.float32({args[0]}) / "
            f"np.float32({float(a['scale'])!r})) + np.float32({a['zero_point']}), "
            f"np.float32({qmin})), np.float32({qmax})))")


def loops_ok(w) -> bool:
    """Every member op elementwise/broadcast (and a bias_add's bias a parameter); with
    quantize/dequantize, every other op computes in the group's output dtype."""
    body, params, ops = _body_nodes(w)
    if any(n.op in QUANT_OPS for n in ops):
        return all(n.op in QUANT_OPS or (n.op in ELEMENTWISE_OPS and n.op != "divide"
                                         and n.op != "bias_add" and n.type.dtype == w.dtype)
                   for n in ops)
    for n in ops:
        if n.op not in ELEMENTWISE_OPS:
            return False
        if n.op == "divide" and not w.dtype.startswith("float"):
            return False
        if n.op == "bias_add" and n.inputs[1] not in params:
            return False
    return True


def _array_op(n, args: list[str], types) -> str:
    op, a = n.op, n.attrs
    shape = tuple(n.type.shape)
    shp = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    if op in ("add", "subtract", "multiply", "divide"):
        if op == "divide" and not n.type.dtype.startswith("float"):
            raise InstantiationError("integer divide is not generated (NumPy runs it)")
        sym = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}[op]
        return f"({args[0]} {sym} {args[1]})"
    if op in ("maximum", "minimum"):
        return f"np.{op}({args[0]}, {args[1]})"
    if op == "bias_add":
        rank = len(shape)
        ch = effective_shape({"op": "bias_add", "attrs": dict(a)}, 1, list(types[1].shape), rank)
        return f"({args[0]} + {args[1]}.reshape({tuple(ch)}))"
    if op == "relu":
        return f"np.maximum({args[0]}, ZERO)"
    if op == "clip":
        return f"np.minimum(np.maximum({args[0]}, DTYPE({a['a_min']!r})), DTYPE({a['a_max']!r}))"
    if op in ("sigmoid", "tanh", "sqrt", "exp", "negative", "dropout"):
        if op == "sigmoid":
            return f"(DTYPE(0.5) * (np.tanh(DTYPE(0.5) * {args[0]}) + DTYPE(1.0)))"
        if op == "negative":
            return f"(-{args[0]})"
        if op == "dropout":
            return args[0]
        return f"np.{op}({args[0]})"
    if op in ("reshape", "flatten", "expand_dims", "squeeze"):
        return f"np.ascontiguousarray({args[0]}).reshape({shp})"
    if op in ("transpose", "layout_transform"):
        if op == "transpose":
            axes = a["axes"] if a["axes"] is not None else tuple(reversed(range(types[0].rank)))
            axes = tuple(x % types[0].rank for x in axes)
        else:
            axes = tuple(a["src_layout"].index(ch) for ch in a["dst_layout"])
        return f"np.transpose({args[0]}, {tuple(axes)})"
    if op == "concatenate":
        return f"np.concatenate(({', '.join(args)},), axis={a['axis'] % len(shape)})"
    if op == "constant_of_shape":
        return f"np.full({shp}, {DTYPE_SRC[a['dtype']]}({a['value']!r}))"
    if op == "dequantize":
        return (f"((np.asarray({args[0]}).astype(np.int32) - np.int32({a['zero_point']})).astype(np.float32)"
                f" * np.float32({float(a['scale'])!r}))")
    if op == "quantize":
        from workloads.graph.ops.quant import clamp_bounds
        qmin, qmax = clamp_bounds(a)
        return (f"np.minimum(np.maximum(np.rint(np.asarray({args[0]}).astype(np.float32) / "
                f"np.float32({float(a['scale'])!r})) + np.float32({a['zero_point']}), "
                f"np.float32({qmin})), np.float32({qmax})).astype({DTYPE_SRC[a['dtype']]})")
    raise InstantiationError(f"op {op!r} has no generated code")


# Loop nests with outputs at least this large run on every thread by default; smaller ones
# on one: a parallel region costs ~3.5 us on two Zen 3 cores (OpenMP layer, threads hot),
# about what 2^15 elements of a batch-norm + relu (~1.2 ns each on one thread) save split in
# two. DenseNet-121's 58 batch-norm + relu groups (25k-800k elements) were 9% of its
# one-thread time and all of it serial at two threads (480 x 28 x 28: 0.325 -> 0.177 ms,
# 992 x 14 x 14: 0.231 -> 0.096 ms, min of 40, load ~8). The gather formulation stays on one
# thread by default: in parallel it was slower on DenseNet's two gathers (256 x 56 x 56:
# 0.70 -> 1.40 ms; 1024 x 7 x 7: 0.050 -> 0.086 ms); its ``threads`` knob stays tunable.
# Exceptions: rows of vector copies and transposes copied in tiles (``default_config``).
PARALLEL_MIN_ELEMENTS = 1 << 15


class InjectiveTemplate(Template):
    name = "injective"
    version = 6   # 6: loop nests read rows (1-D slices from 0: the inner loop vectorises)
    #             5: transposes copied in cache-line tiles (injective_gather.transpose_tile)
    #             4: gather over rows of a repeating pattern (NHWC channel concatenations),
    #                  contiguous runs of plain copies as vectors
    workload_kind = "injective"
    entry = "kernel"

    def space(self, workload, max_threads: int = 1) -> ConfigSpace:
        forms = ("loops",) if loops_ok(workload) else ("gather",) if gather_ok(workload) else ()
        if not (has_quant(workload) and forms == ("loops",)):
            forms += ("numpy",)   # quantized: exact either way; the loop nest materialises nothing
        knobs = [Knob("formulation", forms, False,
                      "one scalar loop nest, copy loops over the index map, or NumPy array code"),
                 Knob("threads", tuple(range(1, max(1, max_threads) + 1)), True,
                      "Numba threads (loops: prange over the two outer dimensions; gather: "
                      "over each large segment's outer loop)")]

        def threads(c):
            if c["threads"] > 1 and c["formulation"] == "numpy":
                return "the numpy formulation runs on one thread"
            return None
        return ConfigSpace(knobs, [Constraint("threads", threads)])

    def default_config(self, workload, max_threads: int = 1) -> Config:
        form = self.space(workload).knob("formulation").values[0]
        big = math.prod(workload.out_shape) >= PARALLEL_MIN_ELEMENTS
        # rows of vector copies (an NHWC channel concat) split well: SqueezeNet's 54 x 54 x
        # 128, standalone, 0.035 ms on 1 thread, 0.022 ms on 2
        rows = (form == "gather" and gather_plan(workload)["rows"] is not None
                and all(vector_copies(workload, max(1, max_threads))))
        # a transpose copied in tiles splits well too (standalone, 1 -> 2 threads: NHWC ->
        # NCHW 56 x 56 x 256 0.58 -> 0.32 ms, NCHW -> NHWC 256 x 56 x 56 0.34 -> 0.26)
        tiled = form == "gather" and gather_plan(workload)["rows"] is None and any(
            transpose_tile(dims, np.dtype(workload.dtype).itemsize) is not None
            for _, _, _, dims in gather_plan(workload)["segments"])
        threads = max(1, max_threads) if (form == "loops" or rows or tiled) and big else 1
        return Config({"formulation": form, "threads": threads})

    def codegen(self, workload, config: Config) -> str:
        w = workload
        c = dict(config)
        self.space(w, max(int(c.get("threads", 1)), 1)).validate(config)
        body, params, ops = _body_nodes(w)
        nparams = len(w.input_specs())
        shape = ("[" + ", ".join(f"S{d}" for d in range(len(w.out_shape) or 1)) + "]"
                 if c["formulation"] == "loops" else str(list(w.out_shape)))
        head = [f'"""injective group {" -> ".join(n.op for n in ops)}: -> {shape} {w.dtype}.',
                "",
                f"Generated by search_spaces.templates.injective (version {self.version}) from "
                f"{json.dumps(dict(sorted(c.items())))}",
                '"""', "import numba", "import numpy as np", "from numba import prange", "",
                f"DTYPE = {DTYPE_SRC[w.dtype]}", "ZERO = DTYPE(0)"]
        sig = ", ".join([f"p{k}" for k in range(nparams)] + ["out"])
        names = {p.name: f"p{k}" for k, p in enumerate(body.inputs)}
        if c["formulation"] == "numpy":
            lines = []
            for k, n in enumerate(ops):
                types = [body.type_of(i) for i in n.inputs]
                names[n.name] = f"t{k}"
                lines.append(f"t{k} = {_array_op(n, [names[i] for i in n.inputs], types)}   # {n.op}")
            res = names[body.outputs[0]]
            lines.append(f"out.reshape(-1)[:] = np.ascontiguousarray({res}).reshape(-1)")
            kern = ["@numba.njit(cache=True)", f"def kernel({sig}):"] + ["    " + ln for ln in lines]
            return "\n".join(head) + "\n\n\n" + "\n".join(kern) + "\n"
        if c["formulation"] == "gather":
            jit = "@numba.njit(cache=True" + (", parallel=True)" if any(parallel_segments(w, c["threads"]))
                                              else ")")
            kern = [jit, f"def kernel({sig}):",
                    '    """Copy loops over the index map, one loop nest per output segment."""']
            kern += ["    " + ln for ln in gather_source(w, c["threads"])]
            if any(vector_copies(w, c["threads"])):
                head.insert(head.index("from numba import prange") + 1,
                            "from search_spaces.runtime.simd import vload_n, vstore_n")
            return "\n".join(head) + "\n\n\n" + "\n".join(kern) + "\n"
        sig += "".join(f", {name}" for name in self.runtime_arg_names(w, config))
        return "\n".join(head) + "\n\n\n" + "\n".join(self._loops(w, body, ops, c, sig)) + "\n"

    # Shape-generic loop nests: the output's extents are arguments (``s0, s1, ...``) and each
    # parameter's strides products of them over its non-broadcast dimensions, so the groups of
    # a model that apply the same ops with the same broadcast pattern (DenseNet's 58
    # batch-norm + relu groups) share one compiled module.
    def runtime_args(self, workload, config: Config) -> tuple:
        if config["formulation"] != "loops":
            return ()
        return tuple(int(x) for x in (tuple(workload.out_shape) or (1,)))

    def runtime_arg_names(self, workload, config: Config) -> tuple[str, ...]:
        return tuple(f"s{d}" for d in range(len(self.runtime_args(workload, config))))

    def _loops(self, w, body, ops, c, sig: str) -> list[str]:
        params = {p.name: k for k, p in enumerate(body.inputs)}
        shape = tuple(w.out_shape) or (1,)
        rank = len(shape)
        idx = [f"i{d}" for d in range(rank)]
        ext = [f"S{d}" for d in range(rank)]

        def index_of(t_shape, dims=None) -> str:
            """Flat index of a parameter of shape ``t_shape`` (broadcast dims: stride 0),
            over ``dims`` (default: all)."""
            t_shape = (1,) * (rank - len(t_shape)) + tuple(t_shape)
            terms = []
            for d in range(rank) if dims is None else dims:
                if t_shape[d] == 1:
                    continue
                stride = " * ".join(ext[e] for e in range(d + 1, rank) if t_shape[e] != 1)
                terms.append(f"{idx[d]} * {stride}" if stride else idx[d])
            return " + ".join(terms) or "0"

        lines = [", ".join(ext) + " = " + ", ".join(x.lower() for x in ext)
                 + "   # output extents: arguments"]
        lines += [f"e{k} = p{k}.reshape(-1)" for k in range(len(body.inputs))]
        lines.append("Cf = out.reshape(-1)")
        par = c["threads"] > 1
        ind = ""
        first = 0
        if par and rank >= 2:
            # the two outer dimensions as one parallel loop (batch 1: the channels split)
            lines += [f"for f01 in prange({ext[0]} * {ext[1]}):",
                      f"    {idx[0]} = f01 // {ext[1]}",
                      f"    {idx[1]} = f01 - {idx[0]} * {ext[1]}"]
            ind, first = "    ", 2
        # The innermost loop reads rows: each operand's row (or, broadcast along the last
        # dimension, its one value) is taken before it, so the loop indexes 1-D slices from
        # 0 and vectorises. Indexed by the flat expression instead, Numba could not prove
        # the index non-negative and guarded every access: DenseNet-121's batch-norm + relu
        # groups (56 x 56 x 224, NHWC) ran 0.678 ms against 0.118 ms (AMD Zen 4, 1 thread).
        rows = first < rank and not (par and rank == 1)   # a parallel 1-D loop stays one
        for d in range(first, rank - 1 if rows else rank):
            rng = f"prange({ext[d]})" if d == 0 and par else f"range({ext[d]})"
            lines.append(f"{ind}for {idx[d]} in {rng}:")
            ind += "    "
        before: list[str] = []
        last = idx[rank - 1]

        def ref(arr: str, t_shape, tag: str) -> str:
            """``arr``'s element for the current output element (see ``rows``)."""
            if not rows:
                return f"{arr}[{index_of(t_shape)}]"
            base = index_of(t_shape, range(rank - 1))
            t_full = (1,) * (rank - len(t_shape)) + tuple(t_shape)
            if t_full[-1] == 1:   # constant along the row
                before.append(f"{ind}v{tag} = {arr}[{base}]")
                return f"v{tag}"
            before.append(f"{ind}r{tag} = {arr}[{base}:{base} + {ext[-1]}]" if base != "0"
                          else f"{ind}r{tag} = {arr}[:{ext[-1]}]")
            return f"r{tag}[{last}]"

        names: dict[str, str] = {}
        for k, p in enumerate(body.inputs):
            names[p.name] = ref(f"e{k}", p.type.shape, str(k))
        channels = {}   # a bias_add's bias, read along its channel axis
        for k, n in enumerate(ops):
            if n.op == "bias_add":
                ch = effective_shape({"op": "bias_add", "attrs": dict(n.attrs)}, 1,
                                     list(body.type_of(n.inputs[1]).shape), rank)
                channels[k] = ref(f"e{params[n.inputs[1]]}", ch, f"b{k}")
        out_ref = ref("Cf", shape, "o")
        if rows:
            lines += before + [f"{ind}for {last} in range({ext[-1]}):"]
            ind += "    "
        for k, n in enumerate(ops):
            args = [names[i] for i in n.inputs]
            if n.op == "bias_add":
                args[1] = channels[k]
            expr = quant_scalar_op(n, args) if n.op in QUANT_OPS else \
                scalar_op(n.op, dict(n.attrs), args, w.dtype)
            lines.append(f"{ind}t{k} = {expr}   # {n.op}")
            names[n.name] = f"t{k}"
        lines.append(f"{ind}{out_ref} = {names[body.outputs[0]]}")
        fast = "False" if any(n.op in QUANT_OPS for n in ops) else "True"   # exact quantize
        jit = f"@numba.njit(cache=True, fastmath={fast}" + (", parallel=True)" if par else ")")
        doc = '    """One loop nest over the output; parameters read through broadcast strides."""'
        return [jit, f"def kernel({sig}):", doc] + ["    " + ln for ln in lines]
