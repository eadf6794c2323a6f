"""Benchmarks run end to end on tiny shapes (their speed is not asserted: that is the
benchmark's job on a quiet machine, not a unit test's)."""
import json
from pathlib import Path

from test_cli import assert_one_line_error, tuner


def test_bench_gemm_writes_json_csv_and_table(db_url, tmp_path):
    out = tmp_path / "b.json"
    p = tuner("bench", "gemm", "--shapes", "32x32x32,17x9x5", "--dtypes", "float32,float64",
              "--threads", "1", "--repeat", "3", "--min-repeat-ms", "2", "--out", str(out), "--db", db_url)
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert data["target"]["key"] and data["measured_ghz"] > 0 and data["target"]["versions"]["numba"]
    assert len(data["rows"]) == 4
    for r in data["rows"]:
        assert r["status"] == "OK" and r["ratio"] > 0 and r["config_source"] == "fallback"
        assert len(r["kernel_samples"]) >= 6 and len(r["numpy_samples"]) >= 6  # two rounds each
        assert r["kernel_placement_spread"] >= 0 and r["numpy_placement_spread"] >= 0
        # the dispatched path, timed in a fresh process, selected the same config
        assert r["dispatched_median_s"] > 0 and "dispatched_config" not in r, r.get("dispatched_error")
        assert r["dispatched_vs_worker"] == r["dispatched_median_s"] / r["kernel_median_s"]
        assert len(r["dispatched_rounds"]) == 3 and r["dispatched_vs_worker_cpu"] > 0
        assert r["kernel_cpu_placement_spread"] >= 0
    assert (tmp_path / "b.csv").read_text().count("\n") == 5
    assert "| 1 | float64 | 17x9x5 | fallback |" in p.stdout
    rep = tuner("bench", "report", str(out))
    assert rep.returncode == 0 and "call overhead" in rep.stdout


def test_bench_ladder_measures_every_step(db_url, tmp_path):
    out = tmp_path / "l.json"
    p = tuner("bench", "ladder", "--shape", "48x40x32", "--threads", "1", "--repeat", "3",
              "--min-repeat-ms", "2", "--out", str(out), "--db", db_url)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["rows"]
    steps = [r["step"] for r in rows]
    assert steps[:7] == ["naive", "blocking", "vectorization", "loop permutation", "packing",
                         "write cache", "parallel"] and steps[7].startswith("tuned")
    for r in rows:
        assert r["status"] in ("OK", "SKIPPED"), r
    assert [r["status"] for r in rows].count("OK") >= 7


def test_bench_bad_input(db_url):
    assert_one_line_error(tuner("bench", "gemm", "--shapes", "12xx", "--db", db_url))
    assert_one_line_error(tuner("bench", "gemm", "--threads", "0", "--db", db_url))
    assert_one_line_error(tuner("bench", "report", "/nonexistent.json"))


def test_bench_compare_remeasures_each_databases_best(tmp_path):
    """Two tuning runs of one shape (different budgets) in two databases: each best is
    re-measured beside NumPy in one run, with what its run cost."""
    dbs = []
    for name, trials in (("short", 1), ("long", 2)):
        url = f"sqlite:///{tmp_path / name}.db"
        p = tuner("tune", "gemm", "--shape", "24x40x16", "--trials", str(trials), "--threads", "1",
                  "--strategy", "random", "--db", url, "--log", "", "--no-progress")
        assert p.returncode == 0, p.stderr
        dbs.append(url)
    out = tmp_path / "c.json"
    p = tuner("bench", "compare", "--shape", "24x40x16", "--dbs", ",".join(dbs), "--threads", "1",
              "--rounds", "2", "--repeat", "3", "--min-repeat-ms", "2", "--out", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert [e["configs"] for e in data["entries"]] == [1, 2]
    for e in data["entries"]:
        assert e["wall_s"] > 0 and len(e["samples"]) >= 6 and e["ratio"] > 0
        assert 0 < e["of_best"] <= 1
        # what the database dispatches: its best, or the default that best did not beat
        assert e["selected"] in ("best", "default kept")
        assert (e["config"] == e["best_config"]) == (e["selected"] == "best")
    assert max(e["of_best"] for e in data["entries"]) == 1.0
    assert "| configs measured |" in p.stdout
    rep = tuner("bench", "report", str(out))
    assert rep.returncode == 0 and "of best" in rep.stdout
    # a database without a record of the shape, and a missing file: one line, exit 2
    assert_one_line_error(tuner("bench", "compare", "--shape", "8x8x8", "--dbs", dbs[0], "--threads", "1"))
    assert_one_line_error(tuner("bench", "compare", "--dbs", str(tmp_path / "none.db"), "--threads", "1"))


def test_bench_placement_times_every_contender_on_every_placement(tmp_path):
    out = tmp_path / "p.json"
    p = tuner("bench", "placement", "--shape", "32x48x16", "--configs", '[{}, {"unroll_k": 2}]',
              "--rounds", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert [r["name"] for r in data["rows"]] == ["config0", "config1", "numpy"]
    for r in data["rows"]:
        assert len(r["per_placement_s"]) == len(data["placements"]) == 14
        assert r["min_s"] <= r["median_s"] <= r["max_s"] and r["spread"] >= 0
    assert "| numpy |" in p.stdout
    assert_one_line_error(tuner("bench", "placement", "--configs", "{nope"))
    assert_one_line_error(tuner("bench", "placement", "--shape", "8x8x8", "--configs", '[{"mr": 5}]'))


CONV_BLOCK = str(Path(__file__).resolve().parents[1] / "workloads" / "graphs" / "conv_block.txt")


def test_bench_tiles_times_each_default_against_its_variants(tmp_path):
    """``bench tiles``: per task the default and each variant timed in both orders; a variant
    the space refuses (or that repairs to the default) has no ratio, an unknown knob is a
    one-line error."""
    out = tmp_path / "t.json"
    p = tuner("bench", "tiles", CONV_BLOCK, "--tasks", "1", "--variants",
              '[{"mr": 4}, {"mr": 5}]', "--out", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["default_s"] > 0 and row["gemm"].startswith("M")
    four, five = row["variants"]
    assert four["config"]["mr"] == 4 and four["ratio"] > 0 and four["seconds"] > 0
    assert five["config"] is None and five["ratio"] is None      # mr=5 is not in the space
    assert five["skipped"] == "refused" and "| refused |" in p.stdout   # and the table says so
    rep = tuner("bench", "report", str(out))
    assert rep.returncode == 0 and '{"mr":4}' in rep.stdout
    bad = tuner("bench", "tiles", CONV_BLOCK, "--variants", '[{"nope": 1}]')
    assert_one_line_error(bad)
    assert "unknown knob" in bad.stderr
    bad = tuner("bench", "tiles", CONV_BLOCK, "--variants", "[]")
    assert_one_line_error(bad)
    assert "--variants" in bad.stderr
    bad = tuner("bench", "tiles", CONV_BLOCK, "--rows", "7", "--variants", '[{"mr": 4}]')
    assert_one_line_error(bad)                                   # no task has 7 GEMM rows
    assert "with 7 GEMM rows" in bad.stderr


def test_bench_cache_times_each_kernel_in_the_model_and_alone(tmp_path):
    """``bench cache``: every conv/dense kernel of the built model timed in the model, back to
    back and flushed; sums and ratios in the table; bad input one line."""
    out = tmp_path / "c.json"
    p = tuner("bench", "cache", CONV_BLOCK, "--rounds", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    kinds = {r["kind"] for r in data["rows"]}
    assert kinds == {"conv2d", "dense"} and len(data["rows"]) >= 3
    for r in data["rows"]:
        assert r["model_s"] > 0 and r["back_to_back_s"] > 0 and r["flushed_s"] > 0
    assert abs(data["totals"]["flushed_s"] - sum(r["flushed_s"] for r in data["rows"])) < 1e-12
    rep = tuner("bench", "report", str(out))
    assert rep.returncode == 0 and "model / flushed" in rep.stdout and "sum of" in rep.stdout
    assert_one_line_error(tuner("bench", "cache", CONV_BLOCK, "--rounds", "0"))
    assert_one_line_error(tuner("bench", "cache", "/nonexistent.onnx"))


def test_measured_fma_peak_halves_for_float64():
    """The "% peak" denominator is measured (FMA chains at the compile target's vector width),
    not read from a table; float64 has half the lanes of float32 at the same FMA rate."""
    import math

    from tuner.bench.peak import measured_fma_gflops, peak_gflops
    from tuner.target import host_target

    f32, f64 = measured_fma_gflops("float32"), measured_fma_gflops("float64")
    assert math.isfinite(f32) and f32 > 1.0
    assert 0.25 < f64 / f32 < 0.8, (f32, f64)
    assert peak_gflops(host_target(), "float32", 2) == 2 * f32
    assert peak_gflops(host_target(), "int8", 1) is None


def test_measured_int8_dot_peak_is_bounded_by_the_instructions():
    """The int8 ceilings ``bench int8`` prints are multiplies the loop really issues: a
    multiply hoisted out of the loop (its operands loop-invariant) would read ~8x the FMA
    peak; a 256/512-bit dot product does at most 4x the fp32 FMA's operations per
    instruction (``vpdpbusd``: 64 MACs against 16 FMAs at 512 bits)."""
    from tuner.bench.peak import core_peaks, peaks_line

    peaks = core_peaks()
    f = peaks["fp32_fma_gflops"]
    assert {"maddubs", "madd16"} <= set(peaks), peaks
    for dot in set(peaks) - {"fp32_fma_gflops"}:
        assert 0.2 < peaks[dot] / f < 4.5, (dot, peaks)
    assert "fp32 FMA" in peaks_line(peaks) and "maddubs" in peaks_line(peaks)


def test_int8_arithmetic_note_and_stored_peaks(tmp_path, monkeypatch):
    """``build --int8`` says what INT8 can gain in arithmetic on this core, warning under
    ``INT8_ARITHMETIC_GAIN``; the ceilings are measured once per target and kept in the
    kernel cache, a broken file measured again."""
    from tuner.bench import peak

    zen2 = {"fp32_fma_gflops": 99.5, "maddubs": 96.5, "madd16": 99.8}
    note = peak.int8_arithmetic_note(zen2)
    assert note.startswith("note: int8 arithmetic on this core: madd16 100 GOPS = 1.00x"), note
    assert "not arithmetic" in note
    vnni = {"fp32_fma_gflops": 100.0, "maddubs": 100.0, "vnni": 390.0}
    assert peak.int8_arithmetic_note(vnni).startswith("int8 arithmetic on this core: vnni 390 GOPS = 3.90x")

    monkeypatch.setenv("TUNER_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(peak, "core_peaks", lambda: calls.append(1) or dict(zen2))
    assert peak.stored_core_peaks() == zen2 and peak.stored_core_peaks() == zen2
    assert len(calls) == 1
    (tmp_path / "peaks.json").write_text("{not json")
    assert peak.stored_core_peaks() == zen2 and len(calls) == 2
    assert peak.stored_core_peaks() == zen2 and len(calls) == 2
