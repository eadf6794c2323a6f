"""``db check``: verify a records database and report every problem found (read-only)."""
from __future__ import annotations

import math
import statistics

from sqlalchemy import select, text

from tuner.db.models import RunRow, TrialRow
from tuner.db.store import Store
from tuner.measure.result import Status


def check(store: Store) -> tuple[list[str], list[str]]:
    """Returns (problems, notes). Problems make the database untrustworthy; notes do not."""
    problems: list[str] = []
    notes: list[str] = []
    with store.session() as s:
        if store.engine.dialect.name == "sqlite":
            res = [r[0] for r in s.execute(text("PRAGMA integrity_check")).all()]
            if res != ["ok"]:
                problems += [f"sqlite integrity: {r}" for r in res[:20]]
            fk = s.execute(text("PRAGMA foreign_key_check")).all()
            problems += [f"foreign key broken: table {r[0]} row {r[1]} -> {r[2]}" for r in fk[:20]]
        statuses = set(Status.__members__)
        n = 0
        for t in s.scalars(select(TrialRow)):
            n += 1
            where = f"trial {t.id}"
            if t.status not in statuses:
                problems.append(f"{where}: unknown status {t.status!r}")
                continue
            if t.status == "OK":
                if not t.samples:
                    problems.append(f"{where}: OK without timing samples")
                elif not all(isinstance(x, (int, float)) and x > 0 and math.isfinite(x) for x in t.samples):
                    problems.append(f"{where}: non-positive or non-finite samples")
                elif t.median is None or not math.isclose(t.median, statistics.median(t.samples), rel_tol=1e-9):
                    problems.append(f"{where}: stored median {t.median} disagrees with its samples")
            elif t.status != "OK" and t.samples:
                problems.append(f"{where}: status {t.status} but has timing samples")
        unfinished = s.scalars(select(RunRow).where(RunRow.finished_at.is_(None))).all()
        for r in unfinished:
            notes.append(f"run {r.id} ({r.command or r.strategy}) started {r.started_at:%Y-%m-%d %H:%M} "
                         "never finished (interrupted or still running); its recorded trials are intact")
        notes.insert(0, f"{n} trials checked")
    return problems, notes
