"""Train the digits classifier shipped as ``digits_mlp.onnx`` (real data for INT8 checks).

scikit-learn's bundled ``load_digits`` (1,797 8x8 images, pixels 0..16), a seeded stratified
80/20 split, an ``MLPClassifier`` (64 -> 64 relu -> 10) trained on pixels / 16. The ONNX
graph is written with ``onnx.helper`` from the trained weights as MatMul/Add/Relu/MatMul/Add/
Softmax taking *raw pixels* (the 1/16 is folded into the first weight), input ``pixels``
float32[N, 64], output ``probabilities`` float32[N, 10].

Writes, beside this script: ``digits_mlp.onnx``, ``digits_split.npz`` (train/test indices
into ``load_digits()``), ``digits_test.npz`` (``x`` float32[360, 64] raw pixels, ``y`` labels)
and ``digits_calib.npz`` (``x``: 256 training images drawn with the seed, for calibration).

    python workloads/models/train_digits.py          # deterministic: same files every run
"""
from __future__ import annotations

import os
import sys

import numpy as np

SEED = 0
HERE = os.path.dirname(os.path.abspath(__file__))


def train(seed: int = SEED):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target.astype(np.int64)
    idx = np.arange(len(y))
    train_idx, test_idx = train_test_split(idx, test_size=0.2, random_state=seed, stratify=y)
    clf = MLPClassifier(hidden_layer_sizes=(64,), activation="relu", alpha=1e-3,
                        max_iter=400, random_state=seed)
    clf.fit(x[train_idx] / 16.0, y[train_idx])
    return clf, x, y, np.sort(train_idx), np.sort(test_idx)


def to_onnx(clf) -> "onnx.ModelProto":
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w1 = (clf.coefs_[0] / 16.0).astype(np.float32)     # raw pixels in, as trained on x / 16
    b1 = clf.intercepts_[0].astype(np.float32)
    w2 = clf.coefs_[1].astype(np.float32)
    b2 = clf.intercepts_[1].astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    nodes = [
        helper.make_node("MatMul", ["pixels", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h1b"], name="fc1_bias"),
        helper.make_node("Relu", ["h1b"], ["a1"], name="relu1"),
        helper.make_node("MatMul", ["a1", "w2"], ["h2"], name="fc2"),
        helper.make_node("Add", ["h2", "b2"], ["logits"], name="fc2_bias"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="tuner workloads/models/train_digits.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main(out_dir: str = HERE) -> int:
    import onnx

    clf, x, y, train_idx, test_idx = train()
    acc = clf.score(x[test_idx] / 16.0, y[test_idx])
    onnx.save(to_onnx(clf), os.path.join(out_dir, "digits_mlp.onnx"))
    np.savez(os.path.join(out_dir, "digits_split.npz"), train=train_idx, test=test_idx, seed=SEED)
    np.savez(os.path.join(out_dir, "digits_test.npz"), x=x[test_idx], y=y[test_idx])
    calib = np.random.default_rng(SEED).choice(train_idx, size=256, replace=False)
    np.savez(os.path.join(out_dir, "digits_calib.npz"), x=x[np.sort(calib)])
    print(f"digits_mlp: {len(train_idx)} train / {len(test_idx)} test images, "
          f"FP32 test accuracy {100 * acc:.2f}% (scikit-learn)")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
