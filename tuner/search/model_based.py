"""Model-based search: a cost model ranks a candidate pool; the best-ranked are measured.

Each round: refit the cost model (``cost_model.CostModel``: gradient boosting on a ranking
target over knob + domain features) on everything measured, plus records of other
workloads when a ``prior`` is given (transfer); build a pool (every unseen valid config when
the space is small enough, else random unseen configs plus the neighbours of the best few
measured ones); predict; take the best-ranked configs while keeping the batch diverse (a
pick must differ from every earlier pick in at least ``min_distance`` knobs); each slot is
instead a random config with probability ``epsilon`` (exploration). Without a prior, the
first ``warmup`` successes come from random sampling; with one, the first batch is already
the model's pick.
"""
from __future__ import annotations

from search_spaces.space import Config
from tuner.search.base import Strategy
from tuner.search.cost_model import CostModel, Featurizer


def _distance(a: Config, b: Config) -> int:
    return sum(1 for k in a if a[k] != b[k])


class _CachedFeatures:
    """Domain features per config, computed once (pools are re-ranked every round)."""

    def __init__(self, fn):
        self.fn = fn
        self.cache: dict[Config, dict] = {}

    def __call__(self, cfg):
        out = self.cache.get(cfg)
        if out is None:
            out = self.cache[cfg] = self.fn(cfg)
        return out


class ModelStrategy(Strategy):
    name = "model"

    def __init__(self, space, seed=0, pool_size: int = 2000, epsilon: float = 0.1,
                 min_distance: int = 2, warmup: int = 8, features=None, prior=None,
                 prior_weight: float = 0.5, target: str = "rank", n_estimators: int = 120,
                 **options):
        super().__init__(space, seed, **options)
        self.pool_size = pool_size
        self.epsilon = epsilon
        self.min_distance = min_distance
        self.warmup = warmup
        extra = _CachedFeatures(features) if features is not None else None
        self.model = CostModel(Featurizer(space, extra), seed=seed, target=target,
                               prior=prior or (), prior_weight=prior_weight,
                               n_estimators=n_estimators)
        self._dirty = True

    def _update(self, configs, results):
        self._dirty = True

    def _pool(self) -> list[Config]:
        if self.space.size <= self.pool_size:  # small (e.g. replayed) space: rank all of it
            return [c for c in self.space if c not in self.seen]
        measured = sorted((c for c in self.history if c[1] is not None), key=lambda p: p[1])
        pool: dict[Config, None] = {}
        for cfg, _ in measured[:5]:
            for nb in self.space.neighbours(cfg):
                if nb not in self.seen:
                    pool[nb] = None
        for cfg in self.sample_unseen(self.pool_size, max_tries=20):
            pool[cfg] = None
        return list(pool)

    def _propose(self, n):
        n_ok = sum(1 for _, c in self.history if c is not None)
        if n_ok < self.warmup and not self.model.has_prior:
            return self.sample_unseen(n)
        if self._dirty:
            self.model.fit([c for c, _ in self.history], [v for _, v in self.history],
                           min_ok=self.warmup)
            self._dirty = False
        if not self.model.fitted:
            return self.sample_unseen(n)
        pool = self._pool()
        if not pool:
            return []
        preds = self.model.predict(pool)
        ranked = [pool[i] for i in preds.argsort(kind="stable")]
        n_explore = sum(1 for _ in range(n) if self.rng.random() < self.epsilon)
        picks: list[Config] = []
        for cfg in ranked:
            if len(picks) >= n - n_explore:
                break
            if all(_distance(cfg, p) >= self.min_distance for p in picks):
                picks.append(cfg)
        for cfg in ranked:  # diversity left the batch short: fill with the next best
            if len(picks) >= n - n_explore:
                break
            if cfg not in picks:
                picks.append(cfg)
        picks += [c for c in self.sample_unseen(n - len(picks)) if c not in picks]
        return picks[:n]
