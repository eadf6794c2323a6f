"""Shared fixtures: an isolated kernel cache for the whole session, a fresh database per test,
and the small test templates registered under their names."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # fault_templates

# TUNER_CPU=haswell python -m pytest ...: the whole run generates, compiles and measures for
# that CPU (the AVX2 path on an AVX-512 machine), before anything is compiled.
from tuner.settings import apply_cpu_override  # noqa: E402

apply_cpu_override()

# The kernel tests: every generated kernel's source and exactness, run a second time for the
# AVX2 path (README "Install, run, test": TUNER_CPU=haswell python -m pytest -m "kernels and not
# slow"), so both ISA classes are tested on any AVX-512 machine.
KERNEL_TEST_FILES = frozenset({
    "test_gemm_template.py", "test_conv2d_template.py", "test_dense_template.py",
    "test_depthwise_template.py", "test_gemm_int8.py", "test_quant_register_requantize.py",
    "test_quant_anchor_templates.py", "test_isa.py", "test_engine_space.py",
    "test_conv_prologue.py", "test_int8_pool.py", "test_dispatch.py", "test_placement.py",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in KERNEL_TEST_FILES:
            item.add_marker(pytest.mark.kernels)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Generated kernels and Numba's cache go to a temporary folder shared by all tests, and
    by all pytest-xdist workers of the run (their base folders share a parent): a kernel
    compiled in one worker is loaded by the others. Both caches take concurrent writers (the
    kernel file by rename, Numba's index likewise), as the build workers of a tuning run do."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        cache = tmp_path_factory.getbasetemp().parent / "tuner-cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("tuner-cache")
    old = os.environ.get("TUNER_CACHE")
    os.environ["TUNER_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("TUNER_CACHE", None)
    else:
        os.environ["TUNER_CACHE"] = old


@pytest.fixture
def db_url(tmp_path, monkeypatch) -> str:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    monkeypatch.setenv("TUNER_DB", url)
    return url


@pytest.fixture
def store(db_url):
    from tuner.db.store import Store

    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture(scope="session")
def templates():
    from fault_templates import FaultGemm, NaiveGemm

    from search_spaces import register_template

    naive, fault = NaiveGemm(), FaultGemm()
    register_template(naive.name, naive)
    register_template(fault.name, fault)
    return {"naive": naive, "fault": fault}


@pytest.fixture(scope="session")
def measurer():
    """One pair of worker pools for the session (Numba import costs ~1 s per worker)."""
    from tuner.measure.measurer import MeasureOptions, Measurer

    m = Measurer(MeasureOptions(threads=1, repeat=3, min_repeat_ms=2, max_time_s=1,
                                run_timeout=8, build_timeout=60, build_workers=2))
    yield m
    m.close()


@pytest.fixture(scope="session")
def pg_base_url():
    """URL of a PostgreSQL server for the session (started here), or skip with the reason."""
    url = os.environ.get("TUNER_TEST_PG_URL")
    if url:
        yield url
        return
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg not installed (pip install -e '.[test]')")
    from pg_server import PgServer, Unavailable

    try:
        server = PgServer()
        url = server.start()
    except Unavailable as exc:
        pytest.skip(f"no PostgreSQL server could be started: {exc}")
    yield url
    server.stop()


@pytest.fixture
def pg_url(pg_base_url):
    """A fresh database on the session's PostgreSQL server for each test."""
    import uuid

    from sqlalchemy import create_engine, text

    name = "t_" + uuid.uuid4().hex[:12]
    admin = create_engine(pg_base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    yield pg_base_url.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture
def fit_to_cpu(monkeypatch):
    """``fit_to_cpu(name)``: the defaults fitted to the named CPU of ``isa.KNOWN_CPUS`` as if
    Numba compiled for it (``isa.compile_cpu`` patched, its feature cache cleared); call again
    to switch, undone after the test."""
    from search_spaces import isa

    def fit(name: str) -> None:
        monkeypatch.setattr(isa, "compile_cpu", lambda: (name, isa.known_cpu_features(name), True))
        isa._features_of.cache_clear()

    yield fit
    isa._features_of.cache_clear()
