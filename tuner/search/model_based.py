"""Model-based search: a cost model ranks a large candidate pool; the best are measured.

Each round: refit the cost model on everything measured; build a pool of random unseen
configs plus the neighbours of the best few measured ones (local refinement); predict; take
the best-ranked configs while keeping the batch diverse (a pick must differ from every
earlier pick in at least ``min_distance`` knobs); replace a fraction ``epsilon`` of the batch
with random configs (exploration). Until the model has enough data, it samples at random.
"""
from __future__ import annotations

from search_spaces.space import Config
from tuner.search.base import Strategy
from tuner.search.cost_model import CostModel, Featurizer


def _distance(a: Config, b: Config) -> int:
    return sum(1 for k in a if a[k] != b[k])


class ModelStrategy(Strategy):
    name = "model"

    def __init__(self, space, seed=0, pool_size: int = 2000, epsilon: float = 0.1,
                 min_distance: int = 2, warmup: int = 8, features=None, **options):
        super().__init__(space, seed, **options)
        self.pool_size = pool_size
        self.epsilon = epsilon
        self.min_distance = min_distance
        self.warmup = warmup
        self.model = CostModel(Featurizer(space, features), seed=seed)
        self._dirty = False

    def _update(self, configs, results):
        self._dirty = True

    def _pool(self) -> list[Config]:
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
        if n_ok < self.warmup:
            return self.sample_unseen(n)
        if self._dirty:
            self.model.fit([c for c, _ in self.history], [v for _, v in self.history])
            self._dirty = False
        if not self.model.fitted:
            return self.sample_unseen(n)
        pool = self._pool()
        if not pool:
            return []
        preds = self.model.predict(pool)
        ranked = [pool[i] for i in preds.argsort()]
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
