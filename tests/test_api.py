"""The Python API (``import tuner``): tune, query, dispatch, register, and the README's examples."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tuner
from workloads.errors import DatabaseError, UsageError

ROOT = Path(__file__).resolve().parent.parent
FAST = dict(repeat=3, min_repeat_ms=2.0, batch_size=4)


def readme_examples() -> dict[str, str]:
    """The README's Python blocks whose first line is ``# example: NAME``."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return {b.splitlines()[0].split(":", 1)[1].strip(): b for b in blocks
            if b.startswith("# example:")}


def test_tune_a_spec_string_returns_the_best_and_its_records(templates, tmp_path):
    db = f"sqlite:///{tmp_path / 'api.db'}"
    r = tuner.tune("gemm:16x16x16", template="naive_gemm", trials=3, threads=1, db=db, strategy="random", **FAST)
    assert r.config is not None, (r.statuses, [(t.status, t.error[:200]) for t in r.records()])
    assert r.median > 0 and r.gflops > 0
    assert r.measured == 3 and r.statuses == {"OK": 3}
    assert r.ratio is not None and r.ratio > 0          # NumPy timed in the same run
    records = r.records()
    assert len(records) >= 3 and {x.status for x in records} == {"OK"}
    # a second call resumes: nothing is measured again
    again = tuner.tune("gemm:16x16x16", template="naive_gemm", trials=3, threads=1, db=db, **FAST)
    assert again.measured == 0 and again.resumed == 3
    # (the final re-measurement and the check against the default may add rows and move the
    # lead between these near-equal naive kernels; the database's best is the result's)
    best = tuner.open_db(db).best("gemm:16x16x16")
    assert [b.config for b in best] == [again.config]


def test_tune_accepts_a_workload_object(templates, tmp_path):
    from workloads.gemm import Gemm

    r = tuner.tune(Gemm(8, 8, 8), template="naive_gemm", trials=2, threads=1,
                   db=f"sqlite:///{tmp_path / 'o.db'}", strategy="random", **FAST)
    assert r.workload == Gemm(8, 8, 8) and r.config is not None


@pytest.mark.parametrize("kwargs, message", [
    ({"trials": 0}, "trials must be a positive integer"),
    ({"batch_size": -1}, "batch-size must be a positive integer"),
    ({"strategy": "annealing"}, "unknown strategy 'annealing'"),
    ({"repeat": 0}, "repeat must be positive"),
    ({"threads": 99}, "this machine allows"),
    ({"template": "conv2d"}, "computes 'conv2d' workloads, not 'gemm'"),
    ({"early_stopping": 0}, "early-stopping must be positive"),
])
def test_bad_arguments_are_one_usage_error_before_anything_is_recorded(tmp_path, kwargs, message):
    db_file = tmp_path / "never.db"
    with pytest.raises(UsageError, match=message):
        tuner.tune("gemm:16x16x16", db=f"sqlite:///{db_file}", **kwargs)
    assert not db_file.exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"threads": 0}, "threads=0: this machine allows"),
    ({"threads": "2"}, "threads='2': this machine allows"),
    ({"opt_level": 7}, "opt_level must be 0..3"),
    ({"layout": "NCWH"}, "layout must be NHWC or NCHW"),
    ({"jobs": 0}, "jobs must be a positive integer"),
])
def test_build_refuses_bad_options_before_anything_compiles(tmp_path, kwargs, message):
    """``tuner.build``'s options are checked up front: one UsageError each (a threads string
    was a TypeError, a bad layout a pass failure, jobs=0 the default)."""
    graph = str(Path(__file__).resolve().parents[1] / "workloads" / "graphs" / "conv_block.txt")
    with pytest.raises(UsageError, match=message):
        tuner.build(graph, db=f"sqlite:///{tmp_path / 'b.db'}", **kwargs)


def test_int8_options_are_part_of_the_api():
    from tuner.quant.flow import Int8Options

    assert tuner.Int8Options is Int8Options


@pytest.mark.parametrize("spec, message", [
    ("gemm", "not a workload spec"), ("gemm:16x16", "MxNxK"), ("nosuch:1x2", "unknown workload kind"),
    (42, "not int"), ("conv2d:3x3", "has no short spec"),
])
def test_bad_workload_specs(spec, message):
    with pytest.raises(UsageError, match=message):
        tuner.workload(spec)


def test_open_db_refuses_a_database_that_does_not_exist(tmp_path):
    missing = tmp_path / "no" / "such.db"
    with pytest.raises(DatabaseError, match="no database at"):
        tuner.open_db(f"sqlite:///{missing}")
    assert not missing.parent.exists()
    r = subprocess.run([sys.executable, "-m", "tuner", "db", "best", "--db", f"sqlite:///{missing}"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: no database at") and len(r.stderr.splitlines()) == 1


def test_a_registered_template_with_priority_wins_over_the_builtin(tmp_path):
    from fault_templates import NaiveGemm
    from search_spaces import _INSTANCES, _PRIORITY, REGISTRY, templates_for

    class MyGemm(NaiveGemm):
        name = "my_gemm"

    try:
        assert templates_for("gemm")[0] == "gemm"
        tuner.register_template(MyGemm(), priority=1)
        assert templates_for("gemm")[0] == "my_gemm"
        k = tuner.kernel("gemm:8x8x8", threads=1, db=f"sqlite:///{tmp_path / 'p.db'}")
        assert k.template.name == "my_gemm" and k.source == "fallback"
        A, B, C = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32), np.zeros((8, 8), np.float32)
        k(A, B, C)
        assert np.all(C == 8)
    finally:
        for d in (REGISTRY, _INSTANCES, _PRIORITY):
            d.pop("my_gemm", None)
    assert templates_for("gemm")[0] == "gemm"


def test_a_registered_workload_kind_claims_fused_groups_before_the_builtins():
    import workloads
    from workloads.fused import FusedWorkload, kind_of

    params = {"anchor": None, "kind": "elemwise", "output": [[4], "float32"]}
    assert kind_of(params) == "injective"

    class Relus(FusedWorkload):
        kind = "relus"

        @classmethod
        def claims_group(cls, p):
            return p["anchor"] is None and p["kind"] == "elemwise"

    try:
        tuner.register_workload(Relus, priority=1)
        assert kind_of(params) == "relus"
        assert kind_of({**params, "kind": "injective"}) == "injective"
    finally:
        workloads.REGISTRY.pop("relus")
        workloads._CLASSES.pop("relus")
        workloads._GROUP_KINDS[:] = [g for g in workloads._GROUP_KINDS if g[1] != "relus"]
    assert kind_of(params) == "injective"


def test_the_readme_example_of_a_user_workload_and_template_is_tuned_recorded_and_dispatched(tmp_path):
    """The README's example (a workload kind and its template defined in a script) runs as
    written: tuned in worker processes, recorded, then dispatched from the records."""
    code = readme_examples()["custom workload and template"]
    assert len(code.splitlines()[1:]) <= 80     # the example itself, without its marker line
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NumPy" in r.stdout
    rows = tuner.open_db(f"sqlite:///{tmp_path / 'example.db'}").trials()
    assert len(rows) >= 6 and rows[0].workload.key.startswith("rowsum:")


def test_the_readme_python_api_example_runs(tmp_path):
    code = readme_examples()["python api"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
