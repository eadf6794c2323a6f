"""Search strategies, by name -> "module:Class" (imported lazily; unknown names are listed)."""
from __future__ import annotations

import importlib

from workloads.errors import UsageError

STRATEGIES: dict[str, str] = {
    "random": "tuner.search.random_search:RandomStrategy",
    "grid": "tuner.search.grid:GridStrategy",
    "tpe": "tuner.search.tpe:TPEStrategy",
    "model": "tuner.search.model_based:ModelStrategy",
}


def make_strategy(name: str, space, seed: int = 0, **options):
    try:
        target = STRATEGIES[name]
    except KeyError:
        raise UsageError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)(space, seed=seed, **options)
