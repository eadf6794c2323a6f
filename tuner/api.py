"""The Python API: what ``import tuner`` offers (one import, no module paths to learn).

    import tuner
    r = tuner.tune("gemm:512x512x512", trials=16, threads=1, db="sqlite:///my.db")
    r.config, r.median, r.ratio            # best config, its time, NumPy time / its time
    C = tuner.gemm(A, B, db="sqlite:///my.db")   # dispatch: the best record, or a loud fallback
    db = tuner.open_db("sqlite:///my.db")  # queries: db.best(...), db.trials(...), db.workloads()
    report = tuner.tune_model("model.onnx", trials=200, threads=1)
    module = tuner.build("model.onnx", threads=1)       # the best records applied
    tuner.register_workload(MyWorkload); tuner.register_template(MyTemplate(), priority=1)

Every function checks its input through the same options objects the CLI uses
(``TuneOptions``, ``MeasureOptions``), so a bad argument is one ``UsageError`` line wherever it
comes from, raised before anything is measured or recorded.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from search_spaces import template_for
from search_spaces.space import Config
from search_spaces.template import Template
from workloads.errors import UsageError
from workloads.workload import Workload


@dataclass
class TuneResult:
    """What ``tuner.tune`` found. ``config`` is None when no candidate ran correctly."""

    workload: Workload
    template: str
    threads: int
    config: Config | None
    median: float | None          # seconds, the best config's slowest recorded median
    gflops: float | None
    baseline_median: float | None  # the competitor (NumPy) timed in the same run
    measured: int                  # new measurements in this run
    resumed: int                   # taken from the database
    statuses: dict[str, int] = field(default_factory=dict)
    wall_time: float = 0.0
    stop_reason: str = ""
    run_id: str = ""
    db: str = ""
    best: Any = None               # the ``Best`` record (config, median, measurements, versions)
    summary: Any = field(default=None, repr=False)   # the loop's ``TuneSummary`` (phase times)

    @property
    def ratio(self) -> float | None:
        """Competitor time / tuned time (> 1: faster than NumPy)."""
        if self.median and self.baseline_median:
            return self.baseline_median / self.median
        return None

    def records(self) -> list:
        """Every trial of this workload, target and thread budget in the database, in order."""
        from tuner.target import host_target

        return open_db(self.db).trials(self.workload, target=host_target().key, threads=self.threads)

    def to_dict(self) -> dict:
        return {"workload": self.workload.key, "template": self.template, "threads": self.threads,
                "config": dict(self.config) if self.config else None, "median_s": self.median,
                "gflops": self.gflops, "baseline_median_s": self.baseline_median,
                "ratio_vs_numpy": self.ratio, "measured": self.measured, "resumed": self.resumed,
                "statuses": self.statuses, "wall_time_s": round(self.wall_time, 2),
                "stop_reason": self.stop_reason, "run_id": self.run_id, "db": self.db}


def workload(spec: str | Workload) -> Workload:
    """A workload from an object, a key (``gemm:{"K":...}``) or a spec (``gemm:1024x1024x1024``,
    ``gemm:64x64x64:float64``)."""
    import workloads

    return workloads.from_spec(spec)


def _threads(threads: int | None) -> int:
    from tuner.target import thread_count

    return thread_count(threads, "threads=")


def tune(spec: str | Workload, *, trials: int = 64, strategy: str = "model",
         threads: int | None = None, template: str | None = None, db: str | None = None,
         seed: int = 0, timeout: float | None = None, early_stopping: int | None = None,
         batch_size: int = 8, repeat: int = 7, min_repeat_ms: float = 40.0, placements: int = 4,
         run_timeout: float = 60.0, build_timeout: float = 120.0, transfer: bool = True,
         optuna_storage: str | None = "db", log: str | None = None, progress: bool = False,
         command: str = "", echo: Callable[[str], Any] | None = None,
         max_new_variants: int | None = 2, trials_per_variant: int | None = 8,
         cache_flush: bool = False) -> TuneResult:
    """Search the template space of a workload, record every trial, return the best.

    ``spec``: a Workload or a spec string. ``trials`` counts configs measured for this workload,
    target, template version and thread budget, resumed ones included (a second call continues
    where the first stopped). ``echo`` receives the header lines the CLI prints.
    ``max_new_variants`` / ``trials_per_variant``: the model search's compile budget (new
    kernels per batch; at most trials / trials_per_variant kernels per run; None: no
    limit), see ``TuneOptions``. ``cache_flush``: each timed call starts with the kernel's
    weights and other inputs but the first evicted from the caches (``MeasureOptions``)."""
    from tuner.dispatch import open_store
    from tuner.measure.measurer import MeasureOptions
    from tuner.target import host_target, require_runnable
    from tuner.tuning import TuneOptions, tune as run_tuning

    w = workload(spec)
    n = _threads(threads)
    opts = TuneOptions(strategy=strategy, trials=trials, timeout=timeout, seed=seed, threads=n,
                       batch_size=batch_size, early_stopping=early_stopping, progress=progress,
                       transfer=transfer, optuna_storage=optuna_storage, log_path=log or None,
                       max_new_variants=max_new_variants, trials_per_variant=trials_per_variant,
                       command=command or shlex.join(["python", *sys.argv]))
    mopts = MeasureOptions(threads=n, repeat=repeat, min_repeat_ms=min_repeat_ms, placements=placements,
                           run_timeout=run_timeout, build_timeout=build_timeout,
                           cache_flush=cache_flush)
    tpl = template_for(w, template)
    target = host_target()
    require_runnable(target)      # a TUNER_CPU whose ISA this machine cannot execute
    store = open_store(db)
    if echo is not None:
        space = tpl.space(w, n)
        echo(f"workload : {w}  ({w.flops() / 1e9:.3f} GFLOP)")
        echo(f"target   : {target.key}, {n} thread(s)")
        echo(f"template : {tpl.name} v{tpl.version}, {len(space.knobs)} knobs, {space.size} points, "
             f"valid {space.valid_text()}")
        echo(f"search   : {strategy}, {trials} trials, seed {seed}, db {store.url}")
    s = run_tuning(w, tpl, store, target, opts, mopts)
    b = s.best
    return TuneResult(
        workload=w, template=tpl.name, threads=n, config=b.config if b else None,
        median=b.median if b else None, gflops=(w.flops() / b.median / 1e9) if b else None,
        baseline_median=s.baseline.median if s.baseline and s.baseline.samples else None,
        measured=s.measured, resumed=s.resumed, statuses=dict(s.statuses), wall_time=s.wall_time,
        stop_reason=s.stop_reason, run_id=s.run_id, db=store.url, best=b, summary=s)


def _graph(graph_or_path):
    from workloads.graph.ir import Graph

    if isinstance(graph_or_path, Graph):
        return graph_or_path
    if isinstance(graph_or_path, (str, Path)):
        from tuner.frontend import load_model

        return load_model(str(graph_or_path))
    raise UsageError(f"a model is a Graph or a path (.onnx or IR text), not {type(graph_or_path).__name__}")


def tune_model(graph_or_path, *, trials: int = 400, threads: int = 1, db: str | None = None,
               opt_level: int | None = None, strategy: str = "model", batch_size: int = 8, seed: int = 0,
               log: str | None = None, progress: bool = False,
               echo: Callable[[str], Any] | None = None, end_to_end: bool = True,
               cache_flush: bool = False) -> dict:
    """Tune every task of a model (a Graph or a path) into ``db``, spending ``trials`` where the
    expected latency cut is largest; returns the report (per task: trials, time before/after;
    ``end_to_end``: the model built with defaults and with the records, both timed in this run,
    under ``report["end_to_end"]``). ``cache_flush``: every timed call starts with the kernel's
    weights evicted from the caches, as the built model meets them (``MeasureOptions``)."""
    from tuner.dispatch import open_store
    from tuner.measure.measurer import MeasureOptions
    from tuner.tasks import tune_model as run
    from tuner.target import host_target
    from tuner.tuning import TuneOptions

    n = _threads(threads)
    TuneOptions(strategy=strategy, trials=trials, threads=n, batch_size=batch_size)  # checks
    if opt_level is not None and opt_level not in range(4):
        raise UsageError(f"opt_level must be 0..3 or None (the default level), got {opt_level!r}")
    graph = _graph(graph_or_path)
    report = run(graph, trials=trials, store=open_store(db), target=host_target(), threads=n,
                 opt_level=opt_level, strategy=strategy, round_size=batch_size, seed=seed,
                 progress=progress, log_path=log, echo=echo or (lambda _line: None),
                 end_to_end=end_to_end,
                 measure_opts=MeasureOptions(threads=n, cache_flush=cache_flush))
    return report


def build(graph_or_path, **options):
    """An executable module for a model (a Graph or a path), the best records applied and
    every fallback counted in ``module.summary`` (options: ``threads``, ``db``, ``strict``,
    ``opt_level``, ``tuned`` ...; see ``tuner.compiler.compile_model.build``)."""
    from tuner.compiler.compile_model import build as run

    return run(_graph(graph_or_path), **options)


class Records:
    """Read access to a records database (``tuner.open_db``)."""

    def __init__(self, store):
        self.store = store
        self.url = store.url

    def _key(self, w: str | Workload | None) -> str | None:
        return None if w is None else workload(w).key

    def best(self, workload: str | Workload | None = None, *, target: str | None = None,
             threads: int | None = None, template: str | None = None) -> list:
        """Best config per (workload, target, threads, template version), as ``Best`` rows."""
        return self.store.best_many(self._key(workload), target, threads, template)

    def trials(self, workload: str | Workload | None = None, *, target: str | None = None,
               threads: int | None = None, status: str | None = None) -> list:
        rows = self.store.trials(workload_key=self._key(workload), target_key=target, threads=threads)
        return [r for r in rows if status is None or r.status == status]

    def workloads(self) -> list[dict]:
        """One row per (workload, target, threads): trial counts and best GFLOPS."""
        return self.store.workloads_summary()


def open_db(url: str | None = None, *, create: bool = False) -> Records:
    """The records at ``url`` (default ``$TUNER_DB`` or ``sqlite:///logs/tuning.db``). A
    SQLite file that does not exist is a ``DatabaseError`` unless ``create=True``."""
    from tuner.dispatch import open_store

    return Records(open_store(url, create=create))


def register_workload(cls: type[Workload], *, priority: int = 0) -> type[Workload]:
    """Add a workload kind (``cls.kind``); usable as a class decorator. A kind that overrides
    ``Workload.claims_group`` is offered the fused groups of models it claims."""
    import workloads

    return workloads.register_workload(cls, priority=priority)


def register_template(template: Template, *, name: str | None = None, priority: int = 1) -> Template:
    """Add a template instance (under ``name``, default ``template.name``). With the default
    ``priority=1`` it is chosen over the built-in template of its kind (priority 0) by
    ``tune``, dispatch and model builds; ``priority=-1`` keeps it an explicit choice
    (``tune(..., template=name)``)."""
    from search_spaces import register_template as register

    register(name or template.name, template, priority)
    return template
