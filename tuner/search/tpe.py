"""Optuna's TPE sampler through its ask/tell interface.

Ordinal knobs (tile sizes) are exposed to Optuna as an integer index, so TPE can model them
as numbers; categorical knobs as categories. A proposal that violates the space's constraints
is told back at once as infeasible (``Trial.set_constraint`` with a positive violation)
with a penalty value, so TPE learns to avoid the region; a proposal already measured is told
its known value without measuring again. The study may live in any Optuna storage (pass
``storage=`` URL) so ``optuna-dashboard`` can open it.
"""
from __future__ import annotations

import logging
import math

from search_spaces.space import Config
from tuner.search.base import Strategy, cost_of


class TPEStrategy(Strategy):
    name = "tpe"

    def __init__(self, space, seed=0, storage: str | None = None, study_name: str | None = None,
                 n_startup_trials: int = 10, **options):
        super().__init__(space, seed, **options)
        import optuna

        optuna.logging.set_verbosity(logging.WARNING)
        self._optuna = optuna
        self._dists = {}
        for k in space.knobs:
            if k.ordinal:
                self._dists[k.name] = optuna.distributions.IntDistribution(0, len(k.values) - 1)
            else:
                self._dists[k.name] = optuna.distributions.CategoricalDistribution(
                    list(range(len(k.values))))
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials,
                                             multivariate=True)
        self.study = optuna.create_study(direction="minimize", sampler=sampler, storage=storage,
                                         study_name=study_name, load_if_exists=True)
        self._pending: dict[Config, object] = {}  # config -> optuna trial awaiting its result
        self._known: dict[Config, float | None] = {}

    def _penalty(self) -> float:
        costs = [c for c in self._known.values() if c is not None]
        return (max(costs) + 1.0) if costs else 10.0

    def _to_config(self, trial) -> Config:
        return Config({k.name: k.values[trial.params[k.name]] for k in self.space.knobs})

    def _propose(self, n):
        out: list[Config] = []
        budget = 50 * max(1, n)  # guards against a sampler stuck on seen/invalid points
        while len(out) < n and budget > 0:
            budget -= 1
            trial = self.study.ask(self._dists)
            cfg = self._to_config(trial)
            reason = self.space.violation(cfg)
            if reason:
                trial.set_constraint("valid", 1.0)
                self.study.tell(trial, self._penalty())
                continue
            if cfg in self.seen or cfg in out:
                known = self._known.get(cfg)
                if cfg in self._pending or cfg in out:
                    self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                else:
                    trial.set_constraint("valid", 0.0 if known is not None else 1.0)
                    self.study.tell(trial, known if known is not None else self._penalty())
                continue
            self._pending[cfg] = trial
            out.append(cfg)
        if len(out) < n:  # TPE keeps proposing known points: top up with random unseen ones
            out += [c for c in self.sample_unseen(n - len(out)) if c not in out]
        return out

    def _update(self, configs, results):
        for cfg, res in zip(configs, results):
            cost = cost_of(res)
            self._known[cfg] = cost
            trial = self._pending.pop(cfg, None)
            value = cost if cost is not None else self._penalty()
            if trial is None:  # resumed from the database or random top-up: add as a finished trial
                params = {k.name: k.index(cfg[k.name]) for k in self.space.knobs}
                self.study.add_trial(self._optuna.trial.create_trial(
                    params=params, distributions=self._dists, value=value,
                    constraints={"valid": 0.0 if cost is not None else 1.0}))
            else:
                trial.set_constraint("valid", 0.0 if cost is not None else 1.0)
                self.study.tell(trial, value if math.isfinite(value) else self._penalty())
