"""``verify``: the built module against ONNX Runtime on the same (random) weights.

SqueezeNet, ResNet-50 at one thread, ShuffleNet and AlexNet (at 1 and 2 threads) run by
default; the nine light models at 1 and 2 threads (DenseNet-121, Inception v1/v2, VGG-19,
ZFNet-512 and the rest) are marked slow: ``python -m pytest -m slow tests/test_verify.py``
(19 minutes from a cold kernel cache on the 2-core Zen 3 under load 7-10)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the optional extra .[onnx] is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime (extra .[onnx]) is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tuner.compiler.verify_model import compare, verify_onnx  # noqa: E402
from workloads.errors import UsageError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _verify_cli(model: str, *extra: str, env=None):
    return subprocess.run([sys.executable, "-m", "tuner", "verify", model, "--threads", "1", *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          env={**os.environ, **(env or {})})


def _errors(stdout: str) -> tuple[float, float]:
    m = re.search(r"max abs error (\S+), max rel error (\S+)", stdout)
    assert m, stdout
    return float(m.group(1)), float(m.group(2))


def _check_light(name: str, tmp_path, *extra: str) -> str:
    r = _verify_cli(os.path.join(LIGHT, f"light_{name}.onnx"), "--random-weights", "7", *extra,
                    env={"TUNER_DB": f"sqlite:///{tmp_path / 't.db'}"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"built light_{name}: ") and "PASS" in r.stdout
    abs_err, rel_err = _errors(r.stdout)
    assert abs_err < 1e-4 and np.isfinite(rel_err)
    print(f"{name}: max abs {abs_err:.3g}, max rel {rel_err:.3g}")
    return r.stdout


def test_verify_light_squeezenet(tmp_path):
    _check_light("squeezenet", tmp_path)


def test_verify_light_resnet50_at_one_thread(tmp_path):
    """The real ResNet-50 architecture (random calibrated weights) against ONNX Runtime, in
    the default run: the smallest setting that is still the whole model."""
    _check_light("resnet50", tmp_path, "--threads", "1")


@pytest.mark.parametrize("name,threads", [
    ("shufflenet", "1"), ("shufflenet", "2"), ("bvlc_alexnet", "1"),
    # AlexNet's 240 MB of weights take ~35 s per build; its two grouped convs at 2 threads
    # are what ShuffleNet's 48 grouped/depthwise convs already cover in the default run
    pytest.param("bvlc_alexnet", "2", marks=pytest.mark.slow)])
def test_verify_grouped_and_depthwise_models(name, threads, tmp_path):
    """ShuffleNet (grouped 1x1 and depthwise 3x3 convs, channel shuffles, concatenate ->
    relu) and AlexNet (grouped convs) at 1 and 2 threads, every group a generated kernel."""
    from tuner.target import usable_cores

    if int(threads) > usable_cores():
        pytest.skip(f"needs {threads} usable cores, this machine has {usable_cores()}")
    out = _check_light(name, tmp_path, "--threads", threads)
    assert " 0 numpy;" in out.splitlines()[0], out.splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("name", ["densenet121", "inception_v1", "inception_v2", "resnet50",
                                  "squeezenet", "vgg19", "zfnet512"])
def test_verify_light_models(name, threads, tmp_path):
    """The other light models at 1 and 2 threads (with the default run's, all nine at both),
    every group a generated kernel."""
    from tuner.target import usable_cores

    if int(threads) > usable_cores():
        pytest.skip(f"needs {threads} usable cores, this machine has {usable_cores()}")
    out = _check_light(name, tmp_path, "--threads", threads)
    assert " 0 numpy;" in out.splitlines()[0], out.splitlines()[0]


def _small_model(path: Path) -> str:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1)]
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (8, 3, 3, 3)), ("b", (8,)), ("wf", (5, 8)), ("bf", (5,)))]
    g = helper.make_graph(nodes, "small",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def test_verify_own_weights_and_failure_exit_code(tmp_path, monkeypatch):
    model = _small_model(tmp_path / "small.onnx")
    env = {"TUNER_DB": f"sqlite:///{tmp_path / 't.db'}"}
    r = _verify_cli(model, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the model's weights" in r.stdout
    # An answer off by 0.2% (twice rtol, whatever the outputs' magnitude) is caught.
    from tuner.compiler.module import Module

    real = Module.run
    monkeypatch.setattr(Module, "run",
                        lambda self, x, copy=True: [o + 2e-3 * (np.abs(o) + 1) for o in real(self, x)])
    res = verify_onnx(model, seed=1, threads=1, db=env["TUNER_DB"])
    assert not res.ok and res.max_abs >= 2e-3


def test_compare_reports_abs_and_rel_errors():
    e = np.array([1.0, -2.0, 1e-6], np.float64)
    c = compare("y", e + np.array([1e-5, 0, 1e-5]), e, 1e-3, 1e-4)
    # max rel skips |expected| < atol (1e-6 here), where a relative error means nothing
    assert c.ok and abs(c.max_abs - 1e-5) < 1e-12 and abs(c.max_rel - 1e-5) < 1e-12
    c = compare("y", e * 1.01, e, 1e-3, 1e-4)
    assert not c.ok and abs(c.max_rel - 0.01) < 1e-4
    assert not compare("y", np.full(3, np.nan, np.float32), e, 1e-3, 1e-4).ok
    assert not compare("y", e[:2], e, 1e-3, 1e-4).ok


@pytest.mark.parametrize("args", [["workloads/graphs/mlp.txt"], ["missing.onnx"],
                                  ["--random-weights", "-1"]])
def test_verify_bad_input_exit_2(args, tmp_path):
    if args[0] == "--random-weights":
        args = [_small_model(tmp_path / "s.onnx"), *args]
    r = _verify_cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: ")


def test_missing_onnxruntime_is_a_usage_error(monkeypatch):
    from tuner.compiler.verify_model import ort_session

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(UsageError, match="pip install"):
        ort_session(b"", 1)


@pytest.mark.parametrize("name", ["bvlc_alexnet", pytest.param("densenet121", marks=pytest.mark.slow),
                                  "inception_v1", "inception_v2", "resnet50", "shufflenet",
                                  "squeezenet", "vgg19", "zfnet512"])
def test_light_models_plan_no_numpy_groups(name):
    """Every fused group of the nine light models (O2, 2 threads) gets a generated kernel,
    none on the injective template's array-code formulation (planning and code generation
    only: nothing compiles; DenseNet-121's 188 groups take minutes under load: slow)."""
    from tuner.compiler.compile_model import pipeline, plan_groups
    from tuner.frontend.onnx import load

    g = pipeline(load(os.path.join(LIGHT, f"light_{name}.onnx")), 2)
    _, kernels, _, _, _ = plan_groups(g, threads=2, store=None, tuned=False)
    numpy_groups = [f"{k.label}: {k.note}" for k in kernels.values() if k.source == "numpy"]
    assert not numpy_groups
    array_code = [k.label for k in kernels.values()
                  if dict(k.config or {}).get("formulation") == "numpy"]
    assert not array_code
