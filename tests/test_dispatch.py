"""Dispatch: tuned records are used, a missing one falls back loudly, other targets never apply."""
import dataclasses

import pytest

from search_spaces.space import Config
from tuner import dispatch
from tuner.db.store import TrialRecord
from workloads.errors import NoRecordError
from tuner.measure.result import MeasureResult, Status
from tuner.target import host_target
from workloads.gemm import Gemm


@pytest.fixture(autouse=True)
def _fresh_warnings():
    dispatch._WARNED.clear()
    dispatch.forget_selections()


def record(store, w, target, cfg, median=1e-3, template_version=1):
    run = store.start_run(target, "test", "random", 1)
    store.add_trials(run, w, target, [TrialRecord("naive_gemm", template_version, Config(cfg), 1,
                                                  MeasureResult(Status.OK, [median] * 3))])


def test_fallback_warns_once_with_the_tune_command(templates, store, capsys):
    w = Gemm.parse("12x34x56")
    for _ in range(3):
        sel = dispatch.select_config(w, templates["naive"], store, threads=1)
        assert sel.source == "fallback" and sel.config == templates["naive"].default_config(w)
    err = capsys.readouterr().err
    assert err.count("no tuned config") == 1
    assert w.key in err and host_target().key in err
    assert "python -m tuner tune gemm --shape 12x34x56 --dtype float32 --threads 1" in err
    assert "may be slow" in err


def test_strict_mode_refuses_the_fallback(templates, store):
    with pytest.raises(NoRecordError, match="tune it with"):
        dispatch.select_config(Gemm.parse("3x3x3"), templates["naive"], store, threads=1, strict=True)


def test_tuned_record_is_used(templates, store, capsys):
    w, t = Gemm.parse("8x8x8"), host_target()
    record(store, w, t, {"unroll": 4})
    sel = dispatch.select_config(w, templates["naive"], store, t, threads=1)
    assert sel.source == "tuned" and sel.config == Config({"unroll": 4})
    assert capsys.readouterr().err == ""


def test_other_targets_records_are_not_applied(templates, store, capsys):
    w, t = Gemm.parse("8x8x16"), host_target()
    other = dataclasses.replace(t, cpu_name="skylake-avx512")
    record(store, w, other, {"unroll": 8})
    sel = dispatch.select_config(w, templates["naive"], store, t, threads=1)
    assert sel.source == "fallback"
    err = capsys.readouterr().err
    assert other.key in err and "not applied here" in err


def test_version_drift_is_announced_or_refused(templates, store, capsys):
    w, t = Gemm.parse("8x16x8"), host_target()
    old = dataclasses.replace(t, versions={**t.versions, "numba": "0.1.0"})
    record(store, w, old, {"unroll": 2})
    sel = dispatch.select_config(w, templates["naive"], store, t, threads=1)
    assert sel.source == "tuned" and sel.config == Config({"unroll": 2})
    assert "numba 0.1.0 ->" in capsys.readouterr().err
    with pytest.raises(NoRecordError, match="refused under --strict"):
        dispatch.select_config(w, templates["naive"], store, t, threads=1, strict=True)


def test_old_template_version_is_not_applied(templates, store):
    w, t = Gemm.parse("16x8x8"), host_target()
    record(store, w, t, {"unroll": 2}, template_version=0)
    assert dispatch.select_config(w, templates["naive"], store, t, threads=1, quiet=True).source == "fallback"


def test_tuner_gemm_api_falls_back_visibly_and_is_correct(db_url, capsys):
    import numpy as np

    import tuner

    rng = np.random.default_rng(0)
    A = rng.standard_normal((33, 17)).astype(np.float32)
    B = rng.standard_normal((17, 29)).astype(np.float32)
    C = tuner.gemm(A, B, threads=1)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    C2 = tuner.gemm(A, B, threads=1)  # second call: no second warning
    np.testing.assert_array_equal(C, C2)
    err = capsys.readouterr().err
    assert err.count("no tuned config") == 1 and "--shape 33x29x17" in err
    with pytest.raises(NoRecordError):
        tuner.gemm(A, B, threads=1, strict=True)


def test_tuner_gemm_caches_its_selection_per_process(db_url):
    """After the first call no database query is made; a trial this process writes to the
    store, or forget_selections(), makes the next call select again."""
    import numpy as np
    from sqlalchemy import event

    import tuner
    from search_spaces import get_template

    store = dispatch.open_store(db_url)
    queries = []
    event.listen(store.engine, "before_cursor_execute", lambda *a, **k: queries.append(a[2]))
    A = np.ones((9, 7), np.float32)
    B = np.ones((7, 5), np.float32)
    tuner.gemm(A, B, threads=1)
    assert queries, "the first call consults the store"
    queries.clear()
    for _ in range(3):
        C = tuner.gemm(A, B, threads=1)
    assert queries == [] and (C == 7).all()
    tuner.gemm(np.ones((9, 8), np.float32), np.ones((8, 5), np.float32), threads=1)
    assert queries, "another workload is selected afresh"

    t, w = get_template("gemm"), Gemm(9, 5, 7)
    cfg = Config({**t.default_config(w, 1), "unroll_k": 2})
    run = store.start_run(host_target(), "test", "random", 1)
    store.add_trials(run, w, host_target(), [TrialRecord("gemm", t.version, cfg, 1,
                                                         MeasureResult(Status.OK, [1e-6] * 3))])
    queries.clear()
    np.testing.assert_array_equal(tuner.gemm(A, B, threads=1), C)
    assert queries, "a trial written by this process invalidates the cached selection"
    (entry,) = [v for k, v in dispatch._SELECTED.items() if k[1:4] == (9, 5, 7)]
    assert entry[1].source == "tuned" and entry[1].config == cfg
    queries.clear()
    tuner.gemm(A, B, threads=1)
    assert queries == []
    dispatch.forget_selections(db_url)
    tuner.gemm(A, B, threads=1)
    assert queries


def test_tuner_kernel_caches_its_selection_per_process(db_url):
    """``tuner.kernel(spec)`` is cached like ``gemm``: the same Kernel object and no query on
    the second call; forget_selections() makes it select again."""
    from sqlalchemy import event

    import tuner

    store = dispatch.open_store(db_url)
    queries = []
    event.listen(store.engine, "before_cursor_execute", lambda *a, **k: queries.append(a[2]))
    k1 = tuner.kernel("gemm:9x5x7", threads=1, db=db_url)
    assert queries, "the first call consults the store"
    queries.clear()
    assert tuner.kernel("gemm:9x5x7", threads=1, db=db_url) is k1 and queries == []
    assert tuner.kernel("gemm:9x5x7", threads=2, db=db_url) is not k1, "another thread budget"
    dispatch.forget_selections(db_url)
    queries.clear()
    assert tuner.kernel("gemm:9x5x7", threads=1, db=db_url) is not k1 and queries


def test_dispatched_calls_check_their_arrays_before_the_compiled_code(db_url):
    """``tuner.gemm`` and a ``tuner.kernel`` refuse arrays the compiled code would misread or
    write past (it checks no bounds): wrong count, shape, dtype, a non-contiguous or
    read-only output, an impossible thread count; each a one-line UsageError, the output
    untouched. Array-likes and non-contiguous inputs are taken as NumPy would."""
    import numpy as np

    import tuner
    from workloads.errors import UsageError

    A = np.ones((8, 8), np.float32)
    with pytest.raises(UsageError, match="dtype 'int64' not supported"):
        tuner.gemm([[1, 2]], [[1], [2]], threads=1)        # a list is an array (of int64)
    for bad in (np.zeros((4, 4), np.float32), np.zeros((8, 8), np.float64),
                np.zeros((8, 16), np.float32)[:, ::2], np.zeros((8, 8), np.float32, order="F")):
        before = bad.copy()
        with pytest.raises(UsageError, match=r"out= must be a writable C-contiguous array of shape \(8, 8\)"):
            tuner.gemm(A, A, threads=1, out=bad)
        np.testing.assert_array_equal(bad, before)
    for threads in (0, -1, 10**6):
        with pytest.raises(UsageError, match="this machine allows 1.."):
            tuner.gemm(A, A, threads=threads)
        with pytest.raises(UsageError, match="this machine allows 1.."):
            tuner.kernel("gemm:8x8x8", threads=threads)
    out = np.zeros((8, 8), np.float32)
    tuner.gemm(A, A, threads=1, out=out)
    np.testing.assert_array_equal(out, A @ A)

    k = tuner.kernel("gemm:8x8x4", threads=1, db=db_url)      # A 8x4, B 4x8
    A4, B4 = np.ones((8, 4), np.float32), np.ones((4, 8), np.float32)
    cases = [((A4, B4), "takes 2 input.s. then 1 output.s.; got 2 arrays"),
             ((A4, B4, np.zeros((8, 4), np.float32)), r"output 0 must have shape \(8, 8\)"),
             ((A4.astype(np.float64), B4, np.zeros((8, 8), np.float32)), "input 0 must have .* float32"),
             ((A4, B4, np.broadcast_to(np.zeros(8, np.float32), (8, 8))), "read-only"),
             ((A4, B4, np.zeros((8, 8), np.float32).T.copy(order="F")), "not C-contiguous")]
    for arrays, message in cases:
        with pytest.raises(UsageError, match=message):
            k(*arrays)
    C = np.zeros((8, 8), np.float32)
    k(np.ones((8, 8), np.float32)[:, ::2], B4, C)             # a strided input is copied
    np.testing.assert_array_equal(C, A4 @ B4)
