"""Calibration records: one JSON file per (model, calibration, target) beside the records DB.

Why JSON and not a table in the records database: a calibration is one blob per model
(a range per tensor), written once and read whole, never queried across rows; a file can be
diffed, shipped beside the model and read without SQLAlchemy, and adding one needs no schema
migration of the records database (whose schema version guards the tuning records). The
file sits in ``calibration/`` next to a SQLite database (``logs/calibration/`` for the
default ``sqlite:///logs/tuning.db``), or under the cache folder for a server database.

A record carries what is needed to reproduce the build: the model's digest, method, sample
source and count, percentile, weight range, target key, CPU, ISA features and versions.
Files are written atomically (temporary file + rename) and only after a calibration
succeeded, so a bad input changes nothing.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path

from tuner.quant.calibrate import ALGORITHM_VERSION, Calibration

FORMAT_VERSION = 1


def calibration_dir(db: str | None = None) -> Path:
    from tuner.settings import cache_dir, db_url

    url = db_url(db)
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):]).resolve().parent / "calibration"
    return cache_dir() / "calibration"


def graph_digest(graph) -> str:
    from workloads.graph.text import to_text

    return hashlib.sha1(to_text(graph).encode()).hexdigest()[:16]


def record_key(graph_digest_: str, method: str, samples: str, percentile: float | None,
               target_key: str, reduce_range: bool) -> str:
    text = json.dumps([FORMAT_VERSION, ALGORITHM_VERSION, graph_digest_, method, samples,
                       percentile, target_key, reduce_range])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def record_path(directory: Path, model_name: str, key: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_name)
    return directory / f"{safe}-{key}.json"


def save(path: Path, calib: Calibration, *, model: str, digest: str, reduce_range: bool,
         target) -> None:
    doc = {
        "format": FORMAT_VERSION, "algorithm": ALGORITHM_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": model, "graph_digest": digest,
        "method": calib.method, "percentile": calib.percentile,
        "samples": calib.samples, "sample_count": calib.count,
        "reduce_range": reduce_range,
        "target": {"key": target.key, "cpu": target.cpu_name, "model_name": target.model_name,
                   "isa": [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vnni",
                                       "avxvnni") if f in target.features]},
        "versions": target.versions,
        "ranges": {k: list(v) for k, v in calib.ranges.items()},
        "observed": {k: list(v) for k, v in calib.observed.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def load(path: Path) -> Calibration | None:
    """The calibration in ``path``, or None when missing or of another format."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if doc.get("format") != FORMAT_VERSION:
        return None
    return Calibration(doc["method"], doc["samples"], doc["sample_count"],
                       {k: tuple(v) for k, v in doc["ranges"].items()},
                       {k: tuple(v) for k, v in doc["observed"].items()}, doc.get("percentile"))
