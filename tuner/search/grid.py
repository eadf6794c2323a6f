"""Every valid config in index order (first knob most significant)."""
from __future__ import annotations

from tuner.search.strategy import Strategy


class GridStrategy(Strategy):
    name = "grid"

    def __init__(self, space, seed=0, **options):
        super().__init__(space, seed, **options)
        self._next = 0

    def _propose(self, n):
        out = []
        while len(out) < n and self._next < self.space.size:
            cfg = self.space.get(self._next)
            self._next += 1
            if cfg not in self.seen and self.space.is_valid(cfg):
                out.append(cfg)
        return out
