"""ONNX frontend: each op (and its attribute corners) against ONNX Runtime, the light models
of the onnx wheel through import and passes, and every bad input as one UsageError line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the optional extra .[onnx] is not installed")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime (extra .[onnx]) is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from workloads.errors import UsageError  # noqa: E402
from tuner.frontend.onnx import from_model, load  # noqa: E402
from workloads.graph import execute, verify  # noqa: E402
from workloads.graph.passes import optimize  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def light(name: str) -> str:
    return os.path.join(LIGHT, f"light_{name}.onnx")


def make_model(nodes, inputs: dict, outputs: list[str], inits: dict | None = None,
               opset: int = 13, out_shapes: list | None = None):
    """A model of ``nodes``; ``inputs`` name -> array (their values are the test data).
    Output shapes come from ONNX shape inference unless given."""
    g = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, out_shapes[k] if out_shapes else None)
         for k, o in enumerate(outputs)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if out_shapes:
        return model
    try:  # fill in the output shapes the checker requires
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # an op ONNX cannot infer (the tests of bad input): as built
        return model


def check_against_ort(model, inputs: dict, rtol=1e-4, atol=1e-5, opt_level=2):
    """Import, verify, run unoptimized and optimized; both must match ONNX Runtime."""
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, inputs)
    graph = from_model(model, name="t")
    verify(graph)
    args = [inputs[p.name] for p in graph.inputs]
    for g in (graph, optimize(graph, opt_level)):
        got = execute(g, args)
        assert len(got) == len(expected)
        for a, e in zip(got, expected):
            assert a.shape == e.shape, (a.shape, e.shape)
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
    return graph


rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- ops against ONNX Runtime ------------------------------------------------------------

@pytest.mark.parametrize("attrs", [
    dict(pads=[1, 0, 2, 1], strides=[2, 1]),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(auto_pad="SAME_LOWER", strides=[2, 2]),
    dict(auto_pad="VALID", dilations=[2, 2]),
    dict(pads=[1, 1, 1, 1], group=2),
], ids=["asym-pads", "same-upper", "same-lower", "valid-dilated", "grouped"])
def test_conv(attrs):
    x, w, b = rand(1, 4, 9, 8), rand(6, 4 // attrs.get("group", 1), 3, 2), rand(6)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="c", kernel_shape=[3, 2], **attrs)
    g = check_against_ort(make_model([node], {"x": x}, ["y"], {"w": w, "b": b}), {"x": x})
    assert [n.op for n in g.nodes if n.is_compute] == ["conv2d", "bias_add"]


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0])),
    ("MaxPool", dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                         count_include_pad=1)),
], ids=["max-ceil", "max-pads", "max-same", "avg-pads", "avg-count-pad", "avg-ceil",
        "avg-ceil-count-pad"])
def test_pool(op, attrs):
    x = rand(1, 3, 10, 10)
    node = helper.make_node(op, ["x"], ["y"], name="p", **attrs)
    check_against_ort(make_model([node], {"x": x}, ["y"], opset=11), {"x": x})


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta", [
    (0, 1, 1.0, 1.0), (0, 0, 1.0, 1.0), (1, 0, 0.5, 2.0), (1, 1, 2.0, 0.25)])
def test_gemm(trans_a, trans_b, alpha, beta):
    a = rand(7, 5) if trans_a else rand(5, 7)
    b = rand(3, 7) if trans_b else rand(7, 3)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="g", transA=trans_a,
                            transB=trans_b, alpha=alpha, beta=beta)
    g = check_against_ort(make_model([node], {"a": a}, ["y"], {"b": b, "c": rand(3)}), {"a": a})
    assert "dense" in [n.op for n in g.nodes]
    # FoldConstant takes the weight's transpose and the scales away.
    fused = optimize(g, 2)
    ops = [n.op for f in fused.nodes if f.is_fused for n in f.body.nodes if n.is_compute]
    assert ops.count("transpose") == trans_a and "multiply" not in ops


def test_gemm_without_c_and_matmul():
    a = rand(4, 6)
    nodes = [helper.make_node("Gemm", ["a", "b"], ["h"], name="g", transB=1),
             helper.make_node("MatMul", ["h", "m"], ["y"], name="mm"),
             helper.make_node("Reshape", ["y", "s"], ["y3"], name="r"),
             helper.make_node("Transpose", ["y3"], ["y3t"], name="t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["y3", "y3t"], ["z"], name="bmm")]
    inits = {"b": rand(5, 6), "m": rand(5, 8), "s": np.array([2, 2, 8], np.int64)}
    g = check_against_ort(make_model(nodes, {"a": a}, ["z"], inits), {"a": a})
    assert [n.op for n in g.nodes if n.is_compute].count("matmul") == 1


def test_batchnorm_relu_sum_and_friends():
    x = rand(2, 3, 4, 5)
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], name="bn",
                         epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["x"], ["sg"], name="sig"),
        helper.make_node("Sum", ["r", "sg", "x"], ["sum"], name="sum"),
        helper.make_node("Mul", ["sum", "k"], ["mul"], name="mul"),
        helper.make_node("Sub", ["mul", "x"], ["sub"], name="sub"),
        helper.make_node("Div", ["sub", "k"], ["div"], name="div"),
        helper.make_node("Clip", ["div", "lo", "hi"], ["y"], name="clip"),
    ]
    inits = {"s": rand(3), "b": rand(3), "m": rand(3), "v": np.abs(rand(3)) + 0.5,
             "k": np.abs(rand(3, 1, 1)) + 0.5, "lo": np.float32(-0.5), "hi": np.float32(1.5)}
    check_against_ort(make_model(nodes, {"x": x}, ["y"], inits, opset=11), {"x": x})


def test_clip_attributes_before_opset_11():
    x = rand(3, 4) * 3
    node = helper.make_node("Clip", ["x"], ["y"], name="clip", min=-1.0, max=2.0)
    check_against_ort(make_model([node], {"x": x}, ["y"], opset=9), {"x": x})
    node = helper.make_node("Clip", ["x"], ["y"], name="clip", max=0.5)
    check_against_ort(make_model([node], {"x": x}, ["y"], opset=9), {"x": x})


@pytest.mark.parametrize("opset,axis", [(9, 1), (11, 2), (11, -1), (13, 1), (13, -1)])
def test_softmax_axis_semantics(opset, axis):
    # Before opset 13 the input is coerced to 2-D at `axis`; from 13 it is one axis.
    x = rand(2, 3, 4, 5)
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=axis)
    check_against_ort(make_model([node], {"x": x}, ["y"], opset=opset), {"x": x})


def test_lrn_concat_dropout():
    x = rand(1, 6, 5, 5)
    nodes = [helper.make_node("LRN", ["x"], ["l"], name="lrn", size=5, alpha=0.001, beta=0.6,
                              bias=2.0),
             helper.make_node("Dropout", ["x"], ["d"], name="drop", ratio=0.3),
             helper.make_node("Concat", ["l", "d", "x"], ["y"], name="cat", axis=1)]
    check_against_ort(make_model(nodes, {"x": x}, ["y"], opset=9), {"x": x})


@pytest.mark.parametrize("shape", [[0, -1], [2, 0, 0, -1], [-1], [4, 1, -1]])
def test_reshape_zero_and_minus_one(shape):
    x = rand(2, 3, 4, 2)
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="r")
    check_against_ort(make_model([node], {"x": x}, ["y"], {"s": np.array(shape, np.int64)}),
                      {"x": x})


@pytest.mark.parametrize("opset,axis", [(9, 1), (9, 0), (11, -1), (11, 4)])
def test_flatten(opset, axis):
    x = rand(2, 3, 4, 2)
    node = helper.make_node("Flatten", ["x"], ["y"], name="f", axis=axis)
    check_against_ort(make_model([node], {"x": x}, ["y"], opset=opset), {"x": x})


@pytest.mark.parametrize("opset", [9, 13])
def test_unsqueeze_squeeze(opset):
    x = rand(3, 4)
    if opset >= 13:
        nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"], name="u"),
                 helper.make_node("Unsqueeze", ["u", "ax1"], ["u2"], name="u2"),
                 helper.make_node("Squeeze", ["u2", "ax1"], ["y"], name="sq")]
        inits = {"ax": np.array([0, -1], np.int64), "ax1": np.array([1], np.int64)}
    else:
        nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], name="u", axes=[0, 3]),
                 helper.make_node("Unsqueeze", ["u"], ["u2"], name="u2", axes=[1]),
                 helper.make_node("Squeeze", ["u2"], ["y"], name="sq", axes=[1])]
        inits = {}
    check_against_ort(make_model(nodes, {"x": x}, ["y"], inits, opset=opset), {"x": x})


def test_pytorch_style_shape_arithmetic_is_evaluated_while_importing():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape (torch.flatten as exported).
    x = rand(2, 3, 4)
    nodes = [helper.make_node("Shape", ["x"], ["shp"], name="shape"),
             helper.make_node("Constant", [], ["zero"], name="k0",
                              value=numpy_helper.from_array(np.array(0, np.int64))),
             helper.make_node("Gather", ["shp", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="unsq"),
             helper.make_node("Concat", ["n1", "m1"], ["newshape"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "newshape"], ["y"], name="reshape")]
    inits = {"ax": np.array([0], np.int64), "m1": np.array([-1], np.int64)}
    model = make_model(nodes, {"x": x}, ["y"], inits, out_shapes=[[2, 12]])
    g = check_against_ort(model, {"x": x})
    assert [n.op for n in g.nodes if n.is_compute] == ["reshape"]


def test_constant_of_shape_is_an_ir_op_that_fold_constant_removes():
    x = rand(2, 5)
    nodes = [helper.make_node("ConstantOfShape", ["shp"], ["w"], name="cos",
                              value=numpy_helper.from_array(np.array([0.02], np.float32))),
             helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)]
    model = make_model(nodes, {"x": x}, ["y"], {"shp": np.array([3, 5], np.int64)}, opset=11,
                       out_shapes=[[2, 3]])
    g = check_against_ort(model, {"x": x})
    assert "constant_of_shape" in [n.op for n in g.nodes]
    assert "constant_of_shape" not in [n.op for n in optimize(g, 2).nodes]


# ---- the light models of the onnx wheel -------------------------------------------------

@pytest.mark.parametrize("name", ["resnet50", "inception_v1", "squeezenet", "densenet121",
                                  "inception_v2", "shufflenet",
                                  pytest.param("vgg19", marks=pytest.mark.slow),
                                  pytest.param("bvlc_alexnet", marks=pytest.mark.slow),
                                  pytest.param("zfnet512", marks=pytest.mark.slow)])
def test_light_models_import_and_fold(name):
    g = load(light(name))
    verify(g)
    assert g.name == f"light_{name}"
    assert len(g.inputs) == 1 and g.inputs[0].type.shape == (1, 3, 224, 224)
    n_cos = sum(n.op == "constant_of_shape" for n in g.nodes)
    assert n_cos > 0
    opt = optimize(g, 2)
    assert not [n for n in opt.nodes if n.op == "constant_of_shape"]
    assert all(n.is_fused for n in opt.nodes if n.is_compute)
    assert opt.output_types == g.output_types


def test_light_squeezenet_runs_like_onnxruntime_with_random_weights():
    from tuner.frontend.onnx_weights import randomize

    model = randomize(onnx.load(light("squeezenet")), seed=3)
    assert not [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"data_0": x})[0]
    assert ref.std() > 1e-4                      # not a trivially uniform output
    got = execute(optimize(from_model(model), 2), [x])[0]
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-5)


def test_random_weights_are_seeded_and_calibrated():
    from tuner.frontend.onnx_weights import randomize

    def weights(m):
        return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}

    base = onnx.load(light("squeezenet"))
    wa, wb, wc = (weights(randomize(base, s)) for s in (1, 1, 2))
    assert wa.keys() == wb.keys() == wc.keys()
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    w = "conv1_w_0"
    assert wa[w].shape == (64, 3, 3, 3) and not np.array_equal(wa[w], wc[w])
    assert 0.12 < wa[w].std() < 0.3       # unit output std on a unit input: ~1/sqrt(27)
    # BatchNorm statistics are calibrated: mean/var are those of the BN's input.
    r = weights(randomize(onnx.load(light("resnet50")), 1))
    var = r["gpu_0/res_conv1_bn_riv_0"]
    assert (var > 0).all() and var.std() > 0 and not np.allclose(var, 1.0)


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_random_weights_give_a_peaked_not_one_hot_softmax(name):
    from tuner.frontend.onnx_weights import randomize

    model = randomize(onnx.load(light(name)), seed=5)
    g = from_model(model)
    x = np.random.default_rng(0).standard_normal(g.inputs[0].type.shape).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {g.inputs[0].name: x})[0].reshape(-1)
    assert 0.02 < y.max() < 0.9 and y.min() < 1e-3


# ---- bad input ----------------------------------------------------------------------------

def _leaky_model():
    x = rand(1, 4)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="ok"),
             helper.make_node("LeakyRelu", ["r"], ["y"], name="leaky_7")]
    return make_model(nodes, {"x": x}, ["y"])


def test_unsupported_op_names_op_and_node(tmp_path):
    path = tmp_path / "leaky.onnx"
    onnx.save(_leaky_model(), path)
    with pytest.raises(UsageError) as exc:
        load(str(path))
    msg = str(exc.value)
    assert "LeakyRelu" in msg and "leaky_7" in msg and "\n" not in msg


@pytest.mark.parametrize("content", [b"", b"not an onnx file at all \x00\xff\x13",
                                     "truncated", "text", "opset8", "badattr"])
def test_bad_files_are_one_line_usage_errors(tmp_path, content):
    path = tmp_path / "m.onnx"
    if content == "truncated":
        data = open(light("squeezenet"), "rb").read()
        path.write_bytes(data[: len(data) // 3])
    elif content == "text":
        path.write_text("graph g(%x: float32[1]) {\n  return %x\n}\n")
    elif content == "opset8":
        m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": rand(2)}, ["y"], opset=8)
        onnx.save(m, path)
    elif content == "badattr":
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="c3", kernel_shape=[3, 3],
                                pads=[1, 1])
        m = make_model([node], {"x": rand(1, 2, 5, 5)}, ["y"], {"w": rand(2, 2, 3, 3)},
                       out_shapes=[[1, 2, 5, 5]])
        onnx.save(m, path)
    else:
        path.write_bytes(content)
    with pytest.raises(UsageError) as exc:
        load(str(path))
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg
    if content == "opset8":
        assert "opset 8" in msg
    if content == "badattr":
        assert "c3" in msg and "Conv" in msg


def test_cli_unsupported_op_exits_2_with_one_line(tmp_path):
    path = tmp_path / "leaky.onnx"
    onnx.save(_leaky_model(), path)
    r = subprocess.run([sys.executable, "-m", "tuner", "passes", str(path)],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "LeakyRelu" in lines[0]
    assert "Traceback" not in r.stderr


def test_cli_passes_on_light_model():
    r = subprocess.run([sys.executable, "-m", "tuner", "passes", light("squeezenet")],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr
    assert "FoldConstant" in r.stdout and "fused groups" in r.stdout


def test_missing_onnx_package_is_a_usage_error(monkeypatch):
    from tuner.frontend import onnx as front

    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(UsageError, match=r"pip install 'tuner\[onnx\]'"):
        front.require_onnx()


def _symbolic_conv():
    """Conv + Relu over an input N x 3 x H x W (three symbolic dimensions)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", "W"])
    w = numpy_helper.from_array(rand(4, 3, 3, 3), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "sym", [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_symbolic_input_dimensions_take_the_given_shape_and_nothing_else():
    """A symbolic dimension other than the first needs a given shape (the error says how); a
    given shape sets the symbolic dimensions and keeps the model's rank and fixed ones (as
    ONNX Runtime does); a name that is no input, or a batch for a model whose batch is fixed,
    is refused."""
    model = _symbolic_conv()
    with pytest.raises(UsageError, match=r"symbolic dimension 2 \(H\); give its shape "
                                         r"\(--input-shape x=Nx3xHxW\)"):
        from_model(model)
    graph = from_model(model, shapes={"x": (2, 3, 9, 7)})
    assert graph.inputs[0].type.shape == (2, 3, 9, 7)
    x = rand(2, 3, 9, 7)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(execute(graph, [x])[0], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    for bad in ((2, 4, 9, 7), (2, 3, 9), (0, 3, 9, 7)):
        with pytest.raises(UsageError, match=r"input 'x' is Nx3xHxW in the model; .* does not fit it"):
            from_model(model, shapes={"x": bad})
    with pytest.raises(UsageError, match=r"no graph input named 'y' \(inputs: x\)"):
        from_model(model, shapes={"x": (1, 3, 4, 4), "y": (1, 4, 4, 4)})
    untyped = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "u",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 13)])
    assert from_model(untyped, shapes={"x": (2, 3)}).inputs[0].type.shape == (2, 3)  # no shape declared
    fixed = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": rand(1, 4)}, ["y"])
    assert from_model(fixed, batch=1).inputs[0].type.shape == (1, 4)
    with pytest.raises(UsageError, match="no input left with a symbolic first dimension"):
        from_model(fixed, batch=2)


def test_cli_model_commands_take_input_shapes(tmp_path, monkeypatch, capsys):
    """``--input-shape NAME=DIMS`` on build / verify / tasks: a model with symbolic dimensions
    builds and matches ONNX Runtime (one subprocess, as a user runs it); a malformed value, a
    shape the model refuses and an IR text given a shape are one-line errors, exit 2 (the CLI
    called in this process: they fail before anything compiles)."""
    from test_cli import tuner

    from tuner.cli import main

    path = str(tmp_path / "sym.onnx")
    onnx.save(_symbolic_conv(), path)
    db = f"sqlite:///{tmp_path / 't.db'}"
    p = tuner("verify", path, "--threads", "1", "--input-shape", "x=2x3x10x6", "--random-weights", "3",
              env={"TUNER_DB": db})
    assert p.returncode == 0 and "y [2, 4, 10, 6]" in p.stdout and "PASS" in p.stdout, p.stdout + p.stderr
    monkeypatch.setenv("TUNER_DB", db)
    capsys.readouterr()
    assert main(["tasks", path, "--threads", "1", "--input-shape", "x=1x3x12x12"]) == 0
    assert "1x12x12x3" in capsys.readouterr().out
    text = str(Path(__file__).resolve().parents[1] / "workloads" / "graphs" / "conv_block.txt")
    bad = [["build", path],                                              # H and W unknown
           ["verify", path, "--input-shape", "x=1x3x4x4", "--rtol", "-1"],
           *(["build", path, "--input-shape", v] for v in ("x2x3", "x=1x3x0x4", "x=1x3xax4", "x=1x5x8x8")),
           ["passes", text, "--input-shape", "x=1x3x8x8"]]
    for argv in bad:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:"), (argv, err)
    assert "apply to .onnx models" in err[0]
