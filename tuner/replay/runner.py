"""Run search strategies against a recorded table: no compiling, no timing, deterministic.

A replay is the tuner loop with the measurer replaced by the table: the strategy asks for a
batch, each config's recorded result (failures included) is told back. The *curve* of a
replay is the best-so-far fraction of the table's best after each trial::

    frac[t] = best_time(table) / best_time(first t+1 trials)   (0 until a success)

``trials_to(curve, x)`` is the first trial count (1-based) with ``frac >= x``, and ``auc`` the
mean of ``frac`` over the first ``auc_trials`` trials (1.0 = the table's best at trial 1). A
replay stops at its budget, when the space is exhausted, or once the table's best is found
(the curve is 1.0 from then on).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Sequence

from tuner.replay.table import Table
from tuner.search import make_strategy

LEVELS = (0.90, 0.95, 0.99)


@dataclass
class ReplayRun:
    strategy: str
    seed: int
    times: list[float | None]           # recorded median per trial (None: failed)
    curve: list[float] = field(default_factory=list)


def curve_of(times: Sequence[float | None], best: float) -> list[float]:
    out, cur = [], None
    for t in times:
        if t is not None and (cur is None or t < cur):
            cur = t
        out.append(best / cur if cur else 0.0)
    return out


def trials_to(curve: Sequence[float], level: float) -> int | None:
    for i, f in enumerate(curve):
        if f >= level - 1e-12:
            return i + 1
    return None


def auc(curve: Sequence[float], n: int) -> float:
    """Mean best-so-far fraction over trials 1..n (the curve is extended with its last value)."""
    if not curve:
        return 0.0
    vals = list(curve[:n]) + [curve[-1]] * max(0, n - len(curve))
    return sum(vals) / n


def replay_one(table: Table, strategy: str, seed: int, budget: int | None = None,
               batch_size: int = 8, options: dict | None = None) -> ReplayRun:
    """One seeded replay of ``strategy`` (a registered name) on ``table``."""
    space = table.space()
    budget = budget or space.size
    strat = make_strategy(strategy, space, seed=seed, **(options or {}))
    best = table.best_time
    times: list[float | None] = []
    while len(times) < budget:
        configs = strat.ask(min(batch_size, budget - len(times)))
        if not configs:
            break
        results = [table.result(c) for c in configs]
        strat.tell(configs, results)
        times.extend(r.median if r.ok else None for r in results)
        if any(t is not None and t <= best for t in times[-len(configs):]):
            break
    run = ReplayRun(strategy, seed, times[:budget])
    run.curve = curve_of(run.times, best)
    return run


@dataclass
class Summary:
    strategy: str
    runs: list[ReplayRun]
    auc_trials: int

    def _levels(self, level: float) -> list[float]:
        return [float(t) if t is not None else float("inf")
                for t in (trials_to(r.curve, level) for r in self.runs)]

    def median_trials(self, level: float) -> float | None:
        m = statistics.median(self._levels(level))
        return None if m == float("inf") else m

    def reached(self, level: float) -> int:
        return sum(1 for t in self._levels(level) if t != float("inf"))

    @property
    def auc(self) -> float:
        return statistics.median(auc(r.curve, self.auc_trials) for r in self.runs)

    def to_dict(self) -> dict:
        d = {f"trials_to_{round(x * 100)}": self.median_trials(x) for x in LEVELS}
        d["auc"] = round(self.auc, 4)
        return d


TRANSFER = "model+transfer"
PLAIN = "model-knobs"


def prior_from_tables(tables: Sequence[Table], exclude: Table | None = None) -> list:
    """Transfer data: the rows of other tables (same template and target) as cost-model samples."""
    from search_spaces.templates.features import feature_function
    from tuner.search.cost_model import Sample

    out = []
    for t in tables:
        if exclude is not None and (t.header["workload"]["key"] == exclude.header["workload"]["key"]
                                    or t.header["template"]["name"] != exclude.header["template"]["name"]
                                    or t.header["target"]["key"] != exclude.header["target"]["key"]):
            continue
        fn = feature_function(t.header["template"]["name"])
        params, caches = t.header["workload"]["params"], t.header["target"].get("caches")
        for r in t.rows:
            if r.status.value == "INVALID":
                continue
            cost = math.log(r.median) if r.median else None
            out.append(Sample(r.config, fn(params, r.config, caches) if fn else None,
                              t.header["workload"]["key"], cost))
    return out


def setup(spec: str, table: Table, transfer_from: Sequence[Table] = ()) -> tuple[str, dict]:
    """(registered strategy, options) for a replay strategy spec.

    ``model`` gets the template's domain features for the table's workload; ``model-knobs``
    is the same strategy with the generic knob encoding only; ``model+transfer`` is ``model``
    pre-trained on ``transfer_from`` (other workloads' tables on the same target).
    """
    from search_spaces.templates.features import bind

    features = bind(table.header["template"]["name"], table.header["workload"]["params"],
                    table.header["target"].get("caches"))
    if spec == "model":
        return "model", {"features": features}
    if spec == PLAIN:
        return "model", {}
    if spec == TRANSFER:
        return "model", {"features": features, "prior": prior_from_tables(transfer_from, table)}
    return spec, {}


def replay(table: Table, strategies: Sequence[str], seeds: int = 20, budget: int | None = None,
           batch_size: int = 8, auc_trials: int = 100, transfer_from: Sequence[Table] = (),
           options: dict[str, dict] | None = None) -> dict[str, Summary]:
    """Every strategy spec over seeds 0..seeds-1 (``options[spec]`` overrides strategy options)."""
    out = {}
    for spec in strategies:
        name, opts = setup(spec, table, transfer_from)
        opts.update((options or {}).get(spec, {}))
        runs = [replay_one(table, name, s, budget, batch_size, opts) for s in range(seeds)]
        for r in runs:
            r.strategy = spec
        out[spec] = Summary(spec, runs, min(auc_trials, budget or table.space().size))
    return out
