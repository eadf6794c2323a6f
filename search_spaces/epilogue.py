"""Epilogue code generation shared by the fused templates (conv2d, dense, injective, fixed).

A fused group's epilogue is an ordered list of elementwise/broadcast ops (``EpilogueOp.params()``
dicts: op, attrs, operand = position of the running value, others = [param index, shape,
dtype]). ``Epilogue`` turns it into straight-line scalar statements applied to one output
element held in a local variable, reading the other operands through flat arrays.

Each operand is classified against a 2-D view of the output that the kernel computes:
``outer`` dims (a batch loop), ``row`` dims and ``col`` dims (the GEMM's rows and columns):

- ``scalar``: one value;                      read ``e[0]``
- ``row``: varies over exactly the row dims;  read ``e[row]``  (e.g. NCHW per-channel bias)
- ``col``: varies over exactly the col dims;  read ``e[col]``  (NHWC / dense bias)
- ``full``: varies over every non-1 dim;      read ``e[flat]`` (residual add)
- ``general``: anything else — broadcast to the output shape once per call, then ``full``.
"""
from __future__ import annotations

import math

from workloads.errors import InstantiationError

DTYPE_SRC = {"float32": "np.float32", "float64": "np.float64", "int32": "np.int32", "int64": "np.int64",
             "uint8": "np.uint8", "int8": "np.int8"}


def effective_shape(op: dict, k: int, shape: list[int], out_rank: int) -> tuple[int, ...]:
    """The operand's shape right-aligned to the output rank (bias_add's vector on its axis)."""
    if op["op"] == "bias_add":
        axis = op["attrs"].get("axis", 1) % out_rank
        return tuple(shape[0] if d == axis else 1 for d in range(out_rank))
    shape = tuple(shape)
    return (1,) * (out_rank - len(shape)) + shape


def classify(shape: tuple[int, ...], out_shape: tuple[int, ...], rows: tuple[int, ...],
             cols: tuple[int, ...]) -> str:
    varying = {d for d, (s, o) in enumerate(zip(shape, out_shape)) if s == o and o > 1}
    if any(s != 1 and s != o for s, o in zip(shape, out_shape)):
        raise InstantiationError(f"operand shape {list(shape)} does not broadcast to {list(out_shape)}")
    big = {d for d, o in enumerate(out_shape) if o > 1}
    if not varying:
        return "scalar"
    if varying == big:
        return "full"
    if varying == {d for d in cols if out_shape[d] > 1}:
        return "col"
    if varying == {d for d in rows if out_shape[d] > 1}:
        return "row"
    return "general"


def _lit(x: float, dtype: str) -> str:
    if math.isinf(x):
        return f"DTYPE({'-' if x < 0 else ''}np.inf)"
    return f"DTYPE({x!r})"


def scalar_op(op: str, attrs: dict, args: list[str], dtype: str) -> str:
    """Source of one elementwise op on scalar expressions ``args`` (inputs in op order)."""
    is_float = dtype.startswith("float")
    a = args
    if op == "add":
        return f"({a[0]} + {a[1]})"
    if op == "subtract":
        return f"({a[0]} - {a[1]})"
    if op == "multiply":
        return f"({a[0]} * {a[1]})"
    if op == "divide":
        if not is_float:
            raise InstantiationError("integer divide is not generated (NumPy runs it)")
        return f"({a[0]} / {a[1]})"
    if op == "maximum":
        return f"max({a[0]}, {a[1]})"
    if op == "minimum":
        return f"min({a[0]}, {a[1]})"
    if op == "bias_add":
        return f"({a[0]} + {a[1]})"
    if op == "relu":
        return f"max({a[0]}, ZERO)"
    if op == "clip":
        return f"min(max({a[0]}, {_lit(attrs['a_min'], dtype)}), {_lit(attrs['a_max'], dtype)})"
    if op == "sigmoid":
        return f"(DTYPE(0.5) * (np.tanh(DTYPE(0.5) * {a[0]}) + DTYPE(1.0)))"
    if op in ("tanh", "sqrt", "exp"):
        return f"np.{op}({a[0]})"
    if op == "negative":
        return f"(-{a[0]})"
    if op == "dropout":
        return a[0]
    raise InstantiationError(f"no scalar code for op {op!r}")


ELEMENTWISE_OPS = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "bias_add",
                   "relu", "clip", "sigmoid", "tanh", "sqrt", "exp", "negative", "dropout")


VECTOR_IMPORTS = "from search_spaces.runtime.vector_ops import vdiv, vmax, vmin, vmul, vsub"


def vector_op(op: str, attrs: dict, args: list[str], lanes: int) -> str | None:
    """Source of one epilogue op on vector expressions (None: no vector form, run scalar)."""
    a = args

    def splat(x: float) -> str:
        return f"vsplat({_lit(x, 'float32')}, {lanes})"
    if op in ("add", "bias_add"):
        return f"vadd({a[0]}, {a[1]})"
    if op == "subtract":
        return f"vsub({a[0]}, {a[1]})"
    if op == "multiply":
        return f"vmul({a[0]}, {a[1]})"
    if op == "divide":
        return f"vdiv({a[0]}, {a[1]})"
    if op == "maximum":
        return f"vmax({a[0]}, {a[1]})"
    if op == "minimum":
        return f"vmin({a[0]}, {a[1]})"
    if op == "relu":
        return f"vmax({a[0]}, vsplat(ZERO, {lanes}))"
    if op == "clip":
        return f"vmin(vmax({a[0]}, {splat(attrs['a_min'])}), {splat(attrs['a_max'])})"
    if op == "negative":
        return f"vsub(vsplat(ZERO, {lanes}), {a[0]})"
    if op == "dropout":
        return a[0]
    return None


class Epilogue:
    """Scalar epilogue code for one group, against an output view (outer, rows, cols)."""

    def __init__(self, epilogue: list[dict], out_shape: tuple[int, ...], dtype: str,
                 rows: tuple[int, ...], cols: tuple[int, ...], prefix: str = "e"):
        """``prefix``: of the flat operand names (``e<k>``; another one for a second op chain
        in the same kernel, e.g. a conv's prologue ``q<k>``)."""
        self.prefix = prefix
        self.ops = epilogue
        self.out_shape = tuple(out_shape)
        self.dtype = dtype
        self.operands: dict[int, str] = {}   # param index -> access kind
        rank = len(out_shape)
        for e in epilogue:
            if e["op"] not in ELEMENTWISE_OPS:
                raise InstantiationError(f"epilogue op {e['op']!r} has no generated code")
            scalar_op(e["op"], e["attrs"], ["x"] * (1 + len(e["others"])), dtype)  # validates
            for k, shape, _dt in e["others"]:
                kind = classify(effective_shape(e, k, shape, rank), self.out_shape, rows, cols)
                prev = self.operands.get(k)
                if prev is not None and prev != kind:
                    kind = "general" if "general" in (prev, kind) else "full"
                self.operands[k] = kind

    @property
    def params(self) -> list[int]:
        return sorted(self.operands)

    def arg_names(self) -> list[str]:
        return [f"{self.prefix}{k}" for k in self.params]

    def args(self) -> str:
        """Comma-separated flat operand names, with a trailing comma when any."""
        names = self.arg_names()
        return "".join(n + ", " for n in names)

    def prep_lines(self, shape: str | None = None) -> list[str]:
        """Kernel-start statements making the flat operand arrays ``e<k>`` from ``p<k>``;
        ``shape``: the output shape's source expression (default: the literal shape)."""
        lines = []
        for k, kind in sorted(self.operands.items()):
            if kind == "general":
                shape = shape or "(" + ", ".join(map(str, self.out_shape)) + ",)"
                lines.append(f"{self.prefix}{k} = np.ascontiguousarray(np.broadcast_to(p{k}, {shape}))"
                             ".reshape(-1)   # broadcast once")
            else:
                lines.append(f"{self.prefix}{k} = p{k}.reshape(-1)   # {kind} operand")
        return lines

    def _ref(self, k: int, row: str, col: str, flat: str) -> str:
        kind = self.operands[k]
        idx = {"scalar": "0", "row": row, "col": col, "full": flat, "general": flat}[kind]
        return f"{self.prefix}{k}[{idx}]"

    def apply(self, v: str, row: str, col: str, flat: str) -> list[str]:
        """Statements replacing variable ``v`` by the epilogue applied to it."""
        lines = []
        for e in self.ops:
            args = [self._ref(k, row, col, flat) for k, *_ in e["others"]]
            args.insert(e["operand"], v)
            lines.append(f"{v} = {scalar_op(e['op'], e['attrs'], args, self.dtype)}   # {e['op']}")
        return lines

    def vectorizable(self) -> bool:
        """Every op has a vector form (float dtypes; else the scalar store runs)."""
        if not self.dtype.startswith("float"):
            return False
        return all(vector_op(e["op"], e["attrs"], ["x"] * (1 + len(e["others"])), 16) is not None
                   for e in self.ops)

    def vec_operands(self, row: str, lanes: int) -> list[str]:
        """Statements hoisting the scalar and per-row operands of one tile row into vectors
        ``ev<k>`` (column and full operands are loaded per vector by ``apply_vec``)."""
        out = []
        for k, kind in sorted(self.operands.items()):
            e = f"{self.prefix}{k}"
            if kind == "scalar":
                out.append(f"{self.prefix}v{k} = vsplat({e}[0], {lanes})")
            elif kind == "row":
                out.append(f"{self.prefix}v{k} = vsplat({e}[{row}], {lanes})")
        return out

    def apply_vec(self, v: str, col: str, flat: str, lanes: int) -> list[str]:
        """Vector statements replacing vector ``v`` by the epilogue (``lanes`` consecutive
        columns starting at ``col``, flat output index ``flat``); after ``vec_operands``."""
        lines = []
        for e in self.ops:
            args = []
            for k, *_ in e["others"]:
                kind = self.operands[k]
                if kind in ("scalar", "row"):
                    args.append(f"{self.prefix}v{k}")
                else:
                    args.append(f"vload({self.prefix}{k}, {col if kind == 'col' else flat}, {lanes})")
            args.insert(e["operand"], v)
            lines.append(f"{v} = {vector_op(e['op'], e['attrs'], args, lanes)}   # {e['op']}")
        return lines

    def needs(self) -> set[str]:
        """Which index expressions the epilogue reads ('row', 'col', 'flat')."""
        out = set()
        for kind in self.operands.values():
            out |= {"row": {"row"}, "col": {"col"}, "full": {"flat"}, "general": {"flat"}}.get(kind, set())
        return out

    def describe(self) -> str:
        if not self.ops:
            return "none"
        return " -> ".join(e["op"] for e in self.ops) + (
            " (operands: " + ", ".join(f"p{k} {kind}" for k, kind in sorted(self.operands.items())) + ")"
            if self.operands else "")
