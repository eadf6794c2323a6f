"""The tuner loop: budget, resume, measurement, records, progress, final re-measurement.

``tune()`` owns everything around the strategy: it resumes from the database (configs
already measured for this workload, target, template version and thread budget are told to
the strategy and never measured again; they count toward ``trials``), asks for batches,
measures them in worker processes, writes each batch to the store in one transaction, shows
progress, stops on budget / timeout / exhaustion / early stopping, re-measures the top few
configs (a lucky sample cannot become best), and measures NumPy in the same run for the ratio.
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from search_spaces.space import Config
from tuner.db.claims import Claims
from tuner.db.jsonl import RunLog
from tuner.db.store import Best, Store, TrialRecord, leader_guard, placements_cut, rank_configs
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.measure.result import MeasureResult, Status, summarize
from tuner.search import make_strategy
from tuner.search.model_based import strategy_options
from tuner.target import busy_note


@dataclass
class TuneOptions:
    strategy: str = "model"
    trials: int = 64              # total measured configs for this workload (resumed included)
    timeout: float | None = None  # seconds of wall time for the search (then finish cleanly)
    seed: int = 0
    threads: int = 1
    batch_size: int = 8
    # model search: at most this many configs of a batch need a kernel not compiled yet (the
    # rest vary the runtime knobs of compiled ones: measured, not compiled); None: no cap.
    # 2 since 2026-12-01 (was 4): two builds fill two build workers in one round
    max_new_variants: int | None = 2
    # model search: at most ceil(trials / trials_per_variant) distinct variants (kernels) in
    # the run, the template default's included (64 trials: 8, two per build round); None: no limit
    trials_per_variant: int | None = 8
    early_stopping: int | None = None  # stop after this many trials without a new best
    remeasure_top: int = 3
    guard_rounds: int = 2         # rounds of the side-by-side default-vs-best check (0: none)
    guard_min_margin: float = 0.02  # the tuned config must win by more than this and the noise
    # a winner of the (hot) check is timed again beside the default with its operands evicted
    # before each call (``guard_against_default``), and applied only if faster there too: a
    # built model meets its weights cold (``tune model`` sets it; a run already flushing needs
    # no second look; a cold timing that fails leaves the first check's decision)
    guard_cold: bool = False
    cutoff_factor: float | None = 10.0  # one sample only for candidates this much slower than the best
    # one buffer placement only (of MeasureOptions.placements) for a candidate whose first
    # placement is this much slower than the best: its slowest placement could not be faster
    placement_cut_factor: float | None = 1.1
    # racing: from its second placement on, a candidate slower than the best score so far on
    # one of them is not timed on the rest (it cannot become the best; worker.time_placements)
    race_placements: bool = True
    claim_ttl: float = 120.0      # seconds a claim lives without its owner's heartbeat
    seed_default: bool = True     # measure the template's seed configs (its default first) in the first batch
    transfer: bool = True         # model: pre-train on other workloads' records (same target)
    optuna_storage: str | None = "db"  # tpe: study in the records db ("db"), a URL, or None (memory)
    log_path: str | None = None   # JSON-lines journal of every recorded trial
    progress: bool = True
    command: str = ""

    def __post_init__(self) -> None:
        """Checked here so every caller (CLI, ``tuner.tune``, ``tune_model``) gets the same
        one-line ``UsageError`` before anything is measured or recorded."""
        from workloads.errors import UsageError
        from tuner.search import STRATEGIES

        for name in ("trials", "batch_size", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("max_new_variants", "trials_per_variant"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value <= 0):
                raise UsageError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("timeout", "early_stopping"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise UsageError(f"{name.replace('_', '-')} must be positive, got {value!r}")
        if self.strategy not in STRATEGIES:
            raise UsageError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")


@dataclass
class TuneSummary:
    run_id: str
    workload_key: str
    target_key: str
    threads: int
    measured: int                 # new measurements in this run
    resumed: int                  # taken from the database
    statuses: Counter = field(default_factory=Counter)
    best: Best | None = None
    baseline: MeasureResult | None = None
    wall_time: float = 0.0
    phase_time: dict = field(default_factory=dict)  # wall seconds: build, run, (search + db)
    compiled: int = 0             # distinct kernel modules built (compile once, measure many)
    runs: int = 0                 # configs run (search, re-measurement, default check)
    stop_reason: str = ""

    @property
    def ratio(self) -> float | None:
        """NumPy time / tuned time (> 1 means faster than NumPy)."""
        if self.best is None or self.baseline is None or not self.baseline.samples:
            return None
        return self.baseline.median / self.best.median


class _Progress:
    def __init__(self, total: int, initial: int, enabled: bool, desc: str):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="trial",
                            file=sys.stderr, dynamic_ncols=True, leave=True)

    def update(self, n: int, failures: int, best_gflops: float | None) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"fail={failures} best={best_gflops:.1f} GFLOPS" if best_gflops else f"fail={failures}")
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def mode_conflict(store: Store, workload, target, template, threads: int,
                  cache_flush: bool) -> str | None:
    """Why this workload's records cannot be tuned further in this measurement mode, or None:
    times taken with ``--cache-flush`` (operands evicted before each call) and without it are
    not comparable, and a config's score mixes every measurement of it."""
    rows = store.measured(workload.key, target.key, template.name, template.version, threads)
    other = [r for r in rows.values()
             if r.status == Status.OK.value and bool((r.info or {}).get("cache_flush")) != cache_flush]
    if not other:
        return None
    was = "without" if cache_flush else "with"
    name = workload.summary() if hasattr(workload, "summary") else str(workload)   # fused: short
    return (f"{len(other)} record(s) of {name} on {target.key} (threads={threads}) were measured "
            f"{was} --cache-flush: their times are not comparable with this run's; tune in the same "
            "mode, or into another database (--db)")


def tune(workload, template, store: Store, target, opts: TuneOptions,
         measure_opts: MeasureOptions | None = None, measurer: Measurer | None = None) -> TuneSummary:
    t_start = time.perf_counter()
    mopts = measure_opts or MeasureOptions(threads=opts.threads)
    mopts.threads = opts.threads
    conflict = mode_conflict(store, workload, target, template, opts.threads,
                             (measurer.opts if measurer is not None else mopts).cache_flush)
    if conflict:
        from workloads.errors import UsageError

        raise UsageError(conflict)
    space = template.space(workload, opts.threads)
    options = strategy_options(opts.strategy, workload, template, store, target, opts.threads,
                               transfer=opts.transfer, optuna_storage=opts.optuna_storage)
    if opts.strategy == "model":
        options["max_new_variants"] = opts.max_new_variants
        options["max_variants"] = max_variants(opts)
    strategy = make_strategy(opts.strategy, space, seed=opts.seed, **options)
    run_id = store.start_run(target, opts.command, opts.strategy, opts.threads)
    flops = workload.flops()
    busy = busy_note(opts.threads)
    if busy:
        print(f"tuner: {busy}", file=sys.stderr)

    # Resume, and share with concurrent tuners: every config recorded for this workload,
    # target, template version and thread budget is told to the strategy and never measured
    # again; the database is read again before every batch, so trials that other processes
    # record meanwhile count too (toward the budget as well).
    known: set[str] = set()
    best_time: float | None = None

    def sync() -> int:
        nonlocal best_time
        rows = [r for h, r in store.measured(workload.key, target.key, template.name,
                                             template.version, opts.threads).items() if h not in known]
        if rows:
            known.update(r.config_hash for r in rows)
            results = [MeasureResult(Status(r.status), samples=list(r.samples)) for r in rows]
            strategy.tell([Config.from_json(r.config) for r in rows], results)
            best_time = min([r.median for r in results if r.ok] + ([best_time] if best_time else []),
                            default=None)
        return len(rows)

    resumed = sync()
    seed_configs = template.seed_configs(workload, opts.threads) if opts.seed_default else []
    log = RunLog(opts.log_path)
    summary = TuneSummary(run_id=run_id, workload_key=workload.key, target_key=target.key,
                          threads=opts.threads, measured=0, resumed=resumed)
    since_best = 0
    progress = _Progress(opts.trials, min(resumed, opts.trials), opts.progress,
                         f"tune {workload.kind} {getattr(workload, 'shape_str', '')}".strip())
    own = measurer is None
    measurer = measurer or Measurer(mopts)
    wall0 = dict(measurer.wall)
    counts0 = dict(measurer.counts)
    claims = Claims(store, run_id, workload, target, template.name, template.version,
                    opts.threads, ttl=opts.claim_ttl)
    try:
        with claims:
            idle = 0
            while True:
                by_others = sync()
                if by_others:
                    progress.update(by_others, sum(v for k, v in summary.statuses.items() if k != "OK"),
                                    flops / best_time / 1e9 if best_time else None)
                remaining = opts.trials - len(known)
                if remaining <= 0:
                    summary.stop_reason = "budget"
                    break
                if opts.timeout is not None and time.perf_counter() - t_start > opts.timeout:
                    summary.stop_reason = "timeout"
                    break
                if opts.early_stopping and since_best >= opts.early_stopping:
                    summary.stop_reason = "early stopping"
                    break
                n = min(opts.batch_size, remaining)
                # The template's default config (the fallback users get) is measured first:
                # the search then starts from a known-good point instead of a random one.
                seeds = [c for c in seed_configs if c.hash not in known and c not in strategy.seen][:n]
                strategy.seen.update(seeds)
                proposed = seeds + strategy.ask(n - len(seeds))
                seed_configs = []
                if not proposed:
                    summary.stop_reason = "space exhausted"
                    break
                configs = claims.claim(proposed)  # others may be measuring some of them
                if not configs:
                    idle += 1
                    if idle > 50:
                        summary.stop_reason = "everything left is claimed by other tuners"
                        break
                    continue
                idle = 0
                cutoff = best_time * opts.cutoff_factor if best_time and opts.cutoff_factor else None
                pcut = (best_time * opts.placement_cut_factor
                        if best_time and opts.placement_cut_factor else None)
                results = measurer.measure(workload, template, configs, cutoff_s=cutoff,
                                           cutoff_factor=opts.cutoff_factor,
                                           placement_cut_s=pcut,
                                           placement_cut_factor=opts.placement_cut_factor,
                                           race_cut_s=best_time if opts.race_placements else None,
                                           race=opts.race_placements)
                ids = store.add_trials(run_id, workload, target, [
                    TrialRecord(template.name, template.version, c, opts.threads, r, strategy.name)
                    for c, r in zip(configs, results)])
                log.write(store, ids)
                known.update(c.hash for c in configs)
                strategy.tell(configs, results)
                summary.measured += len(configs)
                for r in results:
                    summary.statuses[r.status.value] += 1
                    if r.ok and (best_time is None or r.median < best_time):
                        best_time, since_best = r.median, 0
                    else:
                        since_best += 1
                failures = sum(v for k, v in summary.statuses.items() if k != "OK")
                progress.update(len(configs), failures, flops / best_time / 1e9 if best_time else None)
        progress.close()

        summary.phase_time = {k: measurer.wall[k] - wall0[k] for k in wall0}
        settle_best(store, measurer, workload, template, target, opts, run_id)
        summary.baseline = measurer.baseline(workload, opts.threads)
    finally:
        progress.close()
        if own:
            measurer.close()
    summary.best = store.best(workload.key, target.key, opts.threads, template.name, template.version)
    summary.wall_time = time.perf_counter() - t_start
    summary.compiled = measurer.counts["compiled"] - counts0["compiled"]
    summary.runs = measurer.counts["measured"] - counts0["measured"]
    if summary.phase_time:
        summary.phase_time["final remeasure"] = (sum(measurer.wall.values()) - sum(wall0.values())
                                                 - sum(summary.phase_time.values()))
    base = summary.baseline
    store.finish_run(
        run_id,
        baseline={"impl": workload.baseline_name, **summarize(base.samples), "samples": base.samples,
                  "info": base.info} if base is not None else {},
        summary={"measured": summary.measured, "resumed": summary.resumed,
                 "statuses": dict(summary.statuses), "stop_reason": summary.stop_reason,
                 "wall_time": summary.wall_time, "phase_time": summary.phase_time,
                 "kernels_compiled": summary.compiled, "configs_run": summary.runs,
                 "ratio_vs_numpy": summary.ratio, "busy_at_start": busy,
                 "best_median": summary.best.median if summary.best else None})
    return summary


def max_variants(opts: TuneOptions) -> int | None:
    """Distinct variants (compiled kernels) a model search may propose in a run of
    ``opts.trials`` trials, the default's included: one per ``trials_per_variant`` trials
    (at least two)."""
    if opts.trials_per_variant is None:
        return None
    return max(2, -(-opts.trials // opts.trials_per_variant))


def _remeasure_top(store: Store, measurer: Measurer, workload, template, target,
                   opts: TuneOptions, run_id: str, max_rounds: int = 3) -> None:
    """Measure the top configs again until the leader has been measured at least twice.

    ``Store.best`` scores a config by its slowest median, so a lucky sample loses once it is
    re-measured; repeating rounds keeps a once-measured config from inheriting the lead. The
    re-measurements run in the worker ``settle_best`` starts afresh. A config the
    search timed on some placements only (``placements_cut``) counts as not measured again
    yet, and a leader so timed after the rounds is measured again (at most ``max_rounds``
    times more): the best is one measured on every placement.
    """
    if opts.remeasure_top <= 0:
        return

    def ranked_now():
        return rank_configs(store.trials(
            workload_key=workload.key, target_key=target.key, template=template.name,
            template_version=template.version, threads=opts.threads))

    def measure(configs) -> None:
        results = measurer.measure(workload, template, configs)
        store.add_trials(run_id, workload, target, [
            TrialRecord(template.name, template.version, c, opts.threads, r, "remeasure")
            for c, r in zip(configs, results)])

    for _ in range(max_rounds):
        top = [Config.from_json(rs[0].config) for _, rs in ranked_now()[:opts.remeasure_top]
               if len(rs) < 2 or placements_cut(rs)]
        if not top:
            return
        measure(top)
    for _ in range(max_rounds):
        leader = ranked_now()[:1]
        if not leader or not placements_cut(leader[0][1]):
            return
        measure([Config.from_json(leader[0][1][0].config)])


def settle_best(store: Store, measurer: Measurer, workload, template, target,
                opts: TuneOptions, run_id: str, max_rounds: int = 3) -> None:
    """The end of a run: re-measure the leaders (``_remeasure_top``), then check the best
    against the template's default (``guard_against_default``). The check's own rows can
    change the ranking (a best timed slower in it loses its lead, possibly to a config the
    search measured once): the new leader is measured again and, unless the check covers it
    (it outranks a config that beat the default, or ties one that did not), checked in
    turn, until the check measures nothing. The best a run ends with has been measured at
    least twice, on every placement, and carries its check or one that covers it. At most
    ``max_rounds`` times; every round measures only configs that lack that."""
    if opts.remeasure_top <= 0:
        return
    measurer.fresh_runner()   # the leaders again, in a process that has not run the others
    for _ in range(max_rounds):
        _remeasure_top(store, measurer, workload, template, target, opts, run_id)
        if opts.guard_rounds <= 0:
            return
        # A leader the check's rows make (the checked best's slowest median rose) and that
        # the check covers (``Store.best_many``'s ``_covering_guard``: it outranks a config
        # that beat the default, or ties one that did not) is measured again by the next
        # round's ``_remeasure_top`` but not checked itself: checking each new leader among
        # near-equal configs in turn took 23 re-measurements (~20 s) of a 1024^3 run on the
        # Xeon compiling for znver3, 2026-12-03. An accepted check timed cold (guard_cold)
        # covers no other leader: that one is checked, hot and cold, in turn.
        if guard_against_default(store, measurer, workload, template, target, opts, run_id) is None:
            return


def _side_by_side(measurer: Measurer, workload, template, default: Config, best: Config,
                  rounds: int) -> tuple[dict, list] | None:
    """``rounds`` alternating measurements of ``default`` and ``best``: (per-round medians by
    config hash, [(config, result)]), or None if either fails (a failure is recorded by the
    loop's own rules, not here)."""
    per: dict = {default.hash: [], best.hash: []}
    records = []
    for _ in range(rounds):
        for c, r in zip((default, best), measurer.measure(workload, template, [default, best])):
            if not r.ok:
                return None
            per[c.hash].append(r.median)
            records.append((c, r))
    return per, records


def _margin(per: dict, default: Config, best: Config) -> tuple[float, float]:
    """(default time / best time, noise) from each config's per-round medians."""
    # Timing noise on a shared machine only ever adds time, so each config's figure is its
    # fastest round, and the noise is the larger round-to-round spread. (The median of two
    # rounds is the slower one: one round of the default slowed by interference, 21.7 against
    # 12.6 ms at 1024^3 on a 2-core VM, made a 1.05x best look 1.52x and "accepted".)
    low = {h: min(v) for h, v in per.items()}
    noise = max((max(v) - min(v)) / low[h] for h, v in per.items())
    return low[default.hash] / low[best.hash], noise


def _cold_margin(measurer: Measurer, workload, template, default: Config, best: Config,
                 rounds: int) -> float | None:
    """Default time / best time with every operand but the first evicted before each call
    (``MeasureOptions.cache_flush``), side by side; None if either fails. Not recorded as
    trials: their times are not comparable with the run's (``mode_conflict``).

    Why (AMD Zen 4, Inception v2, ``tune model --trials 400``, 2026-12-07): a config reading
    the weights in place (``pack_b=False``, loop order kmn) of the M196 N160 K1152 conv beat
    the default 1.02x back to back, where the weights stay in the caches, and was applied;
    in the model it ran 0.89x (0.749 vs 0.666 ms), as it does timed cold (``bench tiles
    --cache-flush``: 0.89x)."""
    opts = measurer.opts
    was, opts.cache_flush = opts.cache_flush, True
    try:
        measured = _side_by_side(measurer, workload, template, default, best, rounds)
    finally:
        opts.cache_flush = was
    return None if measured is None else _margin(measured[0], default, best)[0]


def guard_against_default(store: Store, measurer: Measurer, workload, template, target,
                          opts: TuneOptions, run_id: str) -> dict | None:
    """Measure the template's default config and the best config side by side (alternating,
    ``opts.guard_rounds`` rounds, in the fresh re-measurement worker) and record both, each
    row carrying ``info["guard"]``: the margin (default median / best median, each config's
    fastest round) and the noise (the larger round-to-round spread of the two). Dispatch applies the
    tuned config only where ``accepted`` (margin > 1 + noise): a winner by selection noise among
    near-equal configs does not replace a good default. Nothing is measured when the best is
    the default, the default never ran correctly, or the best already carries a guard. The bar
    is at least ``opts.guard_min_margin`` (2%): per-task "gains" of 1-4% were measured to be
    selection noise among near-equal configs (ResNet-50, 2026-11-29). With ``opts.guard_cold``
    a winner is also timed with its operands evicted and kept only if faster there too
    (``cold_margin`` > 1, ``_cold_margin``)."""
    rows = store.trials(workload_key=workload.key, target_key=target.key, template=template.name,
                        template_version=template.version, threads=opts.threads)
    ranked = rank_configs(rows)
    if not ranked:
        return None
    best = Config.from_json(ranked[0][1][0].config)
    try:
        default = template.default_config(workload, opts.threads)
    except Exception:  # noqa: BLE001 - a template without a usable default: nothing to guard
        return None
    ok = {rs[0].config_hash for _, rs in ranked}
    if best == default or default.hash not in ok:
        return None
    if leader_guard(ranked):   # its own check, or one that covers it
        return None
    measured = _side_by_side(measurer, workload, template, default, best, opts.guard_rounds)
    if measured is None:
        return None
    per, records = measured
    margin, noise = _margin(per, default, best)
    guard = {"default": default.hash, "best": best.hash, "margin": round(margin, 4),
             "noise": round(noise, 4), "min_margin": opts.guard_min_margin,
             "accepted": margin > 1 + max(noise, opts.guard_min_margin),
             "rounds": opts.guard_rounds}
    if guard["accepted"] and opts.guard_cold and not measurer.opts.cache_flush:
        cold = _cold_margin(measurer, workload, template, default, best, opts.guard_rounds)
        if cold is not None:
            guard["cold_margin"] = round(cold, 4)
            guard["accepted"] = cold > 1.0
    for _, r in records:
        r.info = {**(r.info or {}), "guard": guard}
    store.add_trials(run_id, workload, target, [
        TrialRecord(template.name, template.version, c, opts.threads, r, "guard") for c, r in records])
    return guard
