"""Task extraction and the task scheduler: from a model to the workloads worth tuning.

``extract_tasks(graph)`` runs the same pass pipeline the builder runs (``opt_level``, default 3
for float models, 2 for INT8 ones: ``settings.opt_level``),
turns every fused group into its workload (``workloads.fused.workload_for_group``) and merges
equal workloads (same key) into one ``Task`` with its occurrence count. Groups the builder turns
into views (reshape-only) cost nothing and are not tasks. Each task's time is the best record's
median in the store (this target and thread count) when there is one, else an estimate
(FLOPs at a nominal rate per kind, or bytes at a nominal bandwidth, whichever is slower), so the
share of run time (time x occurrences / total) is known before anything is tuned.

``TaskScheduler`` spends a model's trial budget in rounds. A task with no record starts with a
probe: one trial, which measures the template's default config (the fallback the builder would
use), heaviest estimate first, so every later decision rests on measured times rather than the
nominal-rate estimate (which is far off: ResNet-50's conv defaults run 4.2-5.4x faster than it).
Then every tunable task gets one round (heaviest measured first), then each round goes to the
task with the largest expected reduction of end-to-end latency::

    gain(i) = occurrences(i) * (backward(i) + forward(i))
    backward(i) = time saved per call by its last round (best before - best after)
    forward(i)  = best(i) * OPTIMISM / (1 + trials(i) / ROUND)

— the observed progress of the task (TVM's gradient scheduler's backward term) plus an
optimistic share of its current time that shrinks as it gets more trials. Tasks whose space
is exhausted or has a single point (fixed kernels) never get rounds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from workloads.errors import UsageError

# Nominal single-thread rates for the estimate of untuned tasks (flop/s by kind; bytes/s).
NOMINAL_BANDWIDTH = 5e9


@dataclass
class Task:
    workload: object
    template: str
    occurrences: int
    groups: list[str] = field(default_factory=list)   # fused node names, in order
    tuned: bool = False                                # the store has a config
    time: float = 0.0                                  # seconds per call (record or estimate)
    time_source: str = "estimate"                      # "record" or "estimate"
    best_config: str | None = None

    @property
    def key(self) -> str:
        return self.workload.key

    @property
    def weight(self) -> float:
        return self.time * self.occurrences


def fuse(graph, opt_level: int | None = None, layout: str = "NHWC"):
    """The pipeline the builder runs (``tuner.compiler.compile_model.pipeline``)."""
    from tuner.compiler.compile_model import pipeline

    return pipeline(graph, opt_level, layout)


def estimate_time(workload) -> float:
    rate = workload.nominal_flops_rate
    return max(workload.flops() / rate, workload.nbytes() / NOMINAL_BANDWIDTH, 1e-6)


def extract_tasks(graph, *, opt_level: int | None = None, fused: bool = False, store=None, target=None,
                  threads: int = 1) -> list[Task]:
    """Tasks of ``graph`` (already fused when ``fused``), heaviest share first."""
    from search_spaces import get_template, templates_for
    from tuner.compiler.compile_model import classify_groups
    from workloads.fused import workload_for_group

    g = graph if fused else fuse(graph, opt_level)
    tasks: dict[str, Task] = {}
    groups, _, kinds, _ = classify_groups(g)
    for node in groups:
        if kinds[node.name] != "kernel":     # views and in-place concatenations run no kernel
            continue
        w = workload_for_group(node)
        t = tasks.get(w.key)
        if t is None:
            names = templates_for(w.kind)
            if not names:
                raise UsageError(f"no template for workload kind {w.kind!r}")
            t = tasks[w.key] = Task(w, names[0], 0)
        t.occurrences += 1
        t.groups.append(node.name)
    for t in tasks.values():
        t.time = estimate_time(t.workload)
        if store is not None and target is not None:
            tpl = get_template(t.template)
            best = store.best(t.key, target.key, threads, tpl.name, tpl.version)
            if best is not None:
                t.tuned, t.time, t.time_source = True, best.median, "record"
                t.best_config = best.config.to_json()
    return sorted(tasks.values(), key=lambda t: -t.weight)


def shares(tasks: list[Task]) -> list[float]:
    total = sum(t.weight for t in tasks) or 1.0
    return [t.weight / total for t in tasks]


# -- the scheduler --------------------------------------------------------------------------------
@dataclass
class TaskState:
    index: int
    occurrences: int
    best: float                  # seconds per call now (record or estimate)
    capacity: int | None         # valid configs in the space (None: too many to count)
    trials: int = 0              # trials recorded for it (resumed ones included)
    previous: float | None = None  # best before its last round
    rounds: int = 0              # full rounds (a probe is not one)

    @property
    def measured(self) -> bool:
        """``best`` is a measurement, not the nominal estimate: a record or a probe exists."""
        return self.trials > 0

    @property
    def exhausted(self) -> bool:
        return self.capacity is not None and self.trials >= self.capacity


class TaskScheduler:
    """Which task gets the next round of trials (pure logic: no measuring here)."""

    OPTIMISM = 0.5

    def __init__(self, states: list[TaskState], budget: int, round_size: int = 8):
        if budget < 0 or round_size < 1:
            raise UsageError("budget must be >= 0 and the round size >= 1")
        self.states = states
        self.budget = budget
        self.round_size = round_size
        self.spent = 0
        self.log: list[tuple[int, int]] = []   # (task index, trials granted)

    def tunable(self) -> list[TaskState]:
        return [s for s in self.states if not s.exhausted and (s.capacity is None or s.capacity > 1)]

    def gain(self, s: TaskState) -> float:
        backward = max(0.0, (s.previous or s.best) - s.best)
        forward = s.best * self.OPTIMISM / (1.0 + s.trials / self.round_size)
        return s.occurrences * (backward + forward)

    def next(self) -> tuple[TaskState, int] | None:
        """The task for the next round and how many trials it gets, or None when done."""
        left = self.budget - self.spent
        cands = self.tunable()
        if left <= 0 or not cands:
            return None
        unmeasured = [s for s in cands if not s.measured]
        if unmeasured:   # probe: measure the default config, heaviest estimate first
            return max(unmeasured, key=lambda s: s.occurrences * s.best), 1
        fresh = [s for s in cands if s.rounds == 0]
        if fresh:   # one round each first, heaviest first
            s = max(fresh, key=lambda s: s.occurrences * s.best)
        else:
            s = max(cands, key=self.gain)
        n = min(self.round_size, left)
        if s.capacity is not None:
            n = min(n, s.capacity - s.trials)
        return s, n

    def update(self, s: TaskState, granted: int, trials: int, best: float | None) -> None:
        """After a round: the trials now recorded for the task and its best time."""
        self.spent += granted
        self.log.append((s.index, granted))
        probe = not s.measured
        s.trials = max(trials, s.trials + 1)   # a round always makes progress
        if probe:   # the estimate is replaced, not improved on: no backward term yet
            s.previous = None
        else:
            s.rounds += 1
            s.previous = s.best
        if best is not None:
            s.best = best

    def allocation(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for i, n in self.log:
            out[i] = out.get(i, 0) + n
        return out


def load_graph(path: str):
    from tuner.frontend import load_model

    return load_model(path)


def tune_model(graph, *, trials: int, store, target, threads: int, opt_level: int | None = None,
               strategy: str = "model", round_size: int = 8, seed: int = 0, measure_opts=None,
               progress: bool = False, log_path: str | None = None, command: str = "",
               echo=print, end_to_end: bool = True) -> dict:
    """Tune every task of ``graph`` (a Graph, or the path of a model) into ``store``; returns
    the report. ``end_to_end``: then build the model with defaults and with the records and
    time both in this run (``measure_builds``): the measured before/after, not an estimate."""
    import time

    from search_spaces import get_template
    from tuner.compiler.compile_model import default_opt_level
    from tuner.measure.measurer import MeasureOptions, Measurer
    from tuner.tuning import TuneOptions, mode_conflict, tune

    t0 = time.perf_counter()
    model = graph if isinstance(graph, str) else graph.name
    if isinstance(graph, str):
        graph = load_graph(graph)
    opt_level = default_opt_level(graph, opt_level)
    tasks = extract_tasks(graph, opt_level=opt_level, store=store, target=target,
                          threads=threads)
    states = []
    for i, t in enumerate(tasks):
        tpl = get_template(t.template)
        space = tpl.space(t.workload, threads)
        recorded = len(store.measured(t.key, target.key, tpl.name, tpl.version, threads))
        states.append(TaskState(i, t.occurrences, t.time, space.count_valid(), recorded))
    sched = TaskScheduler(states, trials, round_size)
    start = {s.index: s.best for s in states}   # time before tuning: record, then probe
    mopts = measure_opts or MeasureOptions(threads=threads)
    for t in tasks:   # before anything is measured: one line, nothing recorded
        conflict = mode_conflict(store, t.workload, target, get_template(t.template), threads,
                                 mopts.cache_flush)
        if conflict:
            raise UsageError(conflict)
    measurer = Measurer(mopts)
    try:
        while True:
            pick = sched.next()
            if pick is None:
                break
            s, n = pick
            probe = not s.measured
            t = tasks[s.index]
            tpl = get_template(t.template)
            opts = TuneOptions(strategy=strategy, trials=s.trials + n, seed=seed, threads=threads,
                               batch_size=min(8, n), progress=progress, log_path=log_path,
                               command=command, remeasure_top=2,
                               # the compile budget tune model was measured with (per batch)
                               max_new_variants=4, trials_per_variant=None,
                               guard_cold=True)   # a model meets its weights cold
            summary = tune(t.workload, tpl, store, target, opts, measurer=measurer)
            best = summary.best.median if summary.best else None
            sched.update(s, n, summary.measured + summary.resumed, best)
            label = (f"{len(sched.log):3d}: task {s.index:2d} x{t.occurrences} "
                     f"{t.workload.kind:9s} {t.workload.summary()[:38]:38s}")
            if probe:
                start[s.index] = s.best
                echo(f"probe {label} default {_ms(s.best)} ms (estimate was {_ms(t.time)})")
                continue
            echo(f"round {label} +{n} trials (total {s.trials}), best {_ms(s.best)} ms"
                 + (f" (was {_ms(s.previous)})" if s.previous and s.previous != s.best else ""))
    finally:
        measurer.close()
    before = sum(start[s.index] * s.occurrences for s in states)
    after = sum(s.best * s.occurrences for s in states)
    alloc = sched.allocation()
    rows = [{"task": i, "kind": t.workload.kind, "workload": t.workload.summary(),
             "key": t.key, "occurrences": t.occurrences, "trials": alloc.get(i, 0),
             "time_source": t.time_source if t.tuned else
             ("default measured" if states[i].measured else "estimate"),
             "time_before_ms": start[i] * 1e3, "time_after_ms": states[i].best * 1e3}
            for i, t in enumerate(tasks)]
    report = {"model": model, "target": target.key, "threads": threads, "budget": trials,
              "spent": sched.spent, "estimated_latency_before_ms": before * 1e3,
              "estimated_latency_after_ms": after * 1e3, "tasks": rows}
    if end_to_end:
        echo("measuring end to end: the model built with template defaults and with the "
             "records, timed in turns ...")
        report["end_to_end"] = measure_builds(graph, store=store, threads=threads,
                                              opt_level=opt_level)
    report["wall_time_s"] = time.perf_counter() - t0
    return report


def measure_builds(graph, *, store, threads: int, opt_level: int | None = None, rounds: int = 3,
                   repeat: int = 15, seed: int = 1) -> dict:
    """The end-to-end effect of the records: ``graph`` built twice in this process (template
    defaults everywhere; the records as ``build`` applies them, guard included), both run on
    the same seeded inputs in alternating rounds (so load drifts hit both), outputs compared.

    Returns p50 / p25 / p75 per build (ms), ``speedup`` = defaults p50 / tuned p50, the
    relative spread (IQR / p50, the larger of the two: a speedup inside it is noise), the
    tuned build's kernel counts and the max abs difference between the two outputs."""
    import numpy as np

    from tuner.compiler.compile_model import build
    from tuner.compiler.module import time_interleaved
    from workloads.graph.executor import random_inputs

    inputs = random_inputs(graph, seed=seed)
    mods = {"defaults": build(graph, opt_level=opt_level, threads=threads, store=store, tuned=False),
            "tuned": build(graph, opt_level=opt_level, threads=threads, store=store, tuned=True)}
    outs = {k: [np.array(o) for o in m.run(inputs)] for k, m in mods.items()}
    timing = time_interleaved({k: (lambda m=m: m.run(inputs, copy=False)) for k, m in mods.items()},
                              rounds=rounds, repeat=repeat, warmup=1, max_seconds=20)
    out: dict = {"rounds": rounds, "samples": {k: len(t.samples) for k, t in timing.items()}}
    for k, t in timing.items():
        q25, q50, q75 = np.percentile(t.samples, [25, 50, 75]) * 1e3
        out[k] = {"p50_ms": float(q50), "p25_ms": float(q25), "p75_ms": float(q75)}
    out["speedup"] = out["defaults"]["p50_ms"] / out["tuned"]["p50_ms"]
    out["spread"] = max((out[k]["p75_ms"] - out[k]["p25_ms"]) / out[k]["p50_ms"] for k in mods)
    out["tuned_counts"] = dict(mods["tuned"].summary.counts)
    out["max_abs_diff"] = max((float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                               if a.size else 0.0)
                              for a, b in zip(outs["defaults"], outs["tuned"]))
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.3f}"
