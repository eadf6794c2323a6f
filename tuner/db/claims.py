"""Claims: a candidate is claimed before it is measured, so several tuner processes (on one
machine or many, sharing one database) never measure the same config twice.

``Claims.claim(configs)`` returns the configs this run now owns: not measured yet, and not
claimed by a live owner. Claims expire after ``ttl`` seconds unless renewed; a heartbeat
thread renews this run's claims, so a tuner killed with SIGKILL loses only its in-flight
candidates, which other tuners (or the next run) pick up once the claims expire. A claim held
by a dead process on this same host is released at once. Recording a trial deletes its claim
in the same transaction (``Store.add_trials(..., run_id)``).
"""
from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta
from typing import Sequence

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from search_spaces.space import Config
from tuner.db.models import ClaimRow, TrialRow, utcnow
from tuner.db.store import Store

HOST = socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, owned by someone else
        return True
    return True


class Claims:
    def __init__(self, store: Store, run_id: str, workload, target, template: str,
                 template_version: int, threads: int, ttl: float = 120.0):
        self.store = store
        self.run_id = run_id
        self.workload, self.target = workload, target
        self.template, self.version, self.threads = template, template_version, threads
        self.ttl = ttl
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _scope(self, s):
        w = self.store._workload(s, self.workload)
        t = self.store._target(s, self.target)
        return w.id, t.id

    def _filters(self, cls, wid: int, tid: int):
        return [cls.workload_id == wid, cls.target_id == tid, cls.template == self.template,
                cls.template_version == self.version, cls.threads == self.threads]

    def claim(self, configs: Sequence[Config]) -> list[Config]:
        now = utcnow()
        owned: list[Config] = []
        with self.store.session() as s:
            wid, tid = self._scope(s)
            f = self._filters(ClaimRow, wid, tid)
            s.execute(delete(ClaimRow).where(*f, ClaimRow.expires_at < now))
            for c in s.scalars(select(ClaimRow).where(*f, ClaimRow.host == HOST)).all():
                if c.run_id != self.run_id and not _pid_alive(c.pid):
                    s.delete(c)  # its tuner died on this host: no need to wait for expiry
            s.flush()
            for cfg in configs:
                try:
                    with s.begin_nested():
                        s.add(ClaimRow(workload_id=wid, target_id=tid, template=self.template,
                                       template_version=self.version, threads=self.threads,
                                       config_hash=cfg.hash, run_id=self.run_id, host=HOST,
                                       pid=os.getpid(), expires_at=now + timedelta(seconds=self.ttl)))
                except IntegrityError:
                    continue  # a live claim by another tuner
                # Measured meanwhile by another tuner? (their trial and claim-release commit together)
                done = s.scalar(select(TrialRow.id).where(*self._filters(TrialRow, wid, tid),
                                                          TrialRow.config_hash == cfg.hash).limit(1))
                if done is not None:
                    s.execute(delete(ClaimRow).where(*f, ClaimRow.config_hash == cfg.hash,
                                                     ClaimRow.run_id == self.run_id))
                    continue
                owned.append(cfg)
        return owned

    def renew(self) -> None:
        with self.store.session() as s:
            s.execute(update(ClaimRow).where(ClaimRow.run_id == self.run_id)
                      .values(expires_at=utcnow() + timedelta(seconds=self.ttl)))

    def release_all(self) -> None:
        with self.store.session() as s:
            s.execute(delete(ClaimRow).where(ClaimRow.run_id == self.run_id))

    # -- heartbeat ----------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - a missed beat only shortens the claim
                pass

    def __enter__(self) -> "Claims":
        self._thread = threading.Thread(target=self._beat, name="tuner-claims", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.release_all()
        except Exception:  # noqa: BLE001 - expiry cleans up what we could not
            pass
