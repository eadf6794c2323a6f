"""GEMM template: the space is well formed and generated kernels compute C = A @ B.

Each case compiles one generated module with Numba (~1 s), so the shapes are small and the
configs few; edge handling (odd sizes, partial tiles), every dtype, every micro-kernel
formulation, packing on/off, parallel and the ladder steps are each covered at least once.
"""
from __future__ import annotations

import hashlib
import importlib.util
import random
import sys

import numpy as np
import pytest

from search_spaces import get_template
from search_spaces.templates.gemm import GemmTemplate, native_lanes
from search_spaces.space import Config
from search_spaces.template import bind_runtime_args
from workloads.errors import InstantiationError
from workloads.gemm import Gemm


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gemm_kernels")


def _load(src: str, build_dir):
    name = "gemm_test_" + hashlib.sha1(src.encode()).hexdigest()[:16]
    path = build_dir / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # Numba's cache locates the module by name
    spec.loader.exec_module(mod)
    return mod


def _run(w: Gemm, cfg: Config, build_dir) -> str | None:
    t = GemmTemplate()
    mod = _load(t.codegen(w, cfg), build_dir)
    ins = w.make_inputs(seed=1)
    outs = w.make_outputs()
    bind_runtime_args(getattr(mod, t.entry), t.runtime_args(w, cfg))(*ins, *outs)
    return w.check(ins, outs, w.reference(ins))


def test_registry_and_contract():
    t = get_template("gemm")
    assert isinstance(t, GemmTemplate)
    assert (t.name, t.workload_kind, t.entry) == ("gemm", "gemm", "kernel")
    assert isinstance(t.version, int)
    sp = t.space(Gemm(1024, 1024, 1024), max_threads=2)
    names = {k.name for k in sp.knobs}
    for knob in ("tile_m", "tile_n", "tile_k", "mr", "nr", "loop_order", "pack_a", "pack_b",
                 "microkernel", "vec", "unroll_k", "parallel", "threads"):
        assert knob in names
    for knob in ("tile_m", "tile_n", "tile_k", "mr", "nr"):
        assert sp.knob(knob).ordinal
    assert sp.knob("threads").values == (1, 2)
    assert t.space(Gemm(64, 64, 64), max_threads=1).knob("threads").values == (1,)


def test_constraints_reject_before_compile():
    t = GemmTemplate()
    w = Gemm(512, 512, 512)
    sp = t.space(w, max_threads=2)
    good = t.default_config(w, max_threads=2)
    assert sp.is_valid(good)
    assert "threads" in sp.violation(good.replace(parallel="none", threads=2))
    assert "threads" in sp.violation(good.replace(parallel="m", threads=1))
    assert "smaller" in sp.violation(good.replace(tile_n=16, nr=32))
    L = native_lanes(w.dtype)   # 16 fp32 lanes on AVX-512, 8 on AVX2
    assert "registers" in sp.violation(good.replace(microkernel="unrolled", mr=16, nr=4 * L))
    with pytest.raises(InstantiationError):
        t.codegen(w, good.replace(tile_n=16, nr=32))


@pytest.mark.parametrize("shape", [(1, 1, 1), (1024, 1024, 1024), (1, 1024, 4096), (2048, 33, 7)])
def test_space_and_defaults_valid(shape):
    t = GemmTemplate()
    for dtype in ("float32", "float64", "int32"):
        w = Gemm(*shape, dtype)
        for threads in (1, 2):
            sp = t.space(w, max_threads=threads)
            assert sp.is_valid(t.default_config(w, max_threads=threads))
            cfg = sp.sample(random.Random(0))
            assert Config.from_json(cfg.to_json()) == cfg
        for name, cfg in t.ladder(w):
            assert t.space(w, max_threads=2).is_valid(cfg), name


def test_default_runs_small_work_on_one_thread():
    t = GemmTemplate()
    assert t.default_config(Gemm(64, 64, 64), max_threads=2)["threads"] == 1
    for n in (128, 1024):
        cfg = t.default_config(Gemm(n, n, n), max_threads=2)
        assert cfg["threads"] == 2 and cfg["parallel"] == "n"


def test_ladder_steps():
    t = GemmTemplate()
    steps = t.ladder(Gemm(1024, 1024, 1024))
    names = [n for n, _ in steps]
    assert names == ["naive", "blocking", "vectorization", "loop permutation", "packing",
                     "write cache", "parallel"]
    cfgs = dict(steps)
    assert cfgs["naive"]["mr"] == cfgs["naive"]["nr"] == 1
    assert not cfgs["naive"]["pack_b"] and cfgs["packing"]["pack_b"]
    assert cfgs["parallel"]["parallel"] != "none" and cfgs["parallel"]["threads"] == 2


def test_ladder_correct(build_dir):
    # one dtype per step keeps the compile count down; every step runs on odd sizes
    dtypes = ["float32", "int32", "float64"]
    for i, (name, _) in enumerate(GemmTemplate().ladder(Gemm(17, 33, 65))):
        w = Gemm(17, 33, 65, dtypes[i % 3])
        cfg = dict(GemmTemplate().ladder(w))[name]
        assert _run(w, cfg, build_dir) is None, (name, w.dtype)


CASES = [
    ((1, 1, 1), "float32", {}),
    ((17, 33, 65), "float64", {}),
    ((17, 33, 65), "int32", {}),
    ((37, 45, 100), "float32", {"microkernel": "loops", "pack_a": False, "pack_b": True,
                                "loop_order": "kmn", "unroll_k": 4, "tile_k": 32}),
    ((37, 45, 100), "float32", {"microkernel": "loops", "pack_a": True, "pack_b": False,
                                "loop_order": "mnk", "parallel": "n", "threads": 2}),
    ((64, 20, 300), "float64", {"microkernel": "unrolled", "mr": 4, "nr": 8, "tile_m": 32,
                                "tile_n": 16, "tile_k": 64, "unroll_k": 2, "parallel": "m",
                                "threads": 2}),
]


@pytest.mark.parametrize("shape,dtype,changes", CASES)
def test_kernels_correct(shape, dtype, changes, build_dir):
    t = GemmTemplate()
    w = Gemm(*shape, dtype)
    cfg = t.default_config(w, max_threads=2).replace(**changes)
    if "parallel" not in changes:
        cfg = cfg.replace(parallel="none", threads=1)
    assert t.space(w, max_threads=2).is_valid(cfg), t.space(w, 2).violation(cfg)
    assert _run(w, cfg, build_dir) is None


def test_random_configs_correct(build_dir):
    t = GemmTemplate()
    rng = random.Random(7)
    for shape, dtype in (((23, 40, 57), "float32"), ((50, 17, 33), "int32")):
        w = Gemm(*shape, dtype)
        sp = t.space(w, max_threads=2)
        for _ in range(2):
            cfg = sp.sample(rng)
            if cfg["microkernel"] == "unrolled":   # keep compile time low
                cfg = cfg.replace(microkernel="loops")
                if not sp.is_valid(cfg):
                    continue
            assert _run(w, cfg, build_dir) is None, cfg.to_json()


def test_generated_source_is_readable():
    t = GemmTemplate()
    w = Gemm(1023, 1025, 1000)
    src = t.codegen(w, t.default_config(w, max_threads=2))
    assert "M, N, K = 1023, 1025, 1000" in src
    assert "cache=True" in src and "parallel=True" in src and "prange" in src
    assert src.count("\n") < 600
    compile(src, "<gemm>", "exec")


def test_codegen_accepts_every_config_of_a_multi_thread_space():
    """A 1-thread config proposed in a 2-thread budget may use a per-thread split tile; its
    code must still generate (it was rejected as INVALID, and a tuned record of it could not
    be built)."""
    import random

    from search_spaces import get_template
    from workloads.gemm import Gemm

    t, w = get_template("gemm"), Gemm.parse("200x300x100")
    sp = t.space(w, 2)
    split = [c for c in (sp.sample(random.Random(i)) for i in range(400))
             if c["threads"] == 1 and c["tile_n"] not in t.space(w, 1).knob("tile_n").values]
    assert split, "the 2-thread space has split tiles"
    for c in split[:5]:
        assert "def kernel(A, B, C, tile_m, tile_n, tile_k)" in t.codegen(w, c)


def test_rowaxpy_is_a_gemv_formulation_with_pinned_knobs():
    t = GemmTemplate()
    assert "rowaxpy" not in t.space(Gemm(8, 64, 64), 2).knob("microkernel").values
    assert "k" not in t.space(Gemm(8, 64, 64), 2).knob("parallel").values
    w = Gemm(1, 1024, 4096)
    sp = t.space(w, max_threads=2)
    d = t.default_config(w, max_threads=2)
    assert d["microkernel"] == "rowaxpy" and d["parallel"] == "k" and sp.is_valid(d)
    assert "rowaxpy does not use mr" in sp.violation(d.replace(mr=2))
    assert "rowaxpy does not use pack_b" in sp.violation(d.replace(pack_b=True))
    assert "parallel='k' needs" in sp.violation(t.default_config(Gemm(4, 1024, 4096), 2)
                                                .replace(parallel="k"))
    assert "not M" in sp.violation(d.replace(parallel="m"))
    # the one-knob neighbours of the default stay in the formulation where they are valid
    assert any(nb["unroll_k"] != d["unroll_k"] for nb in sp.neighbours(d))


@pytest.mark.parametrize("shape,dtype,parallel,threads,unroll,tile_n", [
    ((1, 33, 70), "float32", "k", 2, 4, 16),      # K split with a leftover row, partial block
    ((3, 40, 9), "float64", "none", 1, 2, 32),    # several rows of C, K odd
    ((1, 50, 3), "int32", "n", 2, 4, 16),         # K shorter than a step: leftover rows only
    ((2, 17, 5), "float32", "k", 2, 1, 32),       # a K part with fewer rows than the other
])
def test_rowaxpy_correct(build_dir, shape, dtype, parallel, threads, unroll, tile_n):
    t = GemmTemplate()
    w = Gemm(*shape, dtype)
    sp = t.space(w, max_threads=2)
    L = native_lanes(dtype)
    cfg = Config({"tile_m": sp.knob("tile_m").values[-1], "tile_k": sp.knob("tile_k").values[-1],
                  "tile_n": min(v for v in sp.knob("tile_n").values if v >= tile_n),
                  "mr": 1, "nr": L, "vec": L, "pack_a": False, "pack_b": False,
                  "write_cache": False, "loop_order": "nkm", "microkernel": "rowaxpy",
                  "unroll_k": unroll, "parallel": parallel, "threads": threads})
    assert sp.is_valid(cfg), sp.violation(cfg)
    assert _run(w, cfg, build_dir) is None


def test_intrinsic_micro_kernel_prefetches_every_line_of_its_c_tile():
    from search_spaces.gemm_engine.microkernels import prefetch_c_lines

    def cols(lines):
        return sorted({int(ln.rsplit("cj + ", 1)[1].rstrip(")")) for ln in lines if "prefetch" in ln})
    assert cols(prefetch_c_lines(6, 16, 4)) == [0, 15]          # one 64-byte row, maybe two lines
    assert cols(prefetch_c_lines(4, 32, 4)) == [0, 16, 31]
    assert cols(prefetch_c_lines(4, 8, 8)) == [0, 7]
    assert sum("prefetch_w2" in ln for ln in prefetch_c_lines(6, 16, 4)) == 12


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_intrinsic_kernel_is_right_on_every_placement(dtype, build_dir):
    """The C-tile prefetch addresses whole tiles past C's edges: harmless, and the answer is
    the same wherever the operands start relative to a cache line."""
    from tuner.measure.placement import PLACEMENTS, placed_copies

    w = Gemm(13, 35, 17, dtype)
    t = GemmTemplate()
    lanes = 8 if dtype == "float32" else 4
    cfg = Config({**t.default_config(w, 1), "microkernel": "intrinsic", "vec": lanes, "nr": 2 * lanes,
                  "mr": 4, "tile_m": 16, "tile_n": 16, "tile_k": 32, "pack_a": True, "pack_b": True,
                  "write_cache": True})
    src = t.codegen(w, cfg)
    assert "prefetch_w2(C" in src
    kernel = bind_runtime_args(getattr(_load(src, build_dir), t.entry), t.runtime_args(w, cfg))
    ins = w.make_inputs(seed=2)
    ref = w.reference(ins)
    for offsets in PLACEMENTS:
        arrays = placed_copies([*ins, *w.make_outputs()], offsets)
        kernel(*arrays)
        assert w.check(arrays[:2], arrays[2:], ref) is None, offsets


def test_show_prints_the_arguments_and_its_output_runs_as_a_kernel_file(tmp_path):
    """``show`` prints the shared source and the cache blocks it is called with; a file of
    that output (``bench placement --kernels``) runs with those arguments and is right."""
    import json as _json

    from test_cli import tuner

    from tuner.bench.placement_bench import _load_file, called_with

    w = Gemm(40, 56, 72)
    cfg = {**GemmTemplate().default_config(w, 1), "tile_m": 16, "tile_n": 32, "tile_k": 32}
    p = tuner("show", "gemm", "--shape", "40x56x72", "--threads", "1", "--config", _json.dumps(cfg))
    assert p.returncode == 0, p.stderr
    assert "def kernel(A, B, C, tile_m, tile_n, tile_k):" in p.stdout
    assert "# called as: kernel(A, B, C, tile_m=16, tile_n=32, tile_k=32)" in p.stdout
    assert called_with(p.stdout) == (16, 32, 32)
    path = tmp_path / "shown.py"
    path.write_text(p.stdout)
    fn = _load_file(str(path))
    ins, outs = w.make_inputs(seed=5), w.make_outputs()
    fn(*ins, *outs)
    assert w.check(ins, outs, w.reference(ins)) is None
