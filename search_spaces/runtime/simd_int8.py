"""Integer dot-product SIMD for generated Numba kernels: x86 intrinsics named explicitly.

llvmlite's LLVM does not form ``vpmaddubsw`` / ``vpmaddwd`` / ``vpdpbusd`` from generic IR
(a widening multiply and a horizontal add are not recognised as one instruction), so the
int8 GEMM spells them out as target intrinsics through ``numba.extending.intrinsic``. Each
``vdot_*`` adds to an int32 accumulator vector of ``L`` lanes (8 for 256-bit, 16 for 512-bit)
the dot products of ``G``-element groups: lane ``j`` gets ``sum_t a[G j + t] * b[G j + t]``.

    vbroadcast_group(arr, i, L)  the 4 bytes at arr.flat[i] (4 uint8 or 2 int16: one K group)
                                 repeated in every 32-bit lane, as a vector of arr's type
    vdot_maddubs(acc, a, b)      a uint8 x b int8, groups of 4: vpmaddubsw (u8 x s8 pairs summed
                                 into *saturating* int16) then vpmaddwd with ones (int16 pairs
                                 into int32). A pair saturates when |a0 b0 + a1 b1| > 32767,
                                 e.g. 255 * 127 * 2: exact only for weights in [-64, 64]
    vdot_madd16(acc, a, b)       a int16 x b int16, groups of 2: vpmaddwd alone (exact: the
                                 sign-extended int8 products never overflow int32)
    vdot_vnni(acc, a, b)         a uint8 x b int8, groups of 4: vpdpbusd (AVX512-VNNI /
                                 AVX-VNNI; exact: products are summed in int32)

The requantize of a register tile (``quant_anchor``'s ``requantize="registers"``: the int32
accumulators to 8-bit levels without leaving the registers):

    vcvt_f32(v)                  int32 lanes to float32 (vcvtdq2ps; rounds to nearest as
                                 NumPy's float32(int32) does)
    vcvt_i32(v)                  float32 lanes to int32, truncating (vcvttps2dq; the lanes hold
                                 integers already: rounded and clamped)
    vrint(v)                     float32 lanes rounded half to even (vroundps $4, np.rint)
    vpack_u8(lo, hi)             two 8-lane int32 vectors to 16 bytes lo[0..7], hi[0..7] with
    vpack_i8(lo, hi)             saturating packs: vpackssdw (int32 to int16), then vpackuswb /
                                 vpacksswb (int16 to uint8 / int8) and one dword shuffle
                                 (AVX2 packs within 128-bit halves); two 16-lane vectors (AVX-512)
                                 to 32 bytes by two vpmovdb narrowings (lanes already clamped)
    vconcat(a, b)                a's lanes then b's (one vector of twice the lanes)
    vstore_t4(arr, i, stride, v) the 4 rows of L lanes of v (4L lanes, row r = lanes rL..rL+L-1)
                                 stored transposed: arr.flat[i + c*stride + r] = v[rL + c], one
                                 4-byte store per column c (an NCHW output: 4 pixels of a
                                 channel are contiguous, channels ``stride`` apart)
    vload_t4(arr, i, stride, L)  the inverse: lane rL + c = arr.flat[i + c*stride + r] (an NCHW
                                 residual operand's 4 pixels x L channels as 4 rows)
    vlane(v, k)                  lane k of v (a run-time index: the partial tile at C's edge
                                 reads its accumulators lane by lane, with no spill array)
    vwiden_i32(v, start, lanes)  lanes start..start+lanes-1 of an 8-bit vector as int32 (zero-
                                 or sign-extended as its type says: a residual operand's bytes)

Which LLVM intrinsic each emits, per vector width, is the table ``INTRINSICS``; the emitters
are plain functions on an llvmlite ``IRBuilder`` (``emit_dot``), so the AVX-512 forms can be
checked as LLVM IR and assembly for an AVX-512 CPU on a machine that cannot run them.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from search_spaces.runtime.simd import Vec, _contiguous, _flat_ptr, _lanes, _splat, _vector_of

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)

# formulation -> vector bits -> the LLVM intrinsics it calls, in order
INTRINSICS: dict[str, dict[int, tuple[str, ...]]] = {
    "maddubs": {256: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
                512: ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")},
    "madd16": {256: ("llvm.x86.avx2.pmadd.wd",),
               512: ("llvm.x86.avx512.pmaddw.d.512",)},
    "vnni": {256: ("llvm.x86.avx512.vpdpbusd.256",),
             512: ("llvm.x86.avx512.vpdpbusd.512",)},
}
# formulation -> (K elements per group, A element type, B element type)
OPERANDS: dict[str, tuple[int, str, str]] = {
    "maddubs": (4, "uint8", "int8"),
    "madd16": (2, "int16", "int16"),
    "vnni": (4, "uint8", "int8"),
}


def _declare(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Type]):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def emit_dot(builder: ir.IRBuilder, kind: str, acc, a, b):
    """acc + dot products of K groups of a and b (llvmlite values; acc is <L x i32>)."""
    lanes = acc.type.count
    bits = 32 * lanes
    try:
        names = INTRINSICS[kind][bits]
    except KeyError:
        raise ValueError(f"no {kind} dot product for {bits}-bit vectors") from None
    v32 = ir.VectorType(I32, lanes)
    v16 = ir.VectorType(I16, 2 * lanes)
    v8 = ir.VectorType(I8, 4 * lanes)
    if kind == "maddubs":
        pairs = builder.call(_declare(builder, names[0], v16, [v8, v8]), [a, b])
        ones = ir.Constant(v16, [1] * (2 * lanes))
        quads = builder.call(_declare(builder, names[1], v32, [v16, v16]), [pairs, ones])
        return builder.add(acc, quads)
    if kind == "madd16":
        return builder.add(acc, builder.call(_declare(builder, names[0], v32, [v16, v16]), [a, b]))
    if kind == "vnni":
        # The <L x i32> operand form: LLVM 22 reads it (upgrading to i8 vectors) and older
        # LLVMs only know it.
        fn = _declare(builder, names[0], v32, [v32, v32, v32])
        return builder.call(fn, [acc, builder.bitcast(a, v32), builder.bitcast(b, v32)])
    raise ValueError(f"unknown dot formulation {kind!r}; known: {', '.join(INTRINSICS)}")


@intrinsic
def vbroadcast_group(typingctx, arr, i, lanes):
    """arr.flat[i : i + 4 bytes] as one 32-bit value in each of ``lanes`` lanes, typed as a
    vector of arr's elements (4 uint8 or 2 int16 per lane: one K group of the packed A)."""
    _contiguous(arr, "vbroadcast_group")
    if not isinstance(arr.dtype, types.Integer) or arr.dtype.bitwidth not in (8, 16):
        raise TypingError(f"vbroadcast_group needs an 8- or 16-bit integer array, got {arr}")
    n = _lanes(lanes)
    vt = Vec(arr.dtype, n * 32 // arr.dtype.bitwidth)

    def codegen(context, builder, sig, args):
        ptr = _flat_ptr(context, builder, sig.args[0], args[0], args[1])
        word = builder.load(builder.bitcast(ptr, I32.as_pointer()), align=1)
        splat = _splat(context, builder, Vec(types.int32, n), word)
        return builder.bitcast(splat, context.get_value_type(vt))
    return vt(arr, i, lanes), codegen


def _dot_intrinsic(kind: str):
    group, a_name, b_name = OPERANDS[kind]
    a_ty, b_ty = getattr(types, a_name), getattr(types, b_name)

    def typer(typingctx, acc, a, b):
        if not (isinstance(acc, Vec) and acc.dtype == types.int32 and acc.lanes in (8, 16)):
            raise TypingError(f"vdot_{kind} accumulates into an int32 vector of 8 or 16 lanes, got {acc}")
        want_a, want_b = Vec(a_ty, acc.lanes * group), Vec(b_ty, acc.lanes * group)
        if a != want_a or b != want_b:
            raise TypingError(f"vdot_{kind} with {acc} needs {want_a} and {want_b}, got {a} and {b}")

        def codegen(context, builder, sig, args):
            return emit_dot(builder, kind, *args)
        return acc(acc, a, b), codegen
    typer.__name__ = f"vdot_{kind}"
    return intrinsic(typer)


vdot_maddubs = _dot_intrinsic("maddubs")
vdot_madd16 = _dot_intrinsic("madd16")
vdot_vnni = _dot_intrinsic("vnni")


# -- the requantize of a register tile --------------------------------------------------------
def _vec_of(v, dtype, what: str):
    if not (isinstance(v, Vec) and v.dtype == dtype):
        raise TypingError(f"{what} needs a vector of {dtype}, got {v}")


def _convert_intrinsic(name: str, src, dst, op: str, doc: str):
    """A lane-wise conversion of ``src`` vectors to ``dst`` vectors by the IR builder's ``op``."""
    @intrinsic
    def convert(typingctx, v):
        _vec_of(v, src, name)
        vt = Vec(dst, v.lanes)

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], context.get_value_type(vt))
        return vt(v), codegen
    convert.__doc__ = doc
    return convert


vcvt_f32 = _convert_intrinsic("vcvt_f32", types.int32, types.float32, "sitofp",
                              "int32 lanes as float32 (sitofp: vcvtdq2ps).")
vcvt_i32 = _convert_intrinsic("vcvt_i32", types.float32, types.int32, "fptosi",
                              "float32 lanes as int32, truncating (fptosi: vcvttps2dq).")


@intrinsic
def vrint(typingctx, v):
    """float32 lanes rounded to the nearest integer, half to even (llvm.rint: vroundps $4)."""
    _vec_of(v, types.float32, "vrint")

    def codegen(context, builder, sig, args):
        x = args[0]
        fn = _declare(builder, f"llvm.rint.v{v.lanes}f32", x.type, [x.type])
        return builder.call(fn, [x])
    return v(v), codegen


def _pack_intrinsic(signed: bool):
    out = types.int8 if signed else types.uint8
    name = "vpack_i8" if signed else "vpack_u8"

    def typer(typingctx, lo, hi):
        if not (isinstance(lo, Vec) and lo == hi and lo.dtype == types.int32 and lo.lanes in (8, 16)):
            raise TypingError(f"{name} packs two 8- or 16-lane int32 vectors, got {lo}, {hi}")
        n = lo.lanes
        vt = Vec(out, 2 * n)

        def codegen(context, builder, sig, args):
            v8i32, v16i16 = ir.VectorType(I32, 8), ir.VectorType(I16, 16)
            v8i16, v16i8 = ir.VectorType(I16, 8), ir.VectorType(I8, 16)
            if n == 16:
                # AVX-512: each 16-lane half narrowed by vpmovdb (trunc), then joined. The
                # callers' lanes are clamped to the 8-bit range already, so truncation is exact
                # (the saturating forms, vpmovusdb / vpmovsdb, would only repeat the clamp).
                halves = [builder.trunc(a, ir.VectorType(I8, 16)) for a in args]
                return builder.shuffle_vector(halves[0], halves[1],
                                              ir.Constant(ir.VectorType(I32, 32), list(range(32))))
            # [lo0-3 hi0-3 | lo4-7 hi4-7] as int16 (saturating)
            w = builder.call(_declare(builder, "llvm.x86.avx2.packssdw", v16i16, [v8i32, v8i32]),
                             list(args))
            x = builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(I32, 8), list(range(8))))
            y = builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(I32, 8), list(range(8, 16))))
            pack = "llvm.x86.sse2.packsswb.128" if signed else "llvm.x86.sse2.packuswb.128"
            b = builder.call(_declare(builder, pack, v16i8, [v8i16, v8i16]), [x, y])
            # bytes [lo0-3 hi0-3 lo4-7 hi4-7] -> [lo0-7 hi0-7]: one dword shuffle
            order = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
            return builder.shuffle_vector(b, b, ir.Constant(ir.VectorType(I32, 16), order))
        return vt(lo, hi), codegen
    typer.__name__ = name
    return intrinsic(typer)


vpack_u8 = _pack_intrinsic(False)
vpack_i8 = _pack_intrinsic(True)


@intrinsic
def vwiden_i32(typingctx, v, start, lanes):
    """Lanes start .. start+lanes-1 of an 8-bit vector as int32 (zext for uint8, sext for int8)."""
    if not (isinstance(v, Vec) and v.dtype in (types.uint8, types.int8)):
        raise TypingError(f"vwiden_i32 needs an 8-bit integer vector, got {v}")
    if not isinstance(start, types.IntegerLiteral):
        raise TypingError("vwiden_i32 needs a compile-time start lane")
    n, s0 = _lanes(lanes), start.literal_value
    if s0 < 0 or s0 + n > v.lanes:
        raise TypingError(f"vwiden_i32: lanes {s0}..{s0 + n - 1} outside {v}")
    vt = Vec(types.int32, n)

    def codegen(context, builder, sig, args):
        x = args[0]
        part = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, n), list(range(s0, s0 + n))))
        ext = builder.sext if v.dtype.signed else builder.zext
        return ext(part, context.get_value_type(vt))
    return vt(v, start, lanes), codegen


@intrinsic
def vlane(typingctx, v, k):
    """Lane ``k`` of ``v`` (extractelement; k in range by construction)."""
    if not isinstance(v, Vec):
        raise TypingError(f"vlane needs a vector, got {v}")
    if not isinstance(k, types.Integer):
        raise TypingError(f"vlane needs an integer lane, got {k}")

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], builder.trunc(args[1], I32) if args[1].type.width > 32
                                       else args[1])
    return v.dtype(v, k), codegen


@intrinsic
def vconcat(typingctx, a, b):
    """a's lanes, then b's."""
    if not (isinstance(a, Vec) and a == b):
        raise TypingError(f"vconcat needs two equal vector types, got {a}, {b}")
    vt = Vec(a.dtype, 2 * a.lanes)

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[1],
                                      ir.Constant(ir.VectorType(I32, 2 * a.lanes), list(range(2 * a.lanes))))
    return vt(a, b), codegen


def _transpose4_mask(cols: int, to_rows: bool) -> list[int]:
    """Lane permutation between rows (lane r*cols + c) and columns (lane 4c + r)."""
    if to_rows:   # column-major lanes -> row-major
        return [4 * c + r for r in range(4) for c in range(cols)]
    return [r * cols + c for c in range(cols) for r in range(4)]


def _check_t4(arr, what: str):
    _contiguous(arr, what)
    if arr.dtype not in (types.uint8, types.int8):
        raise TypingError(f"{what} needs an 8-bit integer array, got {arr}")


@intrinsic
def vinterleave4(typingctx, v):
    """v as 4 rows of v.lanes/4 elements -> lane 4c + r = row r's element c: four rows of B
    interleaved into the K groups of 4 the dot-product instructions read (one shuffle;
    ``vpermt2b`` with AVX512-VBMI)."""
    if not isinstance(v, Vec) or v.lanes % 4:
        raise TypingError(f"vinterleave4 needs a vector of 4 rows, got {v}")
    mask = _transpose4_mask(v.lanes // 4, False)

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(I32, v.lanes), mask))
    return v(v), codegen


@intrinsic
def vstore_t4(typingctx, arr, i, stride, v):
    """v as 4 rows of v.lanes/4 bytes, stored transposed: column c's 4 bytes at i + c*stride."""
    _check_t4(arr, "vstore_t4")
    _vector_of(arr, v, "vstore_t4")
    if v.lanes % 4:
        raise TypingError(f"vstore_t4 needs 4 rows, got {v}")
    cols = v.lanes // 4

    def codegen(context, builder, sig, args):
        x = args[3]
        cm = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, v.lanes), _transpose4_mask(cols, False)))
        words = builder.bitcast(cm, ir.VectorType(I32, cols))
        base = _flat_ptr(context, builder, sig.args[0], args[0], args[1])
        for c in range(cols):
            off = builder.mul(args[2], ir.Constant(args[2].type, c))
            ptr = builder.bitcast(builder.gep(base, [off]), I32.as_pointer())
            builder.store(builder.extract_element(words, ir.Constant(I32, c)), ptr, align=1)
        return context.get_dummy_value()
    return types.none(arr, i, stride, v), codegen


@intrinsic
def vload_t4(typingctx, arr, i, stride, lanes):
    """4 rows of ``lanes`` bytes: lane r*lanes + c = arr.flat[i + c*stride + r]."""
    _check_t4(arr, "vload_t4")
    cols = _lanes(lanes)
    vt = Vec(arr.dtype, 4 * cols)

    def codegen(context, builder, sig, args):
        base = _flat_ptr(context, builder, sig.args[0], args[0], args[1])
        words = ir.Constant(ir.VectorType(I32, cols), ir.Undefined)
        for c in range(cols):
            off = builder.mul(args[2], ir.Constant(args[2].type, c))
            ptr = builder.bitcast(builder.gep(base, [off]), I32.as_pointer())
            words = builder.insert_element(words, builder.load(ptr, align=1), ir.Constant(I32, c))
        cm = builder.bitcast(words, context.get_value_type(vt))
        return builder.shuffle_vector(cm, cm, ir.Constant(ir.VectorType(I32, 4 * cols), _transpose4_mask(cols, True)))
    return vt(arr, i, stride, lanes), codegen
