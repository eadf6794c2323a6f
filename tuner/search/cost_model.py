"""A learned cost model: config features -> predicted log run time.

Features are generic over any ``ConfigSpace``: an ordinal knob contributes log2 of its value
(or its index when not a positive number), a categorical knob a one-hot vector, a bool 0/1.
A template may add domain features (working set vs caches, arithmetic intensity ...) through
an optional ``features(workload, config) -> dict[str, float]`` method.

The model is scikit-learn's gradient boosting on log(median seconds); failed candidates are
included with a penalty slightly above the slowest success, so the model learns to avoid them.
Only the ranking of predictions matters to the search.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from search_spaces.space import Config, ConfigSpace


class Featurizer:
    def __init__(self, space: ConfigSpace, extra: Callable[[Config], dict[str, float]] | None = None):
        self.space = space
        self.extra = extra
        self._extra_names: list[str] | None = None

    def _knob_features(self, cfg: Config) -> list[float]:
        f: list[float] = []
        for k in self.space.knobs:
            v = cfg[k.name]
            if isinstance(v, bool):
                f.append(float(v))
            elif k.ordinal:
                f.append(math.log2(v) if isinstance(v, int) and v > 0 else float(k.index(v)))
            else:
                f.extend(1.0 if v == x else 0.0 for x in k.values)
        return f

    def __call__(self, configs: Sequence[Config]) -> np.ndarray:
        rows = []
        for cfg in configs:
            f = self._knob_features(cfg)
            if self.extra is not None:
                ex = self.extra(cfg)
                if self._extra_names is None:
                    self._extra_names = sorted(ex)
                f.extend(float(ex.get(n, 0.0)) for n in self._extra_names)
            rows.append(f)
        return np.asarray(rows, dtype=np.float64)


class CostModel:
    def __init__(self, featurizer: Featurizer, seed: int = 0):
        self.featurize = featurizer
        self.seed = seed
        self._model = None

    @property
    def fitted(self) -> bool:
        return self._model is not None

    def fit(self, configs: Sequence[Config], costs: Sequence[float | None]) -> None:
        ok = [c for c in costs if c is not None]
        if len(ok) < 4:
            self._model = None
            return
        penalty = max(ok) + 1.0
        y = np.array([c if c is not None else penalty for c in costs])
        X = self.featurize(configs)
        from sklearn.ensemble import GradientBoostingRegressor

        self._model = GradientBoostingRegressor(
            n_estimators=150, max_depth=3, learning_rate=0.1, subsample=0.8,
            random_state=self.seed).fit(X, y)

    def predict(self, configs: Sequence[Config]) -> np.ndarray:
        if self._model is None:
            raise RuntimeError("cost model not fitted")
        return self._model.predict(self.featurize(configs))
