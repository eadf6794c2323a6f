"""The ``gather`` formulation of the injective template: data movement as copy loops.

A group whose ops are data movement (reshape, flatten, expand_dims, squeeze, transpose,
layout_transform, concatenate) followed by an optional chain of elementwise ops on the result
(relu, clip, sigmoid, ..., and binary ops whose other operand is a parameter broadcast to the
output, e.g. a per-channel scale and shift) -- ShuffleNet's channel shuffle ``reshape ->
transpose -> reshape``, ``concatenate -> relu``, DenseNet's ``concatenate -> multiply -> add
-> relu`` -- computes every output element from exactly one element of one moved
parameter. The map is found at generation time by running the movement ops on arrays of
element *codes* (parameter, flat index), then compressed into segments: maximal runs of the
output (flat order) read from one parameter through an affine index ``base + sum(i_d *
stride_d)`` over a small loop nest. The kernel is those loop nests: contiguous output, strided
input (a channel shuffle's inner loop is a whole contiguous H*W plane), with the elementwise
chain applied on the way (broadcast operands indexed from the flat output index); nothing is
materialised. Groups whose map does not compress into a few segments are left to the other
formulations.
"""
from __future__ import annotations

import functools

import numpy as np

from search_spaces.epilogue import ELEMENTWISE_OPS, effective_shape, scalar_op
from workloads.errors import InstantiationError

MOVEMENT_OPS = ("reshape", "flatten", "expand_dims", "squeeze", "transpose", "layout_transform",
                "concatenate")
MAX_SEGMENTS = 64
PARALLEL_MIN_SEGMENT = 1 << 14   # elements of a segment copied by a parallel loop (threads > 1)


def _affine(idx: np.ndarray) -> list[tuple[int, int]] | None:
    """(extent, stride) dims, innermost first, with ``idx[flat] = idx[0] + sum(i_d * stride_d)``
    over the row-major loop nest of those extents; None when no such nest exists."""
    size = len(idx)
    dims: list[tuple[int, int]] = []
    block = 1
    while block < size:
        stride = int(idx[block] - idx[0])
        base = idx[:block]
        e = 1
        while block * (e + 1) <= size and np.array_equal(idx[e * block:(e + 1) * block],
                                                         base + e * stride):
            e += 1
        while (size // block) % e:   # the extent must divide what is left
            e -= 1
        if e == 1:
            return None
        dims.append((e, stride))
        block *= e
    if not dims:
        dims = [(1, 0)]
    # verify the whole map
    rebuilt = np.zeros(1, np.int64)
    for e, s in dims:
        rebuilt = (np.arange(e, dtype=np.int64)[:, None] * s + rebuilt[None, :]).reshape(-1)
    return dims if np.array_equal(rebuilt + idx[0], idx) else None


@functools.lru_cache(maxsize=256)
def gather_plan(w) -> dict:
    """{'segments': [(param, out_start, in_base, dims)], 'chain': [(body node, operand
    position, [(input position, param index, shape right-aligned to the output)])]} or raises
    (cached per workload: the space, the default and the code generator all ask)."""
    from workloads.graph.ops import get_op

    body = w.body
    params = {p.name: k for k, p in enumerate(body.inputs)}
    ops = [n for n in body.nodes if n.is_compute]
    if not ops:
        raise InstantiationError("empty group")
    movement = [n for n in ops if n.op in MOVEMENT_OPS]
    if ops[:len(movement)] != movement or not movement:
        raise InstantiationError("gather: not data movement followed by elementwise ops")
    rank = len(w.out_shape)
    prev = movement[-1].name
    chain = []
    for n in ops[len(movement):]:
        if n.op not in ELEMENTWISE_OPS or list(n.inputs).count(prev) != 1 \
                or n.op == "divide" and not w.dtype.startswith("float"):
            raise InstantiationError(f"gather: {n.op} is not an elementwise op on the moved result")
        others = []
        for pos, i in enumerate(n.inputs):
            if i == prev:
                continue
            if i not in params:
                raise InstantiationError(f"gather: {n.op} reads a computed value besides the moved one")
            shape = effective_shape({"op": n.op, "attrs": dict(n.attrs)}, pos,
                                    list(body.type_of(i).shape), rank)
            if len(shape) != rank or any(a not in (1, o) for a, o in zip(shape, w.out_shape)):
                raise InstantiationError(f"gather: operand {list(shape)} of {n.op} does not "
                                         f"broadcast to {list(w.out_shape)}")
            others.append((pos, params[i], shape))
        chain.append((n, list(n.inputs).index(prev), others))
        prev = n.name
    if body.outputs[0] != prev:
        raise InstantiationError("gather: the group's output is not its last op")
    sizes = [int(np.prod(p.type.shape)) for p in body.inputs]
    offset = np.cumsum([0] + sizes)
    vals = {p.name: (offset[k] + np.arange(sizes[k], dtype=np.int64)).reshape(p.type.shape)
            for k, p in enumerate(body.inputs)}
    for n in movement:
        if any(i not in vals for i in n.inputs):
            raise InstantiationError(f"gather: {n.op} reads a value that is not moved data")
        op = get_op(n.op)
        vals[n.name] = np.asarray(op.compute([vals[i] for i in n.inputs], n.attrs))
    codes = np.ascontiguousarray(vals[movement[-1].name]).reshape(-1)
    if codes.size != int(np.prod(w.out_shape)) or len(np.unique(codes)) != codes.size \
            and len(body.inputs) > 1 and False:
        raise InstantiationError("gather: output size mismatch")
    src = np.searchsorted(offset, codes, side="right") - 1
    cuts = np.flatnonzero(np.diff(src)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [codes.size]])
    rows = None
    if len(starts) > MAX_SEGMENTS:
        rows = _rows(codes, src, offset, ends)
        if rows is None:
            raise InstantiationError(f"gather: {len(starts)} segments (> {MAX_SEGMENTS}), "
                                     "not rows of a repeating pattern")
        period = rows[1]
        keep = ends <= period
        starts, ends, codes, src = starts[keep], ends[keep], codes[:period], src[:period]
    segments = []
    for a, b in zip(starts, ends):
        k = int(src[a])
        idx = codes[a:b] - offset[k]
        dims = _affine(idx)
        if dims is None:
            raise InstantiationError("gather: a segment's index map is not affine")
        segments.append((k, int(a), int(idx[0]), dims))
    if rows is not None:
        steps = rows[2]
        rows = (rows[0], rows[1], [int(steps[a]) for a in starts])
    return {"segments": segments, "chain": chain, "params": params, "rows": rows}


def _rows(codes: np.ndarray, src: np.ndarray, offset: np.ndarray, ends: np.ndarray):
    """(R, P, step per element of a row) when the output is R rows of P elements that all
    read the same parameters in the same pattern, row r's indices row 0's plus r * step (a
    concatenation along an inner axis: NHWC channels, P the concatenated row); each of the
    first row's segments then needs one step. None when no period up to the first
    ``MAX_SEGMENTS`` segment ends does."""
    n = codes.size
    for period in ends[:MAX_SEGMENTS]:
        period = int(period)
        if n % period or period == n:
            continue
        R = n // period
        s2 = src.reshape(R, period)
        if not (s2 == s2[0]).all():
            continue
        c2 = codes.reshape(R, period) - offset[s2]
        step = c2[1] - c2[0]
        if not (c2 == c2[0] + np.arange(R, dtype=np.int64)[:, None] * step).all():
            continue
        cuts = np.flatnonzero(np.diff(s2[0])) + 1
        if all((step[a:b] == step[a]).all() for a, b in zip(np.concatenate([[0], cuts]),
                                                            np.concatenate([cuts, [period]]))):
            return R, period, step
    return None


def broadcast_index(o: str, out_shape: tuple, shape: tuple) -> str:
    """Flat index into an operand of ``shape`` (right-aligned, 1 on broadcast dims) of the
    output element at flat index ``o``."""
    if tuple(shape) == tuple(out_shape):
        return o
    terms, ostride, pstride = [], 1, 1
    for d in reversed(range(len(out_shape))):
        if shape[d] > 1:
            q = f"{o} // {ostride}" if ostride != 1 else o
            q = f"({q}) % {out_shape[d]}" if d > 0 and any(x > 1 for x in out_shape[:d]) else q
            terms.append(f"({q}) * {pstride}" if pstride != 1 else f"({q})")
            pstride *= shape[d]
        ostride *= out_shape[d]
    return " + ".join(reversed(terms)) or "0"


def gather_ok(w) -> bool:
    try:
        gather_plan(w)
    except InstantiationError:
        return False
    return True


def parallel_segments(w, threads: int) -> list[bool]:
    """Which segments' outer loops run with ``prange``: at ``threads`` > 1, those of at least
    ``PARALLEL_MIN_SEGMENT`` elements (a concatenation of many small inputs stays on one
    thread: one parallel region per segment)."""
    plan = gather_plan(w)
    if plan["rows"] is not None:   # one parallel loop over the rows
        R, period, _ = plan["rows"]
        return [threads > 1 and R > 1 and R * period >= PARALLEL_MIN_SEGMENT]
    return [threads > 1 and int(np.prod([e for e, _ in dims])) >= PARALLEL_MIN_SEGMENT
            for _, _, _, dims in plan["segments"]]


def vector_copies(w, threads: int) -> list[bool]:
    """Which segments copy their innermost run as vectors (``vload_n``/``vstore_n``): float32
    moved data with no elementwise chain, the run contiguous in the parameter too (stride 1),
    and not the whole segment's parallel loop. SqueezeNet's NHWC concat (55 x 55 rows of 64 +
    64 channels), standalone, 1 thread: 0.033 ms against 0.063 for the scalar loop (2 threads,
    rows in parallel: 0.020 against 0.063)."""
    plan = gather_plan(w)
    par = parallel_segments(w, threads) if plan["rows"] is None else [False] * len(plan["segments"])
    return [w.dtype == "float32" and not plan["chain"] and dims[0][1] == 1
            and not (p and len(dims) == 1)
            for (_, _, _, dims), p in zip(plan["segments"], par)]


TILE_MIN_BYTES = 1 << 20   # a transpose at least this large is copied in tiles...
TILE_MIN_LINES = 128       # ...when its row-order copy reads this many lines per output run,
TILE_ALWAYS_LINES = 2048   # and always past this many


def transpose_tile(dims: list[tuple[int, int]], itemsize: int) -> int | None:
    """The dim (index into ``dims``, innermost first) to copy in tiles with the innermost one,
    or None. A transpose (NHWC -> NCHW: [(H*W, C), (C, 1)]) copied in output order reads
    one element per cache line along its innermost run; each line is used again on the next
    ``line`` runs only if the run's lines all stay in L1, which fails for long runs and for
    strides that map them onto a few cache sets (56 x 56 planes: 16 sets). In tiles of one
    line by one line every line read is used for all its elements at once. Standalone,
    float32, 1 thread (row order -> tiles): NHWC -> NCHW 56x56x256 4.73 -> 0.59 ms, 56x56x64
    0.196 -> 0.071; NCHW -> NHWC 256x56x56 0.85 -> 0.36; but 64x56x56 0.039 -> 0.069,
    1024x14x14 0.096 -> 0.117 and 2048x7x7 0.038 -> 0.061 (their runs fit the caches and
    the tiles' short loops cost more), hence the thresholds."""
    line = 64 // itemsize
    if len(dims) < 2:
        return None
    e0, s0 = dims[0]
    if abs(s0) < line or e0 < line:
        return None
    nbytes = int(np.prod([e for e, _ in dims])) * itemsize
    if not (e0 > TILE_ALWAYS_LINES or (nbytes >= TILE_MIN_BYTES and e0 >= TILE_MIN_LINES)):
        return None
    cands = [d for d, (e, s) in enumerate(dims[1:], 1) if s == 1 and e >= line]
    return cands[0] if cands else None


def gather_source(w, threads: int) -> list[str]:
    """The kernel's body lines (after the ``def``): one loop nest per segment."""
    plan = gather_plan(w)
    nparams = len(w.input_specs())
    lines = [f"e{k} = p{k}.reshape(-1)" for k in range(nparams)] + ["Cf = out.reshape(-1)"]
    vectors = vector_copies(w, threads)
    if any(vectors):
        from search_spaces import isa
        lines.append(f"VEC = {isa.current().lanes(w.dtype)}")
    segments, par_segments = plan["segments"], parallel_segments(w, threads)
    row = ""
    steps = [0] * len(segments)
    if plan["rows"] is not None:
        R, period, steps = plan["rows"]
        lines.append(f"# {R} rows of {period} elements, each the segments below")
        lines.append(f"for r in {'prange' if par_segments[0] else 'range'}({R}):")
        row, par_segments = "    ", [False] * len(segments)
    for (k, start, base, dims), par, step, vector in zip(segments, par_segments, steps, vectors):
        outer = list(reversed(dims))   # outermost first
        lines.append(f"{row}# output [{start}, {start + int(np.prod([e for e, _ in dims]))}) from p{k}: "
                     + " x ".join(f"{e} (stride {s})" for e, s in outer)
                     + (f", row step {step}" if row else ""))
        ind = row
        o_terms, i_terms = [str(start)], [str(base)]
        if row:
            o_terms.append(f"r * {period}")
            i_terms.append(f"r * {step}")
        ostrides = [int(np.prod([e for e, _ in outer[d + 1:]])) for d in range(len(outer))]
        for d, (e, s) in enumerate(outer):
            if vector and d == len(outer) - 1:
                continue
            o_terms.append(f"j{d} * {ostrides[d]}" if ostrides[d] != 1 else f"j{d}")
            if s:
                i_terms.append(f"j{d} * {s}" if s != 1 else f"j{d}")
        t = None if (row or vector) else transpose_tile(dims, np.dtype(w.dtype).itemsize)
        if t is None:
            for d, (e, s) in enumerate(outer[:-1] if vector else outer):
                rng = f"prange({e})" if d == 0 and par else f"range({e})"
                lines.append(f"{ind}for j{d} in {rng}:")
                ind += "    "
        else:   # a transpose: tiles of one cache line by one, the two dims last
            tt, tl, tb = len(outer) - 1 - t, len(outer) - 1, 64 // np.dtype(w.dtype).itemsize
            loops = [f"for j{d} in range({e}):" for d, (e, _) in enumerate(outer) if d not in (tt, tl)]
            loops += [f"for b{d} in range({-(-outer[d][0] // tb)}):" for d in (tt, tl)]
            if par:
                loops[0] = loops[0].replace("in range(", "in prange(", 1)
            loops += [f"for j{d} in range(b{d} * {tb}, min(b{d} * {tb} + {tb}, {outer[d][0]})):"
                      for d in (tt, tl)]
            lines.append(f"{ind}# tiles of {tb} x {tb}: reads of stride {dims[0][1]} from a few lines")
            for loop in loops:
                lines.append(f"{ind}{loop}")
                ind += "    "
        if vector:   # the innermost run, contiguous on both sides: vectors, the last one masked
            e = outer[-1][0]
            lines += [f"{ind}o = {' + '.join(o_terms)}",
                      f"{ind}i = {' + '.join(i_terms)}",
                      f"{ind}for jv in range(0, {e}, VEC):",
                      f"{ind}    vstore_n(Cf, o + jv, vload_n(e{k}, i + jv, {e} - jv, VEC), {e} - jv)"]
            continue
        lines.append(f"{ind}o = {' + '.join(o_terms)}")
        lines.append(f"{ind}v = e{k}[{' + '.join(i_terms)}]")
        for n, at, others in plan["chain"]:
            args = [""] * len(n.inputs)
            args[at] = "v"
            for pos, p, shape in others:
                args[pos] = f"e{p}[{broadcast_index('o', tuple(w.out_shape), shape)}]"
            lines.append(f"{ind}v = {scalar_op(n.op, dict(n.attrs), args, w.dtype)}   # {n.op}")
        lines.append(f"{ind}Cf[o] = v")
    return lines
