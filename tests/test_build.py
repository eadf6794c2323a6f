"""Model build and runtime: the memory planner, build/run against the NumPy executor, the
fallback summary (tuned / fallback / fixed / numpy), strict mode, no per-run allocation, and
the build / run-model commands."""
from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import tuner
from tuner.compiler import Module, plan_memory
from workloads.errors import NoRecordError
from workloads.graph import execute, load, random_inputs

ROOT = Path(__file__).resolve().parent.parent
CONV_BLOCK = str(ROOT / "workloads" / "graphs" / "conv_block.txt")


# ---- the memory planner ---------------------------------------------------------------

def _check_plan(steps, nbytes, keep, alias=None):
    """No two values live at the same time share a buffer; each buffer is large enough."""
    alias = alias or {}
    plan = plan_memory(steps, nbytes, {v: "float32" for v in nbytes}, keep, alias)

    def root(v):
        while v in alias:
            v = alias[v]
        return v
    live = {}
    for i, (out, ins) in enumerate(steps):
        live.setdefault(root(out), [i, i])
        for v in ins:
            if root(v) in live:
                live[root(v)][1] = max(live[root(v)][1], i)
    for v in keep:
        live[root(v)][1] = len(steps)
    vals = [v for v in live if v in plan.assign]
    for a in vals:
        assert plan.sizes[plan.assign[a]] >= nbytes[a]
        for b in vals:
            if a < b and plan.assign[a] == plan.assign[b]:
                (s1, e1), (s2, e2) = live[a], live[b]
                assert e1 < s2 or e2 < s1, f"{a} {live[a]} and {b} {live[b]} share a buffer"
    return plan


def test_planner_chain_reuses_two_buffers():
    steps = [("a", ("x",)), ("b", ("a",)), ("c", ("b",)), ("d", ("c",)), ("e", ("d",))]
    plan = _check_plan(steps, {v: 100 for v in "abcde"}, {"e"})
    assert len(plan.sizes) == 2 and plan.total_bytes == 200 and plan.naive_bytes == 500


def test_planner_keeps_outputs_and_grows_free_buffers():
    steps = [("a", ("x",)), ("b", ("a",)), ("c", ("b",)), ("d", ("c", "a"))]
    plan = _check_plan(steps, {"a": 10, "b": 40, "c": 80, "d": 20}, {"b", "d"})
    assert plan.assign["b"] not in (plan.assign["c"], plan.assign["d"])


def test_planner_views_extend_their_buffer_life():
    # r is a view of a: a's buffer must survive until r's last reader (d).
    steps = [("a", ("x",)), ("r", ("a",)), ("b", ("x",)), ("c", ("b",)), ("d", ("r", "c"))]
    plan = _check_plan(steps, {"a": 64, "b": 64, "c": 64, "d": 64}, {"d"}, {"r": "a"})
    assert "r" not in plan.assign
    assert plan.assign["a"] not in (plan.assign["b"], plan.assign["c"])


def test_planner_random_dags():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 25))
        steps, sizes = [], {}
        for i in range(n):
            ins = tuple(f"v{j}" for j in rng.choice(i, size=min(i, int(rng.integers(0, 3))),
                                                    replace=False)) if i else ("x",)
            steps.append((f"v{i}", ins))
            sizes[f"v{i}"] = int(rng.integers(1, 1000))
        keep = {f"v{n - 1}"} | {f"v{int(k)}" for k in rng.choice(n, size=1)}
        plan = _check_plan(steps, sizes, keep)
        assert plan.total_bytes <= plan.naive_bytes


# ---- build and run --------------------------------------------------------------------

@pytest.fixture(scope="module")
def conv_block():
    return load(CONV_BLOCK)


@pytest.fixture(scope="module")
def built(conv_block, tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('db') / 'tuning.db'}"
    return tuner.build(conv_block, threads=1, db=db)


def test_built_module_matches_numpy_executor(conv_block, built):
    x = random_inputs(conv_block, seed=3)
    expected = execute(conv_block, x)
    got = built.run(x)
    assert isinstance(built, Module) and len(got) == len(expected) == 1
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-6)
    # A second input gives a different, still right answer (buffers are reused, not stale).
    x2 = random_inputs(conv_block, seed=4)
    np.testing.assert_allclose(built.run({conv_block.inputs[0].name: x2[0]})[0],
                               execute(conv_block, x2)[0], rtol=1e-4, atol=1e-6)


def test_summary_counts_every_group_once(built):
    s = built.summary
    kinds = [st.source for st in built.steps]
    assert s.kernels + s.views == len(built.steps)
    assert s.counts["fixed"] == kinds.count("fixed") >= 2       # pools, softmax
    assert s.counts["fallback"] == kinds.count("fallback") >= 3  # convs, dense: nothing tuned
    assert s.counts["tuned"] == 0 and s.counts["numpy"] == 0
    # the flatten: a view at -O 2; at -O 3 (NHWC, the AVX-512 default) it is part of the
    # NHWC -> NCHW transform's kernel
    assert s.views == (1 if s.opt_level == 2 else 0), s.opt_level
    line = s.line("g.txt")
    assert "\n" not in line and line.startswith("built conv_block: ")
    assert "0 tuned" in line and "fallback configs" in line and "--details" in line
    assert s.planned_bytes < s.naive_bytes


def _peak(fn) -> int:
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def test_run_allocates_nothing_per_call(conv_block, built):
    """The runtime allocates nothing per run: a run's peak is no more than what the kernels
    themselves allocate (some templates allocate packing scratch inside the kernel)."""
    x = random_inputs(conv_block, seed=1)
    out1 = built.run(x, copy=False)
    built.run(x, copy=False)
    kernel_peak = max(_peak(lambda s=s: s.fn(*s.args)) for s in built.steps if s.fn is not None)
    peak = _peak(lambda: [built.run(x, copy=False) for _ in range(5)])
    assert built.run(x, copy=False)[0] is out1[0]
    assert peak < kernel_peak + 16 * 1024, f"a run allocated {peak} bytes (kernels {kernel_peak})"
    # One activation of this graph is 64 KiB: a runtime allocating outputs would exceed that.


def test_arena_copies_are_aligned_writable_and_equal():
    import mmap

    from tuner.compiler.arena import ALIGN, MIN_BYTES, place, slices

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (3, 1000, MIN_BYTES // 4)]
    arrays.append(rng.integers(-128, 127, size=(7, 9), dtype=np.int8))
    copies = place(arrays)
    root = copies[0].base
    while getattr(root, "base", None) is not None:
        root = root.base
    for a, c in zip(arrays, copies):
        assert c.shape == a.shape and c.dtype == a.dtype and np.array_equal(a, c)
        assert c.flags.c_contiguous and c.flags.writeable and c.ctypes.data % ALIGN == 0
        assert c.ctypes.data != a.ctypes.data
        r = c.base
        while getattr(r, "base", None) is not None:
            r = r.base
        assert r is root   # one block
    if hasattr(mmap, "MADV_HUGEPAGE"):   # over MIN_BYTES: an anonymous map advised huge pages
        assert isinstance(getattr(root, "obj", root), mmap.mmap)   # frombuffer: a memoryview
    # a set under MIN_BYTES: plain memory, still on cache-line boundaries
    for small in (place([np.ones(5, np.float32), np.ones(3, np.int8), np.ones(7, np.float64)])
                  for _ in range(8)):
        assert all(c.ctypes.data % ALIGN == 0 and c.flags.writeable for c in small)
    # buffers carved from one block do not overlap
    bufs = slices([100, 64, 1 << 21], ["float32", "uint8", "float64"])
    spans = sorted((b.ctypes.data, b.ctypes.data + b.nbytes) for b in bufs)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))
    assert [b.nbytes for b in bufs] == [100, 64, 1 << 21]


def test_prepared_weights_live_in_one_arena(built):
    """A build moves every packed weight its kernel_prepared steps read into one block (on
    huge pages where the OS grants them): no step reads one from Numba's allocator."""
    def root(a):
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a

    roots = [root(a) for s in built.steps if s.fn is not None for a in s.args
             if isinstance(a, np.ndarray)]
    assert not [r for r in roots if type(r).__name__ == "_MemInfo"], "a weight left in Numba's heap"


def test_runtime_overhead_is_small(conv_block, built):
    t = built.time(random_inputs(conv_block), repeat=10)
    assert t.p50 > 0 and t.p95 >= t.p50
    assert built.overhead() < 0.5 * t.p50
    prof = built.profile(random_inputs(conv_block), repeat=2)
    assert len(prof) == built.summary.kernels


def test_bad_inputs_are_usage_errors(built):
    from workloads.errors import UsageError

    with pytest.raises(UsageError, match="must be float32"):
        built.run([np.zeros((1, 3, 32, 31), np.float32)])
    with pytest.raises(UsageError, match="takes 1 inputs"):
        built.run([])


def test_strict_build_refuses_fallbacks(conv_block, tmp_path):
    with pytest.raises(NoRecordError, match="tune it with"):
        tuner.build(conv_block, threads=1, db=f"sqlite:///{tmp_path / 't.db'}", strict=True)


def test_unsupported_group_runs_with_numpy_visibly(conv_block, tmp_path, monkeypatch):
    import workloads.fused as fused
    from workloads.errors import UsageError

    real = fused.workload_for_group

    def no_softmax(node):
        if any(n.op == "softmax" for n in node.body.nodes):
            raise UsageError("softmax: not supported here")
        return real(node)

    monkeypatch.setattr(fused, "workload_for_group", no_softmax)
    m = tuner.build(conv_block, threads=1, db=f"sqlite:///{tmp_path / 't.db'}")
    assert m.summary.counts["numpy"] == 1
    assert "1 numpy" in m.summary.line()
    (step,) = [s for s in m.steps if s.source == "numpy"]
    assert "softmax: not supported here" in step.note and "numpy" in m.details()
    x = random_inputs(conv_block, seed=2)
    np.testing.assert_allclose(m.run(x)[0], execute(conv_block, x)[0], rtol=1e-4, atol=1e-6)


def test_opt_level_zero_builds_one_kernel_per_op(conv_block, tmp_path):
    m = tuner.build(conv_block, opt_level=0, threads=1, tuned=False)
    assert m.summary.kernels + m.summary.views > 10
    assert all(s.source in ("fallback", "fixed", "view") for s in m.steps)
    x = random_inputs(conv_block, seed=5)
    np.testing.assert_allclose(m.run(x)[0], execute(conv_block, x)[0], rtol=1e-4, atol=1e-6)


# ---- commands -----------------------------------------------------------------------------

def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=900)


def test_cli_build_summary_and_details(tmp_path):
    env = {"TUNER_DB": f"sqlite:///{tmp_path / 't.db'}"}
    r = _cli("build", CONV_BLOCK, "--threads", "1", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("built conv_block: ")
    assert "no tuned config" not in r.stderr          # no warning per kernel
    r = _cli("build", CONV_BLOCK, "--threads", "1", "--details", env=env)
    assert r.returncode == 0, r.stderr
    assert "memory plan" in r.stdout and "fallback conv2d" in r.stdout
    assert "fixed    fixed" in r.stdout and "view" in r.stdout
    r = _cli("build", CONV_BLOCK, "--threads", "1", "--strict", env=env)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_cli_run_model_prints_p50_p95(tmp_path):
    r = _cli("run-model", CONV_BLOCK, "--threads", "1", "--repeat", "5",
             env={"TUNER_DB": f"sqlite:///{tmp_path / 't.db'}"})
    assert r.returncode == 0, r.stderr
    assert "p50" in r.stdout and "p95" in r.stdout and "runtime overhead" in r.stdout


@pytest.mark.parametrize("args", [["nope.onnx"], [CONV_BLOCK, "--threads", "99"],
                                  [CONV_BLOCK, "--jobs", "0"]])
def test_cli_build_bad_input(args):
    r = _cli("build", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error: ")


def test_concat_inputs_are_computed_in_place(tmp_path):
    g = load(str(ROOT / "workloads" / "graphs" / "inception_block.txt"))
    db = f"sqlite:///{tmp_path / 't.db'}"
    # NCHW (-O 2): at batch 1 each input's channels are a contiguous slice of the output
    m = tuner.build(g, threads=1, db=db, opt_level=2)
    copy = tuner.build(g, threads=1, db=db, inplace_concat=False, opt_level=2)
    cats = [s for s in m.steps if "concatenate" in s.label]
    assert cats and all(s.source == "view" and "(in place)" in s.label for s in cats)
    assert not any("(in place)" in s.label for s in copy.steps)
    assert copy.summary.kernels == m.summary.kernels + len(cats)
    for seed in (0, 1):
        x = random_inputs(g, seed=seed)
        expected = execute(g, x)[0]
        np.testing.assert_allclose(m.run(x)[0], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(copy.run(x)[0], expected, rtol=1e-4, atol=1e-5)


def test_array_code_kernels_are_named_in_the_summary(tmp_path):
    """A group only the injective template's ``numpy`` formulation computes (an elementwise
    op between two transposes) is a generated kernel, and the summary line says it is
    NumPy array code."""
    from workloads.graph import GraphBuilder

    b = GraphBuilder("g")
    x = b.input("x", (1, 6, 4, 5))
    sh = b.op("reshape", b.op("transpose", b.op("reshape", x, newshape=[1, 2, 3, 4, 5]),
                              axes=[0, 2, 1, 3, 4]), newshape=[1, 6, 4, 5])
    y = b.op("add", b.op("transpose", b.op("exp", sh), axes=[0, 1, 3, 2]), b.input("r", (1, 6, 5, 4)))
    g = b.build(y)
    m = tuner.build(g, threads=1, db=f"sqlite:///{tmp_path / 't.db'}")
    forms = sorted((s.config or {}).get("formulation", "") for s in m.steps if s.kind == "injective")
    assert forms == ["numpy"], forms
    assert m.summary.array_code == 1 and m.summary.counts["numpy"] == 0
    assert "0 numpy (+1 generated as NumPy array code)" in m.summary.line()
    xs = random_inputs(g, seed=1)
    np.testing.assert_allclose(m.run(xs)[0], execute(g, xs)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_numpy_steps_run_blas_on_one_thread_beside_parallel_kernels(conv_block, tmp_path,
                                                                     monkeypatch, threads):
    """A NumPy step in a multi-threaded module runs its BLAS on one thread (OpenBLAS's pool
    threads, spinning after a 2-thread call, took cores from our 2-thread kernels: ResNet-50
    with six NumPy convs ran 3x slower); a 1-thread module leaves BLAS as it is."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import workloads.fused as fused
    import workloads.graph.executor as executor
    from tuner.target import usable_cores
    from workloads.errors import UsageError

    if usable_cores() < threads:
        pytest.skip(f"needs {threads} usable cores, this machine has {usable_cores()}")
    real_group, real_execute = fused.workload_for_group, executor.execute

    def no_softmax(node):
        if any(n.op == "softmax" for n in node.body.nodes):
            raise UsageError("softmax: not supported here")
        return real_group(node)

    seen = []

    def execute(graph, inputs, **kw):
        seen.append([p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"])
        return real_execute(graph, inputs, **kw)

    monkeypatch.setattr(fused, "workload_for_group", no_softmax)
    monkeypatch.setattr(executor, "execute", execute)
    m = tuner.build(conv_block, threads=threads, db=f"sqlite:///{tmp_path / 't.db'}")
    assert m.summary.counts["numpy"] == 1
    x = random_inputs(conv_block, seed=2)
    with threadpool_limits(limits=2, user_api="blas"):
        seen.clear()
        out = m.run(x)[0]
        assert max(p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas") == 2
    assert seen and all(n and max(n) == (1 if threads > 1 else 2) for n in seen), seen
    np.testing.assert_allclose(out, real_execute(conv_block, x)[0], rtol=1e-4, atol=1e-6)


def _convs(name: str, seed: int):
    """(builder, input x of 1 x 16 x 10 x 11, conv(v, cin, cout, k): a k x k conv + bias + relu
    with seeded weights, 'same' padding)."""
    from workloads.graph import GraphBuilder

    b = GraphBuilder(name)
    rng = np.random.default_rng(seed)

    def conv(v, cin, cout, k):
        w = b.const(rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.2)
        bias = b.const(rng.standard_normal((cout, 1, 1)).astype(np.float32))
        return b.op("relu", b.op("add", b.op("conv2d", v, w, strides=[1, 1], padding=[k // 2] * 2), bias))

    return b, b.input("x", (1, 16, 10, 11)), conv


def _conv_chain():
    """x -> 1x1 conv + relu -> 3x3 conv + relu -> 3x3 conv + relu (-> output), and a 3x3
    conv whose image has a second reader (the add): two hand-offs, one refused."""
    b, x, conv = _convs("chain", 0)
    y = conv(conv(conv(x, 16, 32, 1), 32, 32, 3), 32, 32, 3)
    z = conv(y, 32, 32, 1)
    out = b.op("add", conv(z, 32, 32, 3), z)      # z: read by the 3x3 conv and by the add
    return b.build(out)


def _branches():
    """Two concatenations over channels of convs of x: one whose inputs are read by it alone
    (computed in place in NHWC), one whose first input a second conv reads too (copied)."""
    b, x, conv = _convs("branches", 1)
    c = b.op("concatenate", conv(x, 16, 24, 1), conv(x, 16, 40, 3), axis=1)
    e = conv(x, 16, 16, 1)
    f = b.op("concatenate", e, conv(x, 16, 16, 3), axis=1)
    out = b.op("add", b.op("add", conv(c, 64, 32, 1), f), conv(e, 16, 32, 1))
    return b.build(out)


@pytest.mark.parametrize("threads", [1, 2])
def test_nhwc_concatenations_are_written_in_place_by_their_producers(tmp_path, threads):
    """In NHWC a concatenation over channels is not a contiguous slice per input: where every
    input is a direct conv read by it alone, each writes its channels of the concatenation
    (``handoff.ChannelSlot``: runtime dims OLD, OCO) and the concatenation copies nothing;
    the same compiled kernels, bit-identical outputs, ``Step.output`` the input's channels.
    A concatenation with an input read elsewhere is copied as before."""
    g = _branches()
    db = f"sqlite:///{tmp_path / 't.db'}"
    m = tuner.build(g, threads=threads, db=db)
    copy = tuner.build(g, threads=threads, db=db, inplace_concat=False)
    cats = [s for s in m.steps if "concatenate" in s.label]
    assert [s.source for s in cats].count("view") == 1 and len(cats) == 2
    assert all(s.source != "view" for s in copy.steps if "concatenate" in s.label)
    placed = [s for s in m.steps if s.out is not None]
    assert len(placed) == 2 and all(s.args[-1].shape[-1] == 64 for s in placed)
    assert sorted(s.out.shape[-1] for s in placed) == [24, 40]
    assert "writes channels 24..63 of its concatenation [1, 10, 11, 64] in place" in m.details()
    for seed in (0, 1):
        x = random_inputs(g, seed=seed)
        seen = {}
        ref = copy.run_steps(x, lambda s: seen.__setitem__(s.name, s.output.copy()))[0]
        got = m.run_steps(x, lambda s: s.out is None or np.array_equal(s.output, seen[s.name])
                          or pytest.fail(f"{s.name} differs"))[0]
        assert np.array_equal(got, ref)
        np.testing.assert_allclose(got, execute(g, x)[0], rtol=1e-4, atol=1e-4)


def test_an_in_place_concatenation_compiles_no_kernel_and_copies_if_a_producer_fails(
        tmp_path, monkeypatch):
    """The concatenation its producers write in place is planned before anything compiles and
    its own kernel is not sent to the compile workers; where a producer's compile fails after
    all (NumPy fallback, which cannot write a channel slot) the concatenation copies, its
    kernel compiled in the building process, and the outputs stay right."""
    from tuner.compiler import compile_model as cm

    g = _branches()
    db = f"sqlite:///{tmp_path / 't.db'}"
    real = cm._compile_in_workers
    sent: list = []

    def spy(kernels, *args, **kwargs):
        sent.extend(k.node.name for k in kernels)
        return real(kernels, *args, **kwargs)

    monkeypatch.setattr(cm, "_compile_in_workers", spy)
    m = tuner.build(g, threads=1, db=db)
    (view,) = [s for s in m.steps if "concatenate" in s.label and s.source == "view"]
    (copied,) = [s for s in m.steps if "concatenate" in s.label and s.source != "view"]
    assert view.name not in sent and copied.name in sent
    producers = {s.name for s in m.steps if s.out is not None}

    def failing(kernels, *args, **kwargs):
        replies = real(kernels, *args, **kwargs)
        for k in kernels:
            if k.node.name in producers:
                replies[k.path] = {"status": "COMPILE_ERROR", "error": "injected"}
        return replies

    monkeypatch.setattr(cm, "_compile_in_workers", failing)
    broken = tuner.build(g, threads=1, db=db)
    steps = {s.name: s for s in broken.steps}
    assert all(steps[p].source == "numpy" for p in producers)
    assert steps[view.name].source not in ("view", "numpy") and steps[view.name].fn is not None
    x = random_inputs(g, seed=0)
    np.testing.assert_allclose(broken.run(x)[0], execute(g, x)[0], rtol=1e-4, atol=1e-4)


def test_padded_images_are_written_in_place_by_their_producers(tmp_path):
    """A direct conv whose image another direct conv computes for it alone gets that image
    zero-padded from its producer (``tuner.compiler.handoff``): no ``pad_image`` copy per
    call, the same compiled kernels, bit-identical outputs; the padded buffer's border stays
    zero run after run, ``Step.output`` is the value itself. An image with a second reader
    is copied as before."""
    g = _conv_chain()
    db = f"sqlite:///{tmp_path / 't.db'}"
    m = tuner.build(g, threads=1, db=db)
    copy = tuner.build(g, threads=1, db=db, handoff=False)
    assert m.summary.handoffs == 2 and copy.summary.handoffs == 0
    assert sum(s.out is not None for s in m.steps) == 2
    assert m.details().count("writes its consumer's padded image [1, 12, 13, 32] in place") == 2
    for seed in (0, 1):
        x = random_inputs(g, seed=seed)
        seen = {}   # each step's value when it was computed (later steps reuse buffers)
        ref = copy.run_steps(x, lambda s: seen.__setitem__(s.name, s.output.copy()))[0]
        got = m.run(x)[0]
        assert np.array_equal(got, ref)
        np.testing.assert_allclose(got, execute(g, x)[0], rtol=1e-4, atol=1e-4)
        for s in m.steps:
            if s.out is None:
                continue
            padded = s.args[-1]
            assert padded.ndim == 4 and padded.size > s.out.size
            assert np.array_equal(s.output, seen[s.name])
            border = np.ones(padded.shape, bool)
            border[:, 1:-1, 1:-1] = False
            assert not padded[border].any()
    assert "handoff" not in " ".join(s.label for s in copy.steps)
