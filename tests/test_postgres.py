"""Several machines, one store: tuners sharing a real PostgreSQL server never measure a config
twice, and a dead tuner's claims expire. Skipped (with the reason) where no server can start."""
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from search_spaces.space import Config
from tuner.db.claims import Claims
from tuner.db.models import utcnow
from tuner.db.store import Store
from tuner.target import host_target
from workloads.gemm import Gemm

SCRIPT = str(Path(__file__).parent / "tune_script.py")


def test_store_round_trip_on_postgres(pg_url):
    from test_db import fill

    s = Store(pg_url)
    t = fill(s)
    assert s.best(Gemm(16, 16, 16).key, t.key, 1).config == Config({"a": 3})
    Store(pg_url).close()  # reopening checks the stored schema version


def test_three_tuners_share_one_postgres_database(pg_url):
    procs = [subprocess.Popen([sys.executable, SCRIPT, pg_url, "12", str(seed)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for seed in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    rows = Store(pg_url).trials()
    hashes = [r.config_hash for r in rows]
    assert len(hashes) == len(set(hashes)) and 12 <= len(rows) <= 12 + 3 * 2


def test_claims_block_others_and_expire(pg_url):
    s, w, t = Store(pg_url), Gemm(16, 16, 16), host_target()
    a = Claims(s, s.start_run(t, "a", "random", 1), w, t, "x", 1, 1, ttl=60)
    b = Claims(s, s.start_run(t, "b", "random", 1), w, t, "x", 1, 1, ttl=60)
    cfgs = [Config({"v": i}) for i in range(4)]
    assert a.claim(cfgs[:3]) == cfgs[:3]
    assert b.claim(cfgs) == [cfgs[3]]  # the first three are a's
    # a's owner stops renewing (it died on another machine): its claims expire
    from sqlalchemy import update

    from tuner.db.models import ClaimRow

    with s.session() as sess:
        sess.execute(update(ClaimRow).where(ClaimRow.run_id == a.run_id)
                     .values(expires_at=utcnow() - timedelta(seconds=1), host="elsewhere"))
    assert b.claim(cfgs[:3]) == cfgs[:3]


def test_two_sessions_racing_to_create_one_workload_row(pg_url):
    """READ COMMITTED: both sessions see no row, both insert; the second insert waits for the
    first commit and fails on the unique key. The loser must read the winner's row, not fail
    (CI once saw 'duplicate key value violates unique constraint workload_key_key')."""
    import threading
    import time

    a, b, w = Store(pg_url), Store(pg_url), Gemm(8, 8, 8)
    got, first_inserted = {}, threading.Event()

    def winner():
        with a.session() as s:
            got["a"] = a._workload(s, w).id
            first_inserted.set()
            time.sleep(0.5)  # b's select runs now and sees nothing committed

    th = threading.Thread(target=winner)
    th.start()
    first_inserted.wait(10)
    with b.session() as s:
        got["b"] = b._workload(s, w).id
    th.join()
    assert got["a"] == got["b"]
