"""Dispatch: pick the best recorded config for a workload on this target, or fall back loudly.

``select_config`` consults the records store for (workload, this target, thread budget,
template version). With no record it returns the template's default config and warns once
per workload, naming the workload, the target and the exact command that would tune it;
``strict=True`` turns that into ``NoRecordError``. Records of another target are never used:
when they exist the warning says so. A record made with other numba/llvmlite versions is used
with a one-time notice (``strict`` refuses it).

``gemm(A, B)`` compiles the chosen kernel in this process (from Numba's on-disk cache when a
tuning worker already built it) and runs it.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
from dataclasses import dataclass

import numpy as np

from search_spaces import template_for
from search_spaces.space import Config
from tuner import settings
from tuner.db.store import Best, Store
from tuner.errors import NoRecordError, UsageError
from tuner.target import Target, host_target, usable_cores

_WARNED: set[tuple] = set()
_LOCK = threading.Lock()
_KERNELS: dict[tuple[str, str], object] = {}
_STORES: dict[str, Store] = {}


@dataclass
class Selection:
    config: Config
    source: str               # "tuned" or "fallback"
    best: Best | None = None
    note: str = ""            # why a fallback, or a version notice


def tune_command(workload, threads: int) -> str:
    if workload.kind == "gemm":
        return (f"python -m tuner tune gemm --shape {workload.shape_str} --dtype {workload.dtype} "
                f"--threads {threads}")
    return f"python -m tuner tune {workload.kind} ... --threads {threads}"


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
    """Compile (or load from Numba's cache) the kernel for ``config`` in this process."""
    from tuner.measure.measurer import write_source

    key = (workload.key, f"{template.name}/{template.version}/{config.hash}")
    fn = _KERNELS.get(key)
    if fn is None:
        align_numba_cache()
        path = write_source(template.codegen(workload, config))
        name = "tuner_kernel_" + path.stem
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        fn = _KERNELS[key] = getattr(mod, template.entry)
    return fn


def open_store(url: str | None = None) -> Store:
    url = settings.db_url(url)
    if url not in _STORES:
        _STORES[url] = Store(url)
    return _STORES[url]


def _gemm_dtype(A: np.ndarray, B: np.ndarray, weights7: bool) -> str:
    """The workload dtype of ``A @ B``: the operands' own, or int8 for uint8 x int8 (int8w7
    when the caller promises weights in [-64, 64]; checked, since that kernel relies on it)."""
    if (A.dtype, B.dtype) == (np.uint8, np.int8):
        if not weights7:
            return "int8"
        if B.size and (int(B.min()) < -64 or int(B.max()) > 64):
            raise UsageError("weights7=True needs every weight in [-64, 64]; got "
                             f"[{int(B.min())}, {int(B.max())}]")
        return "int8w7"
    if A.dtype != B.dtype:
        raise UsageError(f"gemm operands differ in dtype: {A.dtype} and {B.dtype} "
                         "(uint8 x int8 is the quantized GEMM)")
    return str(A.dtype)


def gemm(A: np.ndarray, B: np.ndarray, *, threads: int | None = None, db: str | None = None,
         strict: bool = False, out: np.ndarray | None = None, weights7: bool = False) -> np.ndarray:
    """C = A @ B with the best tuned kernel for this shape, dtype and target (or a fallback).
    uint8 A x int8 B gives int32 C (``weights7``: B in [-64, 64], the int8w7 workload)."""
    from workloads.gemm import Gemm

    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise UsageError(f"gemm needs A[M,K] and B[K,N]; got {A.shape} and {B.shape}")
    w = Gemm(int(A.shape[0]), int(B.shape[1]), int(A.shape[1]), _gemm_dtype(A, B, weights7))
    threads = threads or usable_cores()
    template = template_for(w)
    sel = select_config(w, template, open_store(db), threads=threads, strict=strict)
    fn = load_kernel(w, template, sel.config)
    import numba

    numba.set_num_threads(min(template.threads(sel.config), numba.config.NUMBA_NUM_THREADS))
    C = out if out is not None else np.empty((w.M, w.N), dtype=w.output_specs()[0][1])
    fn(np.ascontiguousarray(A), np.ascontiguousarray(B), C)
    return C
