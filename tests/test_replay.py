"""Replay: tables, the replayed space, every registered strategy on recorded measurements.

Deterministic and fast: nothing is compiled or timed, strategies are seeded, budgets small.
"""
import gzip
import json
import subprocess
import sys

import pytest

from search_spaces.space import Config
from tuner.measure.result import Status
from tuner.replay.runner import auc, curve_of, replay, replay_one, trials_to
from tuner.replay.table import Table, shipped_tables
from tuner.search import STRATEGIES

TABLES = shipped_tables()


@pytest.fixture(scope="module", params=TABLES)
def table(request):
    return Table.load(request.param)


def test_at_least_three_tables_are_shipped():
    assert len(TABLES) >= 3


def test_table_header_and_rows(table):
    h = table.header
    assert h["workload"]["kind"] == h["template"]["name"] in ("gemm", "conv2d")
    assert [k.name for k in table.knobs][:5] == ["tile_m", "tile_n", "tile_k", "mr", "nr"]
    assert h["target"]["key"] and h["date"] and h["recording_seconds"] > 0
    st = table.statuses()
    assert st["OK"] >= 100 and st.get("INVALID", 0) >= 1  # failures are recorded rows too
    assert table.best_time > 0


def test_replay_space_is_exactly_the_recorded_candidates(table):
    import random

    sp = table.space()
    cands = set(table.candidates)
    assert sp.size == len(cands) and set(sp) == cands
    rng = random.Random(0)
    assert all(sp.sample(rng) in cands for _ in range(50))
    some = table.candidates[0]
    assert sp.is_valid(some)
    for nb in sp.neighbours(some):
        assert nb in cands
    invalid = [r.config for r in table.rows if r.status is Status.INVALID][0]
    assert not sp.is_valid(invalid)
    # an unrecorded point of the full product is rejected, and snapped to a recorded one
    knobs = table.knobs
    other = Config({k.name: k.values[-1] for k in knobs})
    if other not in cands:
        assert "unmeasured" in sp.violation(other)
        assert sp.nearest(other) in cands
    assert table.result(other if other not in cands else invalid).status is Status.INVALID


def test_round_trip(tmp_path, table):
    path = tmp_path / "t.jsonl.gz"
    table.save(path)
    again = Table.load(path)
    assert again.header == table.header and again.statuses() == table.statuses()
    assert again.best_time == pytest.approx(table.best_time, rel=1e-5)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_registered_strategy_replays_deterministically(strategy):
    t = Table.load(TABLES[0])
    cands = set(t.candidates)
    seen_runs = []
    for _ in range(2):
        strat_runs = []
        for seed in (0, 1):
            r = replay_one(t, strategy, seed, budget=40, options={"n_estimators": 40}
                           if strategy == "model" else None)
            strat_runs.append(r.times)
        seen_runs.append(strat_runs)
    assert seen_runs[0] == seen_runs[1]  # same seeds, same trials: no timing, no luck
    assert all(len(ts) <= 40 for ts in seen_runs[0])


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_strategies_propose_only_recorded_configs_once(strategy):
    from tuner.search import make_strategy

    t = Table.load(TABLES[-1])
    sp = t.space()
    s = make_strategy(strategy, sp, seed=3, **({"n_estimators": 40} if strategy == "model" else {}))
    proposed = []
    while len(proposed) < 48:
        cfgs = s.ask(8)
        assert cfgs
        proposed += cfgs
        s.tell(cfgs, [t.result(c) for c in cfgs])
    assert len(proposed) == len(set(proposed))
    assert all(c in set(t.candidates) for c in proposed)


def test_exhaustive_replay_finds_the_best_and_metrics_agree():
    t = Table.load(TABLES[0])
    r = replay_one(t, "grid", 0)
    assert r.curve[-1] == 1.0 and len(r.times) <= t.space().size
    best = t.best_time
    assert t.best_time in r.times
    assert trials_to(r.curve, 0.99) <= len(r.times)
    assert curve_of([None, 2.0, 1.0], 1.0) == [0.0, 0.5, 1.0]
    assert trials_to([0.0, 0.5, 1.0], 0.9) == 3 and trials_to([0.1], 0.9) is None
    assert auc([0.0, 0.5, 1.0], 4) == pytest.approx(2.5 / 4)
    assert best > 0


CI_SEEDS, CI_BUDGET = 6, 100   # what the default run replays (docs/search-quality.md, "In CI")


def _inf(x):
    return float("inf") if x is None else x


def test_search_quality_claims_on_every_shipped_table_at_ci_seeds():
    """docs/search-quality.md's claims at reduced seeds, replayed on every shipped table (the
    20-seed claims are the slow test below). Replays are deterministic for a seed."""
    tables = [Table.load(n) for n in TABLES]
    model_beats_random, model_auc_higher, gemm = 0, 0, 0
    for t in tables:
        family = [x for x in tables if x.header["template"]["name"] == t.header["template"]["name"]]
        res = replay(t, ["random", "model", "model+transfer"], seeds=CI_SEEDS, budget=CI_BUDGET,
                     transfer_from=family)
        r, m, mt = (_inf(res[k].median_trials(0.95)) for k in ("random", "model", "model+transfer"))
        model_auc_higher += res["model"].auc > res["random"].auc
        if len(family) > 1:                       # transfer needs another table of its template
            gemm += 1
            model_beats_random += m < r
            assert mt < r and mt <= m, (t.name, r, m, mt)
    assert gemm == 4 and model_beats_random >= 3
    assert model_auc_higher >= len(tables) - 1


@pytest.mark.slow
def test_issue_goals_on_every_shipped_table():
    """Median over 20 seeds (as in the README): model reaches 95% in at most half random's
    trials and fewer than TPE on at least three tables; with transfer, fewer again on each.
    (With 10 seeds random's median on these needle-in-a-haystack tables is lower, and only
    two tables meet both conditions.)"""
    tables = [Table.load(n) for n in TABLES]
    met = []
    for t in tables:
        res = replay(t, ["random", "tpe", "model", "model+transfer"], seeds=20, transfer_from=tables)
        m, r, p = (res[k].median_trials(0.95) for k in ("model", "random", "tpe"))
        if m <= r / 2 and m < p:
            met.append(t.name)
        assert res["model+transfer"].median_trials(0.95) <= m, t.name
    assert len(met) >= 3, met  # the issue's goal: on at least three recorded spaces


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tuner", "replay", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_json_is_medians_per_strategy():
    p = run_cli(TABLES[0], "--strategy", "random,grid", "--seeds", "3", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) == {"random", "grid"}
    for d in out.values():
        assert set(d) == {"trials_to_90", "trials_to_95", "trials_to_99", "auc"}
        assert d["trials_to_90"] <= d["trials_to_95"] <= d["trials_to_99"]
        assert 0 < d["auc"] <= 1


def test_cli_text_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "curves.png"
    p = run_cli(TABLES[0], "--strategy", "random", "--seeds", "2", "--plot", str(png))
    assert p.returncode == 0, p.stderr
    assert "random" in p.stdout and "to 95%" in p.stdout
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("args, message", [
    (["no-such-table"], "no replay table"),
    ([TABLES[0] if TABLES else "x", "--strategy", "annealing"], "unknown strategy"),
    ([TABLES[0] if TABLES else "x", "--seeds", "0"], "--seeds must be at least 1"),
])
def test_cli_bad_input_is_one_line(args, message):
    p = run_cli(*args)
    assert p.returncode == 2 and message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_cli_corrupt_table_and_missing_matplotlib(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write('{"format": "something-else"}\n')
    p = run_cli(str(bad))
    assert p.returncode == 2 and "malformed" in p.stderr
    # --plot without matplotlib: one line, exit 2 (matplotlib hidden by a shadowing module)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "matplotlib.py").write_text("raise ImportError('hidden for the test')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(shadow)}
    p = subprocess.run([sys.executable, "-m", "tuner", "replay", TABLES[0], "--plot", "x.png"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "needs matplotlib" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
