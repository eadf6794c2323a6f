"""Every failure kind is injected, classified with its evidence, and survived."""
import numpy as np

from search_spaces.space import Config
from tuner.measure.result import Status, summarize
from workloads.gemm import Gemm

EXPECTED = {
    "none": Status.OK,
    "compile": Status.COMPILE_ERROR,   # Numba typing error
    "syntax": Status.COMPILE_ERROR,    # the module does not even parse
    "raises": Status.RUNTIME_ERROR,
    "segfault": Status.CRASH,
    "killed": Status.CRASH,            # e.g. the OOM killer: SIGKILL from outside
    "hang": Status.TIMEOUT,
    "wrong": Status.WRONG_ANSWER,
    "unwritten": Status.WRONG_ANSWER,  # C is NaN-filled: skipped elements are caught
    "invalid": Status.INVALID,         # rejected by a constraint, never compiled
}


def test_every_status_is_classified_and_the_run_continues(templates, measurer):
    w = Gemm.parse("24x16x8")
    faults = list(EXPECTED)
    # Faults first and the good kernel last: the workers must survive (or be restarted).
    order = [f for f in faults if f != "none"] + ["none"]
    results = measurer.measure(w, templates["fault"], [Config({"fault": f}) for f in order])
    got = {f: r for f, r in zip(order, results)}
    for fault, status in EXPECTED.items():
        assert got[fault].status is status, (fault, got[fault].status, got[fault].error)
    assert "undefined_name" in got["compile"].error
    assert "SyntaxError" in got["syntax"].error
    assert "kernel refuses" in got["raises"].error
    assert "SIGSEGV" in got["segfault"].error
    assert "SIGKILL" in got["killed"].error
    assert got["hang"].error.startswith("run:") and "did not finish" in got["hang"].error
    assert "outside tolerance" in got["wrong"].error
    assert "NaN" in got["unwritten"].error
    ok = got["none"]
    assert ok.ok and len(ok.samples) == 3 and ok.compile_time > 0
    assert ok.info["cache_hits"] >= 1 and ok.info["cache_misses"] == 0  # run worker did not recompile


def test_build_timeout_is_classified():
    from fault_templates import FaultGemm

    from tuner.measure.measurer import MeasureOptions, Measurer

    w = Gemm.parse("8x8x8")
    with Measurer(MeasureOptions(build_timeout=3, build_workers=1)) as m:
        slow, good = m.measure(w, FaultGemm(["slowbuild", "none"]), [Config({"fault": "slowbuild"}),
                                                      Config({"fault": "none"})])
    assert slow.status is Status.TIMEOUT and slow.error.startswith("build:")
    assert good.ok  # the killed build worker was replaced


def test_baseline_measures_numpy(measurer):
    r = measurer.baseline(Gemm.parse("64x64x64"), threads=1)
    assert r.ok and len(r.samples) >= 3 and all(s > 0 for s in r.samples)
    assert r.info["number"] >= 1


def test_summary_statistics():
    s = summarize([4.0, 1.0, 3.0, 2.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0
    assert s["iqr"] == 2.0  # p75 4.0 - p25 2.0
    assert 4.0 < s["p95"] <= 100.0
    assert summarize([])["median"] is None


def test_baseline_of_a_fused_workload_is_its_numpy_reference(measurer):
    """Non-GEMM workloads are timed against their own NumPy implementation, not matmul."""
    from pathlib import Path

    from workloads.graph import parse
    from workloads.graph.fusion import fused_groups
    from workloads.graph.passes import optimize
    from workloads.fused import workload_for_group

    text = (Path(__file__).parents[1] / "workloads/graphs/conv_block.txt").read_text()
    g = optimize(parse(text), opt_level=2)
    w = workload_for_group(fused_groups(g)[0])
    assert w.kind == "conv2d"
    r = measurer.baseline(w, threads=1)
    assert r.ok, r.error
    assert r.info["impl"] == w.baseline_name and len(r.samples) >= 3


def test_configs_differing_only_in_runtime_knobs_share_one_compiled_module(measurer):
    """Cache blocks are kernel arguments: two configs that differ only in them generate one
    source (one content address, one kernel file), are built once, and each is checked and
    timed with its own blocks; a third differing in the micro-tile is a module of its own."""
    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("50x70x90")
    a = t.default_config(w, 1).replace(tile_m=16, tile_n=32, tile_k=32)
    b = a.replace(tile_m=48, tile_n=64, tile_k=64)
    other = a.replace(mr=4)
    assert t.codegen(w, a) == t.codegen(w, b) != t.codegen(w, other)
    assert t.runtime_args(w, a) == (16, 32, 32) and t.runtime_args(w, b) == (48, 64, 64)
    # clipped to the shape: a block past the dimension is the whole dimension
    assert t.runtime_args(w, a.replace(tile_k=128)) == (16, 32, 90)
    before = dict(measurer.counts)
    ra, rb, ro = measurer.measure(w, t, [a, b, other])
    assert ra.ok and rb.ok and ro.ok, (ra.error, rb.error, ro.error)   # both checked against NumPy
    assert ra.info["source"] == rb.info["source"] != ro.info["source"]
    assert measurer.counts["compiled"] - before["compiled"] == 2
    assert measurer.counts["measured"] - before["measured"] == 3
    # a later batch with another block size of a built module compiles nothing
    (rc,) = measurer.measure(w, t, [a.replace(tile_k=64)])
    assert rc.ok and rc.info["source"] == ra.info["source"]
    assert measurer.counts["compiled"] - before["compiled"] == 2
    assert rc.info["cache_misses"] == 0



def test_cutoff_factor_applies_from_the_first_result_of_a_batch(measurer):
    """With ``cutoff_factor`` a batch measured before anything else (a run's first) cuts a
    candidate far slower than the fastest measured before it in the batch to its one probe
    call; the fast one, measured first, gets its full measurement."""
    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("96x96x96")
    fast = t.default_config(w, 1)
    full = {k: t.space(w, 1).knob(k).values[-1] for k in ("tile_m", "tile_n", "tile_k")}
    naive = fast.replace(**full, mr=1, nr=1, loop_order="mnk", pack_a=False, pack_b=False,
                         microkernel="loops", write_cache=False, unroll_k=1)
    r_fast, r_naive = measurer.measure(w, t, [fast, naive], cutoff_factor=2.0)
    assert r_fast.ok and not r_fast.info.get("cut_short") and len(r_fast.samples) >= 3
    assert r_naive.ok and r_naive.info.get("cut_short") and len(r_naive.samples) == 1
    assert r_naive.samples[0] > 2.0 * r_fast.median
    (again,) = measurer.measure(w, t, [naive])        # no factor: measured in full
    assert again.ok and not again.info.get("cut_short")


def test_a_candidate_slower_than_the_placement_cut_is_timed_on_one_placement(measurer):
    """``placement_cut_factor``: a candidate whose first placement is slower than that multiple
    of the fastest full measurement in the batch is not timed on the other placements (its
    slowest placement could only be slower); the fast one gets every placement. A cut short
    candidate (``cutoff_s``) keeps its first placement's checked call as its one sample."""
    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("96x96x96")          # the modules of the cutoff test above: no compile
    fast = t.default_config(w, 1)
    full = {k: t.space(w, 1).knob(k).values[-1] for k in ("tile_m", "tile_n", "tile_k")}
    naive = fast.replace(**full, mr=1, nr=1, loop_order="mnk", pack_a=False, pack_b=False,
                         microkernel="loops", write_cache=False, unroll_k=1)
    n = measurer.opts.placements
    assert n > 1
    r_fast, r_naive = measurer.measure(w, t, [fast, naive], placement_cut_factor=1.25)
    assert r_fast.ok and len(r_fast.info["placements"]) == n, r_fast.error
    assert not r_fast.info.get("placements_cut")
    assert r_naive.ok and r_naive.info["placements_cut"] == n - 1
    assert len(r_naive.info["placements"]) == 1 and len(r_naive.samples) >= 3
    assert r_naive.median > 1.25 * r_fast.median
    (again,) = measurer.measure(w, t, [naive])       # no cut asked for: every placement
    assert again.ok and len(again.info["placements"]) == n
    # far slower than the cutoff: one call, timed and checked
    (cut,) = measurer.measure(w, t, [naive], cutoff_s=r_fast.median)
    assert cut.ok and cut.info["cut_short"] and cut.samples == [cut.info["placements"][0]["median"]]


def test_racing_stops_a_candidate_once_it_cannot_become_the_best(measurer):
    """``race_cut_s``: from the second placement on, a candidate whose slowest placement so far
    is slower than the best score is not timed on the rest (``placements_cut`` counts them)
    and scores its slowest placement so far; below the bar it gets every placement, and
    ``race=True`` takes the bar from the batch's fastest full measurement."""
    from search_spaces.templates.gemm import GemmTemplate

    t = GemmTemplate()
    w = Gemm.parse("96x96x96")          # the modules of the tests above: no compile
    fast = t.default_config(w, 1)
    n = measurer.opts.placements
    assert n > 2
    (raced,) = measurer.measure(w, t, [fast], race_cut_s=1e-9)     # nothing beats that
    assert raced.ok and raced.info["placements_cut"] == n - 2
    placed = raced.info["placements"]
    assert len(placed) == 2
    assert raced.median == max(p["median"] for p in placed)
    (full,) = measurer.measure(w, t, [fast], race_cut_s=10.0)      # cannot lose: all of them
    assert full.ok and len(full.info["placements"]) == n and not full.info.get("placements_cut")
    naive = fast.replace(mr=1, nr=1, loop_order="mnk", pack_a=False, pack_b=False,
                         microkernel="loops", write_cache=False, unroll_k=1)
    r_fast, r_naive = measurer.measure(w, t, [fast, naive], race=True)
    assert len(r_fast.info["placements"]) == n
    assert r_naive.ok and r_naive.info["placements_cut"] == n - 2
    assert r_naive.median > r_fast.median


def test_worker_checks_run_blas_on_one_thread(monkeypatch):
    """The worker's references and per-placement checks run with BLAS at one thread
    (``worker.serial_blas``): a multi-threaded call wakes OpenBLAS's pool threads, which then
    spin for ~0.1 s and took a core from a 2-thread kernel timed next (docs/measurement.md)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from tuner.measure import worker
    from workloads.gemm import Gemm

    def blas_threads():
        return [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]

    seen = []
    ref, check = Gemm.reference, Gemm.check
    monkeypatch.setattr(Gemm, "reference", lambda self, x: seen.append(blas_threads()) or ref(self, x))
    monkeypatch.setattr(Gemm, "check", lambda self, *a: seen.append(blas_threads()) or check(self, *a))
    w = Gemm(48, 40, 32)
    monkeypatch.setattr(worker, "_DATA", {})
    with threadpool_limits(limits=2, user_api="blas"):
        _, inputs, expected = worker._workload({"workload_key": w.key, "workload_blob": None})
        outputs = w.make_outputs()
        req = {"placements": 2, "repeat": 3, "warmup": 1, "min_repeat_ms": 1.0, "max_time_s": 0.5}
        samples, info = worker.time_placements(lambda a, b, c: np.matmul(a, b, out=c), w, inputs,
                                               outputs, expected, req)
        assert blas_threads() and max(blas_threads()) <= 2   # restored after each check
    assert len(samples) >= 3 and len(info["placements"]) == 2
    assert len(seen) == 3 and all(n and max(n) == 1 for n in seen), seen


def test_worker_imports_the_parents_tuner(monkeypatch, tmp_path):
    """A worker runs the ``tuner`` its parent runs, even when ``PYTHONPATH`` holds another
    (``pool.child_env``): a script that put an uninstalled checkout on ``sys.path`` had every
    worker die on ``import tuner`` and its build's kernels fall back to NumPy."""
    from tuner.measure.pool import Worker

    fake = tmp_path / "tuner"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('not the parent tuner')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")   # ``python -c`` puts the working directory first
    w = Worker("imports", log_dir=str(tmp_path))
    try:
        reply = w.call("ping", {}, timeout=60)
    finally:
        w.kill()
    assert reply["status"] == "OK", reply
