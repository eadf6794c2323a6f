"""The tuner loop on small spaces: all strategies, resume, failures survived, re-measurement."""
import pytest
from fault_templates import NaiveGemm

from search_spaces.space import Config, ConfigSpace, Knob
from tuner.target import host_target
from tuner.tuning import TuneOptions, tune
from workloads.gemm import Gemm


@pytest.mark.parametrize("strategy", ["random", "grid", "tpe", "model"])
def test_each_strategy_tunes_and_records(strategy, templates, store, measurer):
    w = Gemm.parse("32x24x16")
    s = tune(w, templates["naive"], store, host_target(),
             TuneOptions(strategy=strategy, trials=3, threads=1, batch_size=2, progress=False),
             measurer=measurer)
    assert s.measured == 3 and s.statuses["OK"] == 3
    assert s.best is not None and s.best.median > 0
    assert s.baseline.ok and s.ratio > 0
    # every trial was written, plus the re-measurements of the top configs
    rows = store.trials(workload_key=w.key)
    assert len([r for r in rows if r.strategy == strategy]) == 3
    assert len([r for r in rows if r.strategy == "remeasure"]) == 3


def test_failures_do_not_stop_tuning_and_never_win(templates, store, measurer):
    w = Gemm.parse("16x16x16")
    s = tune(w, templates["fault"], store, host_target(),
             TuneOptions(strategy="grid", trials=20, threads=1, progress=False), measurer=measurer)
    # 10 knob values; one is rejected by a constraint and never proposed
    assert s.stop_reason == "space exhausted"
    assert s.statuses["OK"] == 1
    assert s.statuses == {"OK": 1, "COMPILE_ERROR": 2, "RUNTIME_ERROR": 1, "CRASH": 2,
                          "TIMEOUT": 1, "WRONG_ANSWER": 2}
    assert s.best.config["fault"] == "none"


def test_resume_measures_nothing_twice(templates, store, measurer):
    w = Gemm.parse("40x8x8")
    opts = TuneOptions(strategy="random", trials=3, threads=1, progress=False, remeasure_top=0)
    first = tune(w, templates["naive"], store, host_target(), opts, measurer=measurer)
    assert first.measured == 3
    again = tune(w, templates["naive"], store, host_target(), opts, measurer=measurer)
    assert again.resumed == 3 and again.measured == 0 and again.stop_reason == "budget"
    opts.trials = 4  # the whole space: exactly the one unmeasured config is measured
    more = tune(w, templates["naive"], store, host_target(), opts, measurer=measurer)
    assert more.resumed == 3 and more.measured == 1
    hashes = [r.config_hash for r in store.trials(workload_key=w.key)]
    assert len(hashes) == len(set(hashes)) == 4


def test_timeout_and_early_stopping(templates, store, measurer):
    w = Gemm.parse("8x40x8")
    s = tune(w, templates["naive"], store, host_target(),
             TuneOptions(strategy="grid", trials=4, timeout=1e-9, progress=False), measurer=measurer)
    assert s.stop_reason == "timeout" and s.measured == 0 and s.best is None


class SleepyGemm(NaiveGemm):
    """The naive kernel plus a sleep of ``delay`` ms: grid order is fastest first, so after the
    first trial no candidate can be a new best."""

    name = "sleepy_gemm"

    def space(self, workload, max_threads=1):
        return ConfigSpace([Knob("delay", (0, 2, 4, 6, 8, 10, 12, 14), ordinal=True)])

    def default_config(self, workload, max_threads=1):
        return Config({"delay": 0})

    def codegen(self, workload, config):
        src = super().codegen(workload, Config({"unroll": 1})).replace("def kernel(", "def _kernel(")
        return ("import time\n" + src + f"\n\ndef kernel(A, B, C):\n    time.sleep({config['delay'] / 1000})"
                "\n    _kernel(A, B, C)\n")


def test_early_stopping_stops_after_n_trials_without_a_new_best(store, measurer):
    w = Gemm.parse("8x8x8")
    s = tune(w, SleepyGemm(), store, host_target(),
             TuneOptions(strategy="grid", trials=8, early_stopping=3, batch_size=1, progress=False,
                         remeasure_top=0), measurer=measurer)
    assert s.stop_reason == "early stopping"
    assert s.measured == 4                      # the best (first), then 3 without improvement
    assert s.best.config == Config({"delay": 0})
    # without it the same search runs the whole budget
    s2 = tune(Gemm.parse("8x8x9"), SleepyGemm(), store, host_target(),
              TuneOptions(strategy="grid", trials=6, batch_size=1, progress=False, remeasure_top=0),
              measurer=measurer)
    assert s2.stop_reason == "budget" and s2.measured == 6


def test_a_busy_machine_is_announced_and_recorded(templates, store, measurer, monkeypatch, capsys):
    import os

    from tuner import target as target_mod

    busy = target_mod.busy_cpus(0.05)
    assert busy is None or 0 <= busy <= 1.01 * (os.cpu_count() or 1)
    monkeypatch.setattr(target_mod, "busy_cpus", lambda interval=0.3: 0.2)
    assert target_mod.busy_note(1) is None
    monkeypatch.setattr(target_mod, "busy_cpus", lambda interval=0.3: 9.0)
    note = target_mod.busy_note(1)
    assert "9.0 CPUs busy" in note and "bench compare" in note
    w = Gemm.parse("16x8x8")
    tune(w, templates["naive"], store, host_target(),
         TuneOptions(strategy="random", trials=1, threads=1, progress=False), measurer=measurer)
    assert capsys.readouterr().err.count("the machine is busy") == 1
    (run,) = [r for r in store.runs() if r.summary.get("measured") == 1]
    assert run.summary["busy_at_start"] == note


def test_final_remeasurement_runs_in_a_fresh_worker(templates, store, measurer):
    w = Gemm.parse("24x8x8")
    assert measurer.baseline(w).ok
    before = measurer._runner._proc.pid
    s = tune(w, templates["naive"], store, host_target(),
             TuneOptions(strategy="random", trials=2, threads=1, progress=False, remeasure_top=2),
             measurer=measurer)
    assert s.best is not None
    assert measurer._runner._proc.pid != before   # the re-measurements started a new process
    assert len([r for r in store.trials(workload_key=w.key) if r.strategy == "remeasure"]) == 2


class SlowDefaultGemm(SleepyGemm):
    """Its default config sleeps 20 ms per call; the other config does not."""

    name = "slow_default_gemm"

    def space(self, workload, max_threads=1):
        return ConfigSpace([Knob("delay", (20, 0), ordinal=True)])

    def default_config(self, workload, max_threads=1):
        return Config({"delay": 20})


def test_a_real_winner_replaces_the_default_after_the_side_by_side_check(store, measurer):
    from tuner.dispatch import select_config

    w = Gemm.parse("8x8x10")
    t = SlowDefaultGemm()
    s = tune(w, t, store, host_target(),
             TuneOptions(strategy="grid", trials=2, batch_size=2, progress=False), measurer=measurer)
    assert s.best.config == Config({"delay": 0})
    g = s.best.guard
    assert g and g["accepted"] and g["margin"] > 10 and g["best"] == s.best.config.hash
    guard_rows = [r for r in store.trials(workload_key=w.key) if r.strategy == "guard"]
    assert len(guard_rows) == 4          # both configs, two rounds, recorded
    sel = select_config(w, t, store, threads=1)
    assert sel.source == "tuned" and sel.config == Config({"delay": 0})


class _Fixed:
    """A measurer whose timings are given: the guard's decision without timing noise."""

    def __init__(self, medians):
        self.medians = medians            # config -> list of per-round medians

    def _key(self, c):
        return c

    def measure(self, workload, template, configs, cutoff_s=None):
        from tuner.measure.result import MeasureResult, Status

        return [MeasureResult(Status.OK, [self.medians[self._key(c)].pop(0)] * 3) for c in configs]


class _Modes:
    """A given-timings measurer with a measurement mode: timings by (config, cache_flush)."""

    def __init__(self, medians):
        super().__init__(medians)
        from tuner.measure.measurer import MeasureOptions
        self.opts = MeasureOptions()

    def _key(self, c):
        return (c, self.opts.cache_flush)


@pytest.mark.parametrize("default_times, best_times, accepted", [
    ([1.00e-3, 1.03e-3], [0.99e-3, 1.01e-3], False),   # a 1% "gain" inside 3% noise
    ([1.00e-3, 1.00e-3], [0.99e-3, 0.99e-3], False),   # 1%, no noise: below the 2% floor
    ([2.00e-3, 2.02e-3], [1.00e-3, 1.01e-3], True),    # 2x, 1% noise
    ([2.10e-3, 1.00e-3], [1.00e-3, 1.00e-3], False),   # one default round slowed by interference
])
def test_the_guard_refuses_a_noise_winner_and_accepts_a_real_one(store, default_times, best_times,
                                                                  accepted):
    from tuner.dispatch import select_config
    from tuner.db.store import TrialRecord
    from tuner.measure.result import MeasureResult, Status
    from tuner.tuning import guard_against_default

    w, t, target = Gemm.parse("8x8x11"), SleepyGemm(), host_target()
    default, other = t.default_config(w, 1), Config({"delay": 2})
    run = store.start_run(target, "test", "grid", 1)
    store.add_trials(run, w, target, [   # the search's own figures: "other" looked 10% faster
        TrialRecord(t.name, t.version, default, 1, MeasureResult(Status.OK, [1.1e-3] * 3)),
        TrialRecord(t.name, t.version, other, 1, MeasureResult(Status.OK, [1.0e-3] * 3))])
    fake = _Fixed({default: list(default_times), other: list(best_times)})
    g = guard_against_default(store, fake, w, t, target, TuneOptions(progress=False), run)
    assert g["accepted"] is accepted and g["best"] == other.hash
    best = store.best(w.key, target.key, 1, t.name, t.version)
    assert best.config == other and best.guard == g     # still the best, now with its check
    sel = select_config(w, t, store, target, threads=1)
    assert sel.config == (other if accepted else default)
    assert accepted or "default kept" in sel.note
    # the guard ran once: the best carries it, nothing is measured again
    assert guard_against_default(store, fake, w, t, target, TuneOptions(progress=False), run) is None


class _FixedModes(_Modes, _Fixed):
    """``_Fixed`` with a measurement mode: timings by (config, cache_flush)."""


@pytest.mark.parametrize("cold_default, cold_best, accepted", [
    ([1.00e-3, 1.01e-3], [1.12e-3, 1.13e-3], False),   # faster hot, 11% slower with operands evicted
    ([1.50e-3, 1.51e-3], [1.00e-3, 1.01e-3], True),    # faster either way
])
def test_the_cold_guard_keeps_the_default_where_the_winner_loses_with_cold_operands(
        store, cold_default, cold_best, accepted):
    """``guard_cold`` (``tune model``): a config that beat the default back to back is timed
    again beside it with its operands evicted (as a model meets its weights) and applied
    only if faster there too; the cold times are not recorded as trials (another mode)."""
    from tuner.dispatch import select_config
    from tuner.db.store import TrialRecord
    from tuner.measure.result import MeasureResult, Status
    from tuner.tuning import guard_against_default

    w, t, target = Gemm.parse("8x8x13"), SleepyGemm(), host_target()
    default, other = t.default_config(w, 1), Config({"delay": 2})
    run = store.start_run(target, "test", "grid", 1)
    store.add_trials(run, w, target, [
        TrialRecord(t.name, t.version, default, 1, MeasureResult(Status.OK, [2.0e-3] * 3)),
        TrialRecord(t.name, t.version, other, 1, MeasureResult(Status.OK, [1.0e-3] * 3))])
    fake = _FixedModes({(default, False): [2.0e-3, 2.01e-3], (other, False): [1.0e-3, 1.0e-3],
                        (default, True): list(cold_default), (other, True): list(cold_best)})
    g = guard_against_default(store, fake, w, t, target,
                              TuneOptions(progress=False, guard_cold=True), run)
    assert g["margin"] == pytest.approx(2.0) and g["accepted"] is accepted
    assert g["cold_margin"] == pytest.approx(min(cold_default) / min(cold_best), rel=1e-3)
    assert fake.opts.cache_flush is False                        # the mode is restored
    assert all(not v for v in fake.medians.values())             # hot and cold rounds both ran
    assert len([r for r in store.trials(workload_key=w.key) if r.strategy == "guard"]) == 4
    sel = select_config(w, t, store, target, threads=1)
    assert sel.config == (other if accepted else default)
    assert accepted or "operands evicted" in sel.note
    # without guard_cold (tune gemm) a hot winner is applied as before
    w2 = Gemm.parse("8x8x14")
    store.add_trials(run, w2, target, [
        TrialRecord(t.name, t.version, default, 1, MeasureResult(Status.OK, [2.0e-3] * 3)),
        TrialRecord(t.name, t.version, other, 1, MeasureResult(Status.OK, [1.0e-3] * 3))])
    hot = _FixedModes({(default, False): [2.0e-3, 2.0e-3], (other, False): [1.0e-3, 1.0e-3]})
    g2 = guard_against_default(store, hot, w2, t, target, TuneOptions(progress=False), run)
    assert g2["accepted"] and "cold_margin" not in g2


def test_a_run_builds_each_module_once_and_reports_it(store, measurer):
    """Re-measurement and the default check run configs whose modules the search built: the
    summary counts modules compiled and configs run, and a module is built once per run."""
    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("24x40x32")
    s = tune(w, t, store, host_target(),
             TuneOptions(strategy="random", trials=4, batch_size=4, threads=1, progress=False,
                         remeasure_top=2, seed=5), measurer=measurer)
    assert s.statuses["OK"] == 4
    rows = store.trials(workload_key=w.key)
    assert s.runs == len(rows) > 4            # the search's 4, then re-measurements / guard
    sources = {r.info["source"] for r in rows}
    assert s.compiled == len(sources) <= 4    # one build per distinct kernel file
    with pytest.raises(Exception, match="max-new-variants"):
        TuneOptions(max_new_variants=0)
    with pytest.raises(Exception, match="trials-per-variant"):
        TuneOptions(trials_per_variant=-8)       # the CLI's --trials-per-variant -8


def test_a_leader_timed_on_one_placement_is_measured_again(store):
    """The search times a candidate far enough behind the best on one placement only
    (``placements_cut``); should such a config lead when the search ends (here: twice, the
    others measured slower meanwhile), it is not the best (its score is a lower bound), and
    the final re-measurement times it on every placement."""
    from tuner.db.store import TrialRecord
    from tuner.measure.result import MeasureResult, Status
    from tuner.tuning import _remeasure_top

    class Recorder:
        def __init__(self):
            self.measured = []

        def fresh_runner(self):
            pass

        def measure(self, workload, template, configs, cutoff_s=None):
            self.measured += configs
            return [MeasureResult(Status.OK, [1.2e-3] * 3) for _ in configs]

    w, t, target = Gemm.parse("8x8x12"), SleepyGemm(), host_target()
    cut, full = Config({"delay": 2}), Config({"delay": 0})
    one = MeasureResult(Status.OK, [0.9e-3] * 3, info={"placements_cut": 3})
    run = store.start_run(target, "test", "grid", 1)
    store.add_trials(run, w, target, [
        TrialRecord(t.name, t.version, c, 1, r) for c, r in
        [(cut, one), (cut, one), (full, MeasureResult(Status.OK, [1e-3] * 3)),
         (full, MeasureResult(Status.OK, [1e-3] * 3))]])
    assert store.best(w.key, target.key, 1, t.name, t.version).config == full   # never a partial one
    rec = Recorder()
    _remeasure_top(store, rec, w, t, target, TuneOptions(progress=False, remeasure_top=1), run)
    assert rec.measured == [cut]
    assert store.best(w.key, target.key, 1, t.name, t.version).config == full


class GivenMedians:
    """A measurer giving per-config medians, in call order; the last one repeats."""

    def __init__(self, medians):
        self.medians, self.measured = medians, []

    def fresh_runner(self):
        pass

    def _key(self, c):
        return c

    def measure(self, workload, template, configs, cutoff_s=None):
        from tuner.measure.result import MeasureResult, Status

        self.measured += [self._key(c) for c in configs]
        out = []
        for c in configs:
            m = self.medians[self._key(c)]
            out.append(MeasureResult(Status.OK, [m.pop(0) if len(m) > 1 else m[0]] * 3))
        return out


def _three_configs(store, third_ms: float, default_ms: float = 1.0, best_ms: float = 0.9):
    """A workload with records for the default (``default_ms`` twice), a best (``best_ms``
    twice) and a third config measured once at ``third_ms``: (workload, template, target,
    default, best, third, run id)."""
    from tuner.db.store import TrialRecord
    from tuner.measure.result import MeasureResult, Status

    w, t, target = Gemm.parse("8x8x13"), SleepyGemm(), host_target()
    default, best, third = t.default_config(w, 1), Config({"delay": 2}), Config({"delay": 4})
    ok = lambda s: MeasureResult(Status.OK, [s] * 3)   # noqa: E731
    run = store.start_run(target, "test", "grid", 1)
    store.add_trials(run, w, target, [TrialRecord(t.name, t.version, c, 1, r) for c, r in [
        (default, ok(default_ms * 1e-3)), (default, ok(default_ms * 1e-3)),
        (best, ok(best_ms * 1e-3)), (best, ok(best_ms * 1e-3)), (third, ok(third_ms * 1e-3))]])
    return w, t, target, default, best, third, run


def test_a_run_never_ends_on_a_leader_measured_once(store):
    """The default check's rows can cost the best its lead (its slowest median rises), and
    the new leader may be a config the search measured once: ``settle_best`` measures that
    one again. The check was accepted and the new leader outranks the checked config, so
    that check covers it (no check of its own, which would rotate among near-equal
    configs); dispatch applies it."""
    from tuner.tuning import settle_best

    # third: measured once, behind the best
    w, t, target, default, best, third, run = _three_configs(store, 1.1, default_ms=2.0, best_ms=1.0)
    # the check times the best at 1.3 ms (slower than third's single 1.1 ms), third holds 1.1
    given = GivenMedians({default: [2.0e-3], best: [1.3e-3], third: [1.1e-3]})
    settle_best(store, given, w, t, target, TuneOptions(progress=False, remeasure_top=1), run)
    lead = store.best(w.key, target.key, 1, t.name, t.version)
    assert lead.config == third
    rows = [r for r in store.trials(workload_key=w.key) if r.config_hash == third.hash]
    assert len(rows) >= 2                        # measured again before it could lead
    assert not any((r.info or {}).get("guard") for r in rows)          # not checked itself
    assert lead.guard and lead.guard["best"] == best.hash and lead.guard["accepted"]
    from tuner.dispatch import select_config

    sel = select_config(w, t, store, target, threads=1, quiet=True)
    assert sel.config == third and sel.source == "tuned"


class GivenModes(_Modes, GivenMedians):
    """``GivenMedians`` with a measurement mode: medians (and ``measured``) by (config,
    cache_flush)."""


@pytest.mark.parametrize("third_cold, applied", [(1.5e-3, False), (0.6e-3, True)])
def test_a_check_timed_cold_covers_no_other_leader(store, third_cold, applied):
    """With ``guard_cold`` (``tune model``) an accepted check covers only the config it timed
    cold: the leader its rows make (third, faster hot) gets a check of its own, hot and cold,
    and is applied only if faster with its operands evicted too."""
    from tuner.dispatch import select_config
    from tuner.tuning import settle_best

    w, t, target, default, best, third, run = _three_configs(store, 1.1, default_ms=2.0, best_ms=1.0)
    given = GivenModes({(default, False): [2.0e-3], (best, False): [1.3e-3],
                        (third, False): [1.1e-3], (default, True): [1.0e-3],
                        (best, True): [0.9e-3], (third, True): [third_cold]})
    settle_best(store, given, w, t, target,
                TuneOptions(progress=False, remeasure_top=1, guard_cold=True), run)
    lead = store.best(w.key, target.key, 1, t.name, t.version)
    assert lead.config == third
    assert (third, True) in given.measured                        # timed cold itself
    assert lead.guard["best"] == third.hash and lead.guard["accepted"] is applied
    assert lead.guard["cold_margin"] == pytest.approx(1.0e-3 / third_cold, rel=1e-3)
    sel = select_config(w, t, store, target, threads=1, quiet=True)
    assert sel.config == (third if applied else default)
    assert applied or "operands evicted" in sel.note


def test_after_a_refused_check_the_new_leader_is_checked_in_turn(store):
    """A check that keeps the default covers nothing: the leader its rows make is measured
    again and checked against the default itself."""
    from tuner.tuning import settle_best

    w, t, target, default, best, third, run = _three_configs(store, 0.95)
    # side by side the best is no faster than the default (refused), and third is faster
    given = GivenMedians({default: [1.0e-3], best: [1.0e-3], third: [0.5e-3]})
    settle_best(store, given, w, t, target, TuneOptions(progress=False, remeasure_top=1), run)
    lead = store.best(w.key, target.key, 1, t.name, t.version)
    assert lead.config == third
    assert lead.guard and lead.guard["best"] == third.hash and lead.guard["accepted"]


class SeededGemm(SleepyGemm):
    """A template that seeds a second known-good config after its default."""

    name = "seeded_gemm"

    def default_config(self, workload, max_threads=1):
        return Config({"delay": 4})

    def seed_configs(self, workload, max_threads=1):
        return [self.default_config(workload, max_threads), Config({"delay": 0})]


def test_a_run_measures_the_templates_seed_configs_first(store, measurer):
    """``Template.seed_configs``: the first batch holds the default, then the template's other
    seeds, before anything the strategy proposes; the run then finds the seeded winner even
    with a budget that would not reach it in grid order."""
    w = Gemm.parse("8x8x12")
    s = tune(w, SeededGemm(), store, host_target(),
             TuneOptions(strategy="random", trials=3, batch_size=3, progress=False,
                         remeasure_top=0, guard_rounds=0), measurer=measurer)
    rows = store.trials(workload_key=w.key)   # in the order recorded
    assert [Config.from_json(r.config) for r in rows[:2]] == [Config({"delay": 4}), Config({"delay": 0})]
    assert s.best.config == Config({"delay": 0})


def test_gemm_seeds_the_isas_other_default():
    """The GEMM template seeds both AVX-512 defaults (A packed, and A in place as on
    ``isa.A_IN_PLACE_CPUS``) where both apply, its own first; AVX2 and small shapes one."""
    from search_spaces import get_template, isa

    t = get_template("gemm")
    w = Gemm.parse("1024x1024x1024")
    with isa.using(isa.AVX512):
        seeds = t.seed_configs(w, 2)
        assert seeds[0] == t.default_config(w, 2) and seeds[0]["pack_a"]
        assert len(seeds) == 2 and not seeds[1]["pack_a"] and seeds[1]["mr"] == 4
        assert all(t.space(w, 2).is_valid(c) for c in seeds)
        assert len(t.seed_configs(Gemm.parse("24x40x16"), 2)) == 1
    with isa.using(isa.AVX2):
        assert len(t.seed_configs(w, 2)) == 1


def test_a_leader_tied_with_a_refused_config_keeps_the_default_unchecked(store):
    """A refused check covers a new leader within its bar of the refused config (a tie
    with a config that did not beat the default): measured again, not checked, and dispatch
    keeps the default for it."""
    from tuner.dispatch import select_config
    from tuner.tuning import settle_best

    w, t, target, default, best, third, run = _three_configs(store, 0.99)
    given = GivenMedians({default: [1.0e-3], best: [1.0e-3], third: [0.99e-3]})
    settle_best(store, given, w, t, target, TuneOptions(progress=False, remeasure_top=1), run)
    lead = store.best(w.key, target.key, 1, t.name, t.version)
    assert lead.config == third and lead.measurements >= 2
    assert given.measured.count(third) == 1                    # measured again, never checked
    assert lead.guard["best"] == best.hash and not lead.guard["accepted"]
    sel = select_config(w, t, store, target, threads=1, quiet=True)
    assert sel.config == default and "default kept" in sel.note


def test_a_leader_no_faster_than_the_default_is_covered_by_a_refused_check(store):
    """After a refused check, a new leader well ahead of the refused config but within the bar
    of the default's own score is no faster than the default beyond the noise: the default is
    kept, and the leader is not checked."""
    from tuner.dispatch import select_config
    from tuner.tuning import settle_best

    w, t, target, default, best, third, run = _three_configs(store, 0.985)
    # side by side the best is slower than the default (refused; its slowest median 1.05),
    # third (0.985) is more than the bar ahead of it, but within it of the default (1.0)
    given = GivenMedians({default: [0.98e-3], best: [1.05e-3], third: [0.985e-3]})
    settle_best(store, given, w, t, target, TuneOptions(progress=False, remeasure_top=1), run)
    lead = store.best(w.key, target.key, 1, t.name, t.version)
    assert lead.config == third and given.measured.count(third) == 1
    assert lead.guard["best"] == best.hash and not lead.guard["accepted"]
    assert select_config(w, t, store, target, threads=1, quiet=True).config == default
