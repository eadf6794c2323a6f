"""``bench model``: every experiment row measured in one run, written as JSON; bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the optional extra .[onnx] is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime (extra .[onnx]) is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _tiny(path: Path) -> str:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1)]
    # Shapes as in test_verify's model: after the passes the same kernels (compiled once).
    shapes = {"w": (8, 3, 3, 3), "s": (8,), "b": (8,), "m": (8,), "v": (8,), "wf": (5, 8),
              "bf": (5,)}
    inits = [numpy_helper.from_array(np.abs(rng.standard_normal(s)).astype(np.float32), n)
             for n, s in shapes.items()]
    g = helper.make_graph(nodes, "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def _bench(*args, tmp_path):
    return subprocess.run([sys.executable, "-m", "tuner", "bench", "model", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env={**os.environ, "TUNER_DB": f"sqlite:///{tmp_path / 't.db'}"})


def test_bench_model_rows(tmp_path):
    model = _tiny(tmp_path / "tiny.onnx")
    out = tmp_path / "bench.json"
    r = _bench(model, "--threads", "1", "--repeat", "4", "--rounds", "2", "--out", str(out),
               tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["kind"] == "bench-model" and data["versions"]["onnxruntime"]
    assert data["rounds"] == 2 and all(len(row["samples_ms"]) == 6 for row in data["rows"])
    rows = {row["group"]: row for row in data["rows"]}
    assert set(rows) == set("ANBCD")
    for g, row in rows.items():
        assert row["threads"] == 1 and 0 < row["p50_ms"] <= row["p95_ms"]
        assert len(row["samples_ms"]) >= 4 and row["max_abs_err"] < 1e-4
        assert row["vs_numpy"] > 0 and row["vs_ort"] > 0
        # Process CPU time of the same samples, and ratios of it.
        assert len(row["cpu_samples_ms"]) == len(row["samples_ms"]) and row["cpu_p50_ms"] > 0
        assert row["vs_numpy_cpu"] > 0 and row["vs_ort_cpu"] > 0
    assert rows["A"]["max_abs_err"] == 0.0
    # Without passes every op is a kernel (the batch norm's arithmetic included).
    assert rows["B"]["counts"]["fallback"] > rows["C"]["counts"]["fallback"]
    assert rows["C"]["overhead_ms"] < rows["C"]["p50_ms"]
    assert "| A | ONNX Runtime |" in r.stdout
    rep = subprocess.run([sys.executable, "-m", "tuner", "bench", "report", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert rep.returncode == 0 and "| D | built + passes + tuned |" in rep.stdout


def test_bench_two_models_one_table_with_hotspots(tmp_path):
    """Two models in one command: one JSON with both, a summary line per model and thread
    count, and each built row says where its time goes (largest kernels beside BLAS)."""
    a = _tiny(tmp_path / "tiny.onnx")
    b = _tiny(tmp_path / "tiny2.onnx")
    out = tmp_path / "bench.json"
    r = _bench(a, b, "--threads", "1", "--groups", "ACL", "--repeat", "3", "--out", str(out),
               tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["kind"] == "bench-models" and len(data["models"]) == 2
    assert "| model | threads | A ms | C ms | L ms | C vs A | L vs A |" in r.stdout
    rows = {row["group"]: row for row in data["models"][0]["rows"]}
    spots = rows["C"]["hotspots"]
    assert spots and abs(sum(s["share"] for s in spots) - 1.0) < 0.01   # 3 kernels: all listed
    conv = [s for s in spots if s["kind"] == "conv2d"][0]
    assert conv["gemm"] == "M8 N144 K27" and conv["blas_ms"] > 0 and conv["gflops"] > 0
    # group L: the O3 (NHWC) build, whose conv is a direct one with pixels as GEMM rows
    assert rows["L"]["graph_passes"] == "O3" and rows["L"]["max_abs_err"] < 1e-4
    (conv3,) = [s for s in rows["L"]["hotspots"] if s["kind"] == "conv2d"]
    assert conv3["gemm"] == "M144 N8 K27"
    assert "where the time goes, group C" in r.stdout
    rep = subprocess.run([sys.executable, "-m", "tuner", "bench", "report", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert rep.returncode == 0 and "| model | threads |" in rep.stdout


@pytest.mark.parametrize("args", [["missing.onnx"], ["workloads/graphs/mlp.txt"],
                                  ["M.onnx", "--groups", "AXZ"], ["M.onnx", "--threads", "0"],
                                  ["missing.onnx", "missing2.onnx"], ["M.onnx", "--rounds", "0"]])
def test_bench_model_bad_input(args, tmp_path):
    r = _bench(*args, tmp_path=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_bench_layers_pairs_each_kernel_with_ort_nodes(tmp_path):
    """``bench layers``: every kernel of the build profiled beside ONNX Runtime's nodes, each
    ORT node credited to the group computing its value (ORT fuses conv + bn + relu into one
    node, ours into one group), every ORT node counted once."""
    model = _tiny(tmp_path / "tiny.onnx")
    out = tmp_path / "layers.json"
    r = subprocess.run([sys.executable, "-m", "tuner", "bench", "layers", model, "--threads", "1",
                        "--repeat", "3", "--out", str(out)], capture_output=True, text=True,
                       cwd=ROOT, timeout=900,
                       env={**os.environ, "TUNER_DB": f"sqlite:///{tmp_path / 't.db'}"})
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["kind"] == "bench-layers" and data["versions"]["onnxruntime"]
    rows = {row["kind"]: row for row in data["rows"]}
    conv, dense = rows["conv2d"], rows["dense"]
    assert conv["ours_ms"]["1"] > 0 and conv["ort_ms"]["1"] > 0 and conv["ort_nodes"]
    assert dense["ort_ms"]["1"] > 0 and dense["gemm"].startswith("M1 ")
    tot = data["totals"]["1"]
    matched = sum(row["ort_ms"].get("1", 0.0) for row in data["rows"])
    assert abs(matched + tot["ort_unmatched_ms"] - tot["ort_ms"]) < 1e-6   # every node counted once
    assert "| kernel | group | GEMM | ours 1t ms | ORT 1t ms |" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "tuner", "bench", "layers", "missing.onnx"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")
