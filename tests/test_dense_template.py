"""dense template: dot and gemm formulations, dense (W[N, K]) and matmul (W[K, N]) weights."""
from __future__ import annotations

import numpy as np

from search_spaces import get_template
from tuner.dispatch import load_kernel
from workloads.graph import GraphBuilder
from workloads.graph.fusion import fused_groups
from workloads.graph.passes import optimize
from workloads.fused import workload_for_group


def dense_workload(M, K, N, op="dense"):
    b = GraphBuilder("g")
    x = b.input("x", (M, K))
    shape = (N, K) if op == "dense" else (K, N)
    w = b.const(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    bias = b.const(np.arange(N, dtype=np.float32))
    y = b.op("clip", b.op("add", b.op(op, x, w), bias), a_min=-1.0, a_max=2.0)
    (node,) = fused_groups(optimize(b.build(y), opt_level=2))
    return workload_for_group(node)


def check(w, cfg):
    fn = load_kernel(w, get_template("dense"), cfg)
    x, out = w.make_inputs(), w.make_outputs()
    fn(*x, *out)
    return w.check(x, out, w.reference(x))


def test_dense_dot_default_for_small_batches_and_gemm():
    t = get_template("dense")
    w = dense_workload(3, 37, 21)
    assert w.kind == "dense" and w.geometry == {"M": 3, "N": 21, "K": 37, "weight": "NK"}
    d = t.default_config(w, 1)
    assert d["formulation"] == "dot"
    assert check(w, d) is None
    g = d.replace(formulation="gemm", pack_a=True, mr=4, nr=16, vec=8, tile_k=16, tile_m=16,
                  tile_n=16)
    assert t.space(w, 1).is_valid(g), t.space(w, 1).violation(g)
    assert check(w, g) is None


def test_matmul_weight_read_in_place():
    t = get_template("dense")
    w = dense_workload(20, 24, 40, op="matmul")
    assert w.geometry["weight"] == "KN"
    sp = t.space(w, 2)
    assert sp.knob("formulation").values == ("gemm",)
    cfg = t.default_config(w, 1).replace(pack_a=False, pack_b=False, parallel="m", threads=2)
    assert sp.is_valid(cfg), sp.violation(cfg)
    assert check(w, cfg) is None


def test_full_tiles_store_through_the_inlined_vector_store():
    """Full MR x NR tiles go through ``store_full`` (inlined: no call per tile), partial ones
    through ``store_tile``'s scalar loops; both exact, with one K block and with several."""
    t = get_template("dense")
    w = dense_workload(20, 40, 40, op="matmul")   # 20 = 3 x 6 + 2 rows, 40 = 2 x 16 + 8 columns
    base = t.default_config(w, 1).replace(formulation="gemm", pack_a=True, mr=6, nr=16, vec=8,
                                          tile_m=24, tile_n=32)
    for tile_k in (48, 16):   # one K block (mode 3) and three (modes 0, 1, 2)
        cfg = base.replace(tile_k=tile_k)
        src = t.codegen(w, cfg)
        assert 'inline="always")\ndef store_full(' in src
        assert "if mlen == MR and nlen == NR:\n" in src and "store_full(T, Cf" in src
        assert check(w, cfg) is None


import pytest   # noqa: E402


@pytest.mark.parametrize("M,K,N,threads", [(1, 2048, 1000, 1), (1, 300, 23, 2), (2, 100, 9, 1)])
def test_dot_requests_the_next_weight_rows(M, K, N, threads):
    """The dot formulation (batch-1 dense layers: a stream over the weight) requests the next
    four weight rows into L2 while it reads the current four (fewer than eight rows left:
    none); exact at every row count, 1 and 2 threads."""
    t = get_template("dense")
    w = dense_workload(M, K, N)
    d = t.default_config(w, threads)
    assert d["formulation"] == "dot"
    assert "prefetch_l2(Wt, nxt + 3 * K + k" in t.codegen(w, d)
    assert check(w, d) is None
