"""Int8 GEMM (uint8 x int8 -> int32): workload, dot-product intrinsics, template, CLI.

Every result is checked exactly against ``A.astype(int32) @ B.astype(int32)``. Compiling a
generated module costs a few seconds, so shapes are small and configs few; the AVX-512 and
VNNI forms are checked as LLVM IR and assembly for an AVX-512 CPU (this machine may not run
them).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys

import numpy as np
import pytest
from llvmlite import ir

from search_spaces import get_template, template_for
from search_spaces.isa import compile_features
from search_spaces.templates.gemm_int8 import GemmInt8Template, supported
from search_spaces.gemm_engine.int8_microkernels import generate
from search_spaces.runtime.simd_int8 import emit_dot
from workloads.errors import UsageError
from workloads.gemm import Gemm

AVX512_VNNI = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni"})
AVX2 = frozenset({"avx2", "fma"})
needs_avx2 = pytest.mark.skipif("avx2" not in compile_features(), reason="the int8 kernels need AVX2 to run")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("int8_kernels")


def _load(src: str, build_dir):
    name = "int8_test_" + hashlib.sha1(src.encode()).hexdigest()[:16]
    path = build_dir / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run_source(w: Gemm, src: str, build_dir, runtime_args: tuple = ()) -> str | None:
    mod = _load(src, build_dir)
    ins, outs = w.make_inputs(seed=3), w.make_outputs()
    mod.kernel(*ins, *outs, *runtime_args)
    return w.check(ins, outs, w.reference(ins))


# -- workload --------------------------------------------------------------------------------
def test_workload_specs_inputs_and_reference():
    w = Gemm.parse("9x7x11", "int8")
    assert w.input_specs() == [((9, 11), "uint8"), ((11, 7), "int8")]
    assert w.output_specs() == [((9, 7), "int32")]
    a, b = w.make_inputs()
    assert a.dtype == np.uint8 and b.dtype == np.int8
    assert (a[0] == 255).all() and (b[:, 0] == 127).all() and (b[:, -1] == -128).all()
    (ref,) = w.reference([a, b])
    assert ref.dtype == np.int32 and ref[0, 0] == 255 * 127 * 11
    assert np.array_equal(ref, a.astype(np.int64) @ b.astype(np.int64))
    c = ref.copy()
    assert w.check([a, b], [c], [ref]) is None
    c[3, 4] += 1   # one unit off is wrong: the check is exact
    assert "1 of 63 elements differ" in w.check([a, b], [c], [ref])
    a7, b7 = Gemm.parse("9x7x11", "int8w7").make_inputs()
    assert b7.min() == -64 and b7.max() == 64


def test_workload_rejects_k_that_overflows_int32():
    Gemm.parse("1x1x65536", "int8", check_memory=False)
    with pytest.raises(UsageError, match="K <= 65536"):
        Gemm.parse("1x1x65537", "int8", check_memory=False)


# -- intrinsics --------------------------------------------------------------------------------
def _ir_module(kind: str, lanes: int) -> ir.Module:
    mod = ir.Module(name=f"dot_{kind}_{lanes}")
    group = 2 if kind == "madd16" else 4
    elem = ir.IntType(16 if kind == "madd16" else 8)
    acc_t = ir.VectorType(ir.IntType(32), lanes)
    op_t = ir.VectorType(elem, lanes * group)
    fn = ir.Function(mod, ir.FunctionType(acc_t, [acc_t, op_t, op_t]), name="dot")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(emit_dot(b, kind, *fn.args))
    return mod


@pytest.mark.parametrize("kind,lanes,names,insns", [
    ("maddubs", 8, ["llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"], ["vpmaddubsw"]),
    ("maddubs", 16, ["llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"], ["vpmaddubsw", "zmm"]),
    ("madd16", 16, ["llvm.x86.avx512.pmaddw.d.512"], ["zmm"]),
    ("vnni", 8, ["llvm.x86.avx512.vpdpbusd.256"], ["vpdpbusd", "ymm"]),
    ("vnni", 16, ["llvm.x86.avx512.vpdpbusd.512"], ["vpdpbusd", "zmm"]),
])
def test_dot_intrinsics_compile_for_an_avx512_vnni_cpu(kind, lanes, names, insns):
    """LLVM IR names the intrinsic; assembly for icelake-server has the instruction (checked
    here without running it, so an AVX2 machine tests the AVX-512 forms too)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    text = str(_ir_module(kind, lanes))
    for name in names:
        assert name in text
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(cpu="icelake-server", features="")
    asm = tm.emit_assembly(parsed)
    for insn in insns:
        assert insn in asm, asm


@needs_avx2
def test_maddubs_really_saturates_and_madd16_does_not():
    """Why the constraint exists: one group 255*127 + 255*127 + 0 + 0 comes back as 32767."""
    import numba

    from search_spaces.runtime.simd import vload, vsplat, vstore
    from search_spaces.runtime.simd_int8 import vbroadcast_group, vdot_madd16, vdot_maddubs

    @numba.njit
    def ubs(a, b, out):
        vstore(out, 0, vdot_maddubs(vsplat(np.int32(0), 8), vbroadcast_group(a, 0, 8), vload(b, 0, 32)))

    @numba.njit
    def wd(a, b, out):
        vstore(out, 0, vdot_madd16(vsplat(np.int32(0), 8), vbroadcast_group(a, 0, 8), vload(b, 0, 16)))

    a = np.array([255, 255, 0, 0], np.uint8)
    b = np.tile(np.array([127, 127, 0, 0], np.int8), 8)
    out = np.zeros(8, np.int32)
    ubs(a, b, out)
    assert (out == 32767).all()   # true sum 64770
    a16 = np.array([255, 255], np.int16)
    b16 = np.tile(np.array([127, 127], np.int16), 8)
    wd(a16, b16, out)
    assert (out == 64770).all()
    b7 = np.tile(np.array([64, 64, -64, -64], np.int8), 8)
    a = np.array([255, 255, 255, 255], np.uint8)
    ubs(a, b7, out)
    assert (out == 0).all()        # 32640 - 32640: both pairs fit int16


# -- template ----------------------------------------------------------------------------------
def test_space_follows_the_cpu_features():
    w = Gemm(64, 64, 64, "int8")
    avx2 = GemmInt8Template(AVX2).space(w, 2)
    assert avx2.knob("dot").values == ("madd16", "maddubs") and avx2.knob("vec").values == (256,)
    wide = GemmInt8Template(AVX512_VNNI).space(w, 2)
    assert wide.knob("dot").values == ("madd16", "maddubs", "vnni")
    assert wide.knob("vec").values == (256, 512)
    assert GemmInt8Template(AVX512_VNNI).default_config(w)["dot"] == "vnni"
    assert supported("vnni", 256, frozenset({"avx2", "avxvnni"}))
    assert not supported("vnni", 256, frozenset({"avx2", "avx512vnni"}))   # no VL
    with pytest.raises(Exception, match="AVX2"):
        GemmInt8Template(frozenset({"sse4.2"})).space(w)


def test_constraints():
    t = GemmInt8Template(AVX2)
    full, w7 = Gemm(256, 256, 256, "int8"), Gemm(256, 256, 256, "int8w7")
    cfg = t.default_config(full)
    assert cfg["dot"] == "madd16" and t.default_config(w7)["dot"] == "maddubs"
    sp = t.space(full, 2)
    assert "saturates" in sp.violation(cfg.replace(dot="maddubs"))
    assert t.space(w7, 2).violation(cfg.replace(dot="maddubs")) is None
    assert "registers" in sp.violation(cfg.replace(mr=8, nr=32))
    assert "threads" in sp.violation(cfg.replace(threads=2))
    assert "smaller" in sp.violation(cfg.replace(tile_n=16, nr=32, mr=1))
    wide = GemmInt8Template(AVX512_VNNI)
    wsp = wide.space(full, 1)
    assert wide.default_config(full)["nr"] == 64   # VNNI at 512 bits: 6 x 4 vectors
    narrow = wide.default_config(full).replace(dot="vnni", vec=256, mr=4, nr=32)
    assert wsp.violation(narrow) is None
    assert "multiple" in wsp.violation(wide.default_config(full).replace(nr=24, mr=2))
    assert "not supported" in GemmInt8Template(AVX512_VNNI - {"avx512vl"}).space(full).violation(narrow)
    # A in place: 4-byte groups of A's rows, so not for madd16 (A widened) nor K % 4 != 0
    assert "madd16" in sp.violation(cfg.replace(pack_a=False))
    odd = Gemm(64, 64, 70, "int8")
    assert "multiple" in wide.space(odd, 1).violation(wide.default_config(odd).replace(pack_a=False))
    assert wsp.violation(wide.default_config(full).replace(pack_a=False, mr=4)) is None


def test_defaults_avoid_packing_a_twice():
    """AVX2 maddubs reads A in place; a model's int8 anchor (whose A, a conv's im2col, every
    thread packs in an N split) splits a tall A over M with the whole N in one block, and a
    short one over N."""
    t = GemmInt8Template(AVX2)
    w7 = Gemm(1024, 1024, 1024, "int8w7")
    assert t.default_config(w7)["pack_a"] is False and t.default_config(Gemm(1024, 1024, 1024, "int8"))["pack_a"]
    tall = t.default_config(Gemm(3136, 64, 576, "int8w7"), 2, anchor=True)
    assert tall["parallel"] == "m" and tall["tile_n"] == 64 and tall["pack_a"]
    assert t.space(Gemm(3136, 64, 576, "int8w7"), 2).violation(tall) is None
    short = t.default_config(Gemm(49, 512, 4608, "int8w7"), 2, anchor=True)
    assert short["parallel"] == "n" and short["tile_n"] == 256
    assert t.default_config(Gemm(3136, 64, 576, "int8w7"), 1, anchor=True)["parallel"] == "none"


@pytest.mark.parametrize("cpu, tile, in_place", [("znver4", (6, 64), True), ("znver5", (4, 64), True),
                                                  ("icelake-server", (6, 64), False)])
def test_vnni_default_reads_a_in_place_where_measured(fit_to_cpu, cpu, tile, in_place):
    """The 512-bit VNNI default reads A in place on the CPUs of ``isa.A_IN_PLACE_CPUS``
    (Zen 4: the packed default's 6 x 64 tile, Zen 5: 4 x 64) and packs it elsewhere; never
    for a model's int8 anchor, nor where K is not a multiple of the 4-byte groups."""
    fit_to_cpu(cpu)
    t = GemmInt8Template(AVX512_VNNI)
    w = Gemm(1024, 1024, 1024, "int8")
    for threads in (1, 2):
        d = t.default_config(w, threads)
        assert (d["mr"], d["nr"], d["pack_a"]) == (*tile, not in_place), threads
        assert t.space(w, threads).violation(d) is None
    assert t.default_config(Gemm(1024, 1024, 1022, "int8"))["pack_a"]
    assert t.default_config(Gemm(3136, 64, 576, "int8"), 2, anchor=True)["pack_a"]


def test_avx512_source_generates_and_names_the_wide_intrinsics():
    t = GemmInt8Template(AVX512_VNNI)
    w = Gemm(40, 70, 50, "int8")
    cfg = t.default_config(w)
    assert (cfg["dot"], cfg["vec"]) == ("vnni", 512)
    src = t.codegen(w, cfg)
    assert "vdot_vnni" in src and "LANES = 16" in src and "G = 4" in src
    compile(src, "<int8 avx512>", "exec")


# Edge cases: M, N, K not multiples of the tile, of MR/NR or of the K group; every
# formulation this CPU has; unrolled K loops, other loop orders, parallel blocks.
EXACT_CASES = [   # 256-bit forms (every AVX2 CPU), then the 512-bit and VNNI forms
    ((13, 29, 7), "int8", dict(dot="madd16", vec=256, mr=3, nr=16, unroll_k=2)),
    ((37, 45, 70), "int8w7", dict(dot="maddubs", vec=256, mr=4, nr=24, tile_k=64, loop_order="mkn")),
    ((5, 100, 131), "int8", dict(dot="madd16", vec=256, mr=2, nr=8, tile_k=64, tile_n=32, unroll_k=4,
                                 loop_order="knm")),
    ((70, 33, 129), "int8w7", dict(dot="maddubs", vec=256, mr=6, nr=16, tile_m=32, tile_k=64,
                                    parallel="m", threads=2)),
    ((1, 1, 1), "int8", dict(dot="madd16", vec=256, mr=1, nr=8)),
    ((37, 45, 70), "int8", dict(dot="vnni", vec=256, mr=4, nr=24, tile_k=64, loop_order="mkn")),
    ((37, 45, 70), "int8", dict(dot="vnni", vec=512, mr=4, nr=32, tile_k=64, loop_order="mkn")),
    ((70, 50, 129), "int8", dict(dot="vnni", vec=512, mr=6, nr=48, tile_m=32, tile_k=64,
                                 parallel="m", threads=2)),
    ((13, 29, 7), "int8", dict(dot="madd16", vec=512, mr=3, nr=16, unroll_k=2)),
    ((37, 45, 70), "int8w7", dict(dot="maddubs", vec=512, mr=4, nr=32, tile_k=64)),
    # A read in place (K a multiple of the 4-byte group): partial row tiles repeat their last row
    ((37, 45, 72), "int8w7", dict(dot="maddubs", vec=256, mr=4, nr=24, tile_k=64, pack_a=False)),
    ((70, 50, 132), "int8", dict(dot="vnni", vec=256, mr=6, nr=16, tile_m=32, tile_k=64,
                                 parallel="m", threads=2, pack_a=False)),
    ((13, 70, 64), "int8", dict(dot="vnni", vec=512, mr=4, nr=64, pack_a=False, unroll_k=2)),
    # C over 1 MiB: tiles request their lines of C (``c_lines_paced``), partial tiles too
    ((518, 520, 36), "int8", dict(dot="vnni", vec=512, mr=6, nr=64, pack_a=False, unroll_k=2)),
    ((518, 520, 36), "int8", dict(dot="vnni", vec=256, mr=6, nr=24, tile_m=48,
                                  parallel="n", threads=2)),
]


@needs_avx2
@pytest.mark.parametrize("shape,dtype,over", EXACT_CASES,
                         ids=[f"{o['dot']}-{o['vec']}-{'x'.join(map(str, s))}{'-in-place' if o.get('pack_a') is False else ''}"
                              for s, _, o in EXACT_CASES])
def test_generated_kernels_are_exact_on_edges(shape, dtype, over, build_dir):
    if not supported(over["dot"], over["vec"], compile_features()):
        pytest.skip(f"the CPU compiled for has no {over['dot']} at {over['vec']} bits")
    t = GemmInt8Template()
    w = Gemm(*shape, dtype)
    cfg = t.default_config(w, 2).replace(**over)
    assert t.space(w, 2).violation(cfg) is None
    src = t.codegen(w, cfg)
    # groups of 4 bytes (vnni, maddubs): B's full panels packed by vector shuffles
    assert ("vinterleave4(vconcat(" in src) == (over["dot"] != "madd16")
    assert _run_source(w, src, build_dir, t.runtime_args(w, cfg)) is None


@needs_avx2
def test_full_range_weights_never_give_a_wrong_ok(build_dir, measurer):
    """maddubs on full-range weights is refused before compiling (INVALID); forced past the
    constraint, the exact check catches the saturated sums."""
    t = GemmInt8Template()
    w = Gemm(24, 16, 32, "int8")
    bad = t.default_config(w).replace(dot="maddubs")
    (res,) = measurer.measure(w, t, [bad])
    assert res.status.value == "INVALID" and "saturates" in res.error
    problem = _run_source(w, generate(w, dict(bad), t.version), build_dir)
    assert problem is not None and "differ" in problem


# -- command line and dispatch ------------------------------------------------------------------
def test_template_choice_and_refusal():
    assert template_for(Gemm(8, 8, 8, "int8")).name == "gemm_int8"
    assert template_for(Gemm(8, 8, 8, "float32")).name == "gemm"
    with pytest.raises(UsageError, match="no int8 form"):
        template_for(Gemm(8, 8, 8, "int8"), "gemm")
    with pytest.raises(UsageError, match="no float32 form"):
        template_for(Gemm(8, 8, 8, "float32"), "gemm_int8")


def test_dispatch_gemm_uint8_by_int8(db_url, capsys):
    import tuner

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (9, 21)).astype(np.uint8)
    b = rng.integers(-128, 128, (21, 10)).astype(np.int8)
    c = tuner.gemm(a, b, threads=1, db=db_url)
    assert c.dtype == np.int32 and np.array_equal(c, a.astype(np.int32) @ b.astype(np.int32))
    assert "--dtype int8 " in capsys.readouterr().err   # the fallback names the tune command
    with pytest.raises(UsageError, match=r"\[-64, 64\]"):
        tuner.gemm(a, b, threads=1, db=db_url, weights7=True)
    with pytest.raises(UsageError, match="differ in dtype"):
        tuner.gemm(a.astype(np.int8), b.astype(np.uint8), threads=1, db=db_url)


@needs_avx2
def test_cli_tune_show_run_int8(db_url, tmp_path):
    from test_cli import assert_one_line_error, tuner

    p = tuner("tune", "gemm", "--shape", "40x24x36", "--dtype", "int8", "--trials", "4",
              "--batch-size", "2", "--threads", "1", "--repeat", "3", "--min-repeat-ms", "5",
              "--strategy", "random", "--no-progress", "--log", "", "--db", db_url)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"gemm_int8 v{get_template('gemm_int8').version}" in p.stdout and "OK" in p.stdout and "ratio" in p.stdout
    p = tuner("db", "best", "--json", "--db", db_url)
    (best,) = json.loads(p.stdout)
    assert best["template"] == "gemm_int8" and '"dtype":"int8"' in best["workload_key"]
    p = tuner("run", "gemm", "--shape", "40x24x36", "--dtype", "int8", "--threads", "1", "--json",
              "--db", db_url, "--repeat", "3", "--min-repeat-ms", "5")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    # the tuned config, or the default where the side-by-side check found the win within noise
    assert r["config_source"] == "tuned"
    assert r["config"] == best["config"] or r["note"].startswith("default kept"), r["note"]
    p = tuner("show", "gemm", "--shape", "40x24x36", "--dtype", "int8", "--best", "--db", db_url)
    assert p.returncode == 0 and "vdot_" in p.stdout
    assert_one_line_error(tuner("tune", "gemm", "--shape", "8x8x8", "--dtype", "int8", "--template", "gemm"))
    assert_one_line_error(tuner("show", "gemm", "--shape", "8x8x8", "--template", "gemm_int8"))
    assert_one_line_error(tuner("tune", "gemm", "--shape", "1x1x70000", "--dtype", "int8"))
    assert_one_line_error(tuner("show", "gemm", "--shape", "8x8x8", "--dtype", "int8",
                                "--config", json.dumps({**best["config"], "dot": "vnni512"})))


# -- benchmark ----------------------------------------------------------------------------------
@needs_avx2
def test_bench_int8_end_to_end(db_url, tmp_path):
    """Three contenders on a tiny shape, JSON written, both integer outputs checked (ONNX
    Runtime's saturation on full-range weights is reported, not hidden); speed not asserted."""
    pytest.importorskip("onnxruntime", reason="bench int8 needs onnxruntime (extra .[onnx])")
    pytest.importorskip("onnx", reason="bench int8 needs onnx (extra .[onnx])")
    from test_cli import assert_one_line_error, tuner

    out = tmp_path / "i8.json"
    p = tuner("bench", "int8", "--shapes", "24x16x20", "--dtypes", "int8,int8w7", "--threads", "1",
              "--rounds", "1", "--repeat", "2", "--min-repeat-ms", "2", "--out", str(out), "--db", db_url)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    assert data["kind"] == "bench-int8" and data["target"]["versions"]["onnxruntime"]
    assert [r["dtype"] for r in data["rows"]] == ["int8", "int8w7"]
    for r in data["rows"]:
        assert r["int8_check"] is None   # ours is exact on both
        assert r["ratio_vs_ort"] > 0 and r["cpu_ratio_vs_fp32"] > 0 and len(r["samples"]["ort"]) == 2
        assert r["int8_peak_share"] > 0   # of the measured ceiling of the row's formulation
    assert data["peaks"]["fp32_fma_gflops"] > 0 and data["peaks"]["maddubs"] > 0
    # weights in [-64, 64]: ONNX Runtime is exact too
    assert data["rows"][1]["ort_check"] is None
    rep = tuner("bench", "report", str(out))
    assert rep.returncode == 0 and "| 1 | int8w7 | 24x16x20 |" in rep.stdout
    assert "one core's measured ceilings: fp32 FMA" in rep.stdout and "% peak" in rep.stdout
    assert_one_line_error(tuner("bench", "int8", "--dtypes", "float32", "--db", db_url))
    assert_one_line_error(tuner("bench", "int8", "--shapes", "2x2", "--db", db_url))


def test_tiles_request_their_lines_of_c_when_c_outgrows_l2():
    """An int32 C of at least 1 MiB: each tile asks for its C lines for writing, one per K
    group from the first (docs/int8-gemm.md, "C lines requested over the K loop"); a
    smaller C gets no requests."""
    t = GemmInt8Template()
    for shape, paced in (((1024, 1024, 64), True), ((512, 511, 64), False)):
        w = Gemm(*shape, "int8")
        src = t.codegen(w, t.default_config(w, 1))
        assert ("prefetch_w2(C, ci + po // " in src) == paced, shape
        assert ("import prefetch_w2," in src) == paced, shape
