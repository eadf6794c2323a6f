"""Uniform random sampling over the valid configs."""
from __future__ import annotations

from tuner.search.strategy import Strategy


class RandomStrategy(Strategy):
    name = "random"

    def _propose(self, n):
        return self.sample_unseen(n)
