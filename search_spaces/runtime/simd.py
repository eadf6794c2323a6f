"""Explicit SIMD for generated Numba kernels: LLVM vector values through ``numba.extending``.

A ``Vec`` is an LLVM ``<lanes x T>`` value (``<16 x float>`` is one zmm register). Numba
keeps local variables of this type in SSA registers, so a micro-kernel written with these
functions gets exactly the vector loads, broadcasts and FMAs it spells out, whatever the loop
vectoriser would have decided. All functions are ``@intrinsic``s: no call overhead, no bounds
checks (the generated code computes offsets that are in range by construction).

    vload(arr, i, lanes)      arr.flat[i : i+lanes]              (arr C-contiguous)
    vbroadcast(arr, i, lanes) arr.flat[i] in every lane
    vsplat(x, lanes)          scalar x in every lane
    vfma(a, b, c)             a * b + c   (llvm.fma for floats; mul+add for integers)
    vadd(a, b)                a + b
    vstore(arr, i, v)         arr.flat[i : i+lanes] = v
    vload2(C, i, j, lanes) / vstore2(C, i, j, v)   row i, columns j.. of a 2-D array whose
                              rows are contiguous (any row stride)
    vbroadcast2(A, i, j, lanes)   A[i, j] in every lane
    vload_n(arr, i, n, lanes)     arr.flat[i : i+n], zeros in the other lanes (masked load:
                              nothing past i+n-1 is read; n clamped to 0..lanes)
    vload_s2(arr, i, n, lanes)    arr.flat[i], arr.flat[i+2], ... (n of them), zeros after
    vload_even(arr, i, lanes)     arr.flat[i], arr.flat[i+2], ... (lanes of them): two plain
                              loads of i .. i+2*lanes-1 and one even-lane shuffle (for 8-bit
                              lanes, where AVX2 has no masked load; reads one element more
                              than the lanes use)
    vstore_n(arr, i, v, n)        arr.flat[i : i+n] = the first n lanes of v (masked store)
    vsqrt(v)                      lane-wise square root
    prefetch(arr, i) / prefetch_w(arr, i)   cache-line hints (read / write), never fault
    prefetch_w2(C, i, j)          write hint for the line of C[i, j] (2-D, rows contiguous)
    clflush(arr, i)               evict the line of arr.flat[i] from every cache level

Importable and cache-safe: a kernel compiled with ``cache=True`` that uses them is loaded
from Numba's cache by a process that imports this module.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import RequireLiteralValue, TypingError
from numba.extending import intrinsic, models, register_model


class Vec(types.Type):
    """Numba type of an LLVM vector of ``lanes`` elements of scalar type ``dtype``."""

    def __init__(self, dtype: types.Type, lanes: int):
        self.dtype = dtype
        self.lanes = lanes
        super().__init__(name=f"Vec({dtype}, {lanes})")

    @property
    def key(self):
        return self.dtype, self.lanes


@register_model(Vec)
class VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        elem = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(elem, fe_type.lanes))


def _lanes(lanes) -> int:
    if not isinstance(lanes, types.IntegerLiteral):
        raise RequireLiteralValue("vector lanes must be a compile-time integer constant")
    return lanes.literal_value


def _contiguous(arr, what: str) -> None:
    if not isinstance(arr, types.Array) or arr.layout != "C":
        raise TypingError(f"{what} needs a C-contiguous array, got {arr}")


def _flat_ptr(context, builder, arr_ty, arr, index):
    ary = context.make_array(arr_ty)(context, builder, arr)
    return builder.gep(ary.data, [index])


def _row_ptr(context, builder, arr_ty, arr, i, j):
    ary = context.make_array(arr_ty)(context, builder, arr)
    shape = cgutils.unpack_tuple(builder, ary.shape, 2)
    strides = cgutils.unpack_tuple(builder, ary.strides, 2)
    return cgutils.get_item_pointer2(context, builder, ary.data, shape, strides, arr_ty.layout,
                                     [i, j], wraparound=False)


def _vec_ptr(builder, ptr, vty):
    return builder.bitcast(ptr, vty.as_pointer())


def _align(context, dtype) -> int:
    return context.get_abi_sizeof(context.get_value_type(dtype))


@intrinsic
def vload(typingctx, arr, i, lanes):
    _contiguous(arr, "vload")
    vt = Vec(arr.dtype, _lanes(lanes))

    def codegen(context, builder, sig, args):
        ptr = _flat_ptr(context, builder, sig.args[0], args[0], args[1])
        vty = context.get_value_type(vt)
        return builder.load(_vec_ptr(builder, ptr, vty), align=_align(context, arr.dtype))
    return vt(arr, i, lanes), codegen


@intrinsic
def vbroadcast(typingctx, arr, i, lanes):
    _contiguous(arr, "vbroadcast")
    vt = Vec(arr.dtype, _lanes(lanes))

    def codegen(context, builder, sig, args):
        x = builder.load(_flat_ptr(context, builder, sig.args[0], args[0], args[1]))
        return _splat(context, builder, vt, x)
    return vt(arr, i, lanes), codegen


def _splat(context, builder, vt, x):
    vty = context.get_value_type(vt)
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    mask = ir.Constant(ir.VectorType(ir.IntType(32), vt.lanes), [0] * vt.lanes)
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), mask)


@intrinsic
def vsplat(typingctx, x, lanes):
    if not isinstance(x, (types.Float, types.Integer)):
        raise TypingError(f"vsplat needs a scalar, got {x}")
    vt = Vec(x, _lanes(lanes))

    def codegen(context, builder, sig, args):
        return _splat(context, builder, vt, args[0])
    return vt(x, lanes), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    if not (isinstance(a, Vec) and a == b == c):
        raise TypingError(f"vfma needs three equal vector types, got {a}, {b}, {c}")

    def codegen(context, builder, sig, args):
        x, y, z = args
        if isinstance(a.dtype, types.Float):
            fty = ir.FunctionType(x.type, [x.type] * 3)
            name = f"llvm.fma.v{a.lanes}f{a.dtype.bitwidth}"
            fn = cgutils.get_or_insert_function(builder.module, fty, name)
            return builder.call(fn, [x, y, z])
        return builder.add(builder.mul(x, y), z)
    return a(a, b, c), codegen


@intrinsic
def vadd(typingctx, a, b):
    if not (isinstance(a, Vec) and a == b):
        raise TypingError(f"vadd needs two equal vector types, got {a}, {b}")

    def codegen(context, builder, sig, args):
        if isinstance(a.dtype, types.Float):
            return builder.fadd(args[0], args[1])
        return builder.add(args[0], args[1])
    return a(a, b), codegen


def _vector_of(arr, v, what: str) -> None:
    if not (isinstance(v, Vec) and v.dtype == arr.dtype):
        raise TypingError(f"{what} of {v} into {arr}")


@intrinsic
def vstore(typingctx, arr, i, v):
    _contiguous(arr, "vstore")
    _vector_of(arr, v, "vstore")

    def codegen(context, builder, sig, args):
        ptr = _flat_ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], _vec_ptr(builder, ptr, args[2].type), align=_align(context, arr.dtype))
        return context.get_dummy_value()
    return types.none(arr, i, v), codegen


def _rows_contiguous(arr, what: str) -> None:
    if not isinstance(arr, types.Array) or arr.ndim != 2 or arr.layout not in ("C", "A"):
        raise TypingError(f"{what} needs a 2-D array, got {arr}")
    if arr.layout != "C":
        raise TypingError(f"{what} needs rows with unit stride (C layout), got {arr}")


@intrinsic
def vload2(typingctx, arr, i, j, lanes):
    _rows_contiguous(arr, "vload2")
    vt = Vec(arr.dtype, _lanes(lanes))

    def codegen(context, builder, sig, args):
        ptr = _row_ptr(context, builder, sig.args[0], args[0], args[1], args[2])
        vty = context.get_value_type(vt)
        return builder.load(_vec_ptr(builder, ptr, vty), align=_align(context, arr.dtype))
    return vt(arr, i, j, lanes), codegen


@intrinsic
def vstore2(typingctx, arr, i, j, v):
    _rows_contiguous(arr, "vstore2")
    _vector_of(arr, v, "vstore2")

    def codegen(context, builder, sig, args):
        ptr = _row_ptr(context, builder, sig.args[0], args[0], args[1], args[2])
        builder.store(args[3], _vec_ptr(builder, ptr, args[3].type), align=_align(context, arr.dtype))
        return context.get_dummy_value()
    return types.none(arr, i, j, v), codegen


@intrinsic
def vbroadcast2(typingctx, arr, i, j, lanes):
    _rows_contiguous(arr, "vbroadcast2")
    vt = Vec(arr.dtype, _lanes(lanes))

    def codegen(context, builder, sig, args):
        x = builder.load(_row_ptr(context, builder, sig.args[0], args[0], args[1], args[2]))
        return _splat(context, builder, vt, x)
    return vt(arr, i, j, lanes), codegen


# -- masked forms: the first n lanes (n clamped to 0..lanes), for row tails and strided rows ----
def _lane_mask(builder, n, lanes: int):
    """<lanes x i1>: lane k is on when k < n (n <= 0 gives none, n >= lanes all)."""
    i32 = ir.IntType(32)
    lo, hi = ir.Constant(n.type, 0), ir.Constant(n.type, lanes)
    n = builder.select(builder.icmp_signed("<", n, lo), lo, n)
    n = builder.select(builder.icmp_signed(">", n, hi), hi, n)
    n = builder.trunc(n, i32) if n.type.width > 32 else n
    vty = ir.VectorType(i32, lanes)
    splat = builder.shuffle_vector(builder.insert_element(ir.Constant(vty, ir.Undefined), n,
                                                          ir.Constant(i32, 0)),
                                   ir.Constant(vty, ir.Undefined), ir.Constant(vty, [0] * lanes))
    return builder.icmp_signed("<", ir.Constant(vty, list(range(lanes))), splat)


def _masked_load(context, builder, ptr, vty, mask, align: int):
    fty = ir.FunctionType(vty, [vty.as_pointer(), ir.IntType(32), mask.type, vty])
    name = f"llvm.masked.load.v{vty.count}{_suffix(vty.element)}.p0v{vty.count}{_suffix(vty.element)}"
    fn = cgutils.get_or_insert_function(builder.module, fty, name)
    return builder.call(fn, [_vec_ptr(builder, ptr, vty), ir.Constant(ir.IntType(32), align),
                             mask, ir.Constant(vty, None)])


def _suffix(t) -> str:
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    return f"i{t.width}"


@intrinsic
def vload_n(typingctx, arr, i, n, lanes):
    """arr.flat[i : i+n] in the first n lanes, zeros after; reads nothing past i+n-1."""
    _contiguous(arr, "vload_n")
    vt = Vec(arr.dtype, _lanes(lanes))

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(vt)
        ptr = _flat_ptr(context, builder, sig.args[0], args[0], args[1])
        return _masked_load(context, builder, ptr, vty, _lane_mask(builder, args[2], vt.lanes),
                            _align(context, arr.dtype))
    return vt(arr, i, n, lanes), codegen


def _two_vector_ptrs(context, builder, arr_ty, arr, i, lanes: int):
    """Pointers to arr.flat[i] and arr.flat[i + lanes]: two consecutive vectors."""
    lo_ptr = _flat_ptr(context, builder, arr_ty, arr, i)
    return lo_ptr, builder.gep(lo_ptr, [ir.Constant(ir.IntType(64), lanes)])


def _even_lanes(builder, lo, hi, lanes: int):
    """Lanes 0, 2, 4, ... of the 2*lanes elements lo:hi (a stride-2 gather of two vectors)."""
    even = ir.Constant(ir.VectorType(ir.IntType(32), lanes), list(range(0, 2 * lanes, 2)))
    return builder.shuffle_vector(lo, hi, even)


@intrinsic
def vload_s2(typingctx, arr, i, n, lanes):
    """arr.flat[i], arr.flat[i+2], ... (n of them) in the first n lanes, zeros after: two
    masked loads of consecutive elements and one even-lane shuffle; reads only i..i+2n-2."""
    _contiguous(arr, "vload_s2")
    vt = Vec(arr.dtype, _lanes(lanes))

    def codegen(context, builder, sig, args):
        lanes_ = vt.lanes
        vty = context.get_value_type(vt)
        align = _align(context, arr.dtype)
        span = builder.sub(builder.mul(args[2], ir.Constant(args[2].type, 2)),
                           ir.Constant(args[2].type, 1))          # elements i .. i+2n-2
        lo_ptr, hi_ptr = _two_vector_ptrs(context, builder, sig.args[0], args[0], args[1], lanes_)
        lo = _masked_load(context, builder, lo_ptr, vty, _lane_mask(builder, span, lanes_), align)
        rest = builder.sub(span, ir.Constant(span.type, lanes_))
        hi = _masked_load(context, builder, hi_ptr, vty, _lane_mask(builder, rest, lanes_), align)
        return _even_lanes(builder, lo, hi, lanes_)
    return vt(arr, i, n, lanes), codegen


@intrinsic
def vload_even(typingctx, arr, i, lanes):
    """arr.flat[i], arr.flat[i+2], ..., arr.flat[i+2*(lanes-1)]: two unmasked loads of
    consecutive elements and one even-lane shuffle; reads i .. i+2*lanes-1 (the caller
    guarantees they are inside arr)."""
    _contiguous(arr, "vload_even")
    vt = Vec(arr.dtype, _lanes(lanes))

    def codegen(context, builder, sig, args):
        lanes_ = vt.lanes
        vty = context.get_value_type(vt)
        align = _align(context, arr.dtype)
        lo_ptr, hi_ptr = _two_vector_ptrs(context, builder, sig.args[0], args[0], args[1], lanes_)
        lo = builder.load(_vec_ptr(builder, lo_ptr, vty), align=align)
        hi = builder.load(_vec_ptr(builder, hi_ptr, vty), align=align)
        return _even_lanes(builder, lo, hi, lanes_)
    return vt(arr, i, lanes), codegen


def _masked_store(builder, v, ptr, mask, align: int) -> None:
    vty = v.type
    sfx = f"v{vty.count}{_suffix(vty.element)}"
    fty = ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), ir.IntType(32), mask.type])
    fn = cgutils.get_or_insert_function(builder.module, fty, f"llvm.masked.store.{sfx}.p0{sfx}")
    builder.call(fn, [v, _vec_ptr(builder, ptr, vty), ir.Constant(ir.IntType(32), align), mask])


@intrinsic
def vstore_n(typingctx, arr, i, v, n):
    """arr.flat[i : i+n] = the first n lanes of v (masked store; n clamped to 0..lanes)."""
    _contiguous(arr, "vstore_n")
    _vector_of(arr, v, "vstore_n")

    def codegen(context, builder, sig, args):
        _masked_store(builder, args[2], _flat_ptr(context, builder, sig.args[0], args[0], args[1]),
                      _lane_mask(builder, args[3], args[2].type.count), _align(context, arr.dtype))
        return context.get_dummy_value()
    return types.none(arr, i, v, n), codegen


def _prefetch(name: str, rw: int, locality: int = 3):
    def typer(typingctx, arr, i):
        _contiguous(arr, name)

        def codegen(context, builder, sig, args):
            ptr = builder.bitcast(_flat_ptr(context, builder, sig.args[0], args[0], args[1]),
                                  ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            fty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fty, "llvm.prefetch.p0i8")
            builder.call(fn, [ptr, ir.Constant(i32, rw), ir.Constant(i32, locality), ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return types.none(arr, i), codegen
    typer.__name__ = name
    return intrinsic(typer)


# A hint that the cache line of arr.flat[i] is read (written) soon; never faults, so i may be
# past the end of arr.
prefetch = _prefetch("prefetch", 0)
prefetch_w = _prefetch("prefetch_w", 1)
# read soon, but not as soon: into L2 (locality 2, prefetcht1), for the next block of a stream
prefetch_l2 = _prefetch("prefetch_l2", 0, 2)


@intrinsic
def clflush(typingctx, arr, i):
    """Write back and evict the cache line of ``arr.flat[i]`` from every cache level
    (``clflush``; i in range). For measurements that start with an operand in memory, as a
    built model finds its weights (``tuner.measure.cache_flush``)."""
    _contiguous(arr, "clflush")

    def codegen(context, builder, sig, args):
        ptr = builder.bitcast(_flat_ptr(context, builder, sig.args[0], args[0], args[1]),
                              ir.IntType(8).as_pointer())
        fty = ir.FunctionType(ir.VoidType(), [ptr.type])
        fn = cgutils.get_or_insert_function(builder.module, fty, "llvm.x86.sse2.clflush")
        builder.call(fn, [ptr])
        return context.get_dummy_value()
    return types.none(arr, i), codegen


@intrinsic
def prefetch_w2(typingctx, arr, i, j):
    """A hint that the line of ``arr[i, j]`` is written soon (never faults: (i, j) may lie
    past the array). The GEMM micro-kernels issue it for their C tile before the K loop:
    the tile's rows sit a row stride apart (4 KiB at N = 1024 fp32) and, on an unaligned C,
    straddle two lines each; fetched during the K loop, they no longer stall its stores.
    Measured (1024^3 fp32, 1 thread, 6x16 tile, 14 placements): spread 13.8% -> 5.5%."""
    _rows_contiguous(arr, "prefetch_w2")

    def codegen(context, builder, sig, args):
        ptr = builder.bitcast(_row_ptr(context, builder, sig.args[0], args[0], args[1], args[2]),
                              ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.none(arr, i, j), codegen


@intrinsic
def vsqrt(typingctx, a):
    """Lane-wise square root (llvm.sqrt: one vsqrtps/vsqrtpd)."""
    if not (isinstance(a, Vec) and isinstance(a.dtype, types.Float)):
        raise TypingError(f"vsqrt needs a float vector, got {a}")

    def codegen(context, builder, sig, args):
        x = args[0]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(x.type, [x.type]),
                                            f"llvm.sqrt.v{a.lanes}f{a.dtype.bitwidth}")
        return builder.call(fn, [x])
    return a(a), codegen
