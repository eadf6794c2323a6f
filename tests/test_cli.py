"""The command line as a user runs it: one line and exit code 2 for bad input, real runs."""
import json
import os
import subprocess
import sys

import pytest


def tuner(*args, env=None, timeout=600):
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def assert_one_line_error(p):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("args", [
    ["tune", "gemm", "--shape", "1024x"],
    ["tune", "gemm", "--shape", "0x5x5"],
    ["tune", "gemm", "--shape", "axbxc"],
    ["tune", "gemm", "--shape", "-3x4x5"],
    ["tune", "gemm", "--shape", "300000x300000x300000"],
    ["tune", "gemm"],
    ["tune", "conv9d", "--shape", "2x2x2"],
    ["tune", "gemm", "--shape", "8x8x8", "--strategy", "genetic"],
    ["tune", "gemm", "--shape", "8x8x8", "--trials", "0"],
    ["tune", "gemm", "--shape", "8x8x8", "--threads", "64"],
    ["tune", "gemm", "--shape", "8x8x8", "--dtype", "float16"],
    ["show", "gemm", "--shape", "8x8x8", "--config", "{not json"],
    ["show", "gemm", "--shape", "8x8x8", "--config", '{"tile_m": 3}'],
    ["db", "best", "--db", "nonsense://"],
    ["db", "import", "/nonexistent/file.jsonl"],
    ["tune", "gemm", "--shape", "8x8x8", "--bogus-flag"],
])
def test_bad_input_is_one_line_and_exit_2(args, db_url):
    assert_one_line_error(tuner(*args))


def test_target_json():
    p = tuner("target", "--json")
    assert p.returncode == 0
    t = json.loads(p.stdout)
    assert t["key"] and t["cores"] >= 1 and "numba" in t["versions"]
    assert "peak_gflops_per_core" not in t                  # measured only when asked
    p = tuner("target", "--peak", "--json")
    peak = json.loads(p.stdout)["peak_gflops_per_core"]
    assert p.returncode == 0 and peak["float32"] > peak["float64"] > 0
    assert json.loads(p.stdout)["peak_int8_gops_per_core"]["maddubs"] > 0
    p = tuner("target", "--peak")
    assert p.returncode == 0 and "GFLOPS per core (measured FMA" in p.stdout
    assert "int8 peak  : maddubs" in p.stdout


def test_show_prints_readable_source_and_space():
    p = tuner("show", "gemm", "--shape", "64x48x32")
    assert p.returncode == 0, p.stderr
    assert "def kernel(A, B, C, tile_m, tile_n, tile_k)" in p.stdout
    assert "# called as: kernel(A, B, C, tile_m=" in p.stdout   # the cache blocks it runs with
    p = tuner("show", "gemm", "--shape", "64x48x32", "--space")
    assert p.returncode == 0 and "tile_m" in p.stdout and "points:" in p.stdout


def test_tune_then_best_then_run_then_fallback(db_url, tmp_path):
    """The main job, end to end, on a small shape and budget."""
    p = tuner("tune", "gemm", "--shape", "96x80x64", "--trials", "4", "--batch-size", "2",
              "--log", str(tmp_path / "trials.jsonl"),
              "--threads", "1", "--repeat", "3", "--min-repeat-ms", "5", "--strategy", "random",
              "--no-progress", "--db", db_url)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ratio" in p.stdout and "x NumPy" in p.stdout and "GFLOPS" in p.stdout

    p = tuner("db", "best", "--json", "--db", db_url)
    (best,) = json.loads(p.stdout)
    assert best["workload_key"].startswith("gemm:")
    assert best["threads"] == 1 and best["versions"]["numba"] and best["target_key"]

    p = tuner("db", "history", "--db", db_url, "--workload", "96x80x64")
    assert p.returncode == 0 and "remeasure" in p.stdout

    p = tuner("run", "gemm", "--shape", "96x80x64", "--threads", "1", "--json", "--db", db_url,
              "--repeat", "3", "--min-repeat-ms", "5")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["config_source"] == "tuned" and r["config"] == best["config"] and r["gflops"] > 0
    assert "no tuned config" not in p.stderr

    # An untuned shape: a visible fallback naming workload, target and the tune command.
    p = tuner("run", "gemm", "--shape", "40x40x40", "--threads", "1", "--db", db_url,
              "--repeat", "3", "--min-repeat-ms", "5")
    assert p.returncode == 0, p.stderr
    assert "no tuned config" in p.stderr and "python -m tuner tune gemm --shape 40x40x40" in p.stderr
    p = tuner("run", "gemm", "--shape", "40x40x40", "--threads", "1", "--db", db_url, "--strict")
    assert_one_line_error(p)

    # Export, then import into a fresh database: same best.
    out = tmp_path / "trials.jsonl"
    assert tuner("db", "export", "-o", str(out), "--db", db_url).returncode == 0
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    p = tuner("db", "import", str(out), "--db", fresh)
    assert p.returncode == 0 and "imported" in p.stdout
    p = tuner("db", "best", "--json", "--db", fresh)
    assert json.loads(p.stdout)[0]["config"] == best["config"]

    # A truncated import file: one line, exit 2, nothing changed.
    out.write_text(out.read_text()[:-30])
    p = tuner("db", "import", str(out), "--db", fresh)
    assert_one_line_error(p)


def test_tune_with_cache_flush_records_the_mode(db_url, tmp_path):
    """``--cache-flush``: every candidate's timed calls start with its operands evicted, one
    call per sample, and its records say so."""
    p = tuner("tune", "gemm", "--shape", "48x40x32", "--trials", "2", "--batch-size", "2",
              "--threads", "1", "--repeat", "3", "--min-repeat-ms", "5", "--strategy", "random",
              "--cache-flush", "--no-progress", "--db", db_url, "--log", str(tmp_path / "t.jsonl"))
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "export.jsonl"
    assert tuner("db", "export", "-o", str(out), "--db", db_url).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    tuned = [r for r in rows if r.get("status") == "OK" and r.get("strategy") != "baseline"]
    assert tuned, rows[:2]
    for r in tuned:
        assert r["info"]["cache_flush"] is True and r["info"]["number"] == 1, r["info"]
    # the same workload without the flag: the two modes' times are not comparable
    before = out.read_text()
    p = tuner("tune", "gemm", "--shape", "48x40x32", "--trials", "4", "--threads", "1",
              "--no-progress", "--db", db_url, "--log", str(tmp_path / "t2.jsonl"))
    assert_one_line_error(p)
    assert "measured with --cache-flush" in p.stderr
    assert tuner("db", "export", "-o", str(out), "--db", db_url).returncode == 0
    assert out.read_text() == before                      # nothing recorded
