"""The ``gather`` formulation of the injective template: data movement as copy loops.

A group whose ops are data movement (reshape, flatten, expand_dims, squeeze, transpose,
layout_transform, concatenate) followed by an optional chain of unary elementwise ops (relu,
clip, sigmoid, ...) on the result — ShuffleNet's channel shuffle ``reshape -> transpose ->
reshape``, ``concatenate -> relu`` — writes every output element from exactly one element of
one parameter. The map is found at generation time by running the movement ops on arrays of
element *codes* (parameter, flat index), then compressed into segments: maximal runs of the
output (flat order) read from one parameter through an affine index ``base + sum(i_d *
stride_d)`` over a small loop nest. The kernel is those loop nests: contiguous output, strided
input (a channel shuffle's inner loop is a whole contiguous H*W plane), with the unary chain
applied on the way; nothing is materialised. Groups whose map does not compress into a few
segments are left to the other formulations.
"""
from __future__ import annotations

import numpy as np

from search_spaces.epilogue import scalar_op
from workloads.errors import InstantiationError

MOVEMENT_OPS = ("reshape", "flatten", "expand_dims", "squeeze", "transpose", "layout_transform",
                "concatenate")
UNARY_OPS = ("relu", "clip", "sigmoid", "tanh", "sqrt", "exp", "negative", "dropout")
MAX_SEGMENTS = 64


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


def gather_plan(w) -> dict:
    """{'segments': [(param, out_start, in_base, dims)], 'unary': [body nodes]} or raises."""
    from workloads.graph.ops import get_op

    body = w.body
    params = {p.name: k for k, p in enumerate(body.inputs)}
    ops = [n for n in body.nodes if n.is_compute]
    if not ops:
        raise InstantiationError("empty group")
    movement = [n for n in ops if n.op in MOVEMENT_OPS]
    unary = ops[len(movement):]
    if ops[:len(movement)] != movement or not movement:
        raise InstantiationError("gather: not data movement followed by unary ops")
    prev = movement[-1].name
    for n in unary:
        if n.op not in UNARY_OPS or list(n.inputs) != [prev]:
            raise InstantiationError(f"gather: {n.op} is not a unary op on the moved result")
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
    if len(starts) > MAX_SEGMENTS:
        raise InstantiationError(f"gather: {len(starts)} segments (> {MAX_SEGMENTS})")
    segments = []
    for a, b in zip(starts, ends):
        k = int(src[a])
        idx = codes[a:b] - offset[k]
        dims = _affine(idx)
        if dims is None:
            raise InstantiationError("gather: a segment's index map is not affine")
        segments.append((k, int(a), int(idx[0]), dims))
    return {"segments": segments, "unary": unary, "params": params}


def gather_ok(w) -> bool:
    try:
        gather_plan(w)
    except InstantiationError:
        return False
    return True


def gather_source(w, threads: int) -> list[str]:
    """The kernel's body lines (after the ``def``): one loop nest per segment."""
    plan = gather_plan(w)
    nparams = len(w.input_specs())
    lines = [f"e{k} = p{k}.reshape(-1)" for k in range(nparams)] + ["Cf = out.reshape(-1)"]
    for k, start, base, dims in plan["segments"]:
        outer = list(reversed(dims))   # outermost first
        lines.append(f"# output [{start}, {start + int(np.prod([e for e, _ in dims]))}) from p{k}: "
                     + " x ".join(f"{e} (stride {s})" for e, s in outer))
        ind = ""
        o_terms, i_terms = [str(start)], [str(base)]
        ostride = int(np.prod([e for e, _ in dims]))
        for d, (e, s) in enumerate(outer):
            ostride //= e
            rng = f"prange({e})" if d == 0 and threads > 1 else f"range({e})"
            lines.append(f"{ind}for j{d} in {rng}:")
            ind += "    "
            o_terms.append(f"j{d} * {ostride}" if ostride != 1 else f"j{d}")
            if s:
                i_terms.append(f"j{d} * {s}" if s != 1 else f"j{d}")
        lines.append(f"{ind}v = e{k}[{' + '.join(i_terms)}]")
        for n in plan["unary"]:
            lines.append(f"{ind}v = {scalar_op(n.op, dict(n.attrs), ['v'], w.dtype)}   # {n.op}")
        lines.append(f"{ind}Cf[{' + '.join(o_terms)}] = v")
    return lines
