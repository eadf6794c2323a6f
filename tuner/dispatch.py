"""Dispatch: pick the best recorded config for a workload on this target, or fall back loudly.

``select_config`` consults the records store for (workload, this target, thread budget,
template version). With no record it returns the template's default config and warns once
per workload, naming the workload, the target and the exact command that would tune it;
``strict=True`` turns that into ``NoRecordError``. Records of another target are never used:
when they exist the warning says so. A record made with other numba/llvmlite versions is used
with a one-time notice (``strict`` refuses it).

``gemm(A, B)`` compiles the chosen kernel in this process (from Numba's on-disk cache when a
tuning worker already built it) and runs it. Its selection and kernel are cached per process
for (store URL, shape, dtype, threads, strict), and ``kernel(spec)``'s for (store URL,
workload, template, threads, strict): after the first call no database query is made. A
cached entry is dropped when this process writes trials to that store (a tuning run,
``tuner.db.store.writes``) or on ``forget_selections()``; records written by another process
are seen by a new process (or after ``forget_selections()``).
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

import numpy as np

from search_spaces import template_for
from search_spaces.space import Config
from tuner import settings
from tuner.db import store as store_mod
from tuner.db.store import Best, Store
from workloads.errors import NoRecordError, UsageError
from tuner.target import Target, host_target, require_runnable, thread_count, usable_cores

_WARNED: set[tuple] = set()
_LOCK = threading.Lock()
_KERNELS: dict[tuple[str, str], object] = {}
_STORES: dict[str, Store] = {}
# (store url, M, N, K, dtype, threads, strict) for ``gemm``, (store url, "kernel", workload key,
# template, threads, strict) for ``kernel`` -> (store writes when selected, Kernel, output
# dtype): the dispatched path's per-process cache
_SELECTED: dict[tuple, tuple[int, "Kernel", str]] = {}


@dataclass
class Selection:
    config: Config
    source: str               # "tuned" or "fallback"
    best: Best | None = None
    note: str = ""            # why a fallback, or a version notice


def tune_command(workload, threads: int) -> str:
    return workload.tune_command(threads)


def _warn_once(key: tuple, message: str) -> None:
    with _LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    print(f"tuner: {message}", file=sys.stderr)


def _version_drift(best: Best, target: Target) -> list[str]:
    return [f"{k} {best.versions.get(k)} -> {target.versions.get(k)}"
            for k in ("numba", "llvmlite") if best.versions.get(k) != target.versions.get(k)]


def select_config(workload, template, store: Store, target: Target | None = None,
                  threads: int = 1, strict: bool = False, quiet: bool = False) -> Selection:
    target = target or host_target()
    best = store.best(workload.key, target.key, threads, template.name, template.version)
    if best is not None:
        # A record from before the spaces followed the ISA (e.g. a 16-lane config on AVX2)
        # would fail codegen: set it aside, loudly, and fall back.
        invalid = template.space(workload, max(threads, usable_cores())).violation(best.config)
        if invalid:
            if not quiet:
                _warn_once(("invalid", workload.key, target.key, threads),
                           f"record for {workload} on {target.key} is not a valid config of "
                           f"template {template.name} v{template.version} here ({invalid}); "
                           f"ignoring it. Retune with: {tune_command(workload, threads)}")
            best = None
    if best is not None:
        g = best.guard
        if g and not g.get("accepted", True):
            # the tuned config (or one it ties: Store.best_many) did not beat the template's
            # default side by side beyond the measured noise: keep the default (a tuned
            # decision, recorded with its margin)
            tie = "" if g.get("best") == best.config.hash else " (a config it ties)"
            why = (f"margin {g['margin']:.3f} is within the noise {g['noise']:.3f} of a "
                   "side-by-side re-measurement" if "cold_margin" not in g else
                   f"margin {g['margin']:.3f} turned {g['cold_margin']:.3f} timed with its "
                   "operands evicted, as a model meets them")
            return Selection(template.default_config(workload, threads), "tuned", best,
                             f"default kept: the tuned config's{tie} {why}")
        drift = _version_drift(best, target)
        if not drift:
            return Selection(best.config, "tuned", best)
        note = (f"record for {workload} was tuned with {', '.join(drift)}; applying it anyway "
                "(retune for best results)")
        if strict:
            raise NoRecordError(note.replace("applying it anyway", "refused under --strict"))
        if not quiet:
            _warn_once(("drift", workload.key, target.key, threads), note)
        return Selection(best.config, "tuned", best, note)

    others = [b for b in store.best_many(workload.key, None, None, template.name)
              if not (b.target_key == target.key and b.threads == threads
                      and b.template_version == template.version)]
    elsewhere = ""
    if others:
        where = sorted({f"{b.target_key}/threads={b.threads}/v{b.template_version}" for b in others})
        elsewhere = f" (records exist for {', '.join(where)}, not applied here)"
    msg = (f"no tuned config for {workload} on target {target.key} with {threads} thread(s), "
           f"template {template.name} v{template.version}{elsewhere}")
    if strict:
        raise NoRecordError(f"{msg}; tune it with: {tune_command(workload, threads)}")
    from tuner.search.model_based import transfer_fallback

    similar = transfer_fallback(workload, template, store, target, threads)
    config, how = similar or (template.default_config(workload, threads), "the template's default")
    if not quiet:
        _warn_once(("fallback", workload.key, target.key, threads),
                   f"{msg}; using a fallback configuration ({how}), which may be slow. "
                   f"Tune it with: {tune_command(workload, threads)}")
    return Selection(config, "fallback", note=f"{msg}; fallback: {how}")


def align_numba_cache(cache=None) -> None:
    """Make this process read Numba's cache where the build workers write it
    (``$TUNER_CACHE/numba``), so a kernel a tuning run compiled is loaded, not compiled again."""
    want = str((cache or settings.cache_dir()) / "numba")
    if os.environ.get("NUMBA_CACHE_DIR") != want:
        os.environ["NUMBA_CACHE_DIR"] = want
        import numba.core.config

        numba.core.config.reload_config()


def load_kernel(workload, template, config: Config):
    """Compile (or load from Numba's cache) the kernel for ``config`` in this process: a
    callable taking the workload's arrays, with the config's runtime arguments (the
    template's ``runtime_args``) bound. Configs that differ only in runtime knobs share one
    module, imported once per process."""
    from search_spaces.template import bind_runtime_args, kernel_source
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.measurer import write_source

    key = (workload.key, f"{template.name}/{template.version}/{config.hash}")
    fn = _KERNELS.get(key)
    if fn is None:
        require_runnable()
        align_numba_cache()
        path = write_source(kernel_source(template, workload, config), template=template)
        mod = import_kernel_module(path)
        fn = _KERNELS[key] = bind_runtime_args(getattr(mod, template.entry),
                                               template.runtime_args(workload, config))
    return fn


def open_store(url: str | None = None, create: bool = True) -> Store:
    """The process's store for ``url`` (default ``$TUNER_DB`` or ``logs/tuning.db``), opened
    once; ``create=False`` refuses a SQLite file that does not exist (queries)."""
    url = settings.db_url(url)
    if url not in _STORES:
        _STORES[url] = Store(url, create=create)
    return _STORES[url]


def _describe(a) -> str:
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    layout = "" if a.flags.c_contiguous else ", not C-contiguous"
    return f"shape {a.shape}, dtype {a.dtype}{layout}" + ("" if a.flags.writeable else ", read-only")


class Kernel:
    """A compiled kernel with its selected config: call it with the workload's input arrays
    then its output arrays (written in place); Numba's thread pool is set to the config's
    threads on every call."""

    def __init__(self, workload, template, selection: Selection):
        self.workload, self.template, self.selection = workload, template, selection
        self.config = selection.config
        self.source = selection.source          # "tuned" or "fallback"
        self.fn = load_kernel(workload, template, selection.config)
        import numba

        self.threads = min(template.threads(selection.config), numba.config.NUMBA_NUM_THREADS)
        self._n_inputs = len(workload.input_specs())
        self._specs = [(tuple(int(d) for d in shape), np.dtype(dtype))
                       for shape, dtype in workload.input_specs() + workload.output_specs()]

    def __call__(self, *arrays):
        """Run the kernel on the workload's inputs then its outputs. Each array is checked
        against the workload (shape, dtype; outputs C-contiguous and writable; inputs made
        contiguous) before the compiled code, which does not check bounds, sees it."""
        import numba

        arrays = self.checked(arrays)
        numba.set_num_threads(self.threads)
        return self.fn(*arrays)

    def checked(self, arrays: tuple) -> tuple:
        """``arrays`` as the compiled kernel may take them, or a one-line UsageError."""
        if len(arrays) != len(self._specs):
            raise UsageError(f"{self.workload.kind} kernel takes {self._n_inputs} input(s) then "
                             f"{len(self._specs) - self._n_inputs} output(s); got {len(arrays)} arrays")
        out = []
        for i, (a, (shape, dtype)) in enumerate(zip(arrays, self._specs)):
            role = f"input {i}" if i < self._n_inputs else f"output {i - self._n_inputs}"
            if i < self._n_inputs:
                a = np.ascontiguousarray(a)
            elif not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
                raise UsageError(f"{role} must be a writable C-contiguous array of shape {shape} "
                                 f"and dtype {dtype}; got {_describe(a)}")
            if a.shape != shape or a.dtype != dtype:
                raise UsageError(f"{role} must have shape {shape} and dtype {dtype}; got {_describe(a)}")
            out.append(a)
        return tuple(out)

    def __repr__(self) -> str:
        return f"Kernel({self.workload}, {self.template.name} v{self.template.version}, {self.source})"


def kernel(spec, *, threads: int | None = None, db: str | None = None, strict: bool = False,
           template: str | None = None) -> Kernel:
    """The kernel for a workload (object or spec such as ``"gemm:512x512x512"``) with the best
    record for this target and thread budget applied, or the announced fallback."""
    import workloads
    from search_spaces import template_for

    w = workloads.from_spec(spec)
    url = settings.db_url(db)
    key = (url, "kernel", w.key, template, usable_cores() if threads is None else threads,
           bool(strict))
    return _selected(key, lambda: (w, template_for(w, template)))[0]


def forget_selections(url: str | None = None) -> None:
    """Drop the dispatched path's cached selections (all of them, or those of one store URL),
    so the next call consults the store again: after another process tuned, say."""
    with _LOCK:
        for key in [k for k in _SELECTED if url is None or k[0] == settings.db_url(url)]:
            del _SELECTED[key]


def _selected(key: tuple, make) -> tuple:
    """(``Kernel``, output dtype) cached per process for ``key`` = (store url, ..., threads,
    strict); ``make()`` gives (workload, template) when the key is new or this process has
    written trials to the store since it was selected."""
    hit = _SELECTED.get(key)
    if hit is not None and hit[0] == store_mod.writes(key[0]):
        return hit[1:]
    url, threads, strict = key[0], thread_count(key[-2]), key[-1]   # checked once per key
    w, template = make()
    written = store_mod.writes(url)
    k = Kernel(w, template, select_config(w, template, open_store(url), threads=threads, strict=strict))
    entry = (written, k, w.output_specs()[0][1])
    with _LOCK:
        _SELECTED[key] = entry
    return entry[1:]


def _gemm_kernel(key: tuple):
    """(``Kernel``, output dtype) for a gemm key (url, M, N, K, dtype, threads, strict)."""
    from workloads.gemm import Gemm

    def make():
        w = Gemm(*key[1:5])
        return w, template_for(w)

    return _selected(key, make)


_DTYPE_NAMES: dict[str, str] = {}   # dtype.str ('<f4') -> name (str(dtype) is slow Python code in NumPy)


def _gemm_dtype(A: np.ndarray, B: np.ndarray, weights7: bool) -> str:
    """The workload dtype of ``A @ B``: the operands' own, or int8 for uint8 x int8 (int8w7
    when the caller promises weights in [-64, 64]; checked, since that kernel relies on it).
    Compared by ``dtype.str`` (type and byte order): this runs on every ``tuner.gemm`` call."""
    a, b = A.dtype.str, B.dtype.str
    if a == b:
        name = _DTYPE_NAMES.get(a)
        if name is None:
            name = _DTYPE_NAMES[a] = str(A.dtype)
        return name
    if (A.dtype, B.dtype) == (np.uint8, np.int8):
        if not weights7:
            return "int8"
        if B.size and (int(B.min()) < -64 or int(B.max()) > 64):
            raise UsageError("weights7=True needs every weight in [-64, 64]; got "
                             f"[{int(B.min())}, {int(B.max())}]")
        return "int8w7"
    raise UsageError(f"gemm operands differ in dtype: {A.dtype} and {B.dtype} "
                     "(uint8 x int8 is the quantized GEMM)")


def gemm(A: np.ndarray, B: np.ndarray, *, threads: int | None = None, db: str | None = None,
         strict: bool = False, out: np.ndarray | None = None, weights7: bool = False) -> np.ndarray:
    """C = A @ B with the best tuned kernel for this shape, dtype and target (or a fallback).
    uint8 A x int8 B gives int32 C (``weights7``: B in [-64, 64], the int8w7 workload).
    ``out``: a writable C-contiguous array of C's shape and dtype to write into."""
    A = A if isinstance(A, np.ndarray) else np.asarray(A)
    B = B if isinstance(B, np.ndarray) else np.asarray(B)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise UsageError(f"gemm needs A[M,K] and B[K,N]; got {A.shape} and {B.shape}")
    url = settings.db_url(db)
    key = (url, int(A.shape[0]), int(B.shape[1]), int(A.shape[1]), _gemm_dtype(A, B, weights7),
           usable_cores() if threads is None else threads, bool(strict))
    k, out_dtype = _gemm_kernel(key)
    import numba

    if numba.get_num_threads() != k.threads:
        numba.set_num_threads(k.threads)
    if out is None:
        C = np.empty((key[1], key[2]), dtype=out_dtype)
    elif (not isinstance(out, np.ndarray) or out.shape != (key[1], key[2]) or out.dtype != out_dtype
          or not out.flags.c_contiguous or not out.flags.writeable):
        raise UsageError(f"out= must be a writable C-contiguous array of shape {(key[1], key[2])} "
                         f"and dtype {np.dtype(out_dtype)}; got {_describe(out)}")
    else:
        C = out
    k.fn(np.ascontiguousarray(A), np.ascontiguousarray(B), C)
    return C
