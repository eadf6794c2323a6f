"""Configuration read in one place: environment variables and default paths.

- ``TUNER_DB``: SQLAlchemy URL of the records database (default ``sqlite:///logs/tuning.db``,
  relative to the current directory; ``--db`` overrides it).
- ``TUNER_CACHE``: folder for generated kernel sources and Numba's compiled cache
  (default ``~/.cache/tuner``).
"""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DB = "sqlite:///logs/tuning.db"


def db_url(cli_value: str | None = None) -> str:
    return cli_value or os.environ.get("TUNER_DB") or DEFAULT_DB


def cache_dir() -> Path:
    root = os.environ.get("TUNER_CACHE") or os.path.join(Path.home(), ".cache", "tuner")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
