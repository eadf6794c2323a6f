"""Vector forms of the epilogue's elementwise ops, called by generated kernels at run time
(LLVM vectors of ``search_spaces.runtime.simd``; ``search_spaces.epilogue`` emits the calls)."""
from __future__ import annotations

from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from search_spaces.runtime.simd import Vec


def _vec_binary(name: str, build):
    def typer(typingctx, a, b):
        if not (isinstance(a, Vec) and a == b and isinstance(a.dtype, types.Float)):
            raise TypingError(f"{name} needs two equal float vector types, got {a}, {b}")

        def codegen(context, builder, sig, args):
            return build(builder, args[0], args[1])
        return a(a, b), codegen
    typer.__name__ = name
    return intrinsic(typer)


vsub = _vec_binary("vsub", lambda bd, x, y: bd.fsub(x, y))
vmul = _vec_binary("vmul", lambda bd, x, y: bd.fmul(x, y))
vdiv = _vec_binary("vdiv", lambda bd, x, y: bd.fdiv(x, y))


def _vec_minmax(name: str, cmp: str):
    """Lane-wise max/min of float or integer vectors: floats as x > y ? x : y (one
    vmaxps/vminps; like the scalar max(), a NaN in the first operand yields the second),
    integers by a signed or unsigned compare as their type says (one vpmaxub/vpmaxsb ... on
    AVX2: 32 8-bit lanes per instruction)."""
    def typer(typingctx, a, b):
        if not (isinstance(a, Vec) and a == b and isinstance(a.dtype, (types.Float, types.Integer))):
            raise TypingError(f"{name} needs two equal float or integer vector types, got {a}, {b}")

        def codegen(context, builder, sig, args):
            x, y = args
            if isinstance(a.dtype, types.Float):
                return builder.select(builder.fcmp_ordered(cmp, x, y), x, y)
            icmp = builder.icmp_signed if a.dtype.signed else builder.icmp_unsigned
            return builder.select(icmp(cmp, x, y), x, y)
        return a(a, b), codegen
    typer.__name__ = name
    return intrinsic(typer)


vmax = _vec_minmax("vmax", ">")
vmin = _vec_minmax("vmin", "<")
