"""The records store: every database call runs inside one scoped session.

``Store(url)`` opens any SQLAlchemy URL (default SQLite file under ``logs/``), creates the
tables, and checks the stored schema version. SQLite runs in WAL mode with a busy timeout so
several tuners can write one file. Writes happen once per measured batch, not per row.
Every ``SQLAlchemyError`` becomes a one-line ``DatabaseError``.
"""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from sqlalchemy import create_engine, delete, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from search_spaces.space import Config
from tuner.db.models import (SCHEMA_VERSION, Base, ClaimRow, Meta, RunRow, TargetRow,
                             TrialRow, WorkloadRow, utcnow)
from workloads.errors import DatabaseError
from tuner.measure.result import MeasureResult, Status


@dataclass
class TrialRecord:
    """What the tuner hands the store for one measured candidate."""

    template: str
    template_version: int
    config: Config
    threads: int
    result: MeasureResult
    strategy: str = ""


@dataclass
class Best:
    workload_key: str
    target_key: str
    template: str
    template_version: int
    config: Config
    threads: int
    median: float
    gflops: float | None
    measurements: int            # OK rows of this config (re-measurements included)
    trial_id: int
    versions: dict = field(default_factory=dict)
    created_at: str = ""
    # the side-by-side check against the template's default (tuner.tuning.guard_against_default):
    # margin, noise, accepted; None when the config was never checked
    guard: dict | None = None

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        d["config"] = dict(self.config)
        return d


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # Let SQLAlchemy's "begin" event start transactions (below), not the sqlite3 module.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def rank_configs(rows: Sequence[TrialRow]) -> list[tuple[float, list[TrialRow]]]:
    """(score, OK rows) per config of one workload/target/threads/template, best first.

    The score is a config's slowest median: it must be fast every time it is measured. A config
    with any failed measurement (flaky answer, crash) is left out.
    """
    failed = {r.config_hash for r in rows if r.status != Status.OK.value}
    by_cfg: dict[str, list[TrialRow]] = {}
    for r in rows:
        if r.status == Status.OK.value and r.config_hash not in failed:
            by_cfg.setdefault(r.config_hash, []).append(r)
    return sorted(((max(x.median for x in rs), rs) for rs in by_cfg.values()), key=lambda p: p[0])


def placements_cut(rows: Sequence[TrialRow]) -> bool:
    """Whether every measurement of a config left buffer placements untimed (a tuning run's
    ``placements_cut``: behind the best of its run on its first placement, or raced out
    after a later one), so it has no slowest-placement score yet."""
    return all((r.info or {}).get("placements_cut") for r in rows)


_WRITES: dict[str, int] = {}   # store URL -> batches of trials written by this process


def writes(url: str) -> int:
    """Batches of trials this process has written to ``url``: a selection cached by
    ``tuner.dispatch`` is stale once this moved on (a tuning run in the same process)."""
    return _WRITES.get(url, 0)


class Store:
    def __init__(self, url: str, create: bool = True):
        """Open the records at ``url``; ``create=False`` (queries) refuses a SQLite file that
        does not exist instead of creating an empty database."""
        self.url = url
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise DatabaseError(f"not a database URL: {url!r} (e.g. sqlite:///logs/tuning.db)") from None
        kwargs: dict = {}
        if parsed.get_backend_name() == "sqlite":
            db = parsed.database
            # (a "file:..." database is an SQLite URI, e.g. read-only mode: not a path to make)
            if db and db != ":memory:" and not db.startswith("file:"):
                if not create and not Path(db).is_file():
                    raise DatabaseError(f"no database at {url!r} (nothing has been recorded "
                                        "there; tune something first, or check --db / TUNER_DB)")
                Path(db).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": 60}
        try:
            self.engine = create_engine(url, **kwargs)
        except (SQLAlchemyError, ImportError) as exc:
            raise DatabaseError(f"cannot open database {url!r}: {exc}") from None
        if parsed.get_backend_name() == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            # BEGIN IMMEDIATE takes the write lock up front and waits (busy timeout) for it.
            # A deferred transaction that reads and then writes can fail at once with
            # "database is locked" when another writer committed in between (WAL snapshot).
            event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._init_schema()

    # -- session scope -----------------------------------------------------------------
    @contextmanager
    def session(self) -> Iterator[Session]:
        s = self._sessions()
        try:
            yield s
            s.commit()
        except SQLAlchemyError as exc:
            s.rollback()
            msg = str(exc.orig if getattr(exc, "orig", None) is not None else exc).splitlines()[0]
            raise DatabaseError(f"database {self.url}: {msg}") from None
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def _init_schema(self) -> None:
        with self.session() as s:
            if self.engine.dialect.name == "postgresql":
                # several tuners may create the schema at once: one at a time
                s.execute(text("SELECT pg_advisory_xact_lock(7357001)"))
            Base.metadata.create_all(s.connection())
            row = s.get(Meta, "schema_version")
            if row is None:
                s.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
            elif int(row.value) > SCHEMA_VERSION:
                raise DatabaseError(
                    f"database {self.url} has schema version {row.value}, newer than this "
                    f"tuner's {SCHEMA_VERSION}; upgrade tuner to read it (nothing was changed)")

    def close(self) -> None:
        self.engine.dispose()

    # -- get-or-create -----------------------------------------------------------------
    @staticmethod
    def _get_or_create(s: Session, cls, key: str, make):
        """The row of `cls` with this key, created by `make()` if absent. Several tuners may
        create the same row at once (PostgreSQL, READ COMMITTED): the insert runs in a
        savepoint, and the loser of the race reads the winner's committed row."""
        row = s.scalar(select(cls).where(cls.key == key))
        if row is not None:
            return row
        try:
            with s.begin_nested():
                row = make()
                s.add(row)
            return row
        except IntegrityError:
            return s.scalar(select(cls).where(cls.key == key))

    @classmethod
    def _target(cls, s: Session, target) -> TargetRow:
        return cls._get_or_create(s, TargetRow, target.key, lambda: TargetRow(
            key=target.key, cpu_name=target.cpu_name, model_name=target.model_name,
            cores=target.cores, features=list(target.features), caches=dict(target.caches)))

    @classmethod
    def _workload(cls, s: Session, workload) -> WorkloadRow:
        return cls._get_or_create(s, WorkloadRow, workload.key, lambda: WorkloadRow(
            kind=workload.kind, key=workload.key, params=workload.params(),
            flops=int(workload.flops())))

    # -- runs and trials ---------------------------------------------------------------
    def start_run(self, target, command: str, strategy: str, threads: int) -> str:
        run_id = str(uuid.uuid4())
        with self.session() as s:
            t = self._target(s, target)
            s.add(RunRow(id=run_id, command=command, strategy=strategy, threads=threads,
                         target_id=t.id, versions=dict(target.versions)))
        return run_id

    def finish_run(self, run_id: str, baseline: dict | None = None, summary: dict | None = None) -> None:
        with self.session() as s:
            run = s.get(RunRow, run_id)
            if run is not None:
                run.baseline = baseline or run.baseline
                run.summary = summary or run.summary
                run.finished_at = utcnow()

    def add_trials(self, run_id: str | None, workload, target, records: Sequence[TrialRecord]) -> list[int]:
        """Write one batch of measured candidates in one transaction; returns their ids."""
        _WRITES[self.url] = _WRITES.get(self.url, 0) + 1
        flops = workload.flops()
        with self.session() as s:
            w, t = self._workload(s, workload), self._target(s, target)
            rows = []
            for r in records:
                st = r.result.stats()
                rows.append(TrialRow(
                    run_id=run_id, workload_id=w.id, target_id=t.id, template=r.template,
                    template_version=r.template_version, config=r.config.to_json(),
                    config_hash=r.config.hash, threads=r.threads, status=r.result.status.value,
                    error=r.result.error[:8000], compile_time=r.result.compile_time,
                    samples=list(r.result.samples), median=st["median"], iqr=st["iqr"],
                    p95=st["p95"], mean=st["mean"],
                    gflops=(flops / st["median"] / 1e9) if st["median"] else None,
                    strategy=r.strategy, versions=dict(target.versions), info=dict(r.result.info)))
            s.add_all(rows)
            if run_id is not None:  # the measured candidates are no longer claimed
                s.execute(delete(ClaimRow).where(
                    ClaimRow.run_id == run_id, ClaimRow.workload_id == w.id,
                    ClaimRow.config_hash.in_([r.config.hash for r in records])))
            s.flush()
            return [row.id for row in rows]

    def _trial_query(self, workload_key: str | None = None, target_key: str | None = None,
                     template: str | None = None, template_version: int | None = None,
                     threads: int | None = None, status: str | None = None,
                     ids: list[int] | None = None):
        q = select(TrialRow).join(WorkloadRow).join(TargetRow)
        if ids is not None:
            q = q.where(TrialRow.id.in_(ids))
        if workload_key is not None:
            q = q.where(WorkloadRow.key == workload_key)
        if target_key is not None:
            q = q.where(TargetRow.key == target_key)
        if template is not None:
            q = q.where(TrialRow.template == template)
        if template_version is not None:
            q = q.where(TrialRow.template_version == template_version)
        if threads is not None:
            q = q.where(TrialRow.threads == threads)
        if status is not None:
            q = q.where(TrialRow.status == status)
        return q

    def measured(self, workload_key: str, target_key: str, template: str, template_version: int,
                 threads: int) -> dict[str, TrialRow]:
        """config hash -> its first trial row, for resuming (any status counts as measured)."""
        with self.session() as s:
            rows = s.scalars(self._trial_query(workload_key, target_key, template,
                                               template_version, threads).order_by(TrialRow.id)).all()
        out: dict[str, TrialRow] = {}
        for r in rows:
            out.setdefault(r.config_hash, r)
        return out

    def trials(self, **filters) -> list[TrialRow]:
        with self.session() as s:
            q = self._trial_query(**filters).order_by(TrialRow.id)
            rows = s.scalars(q).all()
            for r in rows:  # load relationships before the session closes
                _ = r.workload.key, r.target.key
            return list(rows)

    def best_many(self, workload_key: str | None = None, target_key: str | None = None,
                  threads: int | None = None, template: str | None = None,
                  template_version: int | None = None) -> list[Best]:
        """Best OK config per (workload, target, threads, template, version).

        A config measured several times (a final re-measurement, or several runs) is scored
        by its slowest median: it must be fast every time, so a lucky sample cannot win. A
        config with any failed measurement (flaky answer, crash) is never chosen, nor one only
        ever timed on one placement (``placements_cut``).
        """
        rows = self.trials(workload_key=workload_key, target_key=target_key, template=template,
                           template_version=template_version, threads=threads)
        groups: dict[tuple, list[TrialRow]] = {}
        for r in rows:
            k = (r.workload.key, r.target.key, r.threads, r.template, r.template_version)
            groups.setdefault(k, []).append(r)
        out = []
        for (wkey, tkey, thr, tmpl, ver), group in groups.items():
            ranked = [(sc, rs) for sc, rs in rank_configs(group) if not placements_cut(rs)]
            if not ranked:
                continue
            score, cfg_rows = ranked[0]
            first = cfg_rows[0]
            worst = max(cfg_rows, key=lambda x: x.median)
            guard = leader_guard(ranked)
            out.append(Best(workload_key=wkey, target_key=tkey, template=tmpl, template_version=ver,
                            config=Config.from_json(first.config), threads=thr, median=score,
                            gflops=worst.gflops, measurements=len(cfg_rows), trial_id=worst.id,
                            versions=dict(worst.versions), created_at=str(worst.created_at),
                            guard=guard))
        out.sort(key=lambda b: (b.workload_key, b.target_key, b.threads, b.median))
        return out

    def best(self, workload_key: str, target_key: str, threads: int | None = None,
             template: str | None = None, template_version: int | None = None) -> Best | None:
        found = self.best_many(workload_key, target_key, threads, template, template_version)
        return min(found, key=lambda b: b.median) if found else None

    def workloads_summary(self) -> list[dict]:
        """One row per (workload, target, threads): trial counts and best GFLOPS."""
        rows = self.trials()
        agg: dict[tuple, dict] = {}
        for r in rows:
            k = (r.workload.key, r.target.key, r.threads)
            a = agg.setdefault(k, {"workload": k[0], "target": k[1], "threads": k[2], "trials": 0,
                                   "ok": 0, "failed": 0, "best_gflops": None})
            a["trials"] += 1
            if r.status == Status.OK.value:
                a["ok"] += 1
                if r.gflops is not None and (a["best_gflops"] is None or r.gflops > a["best_gflops"]):
                    a["best_gflops"] = r.gflops
            else:
                a["failed"] += 1
        return list(agg.values())

    def runs(self) -> list[RunRow]:
        with self.session() as s:
            return list(s.scalars(select(RunRow).order_by(RunRow.started_at)).all())


def leader_guard(ranked: list) -> dict | None:
    """The side-by-side check against the default that decides for the leader of ``ranked``
    (``rank_configs`` pairs, best first): its own latest one, else one that covers it
    (``_covering_guard``); None when it needs one of its own."""
    if not ranked:
        return None
    score, rows = ranked[0]
    own = [g for g in ((r.info or {}).get("guard") for r in rows) if g]
    return own[-1] if own else _covering_guard(score, ranked[1:])


def _covering_guard(score: float, below: list) -> dict | None:
    """A side-by-side check against the default (``tuning.guard_against_default``) that
    decides for a leader scored ``score`` without one of its own, from the configs ranked
    below it (``below``: ``rank_configs`` pairs), latest first: an accepted check of any of
    them (faster than a config that beat the default beyond the noise, the leader beats it
    too), or a refused one of a config within that check's bar of the leader (a tie with a
    config that did not beat the default: the default is kept), or a refused one whose default
    scores within that bar of the leader (no faster than the default beyond the noise: kept
    too). None otherwise: the leader needs its own check. So ``tuning.settle_best`` does not
    check each new leader among near-equal configs in turn.

    An accepted check that also timed its config cold (``cold_margin``, ``tune model``) covers
    no other config: the ranking is by times with hot operands, and a leader faster hot can be
    the slower one cold (B read in place beat the default 1.02x hot and ran 0.89x in the
    model, Inception v2 on AMD Zen 4, 2026-12-07), so that leader gets its own check."""
    scores = {rows[0].config_hash: sc for sc, rows in below}
    for other, rows in below:
        for r in reversed(rows):
            g = (r.info or {}).get("guard")
            if not g or g.get("best") != r.config_hash:
                continue
            bar = 1 + max(g.get("noise", 0.0), g.get("min_margin", 0.02))
            default = scores.get(g.get("default"), float("inf"))
            if g.get("accepted") and "cold_margin" in g:
                continue
            if g.get("accepted") or other <= score * bar or default <= score * bar:
                return g
    return None
