"""Optuna's TPE sampler through its ask/tell interface.

Ordinal knobs (tile sizes) are exposed to Optuna as an integer index, so TPE can model them
as numbers; categorical knobs as categories. Constraints use Optuna's own constraint
handling (``Trial.set_constraint``, read by ``TPESampler``): a proposal that violates the
space's constraints is told back at once as infeasible (constraint value 1) with a penalty
value, and so is a measured failure; a feasible success has constraint 0. A proposal
already measured is never measured again: a duplicate of a pending proposal is told FAIL (TPE
ignores it), a duplicate of a finished one is told its known value.

Storage: pass ``storage=`` (any SQLAlchemy URL, e.g. the tuner's records database) and a
``study_name`` (``study_name_for`` derives one from workload, target, template and threads);
``optuna-dashboard <url>`` then opens the study. A stored study resumes: trials it already
holds are not added twice.

Replayed spaces (``tuner.replay.table.ReplaySpace``) only contain recorded configs. A TPE
proposal outside the table is *snapped* to the nearest unseen recorded config: the proposed
trial is told FAIL (TPE ignores it, it was never measured) and the snapped config is added
as a finished trial with its own parameters once its result is known.
"""
from __future__ import annotations

import hashlib
import logging
import math

from search_spaces.space import Config
from tuner.search.strategy import Strategy, cost_of


def study_name_for(workload_key: str, target_key: str, template: str, version: int,
                   threads: int) -> str:
    digest = hashlib.sha1(workload_key.encode()).hexdigest()[:10]
    return f"tuner-{template}-v{version}-{digest}-{target_key}-t{threads}"


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
        if isinstance(storage, str) and storage.startswith("sqlite"):
            storage = optuna.storages.RDBStorage(
                storage, engine_kwargs={"connect_args": {"timeout": 60}})
        self.study = optuna.create_study(direction="minimize", sampler=sampler, storage=storage,
                                         study_name=study_name, load_if_exists=True)
        self._pending: dict[Config, object] = {}  # config -> optuna trial awaiting its result
        self._known: dict[Config, float | None] = {}
        self._in_study: set[Config] = set()       # finished trials the (stored) study holds
        for t in self.study.get_trials(deepcopy=False,
                                       states=(optuna.trial.TrialState.COMPLETE,)):
            cfg = self._params_to_config(t.params)
            if cfg is not None:
                self._in_study.add(cfg)
        self._nearest = getattr(space, "nearest", None)

    def _penalty(self) -> float:
        costs = [c for c in self._known.values() if c is not None]
        return (max(costs) + 1.0) if costs else 10.0

    def _params_to_config(self, params: dict) -> Config | None:
        try:
            return Config({k.name: k.values[params[k.name]] for k in self.space.knobs})
        except (KeyError, IndexError, TypeError):
            return None

    def _to_config(self, trial) -> Config:
        return Config({k.name: k.values[trial.params[k.name]] for k in self.space.knobs})

    def _infeasible(self, trial) -> None:
        trial.set_constraint("valid", 1.0)
        self.study.tell(trial, self._penalty())

    def _propose(self, n):
        out: list[Config] = []
        fail = self._optuna.trial.TrialState.FAIL
        budget = 50 * max(1, n)  # guards against a sampler stuck on seen/invalid points
        while len(out) < n and budget > 0:
            budget -= 1
            trial = self.study.ask(self._dists)
            cfg = self._to_config(trial)
            reason = self.space.violation(cfg)
            if reason and self._nearest is not None and "unmeasured" in reason:
                snapped = self._nearest(cfg, exclude=self.seen | set(out))
                self.study.tell(trial, state=fail)
                if snapped is None:
                    break
                out.append(snapped)  # told to the study as a new trial in _update
                continue
            if reason:
                self._infeasible(trial)
                continue
            if cfg in self.seen or cfg in out:
                known = self._known.get(cfg)
                if cfg in self._pending or cfg in out or cfg not in self._known:
                    self.study.tell(trial, state=fail)
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
            feasible = 0.0 if cost is not None else 1.0
            if trial is None:  # resumed, snapped or random top-up: add as a finished trial
                if cfg in self._in_study:
                    continue
                params = {k.name: k.index(cfg[k.name]) for k in self.space.knobs}
                self.study.add_trial(self._optuna.trial.create_trial(
                    params=params, distributions=self._dists, value=value,
                    constraints={"valid": feasible}))
            else:
                trial.set_constraint("valid", feasible)
                self.study.tell(trial, value if math.isfinite(value) else self._penalty())
            self._in_study.add(cfg)
