"""``python -m tuner passes FILE``: output, dumps, and one-line errors for bad input."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONV_BLOCK = str(ROOT / "workloads" / "graphs" / "conv_block.txt")
MLP = str(ROOT / "workloads" / "graphs" / "mlp.txt")


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_passes_reports_each_pass_groups_and_traffic(level, capsys):
    assert main(["passes", CONV_BLOCK, "--opt-level", str(level)]) == 0
    out = capsys.readouterr().out
    assert f"opt level {level}" in out and "InferType" in out and "FuseOps" in out
    assert "fused groups (" in out and "fusion saves" in out
    if level >= 2:
        assert "conv2d + [add -> relu]" in out and "FoldScaleAxis" in out
    if level == 3:
        assert "ConvertLayout" in out


def test_passes_dump_shows_ir_after_each_pass(capsys):
    assert main(["passes", MLP, "--dump", "-O", "2"]) == 0
    out = capsys.readouterr().out
    assert "# ---- IR before passes" in out and "# ---- IR after InferType: unchanged" in out
    assert "# ---- IR after FoldConstant" in out and "constant_of_shape" in out
    assert "elided=8192" in out  # the folded weight is abbreviated
    assert "%r1 = fused(%x, %w1, %b1) : float32[8, 128] graph fused_dense_add_relu(" in out


def test_passes_disable_and_group_size(capsys):
    assert main(["passes", MLP, "--disable", "FoldConstant,EliminateCommonSubexpr", "--max-group-size", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"FoldConstant +- +skipped \(disabled\)", out)
    assert "constant_of_shape" in out  # not folded, so it is a group of its own


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("graph g(%x: float32[2]) {\n  %y = relu(%x)\n  %z = frob(%y)\n  return %z\n}", "line 3: unknown op 'frob'"),
    ("graph g(%x: float32[2]) {\n  %y = relu(%q)\n  return %y\n}", "line 2: %y uses undefined value %q"),
    ("graph g(%x: float32[2]) {\n  %y = add(%x, %w)\n  %w = const(fill=1.0) : float32[3]\n  return %y\n}",
     "line 2: %y = add.*do not broadcast"),
    ("not a graph", "line 1: expected 'graph'"),
    (b"\xff\xfe", "cannot read"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, content, message):
    path = tmp_path / "g.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["passes", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert re.search(message, err), err


def test_unknown_disabled_pass_and_onnx_placeholder(tmp_path, capsys):
    assert main(["passes", MLP, "--disable", "FoldEverything"]) == 2
    assert "unknown pass 'FoldEverything'" in capsys.readouterr().err
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"")
    assert main(["passes", str(onnx)]) == 2


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "tuner", "passes", MLP, "-O", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "dense + [add -> relu]" in proc.stdout


def test_full_constant_dumps_parse_back(capsys):
    from workloads.graph import parse
    from workloads.graph.passes import optimize
    from workloads.graph.text import load
    assert main(["passes", CONV_BLOCK, "--dump", "--full-constants"]) == 0
    out = capsys.readouterr().out
    block = out.split("# ---- IR after FuseOps\n", 1)[1]
    block = block[:block.index("\n}\n") + 3]
    from tuner.compiler.compile_model import default_opt_level
    graph = load(CONV_BLOCK)
    assert parse(block) == optimize(graph, default_opt_level(graph))
