"""Parallel loop bodies as functions of their own: what a parallel kernel costs to compile.

Numba compiles a ``parallel=True`` function's ``prange`` loop twice over: the whole function
is typed, then the parfor passes cut the loop body out into a gufunc that is typed, lowered
and optimised again, with every ``inline="always"`` callee (the micro-kernels) inlined into
both. And the gufunc calls a function of the body typed with the loop index as ``uint64``,
where the enclosing function typed it ``int64``: each such callee compiles twice.

``outline_parallel_loops`` rewrites a generated module so that each ``prange`` loop whose body
calls a module function compiled ``inline="always"`` (a micro-kernel: what makes the body
expensive to compile twice) has that body in a serial function of its own::

    for blk in prange(M_BLOCKS):             @numba.njit(...)
        i0 = blk * TILE_M           ->       def gemm_core_block(blk, TILE_M, M, ...):
        ...                                      i0 = blk * TILE_M
                                                 ...
                                             ...
                                             for blk in prange(M_BLOCKS):
                                                 gemm_core_block(np.int64(blk), TILE_M, M, ...)

typed and compiled once; the parfor machinery then handles a one-call body. The ``np.int64``
is what makes it pay: without it the body function compiles for both index types, and an
earlier trial of this outlining (docs/compile-once.md) measured it slower than the parfor.
Measured (Intel Xeon, AVX-512, 2 threads, 2026-12-03): a 1x1 NHWC conv2d module of ResNet-50
2.2 -> 1.8 s of compile CPU (its 1-thread twin 1.3 s), a 3x3 one 5.4 -> 4.4 s, the same run
time; the model's cold `build` 29.2-30.1 -> 25.0-25.2 s wall (docs/compile-once.md).

A loop is left as it is when outlining could change what it computes: a name its body
assigns that the enclosing function also binds (a reduction, or a value read after the
loop), or a ``return``/``break``/``continue`` of the loop itself. A body without such a
callee stays too: typing it twice costs less than the level of calls outlining adds (the
GEMM template's block loop, whose micro-kernel is a call: 3.6 s of compile CPU as it is,
3.8 s outlined; a padding loop of slice copies 4.4 s as it is, 6.9 s outlined).
"""
from __future__ import annotations

import ast
import builtins
import functools

_BUILTINS = set(dir(builtins))


def _is_prange(node: ast.AST) -> bool:
    return (isinstance(node, ast.For) and isinstance(node.iter, ast.Call)
            and isinstance(node.iter.func, ast.Name) and node.iter.func.id == "prange")


def _njit_call(fn: ast.FunctionDef, arg: str, value) -> ast.Call | None:
    """The decorator call of ``fn`` passing ``arg=value`` (``parallel=True``,
    ``inline="always"``), or None."""
    return next((d for d in fn.decorator_list if isinstance(d, ast.Call) and any(
        k.arg == arg and isinstance(k.value, ast.Constant) and k.value.value == value
        for k in d.keywords)), None)


def _names(nodes: list[ast.stmt], ctx: type) -> set[str]:
    return {n.id for s in nodes for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _leaves_loop(body: list[ast.stmt]) -> bool:
    """A return anywhere, or a break/continue not inside a nested loop of the body."""
    def walk(node: ast.AST, nested: bool) -> bool:
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, (ast.Break, ast.Continue)) and not nested:
            return True
        inner = nested or isinstance(node, (ast.For, ast.While))
        return any(walk(c, inner) for c in ast.iter_child_nodes(node))
    return any(walk(s, False) for s in body)


def _bound_in(fn: ast.FunctionDef, loop: ast.For) -> set[str]:
    """Names the function binds outside ``loop``'s body: its parameters and every store."""
    inside = {id(n) for s in loop.body for n in ast.walk(s)}
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    stores = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
              and id(n) not in inside}
    return params | stores


def _decorator(fn: ast.FunctionDef) -> str:
    """The enclosing function's numba.njit options, serial and not cached on their own."""
    deco = _njit_call(fn, "parallel", True)
    kept = [k for k in deco.keywords if k.arg not in ("parallel", "cache")]
    return "@" + ast.unparse(ast.Call(func=deco.func, args=deco.args, keywords=kept))


@functools.lru_cache(maxsize=256)   # a build asks for the same module once per layer using it
def outline_parallel_loops(source: str) -> str:
    """``source`` with the body of every eligible ``prange`` loop of a parallel function moved
    into a serial function (see the module docstring); unchanged when there is none."""
    tree = ast.parse(source)
    lines = source.split("\n")
    module_names = {t.id for s in tree.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                    for t in ast.walk(s) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    functions = {s.name for s in tree.body if isinstance(s, ast.FunctionDef)}
    inlined = {s.name for s in tree.body
               if isinstance(s, ast.FunctionDef) and _njit_call(s, "inline", "always")}
    imported = {(a.asname or a.name).split(".")[0] for s in tree.body
                if isinstance(s, (ast.Import, ast.ImportFrom)) for a in s.names}
    globals_ = module_names | functions | imported | _BUILTINS
    edits = []   # (first line of the enclosing function's decorator, new function, loop, call)
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and _njit_call(fn, "parallel", True)):
            continue
        loops = [n for n in ast.walk(fn) if _is_prange(n)]
        nested = {id(m) for n in loops for s in n.body for m in ast.walk(s)}
        loops = [n for n in loops if id(n) not in nested]   # an inner prange goes with its outer
        for k, loop in enumerate(loops):
            if not isinstance(loop.target, ast.Name) or _leaves_loop(loop.body):
                continue
            calls = {c.func.id for s in loop.body for c in ast.walk(s)
                     if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            if not calls & inlined:
                continue   # nothing inlined into it: cheap to type twice, and a level of calls less
            stored = _names(loop.body, ast.Store)
            if stored & _bound_in(fn, loop):
                continue   # the loop's effect on the function's own names would be lost
            index = loop.target.id
            passed = _names(loop.body, ast.Load) - stored - globals_ - {index}
            used = sorted((x.lineno, x.col_offset, x.id) for s in loop.body for x in ast.walk(s)
                          if isinstance(x, ast.Name) and x.id in passed)
            free = list(dict.fromkeys(n for *_, n in used))   # in the order the body reads them
            name = f"{fn.name}_{'block' if len(loops) == 1 else f'block{k}'}"
            if name in globals_:
                continue   # the module already has that name
            body = lines[loop.body[0].lineno - 1:loop.end_lineno]
            indent = min(len(b) - len(b.lstrip()) for b in body if b.strip())
            new = [_decorator(fn),
                   f"def {name}({', '.join([index] + free)}):",
                   f'    """One iteration of {fn.name}\'s parallel loop over {index}."""'] \
                + ["    " + b[indent:] if b.strip() else "" for b in body]
            call = " " * indent + f"{name}(np.int64({index}), {', '.join(free)})".replace(", )", ")")
            edits.append((fn.decorator_list[0].lineno, new, loop, call))
    if not edits:
        return source
    # splice a function at a time from the bottom up: its loops (bottom-up), then its new
    # functions above it; every edit lies below the lines still to be edited
    for deco_line in sorted({e[0] for e in edits}, reverse=True):
        mine = sorted((e for e in edits if e[0] == deco_line), key=lambda e: -e[2].lineno)
        for _deco, _new, loop, call in mine:
            lines[loop.body[0].lineno - 1:loop.end_lineno] = [call]
        lines[deco_line - 1:deco_line - 1] = [ln for e in reversed(mine) for ln in e[1] + ["", ""]]
    out = "\n".join(lines)
    if "np" not in imported:
        out = out.replace("import numba\n", "import numba\nimport numpy as np\n", 1)
    return out
