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
# x > y ? x : y (and the mirror): one vmaxps/vminps; like the scalar max(), a NaN in the
# first operand yields the second.
vmax = _vec_binary("vmax", lambda bd, x, y: bd.select(bd.fcmp_ordered(">", x, y), x, y))
vmin = _vec_binary("vmin", lambda bd, x, y: bd.select(bd.fcmp_ordered("<", x, y), x, y))
