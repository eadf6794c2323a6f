"""ISA-aware templates and the TUNER_CPU override: spaces, register budget and defaults for
AVX2 and AVX-512, kernels run for the ISA(s) this machine executes, the override's target key.

Anything that sets TUNER_CPU runs in a subprocess: the override reconfigures Numba for the
whole process, and kernels compiled for a CPU this machine lacks would die of SIGILL."""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys

import pytest

from search_spaces import get_template, isa
from search_spaces.space import Config
from tuner.db.store import TrialRecord
from workloads.errors import InstantiationError, UsageError
from tuner.measure.result import MeasureResult, Status
from tuner.target import _target, host_target, missing_features
from workloads.gemm import Gemm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ISAS = {"avx2": isa.AVX2, "avx512": isa.AVX512}


def _host_runs(target_isa: isa.Isa) -> bool:
    host = isa.isa_from_features(isa.host_cpu()[1])
    return host.vector_bits >= target_isa.vector_bits and (host.fma or not target_isa.fma)


def _tuner(*args, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


# -- the ISA description --------------------------------------------------------------------
def test_isa_from_features():
    avx2 = isa.isa_from_features(isa.known_cpu_features("znver3"))
    assert (avx2.vector_bits, avx2.registers, avx2.fp32_lanes, avx2.fp64_lanes) == (256, 16, 8, 4)
    assert avx2.fma and not avx2.avx512bw and not avx2.avx512vnni
    zmm = isa.isa_from_features(["+avx2", "+fma", "+avx512f", "+avx512bw", "+avx512vnni"])
    assert (zmm.vector_bits, zmm.registers, zmm.fp32_lanes, zmm.fp64_lanes) == (512, 32, 16, 8)
    assert zmm.avx512bw and zmm.avx512vnni
    assert isa.isa_from_features(isa.known_cpu_features("cascadelake")).avx512vnni
    assert not isa.isa_from_features(isa.known_cpu_features("skylake-avx512")).avx512vnni
    assert isa.AVX2.lanes("int32") == 8 and isa.AVX512.lanes("int32") == 16


def test_host_target_uses_the_same_isa_as_the_templates():
    assert host_target().isa == isa.current()
    assert host_target().simd_bits == isa.current().vector_bits


def test_unknown_cpu_lists_the_known_ones():
    with pytest.raises(UsageError, match="known: .*haswell.*znver4"):
        isa.known_cpu_features("pentium3")


@pytest.mark.parametrize("cpu", sorted(isa.KNOWN_CPUS))
def test_known_cpu_table_matches_llvm(cpu):
    """The table's vector width is LLVM's: a <16 x float> add compiled for that CPU uses zmm
    registers exactly when the table says avx512f, ymm when it says avx (else xmm)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    ir_src = """define void @f(<16 x float>* %p, <16 x float>* %q) {
      %a = load <16 x float>, <16 x float>* %p
      %b = load <16 x float>, <16 x float>* %q
      %c = fadd <16 x float> %a, %b
      store <16 x float> %c, <16 x float>* %p
      ret void }"""
    try:
        mod = llvm.parse_assembly(ir_src)
    except RuntimeError:   # LLVM with opaque pointers only
        mod = llvm.parse_assembly(ir_src.replace("<16 x float>*", "ptr"))
    tm = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features="")
    asm = tm.emit_assembly(mod)
    feats = set(isa.KNOWN_CPUS[cpu])
    want = "zmm" if "avx512f" in feats else "ymm" if "avx" in feats else "xmm"
    assert want in asm and not ("zmm" in asm and want != "zmm")


# -- spaces, the register budget and defaults for both ISAs ---------------------------------
@pytest.mark.parametrize("name", ["avx2", "avx512"])
def test_gemm_space_and_default_follow_the_isa(name):
    target = ISAS[name]
    L = target.fp32_lanes
    t = get_template("gemm")
    w = Gemm(1024, 1024, 1024)
    with isa.using(target):
        sp = t.space(w, 2)
        d = t.default_config(w, 2)
        assert sp.is_valid(d)
        src = t.codegen(w, d)
    assert set(sp.knob("nr").values) - {1} <= {L // 2 * k for k in range(1, 9)}
    assert sp.knob("vec").values == (L // 2, L)
    # Haswell-classic 6 x 16 fp32 on AVX2 (12 + 2 + 1 = 15 of 16 ymm); AVX-512 6 x 64
    # (24 + 4 + 1 = 29 of 32 zmm)
    assert (d["mr"], d["nr"], d["vec"]) == (6, (2 if name == "avx2" else 4) * L, L)
    assert target.live_registers(d["mr"], d["nr"] // d["vec"]) <= target.registers
    assert f"vload(BB, pb + {L}, {L})" in src


def test_gemm_default_reads_a_in_place_on_the_in_place_cpus(fit_to_cpu):
    """On a CPU of ``isa.A_IN_PLACE_CPUS`` (AMD Zen 5, Zen 4) the float32 GEMM default is 4 x 4
    vectors with A read in place and 64-column B blocks; elsewhere, inside ``isa.using``, for
    rows that do not fill the 4-row tile and for too few columns to split, the ISA's default."""
    t = get_template("gemm")
    w = Gemm(1024, 1024, 1024)
    with isa.using(isa.AVX512):
        generic = t.default_config(w, 2)
    fit_to_cpu("znver5")
    d = t.default_config(w, 2)
    assert (d["mr"], d["nr"], d["pack_a"], d["tile_n"], d["tile_k"]) == (4, 64, False, 64, 1024)
    assert t.space(w, 2).is_valid(d)
    for shape, threads in (((1022, 1024, 1024), 1), ((1024, 64, 1024), 2), ((1024, 1024, 1024), 2)):
        with isa.using(isa.AVX512) if shape == (1024, 1024, 1024) else contextlib.nullcontext():
            e = t.default_config(Gemm(*shape), threads)
        assert (e["mr"], e["pack_a"]) == (6, True), shape
    if _host_runs(isa.AVX512):    # the in-place default computes the right thing
        from tuner.dispatch import load_kernel

        for shape in ((96, 130, 70), (128, 256, 1100)):
            v = Gemm(*shape)
            for threads in (1, 2):
                c = t.default_config(v, threads)
                assert not c["pack_a"], (shape, threads)
                ins, outs = v.make_inputs(seed=5), v.make_outputs()
                load_kernel(v, t, c)(*ins, *outs)
                assert v.check(ins, outs, v.reference(ins)) is None, (shape, threads)
    fit_to_cpu("znver4")   # 512-bit FMAs on 256-bit pipes: in place too (measured)
    assert not t.default_config(w, 2)["pack_a"]
    fit_to_cpu("icelake-server")
    assert t.default_config(w, 2) == generic


@pytest.mark.parametrize("name", ["avx2", "avx512"])
def test_conv_and_dense_spaces_follow_the_isa(name):
    from test_conv2d_template import conv_workload
    from test_dense_template import dense_workload

    target = ISAS[name]
    L = target.fp32_lanes
    for tname, w in (("conv2d", conv_workload(16, 14, 64, 3, 1, 2)),
                     ("conv2d", conv_workload(16, 14, 64, 1, 1, 3, pad=0)),
                     ("dense", dense_workload(64, 48, 40))):
        t = get_template(tname)
        with isa.using(target):
            sp = t.space(w, 2)
            d = t.default_config(w, 2)
        nhwc = tname == "conv2d" and w.geometry["data_layout"] == "NHWC"
        # the NHWC (direct) conv may take 4-vector tiles: its B panels are prepacked
        assert sp.knob("nr").values == (L, 2 * L, 3 * L) + ((4 * L,) if nhwc else ())
        assert sp.knob("vec").values == (L // 2, L)
        assert sp.is_valid(d) and d["vec"] == L
        assert target.live_registers(d["mr"], d["nr"] // d["vec"]) <= target.registers


def test_spill_is_invalid_before_compile_with_the_counts():
    t = get_template("gemm")
    w = Gemm(256, 256, 256)
    with isa.using(isa.AVX2):
        sp = t.space(w, 1)
        bad = t.default_config(w, 1).replace(mr=8)          # 16 + 2 + 1 = 19 > 16 ymm
        reason = sp.violation(bad)
        assert reason.startswith("registers")
        assert "16 accumulators + 2 B vector(s) + 1 A broadcast = 19" in reason and "16" in reason
        with pytest.raises(InstantiationError, match="would spill"):
            t.codegen(w, bad)
        assert sp.is_valid(bad.replace(mr=6))                # 12 + 2 + 1 = 15 fits
    with isa.using(isa.AVX512):
        assert t.space(w, 1).is_valid(t.default_config(w, 1).replace(mr=8, nr=32))   # 16 + 2 + 1 of 32


def test_avx512_register_rule_is_the_former_28_accumulators():
    """On AVX-512 the budget (accumulators + B vectors + 1 <= 32) admits exactly the micro-tiles
    the former rule (<= 28 accumulators) did, for the gemm and the conv2d/dense spaces."""
    t = get_template("gemm")
    w = Gemm(512, 512, 512)
    with isa.using(isa.AVX512):
        sp = t.space(w, 1)
        base = t.default_config(w, 1)
        for mk, mr, nr, vec in itertools.product(("intrinsic", "unrolled"), sp.knob("mr").values,
                                                 sp.knob("nr").values, sp.knob("vec").values):
            c = base.replace(microkernel=mk, mr=mr, nr=nr, vec=vec if mk == "intrinsic" else 16)
            if mk == "intrinsic" and nr % vec:
                continue
            acc = mr * -(-nr // (vec if mk == "intrinsic" else 16))
            reason = sp.violation(c) or ""
            unrolled_limit = mk == "unrolled" and mr * nr > 256   # source size, ISA-free
            assert reason.startswith("registers") == (acc > 28 or unrolled_limit), (c, reason)
        from search_spaces.gemm_engine.space import core_constraints

        (micro, *_) = core_constraints(512, 512)
        for mr, nr, vec in itertools.product((4, 6, 8), (16, 32, 48), (8, 16)):
            if nr % vec == 0:
                assert (micro.check({"mr": mr, "nr": nr, "vec": vec}) is not None) == (mr * nr // vec > 28)


# -- kernels compiled and run for the ISA the host executes ---------------------------------
@pytest.mark.parametrize("name", ["avx2", "avx512"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_default_kernels_run_correctly(name, dtype):
    target = ISAS[name]
    if not _host_runs(target):
        pytest.skip(f"this machine cannot execute {target.name} kernels")
    from tuner.dispatch import load_kernel

    t = get_template("gemm")
    for shape in ((100, 70, 90), (4, 50, 33), (64, 64, 64), (96, 130, 70)):
        w = Gemm(*shape, dtype)
        with isa.using(target):
            for threads in (1, 2):
                fn = load_kernel(w, t, t.default_config(w, threads))
                ins, outs = w.make_inputs(seed=3), w.make_outputs()
                fn(*ins, *outs)
                assert w.check(ins, outs, w.reference(ins)) is None, (shape, threads)


@pytest.mark.parametrize("name", ["avx2", "avx512"])
def test_conv_kernels_run_correctly(name):
    from test_conv2d_template import check, conv_workload

    target = ISAS[name]
    if not _host_runs(target):
        pytest.skip(f"this machine cannot execute {target.name} kernels")
    t = get_template("conv2d")
    for level in (2, 3):
        w = conv_workload(8, 11, 20, 3, 1, level)
        with isa.using(target):
            sp = t.space(w, 1)
            for mr, nr in ((6, 2 * target.fp32_lanes), (4, 3 * target.fp32_lanes)):
                cfg = t.default_config(w, 1).replace(mr=mr, nr=nr, tile_m=sp.knob("tile_m").values[-1],
                                                     tile_n=sp.knob("tile_n").values[-1])
                assert sp.is_valid(cfg), sp.violation(cfg)
                assert check(w, cfg) is None, cfg


# -- the TUNER_CPU override -----------------------------------------------------------------
def test_override_target_has_its_own_key_and_records():
    host = host_target()
    other = "skylake-avx512" if host.isa.vector_bits < 512 else "haswell"
    over = _target(other)
    assert over.cpu_name == other and over.key != host.key
    assert over.isa == isa.isa_from_features(isa.known_cpu_features(other))
    r = _tuner("target", env_extra={"TUNER_CPU": other})
    assert r.returncode == 0, r.stderr
    assert f"target key : {over.key}" in r.stdout


def test_override_records_are_kept_apart(store):
    host = host_target()
    over = _target("haswell" if host.cpu_name != "haswell" else "znver3")
    t = get_template("gemm")
    w = Gemm(64, 64, 64)
    run = store.start_run(over, "test", "random", 1)
    cfg = t.default_config(w, 1)
    store.add_trials(run, w, over, [TrialRecord(t.name, t.version, cfg, 1,
                                                MeasureResult(Status.OK, [1e-4] * 3))])
    assert store.best(w.key, over.key, 1, t.name, t.version).config == cfg
    assert store.best(w.key, host.key, 1, t.name, t.version) is None


def test_override_sets_numba_for_workers(monkeypatch, tmp_path):
    from tuner import settings
    from tuner.measure.pool import worker_env

    monkeypatch.delenv("TUNER_CPU", raising=False)
    assert "NUMBA_CPU_NAME" not in worker_env(1, tmp_path)
    monkeypatch.setenv("TUNER_CPU", "haswell")
    env = worker_env(2, tmp_path)
    assert env["NUMBA_CPU_NAME"] == "haswell" and env["NUMBA_CPU_FEATURES"] == ""
    assert settings.cpu_override() == "haswell"
    monkeypatch.setenv("TUNER_CPU", "nosuchcpu")
    with pytest.raises(UsageError, match="known:"):
        settings.compile_env()


def test_override_compiles_for_that_cpu_in_process():
    """Numba in a TUNER_CPU process targets that CPU, and the templates follow it."""
    code = ("from tuner.target import host_target; from search_spaces import isa; "
            "from numba.core import config; t = host_target(); "
            "print(t.cpu_name, config.CPU_NAME, repr(config.CPU_FEATURES), isa.current().name)")
    env = {**os.environ, "PYTHONPATH": ROOT, "TUNER_CPU": "haswell"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["haswell", "haswell", "''", "avx2"]


def test_override_the_host_cannot_execute_is_refused_but_shown(tmp_path):
    if "avx512f" in isa.host_cpu()[1]:
        pytest.skip("this machine executes AVX-512: no CPU in the table it cannot run")
    assert missing_features(_target("skylake-avx512"))
    env = {"TUNER_CPU": "skylake-avx512"}
    shown = _tuner("show", "gemm", "--shape", "64x64x64", env_extra=env)
    assert shown.returncode == 0, shown.stderr
    assert '"vec": 16' in shown.stdout and "vload(BB, pb + 16, 16)" in shown.stdout
    for cmd in (["tune", "gemm", "--shape", "16x16x16", "--trials", "1"],
                ["bench", "gemm", "--shapes", "16x16x16", "--threads", "1", "--dtypes", "float32"]):
        r = _tuner(*cmd, "--db", f"sqlite:///{tmp_path / 'x.db'}", env_extra=env)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and "avx512f" in lines[0] and "not measured or run" in lines[0]
    bad = _tuner("target", env_extra={"TUNER_CPU": "pentium3"})
    assert bad.returncode == 2 and "known:" in bad.stderr


def test_record_invalid_on_this_isa_is_set_aside(store, capsys):
    """A record tuned before the spaces followed the ISA (16-lane tiles on an AVX2 target)
    is not applied: dispatch falls back to the default instead of failing in codegen."""
    from tuner.dispatch import select_config

    t = get_template("gemm")
    w = Gemm(96, 96, 96)
    target = host_target()
    with isa.using(isa.AVX512):
        wide = t.default_config(w, 1)
    run = store.start_run(target, "test", "random", 1)
    store.add_trials(run, w, target, [TrialRecord(t.name, t.version, wide, 1,
                                                  MeasureResult(Status.OK, [1e-4] * 3))])
    with isa.using(isa.AVX2):
        assert t.space(w, 1).violation(wide)
        sel = select_config(w, t, store, target, 1)
        assert sel.source == "fallback" and t.space(w, 1).is_valid(sel.config)
    assert "not a valid config" in capsys.readouterr().err
    with isa.using(isa.AVX512):
        assert select_config(w, t, store, target, 1, quiet=True).config == wide
