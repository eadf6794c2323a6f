"""The one interface every search strategy implements: propose, then learn.

Strategies only propose (``ask``) and learn from outcomes (``tell``); the tuner loop owns the
budget, measurement, early stopping, progress and database writes. A strategy never proposes
a config it has already proposed or been told about, so nothing is measured twice.
"""
from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from typing import ClassVar, Sequence

from search_spaces.space import Config, ConfigSpace
from tuner.measure.result import MeasureResult


def cost_of(result: MeasureResult) -> float | None:
    """The figure strategies minimise: log of the median seconds; None when not OK."""
    m = result.median if result.ok else None
    return math.log(m) if m else None


class Strategy(ABC):
    name: ClassVar[str]

    def __init__(self, space: ConfigSpace, seed: int = 0, **options):
        self.space = space
        self.rng = random.Random(seed)
        self.seed = seed
        self.options = options
        self.seen: set[Config] = set()
        self.history: list[tuple[Config, float | None]] = []  # (config, cost or None)

    @abstractmethod
    def _propose(self, n: int) -> list[Config]:
        """Up to n new valid configs not in ``self.seen``."""

    def ask(self, n: int) -> list[Config]:
        out = []
        for cfg in self._propose(n):
            if cfg not in self.seen and len(out) < n:
                self.seen.add(cfg)
                out.append(cfg)
        return out

    def tell(self, configs: Sequence[Config], results: Sequence[MeasureResult]) -> None:
        for cfg, res in zip(configs, results):
            self.seen.add(cfg)
            self.history.append((cfg, cost_of(res)))
        self._update(configs, results)

    def _update(self, configs: Sequence[Config], results: Sequence[MeasureResult]) -> None:
        """Hook for learning strategies."""

    @property
    def best_cost(self) -> float | None:
        costs = [c for _, c in self.history if c is not None]
        return min(costs) if costs else None

    def sample_unseen(self, n: int, max_tries: int = 200) -> list[Config]:
        """n random valid configs not seen yet (fewer when the space runs out)."""
        out: list[Config] = []
        taken: set[Config] = set()   # membership of ``out`` (a list test was quadratic: a
        tries = 0                    # 4096-config pool made 14M comparisons per batch)
        while len(out) < n and tries < max_tries * max(1, n):
            tries += 1
            cfg = self.space.sample(self.rng)
            if cfg not in self.seen and cfg not in taken:
                out.append(cfg)
                taken.add(cfg)
        return out
