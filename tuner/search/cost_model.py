"""A learned cost model: (workload, config) features -> a ranking score (lower is better).

Features: the generic knob encoding of the space (an ordinal knob contributes log2 of its
value, a categorical knob a one-hot vector, a bool 0/1) plus the template's *domain*
features from ``search_spaces.templates.features`` (effective tiles, working sets against L1/L2,
register tile, arithmetic intensity, packing traffic, parallel grain, workload dimensions).

Target: ranking-friendly and comparable across workloads. Within each workload ("group")
a measured config's target is its rank quantile among that group's successes (0 = fastest,
1 = slowest), or, with ``target="log"``, log(time / group's best time); failures get a
penalty above every success. Training on ranks keeps a few 100x-slow outliers from
dominating the squared loss, and makes records of other shapes (transfer) usable as they
are: a 2 ms config on 256^3 and a 100 ms config on 1024^3 can both be "top 5%".

The model is scikit-learn's gradient boosting; records of other workloads (``prior``) are
fitted together with this workload's own results, down-weighted by ``prior_weight``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from search_spaces.space import Config, ConfigSpace

FAIL_PENALTY = {"rank": 1.25, "log": None}  # log: slowest success + 1 (set per group)


@dataclass
class Sample:
    """One measured config of some workload (``group``) with its domain features."""

    config: Mapping
    extra: Mapping[str, float] | None
    group: str
    cost: float | None        # log seconds, None when the config failed


class Featurizer:
    def __init__(self, space: ConfigSpace, extra: Callable[[Config], dict[str, float]] | None = None):
        self.space = space
        self.extra = extra
        self._extra_names: list[str] | None = None

    def _knob_features(self, cfg: Mapping) -> list[float]:
        f: list[float] = []
        for k in self.space.knobs:
            v = cfg.get(k.name, k.values[0])
            if isinstance(v, bool):
                f.append(float(v))
            elif k.ordinal:
                f.append(math.log2(v) if isinstance(v, int) and v > 0
                         else float(k.values.index(v)) if v in k.values else 0.0)
            else:
                f.extend(1.0 if v == x else 0.0 for x in k.values)
        return f

    def row(self, cfg: Mapping, extra: Mapping[str, float] | None = None) -> list[float]:
        f = self._knob_features(cfg)
        if extra is None and self.extra is not None:
            extra = self.extra(cfg)
        if extra is not None:
            if self._extra_names is None:
                self._extra_names = sorted(extra)
            f.extend(float(extra.get(n, 0.0)) for n in self._extra_names)
        return f

    def __call__(self, configs: Sequence[Mapping]) -> np.ndarray:
        return np.asarray([self.row(c) for c in configs], dtype=np.float64)


def group_targets(costs: Sequence[float | None], kind: str = "rank") -> np.ndarray:
    """Per-group targets (lower is better): rank quantile, or log time over the group's best."""
    ok = sorted(c for c in costs if c is not None)
    if not ok:
        return np.full(len(costs), FAIL_PENALTY["rank"] if kind == "rank" else 1.0)
    if kind == "log":
        best, worst = ok[0], ok[-1]
        return np.array([c - best if c is not None else worst - best + 1.0 for c in costs])
    n = len(ok)
    out = []
    for c in costs:
        if c is None:
            out.append(FAIL_PENALTY["rank"])
        else:  # mid-rank quantile of c among the successes (ties share a rank)
            lo = np.searchsorted(ok, c, side="left")
            hi = np.searchsorted(ok, c, side="right")
            out.append(((lo + hi - 1) / 2) / max(1, n - 1))
    return np.array(out)


class CostModel:
    def __init__(self, featurizer: Featurizer, seed: int = 0, target: str = "rank",
                 prior: Sequence[Sample] = (), prior_weight: float = 0.5,
                 n_estimators: int = 120, max_depth: int = 4, ensemble: int = 1,
                 kappa: float = 1.0):
        self.featurize = featurizer
        self.seed = seed
        self.target = target
        self.prior_weight = prior_weight
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.ensemble = ensemble
        self.kappa = kappa
        self._model = None
        self._prior_X, self._prior_y = self._prepare_prior(prior)

    def _prepare_prior(self, prior: Sequence[Sample]):
        if not prior:
            return None, None
        groups: dict[str, list[Sample]] = {}
        for s in prior:
            groups.setdefault(s.group, []).append(s)
        X, y = [], []
        for samples in groups.values():
            if sum(1 for s in samples if s.cost is not None) < 4:
                continue
            y.extend(group_targets([s.cost for s in samples], self.target))
            X.extend(self.featurize.row(s.config, s.extra) for s in samples)
        if not X:
            return None, None
        return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)

    @property
    def has_prior(self) -> bool:
        return self._prior_X is not None

    @property
    def fitted(self) -> bool:
        return self._model is not None

    def fit(self, configs: Sequence[Config], costs: Sequence[float | None], min_ok: int = 4) -> None:
        """Refit on this workload's results (plus the prior, if any)."""
        n_ok = sum(1 for c in costs if c is not None)
        parts_X, parts_y, parts_w = [], [], []
        if n_ok >= min_ok:
            parts_X.append(self.featurize(configs))
            parts_y.append(group_targets(costs, self.target))
            parts_w.append(np.ones(len(configs)))
        if self.has_prior:
            parts_X.append(self._prior_X)
            parts_y.append(self._prior_y)
            parts_w.append(np.full(len(self._prior_y), self.prior_weight))
        if not parts_X:
            self._model = None
            return
        from sklearn.ensemble import GradientBoostingRegressor

        X, y, w = np.vstack(parts_X), np.concatenate(parts_y), np.concatenate(parts_w)
        rng = np.random.default_rng(self.seed)
        models = []
        for i in range(self.ensemble):
            # members after the first see a bootstrap resample: their spread is the uncertainty
            idx = rng.integers(0, len(y), len(y)) if i else np.arange(len(y))
            models.append(GradientBoostingRegressor(
                n_estimators=self.n_estimators, max_depth=self.max_depth, learning_rate=0.1,
                subsample=0.8, random_state=self.seed + i).fit(X[idx], y[idx], sample_weight=w[idx]))
        self._model = models

    def predict(self, configs: Sequence[Config]) -> np.ndarray:
        """Predicted score (lower is better); with an ensemble, the optimistic bound
        mean - kappa * std, so uncertain candidates get explored."""
        if self._model is None:
            raise RuntimeError("cost model not fitted")
        X = self.featurize(configs)
        preds = np.array([m.predict(X) for m in self._model])
        if len(preds) == 1:
            return preds[0]
        return preds.mean(axis=0) - self.kappa * preds.std(axis=0)


def prior_from_rows(rows, exclude_workload: str, template: str,
                    caches: Mapping | None = None) -> list[Sample]:
    """Transfer data from records-store trial rows of *other* workloads of one template.

    ``rows``: ``TrialRow``s (``store.trials(target_key=..., template=..., threads=...)``).
    A config measured several times keeps its slowest median; any failure marks it failed.
    """
    from search_spaces.templates.features import feature_function

    fn = feature_function(template)
    by_key: dict[tuple[str, str], tuple[Mapping, Mapping, float | None]] = {}
    for r in rows:
        wkey = r.workload.key
        if wkey == exclude_workload or r.template != template:
            continue
        params = dict(r.workload.params)
        cost = math.log(r.median) if r.status == "OK" and r.median else None
        k = (wkey, r.config_hash)
        if k in by_key:
            prev = by_key[k][2]
            cost = None if prev is None or cost is None else max(prev, cost)
        import json

        by_key[k] = (params, json.loads(r.config), cost)
    return [Sample(cfg, fn(params, cfg, caches) if fn else None, wkey, cost)
            for (wkey, _), (params, cfg, cost) in by_key.items()]
