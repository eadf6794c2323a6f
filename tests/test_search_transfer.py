"""Search context: transfer priors from the records, the smarter fallback, TPE's stored study."""
import json

import pytest

from search_spaces.space import Config, ConfigSpace, Knob
from tuner import dispatch
from tuner.db.store import TrialRecord
from tuner.measure.result import MeasureResult, Status
from tuner.search.cost_model import CostModel, Featurizer, Sample, group_targets, prior_from_rows
from tuner.search.model_based import ModelStrategy, _project, strategy_options
from tuner.target import host_target
from workloads.gemm import Gemm


@pytest.fixture(autouse=True)
def _fresh_warnings():
    dispatch._WARNED.clear()


def record(store, w, cfgs_medians, template="naive_gemm", status=Status.OK):
    t = host_target()
    run = store.start_run(t, "test", "random", 1)
    store.add_trials(run, w, t, [
        TrialRecord(template, 1, Config(c), 1,
                    MeasureResult(status, [m] * 3 if status is Status.OK else []))
        for c, m in cfgs_medians])


def test_group_targets_rank_successes_and_penalise_failures():
    y = group_targets([2.0, None, 1.0, 3.0, 1.0])
    assert y[2] == y[4] < y[0] < y[3] <= 1.0 < y[1]
    logy = group_targets([2.0, None, 1.0], kind="log")
    assert list(logy[[2, 0]]) == [0.0, 1.0] and logy[1] > 1.0


def test_prior_comes_from_other_workloads_only(templates, store):
    a, b = Gemm.parse("8x8x8"), Gemm.parse("16x16x16")
    record(store, a, [({"unroll": 1}, 2e-3), ({"unroll": 4}, 1e-3)])
    record(store, b, [({"unroll": 2}, 5e-3)])
    record(store, b, [({"unroll": 8}, None)], status=Status.CRASH)
    rows = store.trials(target_key=host_target().key, template="naive_gemm")
    prior = prior_from_rows(rows, exclude_workload=b.key, template="naive_gemm")
    assert sorted((s.group, s.config["unroll"]) for s in prior) == [(a.key, 1), (a.key, 4)]
    opts = strategy_options("model", b, templates["naive"], store, host_target(), 1)
    assert {s.group for s in opts["prior"]} == {a.key}
    assert "prior" not in strategy_options("model", b, templates["naive"], store, host_target(), 1,
                                           transfer=False)


def test_a_prior_lets_the_model_pick_from_the_first_batch():
    space = ConfigSpace([Knob("x", tuple(range(1, 41)), ordinal=True)])
    # other workloads say: small x is fast
    prior = [Sample({"x": x}, None, f"w{g}", float(x + g)) for g in range(3) for x in range(1, 41)]
    s = ModelStrategy(space, seed=0, prior=prior, epsilon=0.0, min_distance=1)
    first = s.ask(4)
    assert all(c["x"] <= 6 for c in first), first
    blind = ModelStrategy(space, seed=0, epsilon=0.0, min_distance=1).ask(4)
    assert any(c["x"] > 6 for c in blind)  # without a prior the first batch is random


def test_cost_model_learns_a_ranking_across_groups():
    space = ConfigSpace([Knob("x", tuple(range(1, 31)), ordinal=True)])
    prior = [Sample({"x": x}, None, "slow-shape", 10.0 + abs(x - 20)) for x in range(1, 31)]
    m = CostModel(Featurizer(space), prior=prior)
    m.fit([], [])
    preds = m.predict([Config({"x": x}) for x in range(1, 31)])
    assert int(preds.argmin()) + 1 in (19, 20, 21)


def test_projection_moves_tiles_to_the_nearest_value():
    from search_spaces import get_template

    t = get_template("gemm")
    big, small = Gemm.parse("1024x1024x1024"), Gemm.parse("256x256x256")
    cfg = t.default_config(big, 1).replace(tile_n=1024, tile_k=768)
    moved = _project(t.space(small, 1), cfg)
    assert moved is not None and moved["tile_n"] == 256 and moved["tile_k"] == 256
    assert moved["mr"] == cfg["mr"] and moved["loop_order"] == cfg["loop_order"]


def test_fallback_uses_the_most_similar_tuned_workload(templates, store, capsys):
    record(store, Gemm.parse("8x8x8"), [({"unroll": 4}, 1e-3), ({"unroll": 1}, 2e-3)])
    record(store, Gemm.parse("512x512x512"), [({"unroll": 8}, 1e-1)])
    record(store, Gemm.parse("8x8x16", "float64"), [({"unroll": 2}, 1e-3)])
    w = Gemm.parse("8x8x16")
    sel = dispatch.select_config(w, templates["naive"], store, threads=1)
    assert sel.source == "fallback" and sel.config == Config({"unroll": 4})
    err = capsys.readouterr().err
    assert "most similar tuned workload" in err and Gemm.parse("8x8x8").key in err
    assert "python -m tuner tune gemm --shape 8x8x16" in err  # still announced, still loud
    # strict mode still refuses
    from workloads.errors import NoRecordError

    with pytest.raises(NoRecordError):
        dispatch.select_config(w, templates["naive"], store, threads=1, strict=True)


TUNED_1024_2T = {"loop_order": "nmk", "microkernel": "intrinsic", "mr": 8, "nr": 32,
                 "pack_a": False, "pack_b": False, "parallel": "n", "threads": 2, "tile_k": 384,
                 "tile_m": 128, "tile_n": 512, "unroll_k": 1, "vec": 16, "write_cache": True}


@pytest.mark.parametrize("shape, why", [
    ("1x1024x4096", "no similar workload"),         # M differs 1024x: not similar at all
    ("1023x1023x1023", "unpacked operands"),        # similar, but the config is shape-fragile
])
def test_fallback_skips_far_or_fragile_transfers(store, shape, why):
    from search_spaces import get_template
    from tuner.search.model_based import transfer_fallback

    t = get_template("gemm")
    target = host_target()
    run = store.start_run(target, "test", "random", 2)
    store.add_trials(run, Gemm.parse("1024x1024x1024"), target, [
        TrialRecord(t.name, t.version, Config(TUNED_1024_2T), 2,
                    MeasureResult(Status.OK, [1e-2] * 3))])
    w = Gemm.parse(shape)
    assert t.transfer_hazard(Gemm.parse("1024x1024x1024"), Config(TUNED_1024_2T)) is None
    got = transfer_fallback(w, t, store, target, 2)
    if why == "no similar workload":
        assert got is None   # dispatch uses the template default
    else:
        assert t.transfer_hazard(w, Config(TUNED_1024_2T)) is not None
        # the template default (None) or the cost model's pick, never the fragile config
        assert got is None or t.transfer_hazard(w, got[0]) is None, got
    # a packed config of 1024^3 does transfer to 1023^3
    if shape == "1023x1023x1023":
        packed = {**TUNED_1024_2T, "pack_a": True, "pack_b": True}
        assert t.transfer_hazard(w, Config(packed)) is None


def test_tpe_study_lives_in_the_tuner_database_and_resumes(db_url):
    import optuna

    from tuner.search.tpe import TPEStrategy, study_name_for

    space = ConfigSpace([Knob("a", tuple(range(8)), ordinal=True), Knob("b", ("x", "y", "z"))])
    name = study_name_for("gemm:{}", "cpu-1c", "gemm", 2, 1)
    s = TPEStrategy(space, seed=1, storage=db_url, study_name=name, n_startup_trials=4)
    seen = []
    for _ in range(3):
        cfgs = s.ask(4)
        seen += cfgs
        s.tell(cfgs, [MeasureResult(Status.OK, [1e-3 * (1 + c["a"])]) for c in cfgs])
    assert len(seen) == len(set(seen)) == 12  # never a duplicate
    study = optuna.load_study(study_name=name, storage=db_url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len({json.dumps(t.params, sort_keys=True) for t in done}) == 12
    # a new strategy on the same study (a resumed tuning run) does not add them again
    again = TPEStrategy(space, seed=2, storage=db_url, study_name=name)
    again.tell(seen, [MeasureResult(Status.OK, [1e-3 * (1 + c["a"])]) for c in seen])
    assert len([t for t in optuna.load_study(study_name=name, storage=db_url).trials
                if t.state == optuna.trial.TrialState.COMPLETE]) == len(done)
    nxt = again.ask(4)
    assert not set(nxt) & set(seen)


@pytest.mark.parametrize("cap", [1, 3])
def test_model_batches_cap_the_configs_that_need_a_new_kernel(cap):
    """With runtime knobs, at most ``max_new_variants`` picks of a model batch are of a
    variant (config less its cache blocks) not measured yet; the batch is still full: the
    other picks vary the blocks of compiled variants. Without the cap the same model picks
    more new variants (the test would not notice a cap that does nothing)."""
    import random

    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("256x256x256")
    space = t.space(w, 1)
    rng = random.Random(3)
    measured = [space.sample(rng) for _ in range(16)]
    # a smooth fake cost: big micro-tiles and mid-size blocks are fast
    results = [MeasureResult(Status.OK, [1e-3 / (c["mr"] * c["nr"]) * (1 + abs(c["tile_k"] - 128) / 128)] * 3)
               for c in measured]

    def picks(max_new):
        s = ModelStrategy(space, seed=1, epsilon=0.0, warmup=8, runtime_knobs=t.runtime_knobs,
                          max_new_variants=max_new)
        s.tell(measured, results)
        batch = s.ask(8)
        known = {s.variant(c) for c in measured}
        return batch, len({s.variant(c) for c in batch} - known)

    batch, new = picks(cap)
    assert len(batch) == 8 and new <= cap
    _, uncapped = picks(None)
    assert uncapped > cap


def test_the_random_warm_up_batch_shares_the_new_variant_cap():
    """Before the model can rank anything, the random picks of a batch and the seeded
    default need at most ``max_new_variants`` new kernels: the other picks are random cache
    blocks of those variants. Without the cap the same random picks need one kernel almost
    each."""
    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("256x256x256")
    space = t.space(w, 2)
    default = t.default_config(w, 2)

    def first_batch(max_new):
        s = ModelStrategy(space, seed=4, warmup=8, runtime_knobs=t.runtime_knobs,
                          max_new_variants=max_new)
        s.seen.add(default)             # the tuner seeds the default into the first batch
        batch = s.ask(7)
        return batch, {s.variant(c) for c in batch} - {s.variant(default)}

    batch, new = first_batch(2)
    assert len(batch) == 7 and len(set(batch)) == 7 and default not in batch
    assert len(new) == 1 and all(space.is_valid(c) for c in batch)   # the default's and one more
    _, uncapped = first_batch(None)
    assert len(uncapped) > 4


def test_random_picks_past_the_budget_go_to_the_faster_measured_variants():
    """Past the compile budget a random pick is moved onto a known variant: one not measured
    yet or among the faster half of the measured ones, never one seen to be slow."""
    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("256x256x256")
    space = t.space(w, 2)
    default = t.default_config(w, 2)
    slow = default.replace(mr=1, nr=8, microkernel="loops", write_cache=False, unroll_k=1,
                           pack_a=False, pack_b=False)
    s = ModelStrategy(space, seed=2, warmup=100, runtime_knobs=t.runtime_knobs,
                      max_new_variants=2, max_variants=2)     # no new variant allowed
    s.tell([default, slow], [MeasureResult(Status.OK, [1e-3] * 3),
                             MeasureResult(Status.OK, [9e-3] * 3)])
    batch = s.ask(8)
    assert len(batch) == 8 and {s.variant(c) for c in batch} == {s.variant(default)}
