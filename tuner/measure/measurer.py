"""From configs to MeasureResults: validate, generate, build in parallel, run one at a time.

Builds (Numba compiles) of a batch run concurrently in ``build_workers`` processes; runs are
serial in one pinned run worker, so no compile competes with a timing. Generated sources are
written to ``<cache>/kernels/k_<digest>.py``: content-addressed (the source, the project
modules it imports and the toolchain versions: ``tuner.measure.kernel_key``), so the same
kernel is built once and Numba's cache (``<cache>/numba``) serves every later run, and a
changed helper module or a Numba upgrade gets a new file, compiled anew.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from search_spaces.space import Config
from search_spaces.template import kernel_source, prepared_inputs
from tuner import settings
from workloads.errors import InstantiationError
from tuner.measure.kernel_key import kernel_digest
from tuner.measure.pool import Worker, worker_env
from tuner.measure.result import MeasureResult, Status


@dataclass
class MeasureOptions:
    threads: int = 1              # the tuning thread budget (max threads a kernel may use)
    warmup: int = 1
    repeat: int = 7               # timed samples per candidate
    min_repeat_ms: float = 40.0   # each sample lasts at least this long
    max_time_s: float = 3.0       # timing budget per candidate (fewer samples when slow)
    build_timeout: float = 120.0
    run_timeout: float = 60.0
    build_workers: int = 0        # 0: one per core
    # freshly allocated buffer placements each candidate is timed on (offsets from 64-byte
    # alignment, tuner.measure.placement); its score is the slowest placement's median
    placements: int = 4
    check: bool = True
    # evict the kernel's weights and other inputs but the first from the caches before each
    # timed call (one call per sample), as a built model meets them (tuner.measure.cache_flush)
    cache_flush: bool = False

    def __post_init__(self) -> None:
        """Every caller (CLI, ``tuner.tune``, scripts) gets the same one-line errors."""
        from workloads.errors import UsageError

        for name in ("threads", "repeat", "min_repeat_ms", "max_time_s", "build_timeout", "run_timeout",
                     "placements"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise UsageError(f"{name.replace('_', '-')} must be positive, got {value}")
        if self.warmup < 0 or self.build_workers < 0:
            raise UsageError("warmup and build-workers must be >= 0")


def workload_request(workload) -> dict:
    """How a worker process rebuilds ``workload``: its key (the registry imports its class),
    plus the workload itself by value (cloudpickle) when its class cannot be imported by name
    in another process, e.g. a workload kind defined in a script or a notebook."""
    req = {"workload_key": workload.key}
    cls = type(workload)
    mod = sys.modules.get(cls.__module__)
    importable = (cls.__module__ != "__main__" and getattr(mod, "__file__", None)
                  and getattr(mod, cls.__qualname__, None) is cls)
    if not importable:
        import cloudpickle

        req["workload_blob"] = cloudpickle.dumps(workload)
    return req


def write_source(source: str, cache: Path | None = None, template=None) -> Path:
    """Store ``source`` under its content address (atomic; existing files are left alone).

    The address covers the source, every project module it imports (transitively), the
    numba/llvmlite versions and ``template``'s name and version (a template object or a
    ``"name/version"`` string), so cached machine code is never reused after any of them
    changed (``tuner.measure.kernel_key``)."""
    cache = cache or settings.cache_dir()
    folder = cache / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    if template is not None and not isinstance(template, str):
        template = f"{getattr(template, 'name', '?')}/{getattr(template, 'version', '?')}"
    path = folder / f"k_{kernel_digest(source, template or '')[:20]}.py"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(source)
        os.replace(tmp, path)
    return path


class Measurer:
    def __init__(self, options: MeasureOptions | None = None, cache: Path | None = None):
        from tuner.target import require_runnable

        require_runnable()   # TUNER_CPU naming an ISA this machine lacks: refuse, one line
        self.opts = options or MeasureOptions()
        self.cache = cache or settings.cache_dir()
        env = worker_env(self.opts.threads, self.cache)
        n_build = self.opts.build_workers or max(1, os.cpu_count() or 1)
        log_dir = str(self.cache / "worker-logs")
        os.makedirs(log_dir, exist_ok=True)
        tag = f"{os.getpid()}"
        self._builders = [Worker(f"build{i}-{tag}", env, log_dir) for i in range(n_build)]
        self._runner = Worker(f"run-{tag}", env, log_dir)
        # wall seconds spent building (parallel builds count once) and running, for reports
        self.wall = {"build": 0.0, "run": 0.0}
        # compile once, measure many: the build reply of every module this measurer built
        # (kernel path -> reply); a later config with the same source is not built again
        self._built: dict[Path, dict] = {}
        self.counts = {"compiled": 0, "measured": 0}   # modules built, configs run

    def close(self) -> None:
        for w in [*self._builders, self._runner]:
            w.kill()

    def fresh_runner(self) -> None:
        """Measure what follows in a new run worker. Measured (1024^3, 2 threads): a config
        took 10.43 ms in the worker of a 64-trial run, re-measurement there included, and
        11.7-12.5 ms in every process after; the final re-measurement starts afresh."""
        self._runner.kill()   # Worker.call starts a new process on its next job

    def __enter__(self) -> "Measurer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- stages ------------------------------------------------------------------------
    def _prepare(self, workload, template, config: Config):
        """Validate and generate; returns (path, None) or (None, failed MeasureResult)."""
        space = template.space(workload, self.opts.threads)
        reason = space.violation(config)
        if reason:
            return None, MeasureResult(Status.INVALID, error=reason)
        try:
            source = kernel_source(template, workload, config)
        except InstantiationError as exc:
            return None, MeasureResult(Status.INVALID, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a codegen bug is this candidate's failure
            return None, MeasureResult(Status.COMPILE_ERROR, error=f"codegen failed: {type(exc).__name__}: {exc}")
        return write_source(source, self.cache, template), None

    def _build(self, worker: Worker, workload, template, path: Path, runtime_args: tuple,
               prepared: tuple = ()) -> dict:
        req = {"path": str(path), "entry": template.entry, "runtime_args": list(runtime_args),
               "arg_specs": workload.input_specs() + workload.output_specs(),
               "prepared": list(prepared), "n_inputs": len(workload.input_specs()),
               "prepared_only": True}   # ``run`` times the prepared form only
        return worker.call("build", req, self.opts.build_timeout)

    def _run(self, workload, template, config: Config, path: Path, cutoff_s: float | None,
             placement_cut_s: float | None = None, race_cut_s: float | None = None) -> dict:
        o = self.opts
        req = {"path": str(path), "entry": template.entry, **workload_request(workload),
               "runtime_args": list(template.runtime_args(workload, config)),
               "prepared": list(prepared_inputs(template, workload, config)),
               "threads": template.threads(config), "warmup": o.warmup, "repeat": o.repeat,
               "min_repeat_ms": o.min_repeat_ms, "max_time_s": o.max_time_s, "check": o.check,
               "cutoff_s": cutoff_s, "placement_cut_s": placement_cut_s, "race_cut_s": race_cut_s,
               "placements": o.placements, "cache_flush": o.cache_flush}
        return self._runner.call("run", req, o.run_timeout)

    # -- public ------------------------------------------------------------------------
    def measure(self, workload, template, configs: Sequence[Config],
                cutoff_s: float | None = None,
                cutoff_factor: float | None = None,
                placement_cut_s: float | None = None,
                placement_cut_factor: float | None = None,
                race_cut_s: float | None = None, race: bool = False) -> list[MeasureResult]:
        """One result per config, in order. ``cutoff_s``: a candidate whose first timed call
        is slower than this is recorded with that one sample (``info["cut_short"]``).
        ``cutoff_factor``: the cutoff is also this multiple of the fastest median measured so
        far in this call, so a batch measured before anything else (a tuning run's first,
        the default config first) does not spend a full measurement on every slow random
        config (one 1024^3 candidate at 1-4 s per call took 20-60 s over 4 placements).
        ``placement_cut_s`` / ``placement_cut_factor`` (the same two sources): a candidate
        whose first placement's median is slower than this is timed on that placement only
        (``info["placements_cut"]``); the slowest of the others could only score it slower.
        ``race_cut_s`` / ``race`` (the best score so far, and the fastest full measurement of
        this call): from its second placement on, a candidate already slower than that on one
        of them is not timed on the rest (``worker.time_placements``)."""
        results: list[MeasureResult | None] = [None] * len(configs)
        paths: dict[int, Path] = {}
        for i, cfg in enumerate(configs):
            path, failed = self._prepare(workload, template, cfg)
            if failed:
                results[i] = failed
            else:
                paths[i] = path

        # Build concurrently: each builder takes the next pending index.
        builds: dict[int, dict] = {}
        pending = list(paths)
        seen_paths: dict[Path, int] = {}

        def build_loop(worker: Worker) -> None:
            while pending:
                try:
                    i = pending.pop(0)
                except IndexError:
                    return
                builds[i] = self._build(worker, workload, template, paths[i],
                                        template.runtime_args(workload, configs[i]),
                                        prepared_inputs(template, workload, configs[i]))

        # Identical sources (two configs generating the same code: configs differing only in
        # the template's runtime knobs, or knobs a formulation ignores) are built once, in
        # this batch or any earlier one.
        for i in list(pending):
            if paths[i] in self._built:
                pending.remove(i)
                builds[i] = self._built[paths[i]]
            elif paths[i] in seen_paths:
                pending.remove(i)
            else:
                seen_paths[paths[i]] = i
        n = min(len(self._builders), len(pending)) or 1
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(build_loop, self._builders[:n]))
        self.wall["build"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        for path, i in seen_paths.items():
            self.counts["compiled"] += 1
            if builds[i]["status"] == "OK":
                self._built[path] = builds[i]
        for i in paths:
            if i not in builds:
                builds[i] = builds[seen_paths[paths[i]]]

        fastest: float | None = None
        for i in sorted(paths):
            b = builds[i]
            ctime = b.get("compile_time", b.get("elapsed"))
            if b["status"] != "OK":
                status = Status(b["status"])
                err = b.get("error", "")
                if status is Status.TIMEOUT:
                    err = "build: " + err
                results[i] = MeasureResult(status, compile_time=ctime, error=err)
                continue
            self.counts["measured"] += 1
            cut, pcut = cutoff_s, placement_cut_s
            if cutoff_factor and fastest is not None:
                cut = min(cut or float("inf"), fastest * cutoff_factor)
            if placement_cut_factor and fastest is not None:
                pcut = min(pcut or float("inf"), fastest * placement_cut_factor)
            race_cut = race_cut_s
            if race and fastest is not None:
                race_cut = min(race_cut or float("inf"), fastest)
            r = self._run(workload, template, configs[i], paths[i], cut, pcut, race_cut)
            status = Status(r["status"])
            err = r.get("error", "")
            if status is Status.TIMEOUT:
                err = "run: " + err
            results[i] = MeasureResult(status, samples=r.get("samples", []), compile_time=ctime,
                                       error=err, info={**r.get("info", {}), "source": paths[i].name})
            if results[i].ok and not (results[i].info.get("cut_short")
                                      or results[i].info.get("placements_cut")):
                fastest = min(fastest or float("inf"), results[i].median)
        self.wall["run"] += time.perf_counter() - t0
        return results  # type: ignore[return-value]

    def baseline(self, workload, threads: int | None = None) -> MeasureResult:
        """NumPy's reference implementation timed by the run worker, same procedure."""
        o = self.opts
        req = {**workload_request(workload), "threads": threads or o.threads, "warmup": o.warmup,
               "repeat": o.repeat, "min_repeat_ms": o.min_repeat_ms, "max_time_s": o.max_time_s,
               "placements": o.placements}
        r = self._runner.call("baseline", req, o.run_timeout)
        return MeasureResult(Status(r["status"]), samples=r.get("samples", []),
                             error=r.get("error", ""), info=r.get("info", {}))

    def call_overhead(self, dtype: str = "float32") -> dict:
        """Median seconds of an empty Numba call and of NumPy's matmul on 1x1 operands."""
        return self._runner.call("overhead", {"dtype": dtype}, self.opts.run_timeout)
