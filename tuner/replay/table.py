"""Recorded measurement tables and the space they span.

A table is a gzipped JSON-lines file. Line 1 is the header::

    {"format": "tuner-replay-table", "format_version": 1,
     "workload": {"kind", "key", "params", "flops"},
     "template": {"name", "version"}, "threads": 1,
     "knobs": [{"name", "values", "ordinal"}, ...],
     "target": {"key", "cpu_name", "caches"}, "versions": {...}, "date": "...",
     "sampling": {...}, "measure_options": {...}, "recording_seconds": ...}

then one line per measured config: ``{"config": {...}, "status": "OK", "samples": [...],
"compile_time": s, "error": "..."}``. Failures (INVALID, COMPILE_ERROR, TIMEOUT, ...) are rows
like any other.

``ReplaySpace`` is what strategies search during a replay. Its knobs are the recorded knobs,
but its *valid points are exactly the recorded configs* whose status is not INVALID (an
INVALID row was rejected by the template's constraints when it was recorded). A config that
was never measured is "unmeasured" and rejected like a constraint violation; sampling,
neighbours and enumeration draw only from the recorded set. So a replay answers: "given
these N recorded candidates, in which order does a strategy find the good ones?"; it says
nothing about configs outside the sample.
"""
from __future__ import annotations

import gzip
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from workloads.errors import UsageError
from tuner.measure.result import MeasureResult, Status

FORMAT = "tuner-replay-table"
FORMAT_VERSION = 1
TABLES_DIR = Path(__file__).resolve().parents[2] / "workloads" / "tables"


@dataclass
class Row:
    config: Config
    status: Status
    samples: list[float]
    compile_time: float | None = None
    error: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.status is Status.OK and self.samples else None

    def result(self) -> MeasureResult:
        return MeasureResult(self.status, samples=list(self.samples),
                             compile_time=self.compile_time, error=self.error,
                             info={"replayed": True})


def knob_header(space: ConfigSpace) -> list[dict]:
    return [{"name": k.name, "values": list(k.values), "ordinal": k.ordinal} for k in space.knobs]


def knobs_from_header(items: list[dict]) -> list[Knob]:
    return [Knob(d["name"], tuple(d["values"]), bool(d.get("ordinal", False))) for d in items]


class Table:
    """A header and its rows; ``result(config)`` serves what was measured."""

    def __init__(self, header: dict, rows: list[Row], name: str = ""):
        self.header = header
        self.rows = rows
        self.name = name or header.get("name", "")
        self.knobs = knobs_from_header(header["knobs"])
        self._by_config: dict[Config, Row] = {}
        for r in rows:
            self._by_config.setdefault(r.config, r)

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path_or_name: str | Path) -> "Table":
        path = resolve(path_or_name)
        try:
            with gzip.open(path, "rt") as fh:
                lines = [ln for ln in fh if ln.strip()]
        except (OSError, EOFError) as exc:
            raise UsageError(f"cannot read replay table {str(path)!r}: {exc}") from None
        try:
            header = json.loads(lines[0])
            if header.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} file")
            if header.get("format_version", 0) > FORMAT_VERSION:
                raise ValueError(f"format version {header['format_version']} is newer than {FORMAT_VERSION}")
            rows = []
            for ln in lines[1:]:
                d = json.loads(ln)
                rows.append(Row(Config(d["config"]), Status(d["status"]), list(d.get("samples") or []),
                                d.get("compile_time"), d.get("error", "")))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UsageError(f"replay table {str(path)!r} is malformed: {exc}") from None
        return cls(header, rows, name=path.name.removesuffix(".jsonl.gz"))

    def save(self, path: str | Path) -> None:
        with gzip.open(path, "wt", compresslevel=9) as fh:
            fh.write(json.dumps(self.header, sort_keys=True) + "\n")
            for r in self.rows:
                fh.write(json.dumps(row_dict(r), sort_keys=True) + "\n")

    # -- queries -----------------------------------------------------------------------------
    @property
    def candidates(self) -> list[Config]:
        """Recorded configs a strategy may propose (every status but INVALID), in file order."""
        return [c for c, r in self._by_config.items() if r.status is not Status.INVALID]

    def result(self, config: Config) -> MeasureResult:
        row = self._by_config.get(config)
        if row is None:
            return MeasureResult(Status.INVALID, error="unmeasured: config not in the replay table")
        return row.result()

    @property
    def best_time(self) -> float:
        times = [r.median for r in self._by_config.values() if r.median]
        if not times:
            raise UsageError(f"replay table {self.name!r} has no OK measurement")
        return min(times)

    @property
    def flops(self) -> int:
        return int(self.header["workload"]["flops"])

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self._by_config.values():
            out[r.status.value] = out.get(r.status.value, 0) + 1
        return out

    def space(self) -> "ReplaySpace":
        return ReplaySpace(self.knobs, self.candidates)


def row_dict(r: Row) -> dict:
    return {"config": dict(r.config), "status": r.status.value,
            "samples": [float(f"{s:.6g}") for s in r.samples],
            "compile_time": round(r.compile_time, 3) if r.compile_time is not None else None,
            "error": r.error[:300]}


def resolve(path_or_name: str | Path) -> Path:
    """A path, or the name of a shipped table (``gemm-256x256x256``) under workloads/tables."""
    p = Path(path_or_name)
    if p.exists():
        return p
    for cand in (TABLES_DIR / str(path_or_name), TABLES_DIR / f"{path_or_name}.jsonl.gz"):
        if cand.exists():
            return cand
    raise UsageError(f"no replay table {str(path_or_name)!r}; shipped tables: "
                     f"{', '.join(shipped_tables()) or 'none'}")


def shipped_tables() -> list[str]:
    return sorted(p.name.removesuffix(".jsonl.gz") for p in TABLES_DIR.glob("*.jsonl.gz"))


class ReplaySpace(ConfigSpace):
    """A ConfigSpace whose valid points are the recorded configs (see module docstring).

    ``size``/``get`` index the recorded candidates (sorted by their index in the full
    product), so grid search enumerates the table; ``sample`` is uniform over them;
    ``neighbours`` keeps only recorded ones; ``nearest`` maps any point of the product to the
    closest recorded one (used by TPE, whose proposals live in the full product).
    """

    def __init__(self, knobs: list[Knob], candidates: list[Config]):
        recorded = set(candidates)
        super().__init__(list(knobs), [Constraint(
            "recorded", lambda c: None if Config(c) in recorded else "unmeasured: not in the replay table")])
        full = ConfigSpace(list(knobs))
        self.full_size = full.size
        self._points = sorted(recorded, key=full.index_of)
        self._recorded = recorded
        self._index = {c: i for i, c in enumerate(self._points)}
        self._pos = [{v: i for i, v in enumerate(k.values)} for k in self.knobs]

    @property
    def size(self) -> int:
        return len(self._points)

    def get(self, index: int) -> Config:
        return self._points[index]

    def index_of(self, config: Mapping) -> int:
        return self._index[Config(config)]

    def __iter__(self) -> Iterator[Config]:
        return iter(self._points)

    def violation(self, config: Mapping) -> str | None:
        cfg = config if isinstance(config, Config) else Config(config)
        if cfg in self._recorded:
            return None
        return super().violation(config) or "recorded: unmeasured"

    def sample(self, rng: random.Random, max_tries: int = 0) -> Config:
        return rng.choice(self._points)

    def count_valid(self, limit: int = 0) -> int:
        return len(self._points)

    def neighbours(self, config: Config) -> list[Config]:
        return [c for c in super().neighbours(config) if c in self._recorded]

    def distance(self, a: Mapping, b: Mapping) -> float:
        """Normalised index distance for ordinal knobs, 0/1 for categorical ones."""
        d = 0.0
        for k, pos in zip(self.knobs, self._pos):
            if k.ordinal:
                d += abs(pos[a[k.name]] - pos[b[k.name]]) / max(1, len(k.values) - 1)
            else:
                d += a[k.name] != b[k.name]
        return d

    def nearest(self, config: Mapping, exclude=()) -> Config | None:
        """The recorded config closest to ``config`` not in ``exclude`` (ties: product order)."""
        best, best_d = None, None
        for c in self._points:
            if c in exclude:
                continue
            d = self.distance(config, c)
            if best_d is None or d < best_d:
                best, best_d = c, d
        return best
